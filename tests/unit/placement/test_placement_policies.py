"""Every placement policy on small, hand-checked cases."""

from __future__ import annotations

import threading

import pytest

import share_placement as placement
from share_placement import BestFitPolicy
from share_placement import BinpackPolicy
from share_placement import Demand
from share_placement import FragPolicy
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import RandomPolicy
from share_placement import SpreadPolicy
from share_placement import WorkloadTable
from share_placement import best_node
from share_placement import fits
from share_placement import fragmentation
from share_placement import make_policy
from share_placement import node_view


def node(name: str, *frees: int, model: str = "A100", total: int = 1000, **kw) -> NodeState:
    return NodeState(name, tuple(GpuSlot(i, model, total, f) for i, f in enumerate(frees)), **kw)


ALL = ["binpack", "bestfit", "spread", "random", "frag", "fgd"]


def test_registry_and_make_policy():
    assert set(placement.POLICIES) >= set(ALL)
    for name in ALL:
        assert make_policy(name).name == name
    assert make_policy("random", seed=3).name == "random"
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")


@pytest.mark.parametrize("name", ALL)
def test_no_fit_is_none_and_minus_inf(name):
    policy = make_policy(name)
    n = node("n", 300, 200)
    assert policy.choose(n, Demand(500)) is None
    assert policy.score(n, Demand(500)) == float("-inf")
    assert not fits(n, Demand(500))


@pytest.mark.parametrize("name", ALL)
def test_unhealthy_gpus_are_never_used(name):
    policy = make_policy(name)
    n = NodeState("n", (GpuSlot(0, "A100", 1000, 1000, healthy=False), GpuSlot(1, "A100", 1000, 600)))
    assert policy.choose(n, Demand(500)) == (1,)
    assert policy.choose(n, Demand(700)) is None
    assert policy.choose(n, Demand(500, count=2)) is None


@pytest.mark.parametrize("name", ALL)
def test_model_constraint(name):
    policy = make_policy(name)
    n = NodeState("n", (GpuSlot(0, "Tesla T4", 16, 16), GpuSlot(1, "NVIDIA A100-SXM4-80GB", 80, 80)))
    assert policy.choose(n, Demand(8, models=("a100",))) == (1,)
    assert policy.choose(n, Demand(8, models=("t4",))) == (0,)
    assert policy.choose(n, Demand(8, models=("h100",))) is None
    assert policy.score(n, Demand(8, models=("h100",))) == float("-inf")


@pytest.mark.parametrize("name", ALL)
def test_multi_gpu_takes_distinct_gpus_with_room(name):
    policy = make_policy(name)
    n = node("n", 1000, 400, 1000, 1000)
    chosen = policy.choose(n, Demand(1000, count=3))
    assert chosen == (0, 2, 3)
    assert policy.choose(n, Demand(1000, count=4)) is None


@pytest.mark.parametrize("name", ALL)
def test_cpu_and_memory_checked_only_when_known(name):
    policy = make_policy(name)
    d = Demand(100, cpu=4000, memory=1024)
    assert policy.choose(node("n", 1000), d) == (0,)  # unknown: not checked here
    assert policy.choose(node("n", 1000, cpu_free=3999), d) is None
    assert policy.choose(node("n", 1000, cpu_free=4000, memory_free=1000), d) is None
    assert policy.choose(node("n", 1000, cpu_free=4000, memory_free=1024), d) == (0,)


@pytest.mark.parametrize("name", ALL)
def test_cpu_only_demand_needs_no_gpu(name):
    policy = make_policy(name)
    assert policy.choose(node("n", 0, 0, cpu_free=8000), Demand(0, count=0, cpu=2000)) == ()
    assert policy.choose(node("n", 0, cpu_free=1000), Demand(0, count=0, cpu=2000)) is None


