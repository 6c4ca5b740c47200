"""The bin-packing LP's dual prices of share sizes, in pure Python (no LP library in the product).

Gilmore-Gomory: pack the learned sharing pods (how many of each size) into the fewest GPUs of
`capacity` units, a GPU holding any multiset of sizes that fits (a "pattern"). Its linear relaxation,
min sum x_p subject to sum_p a_sp x_p >= n_s, x >= 0, has one dual price pi(s) per size: the part of a
GPU a pod of that size is worth in an optimal packing. `frag` prices a gap with them (`GapPrices`).

Solved by the revised simplex with column generation, exactly (integers over the basis's
determinant; prices returned as `Fraction`s), so the prices are the same on every machine and a loss
that is zero is exactly zero: the basis starts with one single-size pattern per size (feasible at
once, no phase one); each iteration the entering column is the pattern with the most negative reduced
cost 1 - y.a, found by an unbounded knapsack over the sizes at the current duals y (searched in
floats, its value then checked in integers; optimality at the end is proven by the knapsack in
integers). Sizes and capacity are divided by their common divisor first, so the knapsack runs over
few capacities (100 for the openb trace's thousandths). About 5 ms and 36 pivots for the openb
trace's 20 share sizes (`python bench/share_packing_bound.py --lp`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from fractions import Fraction

MAX_PIVOTS = 10_000


def _knapsack(sizes: list[int], values: list, capacity: int) -> list:
    """best[r]: the most an unbounded multiset of `sizes` of total at most r earns at `values`
    (r = 0..capacity), in the values' own arithmetic (floats to search, integers to prove)."""
    best = [values[0] * 0 if values else 0] * (capacity + 1)
    for s, v in zip(sizes, values, strict=True):
        if v <= 0 or s > capacity:
            continue
        for r in range(s, capacity + 1):  # ascending r: a size may repeat (unbounded)
            c = best[r - s] + v
            if c > best[r]:
                best[r] = c
    for r in range(1, capacity + 1):  # at most r, not exactly r
        if best[r - 1] > best[r]:
            best[r] = best[r - 1]
    return best


def best_pattern(sizes: list[int], values: list[float], capacity: int) -> tuple[int, ...]:
    """A multiset of `sizes` fitting `capacity` that earns most at `values` (count per size)."""
    best = _knapsack(sizes, values, capacity)
    counts = [0] * len(sizes)
    r = capacity
    while r > 0 and best[r] > 0:
        if best[r - 1] == best[r]:
            r -= 1
            continue
        for i, (s, v) in enumerate(zip(sizes, values, strict=True)):
            if v > 0 and s <= r and best[r - s] + v == best[r]:
                counts[i] += 1
                r -= s
                break
        else:  # pragma: no cover - float rounding: take the closest
            i = max(
                (i for i, s in enumerate(sizes) if s <= r and values[i] > 0),
                key=lambda i: (best[r - sizes[i]] + values[i], -i),
            )
            counts[i] += 1
            r -= sizes[i]
    return tuple(counts)


@dataclass(frozen=True)
class PackingLP:
    """The LP's optimum: `bins` (GPUs, fractional), `prices[s]` (part of a GPU per pod of size s) and
    the optimal basis's patterns (count per size, sizes ascending) with their GPU counts; `pivots`:
    simplex iterations."""

    bins: Fraction
    prices: dict[int, Fraction]
    packing: tuple[tuple[tuple[int, ...], Fraction], ...] = field(default=())
    pivots: int = 0


