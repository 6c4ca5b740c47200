"""How long a running pod has left, learned from the pods that left (issue 40, reservations).

A scheduler is never told when a pod will end, but it sees every pod that ends and how long it ran.
Those run times say how likely a pod that has already run `a` seconds is to be gone `t` seconds later:
the share of the runs longer than a that ended by a + t. A reservation uses it to pick the node whose
blocking pods are likely gone soonest (`gone_by`: all of them, at even odds) instead of the one with the
fewest GPUs short (one GPU short behind a pod that has only begun a day-long run is further than two GPUs
short behind pods near their end).

One rule for share-sim's timeline (fed the departures it simulates) and the extender (fed the pods its
watch sees deleted after running): `Lifetimes`. Until it has seen `min_samples` departures it knows
nothing (`ready` is False) and reservations fall back to the fewest GPUs short.
"""

from __future__ import annotations

from bisect import bisect_left
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence

KEEP = 4096  # the most recent run times kept: the workload may change, and this bounds the memory
MIN_SAMPLES = 100  # departures seen before an estimate is trusted
ODDS = 0.5  # `gone_by`: the time by which the pods are gone with these odds (even: the median)
# The times `gone_by` answers in: 0, then 30 s growing by a quarter each step, to about 8 days.
GRID: tuple[float, ...] = (0.0, *(30.0 * 1.25**k for k in range(46)))


class Lifetimes:
    """The last `keep` run times (seconds) of pods that left, and when running pods are likely gone."""

    def __init__(self, keep: int = KEEP, min_samples: int = MIN_SAMPLES) -> None:
        if keep < 1 or min_samples < 1:
            raise ValueError(f"lifetimes: keep >= 1 and min_samples >= 1 (got keep={keep}, min_samples={min_samples})")
        self.min_samples = min_samples
        self._runs: deque[float] = deque(maxlen=keep)
        self._sorted: list[float] = []
        self._dirty = False

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def ready(self) -> bool:
        return len(self._runs) >= self.min_samples

    def observe(self, ran_s: float) -> None:
        """A pod left after running `ran_s` seconds (a negative or non-finite time is ignored: clock skew)."""
        if ran_s >= 0 and ran_s != float("inf"):
            self._runs.append(float(ran_s))
            self._dirty = True

    def _refresh(self) -> None:
        self._sorted, self._dirty = sorted(self._runs), False

    def _survival(self, x: float) -> float:
        """The share of the runs seen that lasted longer than `x` seconds."""
        runs = self._sorted
        return (len(runs) - bisect_right(runs, x)) / len(runs)

    def gone_by(self, ages: Sequence[float], odds: float = ODDS) -> float:
        """Seconds until every pod of these ages (how long each has run) has left, with probability `odds`:
        the first of `GRID` where the product over the pods of P(run <= age + t | run > age) reaches it
        (inf: not within the grid). Each pod by the runs seen; a pod older than every run seen is taken to
        run as long again as it has (nothing seen says when it ends; long runs are the ones that go on);
        a negative age is a pod already leaving (terminating), gone now. The product, not the largest of
        the pods' own estimates: eight pods each likely gone in an hour are not all likely gone in an hour.
        Needs `ready`."""
        if self._dirty:
            self._refresh()
        if not self._sorted:
            raise ValueError("lifetimes: no run time observed yet")
        if not ages:
            return 0.0
        pods = []  # (age, survival at that age) or (age, 0.0): as long again
        floor = 0.0
        for a in ages:
            if a < 0:  # leaving already (terminating)
                continue
            alive = self._survival(a)
            if alive == 0.0:
                floor = max(floor, a, 1.0)
            else:
                pods.append((a, alive))
        survival = self._survival

        def all_gone(t: float) -> float:
            p = 1.0
            for a, alive in pods:
                p *= 1.0 - survival(a + t) / alive
                if p < odds:
                    break
            return p

        lo = bisect_left(GRID, floor)
        if lo == len(GRID):
            return floor
        hi = len(GRID)
        while lo < hi:  # the first grid time where all_gone reaches the odds (it never decreases in t)
            mid = (lo + hi) // 2
            if all_gone(GRID[mid]) >= odds:
                hi = mid
            else:
                lo = mid + 1
        return max(floor, GRID[lo]) if lo < len(GRID) else float("inf")