@pytest.mark.parametrize("policy", [BinpackPolicy, FragPolicy], ids=["binpack", "frag-without-workload"])
def test_best_fit_picks_tightest_gpu_and_fullest_node(policy):
    """Binpack, and frag before it has learned a workload (it then is best fit)."""
    p = policy()
    assert p.choose(node("n", 1000, 600, 500), Demand(500)) == (2,)
    a, b = node("a", 600, 1000), node("b", 600, 0)
    assert p.score(b, Demand(500)) > p.score(a, Demand(500))  # same leftover, fuller node
    assert best_node([a, b], Demand(500), p) is b
    assert p.choose(node("n", 1000, 700, 800, 1000), Demand(700, count=2)) == (1, 2)


def test_bestfit_scores_as_the_paper_hand_checked():
    p = BestFitPolicy()
    assert (p.cpu_spec, p.gpu_spec, p.cpu_weight, p.levels) == (128_000, 8_000, 0.5, 100) and p.random_ties
    # left after the pod: CPU 64000 - 16000 = 48000 -> 0.5 * 48000/128000 = 0.1875; GPU 2500 - 500 = 2000
    # -> 0.5 * 2000/8000 = 0.125; score int(100 * (1 - 0.3125)) = int(68.75) = 68, on the tightest GPU.
    n = node("n", 1000, 1000, 500, 0, cpu_free=64000)
    assert p.score(n, Demand(500, cpu=16000)) == 68.0
    assert p.choose(n, Demand(500, cpu=16000)) == (2,)
    # Truncated to an integer, as the paper's Go code does: nearby nodes tie (broken at random by the caller).
    assert p.score(node("m", 1000, 1000, 500, 0, cpu_free=64500), Demand(500, cpu=16000)) == 68.0
    # Exact edges: 0.5 * 64000/128000 + 0.5 * 4000/8000 = 0.5 -> exactly 50.
    assert p.score(node("e", 1000, 1000, 1000, 1000, 1000, cpu_free=64000), Demand(1000)) == 50.0
    # Whole-GPU pods take the lowest-indexed free GPUs; shares the tightest GPU, lowest index on ties.
    assert p.choose(node("w", 1000, 400, 1000, 1000, cpu_free=8000), Demand(1000, count=2)) == (0, 2)
    assert p.choose(node("t", 700, 600, 600, 1000, cpu_free=8000), Demand(500)) == (1,)


def test_bestfit_weighs_cpu_like_gpu_where_binpack_looks_at_the_gpu():
    # a: tight GPU but all CPU free: left 0.5 * 1 + 0.5 * 500/8000 = 0.53125 -> 46.
    # b: 8 empty GPUs but no CPU left: left 0 + 0.5 * 7500/8000 = 0.46875 -> 53. Best-fit takes b.
    a = node("a", 1000, cpu_free=128_000)
    b = node("b", *[1000] * 8, cpu_free=0)
    d = Demand(500)
    assert (BestFitPolicy().score(a, d), BestFitPolicy().score(b, d)) == (46.0, 53.0)
    assert best_node([a, b], d, BestFitPolicy()) is b
    assert best_node([a, b], d, BinpackPolicy()) is a


def test_bestfit_without_cpu_is_least_gpu_left():
    # The extender's NodeState has no CPU: the score is minus the node's free GPU after the pod, exact.
    p = make_policy("bestfit")
    a, b = node("a", 80, 80, total=80), node("b", 80, 30, total=80)
    assert p.score(a, Demand(20)) == -140.0 and p.score(b, Demand(20)) == -90.0
    assert best_node([a, b], Demand(20), p) is b and p.choose(b, Demand(20)) == (1,)
    assert p.score(node("c", 80, 79, total=80), Demand(20)) == -139.0  # a 1 GiB difference still counts
    with pytest.raises(ValueError):
        BestFitPolicy(cpu_weight=1.5)


def test_spread_picks_emptiest():
    p = SpreadPolicy()
    assert p.choose(node("n", 600, 1000, 500), Demand(500)) == (1,)
    a, b = node("a", 1000, 1000), node("b", 1000, 200)
    assert best_node([b, a], Demand(500), p) is a


