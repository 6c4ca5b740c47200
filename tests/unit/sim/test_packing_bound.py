"""bench/share_packing_bound.py: the lower bound on unallocated GPU must hold for every placement."""

from __future__ import annotations

import importlib.util
import itertools
import random
from collections import Counter
from pathlib import Path

import pytest

from share_scheduler.sim.engine import arrivals_until
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.engine import run_policy
from share_scheduler.sim.engine import simulate
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload

ROOT = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location("share_packing_bound", ROOT / "bench" / "share_packing_bound.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bound = _bench()


def _best_allocation(shares: list[int], whole: int, gpus: int, cap: int) -> int:
    """The most units any assignment of the pods to `gpus` GPUs of `cap` allocates (brute force)."""
    best = 0
    # Each share goes to one GPU or fails (index gpus); whole-GPU pods then take the empty GPUs.
    for assign in itertools.product(range(gpus + 1), repeat=len(shares)):
        load = [0] * gpus
        for s, g in zip(shares, assign, strict=True):
            if g < gpus:
                load[g] += s
        if any(x > cap for x in load):
            continue
        empty = sum(1 for x in load if x == 0)
        best = max(best, sum(load) + cap * min(whole, empty))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_dual_bound_is_never_below_the_best_placement(seed):
    rng = random.Random(seed)
    cap = 10
    shares = [rng.choice([3, 4, 6, 7, 8]) for _ in range(rng.randint(2, 6))]
    gpus, whole = rng.randint(1, 4), rng.randint(0, 3)
    counts = Counter(shares)
    best = _best_allocation(shares, whole, gpus, cap)
    # Any non-negative prices give a valid bound (weak duality), the pattern LP's the tightest.
    for _ in range(5):
        prices = {s: rng.uniform(0, s) for s in counts}
        assert bound.dual_bound(counts, whole, gpus, cap, prices) >= best - 1e-9
    lp, lp_prices, proven = bound.lp_prices(counts, whole, gpus, cap, exact=True)
    checked = bound.dual_bound(counts, whole, gpus, cap, lp_prices)
    assert checked == pytest.approx(lp, abs=1e-6)  # the LP's duals are optimal: no slack lost
    assert lp >= best - 1e-9
    assert proven == pytest.approx(best, abs=1e-6)  # the integer program is the brute force's optimum


def test_bound_is_tight_where_shares_pair_exactly():
    # Two 6s and two 4s fill two GPUs of 10 exactly: nothing can be left unallocated.
    counts = Counter({6: 2, 4: 2})
    assert bound.dual_bound(counts, 0, 2, 10, {6: 0.0, 4: 0.0}) == 20
    assert bound.dual_bound(Counter({6: 3}), 1, 2, 10, {6: 0.0}) == 16  # u = 10 per GPU at zero prices
    lp, _, _ = bound.lp_prices(counts, 0, 2, 10)
    assert lp == pytest.approx(20)
    # Three 6s on two GPUs: one must fail, so at most 12 of 20 units; the whole-GPU pod takes none.
    lp, prices, _ = bound.lp_prices(Counter({6: 3}), 1, 2, 10)
    assert lp == pytest.approx(16)  # the relaxation: one GPU of 6, one whole GPU (10)
    assert bound.dual_bound(Counter({6: 3}), 1, 2, 10, prices) == pytest.approx(16)


def test_knapsack_respects_counts_and_capacity():
    assert bound.best_pattern_value({3: 5}, {}, 10) == 9
    assert bound.best_pattern_value({3: 2}, {}, 10) == 6
    assert bound.best_pattern_value({6: 1, 4: 1, 5: 2}, {5: 1.0}, 10) == 10  # 6+4 beats 5+5 at 8
    assert bound.best_pattern_value({6: 1}, {6: 7.0}, 10) == 0  # a share priced above its size: none
    assert sorted(bound.patterns([3, 4], 7)) == [(0, 1), (1, 0), (1, 1), (2, 0)]  # 4, 3, 3+4, 3+3


def test_packings_leave_the_room_they_report():
    sizes = [810, 470, 470, 320, 650, 160, 50, 230, 230, 550]
    for pack in (bound.first_fit_decreasing, bound.best_fit_decreasing):
        bins = pack(sizes, 1000)
        assert sum(1000 - r for r in bins) == sum(sizes) and min(bins) >= 0
    assert bound.best_fit_decreasing([600, 500, 400, 100], 1000) == [0, 400]  # 600+400, 500+100
    assert bound.first_fit_decreasing([600, 500, 400, 100], 1000) == [0, 400]


def _tiny() -> Workload:
    nodes = tuple(SimNode(f"n{i}", "G", (1000, 1000), 64000, 1 << 20) for i in range(3))
    pods = (
        SimPod("a", 470, 1, (), 1000),
        SimPod("b", 810, 1, (), 1000),
        SimPod("c", 1000, 2, (), 1000),
        SimPod("d", 0, 0, (), 1000),
        SimPod("e", 230, 1, (), 1000),
    )
    return Workload(nodes, pods)


@pytest.mark.parametrize("seed", range(4))
def test_arrivals_until_are_the_simulators_arrivals(seed):
    w = _tiny()
    seen: list = []
    simulate(w, build_policy("binpack", seed, w), seed, tune=1.3, placements=seen)
    order = [k for k, _ in seen]
    upto = arrivals_until(w, seed)
    assert order[: len(upto)] == upto
    asked = [sum(w.pods[k].gpu_request for k in upto[:i]) for i in (len(upto) - 1, len(upto))]
    assert asked[0] < w.gpu_capacity <= asked[1]  # the first arrival that reaches 100 %
    # The table's 100 % column is read at that arrival.
    placed = sum(w.pods[k].gpu_request for k, where in seen[: len(upto)] if where is not None)
    got = run_policy(w, "binpack", seed, tune=1.3).unallocated_pct["100"]
    assert got == pytest.approx(100 - 100 * placed / w.gpu_capacity)


def test_place_all_bounds_only_placements_that_place_every_share():
    counts = Counter({6: 2, 4: 1})
    # Any placement: fail one 6 and give its GPU to the whole-GPU pod (6 + 4 + 10).
    assert bound.lp_prices(counts, 1, 2, 10, exact=True)[2] == pytest.approx(20)
    assert _best_allocation([6, 6, 4], 1, 2, 10) == 20
    # Every share placed: 6 + 4 on one GPU, 6 on the other, no room for the whole-GPU pod.
    lp, prices, proven = bound.lp_prices(counts, 1, 2, 10, exact=True, place_all=True)
    assert lp == pytest.approx(16) and proven == pytest.approx(16)
    assert bound.dual_bound(counts, 1, 2, 10, prices, place_all=True) == pytest.approx(16)
    with pytest.raises(ValueError):
        bound.dual_bound(counts, 1, 2, 10, {6: -1.0})


def test_share_sim_gives_frag_the_gpu_capacity_for_its_gap_price():
    """share-sim builds frag as fgd, with the largest GPU as `gpu_unit`: the shares the LP prices are
    the pods asking less than that, whatever the largest request (here a 2-GPU pod of 1000 each)."""
    w = _tiny()
    policy = build_policy("frag", 0, w)
    assert policy.gpu_unit == 1000  # type: ignore[attr-defined]
    _ = policy.table  # type: ignore[attr-defined]
    gp = policy._pricer.gap_prices()  # type: ignore[attr-defined]
    assert gp is not None and set(gp.price) == {230, 470, 810}
    # 810 alone fills a GPU in the LP's packing; 470 + 230 another (with room to spare).
    assert gp.price[810] == 1000 and gp.loss(1000, 810) == 0
