"""The learned workload (pod classes and how often each arrives) and the fragmentation it implies.

`frag` prices placements against these tables; `fgd` has its own (`share_placement.fgd.TypicalPods`).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from share_placement.model import GpuView
from share_placement.model import model_allowed

# A pod class as the learning policies count it: (GPU share, GPUs, models allowed (lower case), CPU).
ClassKey = tuple[int, int, tuple[str, ...], int]

# ---------------------------------------------------------------------------------------------------
# Fragmentation-aware placement.
#
# FGD (Weng et al., ATC '23) defines the fragmentation of a node for a pod class as the free GPU
# capacity that class cannot use there: all of it if the class cannot be hosted at all (wrong model,
# too few GPUs with room, too little CPU), otherwise the free capacity of the GPUs too small for one
# share. The node's fragmentation is the expectation over the workload's classes, and FGD places each
# pod where that expectation grows least. `frag` does the same with exact (unquantised) deltas, then
# breaks the many exact ties FGD leaves to chance by best fit: the GPU left with the least room, on the
# node left with the least free GPU capacity, then the least free CPU. The learned workload is a table
# of classes refreshed lazily from the observed counts, so observe() stays O(1) on the hot path.
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClassGroup:
    """Pod classes sharing (models, per_gpu, count), with their CPU needs as a cumulative distribution."""

    models: tuple[str, ...]
    per_gpu: int
    count: int
    prob: float  # total probability of the group
    cpus: tuple[int, ...]  # distinct CPU requests, ascending
    cum: tuple[float, ...]  # cum[j] = probability of the classes with cpus[:j]
    weight: int = 0  # pods observed in the group (frag prices in these exact counts)
    wcum: tuple[int, ...] = ()  # wcum[j] = pods observed in the classes with cpus[:j]
    wcpu: tuple[int, ...] = ()  # wcpu[j] = CPU those pods ask in all (sum of pods x cpu)


@dataclass(frozen=True, slots=True)
class WorkloadTable:
    """An immutable snapshot of the learned pod-size distribution (GPU classes only)."""

    groups: tuple[ClassGroup, ...]
    observed: int
    weight: int = 0  # pods observed over all groups (the groups' weights add up to it)

    @staticmethod
    def from_counts(counts: dict[ClassKey, float]) -> WorkloadTable:
        total = sum(counts.values())
        if total <= 0:
            return WorkloadTable((), 0)
        by_group: dict[tuple[tuple[str, ...], int, int], dict[int, float]] = {}
        for (per_gpu, count, models, cpu), n in counts.items():
            if n != int(n) or n < 0:
                raise ValueError(f"pod class counts must be whole numbers, got {n!r}")
            cpus = by_group.setdefault((models, per_gpu, count), {})
            cpus[cpu] = cpus.get(cpu, 0.0) + n
        groups = []
        for (models, per_gpu, count), cpus in sorted(by_group.items()):
            keys = sorted(cpus)
            cum, wcum, wcpu = [0.0], [0], [0]
            for k in keys:
                cum.append(cum[-1] + cpus[k] / total)
                wcum.append(wcum[-1] + int(cpus[k]))
                wcpu.append(wcpu[-1] + int(cpus[k]) * k)
            groups.append(
                ClassGroup(models, per_gpu, count, cum[-1], tuple(keys), tuple(cum), wcum[-1], tuple(wcum), tuple(wcpu))
            )
        return WorkloadTable(tuple(groups), int(total), sum(g.weight for g in groups))


# Rebuild a learned table when the observed count has grown by this fraction (or a class is new; frag: a
# class group): observe() stays O(1), and a table a few percent stale prices the same placements.
TABLE_REFRESH = 0.02


class ObservedClasses:
    """The pods a learning policy (frag, fgd) has observed, per class, and the table it learns from them,
    rebuilt lazily: observe() stays O(1), and the first reader after the counts have grown by TABLE_REFRESH
    (or the policy called the table stale) rebuilds it once."""

    __slots__ = ("at_rebuild", "counts", "observed", "stale")

    def __init__(self) -> None:
        self.counts: dict[ClassKey, float] = {}
        self.observed = 0
        self.at_rebuild = 0  # `observed` when the table was last rebuilt
        self.stale = False

    def add(self, key: ClassKey) -> None:
        """Count one pod of class `key` (under the policy's lock)."""
        self.counts[key] = self.counts.get(key, 0.0) + 1.0
        self.observed += 1
        if self.observed >= (1.0 + TABLE_REFRESH) * max(self.at_rebuild, 1):
            self.stale = True

    def refresh(self, lock: threading.Lock, rebuild: Callable[[dict[ClassKey, float]], None]) -> None:
        """Call `rebuild(counts)` if the table is stale, once, under `lock`; a fresh table costs readers no
        lock."""
        if self.stale:
            with lock:
                if self.stale:
                    rebuild(self.counts)
                    self.at_rebuild = self.observed
                    self.stale = False


# Per class group: (GPUs with room for one share, their free capacity, shares of one GPU they hold).
# Sums over GPUs, so taking a share from one GPU updates them in O(groups), not O(groups x GPUs).
Aggregates = tuple[tuple[int, int, int], ...]


def group_aggregates(gpus: GpuView, table: WorkloadTable) -> Aggregates:
    """The per-group sums `fragmentation` needs from a node's GPUs (CPU plays no part here)."""
    out = []
    for g in table.groups:
        per, models = g.per_gpu, g.models
        room = usable = slots = 0
        for m, f in gpus:
            if f >= per and (not models or model_allowed(models, m)):
                room += 1
                usable += f
                slots += f // per
        out.append((room, usable, slots))
    return tuple(out)


def shift_aggregates(aggs: Aggregates, table: WorkloadTable, model: str, free: int, after: int) -> Aggregates:
    """`aggs` after one GPU of `model` went from `free` to `after` units free (exact integer update)."""
    out = []
    for g, agg in zip(table.groups, aggs, strict=True):
        if g.models and not model_allowed(g.models, model):
            out.append(agg)
            continue
        room, usable, slots = agg
        per = g.per_gpu
        if free >= per:
            room, usable, slots = room - 1, usable - free, slots - free // per
        if after >= per:
            room, usable, slots = room + 1, usable + after, slots + after // per
        out.append((room, usable, slots))
    return tuple(out)


def fill_ratio(fill_weight: float) -> tuple[int, int]:
    """`fill_weight` as a fraction (numerator, denominator <= 1000), so fragmentation is exact."""
    f = Fraction(fill_weight).limit_denominator(1000)
    return f.numerator, f.denominator


def fragmentation(gpus: GpuView, cpu_free: int | None, table: WorkloadTable, fill_weight: float = 0.6) -> float:
    """Expected free GPU capacity on a node that pods drawn from the workload could not use.

    Two views of "could not use", blended by `fill_weight`:
    - next pod (FGD): for a class that cannot be hosted at all (too few GPUs with room, too little
      CPU) all free capacity counts; otherwise the free capacity of the GPUs too small for one share.
    - fill: the free capacity left over after as many pods of the class as the node's GPUs can take,
      all classes' pods sharing the node's CPU as they arrive (in proportion to how often each does).
      FGD misses that 8 free GPUs with CPU for 3 pods strand 5 GPUs, or that two 470-unit shares
      strand 60 units of a GPU; this term sees both. Shared, not class by class: a node with 12 cores
      per GPU is not "too short of CPU" for 18-core pods when the pods that fill it ask 9 on average.
    """
    total = 0
    for _, f in gpus:
        total += f
    return fragmentation_from(total, group_aggregates(gpus, table), cpu_free, table, fill_weight)


def fragmentation_from(
    total: int, aggs: Aggregates, cpu_free: int | None, table: WorkloadTable, fill_weight: float = 0.6
) -> float:
    """`fragmentation` from a node's free total and per-group aggregates (see `group_aggregates`)."""
    wa, wb = fill_ratio(fill_weight)
    units = fragmentation_units(total, aggs, cpu_free, table, wa, wb)
    return units / (table.weight * wb) if units else 0.0


def fragmentation_units(
    total: int, aggs: Aggregates, cpu_free: int | None, table: WorkloadTable, wa: int, wb: int
) -> int:
    """`fragmentation` x `table.weight` x `wb`, in integers (fill weight `wa`/`wb`).

    Per group, with w the fill weight and p the group's probability: a group the node cannot host
    strands all `total` in both views; one it can host strands `p x total - ok x usable` (next pod;
    `ok`: the probability of its classes whose CPU fits) and `p x total - take x ok x slots` (fill:
    `slots` pods of the group on the node's GPUs). As the probabilities add up to 1, the blend is
    `total - (1 - w) x sum(ok x usable) - w x fill`, where fill is `sum(take x ok x slots)` over the
    groups the node can host, in GPU units. With CPU information, the pods that fill the node share
    its free CPU: a stream drawn from the workload asks `sum(slots x sum(p_i x cpu_i))` of it for
    that fill, and when that is more than the node has, the fill shrinks in proportion (rounded down
    to a whole unit of `1 / (table.weight x wb)`). Counted in observed pods instead of probabilities,
    every term is an integer, so equal placements price equal and the incremental pricing below can be
    checked against this for equality, not closeness.
    """
    if total == 0 or not table.groups:
        return 0
    return units_from_sums(total, fragmentation_sums(aggs, cpu_free, table, wa, wb), cpu_free, table, wa, wb)


def fragmentation_sums(
    aggs: Aggregates, cpu_free: int | None, table: WorkloadTable, wa: int, wb: int
) -> tuple[int, int, int]:
    """`fragmentation_units`' pass over the groups: (kept, fill, need). With CPU known they depend on the
    node's free CPU only through which classes' CPU fits it (a bisection per group), so a caller may keep
    them per CPU class; `units_from_sums` finishes them with the exact free CPU."""
    kept = fill = need = 0
    keep_w = wb - wa
    for g, (room, usable, slots) in zip(table.groups, aggs, strict=True):
        count = g.count
        if room < count:
            continue
        if count != 1:
            slots = room // count
        if cpu_free is None:
            kept += g.weight * (keep_w * usable + wa * g.per_gpu * count * slots)
            continue
        j = bisect_right(g.cpus, cpu_free)  # classes whose CPU fits at all
        ok = g.wcum[j]
        kept += keep_w * ok * usable
        fill += ok * g.per_gpu * count * slots
        need += g.wcpu[j] * slots
    return kept, fill, need


def units_from_sums(
    total: int, sums: tuple[int, int, int], cpu_free: int | None, table: WorkloadTable, wa: int, wb: int
) -> int:
    """`fragmentation_units` from `fragmentation_sums`: the fill shrunk where the node's CPU runs out first."""
    kept, fill, need = sums
    if cpu_free is not None:
        if need > cpu_free * table.weight:  # the CPU runs out first: fill in proportion
            fill = fill * cpu_free * table.weight // need
        kept += wa * fill
    return total * table.weight * wb - kept