def test_random_is_seeded_and_only_uses_eligible_gpus():
    n = node("n", 1000, 100, 1000, 1000, 1000)
    picks1 = [RandomPolicy(seed=7).choose(n, Demand(500, count=2)) for _ in range(3)]
    picks2 = [RandomPolicy(seed=7).choose(n, Demand(500, count=2)) for _ in range(3)]
    assert picks1 == picks2
    seen = set()
    p = RandomPolicy(seed=1)
    for _ in range(200):
        chosen = p.choose(n, Demand(500, count=2))
        assert chosen is not None and 1 not in chosen and len(set(chosen)) == 2
        seen.update(chosen)
    assert seen == {0, 2, 3, 4}
    assert not p.cacheable


def table(*classes: tuple[int, int, int, float]) -> WorkloadTable:
    """Classes as (per_gpu, count, cpu, weight)."""
    return WorkloadTable.from_counts({(per, count, (), cpu): w for per, count, cpu, w in classes})


def test_fragmentation_hand_checked():
    gpus = (("A", 500), ("A", 1000))
    # One class, 700 units, no CPU: next pod: GPU0 (500) is stranded -> 500; fill: one 700 share fits
    # -> 1500 - 700 = 800.
    t = table((700, 1, 0, 1.0))
    assert fragmentation(gpus, None, t, fill_weight=0.0) == pytest.approx(500)
    assert fragmentation(gpus, None, t, fill_weight=1.0) == pytest.approx(800)
    assert fragmentation(gpus, None, t, fill_weight=0.5) == pytest.approx(650)
    # Whole-GPU class needing 2 GPUs cannot be hosted at all: everything free is stranded.
    t2 = table((1000, 2, 0, 1.0))
    assert fragmentation(gpus, None, t2, fill_weight=0.0) == pytest.approx(1500)
    # CPU: 8 free GPUs but CPU for 3 one-GPU pods -> FGD sees nothing stranded, fill sees 5 GPUs.
    eight = tuple(("A", 1000) for _ in range(8))
    t3 = table((1000, 1, 12000, 1.0))
    assert fragmentation(eight, 36000, t3, fill_weight=0.0) == pytest.approx(0)
    assert fragmentation(eight, 36000, t3, fill_weight=1.0) == pytest.approx(5000)
    assert fragmentation(eight, 11000, t3, fill_weight=0.0) == pytest.approx(8000)
    # Mixture: probabilities weight the classes.
    t4 = table((700, 1, 0, 1.0), (1000, 2, 0, 3.0))
    assert fragmentation(gpus, None, t4, fill_weight=0.0) == pytest.approx(0.25 * 500 + 0.75 * 1500)
    assert fragmentation((("A", 0),), None, t4) == 0.0


def test_frag_keeps_room_for_the_typical_pod_where_binpack_does_not():
    n = node("n", 800, 1000)
    d = Demand(300)
    assert BinpackPolicy().choose(n, d) == (0,)  # 800 -> 500: no 700 pod fits there any more
    p = FragPolicy()
    for _ in range(10):
        p.observe(Demand(700))
    assert p.choose(n, d) == (1,)  # 1000 -> 700: both GPUs still take a 700 pod


def test_frag_avoids_stranding_gpus_behind_cpu():
    # Typical pod: one whole GPU and 12 cores. A 30-core CPU-only pod should go where it strands no GPU.
    p = FragPolicy()
    for _ in range(5):
        p.observe(Demand(1000, cpu=12000))
    tight = node("tight", 1000, 1000, cpu_free=40000)  # 2 free GPUs, CPU for 3 pods
    roomy = node("roomy", 1000, 1000, cpu_free=100000)
    d = Demand(0, count=0, cpu=30000)
    assert p.score(roomy, d) > p.score(tight, d)
    assert best_node([tight, roomy], d, p) is roomy
    assert BinpackPolicy().score(roomy, d) == BinpackPolicy().score(tight, d)


def test_frag_learns_online_and_ignores_cpu_only_pods():
    p = FragPolicy()
    p.observe(Demand(0, count=0, cpu=1000))
    assert p.table.groups == ()
    p.observe(Demand(8, models=("A100",)))
    p.observe(Demand(8, models=("A100",)))
    p.observe(Demand(16, count=2))
    groups = {(g.models, g.per_gpu, g.count): g.prob for g in p.table.groups}
    assert groups == {(("a100",), 8, 1): pytest.approx(2 / 3), ((), 16, 2): pytest.approx(1 / 3)}
    assert p.table.observed == 3


