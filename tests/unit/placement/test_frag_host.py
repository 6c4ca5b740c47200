"""frag's host fast path (`FragPolicy._evaluate_host`, CPU-only and single-GPU pods with CPU known, the
learned workload with or without multi-GPU classes) decides exactly as the full recount: the same score
and GPUs on random nodes, the same node pod after pod."""

from __future__ import annotations

import random

import pytest

from share_placement import Demand
from share_placement import FragPolicy
from tests.unit.placement.test_frag_pricing import MODELS
from tests.unit.placement.test_frag_pricing import first_best
from tests.unit.placement.test_frag_pricing import random_gpus
from tests.unit.placement.test_frag_pricing import random_table
from tests.unit.placement.test_frag_pricing import reference_evaluate
from tests.unit.placement.test_frag_pricing import taught


def single_gpu_table(rng: random.Random, unit: int) -> dict:
    """A learned workload of single-GPU classes only (the case `FragPolicy._evaluate_host` takes)."""
    return {k: n for k, n in random_table(rng, unit, cpu=True).items() if k[1] == 1} or {(unit // 4, 1, (), 2000): 3.0}


def learned_table(rng: random.Random, unit: int, with_keys: bool) -> dict:
    """Single-GPU classes only, or any classes (multi-GPU ones too, some restricted to a model: the keys)."""
    return random_table(rng, unit, cpu=True) if with_keys else single_gpu_table(rng, unit)


@pytest.mark.parametrize("with_keys", [False, True], ids=["single-gpu-classes", "multi-gpu-keys"])
@pytest.mark.parametrize("seed", range(4))
def test_host_fast_path_evaluates_as_the_recount(seed, with_keys):
    """With CPU known: the one-pass path (`_evaluate_host`) gives the very evaluation the general path
    gives (every candidate recounted), and both equal the reference recount, for CPU-only and
    single-GPU demands on random nodes, with and without the host-aware gap price, with and without
    multi-GPU classes learned (whose keys a share may keep room for or cross)."""
    rng = random.Random(100 + seed + (50 if with_keys else 0))
    taken = keyed = 0
    for _ in range(40):
        unit = rng.choice((80, 1000))
        fast = FragPolicy(host_quantile=rng.choice((0.5, 0.5, None)))
        slow = FragPolicy(host_quantile=fast.host_quantile)
        slow.fast_host = False
        table = learned_table(rng, unit, with_keys)
        observed = taught(fast, table, random.Random(seed), cpu=True)
        taught(slow, table, random.Random(seed), cpu=True)
        for _ in range(40):
            view = (
                random_gpus(rng, unit),
                rng.choice((0, 1500, 2000, 7999, 8000, 30000, 64000)),
                rng.choice((None, 0, 1000, 4000, 64000)),
            )
            count = rng.choice((0, 1, 1, 1))
            per = rng.choice((unit // 20, unit // 10, unit // 4, unit // 2, unit)) if count else 0
            models = (rng.choice(MODELS).lower(),) if rng.random() < 0.2 else ()
            d = Demand(per, count, models, rng.choice((0, 500, 2000, 4000)), rng.choice((0, 1000, 2000)))
            assert with_keys or fast._pricer.keys == ()
            ev = fast.evaluate(view, d)
            assert ev == slow.evaluate(view, d), (view, d)
            if fast.host_quantile is not None:
                assert ev == reference_evaluate(fast, view, d, observed), (view, d)
            taken += ev is not None
            keyed += ev is not None and bool(fast._pricer.keys)
    assert taken > 500
    assert keyed > 300 if with_keys else keyed == 0


@pytest.mark.parametrize("with_keys", [False, True], ids=["single-gpu-classes", "multi-gpu-keys"])
@pytest.mark.parametrize("seed", range(3))
def test_host_fast_path_picks_the_node_the_recount_picks(seed, with_keys):
    """Random clusters, CPU known: the node (highest score, first on ties) and the GPU frag chooses
    with the one-pass path are those it chooses recounting every candidate, demand after demand as
    the pods land (so the learned workload and the nodes move)."""
    rng = random.Random(200 + seed + (50 if with_keys else 0))
    unit = 80
    fast, slow = FragPolicy(), FragPolicy()
    slow.fast_host = False
    table = learned_table(rng, unit, with_keys)
    if with_keys:
        table[(unit, 2, (), 4000)] = 3.0  # a pair of whole GPUs, as openb's: a key every share may cross
    taught(fast, table, random.Random(seed), cpu=True)
    taught(slow, table, random.Random(seed), cpu=True)
    nodes = [
        [random_gpus(rng, unit), rng.choice((16000, 32000, 64000)), rng.choice((64000, 256000))] for _ in range(60)
    ]
    placed = 0
    for _ in range(300):
        d = Demand(
            rng.choice((0, 4, 8, 16, 20, 40, 80)) if rng.random() < 0.8 else 0,
            1,
            (),
            rng.choice((250, 1000, 2000, 4000, 1000 + rng.randrange(50))),
            rng.choice((512, 2048, 8192)),
        )
        if d.per_gpu == 0:
            d = Demand(0, 0, (), d.cpu, d.memory)
        views = [(tuple(n[0]), n[1], n[2]) for n in nodes]
        fast_evs = [fast.evaluate(v, d) for v in views]
        slow_evs = [slow.evaluate(v, d) for v in views]
        assert fast_evs == slow_evs
        best = first_best([None if e is None else e[0] for e in fast_evs])
        if best is None:
            continue
        placed += 1
        n, (_, chosen) = nodes[best], fast_evs[best]
        gpus = list(n[0])
        for i in chosen:
            gpus[i] = (gpus[i][0], gpus[i][1] - d.per_gpu)
        n[0], n[1], n[2] = tuple(gpus), n[1] - d.cpu, n[2] - d.memory
        for p in (fast, slow):
            p.observe(d)
    assert placed > 100


@pytest.mark.parametrize("with_keys", [False, True], ids=["single-gpu-classes", "multi-gpu-keys"])
@pytest.mark.parametrize("seed", range(3))
def test_host_best_kept_per_multiset_answers_as_the_recount(seed, with_keys):
    """The answers `_evaluate_host` keeps per GPU multiset, CPU classes and hostable sets (`HostFacts.bests`:
    a share's best candidates, a CPU-only pod's price) answer as the recount for every order of those GPUs
    and every free CPU and memory:
    the same node seen shuffled, with CPU and memory inside and across the classes, down to where the
    node's CPU caps its fill (where nothing kept may be read), on mixed models with equal frees (ties
    between GPU states, decided by position)."""
    rng = random.Random(300 + seed + (50 if with_keys else 0))
    unit = rng.choice((80, 1000))
    fast = FragPolicy()
    slow = FragPolicy()
    slow.fast_host = False
    table = learned_table(rng, unit, with_keys)
    observed = taught(fast, table, random.Random(seed), cpu=True)
    taught(slow, table, random.Random(seed), cpu=True)
    half = unit // 2
    multisets = [random_gpus(rng, unit) for _ in range(6)]
    multisets.append((("T4", half), ("V100", half), ("T4", unit), ("V100", unit), ("A100", 0)))  # ties by model
    asked = 0
    for gpus in multisets:
        for _ in range(60):
            order = list(gpus)
            rng.shuffle(order)
            view = (
                tuple(order),
                rng.choice((0, 300, 1500, 2000, 2100, 7999, 8000, 30000, 64000)) + rng.randrange(3),
                rng.choice((None, 0, 1000, 4000, 64000)) if rng.random() < 0.3 else 64000 + rng.randrange(5),
            )
            for _ in range(3):  # several pods priced on one node state (its per-state part kept)
                count = rng.choice((0, 1, 1))
                per = rng.choice((unit // 20, unit // 10, unit // 4, half, unit)) if count else 0
                models = (rng.choice(MODELS).lower(),) if count and rng.random() < 0.15 else ()
                d = Demand(per, count, models, rng.choice((0, 500, 2000, 4000)), rng.choice((0, 1000)))
                ev = fast.evaluate(view, d)
                assert ev == slow.evaluate(view, d), (view, d)
                assert ev == reference_evaluate(fast, view, d, observed), (view, d)
                asked += ev is not None
    kept = fast._pricer._bests_size
    assert asked > 600
    assert 0 < kept < asked * 3 / 4  # many answers were read back, not worked out again