def solve_packing_lp(counts: Mapping[int, int], capacity: int) -> PackingLP:
    """Gilmore-Gomory's bin-packing LP over `counts` (size -> pods), GPUs of `capacity`; see the module.

    Exact in integers: the basis inverse is kept as an integer matrix over a common denominator
    (B^-1 = N / D, D = det B > 0; a pivot divides exactly, as in integer-preserving Gauss-Jordan), so
    the duals are y = (sum of N's pattern rows) / D. Sizes above `capacity` or with no pods get no price."""
    items = sorted((s, n) for s, n in counts.items() if 0 < s <= capacity and n > 0)
    if not items:
        return PackingLP(Fraction(0), {})
    g = math.gcd(capacity, *(s for s, _ in items))
    sizes = [s // g for s, _ in items]
    cap = capacity // g
    need = [n for _, n in items]
    m = len(sizes)
    # Start: one single-size pattern per size, k_i = cap // s_i copies: B = diag(k), feasible at once.
    ks = [cap // s for s in sizes]
    det = math.prod(ks)
    inv = [[det // ks[i] if j == i else 0 for j in range(m)] for i in range(m)]  # N = D x B^-1
    # Columns: (pattern counts, -1) or ((), i) for the surplus of row i (column -e_i).
    basis: list[tuple[tuple[int, ...], int]] = [(tuple(ks[i] if j == i else 0 for j in range(m)), -1) for i in range(m)]
    xb = [det // ks[i] * need[i] for i in range(m)]  # N x n: the basic values x D
    pivots = 0
    while True:
        y = [0] * m  # the duals x D
        for (_, surplus), row in zip(basis, inv, strict=True):
            if surplus < 0:
                y = [a + b for a, b in zip(y, row, strict=True)]
        col: list[int] | None = None
        entering: tuple[tuple[int, ...], int] | None = None
        neg = [i for i in range(m) if y[i] < 0]
        if neg:  # a surplus prices out (reduced cost y_i < 0): the most negative, lowest row on ties
            i = min(neg, key=lambda i: (y[i], i))
            entering, col = ((), i), [-1 if j == i else 0 for j in range(m)]
        else:
            pat = best_pattern(sizes, [v / det for v in y], cap)
            if sum(c * v for c, v in zip(pat, y, strict=True)) <= det:
                # The float search found no column with 1 - y.a < 0: prove it in integers.
                # (Should float rounding have hidden an improving column, the integer search finds it.)
                pat = best_pattern(sizes, y, cap) if _knapsack(sizes, y, cap)[cap] > det else ()  # type: ignore[arg-type]
            if pat:
                entering, col = (pat, -1), list(pat)
        if entering is None or col is None:
            break
        pivots += 1
        if pivots > MAX_PIVOTS:  # pragma: no cover - Dantzig's rule cycling on a degenerate basis
            raise RuntimeError("packing LP: no optimum within the pivot limit")
        d = [sum(row[j] * col[j] for j in range(m) if col[j]) for row in inv]  # D x B^-1 a
        leave = -1
        for r in range(m):  # ratio test x_r / d_r over d_r > 0 (the least; the lowest row on ties)
            if d[r] > 0 and (leave < 0 or xb[r] * d[leave] < xb[leave] * d[r]):
                leave = r
        if leave < 0:  # pragma: no cover - the objective is bounded below by 0
            raise RuntimeError("packing LP: unbounded")
        piv = d[leave]
        prow, px = inv[leave], xb[leave]
        for r in range(m):
            if r != leave:
                f = d[r]
                inv[r] = [(piv * a - f * b) // det for a, b in zip(inv[r], prow, strict=True)]
                xb[r] = (piv * xb[r] - f * px) // det
        det = piv  # the new basis's determinant; row `leave` of N and of x D stays as it was
        basis[leave] = entering
    packing = tuple((pat, Fraction(x, det)) for (pat, surplus), x in zip(basis, xb, strict=True) if surplus < 0 and x)
    bins = sum((x for _, x in packing), Fraction(0))
    prices = {s: Fraction(y[i], det) for i, (s, _) in enumerate(items)}
    return PackingLP(bins, prices, packing, pivots)


class GapPrices:
    """What a gap of r free units is worth at the LP's prices, and what putting a share in one loses.

    pi(s) = the LP's price x `capacity` (units); K(r) = the most a gap of r units earns at those prices
    (unbounded knapsack over the priced sizes, extended on demand past `capacity` for larger GPUs).
    Putting a share of s where f is free loses K(f) - K(f - s) - pi(s) >= 0 (K is superadditive): zero
    exactly when what is left can still be filled as well as the LP's packing values it. A size with
    no price (never learned) loses nothing."""

    def __init__(self, counts: Mapping[int, int], capacity: int) -> None:
        self.capacity = capacity
        self.lp = solve_packing_lp(counts, capacity)
        self.price = {s: p * capacity for s, p in self.lp.prices.items()}
        priced = sorted(s for s, p in self.price.items() if p > 0)
        self._g = math.gcd(*priced) if priced else 1
        # K in integers: every price x their common denominator (exact, and fast to compare and add).
        self._den = math.lcm(*(p.denominator for p in self.price.values())) if self.price else 1
        self._sizes = [s // self._g for s in priced]
        self._values = [int(self.price[s] * self._den) for s in priced]
        self._k: list[int] = [0]
        self._extend(self._k, self._sizes, self._values, capacity // self._g)
        self.priced = frozenset(priced)
        # K over a subset of the sizes (`host_value`), one table per subset met.
        self._subsets: dict[frozenset[int], tuple[list[int], list[int], list[int]]] = {}
        self._price_units: dict[int, int] = {}

    @staticmethod
    def _extend(best: list[int], sizes: list[int], values: list[int], r_max: int) -> None:
        for r in range(len(best), r_max + 1):
            b = best[r - 1]
            for s, v in zip(sizes, values, strict=True):
                if s <= r:
                    c = best[r - s] + v
                    if c > b:
                        b = c
            best.append(b)

    def _value(self, free: int) -> int:
        r = free // self._g
        if r >= len(self._k):
            self._extend(self._k, self._sizes, self._values, r)
        return self._k[r]

    @property
    def denominator(self) -> int:
        """`host_value` and `price_units` count in 1 / this of a unit (integers, exact)."""
        return self._den

    def price_units(self, size: int) -> int:
        """pi(size) in 1 / `denominator` units (0 for a size with no price)."""
        v = self._price_units.get(size)
        if v is None:
            p = self.price.get(size)
            v = self._price_units[size] = 0 if p is None else int(p * self._den)
        return v

    def host_value(self, free: int, sizes: frozenset[int]) -> int:
        """K(free) over only `sizes` (a subset of `priced`), in 1 / `denominator` units: what a gap is
        worth when only pods of those sizes can still come to it (`frag`'s host-aware gap price)."""
        if sizes == self.priced:
            return self._value(free)
        t = self._subsets.get(sizes)
        if t is None:
            order = sorted(sizes)
            t = self._subsets[sizes] = ([0], [s // self._g for s in order], [self.price_units(s) for s in order])
        best, ss, vs = t
        r = free // self._g
        if r >= len(best):
            self._extend(best, ss, vs, max(r, self.capacity // self._g))
        return best[r]

    def value(self, free: int) -> Fraction:
        """K(free): the most a gap of `free` units earns at the LP's prices."""
        return Fraction(self._value(free), self._den)

    def loss(self, free: int, size: int) -> Fraction:
        """K(free) - K(free - size) - pi(size): what a share of `size` on a GPU with `free` units loses."""
        p = self.price.get(size)
        if p is None:
            return Fraction(0)
        return Fraction(self._value(free) - self._value(free - size), self._den) - p
