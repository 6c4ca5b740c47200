"""How low can unallocated GPU % at arrived 100 % go on a trace? Offline packings and a true lower bound.

At arrived 100 % the pods have asked for the whole cluster, so the unallocated share is exactly the
capacity the placed pods could not use. Sharing pods leave the rest of their GPU to pods that fit in
it; whatever no pod fills is lost.

Default: the trace's sharing pods packed offline, first-fit decreasing (FFD), scaled to arrived 100 %:
an estimate of what even a clairvoyant scheduler leaves in partly used GPUs.

`--per-seed N`: for seeds 0..N-1, the exact arrivals of the simulator (`engine.arrivals_until`: up to
and including the first arrival reaching 100 %), and for those arrivals
- FFD and best-fit decreasing (BFD) of their sharing pods, every other GPU given to whole-GPU pods;
- a lower bound on unallocated % that holds for ANY placement of those arrivals (`--bound`, needs
  scipy). The relaxation drops nodes, CPU, memory and GPU models: the cluster is a pool of GPUs of one
  size; a multi-GPU pod may be split into single GPUs (whole-GPU demand is fungible); any pod may fail.
  Every real placement is a solution of it (each GPU holds one multiset of shares, a "pattern", or
  one whole-GPU pod, or nothing), so its optimum allocation is at least the real one. Its linear
  relaxation over patterns (Gilmore-Gomory: x_p GPUs packed with pattern p, y GPUs given to whole-GPU
  pods; sum x + y <= GPUs, y <= whole GPUs asked, each share size used at most as often as it arrived)
  is larger still. The bound is not taken on trust from the LP solver: its dual prices are checked in
  pure Python (`dual_bound`: any prices >= 0 give a valid bound by weak duality, the best pattern at
  those prices found by an exact knapsack), and that figure is what is printed. `--exact` also solves
  the integer program (HiGHS branch and bound) and prints its proven bound.

`--online N`: a prototype, not the product: `frag` for seeds 0..N-1 as share-sim runs it, except that a
sharing pod's GPU is also priced by the bin-packing LP's dual prices (below), and once more without
them (the same loop, so the two differ only in that price).
Gilmore-Gomory's LP packs the learned sharing pods into the fewest GPUs; its dual gives each share size
a price pi(s) (the part of a GPU it is worth in an optimal packing, x 1000 units). With K(r) the most
a gap of r units can earn at those prices (a knapsack), putting a share of s on a GPU with f units free
loses K(f) - K(f - s) - pi(s) >= 0, zero exactly when the GPU stays on an optimal pattern. The
prototype adds `--weight` x that loss to frag's price of every candidate GPU.

    python bench/share_packing_bound.py [--pods ...openb_pod_list_default.csv] [--variant gpushare=60]
    python bench/share_packing_bound.py --per-seed 10 --bound [--exact]
    python bench/share_packing_bound.py --online 10 [--weight 1000] [--variant ...]
    python bench/share_packing_bound.py --online 10 --commit basis [--order abc|acb|soft|c] [--bonus 10]
    python bench/share_packing_bound.py --online 10 --host 0.5 [--variant ...]
    python bench/share_packing_bound.py --lp [--variant ...]

`--commit` (issue 12, experiment; a negative result): online pattern commitment (Gupta & Radovanovic,
"Online stochastic bin packing"; Csirik et al.'s sum of squares with a known distribution). Each
partly used GPU gets a target, one of the LP optimum's patterns (`patterns.solve_packing_lp`'s basis),
GPUs are committed to patterns in the LP's proportions x_p, and a share goes (a) to a GPU whose target
has a slot for it, (b) else to an empty GPU given the pattern holding its size most behind x_p, (c) else
where frag + the price puts it (`PatternCommit`, `online_commit`; `--order acb`: frag's choice before
(b) when it loses nothing at the price; `soft`: frag + price with slots `--bonus` better; `c`: frag +
price alone through the same loop, which reproduces `online_frag` to the last digit). Seeds 0-9:
abc 4.578, acb 4.323, soft (bonus 10) 4.277, against frag + price 4.281; seeds 0-1 `gpushare=100`
12.32 against 11.80, `gpuspec=33` 11.31 against 11.07. Committed GPUs wait for the partner their
target names and are left half full when the arrivals stop (51,000 units in open targets on seed 0
against 28,000), where frag + price pairs a 460 with a 470 as readily as with a 460.

`--host Q` (found on the way): what frag + price still loses is mostly GPUs half full on nodes whose
CPU or memory is gone (seed 0: a 470, 650, 230 + 470 or 220 + 230 alone on 45 GPUs no pod can reach,
18,600 units, most of the 20,000 frag + price leaves above the CPU-blind optimum). `host_gap_loss`
prices that: a gap is worth K_h, the knapsack over the sizes whose pods (the Q quantile of their CPU
and memory asks) the node can still host, and a share costs V(before) - V(after) - pi(s), V the sum of
K_h over the node's partly used GPUs (node-local; with no CPU known it is the plain price). Seeds 0-9
at Q 0.5: 3.988 against 4.281, lower on every seed (Q 0.25 / 1 / 0: 3.950 / 3.951 / 4.004; CPU alone
4.018; GPU i alone, not the node's other GPUs, 4.007); held out, seeds 10-19: 3.945 against 4.266,
lower on every seed (Q 0.25: 3.959). `gpushare=100` seeds 0-1: 11.70 against 11.80; `gpuspec=33`
seeds 0-4: 11.06 against 10.95, worse on every seed (a model-aware K_h changes nothing there, nor does
a tenth of the weight on the host part). Now in `frag` (`Pricer.host_gap`, docs/simulator.md `frag`
item 7), with CPU-only and whole-GPU pods also charged for the gaps they strand (`host_strand`), which
won `gpuspec=33` back (10.86) and gives 3.927 on seeds 0-9; this prototype stays as it was measured.

`--lp`: the product's own solver of that LP (`share_placement/patterns.py`, pure Python, exact) on the
trace's learned share sizes: its solve time, pivots and optimum, and its prices against HiGHS's (when
scipy is installed). `frag` solves it once per learned table, on first use.

One piece: one experiment script; its bounds share the arrivals, the LP and the report.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from share_placement import Demand
from share_placement import FragPolicy
from share_placement import NodeView
from share_placement import eligible_positions
from share_placement import fragmentation_units
from share_placement import shift_aggregates
from share_placement.model import model_allowed
from share_scheduler.sim import variants
from share_scheduler.sim.engine import arrivals_until
from share_scheduler.sim.workload import Workload
from share_scheduler.sim.workload import load_openb

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


def first_fit_decreasing(sizes: list[int], capacity: int) -> list[int]:
    """Room left in each bin after packing `sizes` first-fit decreasing."""
    bins: list[int] = []
    for s in sorted(sizes, reverse=True):
        for i, room in enumerate(bins):
            if room >= s:
                bins[i] = room - s
                break
        else:
            bins.append(capacity - s)
    return bins


def best_fit_decreasing(sizes: list[int], capacity: int) -> list[int]:
    """Room left in each bin after packing `sizes` best-fit decreasing (the bin left with least room)."""
    bins: list[int] = []
    for s in sorted(sizes, reverse=True):
        best = -1
        for i, room in enumerate(bins):
            if room >= s and (best < 0 or room < bins[best]):
                best = i
        if best < 0:
            bins.append(capacity - s)
        else:
            bins[best] -= s
    return bins


def patterns(sizes: list[int], capacity: int) -> list[tuple[int, ...]]:
    """Every non-empty multiset of `sizes` (how many of each, in `sizes`' order) that fits `capacity`."""
    out: list[tuple[int, ...]] = []
    counts = [0] * len(sizes)

    def walk(i: int, room: int) -> None:
        if i == len(sizes):
            if any(counts):
                out.append(tuple(counts))
            return
        for c in range(room // sizes[i] + 1):
            counts[i] = c
            walk(i + 1, room - c * sizes[i])
        counts[i] = 0

    walk(0, capacity)
    return out


def pattern_values(counts: Mapping[int, int], prices: Mapping[int, float], capacity: int) -> list[float]:
    """For every room r up to `capacity`: max over patterns fitting r of sum(size - price) (bounded
    knapsack, exact).

    A pattern holds at most as many pods of a size as arrived: the LP without the others is smaller
    and still a relaxation (no real GPU holds more), so prices checked against this bound it too."""
    best = [0.0] * (capacity + 1)  # best[r]: the most earned with at most r units
    for s, n in counts.items():
        gain = s - prices.get(s, 0.0)
        if gain <= 0 or s > capacity:
            continue
        for _ in range(min(n, capacity // s)):  # one copy at a time: 0/1 knapsack per copy
            for r in range(capacity, s - 1, -1):
                v = best[r - s] + gain
                if v > best[r]:
                    best[r] = v
    return best


def best_pattern_value(counts: Mapping[int, int], prices: Mapping[int, float], capacity: int) -> float:
    """What one GPU of shares earns at `prices` (`pattern_values` at full capacity)."""
    return pattern_values(counts, prices, capacity)[capacity]


def dual_bound(
    counts: Mapping[int, int],
    whole_gpus: int,
    gpus: int,
    capacity: int,
    prices: Mapping[int, float],
    place_all: bool = False,
) -> float:
    """An upper bound on the units ANY placement allocates (weak duality of the pattern LP).

    The dual: prices p(s) >= 0 on the share sizes, u per GPU, v per whole GPU asked, with
    u >= what any pattern earns at those prices (sum of size - p(s)) and u + v >= capacity. For given
    prices, u is at least the most one GPU of shares earns (`best_pattern_value`, k); then either
    u = k, v = capacity - k, or u = max(k, capacity), v = 0: both feasible, so the smaller
    gpus x u + whole_gpus x v + sum(count(s) x p(s)) bounds the LP and hence every packing.
    With `place_all` (every share must be placed: equalities) the prices may be negative."""
    if not place_all and any(p < 0 for p in prices.values()):
        raise ValueError("prices must be non-negative")
    k = best_pattern_value(counts, prices, capacity)
    per_gpu = min(gpus * k + whole_gpus * max(0.0, capacity - k), gpus * max(k, capacity))
    return per_gpu + sum(n * prices.get(s, 0.0) for s, n in counts.items())


def lp_prices(
    counts: Mapping[int, int],
    whole_gpus: int,
    gpus: int,
    capacity: int,
    exact: bool = False,
    place_all: bool = False,
) -> tuple[float, dict[int, float], float | None]:
    """The pattern LP's optimum and dual prices (scipy's HiGHS); with `exact`, the integer program's
    proven upper bound too (the best bound branch and bound closed on). `place_all`: every share is
    placed (no share may fail), not a relaxation of every placement but of those that place them all."""
    import numpy as np
    from scipy.optimize import Bounds
    from scipy.optimize import LinearConstraint
    from scipy.optimize import linprog
    from scipy.optimize import milp
    from scipy.sparse import lil_matrix

    sizes = sorted(counts)
    pats = patterns(sizes, capacity)
    rows = len(sizes) + 2  # per size; GPUs; whole GPUs
    a = lil_matrix((rows, len(pats) + 1))
    for j, pat in enumerate(pats):
        for i, c in enumerate(pat):
            if c:
                a[i, j] = c
        a[len(sizes), j] = 1
    a[len(sizes), len(pats)] = 1
    a[len(sizes) + 1, len(pats)] = 1
    a = a.tocsr()
    gain = np.array([sum(c * s for c, s in zip(p, sizes, strict=True)) for p in pats] + [capacity], float)
    ub = np.array([counts[s] for s in sizes] + [gpus, whole_gpus], float)
    n = len(sizes)
    if place_all:
        lp = linprog(-gain, A_ub=a[n:], b_ub=ub[n:], A_eq=a[:n], b_eq=ub[:n], bounds=(0, None), method="highs")
    else:
        lp = linprog(-gain, A_ub=a, b_ub=ub, bounds=(0, None), method="highs")
    if lp.status != 0:
        raise RuntimeError(f"pattern LP failed: {lp.message}")
    if place_all:
        prices = {s: -float(m) for s, m in zip(sizes, lp.eqlin.marginals, strict=True)}
    else:
        prices = {s: max(0.0, -float(m)) for s, m in zip(sizes, lp.ineqlin.marginals[:n], strict=True)}
    proven = None
    if exact:
        ip = milp(
            -gain,
            constraints=LinearConstraint(
                a, np.where(np.arange(len(ub)) < n, ub, -np.inf) if place_all else -np.inf, ub
            ),
            integrality=np.ones(len(pats) + 1),
            bounds=Bounds(0, np.inf),
            options={"time_limit": 120},
        )
        proven = -float(ip.mip_dual_bound)
    return -float(lp.fun), prices, proven


def min_bins_prices(counts: Mapping[int, int], capacity: int) -> dict[int, float]:
    """Dual prices of the LP that packs `counts` into the fewest bins, in units (x capacity)."""
    import numpy as np
    from scipy.optimize import linprog

    sizes = sorted(counts)
    pats = patterns(sizes, capacity)
    a = np.array(pats, float).T
    lp = linprog(np.ones(len(pats)), A_ub=-a, b_ub=-np.array([counts[s] for s in sizes], float), method="highs")
    if lp.status != 0:
        raise RuntimeError(f"bin-packing LP failed: {lp.message}")
    return {s: -float(m) * capacity for s, m in zip(sizes, lp.ineqlin.marginals, strict=True)}


def gap_loss(counts: Mapping[int, int], capacity: int) -> Callable[[int, int], float]:
    """loss(f, s): K(f) - K(f - s) - pi(s), the LP's reduced cost of putting s where f is free."""
    prices = min_bins_prices(counts, capacity)
    unbounded = {s: capacity // s for s in counts}
    k = pattern_values(unbounded, {s: s - p for s, p in prices.items()}, capacity)
    return lambda f, s: k[f] - k[f - s] - prices[s]


def online_frag(workload: Workload, seed: int, loss: Callable[[int, int], float] | None, weight: float) -> float:
    """Unallocated % at arrived 100 % for `frag` (engine.simulate's loop and ties), with `weight` x
    `loss` added to the price of each GPU a sharing pod could take (None: frag as it is)."""
    policy = FragPolicy(gap_weight=0)  # frag alone: the gap price is what this loop adds, or not
    for pod in workload.pods:
        policy.observe(pod.demand())
    unit = variants.gpu_unit(workload)
    views: list[NodeView] = [(tuple((n.model, g) for g in n.gpus), n.cpu, n.memory) for n in workload.nodes]
    members: dict[NodeView, list[int]] = {}
    for i, v in enumerate(views):
        members.setdefault(v, []).append(i)
    memo: dict[tuple[NodeView, Demand], Any] = {}
    placed = 0
    for k in arrivals_until(workload, seed):
        pod = workload.pods[k]
        d = pod.demand()
        share = loss is not None and d.count == 1 and 0 < d.per_gpu < unit
        best: tuple[float, int, tuple[int, ...]] | None = None
        for v, nodes in members.items():
            got = memo.get((v, d), memo)
            if got is memo:
                got = memo[(v, d)] = share_candidates(policy, v, d) if share else policy.evaluate(v, d)
            options = got if share else ([] if got is None else [got])
            for score, chosen in options:
                if share:
                    score -= weight * loss(v[0][chosen[0]][1], d.per_gpu)  # type: ignore[misc]
                if best is None or score > best[0] or (score == best[0] and nodes[0] < best[1]):
                    best = (score, nodes[0], chosen)
        if best is None:
            continue
        _, n, chosen = best
        placed += pod.gpu_request
        place(views, members, n, chosen, d)
    return 100 - 100 * placed / workload.gpu_capacity


def place(
    views: list[NodeView], members: dict[NodeView, list[int]], n: int, chosen: tuple[int, ...], d: Demand
) -> None:
    """Node `n` takes the pod on GPUs `chosen`: its view moves from one group of equal nodes to another."""
    old = views[n]
    gpus = list(old[0])
    for p in chosen:
        gpus[p] = (gpus[p][0], gpus[p][1] - d.per_gpu)
    new: NodeView = (
        tuple(gpus),
        None if old[1] is None else old[1] - d.cpu,
        None if old[2] is None else old[2] - d.memory,
    )
    views[n] = new
    members[old].remove(n)
    if not members[old]:
        del members[old]
    members.setdefault(new, []).append(n)
    members[new].sort()


def share_candidates(policy: Any, view: NodeView, demand: Demand) -> list[tuple[float, tuple[int, ...]]]:
    """frag's score (`FragPolicy._evaluate` with CPU known) of every distinct GPU a share could take."""
    _ = policy.table
    elig = eligible_positions(view, demand)
    if elig is None:
        return []
    gpus, cpu_free, _ = view
    table, per = policy.table, demand.per_gpu
    cpu_after = cpu_free - demand.cpu
    total = sum(f for _, f in gpus)
    before = policy.node_units(gpus, cpu_free)
    aggs = policy.aggregates(tuple(sorted(gpus)))
    out, seen = [], set()
    for i in elig:
        if gpus[i] in seen:
            continue
        seen.add(gpus[i])
        m, f = gpus[i]
        after = fragmentation_units(
            total - per, shift_aggregates(aggs, table, m, f, f - per), cpu_after, table, policy._wa, policy._wb
        )
        out.append(policy._finish(after - before, f - per, (i,), gpus, per, cpu_after))
    return out


class PatternCommit:
    """Pattern commitment (Gupta & Radovanovic; Csirik et al.'s known-distribution SS): each partly used
    GPU is meant to become one of the bin-packing LP's patterns (its "target"), GPUs are committed to
    the patterns in the LP's proportions x_p, and a share goes (a) to a GPU whose target still has a
    slot for its size, else (b) to an empty GPU whose new target is the pattern holding its size that
    is most behind x_p, else (c) where `frag` (+ the gap price) puts it.

    `mode` "basis": the targets are the optimal basis's patterns (`patterns.solve_packing_lp`), the
    proportions theirs. "zero": any pattern of zero reduced cost at the LP's prices (a full GPU's worth
    of prices, within the sizes' counts) may be a target kept on retargeting; proportions still x_p's
    for the basis ones (the others count as behind by nothing: only taken to keep a GPU targeted).
    Targets live per GPU (`target`), with `count[p]` GPUs currently targeted at pattern p."""

    def __init__(self, counts: Mapping[int, int], capacity: int, mode: str = "basis") -> None:
        from share_placement.patterns import solve_packing_lp

        lp = solve_packing_lp(counts, capacity)
        sizes = sorted(s for s, n in counts.items() if 0 < s <= capacity and n > 0)
        self.pats: list[Counter[int]] = []
        self.x: list[float] = []
        for pat, x in lp.packing:
            self.pats.append(Counter({s: c for s, c in zip(sizes, pat, strict=True) if c}))
            self.x.append(float(x))
        if mode == "zero":
            seen = {tuple(sorted(p.items())) for p in self.pats}
            price = lp.prices
            for pat in patterns(sizes, capacity):
                c = Counter({s: k for s, k in zip(sizes, pat, strict=True) if k})
                key = tuple(sorted(c.items()))
                if key in seen or sum(price[s] * k for s, k in c.items()) != 1:
                    continue
                if any(price[s] == 0 for s in c):  # zero-priced fillers: only the basis's
                    continue
                seen.add(key)
                self.pats.append(c)
                self.x.append(0.0)
        self.mode = mode
        self.count = [0] * len(self.pats)
        self.target: dict[tuple[int, int], int] = {}
        self.held: dict[tuple[int, int], Counter[int]] = {}
        self.slots: dict[int, set[tuple[int, int]]] = {}
        self.stats: Counter[str] = Counter()
        self.views: list[NodeView] = []  # the cluster at the end of `online_commit`, for a look at it

    def _open(self, gpu: tuple[int, int]) -> Counter[int]:
        p = self.target.get(gpu)
        if p is None:
            return Counter()
        return self.pats[p] - self.held.get(gpu, Counter())

    def _set(self, gpu: tuple[int, int], p: int | None) -> None:
        old = self.target.pop(gpu, None)
        if old is not None:
            self.count[old] -= 1
            for s in self.pats[old]:
                self.slots.get(s, set()).discard(gpu)
        if p is None:
            return
        self.target[gpu] = p
        self.count[p] += 1
        for s in self._open(gpu):
            self.slots.setdefault(s, set()).add(gpu)

    def behind(self, p: int) -> tuple[float, float, int]:
        """Sort key: the pattern most behind its share x_p first (count / x_p; unlisted ones last)."""
        x = self.x[p]
        return (self.count[p] / x if x > 0 else math.inf, -x, p)

    def new_target(self, size: int) -> int | None:
        ps = [p for p, c in enumerate(self.pats) if c[size] and self.x[p] > 0]
        return min(ps, key=self.behind) if ps else None

    def placed(self, gpu: tuple[int, int], size: int | None, fresh: int | None = None) -> None:
        """A share of `size` (None: anything else, e.g. part of a multi-GPU pod) landed on `gpu`;
        `fresh`: the target chosen for a GPU that was empty."""
        held = self.held.setdefault(gpu, Counter())
        if size is None:
            held[-1] += 1
            self._set(gpu, None)
            return
        if fresh is not None:
            self._set(gpu, fresh)
        had_slot = self._open(gpu)[size] > 0
        held[size] += 1
        if had_slot:
            if self._open(gpu)[size] == 0:
                self.slots[size].discard(gpu)
            self.stats["slot"] += 1
            return
        # Off target (or none): the pattern holding what is on the GPU now that is most behind x_p.
        ps = [p for p, c in enumerate(self.pats) if not (held - c)]
        self.stats["retarget" if ps else "untargeted"] += 1
        self._set(gpu, min(ps, key=self.behind) if ps else None)


def host_gap_loss(
    workload: Workload,
    capacity: int,
    quantile: float = 0.0,
    memory: bool = True,
    node: bool = True,
    models: bool = False,
) -> Callable[[NodeView, Demand, int], float]:
    """A node-level, CPU- and memory-aware `gap_loss` (a side experiment of the commitment try).

    A gap is worth K_h(f), the knapsack of the LP's prices over only the share sizes whose pods the node
    can still host (the `quantile` of that size's CPU and memory asks, 0: the smallest, fits what the
    node has free). Putting a share of s on GPU i loses V(before) - V(after) - pi(s), V the sum of K_h
    over the node's partly used GPUs and GPU i, each side with its own free CPU and memory: zero when
    the GPU stays on an optimal pattern that the node can still host, the price of the stranded rest
    when it cannot. `memory` False: CPU alone decides what the node can host; `node` False: V is GPU i's
    K_h alone (the node's other partly used GPUs left out); `models`: a size counts on a GPU only
    through the pods that may run on its model (their own quantile), none: not at all."""
    shares = [p for p in workload.pods if p.count == 1 and 0 < p.per_gpu < capacity]
    counts = Counter(p.per_gpu for p in shares)
    prices = min_bins_prices(counts, capacity)
    needs: dict[str, dict[int, tuple[int, int]]] = {}

    def need(model: str) -> dict[int, tuple[int, int]]:
        got = needs.get(model if models else "")
        if got is None:
            got = needs[model if models else ""] = {}
            for s in counts:
                pods = [
                    p
                    for p in shares
                    if p.per_gpu == s and (not models or not p.models or model_allowed(p.models, model))
                ]
                if not pods:
                    continue
                cpus = sorted(p.cpu for p in pods)
                mems = sorted(p.memory for p in pods)
                q = min(len(cpus) - 1, int(quantile * len(cpus)))
                got[s] = (cpus[q], mems[q])
        return got

    tables: dict[frozenset[int], list[float]] = {}

    def k(model: str, cpu: int | None, mem: int | None) -> list[float]:
        avail = frozenset(
            s for s, (c, m) in need(model).items() if (cpu is None or c <= cpu) and (mem is None or m <= mem)
        )
        got = tables.get(avail)
        if got is None:
            sizes = {s: capacity // s for s in avail}
            got = tables[avail] = pattern_values(sizes, {s: s - prices[s] for s in avail}, capacity)
        return got

    def loss(view: NodeView, d: Demand, i: int) -> float:
        gpus, cpu, mem = view
        if not memory:
            mem = None
        cpu1 = None if cpu is None else cpu - d.cpu
        mem1 = None if mem is None else mem - d.memory
        caps = capacity if node else 0
        v = 0.0
        for g, (m, f) in enumerate(gpus):
            if g == i:
                v += k(m, cpu, mem)[f] - k(m, cpu1, mem1)[f - d.per_gpu]
            elif 0 < f < caps:
                v += k(m, cpu, mem)[f] - k(m, cpu1, mem1)[f]
        return v - prices[d.per_gpu]

    return loss


def online_commit(
    workload: Workload,
    seed: int,
    loss: Callable[[int, int], float],
    weight: float,
    mode: str = "basis",
    order: str = "abc",
    bonus: float = 0.0,
    host: Callable[[NodeView, Demand, int], float] | None = None,
) -> tuple[float, Counter[str]]:
    """`online_frag` with the LP gap price and pattern commitment (`PatternCommit`) for sharing pods.

    `order` "abc": slot, else empty GPU, else frag; "acb": slot, else frag's choice if it loses nothing
    at the gap price (a zero-loss gap elsewhere), else empty GPU, else frag; "soft": frag's choice, a
    GPU with a slot for the share priced `bonus` better, an empty GPU taken by frag given the pattern
    most behind; "c": frag + price alone (checks that this loop reproduces `online_frag`)."""
    policy = FragPolicy(gap_weight=0)
    for pod in workload.pods:
        policy.observe(pod.demand())
    unit = variants.gpu_unit(workload)
    counts = Counter(p.per_gpu for p in workload.pods if p.count == 1 and 0 < p.per_gpu < unit)
    commit = PatternCommit(counts, unit, mode)
    cap = [list(n.gpus) for n in workload.nodes]
    views: list[NodeView] = [(tuple((n.model, g) for g in n.gpus), n.cpu, n.memory) for n in workload.nodes]
    members: dict[NodeView, list[int]] = {}
    for i, v in enumerate(views):
        members.setdefault(v, []).append(i)
    memo: dict[tuple[NodeView, Demand], Any] = {}
    scored: dict[tuple[NodeView, Demand], dict[tuple[str, int], float]] = {}

    def score_map(v: NodeView, d: Demand) -> dict[tuple[str, int], float]:
        got = scored.get((v, d))
        if got is None:
            got = scored[(v, d)] = {
                v[0][c[0]]: s - weight * (loss(v[0][c[0]][1], d.per_gpu) if host is None else host(v, d, c[0]))
                for s, c in share_candidates(policy, v, d)
            }
        return got

    placed = 0
    for k in arrivals_until(workload, seed):
        pod = workload.pods[k]
        d = pod.demand()
        share = d.count == 1 and 0 < d.per_gpu < unit
        pick: tuple[int, tuple[int, ...]] | None = None
        fresh = None
        if share:
            s = d.per_gpu
            best_a: tuple[float, int, int] | None = None
            for n, g in commit.slots.get(s, ()):
                sc = score_map(views[n], d).get(views[n][0][g])
                if sc is not None and (best_a is None or sc > best_a[0] or (sc == best_a[0] and (n, g) < best_a[1:])):
                    best_a = (sc, n, g)
            best: tuple[float, int, int] | None = None  # any GPU (c)
            best_b: tuple[float, int, int] | None = None  # an empty one (b)
            if best_a is None or order in ("c", "soft"):
                for v, nodes in members.items():
                    for (m, f), sc in score_map(v, d).items():
                        g = v[0].index((m, f))
                        if best is None or sc > best[0] or (sc == best[0] and nodes[0] < best[1]):
                            best = (sc, nodes[0], g)
                        if f == cap[nodes[0]][g] and (
                            best_b is None or sc > best_b[0] or (sc == best_b[0] and nodes[0] < best_b[1])
                        ):
                            best_b = (sc, nodes[0], g)
            if order == "c":  # validation: frag + price alone, through this loop
                best_a = best_b = None
            if best_a is not None and (order != "soft" or best is None or best_a[0] + bonus >= best[0]):
                pick = (best_a[1], (best_a[2],))
                commit.stats["a"] += 1
            elif order == "soft" or best_b is None:
                if best is not None:
                    pick = (best[1], (best[2],))
                    empty = views[best[1]][0][best[2]][1] == cap[best[1]][best[2]]
                    fresh = commit.new_target(s) if empty and order == "soft" else None
                    commit.stats["b" if fresh is not None else "c"] += 1
            else:
                fresh = commit.new_target(s)
                use_c = best is not None and (
                    fresh is None
                    or (
                        order == "acb"
                        and views[best[1]][0][best[2]][1] < cap[best[1]][best[2]]
                        and loss(views[best[1]][0][best[2]][1], s) == 0
                    )
                )
                if use_c and best is not None:
                    pick = (best[1], (best[2],))
                    fresh = None
                    commit.stats["c"] += 1
                else:
                    pick = (best_b[1], (best_b[2],))
                    commit.stats["b"] += 1
        else:
            bestw: tuple[float, int, tuple[int, ...]] | None = None
            for v, nodes in members.items():
                got = memo.get((v, d), memo)
                if got is memo:
                    got = memo[(v, d)] = policy.evaluate(v, d)
                if got is None:
                    continue
                sc, chosen = got
                if bestw is None or sc > bestw[0] or (sc == bestw[0] and nodes[0] < bestw[1]):
                    bestw = (sc, nodes[0], chosen)
            if bestw is not None:
                pick = (bestw[1], bestw[2])
        if pick is None:
            commit.stats["failed share" if share else "failed other"] += 1
            continue
        n, chosen = pick
        placed += pod.gpu_request
        if d.per_gpu < unit:
            for p in chosen:
                commit.placed((n, p), d.per_gpu if share else None, fresh)
        place(views, members, n, chosen, d)
    for n, v in enumerate(views):  # what is left: partly used GPUs by gap, targets left open
        for g, (_, f) in enumerate(v[0]):
            if 0 < f < cap[n][g]:
                commit.stats[f"gap {f}"] += 1
                if commit._open((n, g)):
                    commit.stats[f"open {f}"] += 1
    commit.views = views
    return 100 - 100 * placed / workload.gpu_capacity, commit.stats


def online(
    workload: Workload,
    seeds: int,
    weight: float,
    commit: str | None = None,
    order: str = "abc",
    bonus: float = 0.0,
    host: float | None = None,
) -> None:
    """frag without and with the LP's gap price, seed by seed (see the module docstring); with `commit`
    or `host` (a quantile for `host_gap_loss`), frag + the price against frag + the price with pattern
    commitment (`online_commit`) and/or the host-aware price instead."""
    unit = variants.gpu_unit(workload)
    counts = Counter(p.per_gpu for p in workload.pods if p.count == 1 and 0 < p.per_gpu < unit)
    loss = gap_loss(counts, unit)
    if commit or host is not None:
        hloss = None if host is None else host_gap_loss(workload, unit, host)
        what = (f"commitment ({commit}, {order}, {bonus:g})" if commit else "") + (
            f" host-aware price (q {host:g})" if hloss else ""
        )
        pairs = []
        for s in range(seeds):
            a = online_frag(workload, s, loss, weight)
            b, stats = online_commit(
                workload, s, loss, weight, commit or "basis", order if commit else "c", bonus, hloss
            )
            pairs.append((a, b))
            print(
                f"seed {s}: frag + price {a:.3f}  {what.strip()} {b:.3f}  "
                + str({k: v for k, v in stats.items() if not k.startswith(("gap", "open"))}),
                flush=True,
            )
        print(f"mean: {sum(a for a, _ in pairs) / seeds:.3f}  {sum(b for _, b in pairs) / seeds:.3f}")
        return
    rows = [(online_frag(workload, s, None, weight), online_frag(workload, s, loss, weight)) for s in range(seeds)]
    for s, (a, b) in enumerate(rows):
        print(f"seed {s}: frag {a:.2f}  frag + LP gap price x {weight:g}: {b:.2f}")
    print(f"mean: {sum(a for a, _ in rows) / seeds:.3f}  {sum(b for _, b in rows) / seeds:.3f}")


def lp_timing(workload: Workload, runs: int = 20) -> None:
    """The pure-Python LP on the trace's share sizes: best and median solve time, and HiGHS's prices."""
    import statistics
    import time

    from share_placement.patterns import GapPrices
    from share_placement.patterns import solve_packing_lp

    unit = variants.gpu_unit(workload)
    counts = Counter(p.per_gpu for p in workload.pods if p.count == 1 and 0 < p.per_gpu < unit)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        lp = solve_packing_lp(counts, unit)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    GapPrices(counts, unit)
    gap = time.perf_counter() - t0
    print(f"{len(counts)} share sizes, GPU of {unit}: {float(lp.bins):.3f} GPUs at the LP optimum, {lp.pivots} pivots")
    print(
        f"solve: best {min(times) * 1e3:.2f} ms, median {statistics.median(times) * 1e3:.2f} ms over {runs}; "
        f"with the gap table K up to one GPU: {gap * 1e3:.2f} ms"
    )
    print("prices (x GPU): " + " ".join(f"{s}:{lp.prices[s]}" for s in sorted(lp.prices)))
    try:
        highs = min_bins_prices(counts, unit)
    except ImportError:
        return
    diff = max(abs(float(lp.prices[s]) * unit - highs[s]) for s in counts)
    print(f"largest difference from HiGHS's prices: {diff:.2e} units")


def per_seed(workload: Workload, seeds: int, bound: bool, exact: bool, place_all: bool = False) -> None:
    """One row per seed: the arrivals up to arrived 100 %, their offline packings and the lower bound."""
    unit = variants.gpu_unit(workload)
    if any(g != unit for n in workload.nodes for g in n.gpus):
        raise SystemExit("--per-seed assumes GPUs of one size (the openb trace)")
    cap, gpus = workload.gpu_capacity, workload.gpu_count
    pods = workload.pods
    head = "seed arrivals shares whole-GPUs   FFD  BFD"
    print(head + ("   LP bound (checked)" + ("  integer bound" if exact else "") if bound else ""))
    sums: dict[str, float] = Counter()
    for seed in range(seeds):
        arrived = arrivals_until(workload, seed)
        shares = [pods[k].per_gpu for k in arrived if pods[k].count == 1 and pods[k].per_gpu < unit]
        whole = sum(pods[k].count for k in arrived if pods[k].count > 0 and pods[k].per_gpu >= unit)
        row = f"{seed:4d} {len(arrived):8d} {len(shares):6d} {whole:10d}"
        for name, pack in (("ffd", first_fit_decreasing), ("bfd", best_fit_decreasing)):
            bins = pack(shares, unit)
            placed = sum(shares) + unit * max(0, min(whole, gpus - len(bins)))
            pct = 100 * (cap - placed) / cap
            sums[name] += pct
            row += f" {pct:5.2f}"
        if bound:
            counts = Counter(shares)
            lp, prices, proven = lp_prices(counts, whole, gpus, unit, exact, place_all)
            checked = dual_bound(counts, whole, gpus, unit, prices, place_all)
            if checked < lp - 1e-6 * cap:  # cannot happen: weak duality
                raise AssertionError(f"seed {seed}: dual {checked} below the LP optimum {lp}")
            pct = 100 * (cap - min(checked, cap)) / cap
            sums["lp"] += pct
            row += f"   {pct:8.3f} (LP {100 * (cap - lp) / cap:.3f})"
            if proven is not None:
                ipct = 100 * (cap - math.floor(proven + 1e-6)) / cap
                sums["ip"] += ipct
                row += f"  {ipct:8.3f}"
        print(row)
    means = " ".join(f"{k} {v / seeds:.3f}" for k, v in sums.items())
    print(f"mean over {seeds} seeds (unallocated GPU % at arrived 100 %): {means}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"))
    ap.add_argument("--variant", help="a share-sim variant, e.g. gpushare=60")
    ap.add_argument("--per-seed", type=int, metavar="N", help="seeds 0..N-1: the simulator's own arrivals")
    ap.add_argument("--bound", action="store_true", help="with --per-seed: the lower bound (needs scipy)")
    ap.add_argument("--exact", action="store_true", help="with --bound: also the integer program's bound")
    ap.add_argument(
        "--place-all", action="store_true", help="with --bound: no share may fail (placements that place all)"
    )
    ap.add_argument("--online", type=int, metavar="N", help="seeds 0..N-1: frag with the LP's gap price (needs scipy)")
    ap.add_argument("--weight", type=float, default=1000.0, help="with --online: the gap price's weight (1000)")
    ap.add_argument(
        "--commit",
        choices=("basis", "zero"),
        help="with --online: frag + price against pattern commitment (its targets)",
    )
    ap.add_argument(
        "--order", default="abc", choices=("abc", "acb", "soft", "c"), help="with --commit: where a share goes"
    )
    ap.add_argument("--bonus", type=float, default=0.0, help="with --order soft: a slot's price advantage")
    ap.add_argument(
        "--host", type=float, metavar="Q", help="with --online: the host-aware gap price, sizes' CPU/memory quantile Q"
    )
    ap.add_argument("--lp", action="store_true", help="time the product's pure-Python LP on the trace's shares")
    args = ap.parse_args()
    workload = load_openb(args.nodes, args.pods)
    if args.variant:
        workload = variants.derive(workload, args.variant)
    if args.lp:
        lp_timing(workload)
        return
    if args.online:
        online(workload, args.online, args.weight, args.commit, args.order, args.bonus, args.host)
        return
    if args.per_seed:
        per_seed(workload, args.per_seed, args.bound, args.exact, args.place_all)
        return
    unit = variants.gpu_unit(workload)
    shares = [p.per_gpu for p in workload.pods if p.count == 1 and p.per_gpu < unit]
    demand = sum(p.gpu_request for p in workload.pods)
    bins = first_fit_decreasing(shares, unit)
    waste = sum(bins)
    # At arrived 100 % the arrivals are the trace scaled to the cluster's capacity.
    scale = workload.gpu_capacity / demand
    print(f"{len(shares)} sharing pods in {len(bins)} GPUs, {waste} units left in them")
    print(
        f"unallocated GPU % at arrived 100 % that an offline first-fit-decreasing packing of the sharing pods "
        f"alone leaves: {100 * waste * scale / workload.gpu_capacity:.2f}"
    )


if __name__ == "__main__":
    main()
