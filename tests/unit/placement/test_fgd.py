"""fgd: FGD as published (Weng et al., ATC '23), on hand-checked cases."""

from __future__ import annotations

import math

import pytest

from share_placement import Demand
from share_placement import FgdPolicy
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import TypicalPods
from share_placement import fgd_fragmentation
from share_placement import make_policy

Key = tuple[int, int, tuple[str, ...], int]


def typical(counts: dict[Key, float], popularity: float = 1.0) -> TypicalPods:
    return TypicalPods.from_counts(counts, popularity)


CPU_ONLY: Key = (0, 0, (), 1000)
SHARE_700: Key = (700, 1, (), 4000)
TWO_WHOLE: Key = (1000, 2, (), 8000)


def test_fragmentation_hand_checked():
    t = typical({CPU_ONLY: 2, SHARE_700: 5, TWO_WHOLE: 3})
    gpus = (("A", 500), ("A", 1000))
    # CPU-only: all 1500 free is theirs to strand (0.2 x 1500 = 300). 700-share: GPU0 (500) is too small
    # (0.5 x 500 = 250). Two whole GPUs: only one is free, all 1500 stranded (0.3 x 1500 = 450).
    assert fgd_fragmentation(gpus, 20000, t) == pytest.approx(300 + 250 + 450)
    # Too little CPU for the share: it cannot run here at all (Q4), so all 1500 count for it.
    assert fgd_fragmentation(gpus, 3000, t) == pytest.approx(300 + 750 + 450)
    # A class restricted to another model cannot use the node: all free capacity counts.
    t2 = typical({(300, 1, ("b",), 0): 1})
    assert fgd_fragmentation(gpus, None, t2) == pytest.approx(1500)
    assert fgd_fragmentation((("A", 0), ("A", 0)), 20000, t) == 0.0


def test_typical_pods_keep_the_popular_classes_up_to_95_percent():
    a, b, c, d = ((100 * i, 1, (), 0) for i in range(1, 5))
    t = typical({a: 50, b: 30, c: 15, d: 5}, popularity=0.95)
    # 50, 80, 95 %: the cut stops once 95 % is reached and renormalises over what it kept.
    assert t.classes == 3
    assert sorted((g.per_gpu, round(g.prob, 6)) for g in t.groups) == [
        (100, round(50 / 95, 6)),
        (200, round(30 / 95, 6)),
        (300, round(15 / 95, 6)),
    ]
    t = typical({CPU_ONLY: 1, SHARE_700: 3}, popularity=1.0)
    assert t.cpu_only == pytest.approx(0.25)


def node(*frees: int, cpu: int | None = None) -> NodeState:
    return NodeState("n", tuple(GpuSlot(i, "A", 1000, f) for i, f in enumerate(frees)), cpu_free=cpu)


def sigmoid_score(before: float, after: float) -> int:
    return int(100 / (1 + math.exp(-(before - after) / 1000)))


def test_score_is_the_papers_integer_sigmoid_and_the_gpu_the_first_best():
    p = FgdPolicy()
    for _ in range(3):
        p.observe(Demand(500, cpu=1000))
    p.observe(Demand(0, count=0, cpu=1000))  # a CPU-only pod: a quarter of the workload
    n = node(500, 1000, 1000, cpu=10000)
    # Before: CPU-only 0.25 x 2500; 500-share fits everywhere. Taking GPU0's 500 leaves 2000 free.
    before = 0.25 * 2500
    assert p.score(n, Demand(500, cpu=1000)) == sigmoid_score(before, 0.25 * 2000)
    assert p.choose(n, Demand(500, cpu=1000)) == (0,)
    # A 300-share: on GPU0 it leaves 200 (too small for a 500: stranded), on GPU1 it leaves 700.
    on0 = 0.25 * 2200 + 0.75 * 200
    on1 = 0.25 * 2200
    assert p.score(n, Demand(300, cpu=1000)) == max(sigmoid_score(before, on0), sigmoid_score(before, on1))
    assert p.choose(n, Demand(300, cpu=1000)) == (1,)
    # Equal integer scores on GPU1 and GPU2: the first one.
    assert p.choose(node(1000, 1000, cpu=10000), Demand(300, cpu=1000)) == (0,)
    assert isinstance(p.score(n, Demand(300, cpu=1000)), float) and p.score(n, Demand(300)).is_integer()


def test_multi_gpu_takes_the_tightest_whole_gpus_and_no_fit_is_none():
    p = make_policy("fgd")
    p.observe(Demand(1000, count=2))
    assert p.choose(node(1000, 300, 1000, 1000), Demand(1000, count=2)) == (0, 2)
    assert p.choose(node(1000, 300), Demand(1000, count=2)) is None


def test_ties_go_to_the_first_node_as_in_the_papers_scheduler():
    # The paper's simulator runs a kube-scheduler fork whose selectHost picks the smallest node name.
    assert not getattr(FgdPolicy(), "random_ties", False)


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="gpu_unit"):
        FgdPolicy(gpu_unit=0)
    with pytest.raises(ValueError, match="popularity"):
        FgdPolicy(popularity=1.5)


def test_node_fragmentation_memo_by_cpu_class_answers_as_the_recount():
    """The memo keys free CPU by the class the groups' CPU asks cut it into: every free CPU, at a cut, on
    either side of it and between cuts, answers as `fgd_fragmentation` does, in any order of asking."""
    import random

    counts = {CPU_ONLY: 2, SHARE_700: 5, TWO_WHOLE: 3, (700, 1, (), 2000): 4, (300, 1, ("a",), 6000): 1}
    policy = FgdPolicy(popularity=1.0)
    for (per, count, models, cpu), n in counts.items():
        for _ in range(int(n)):
            policy.observe(Demand(per, count, models, cpu, 0))
    t = policy.typical
    assert t.cpu_cuts == (2000, 4000, 6000, 8000)
    rng = random.Random(7)
    frees = [c + d for c in (0, *t.cpu_cuts) for d in (-1, 0, 1)] + [rng.randrange(0, 20000) for _ in range(200)]
    rng.shuffle(frees)
    gpus = (("A", 500), ("A", 1000), ("B", 300))
    for cpu in frees:
        assert policy.node_fragmentation(gpus, cpu) == fgd_fragmentation(gpus, cpu, t)
    assert policy.node_fragmentation(gpus, None) == fgd_fragmentation(gpus, None, t)
