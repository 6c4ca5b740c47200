"""share_placement/patterns.py: the pure-Python bin-packing LP equals scipy's HiGHS, and its prices are
optimal duals (every pattern priced at most one GPU, dual objective = primal), so they bound every
packing (weak duality), and `GapPrices.loss` is what docs/policies.md says."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from fractions import Fraction

import pytest

from share_placement.patterns import GapPrices
from share_placement.patterns import best_pattern
from share_placement.patterns import solve_packing_lp
from tests.unit.sim.test_packing_bound import ROOT
from tests.unit.sim.test_packing_bound import _best_allocation
from tests.unit.sim.test_packing_bound import bound

OPENB = ROOT.parent / "shared" / "data" / "openb"


def _check_optimal_duals(counts: Counter, cap: int) -> None:
    """The LP's answer is primal feasible, dual feasible over every pattern (enumerated, not the
    solver's knapsack) and the two objectives are equal: optimal, in exact rationals."""
    lp = solve_packing_lp(counts, cap)
    sizes = sorted(counts)
    for pat in bound.patterns(sizes, cap):  # dual feasibility: no pattern is worth more than a GPU
        assert sum(c * lp.prices[s] for c, s in zip(pat, sizes, strict=True)) <= 1
    assert all(p >= 0 for p in lp.prices.values())
    assert sum(n * lp.prices[s] for s, n in counts.items()) == lp.bins  # dual objective = primal
    covered = Counter()
    for pat, x in lp.packing:  # primal feasibility: the basis's patterns cover every pod
        assert x > 0 and sum(c * s for c, s in zip(pat, sizes, strict=True)) <= cap
        for c, s in zip(pat, sizes, strict=True):
            covered[s] += c * x
    assert all(covered[s] >= n for s, n in counts.items())
    assert sum(x for _, x in lp.packing) == lp.bins


def _min_bins(shares: list[int], cap: int) -> int:
    """The fewest GPUs of `cap` that hold `shares` (brute force)."""
    for k in range(1, len(shares) + 1):
        for assign in itertools.product(range(k), repeat=len(shares)):
            load = [0] * k
            for s, g in zip(shares, assign, strict=True):
                load[g] += s
            if max(load) <= cap:
                return k
    return 0


@pytest.mark.parametrize("seed", range(30))
def test_the_lp_equals_highs_on_random_cases(seed):
    rng = random.Random(seed)
    cap = rng.choice((10, 24, 100, 1000))
    sizes = rng.sample(range(1, cap + 1), rng.randint(1, min(8, cap)))
    counts = Counter({s: rng.randint(1, 40) for s in sizes})
    lp = solve_packing_lp(counts, cap)
    highs = bound.min_bins_prices(counts, cap)  # HiGHS's duals, in units (x cap)
    # The optimum is unique; the duals need not be (degenerate LPs): both must be optimal duals.
    assert float(lp.bins) == pytest.approx(sum(n * highs[s] for s, n in counts.items()) / cap, abs=1e-6)
    _check_optimal_duals(counts, cap)


@pytest.mark.parametrize("seed", range(15))
def test_weak_duality_against_brute_force_packings(seed):
    """The LP's bins never exceed the fewest GPUs any packing needs, and its prices, as the allocation
    LP's share prices (`dual_bound`), bound what any placement allocates."""
    rng = random.Random(100 + seed)
    cap = 10
    shares = [rng.choice([2, 3, 4, 6, 7, 8]) for _ in range(rng.randint(2, 7))]
    counts = Counter(shares)
    lp = solve_packing_lp(counts, cap)
    assert lp.bins <= _min_bins(shares, cap)
    assert lp.bins >= Fraction(sum(shares), cap)  # no GPU holds more than its capacity
    gpus, whole = rng.randint(1, 3), rng.randint(0, 2)
    prices = {s: float(p) * cap for s, p in lp.prices.items()}
    assert bound.dual_bound(counts, whole, gpus, cap, prices) >= _best_allocation(shares, whole, gpus, cap) - 1e-9


def test_the_default_traces_prices_are_highs_prices_in_exact_thirds_and_quarters():
    pods = OPENB / "openb_pod_list_default.csv"
    assert pods.exists(), f"openb trace not found under {OPENB}"
    from share_scheduler.sim.workload import load_openb

    w = load_openb(OPENB / "openb_node_list_gpu_node.csv", pods)
    counts = Counter(p.per_gpu for p in w.pods if p.count == 1 and 0 < p.per_gpu < 1000)
    assert len(counts) == 20
    lp = solve_packing_lp(counts, 1000)
    highs = bound.min_bins_prices(counts, 1000)
    for s in counts:
        assert float(lp.prices[s]) * 1000 == pytest.approx(highs[s], abs=1e-6), s
    assert lp.prices[810] == 1 and lp.prices[470] == Fraction(1, 2) and lp.prices[220] == Fraction(1, 12)
    assert lp.prices[160] == 0 and lp.prices[650] == Fraction(2, 3)
    _check_optimal_duals(counts, 1000)


def test_best_pattern_is_the_knapsack_optimum():
    rng = random.Random(7)
    for _ in range(50):
        cap = rng.randint(5, 40)
        sizes = rng.sample(range(1, cap + 1), rng.randint(1, min(5, cap)))
        values = [rng.randint(0, 9) for _ in sizes]
        pat = best_pattern(sizes, values, cap)
        assert sum(c * s for c, s in zip(pat, sizes, strict=True)) <= cap
        got = sum(c * v for c, v in zip(pat, values, strict=True))
        want = max((sum(c * v for c, v in zip(p, values, strict=True)) for p in bound.patterns(sizes, cap)), default=0)
        assert got == want


def test_gap_loss_is_zero_along_the_lps_patterns_and_never_negative():
    counts = Counter({810: 50, 470: 40, 320: 30, 230: 20, 160: 10})
    gp = GapPrices(counts, 1000)
    for pat, _ in gp.lp.packing:  # filling an empty GPU with an optimal pattern loses nothing
        free = 1000
        for c, s in zip(pat, sorted(counts), strict=True):
            for _ in range(c):
                assert gp.loss(free, s) == 0, (pat, free, s)
                free -= s
    for f in range(0, 1001, 10):
        for s in counts:
            if s <= f:
                assert gp.loss(f, s) >= 0
    assert gp.price == {810: 1000, 470: 500, 320: Fraction(1000, 3), 230: 250, 160: 0}
    assert gp.loss(1000, 810) == 0 and gp.loss(530, 470) == 0 and gp.loss(190, 160) == 0
    # A 320 in the room a 470 left: the room was worth a 470 (500), the 320 is worth 333 and leaves 210,
    # which nothing priced fills: it loses 500 - 0 - 333.
    assert gp.loss(530, 320) == Fraction(500, 3)
    assert gp.value(2000) == Fraction(7000, 3)  # K extends past the capacity (larger GPUs): 810+810+320
    assert GapPrices(counts, 1000).loss(1000, 999) == 0  # a size never learned has no price


def test_an_empty_table_prices_nothing():
    assert solve_packing_lp({}, 1000).prices == {}
    assert solve_packing_lp({1200: 3}, 1000).prices == {}  # larger than a GPU: not a share