def test_frag_is_thread_safe_under_concurrent_observe_and_score():
    p = FragPolicy()
    nodes = [node(f"n{i}", 1000 - 10 * i, 1000, 500) for i in range(20)]
    errors: list[BaseException] = []

    def observer():
        try:
            for i in range(2000):
                p.observe(Demand(100 + (i % 9) * 100, cpu=(i % 5) * 1000))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    def scorer():
        try:
            for _ in range(50):
                for n in nodes:
                    p.score(n, Demand(300))
                    p.choose(n, Demand(300))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=observer), threading.Thread(target=scorer), threading.Thread(target=scorer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert p.table.observed >= 1900  # refreshed lazily, within REFRESH of the true count


@pytest.mark.parametrize("name", ALL)
def test_score_and_choose_are_evaluate(name):
    """score/choose over NodeState are the same decision as evaluate over the compact view."""
    policy = make_policy(name, seed=5) if name == "random" else make_policy(name)
    policy.observe(Demand(700))
    n = NodeState(
        "n",
        (GpuSlot(3, "A", 1000, 800), GpuSlot(5, "A", 1000, 1000, healthy=False), GpuSlot(7, "A", 1000, 1000)),
    )
    view, indices = node_view(n)
    assert indices == (3, 7)
    if policy.cacheable:
        ev = policy.evaluate(view, Demand(300))
        assert ev is not None
        assert policy.score(n, Demand(300)) == ev[0]
        assert policy.choose(n, Demand(300)) == tuple(sorted(indices[i] for i in ev[1]))


def test_per_group_sums_update_exactly_when_one_gpu_changes():
    # frag prices each candidate GPU by updating per-group sums instead of recounting the node.
    from share_placement import fragmentation_from
    from share_placement import group_aggregates
    from share_placement import shift_aggregates

    t = WorkloadTable.from_counts(
        {(470, 1, (), 8000): 3.0, (1000, 2, (), 16000): 1.0, (810, 1, ("t4",), 4000): 2.0, (160, 1, (), 0): 1.0}
    )
    gpus = (("T4", 1000), ("T4", 530), ("T4", 60), ("T4", 1000))
    aggs = group_aggregates(gpus, t)
    for i, (m, f) in enumerate(gpus):
        for take in (50, 160, 470, 530):
            if take > f:
                continue
            after = list(gpus)
            after[i] = (m, f - take)
            assert shift_aggregates(aggs, t, m, f, f - take) == group_aggregates(tuple(after), t)
            for cpu in (None, 0, 9000, 40000):
                total = sum(x for _, x in after)
                assert fragmentation_from(total, shift_aggregates(aggs, t, m, f, f - take), cpu, t) == fragmentation(
                    tuple(after), cpu, t
                )


def test_frag_charges_for_gpu_models_that_restricted_pods_need():
    def policy(pressure: float) -> FragPolicy:
        p = FragPolicy(pressure=pressure)
        for _ in range(5):
            p.observe(Demand(1000, models=("t4",)))
            p.observe(Demand(1000))
        return p

    t4, g2 = node("t4", 1000, 1000, model="T4"), node("g2", 1000, 1000, model="G2")
    free, calm = policy(3.0), policy(0.0)
    # Half the workload may only use T4s: taking 1000 units of a T4 costs 3 x 0.5 x 1000 more.
    gap = (free.score(g2, Demand(1000)) - free.score(t4, Demand(1000))) - (
        calm.score(g2, Demand(1000)) - calm.score(t4, Demand(1000))
    )
    assert gap == pytest.approx(1500)
    assert best_node([t4, g2], Demand(1000), free) is g2
    # A T4-only pod pays the same on every node it may use, so its choice is unchanged.
    other = node("t4b", 1000, 0, model="T4")
    assert (
        best_node([t4, other], Demand(1000, models=("t4",)), free).name
        == best_node([t4, other], Demand(1000, models=("t4",)), calm).name
    )
    with pytest.raises(ValueError, match="pressure"):
        FragPolicy(pressure=-1)
