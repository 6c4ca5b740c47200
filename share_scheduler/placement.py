"""Where does a pod go? Placement policies: pure functions over plain data.

The extender (filter, prioritize, bind) and the trace simulator call exactly this code, so what the
simulator measures is what the cluster does. Units are whatever the caller counts in (GiB in the
extender, thousandths of a GPU in the simulator).

Every policy has one decision function, ``evaluate(view, demand)``, over a compact ``NodeView``
(plain tuples, cheap to hash and memoise). ``score`` and ``choose`` are thin wrappers that turn a
``NodeState`` into a view and map GPU positions back to GPU indices; the simulator calls ``evaluate``
directly so it need not build ``NodeState`` objects ten million times.
"""

from __future__ import annotations

import math
import random
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from itertools import accumulate, repeat
from operator import itemgetter
from typing import Any, Protocol

from share_scheduler.patterns import GapPrices

NEG_INF = float("-inf")
_MISSING = object()


@dataclass(frozen=True, slots=True)
class GpuSlot:
    index: int
    model: str
    total: int
    free: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as placement sees it; `cpu_free`/`memory_free` of None mean "not checked here"."""

    name: str
    gpus: tuple[GpuSlot, ...]
    cpu_free: int | None = None
    memory_free: int | None = None


@dataclass(frozen=True, slots=True)
class Demand:
    """`count` GPUs with `per_gpu` free each, of a model matching one of `models` (empty: any).

    `cpu` and `memory` are only checked against nodes that report `cpu_free`/`memory_free` (the
    simulator does; the extender leaves CPU and memory to kube-scheduler). `count` 0 is a CPU-only pod.
    """

    per_gpu: int
    count: int = 1
    models: tuple[str, ...] = ()
    cpu: int = 0
    memory: int = 0

    def model_allowed(self, model: str) -> bool:
        if not self.models:
            return True
        return _model_allowed(self.models, model)


def _room_at_least(
    frees: dict[tuple[str, ...], tuple[list[int], list[int]]], gpus: GpuView, models: tuple[str, ...], need: int
) -> tuple[int, int]:
    """(how many of the node's GPUs allowed to `models` have `need` free, their free capacity summed).

    `frees` memoises, per model set, the allowed GPUs' free units sorted with their running sums, so
    one node's keys sharing a model set sort once."""
    fs = frees.get(models)
    if fs is None:
        vals = sorted([f for m, f in gpus if not models or _model_allowed(models, m)])
        fs = frees[models] = (vals, [0, *accumulate(vals)])
    vals, running = fs
    i = bisect_left(vals, need)
    return len(vals) - i, running[-1] - running[i]


@lru_cache(maxsize=4096)
def _model_allowed(models: tuple[str, ...], model: str) -> bool:
    lowered = model.lower()
    return any(m.lower() in lowered for m in models)


# A node reduced to what placement needs: ((model, free) per healthy GPU, cpu_free, memory_free).
GpuView = tuple[tuple[str, int], ...]
NodeView = tuple[GpuView, int | None, int | None]
# What `evaluate` answers: (score, GPU positions in the view), or None when the demand does not fit.
Evaluation = tuple[float, tuple[int, ...]] | None


def node_view(node: NodeState) -> tuple[NodeView, tuple[int, ...]]:
    """The compact view of a node's healthy GPUs, and the GPU index behind each view position."""
    gpus = [g for g in node.gpus if g.healthy]
    view = (tuple([(g.model, g.free) for g in gpus]), node.cpu_free, node.memory_free)
    return view, tuple([g.index for g in gpus])


def _host_fits(view: NodeView, demand: Demand) -> bool:
    _, cpu_free, mem_free = view
    if cpu_free is not None and cpu_free < demand.cpu:
        return False
    return mem_free is None or mem_free >= demand.memory


def eligible_positions(view: NodeView, demand: Demand) -> list[int] | None:
    """View positions of GPUs that can take one share, or None if the node cannot take the demand."""
    if not _host_fits(view, demand):
        return None
    per, models = demand.per_gpu, demand.models
    if models:
        out = [i for i, (m, f) in enumerate(view[0]) if f >= per and _model_allowed(models, m)]
    else:
        out = [i for i, (_, f) in enumerate(view[0]) if f >= per]
    return out if len(out) >= demand.count else None


def fits(node: NodeState, demand: Demand) -> bool:
    return eligible_positions(node_view(node)[0], demand) is not None


class Policy(Protocol):
    name: str
    # True when evaluate() is a pure function of (view, demand) for a fixed learned workload, so a
    # caller may memoise it; the random policy is not.
    cacheable: bool

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        """(score, GPU positions) for this node view, or None if the demand does not fit."""
        ...

    def choose(self, node: NodeState, demand: Demand) -> tuple[int, ...] | None:
        """The GPU indices to use on this node, or None if the demand does not fit."""
        ...

    def score(self, node: NodeState, demand: Demand) -> float:
        """How much this policy likes the node for the demand (higher is better; only order matters)."""
        ...

    def observe(self, demand: Demand) -> None:
        """Learn from a pod the cluster has seen (used by workload-aware policies; others ignore it)."""
        ...


class _ViewPolicy:
    """score/choose over NodeState, both answered by the subclass's evaluate()."""

    name = "base"
    cacheable = True

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:  # pragma: no cover - abstract
        raise NotImplementedError

    def choose(self, node: NodeState, demand: Demand) -> tuple[int, ...] | None:
        view, indices = node_view(node)
        ev = self.evaluate(view, demand)
        if ev is None:
            return None
        return tuple(sorted(indices[p] for p in ev[1]))

    def score(self, node: NodeState, demand: Demand) -> float:
        # node_view's view, built in one pass (no GPU indices needed): this runs for every node.
        view = (tuple([(g.model, g.free) for g in node.gpus if g.healthy]), node.cpu_free, node.memory_free)
        ev = self.evaluate(view, demand)
        return NEG_INF if ev is None else ev[0]

    def observe(self, demand: Demand) -> None:
        pass


def learns(policy: Policy) -> bool:
    """Whether the policy's observe() does anything (binpack, spread, random learn nothing)."""
    return getattr(type(policy), "observe", None) is not _ViewPolicy.observe


def _best_fit(view: NodeView, elig: list[int], count: int) -> tuple[int, ...]:
    gpus = view[0]
    elig.sort(key=lambda i: (gpus[i][1], i))
    return tuple(sorted(elig[:count]))


class BinpackPolicy(_ViewPolicy):
    """Best fit: the GPU(s) left with the least free memory, lowest index on ties."""

    name = "binpack"

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        chosen = _best_fit(view, elig, demand.count)
        gpus = view[0]
        stranded = sum(gpus[i][1] - demand.per_gpu for i in chosen)
        node_free = sum(f for _, f in gpus)
        # Least stranded memory first; among equals, the fuller node.
        return -float(stranded * 1_000_000 + node_free), chosen


class SpreadPolicy(_ViewPolicy):
    """Worst fit: the emptiest GPU(s) on the emptiest node, lowest index on ties."""

    name = "spread"

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        gpus = view[0]
        elig.sort(key=lambda i: (-gpus[i][1], i))
        chosen = tuple(sorted(elig[: demand.count]))
        left = sum(gpus[i][1] - demand.per_gpu for i in chosen)
        node_free = sum(f for _, f in gpus)
        return float(left * 1_000_000 + node_free), chosen


class RandomPolicy(_ViewPolicy):
    """Random fit: a uniformly random score for every node that fits, random GPUs on it (a baseline)."""

    name = "random"
    cacheable = False

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        with self._lock:
            chosen = tuple(sorted(self._rng.sample(elig, demand.count)))
            return self._rng.random(), chosen


class BestFitPolicy(_ViewPolicy):
    """The FGD paper's Best-fit baseline: the node left with the least weighted free CPU and GPU.

    Node score, as in the paper's simulator (kubernetes-scheduler-simulator, ``BestFitScore``):
    ``100 * (1 - (0.5 * cpu_left / cpu_spec + 0.5 * gpu_left / gpu_spec))`` truncated to an integer,
    where ``*_left`` is the node's free CPU and total free GPU after the pod and ``cpu_spec``/``gpu_spec``
    are the largest node's (128 cores and 8 GPUs of 1000 units in the paper). The integer score leaves
    many ties, which kube-scheduler breaks uniformly at random (``random_ties``): the simulator does the
    same, and in the extender kube-scheduler does it itself. GPUs on the node: the one left with the
    least room for a share pod, the lowest-indexed free ones for whole-GPU pods (lowest index on ties).

    Without CPU information (``cpu_free`` None, as in the extender) the score is the GPU term alone,
    unquantised: the node left with the least free GPU, in whatever unit the caller counts.
    """

    name = "bestfit"
    # Equal scores are broken uniformly at random by the caller (kube-scheduler's selectHost).
    random_ties = True
    # The paper's normalisers (millicores, milli-GPU) and weights.
    CPU_SPEC = 128_000
    GPU_SPEC = 8_000

    def __init__(
        self, cpu_spec: int = CPU_SPEC, gpu_spec: int = GPU_SPEC, cpu_weight: float = 0.5, levels: int = 100
    ) -> None:
        if cpu_spec <= 0 or gpu_spec <= 0 or not 0.0 <= cpu_weight <= 1.0 or levels <= 0:
            raise ValueError("bestfit: cpu_spec, gpu_spec and levels must be positive, cpu_weight in [0, 1]")
        self.cpu_spec = cpu_spec
        self.gpu_spec = gpu_spec
        self.cpu_weight = cpu_weight
        self.levels = levels

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        gpus, cpu_free, _ = view
        chosen = _best_fit(view, elig, demand.count)
        gpu_left = sum(f for _, f in gpus) - demand.per_gpu * demand.count
        if cpu_free is None:
            return -float(gpu_left), chosen
        # Same operations in the same order as the paper's Go code, so truncation agrees at the edges.
        left = (cpu_free - demand.cpu) / self.cpu_spec * self.cpu_weight
        left += gpu_left / self.gpu_spec * (1.0 - self.cpu_weight)
        return float(int((1.0 - left) * self.levels)), chosen


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
class _ClassGroup:
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

    groups: tuple[_ClassGroup, ...]
    observed: int
    weight: int = 0  # pods observed over all groups (the groups' weights add up to it)

    @staticmethod
    def from_counts(counts: dict[tuple[int, int, tuple[str, ...], int], float]) -> WorkloadTable:
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
                _ClassGroup(
                    models, per_gpu, count, cum[-1], tuple(keys), tuple(cum), wcum[-1], tuple(wcum), tuple(wcpu)
                )
            )
        return WorkloadTable(tuple(groups), int(total), sum(g.weight for g in groups))


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
            if f >= per and (not models or _model_allowed(models, m)):
                room += 1
                usable += f
                slots += f // per
        out.append((room, usable, slots))
    return tuple(out)


def shift_aggregates(aggs: Aggregates, table: WorkloadTable, model: str, free: int, after: int) -> Aggregates:
    """`aggs` after one GPU of `model` went from `free` to `after` units free (exact integer update)."""
    out = []
    for g, agg in zip(table.groups, aggs, strict=True):
        if g.models and not _model_allowed(g.models, model):
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
    if cpu_free is not None:
        if need > cpu_free * table.weight:  # the CPU runs out first: fill in proportion
            fill = fill * cpu_free * table.weight // need
        kept += wa * fill
    return total * table.weight * wb - kept


# Key sums of a node without CPU information: per multi-GPU key (models, per_gpu), (GPUs with room,
# their free capacity). What the single-GPU groups need is a sum over GPUs (see `_Pricer`).
KeySums = tuple[tuple[int, int], ...]
# Per model on a node (see `_Pricer.prefix`): the multi-GPU keys' per_gpu ascending, running sums `stay`
# and `cross_free`, per key `cross_usable` and `cross_const`, and per key the node's (room, usable).
Prefix = tuple[
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
]


# `_Pricer.node_sig`: (keys each GPU has room for, by free ascending; sole model or None; sorted frees).
NodeSig = tuple[tuple[int, ...], str | None, tuple[int, ...]]
# `_Pricer.room_prefix`: `by_rooms`'s stay, cross_free, cross_usable, cross_const, then per key where
# room for it starts in the node's sorted frees.
RoomPrefix = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class _RoomsOf(dict):
    """free -> how many of the keys' per_gpu (ascending, `qs`) a GPU with that many units reaches."""

    def __init__(self, qs: tuple[int, ...]) -> None:
        super().__init__()
        self.qs = qs

    def __missing__(self, free: int) -> int:
        v = self[free] = bisect_right(self.qs, free)
        return v


def _one_gpu_price(info: tuple[int, int, int], f: int, per: int, vals: Sequence[int], prefix: tuple[Any, ...]) -> int:
    """The exact price of taking `per` from one GPU with `f` free on a node: the GPU's own part
    (`_Pricer.gpu_info`), the keys it keeps room for, and, for the keys it falls below, the node's
    usable capacity above each (`vals`: the node's frees sorted, `prefix`: its `room_prefix`)."""
    stay, cross_free, cross_usable, cross_const, idx = prefix
    d, lo, hi = info
    d += per * stay[lo]
    if hi > lo:
        d += f * (cross_free[hi] - cross_free[lo])
        for j in range(lo, hi):
            d += cross_usable[j] * sum(vals[idx[j] :]) + cross_const[j]
    return d


def _key_change(frees: Iterable[int], per: int, q: int) -> tuple[int, int]:
    """Taking `per` from GPUs with these frees: the change of a multi-GPU key's (GPUs with room, their
    usable capacity), the key needing `q` per GPU. A GPU that keeps room loses `per` of usable
    capacity; one that falls below `q` leaves the room count and takes all its free capacity with it."""
    dr = du = 0
    for f in frees:
        if f >= q:
            if f - per >= q:
                du -= per
            else:
                dr -= 1
                du -= f
    return dr, du


class _Pricer:
    """`fragmentation_units` changes without CPU information (the extender's case), in O(1) per GPU.

    Without CPU, a hostable single-GPU group keeps `weight x ((1 - w) x usable + w x per x slots)`,
    which is a sum over the node's GPUs (a group with no GPU with room keeps nothing either way): so
    all single-GPU groups together keep `sum over GPUs of V(model, free)`, and a share taken from one
    GPU changes it by `V(model, after) - V(model, free)`, whatever the rest of the node holds. A
    multi-GPU group keeps `A(room) x usable + B(room)` (zero below `count` GPUs with room), so it needs
    the node's (room, usable) per distinct (models, per_gpu) key: few keys, each a bisection. A
    placement's price is then a handful of integer operations per changed GPU, instead of a pass over
    every group for every candidate GPU, and equals `fragmentation_units(after) - ...(before)` exactly.
    A single-GPU share's price also carries the LP gap price (`gap`), an integer per (size, free) that
    every path adds alike.
    """

    def __init__(
        self, table: WorkloadTable, wa: int, wb: int, gap_weight: Fraction = Fraction(0), gpu_unit: int | None = None
    ) -> None:
        self.table = table
        # size -> (CPU, memory) a typical pod of that share size asks (`host_gap`); FragPolicy fills it
        # on the first priced placement that knows CPU (never in the extender, which does not).
        self.host_needs: dict[int, tuple[int, int]] | None = None
        self._hostable: dict[tuple[int, int | None], frozenset[int]] = {}
        self._interned: dict[frozenset[int], frozenset[int]] = {}
        self._host_gaps: dict[int, int] = {}
        self.wa, self.keep_w = wa, wb - wa
        self.total_w = table.weight * wb  # units per unit of free capacity
        # The LP gap price (`gap`): solved on first use, once per table; None until then.
        self._gap_scale = gap_weight * self.total_w
        self._gpu_unit = gpu_unit
        self._gap_prices: GapPrices | None = None
        self._gaps: dict[int, dict[int, int] | None] = {}
        self.singles = tuple((g.models, g.per_gpu, g.weight) for g in table.groups if g.count == 1)
        multi: dict[tuple[tuple[str, ...], int], list[tuple[int, int]]] = {}
        for g in table.groups:
            if g.count != 1:
                multi.setdefault((g.models, g.per_gpu), []).append((g.count, g.weight))
        self.keys = tuple(sorted(multi))
        self._key_groups = tuple(tuple(multi[k]) for k in self.keys)
        self.values: dict[tuple[str, int], int] = {}
        self._by_model: dict[str, tuple[tuple[int, int], ...]] = {}
        self._ab: dict[tuple[int, int], tuple[int, int]] = {}
        self._by_rooms: dict[tuple[str, tuple[int, ...]], tuple[tuple[int, ...], ...]] = {}
        self.state_prefixes: dict[tuple[GpuView, str], Prefix] = {}  # FragPolicy.prefix_of's memo
        self._crossing: tuple[list[tuple[int, int, int, int]], ...] = tuple([] for _ in self.keys)
        self._qs: dict[str, tuple[int, ...]] = {}
        self._single_loss: dict[int, dict[tuple[str, int], int]] = {}
        self.coef_rows: tuple[list[tuple[int, int]], ...] = tuple([] for _ in self.keys)
        self._unrestricted = all(not models for models, _ in self.keys)
        # With no key restricted to GPU models, every model sees every key, by per_gpu ascending.
        self.all_qs = tuple(sorted(q for _, q in self.keys)) if self._unrestricted else None
        self._multi_infos: dict[tuple[int, tuple[str, ...], str], dict] = {}
        self._gpu_infos: dict[tuple[int, tuple[str, ...], str], dict[int, tuple[int, int, int] | bool]] = {}
        # GPU view -> `node_sig`; FragPolicy hands it on to the next pricer while `all_qs` is the same.
        self.node_sigs: dict[GpuView, NodeSig] = {}
        self._rooms_of = _RoomsOf(self.all_qs or ())
        self.room_prefixes: dict[tuple[int, ...], RoomPrefix] = {}

    def value(self, model: str, free: int) -> int:
        """What all single-GPU groups keep of one GPU of `model` with `free` units."""
        key = (model, free)
        v = self.values.get(key)
        if v is None:
            v = 0
            wa, keep_w = self.wa, self.keep_w
            for models, per, weight in self.singles:
                if free >= per and (not models or _model_allowed(models, model)):
                    v += weight * (keep_w * free + wa * per * (free // per))
            self.values[key] = v
        return v

    def gap_prices(self) -> GapPrices | None:
        """The bin-packing LP's prices of the learned share sizes (`patterns.GapPrices`), solved once per
        table on first use (a few ms for ~20 sizes); None when the gap price is off or nothing is shared.

        Shares are the single-GPU classes asking less than a GPU: `gpu_unit` when the caller knows it
        (share-sim: the largest GPU), else the largest per-GPU request learned (a whole-GPU pod's)."""
        gp = self._gap_prices
        if gp is None and self._gap_scale:
            groups = self.table.groups
            unit = self._gpu_unit or max((g.per_gpu for g in groups), default=0)
            counts: dict[int, int] = {}
            for g in groups:
                if g.count == 1 and 0 < g.per_gpu < unit:
                    counts[g.per_gpu] = counts.get(g.per_gpu, 0) + g.weight
            if counts:
                gp = self._gap_prices = GapPrices(counts, unit)
        return gp

    def gap_of(self, per: int) -> dict[int, int] | None:
        """free -> `gap(free, per)` filled lazily, or None when a share of `per` has no gap price."""
        d = self._gaps.get(per, _MISSING)
        if d is _MISSING:
            gp = self.gap_prices()
            d = self._gaps[per] = {} if gp is not None and per in gp.price else None
        return d  # type: ignore[return-value]

    def gap(self, free: int, per: int) -> int:
        """What a share of `per` on a GPU with `free` units loses at the LP's prices (`GapPrices.loss`),
        x the policy's gap weight, in this pricer's integer units (rounded once: every path adds the
        same integer, so the fast paths still equal the recount exactly)."""
        d = self.gap_of(per)
        if d is None:
            return 0
        v = d.get(free)
        if v is None:
            gp = self._gap_prices
            assert gp is not None
            v = d[free] = round(self._gap_scale * gp.loss(free, per))
        return v

    def hostable(self, cpu: int, memory: int | None) -> frozenset[int]:
        """The priced share sizes whose typical pod (`host_needs`) a node with `cpu` and `memory` free
        could still host."""
        key = (cpu, memory)
        got = self._hostable.get(key)
        if got is None:
            gp, needs = self._gap_prices, self.host_needs
            assert gp is not None and needs is not None
            got = frozenset(
                s for s, (c, m) in needs.items() if s in gp.priced and c <= cpu and (memory is None or m <= memory)
            )
            got = self._interned.setdefault(got, got)  # one object per set: `host_gap` compares by identity
            if len(self._hostable) >= 100_000:
                self._hostable.clear()
            self._hostable[key] = got
        return got

    def host_gap(
        self, gpus: GpuView, pos: int, per: int, host: tuple[int, int | None], host_after: tuple[int, int | None]
    ) -> int:
        """`gap` when the node's free CPU and memory are known (`host`, and `host_after` the share).

        A gap is worth K_h, the knapsack at the LP's prices over only the sizes whose typical pod the
        node can still host (`hostable`): a half-full GPU on a node with no CPU left for any share that
        would fit it is worth nothing, not what its free units could earn. A share of `per` on GPU
        `pos` loses V(before) - V(after) - pi(per), V the sum of K_h over the node's partly used GPUs
        and GPU `pos` (the share's CPU and memory can strand the node's other gaps too). Node-local,
        and `gap` itself wherever the node can host every size before and after. A one-GPU pod of a
        size with no price (a whole GPU, a size not yet learned) pays `host_strand`."""
        f = gpus[pos][1]
        gp = self.gap_prices()
        if gp is None or self.host_needs is None:
            return self.gap(f, per)
        if per not in gp.price:
            return self.host_strand(gpus, (pos,), host, host_after)
        before, after = self.hostable(*host), self.hostable(*host_after)
        v = gp.host_value(f, before) - gp.host_value(f - per, after) - gp.price_units(per)
        return self._host_units(v + self._stranded(gp, gpus, (pos,), before, after), gp)

    def host_strand(
        self, gpus: GpuView, chosen: tuple[int, ...], host: tuple[int, int | None], host_after: tuple[int, int | None]
    ) -> int:
        """What a pod that is not a priced share (whole GPUs, several GPUs, CPU only) costs the node's
        other partly used GPUs at the host-aware gap price: its CPU and memory may leave them no pod."""
        gp = self.gap_prices()
        if gp is None or self.host_needs is None:
            return 0
        v = self._stranded(gp, gpus, chosen, self.hostable(*host), self.hostable(*host_after))
        return self._host_units(v, gp) if v else 0

    @staticmethod
    def _stranded(
        gp: GapPrices, gpus: GpuView, chosen: tuple[int, ...], before: frozenset[int], after: frozenset[int]
    ) -> int:
        """What the partly used GPUs outside `chosen` lose (1 / `gp.denominator` units) when what the
        node can host goes from `before` to `after`: V's part that the pod's CPU and memory move."""
        if before is after:  # interned by `hostable`: the same set, nothing moves
            return 0
        value, cap = gp.host_value, gp.capacity
        return sum(
            value(g, before) - value(g, after) for j, (_, g) in enumerate(gpus) if 0 < g < cap and j not in chosen
        )

    def _host_units(self, v: int, gp: GapPrices) -> int:
        """A host-aware loss `v` (in 1 / `gp.denominator` units) x the gap weight, in this pricer's
        integer units, rounded once per value as `gap` rounds."""
        units = self._host_gaps.get(v)
        if units is None:
            units = self._host_gaps[v] = round(self._gap_scale * Fraction(v, gp.denominator))
        return units

    def single_loss(self, per: int) -> dict[tuple[str, int], int]:
        """(model, free) -> what taking `per` units from that GPU costs the single-GPU groups, plus the
        free capacity it removes (`value(free) - value(free - per) - per x total_w`), filled lazily."""
        d = self._single_loss.get(per)
        if d is None:
            d = self._single_loss[per] = {}
        return d

    def keys_for(self, model: str) -> tuple[tuple[int, int], ...]:
        """(key index, per_gpu) of the multi-GPU keys that may use `model`, by per_gpu ascending."""
        out = self._by_model.get(model)
        if out is None:
            out = tuple(
                sorted(
                    ((k, q) for k, (models, q) in enumerate(self.keys) if not models or _model_allowed(models, model)),
                    key=lambda x: (x[1], x[0]),
                )
            )
            self._by_model[model] = out
        return out

    def coefficients(self, k: int, room: int) -> tuple[int, int]:
        """(A, B): the multi-GPU groups of key `k` keep `A x usable + B` of a node with `room` GPUs."""
        ab = self._ab.get((k, room))
        if ab is None:
            a = b = 0
            per = self.keys[k][1]
            for count, weight in self._key_groups[k]:
                if room >= count:
                    a += weight
                    b += weight * count * (room // count)
            ab = self._ab[(k, room)] = (self.keep_w * a, self.wa * per * b)
        return ab

    def crossing(self, k: int, room: int) -> tuple[int, int, int, int]:
        """(A(room), A(room - 1), A(room) - A(room - 1), B(room) - B(room - 1)) for key `k` (zeros
        but A at room 0), from a per-key list: `prefix_of` reads it once per key and node."""
        row = self._crossing[k]
        while len(row) <= room:
            r = len(row)
            a, b = self.coefficients(k, r)
            if r == 0:
                row.append((a, 0, 0, 0))
            else:
                a0, b0 = self.coefficients(k, r - 1)
                row.append((a, a0, a - a0, b - b0))
        return row[room]

    def prefix_of(self, gpus: GpuView, model: str) -> Prefix:
        """`prefix(model, key_sums(gpus))`, computed straight from the node's GPUs: one sort, and the
        bisections for every key in one call when no key is restricted to GPU models."""
        qs = self.qs_for(model)
        if self._unrestricted:  # every key may use every GPU: one sorted list serves them all
            vals = sorted(map(itemgetter(1), gpus))
            running = [0, *accumulate(vals)]
            n, total = len(vals), running[-1]
            idx = list(map(bisect_left, repeat(vals, len(qs)), qs))
            rooms = tuple([n - i for i in idx])
            usables = tuple([total - running[i] for i in idx])
        else:
            keys = self.keys
            frees: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
            room_list, usable_list = [], []
            for k, q in self.keys_for(model):
                room, usable = _room_at_least(frees, gpus, keys[k][0], q)
                room_list.append(room)
                usable_list.append(usable)
            rooms, usables = tuple(room_list), tuple(usable_list)
        return (qs, *self.by_rooms(model, rooms), rooms, usables)

    def one_gpu_infos(self, per: int, models: tuple[str, ...], model: str) -> dict[int, tuple[int, int, int] | bool]:
        """free -> `gpu_info((model, free), per, models)`, filled lazily: what a share of this size and
        model set needs to know of one GPU of `model`, whatever node it is on."""
        key = (per, models, model)
        d = self._gpu_infos.get(key)
        if d is None:
            if len(self._gpu_infos) >= 1024:  # many sizes seen since the table was built: start afresh
                self._gpu_infos.clear()
            d = self._gpu_infos[key] = {}
        return d

    def multi_infos(
        self, per: int, models: tuple[str, ...], model: str
    ) -> dict[tuple[int, ...], tuple[int, int, tuple[tuple[int, int, int, int], ...]]]:
        """frees of the chosen GPUs (ascending) -> `multi_info(model, per, models, frees)`, lazily."""
        key = (per, models, model)
        d = self._multi_infos.get(key)
        if d is None:
            if len(self._multi_infos) >= 1024:
                self._multi_infos.clear()
            d = self._multi_infos[key] = {}
        return d

    def multi_info(
        self, model: str, per: int, models: tuple[str, ...], picked: tuple[int, ...]
    ) -> tuple[int, int, tuple[tuple[int, int, int, int], ...]]:
        """What a share of `per` on each of GPUs of `model` with frees `picked` (ascending, each with
        room) costs whatever node they are on: (the single-GPU groups' cost plus the free capacity
        taken; the first key (of `all_qs`) not every chosen GPU stays above; per key some chosen GPU
        crosses or leaves room in, (key position, key index, change of its room, change of its usable
        capacity)). `_Pricer.delta`'s terms less the node's room and usable capacity per key."""
        d = 0
        for f in picked:
            d += self.value(model, f) - self.value(model, f - per) - per * self.total_w
        qs = self.all_qs or ()
        lo = bisect_right(qs, picked[0] - per)  # keys every chosen GPU keeps room for
        moves = []
        ks = self.keys_for(model)
        for j in range(lo, bisect_right(qs, picked[-1], lo)):
            k, q = ks[j]
            dr, du = _key_change(picked, per, q)
            if dr or du:
                moves.append((j, k, dr, du))
        return d, lo, tuple(moves)

    def gpu_info(self, gpu: tuple[str, int], per: int, models: tuple[str, ...]) -> tuple[int, int, int] | bool:
        """For taking `per` units from `gpu`: (what it costs the single-GPU groups, plus the free
        capacity it removes; the first key (of `all_qs`) it does not stay above; the first it stays
        below): `delta_one` less the parts that depend on the node. False: the GPU cannot take it."""
        m, f = gpu
        if f < per or (models and not _model_allowed(models, m)):
            return False
        a = f - per
        qs = self.all_qs or ()
        lo = bisect_right(qs, a)
        d = self.value(m, f) - self.value(m, a) - per * self.total_w + self.gap(f, per)
        return d, lo, bisect_right(qs, f, lo)

    def node_sig(self, gpus: GpuView) -> NodeSig:
        """What the fast paths need of a node's GPUs when the keys are unrestricted (`all_qs` not
        None), a pure function of the GPUs and `all_qs` (so a new table with the same keys keeps it):
        - per GPU, by free ascending, how many keys it has room for: the node's room per key, which
          picks the shared `room_prefix`;
        - the one GPU model of the node (None: none or several);
        - its frees, sorted (the usable capacity for key j: `sum(frees[idx[j]:])`, `idx` from
          `room_prefix`)."""
        vals = tuple(sorted(map(itemgetter(1), gpus)))
        models = set(map(itemgetter(0), gpus))
        v = (tuple(map(self._rooms_of.__getitem__, vals)), models.pop() if len(models) == 1 else None, vals)
        if len(self.node_sigs) >= FragPolicy.MEMO_LIMIT:
            self.node_sigs.clear()
        self.node_sigs[gpus] = v
        return v

    def room_prefix(self, sig: tuple[int, ...]) -> RoomPrefix:
        """`by_rooms` for a node with this `node_sig` signature, and per key the position in the
        node's sorted frees where room for it starts (`idx`); memoised on the signature: few differ
        among many nodes (a few hundred among 5,000)."""
        v = self.room_prefixes.get(sig)
        if v is None:
            if len(self.room_prefixes) >= 100_000:
                self.room_prefixes.clear()
            idx = tuple([bisect_right(sig, j) for j in range(len(self.all_qs or ()))])
            n = len(sig)
            v = self.room_prefixes[sig] = (*self.by_rooms("", tuple([n - i for i in idx])), idx)
        return v

    def by_rooms(
        self, model: str, rooms: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The parts of `prefix` that depend on the keys' room counts alone (nodes share them)."""
        key = (model, rooms)
        v = self._by_rooms.get(key)
        if v is None:
            stay, cross_free, cross_usable, cross_const = [0], [0], [], []
            s = cf = 0
            for (k, _), room in zip(self.keys_for(model), rooms, strict=True):
                a, a0, da, db = self.crossing(k, room)
                s += a
                if room:
                    cf += a0
                else:  # no GPU of this node has room for the key: no share can cross it
                    da = db = 0
                stay.append(s)
                cross_free.append(cf)
                cross_usable.append(da)
                cross_const.append(db)
            # Tuples of ints: the garbage collector stops tracking them.
            v = (tuple(stay), tuple(cross_free), tuple(cross_usable), tuple(cross_const))
            if len(self._by_rooms) >= 100_000:
                self._by_rooms.clear()
            self._by_rooms[key] = v
        return v

    def qs_for(self, model: str) -> tuple[int, ...]:
        """The per_gpu of `keys_for(model)`, in its order."""
        qs = self._qs.get(model)
        if qs is None:
            qs = self._qs[model] = tuple(q for _, q in self.keys_for(model))
        return qs

    def coefficient_row(self, k: int, room: int) -> list[tuple[int, int]]:
        """`coefficients(k, r)` for r = 0..room at least, as a list (read by index in hot loops)."""
        row = self.coef_rows[k]
        while len(row) <= room:
            row.append(self.coefficients(k, len(row)))
        return row

    def kept(self, k: int, room: int, usable: int) -> int:
        """What the multi-GPU groups of key `k` keep of a node with `room` GPUs holding `usable`."""
        a, b = self.coefficients(k, room)
        return a * usable + b

    def prefix(self, model: str, sums: KeySums) -> Prefix:
        """What pricing one GPU of `model` needs of a node with these key sums, so that a share is
        priced with two bisections whatever the number of keys (keys by per_gpu ascending).

        A share that leaves a GPU with room for key k only lowers the key's usable capacity, which
        changes what it keeps by `A(room) x share` (running sum `stay`). A share that takes the GPU
        below the key's per_gpu removes it from the room count: the key keeps
        `A(room - 1) x free + (A(room) - A(room - 1)) x usable + B(room) - B(room - 1)` less, linear in
        the GPU's free units (running sum `cross_free` of A(room - 1); per key `cross_usable` =
        A(room) - A(room - 1) and `cross_const` = B(room) - B(room - 1), for the few keys a share crosses)."""
        ks = self.keys_for(model)
        rooms = tuple(sums[k][0] for k, _ in ks)
        usables = tuple(sums[k][1] for k, _ in ks)
        return (self.qs_for(model), *self.by_rooms(model, rooms), rooms, usables)

    def crossed(self, pre: Prefix, lo: int, hi: int, free: int) -> int:
        """What the keys lo..hi-1 (a GPU with `free` units drops below their per_gpu) keep less."""
        _, _, cross_free, cross_usable, cross_const, _, usables = pre
        d = free * (cross_free[hi] - cross_free[lo])
        for j in range(lo, hi):
            d += cross_usable[j] * usables[j] + cross_const[j]
        return d

    def delta_one(self, sums: KeySums, model: str, free: int, after: int) -> int:
        """`delta` for one GPU, without visiting the keys it stays above or below."""
        value = self.value
        d = value(model, free) - value(model, after) - (free - after) * self.total_w
        if not self.keys:
            return d
        pre = self.prefix(model, sums)
        qs, stay = pre[0], pre[1]
        lo = bisect_right(qs, after)
        hi = bisect_right(qs, free, lo)
        return d + (free - after) * stay[lo] + self.crossed(pre, lo, hi, free)

    def key_sums(self, gpus: GpuView) -> KeySums:
        """(GPUs with room, their free capacity) per multi-GPU key."""
        frees: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
        return tuple(_room_at_least(frees, gpus, models, per) for models, per in self.keys)

    def delta(self, sums: KeySums, changes: Sequence[tuple[str, int, int]]) -> int:
        """`fragmentation_units` after minus before, for GPUs changing (model, free, after)."""
        d = 0
        taken = 0
        value = self.value
        for m, f, a in changes:
            taken += f - a
            d -= value(m, a) - value(m, f)
        d -= taken * self.total_w
        if not self.keys:
            return d
        if len(changes) == 1:
            m, f, a = changes[0]
            for k, per in self.keys_for(m):
                if per > f:
                    break
                room, usable = sums[k]
                if a >= per:
                    d -= self.kept(k, room, usable - (f - a)) - self.kept(k, room, usable)
                else:
                    d -= self.kept(k, room - 1, usable - f) - self.kept(k, room, usable)
            return d
        shifts: dict[int, list[int]] = {}
        for m, f, a in changes:
            for k, per in self.keys_for(m):
                if per > f:
                    break
                s = shifts.setdefault(k, [0, 0])
                if a >= per:
                    s[1] -= f - a
                else:
                    s[0] -= 1
                    s[1] -= f
        for k, (dr, du) in shifts.items():
            room, usable = sums[k]
            d -= self.kept(k, room + dr, usable + du) - self.kept(k, room, usable)
        return d


def _quantile(counted: list[tuple[int, int]], q: float) -> int:
    """The value at position min(n - 1, int(q x n)) of the n values (each listed with its count) sorted."""
    counted.sort()
    n = sum(c for _, c in counted)
    at = min(n - 1, int(q * n))
    for value, c in counted:
        if at < c:
            return value
        at -= c
    raise ValueError("no values")  # pragma: no cover - n > 0 whenever a size was observed


# The CPU and memory a share size's "typical" pod asks, for frag's host-aware gap price: the median
# (docs/simulator.md, `frag` item 7).
HOST_QUANTILE = 0.5

# frag's weight on the LP gap price (`_Pricer.gap`), in GPU units per unit of loss: large enough that the
# loss decides first and frag's fragmentation price breaks its ties (docs/simulator.md, `frag` item 6).
GAP_WEIGHT = 1000.0


class FragPolicy(_ViewPolicy):
    """Least growth of expected fragmentation under the learned workload; best fit on ties."""

    name = "frag"
    # Rebuild the class table when the observed count has grown by this fraction (or a class is new).
    REFRESH = 0.02
    MEMO_LIMIT = 400_000
    PREFIX_LIMIT = 50_000  # per-state running sums kept (a few hundred bytes each; 5,000 nodes need 5,000)

    def __init__(
        self,
        fill_weight: float = 0.6,
        pressure: float = 3.0,
        gap_weight: float = GAP_WEIGHT,
        gpu_unit: int | None = None,
        host_quantile: float | None = HOST_QUANTILE,
    ) -> None:
        if not 0.0 <= fill_weight <= 1.0 or pressure < 0 or gap_weight < 0:
            raise ValueError("frag: fill_weight must be in [0, 1], pressure and gap_weight non-negative")
        if host_quantile is not None and not 0.0 <= host_quantile <= 1.0:
            raise ValueError("frag: host_quantile must be in [0, 1] (or None: the gap price ignores CPU)")
        self.host_quantile = host_quantile
        # (per_gpu, cpu, memory) -> single-GPU pods observed: what a share size's pods ask of a host.
        self._share_asks: dict[tuple[int, int, int], int] = {}
        self.fill_weight = fill_weight
        self._wa, self._wb = fill_ratio(fill_weight)
        self.pressure = pressure
        self.gap_weight = gap_weight
        self._gap_w = Fraction(gap_weight).limit_denominator(1000)
        self.gpu_unit = gpu_unit
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, int, tuple[str, ...], int], float] = {}
        self._observed = 0
        self._table_observed = 0
        self._dirty = False
        self._table = WorkloadTable((), 0)
        self._pricer = _Pricer(self._table, self._wa, self._wb, self._gap_w, gpu_unit)
        self._pressure: dict[str, float] = {}
        self._agg_memo: dict[GpuView, Aggregates] = {}
        self._sums_memo: dict[GpuView, KeySums] = {}
        self._memo: dict[Any, int] = {}
        self._eval_memo: dict[Demand, dict[NodeView, Evaluation]] = {}
        self._eval_size = 0
        self._last: tuple[Demand | None, dict[NodeView, Evaluation], dict[Demand, dict[NodeView, Evaluation]]] = (
            None,
            {},
            {},
        )

    def observe(self, demand: Demand) -> None:
        if demand.count <= 0 or demand.per_gpu <= 0:
            return  # CPU-only pods fragment no GPU
        key = (demand.per_gpu, demand.count, tuple(sorted(m.lower() for m in demand.models)), demand.cpu)
        with self._lock:
            if key not in self._counts:
                self._counts[key] = 0.0
                self._dirty = True
            self._counts[key] += 1.0
            if demand.count == 1:
                ask = (demand.per_gpu, demand.cpu, demand.memory)
                self._share_asks[ask] = self._share_asks.get(ask, 0) + 1
            self._observed += 1
            if self._observed >= (1.0 + self.REFRESH) * max(self._table_observed, 1):
                self._dirty = True

    def set_gpu_unit(self, units: int | None) -> None:
        """The capacity of a GPU the gap price packs shares into (the cluster's largest GPU, in units), told
        by the extender as nodes come and go; None: the largest per-GPU request learned. A change gives a
        new table snapshot, so whatever was priced with the old capacity is priced again."""
        with self._lock:
            if units != self.gpu_unit:
                self.gpu_unit = units
                self._dirty = True

    @property
    def table(self) -> WorkloadTable:
        """The current snapshot of the learned workload (rebuilt lazily after observe())."""
        if self._dirty:
            with self._lock:
                if self._dirty:
                    table = WorkloadTable.from_counts(self._counts)
                    pricer = _Pricer(table, self._wa, self._wb, self._gap_w, self.gpu_unit)
                    if [(g.models, g.per_gpu) for g in table.groups] != [
                        (g.models, g.per_gpu) for g in self._table.groups
                    ]:
                        self._agg_memo = {}  # the sums depend on the groups' sizes, not their weights
                    if pricer.keys != self._pricer.keys:
                        self._sums_memo = {}
                    if pricer.all_qs is not None and pricer.all_qs == self._pricer.all_qs:
                        pricer.node_sigs = self._pricer.node_sigs  # the nodes' room positions stand
                    self._table, self._pricer = table, pricer
                    self._table_observed = self._observed
                    self._pressure = {}
                    self._memo = {}
                    self._eval_memo = {}
                    self._eval_size = 0
                    self._dirty = False
        return self._table

    def host_needs(self) -> dict[int, tuple[int, int]]:
        """Per single-GPU size: the `host_quantile` of its pods' CPU asks and of their memory asks
        (`_Pricer.host_gap`'s typical pod), from what was observed."""
        q = self.host_quantile or 0.0
        with self._lock:
            asks = list(self._share_asks.items())
        by_size: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
        for (per, cpu, mem), n in asks:
            cpus, mems = by_size.setdefault(per, ([], []))
            cpus.append((cpu, n))
            mems.append((mem, n))
        return {per: (_quantile(cpus, q), _quantile(mems, q)) for per, (cpus, mems) in by_size.items()}

    def model_pressure(self, model: str) -> float:
        """Probability that a pod is restricted to GPU models that include `model` (scarce capacity)."""
        v = self._pressure.get(model)
        if v is None:
            v = sum(g.prob for g in self.table.groups if g.models and _model_allowed(g.models, model))
            self._pressure[model] = v
        return v

    def aggregates(self, gpus_sorted: GpuView) -> Aggregates:
        """`group_aggregates` of a node's GPUs (sorted, so nodes in the same state share them)."""
        a = self._agg_memo.get(gpus_sorted)
        if a is None:
            a = group_aggregates(gpus_sorted, self.table)
            if len(self._agg_memo) >= self.MEMO_LIMIT:
                self._agg_memo.clear()
            self._agg_memo[gpus_sorted] = a
        return a

    def key_sums(self, gpus_sorted: GpuView, pricer: _Pricer) -> KeySums:
        """`_Pricer.key_sums` of a node's GPUs, kept across table rebuilds while the keys stay."""
        s = self._sums_memo.get(gpus_sorted)
        if s is None:
            s = pricer.key_sums(gpus_sorted)
            if len(self._sums_memo) >= self.MEMO_LIMIT:
                self._sums_memo.clear()
            self._sums_memo[gpus_sorted] = s
        return s

    def prefix_of(self, gpus: GpuView, model: str, pricer: _Pricer) -> Prefix:
        """`_Pricer.prefix_of`, memoised per node state and model in the pricer itself (so an entry can
        only ever be read with the table it was computed for, whichever thread rebuilt the table)."""
        memo = pricer.state_prefixes
        key = (gpus, model)
        v = memo.get(key)
        if v is None:
            v = pricer.prefix_of(gpus, model)
            if len(memo) >= self.PREFIX_LIMIT:
                memo.clear()
            memo[key] = v
        return v

    def node_units(self, gpus: GpuView, cpu_free: int | None) -> int:
        """`fragmentation_units` of a node under the current table (memoised per sorted state)."""
        gpus_sorted = tuple(sorted(gpus))
        key = (gpus_sorted, cpu_free)
        v = self._memo.get(key)
        if v is None:
            total = sum(f for _, f in gpus)
            v = fragmentation_units(total, self.aggregates(gpus_sorted), cpu_free, self.table, self._wa, self._wb)
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = v
        return v

    def node_fragmentation(self, gpus: GpuView, cpu_free: int | None) -> float:
        """Expected fragmentation of a node under the current table (`fragmentation`, memoised)."""
        units = self.node_units(gpus, cpu_free)
        return units / (self.table.weight * self._wb) if units else 0.0

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        _ = self.table  # refresh first, so the memo below belongs to the current table
        # One dict per demand, keyed by the view alone: its keys and values are tuples of numbers and
        # strings, which the cyclic garbage collector stops tracking, so a memo of many entries adds
        # nothing to every full collection's work (a (view, demand) key holds the tracked Demand).
        # A filter pass asks about every node for one Demand object: skip hashing it again.
        last_demand, memo, outer = self._last
        if last_demand is not demand or outer is not self._eval_memo:
            outer = self._eval_memo
            memo = outer.get(demand)
            if memo is None:
                memo = outer.setdefault(demand, {})
            self._last = (demand, memo, outer)
        ev = memo.get(view, _MISSING)
        if ev is _MISSING:
            if view[1] is None:  # the extender's case: one call less
                if demand.count == 1:
                    ev = self._evaluate_one_gpu(view, demand, self._pricer)
                else:
                    ev = self._evaluate_gpus(view, demand, self._pricer)
            else:
                ev = self._evaluate(view, demand)
            if self._eval_size >= self.MEMO_LIMIT:  # start afresh
                memo = {}
                self._eval_memo = {demand: memo}
                self._eval_size = 0
            self._eval_size += 1
            memo[view] = ev
        return ev  # type: ignore[return-value]

    def _evaluate_one_gpu(self, view: NodeView, demand: Demand, pricer: _Pricer) -> Evaluation:
        """`_evaluate` for a single-GPU demand without CPU information (the extender's common case).

        The same candidates in the same order and the same exact prices as the general path, in one
        pass over the GPUs: the multi-GPU keys' running sums are built once per model on the node.
        """
        gpus, _, mem_free = view
        if mem_free is not None and mem_free < demand.memory:
            return None
        per, models = demand.per_gpu, demand.models
        if pricer.all_qs is not None:
            # No key restricted to models: the node enters through its sorted frees alone. Where they
            # reach each key's per_gpu (its room per key) picks running sums shared by every node with
            # the same room counts; what depends on one GPU alone is looked up per GPU state; only the
            # keys a share crosses need this node's usable capacity. `delta_one`, exactly, and the same
            # candidate wins: the least price, then the least left (distinct for distinct frees).
            sig_entry = pricer.node_sigs.get(gpus)
            if sig_entry is None:
                sig_entry = pricer.node_sig(gpus)
            sig, sole, vals = sig_entry
            prefix = pricer.room_prefixes.get(sig) or pricer.room_prefix(sig)
            total = sum(vals)
            best_d = best_left = 0
            best = None
            if sole is not None:  # one model: the candidates are the distinct frees with room
                if models and not _model_allowed(models, sole):
                    return None
                infos = pricer.one_gpu_infos(per, models, sole)
                prev = -1
                for f in vals[bisect_left(vals, per) :]:
                    if f == prev:
                        continue
                    prev = f
                    info = infos.get(f)
                    if info is None:
                        info = infos[f] = pricer.gpu_info((sole, f), per, models)
                    d = _one_gpu_price(info, f, per, vals, prefix)  # type: ignore[arg-type]
                    if best is None or d < best_d:
                        best_d, best_left, best = d, f - per, f
                if best is None:
                    return None
                # `_finish` for one GPU without CPU, written out (the same float operations in the
                # same order, so the same score): this runs once per distinct node state.
                delta_f = best_d / pricer.total_w if best_d else 0.0
                if self.pressure:
                    mp = self._pressure.get(sole)
                    delta_f += self.pressure * (self.model_pressure(sole) if mp is None else mp) * per
                score = -(delta_f + 1e-7 * best_left + 1e-10 * (total - per + 0.0))
                return score, (gpus.index((sole, best)),)
            else:  # several models: each distinct GPU state, in the order of its first position
                for g in dict.fromkeys(gpus):
                    m, f = g
                    infos = pricer.one_gpu_infos(per, models, m)
                    info = infos.get(f)
                    if info is None:
                        info = infos[f] = pricer.gpu_info(g, per, models)
                    if info is False:
                        continue
                    d = _one_gpu_price(info, f, per, vals, prefix)  # type: ignore[arg-type]
                    a = f - per
                    if best is None or d < best_d or (d == best_d and a < best_left):
                        best_d, best_left, best = d, a, g
                if best is None:
                    return None
                pos = gpus.index(best)
            return self._finish(best_d, best_left, (pos,), gpus, per, None, total)
        # What the single-GPU groups lose when this demand takes one GPU (model, free): the same on
        # every node, so one dict per size serves them all.
        single = pricer.single_loss(per)
        gaps = pricer.gap_of(per)
        keys = pricer.keys
        prefixes: dict[str, Prefix] = {}
        best_d = best_left = 0
        best: tuple[str, int] | None = None
        # Each distinct GPU state once, in the order of its first position (dict.fromkeys keeps it).
        for g in dict.fromkeys(gpus):
            m, f = g
            if f < per or (models and not _model_allowed(models, m)):
                continue
            a = f - per
            d = single.get(g)
            if d is None:
                d = single[g] = pricer.value(m, f) - pricer.value(m, a) - per * pricer.total_w
            if gaps is not None:
                x = gaps.get(f)
                d += pricer.gap(f, per) if x is None else x
            if keys:
                pre = prefixes.get(m)
                if pre is None:
                    pre = prefixes[m] = self.prefix_of(gpus, m, pricer)
                qs = pre[0]
                lo = bisect_right(qs, a)
                hi = bisect_right(qs, f, lo)
                d += per * pre[1][lo]
                if hi > lo:
                    d += pricer.crossed(pre, lo, hi, f)
            if best is None or d < best_d or (d == best_d and a < best_left):
                best_d, best_left, best = d, a, g
        if best is None:
            return None
        return self._finish(best_d, best_left, (gpus.index(best),), gpus, per, None, sum(map(itemgetter(1), gpus)))

    def _evaluate_gpus(self, view: NodeView, demand: Demand, pricer: _Pricer) -> Evaluation:
        """`_evaluate` for a multi-GPU demand without CPU information: the best-fit GPUs, priced as
        `_Pricer.delta` does, with the keys every chosen GPU stays above taken from the running sums."""
        gpus, _, mem_free = view
        if mem_free is not None and mem_free < demand.memory:
            return None
        per, count, models = demand.per_gpu, demand.count, demand.models
        if pricer.all_qs is not None and count > 1:
            sig_entry = pricer.node_sigs.get(gpus)
            if sig_entry is None:
                sig_entry = pricer.node_sig(gpus)
            if sig_entry[1] is not None:
                return self._evaluate_gpus_one_model(gpus, per, count, models, pricer, sig_entry)
        elig = [(f, i) for i, (m, f) in enumerate(gpus) if f >= per and (not models or _model_allowed(models, m))]
        if len(elig) < count:
            return None
        elig.sort()  # least room first, lowest index on ties: `_best_fit`
        picked = elig[:count]
        chosen = tuple(sorted(i for _, i in picked))
        model = gpus[picked[0][1]][0] if picked else ""
        keys = pricer.keys
        d = 0
        left = -per * count
        if picked and keys:
            single = pricer.single_loss(per)  # includes the free capacity each GPU gives up
            for f, i in picked:
                g = gpus[i]
                if g[0] != model:
                    break
                left += f
                x = single.get(g)
                if x is None:
                    x = single[g] = pricer.value(model, f) - pricer.value(model, f - per) - per * pricer.total_w
                d += x
            else:
                qs, stay, _, _, _, rooms, usables = self.prefix_of(gpus, model, pricer)
                lo = bisect_right(qs, picked[0][0] - per)  # keys every chosen GPU keeps room for
                d += count * per * stay[lo]
                ks = pricer.keys_for(model)
                frees = [f for f, _ in picked]
                for j in range(lo, bisect_right(qs, picked[-1][0], lo)):
                    k, q = ks[j]
                    dr, du = _key_change(frees, per, q)
                    room, usable = rooms[j], usables[j]
                    row = pricer.coefficient_row(k, room)
                    a1, b1 = row[room + dr]
                    a0, b0 = row[room]
                    d -= a1 * (usable + du) + b1 - a0 * usable - b0
                return self._finish(d, left, chosen, gpus, per, None)
        # Mixed models on the chosen GPUs, no multi-GPU keys, or a CPU-only demand: the general sum.
        changes = [(gpus[i][0], f, f - per) for f, i in picked]
        d = pricer.delta(self.key_sums(tuple(sorted(gpus)), pricer) if keys else (), changes)
        left = sum(f for f, _ in picked) - per * count
        return self._finish(d, left, chosen, gpus, per, None)

    def _evaluate_gpus_one_model(
        self, gpus: GpuView, per: int, count: int, models: tuple[str, ...], pricer: _Pricer, sig_entry: NodeSig
    ) -> Evaluation:
        """`_evaluate_gpus` on a node of one GPU model with unrestricted keys, from its `node_sig`: the
        best-fit GPUs are the `count` least frees with room (lowest positions on ties), and their price
        is `_Pricer.delta`'s, with every key's room and usable capacity read off the sorted frees."""
        sole = sig_entry[1]
        assert sole is not None
        if models and not _model_allowed(models, sole):
            return None
        sig, _, vals = sig_entry
        n = len(vals)
        i0 = bisect_left(vals, per)
        if n - i0 < count:
            return None
        picked = vals[i0 : i0 + count]
        shares = pricer.multi_infos(per, models, sole)
        info = shares.get(picked)
        if info is None:
            info = shares[picked] = pricer.multi_info(sole, per, models, picked)
        d, lo, moves = info
        stay, _, _, _, idx = pricer.room_prefix(sig)
        d += count * per * stay[lo]
        if moves:  # the keys some chosen GPU crosses: their room and usable capacity on this node
            running = tuple(accumulate(vals, initial=0))
            total = running[-1]
            rows = pricer.coef_rows
            for j, k, dr, du in moves:
                i = idx[j]
                room, usable = n - i, total - running[i]
                row = rows[k]
                if len(row) <= room:
                    row = pricer.coefficient_row(k, room)
                a1, b1 = row[room + dr]
                a0, b0 = row[room]
                d -= a1 * (usable + du) + b1 - a0 * usable - b0
        # The positions: every GPU with room below the last picked free, then the first ones at it.
        last = picked[-1]
        at_last = count - (bisect_left(vals, last) - i0)
        chosen = []
        for i, (_, f) in enumerate(gpus):
            if per <= f < last:
                chosen.append(i)
            elif f == last and at_last:
                chosen.append(i)
                at_last -= 1
        return self._finish(d, sum(picked) - per * count, tuple(chosen), gpus, per, None, sum(vals))

    def _finish(
        self,
        units: int,
        left: int,
        chosen: tuple[int, ...],
        gpus: GpuView,
        per: int,
        cpu_after: int | None,
        node_free: int | None = None,
    ) -> Evaluation:
        """The score of the chosen placement from its exact fragmentation growth (`units`)."""
        total_w = self._pricer.total_w
        delta_f = units / total_w if units else 0.0
        # One float, lexicographic in practice: fragmentation growth, then the chosen GPU's leftover,
        # then the node's leftover free GPU and CPU (best fit). Deltas differ by >= ~1e-4 in practice.
        if node_free is None:
            node_free = sum(f for _, f in gpus)
        node_left = node_free - per * len(chosen)
        cpu_term = 0.0 if cpu_after is None else cpu_after / (cpu_after + 1e6)
        if self.pressure and chosen:
            # Scarcity: GPU capacity that pods restricted to this GPU model need costs more to take,
            # so pods that may run elsewhere leave it to them (constant for a pod that may not).
            delta_f += self.pressure * self.model_pressure(gpus[chosen[0]][0]) * per * len(chosen)
        return -(delta_f + 1e-7 * left + 1e-10 * (node_left + cpu_term)), chosen

    def _evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        pricer = self._pricer
        if view[1] is None:
            if demand.count == 1:
                return self._evaluate_one_gpu(view, demand, pricer)
            return self._evaluate_gpus(view, demand, pricer)
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        gpus, cpu_free, _ = view
        table = pricer.table
        cpu_after = None if cpu_free is None else cpu_free - demand.cpu
        node_free = sum(f for _, f in gpus)
        per = demand.per_gpu
        if demand.count == 1:
            candidates: list[tuple[int, ...]] = []
            seen = set()
            for i in elig:
                if gpus[i] not in seen:
                    seen.add(gpus[i])
                    candidates.append((i,))
        else:
            candidates = [_best_fit(view, elig, demand.count)]
        best: tuple[int, int, tuple[int, ...]] | None = None
        if cpu_free is None:
            # The extender's case: exact incremental prices, O(1) per changed GPU (see _Pricer).
            sums = self.key_sums(tuple(sorted(gpus)), pricer) if pricer.keys else ()
            for chosen in candidates:
                if len(chosen) == 1:
                    m, f = gpus[chosen[0]]
                    delta = pricer.delta_one(sums, m, f, f - per) + pricer.gap(f, per)
                else:
                    delta = pricer.delta(sums, [(gpus[i][0], gpus[i][1], gpus[i][1] - per) for i in chosen])
                left = sum(gpus[i][1] for i in chosen) - per * len(chosen)
                if best is None or (delta, left) < best[:2]:
                    best = (delta, left, chosen)
        else:
            before = self.node_units(gpus, cpu_free)
            aggs = self.aggregates(tuple(sorted(gpus))) if demand.count == 1 else ()
            if self.host_quantile is not None and pricer.host_needs is None:
                pricer.host_needs = self.host_needs()
            mem_free = view[2]
            host = (cpu_free, mem_free)
            host_after = (cpu_after, None if mem_free is None else mem_free - demand.memory)
            for chosen in candidates:
                if demand.count == 1:
                    # One GPU changes: update the per-group sums instead of recounting the node.
                    m, f = gpus[chosen[0]]
                    after = fragmentation_units(
                        node_free - per,
                        shift_aggregates(aggs, table, m, f, f - per),
                        cpu_after,
                        table,
                        self._wa,
                        self._wb,
                    ) + pricer.host_gap(gpus, chosen[0], per, host, host_after)
                else:
                    after_gpus = list(gpus)
                    for i in chosen:
                        m, f = after_gpus[i]
                        after_gpus[i] = (m, f - per)
                    after = self.node_units(tuple(after_gpus), cpu_after) + pricer.host_strand(
                        gpus, chosen, host, host_after
                    )
                delta = after - before
                left = sum(gpus[i][1] for i in chosen) - per * len(chosen)
                if best is None or (delta, left) < best[:2]:
                    best = (delta, left, chosen)
        assert best is not None
        units, left, chosen = best
        return self._finish(units, left, chosen, gpus, per, cpu_after)


# ---------------------------------------------------------------------------------------------------
# FGD, as published (Weng et al., "Beware of Fragmentation", USENIX ATC '23, section 4), kept apart from
# `frag` so that `frag` can be measured against it. Written from the paper's text; the authors' public
# simulator (kubernetes-scheduler-simulator, FGDScore) was read for the details the text leaves open:
# - target workload: the pod classes (CPU, per-GPU share, GPU count, GPU models) of the trace, CPU-only
#   pods included, most popular first, cut at the first class where the cumulative count reaches 95 %
#   and renormalised;
# - a node's fragmentation for a class: all its free GPU capacity when the class cannot run there at all
#   (a CPU-only class, a GPU model the class does not accept, too few GPUs with room, too little CPU);
#   otherwise the free capacity of the GPUs too small for one share. The node's fragmentation is the
#   expectation over the classes;
# - score: int(100 * sigmoid((before - after) / GPU)), an integer 0-100 as kube-scheduler plugins score;
#   equal node scores go to the first node: the paper's simulator runs a kube-scheduler fork
#   (github.com/mental2008/kubernetes v1.20.5-minor, `selectHost`) that picks the lexicographically
#   smallest node name among the best "for reproducibility", not a random one; openb's node names are
#   in input order, so the first node by name is the first node. (With random ties, as upstream
#   kube-scheduler does, FGD leaves about 10 % unallocated on the default trace, not 4.77 %.)
# - GPU on the node: a single-GPU pod tries every GPU with room and keeps the first with the highest
#   integer score; a multi-GPU pod takes the GPUs with the least room that fit (lowest index on ties).
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TypicalPods:
    """FGD's target workload: GPU classes as `_ClassGroup`s, plus the share of CPU-only classes."""

    groups: tuple[_ClassGroup, ...]
    cpu_only: float  # probability mass of CPU-only classes (all free GPU capacity is theirs to strand)
    classes: int  # how many classes survived the popularity cut

    @staticmethod
    def from_counts(counts: dict[tuple[int, int, tuple[str, ...], int], float], popularity: float) -> TypicalPods:
        """Top classes by count until their cumulative share reaches `popularity`, renormalised."""
        total = sum(counts.values())
        if total <= 0:
            return TypicalPods((), 0.0, 0)
        # Most popular first; among equal counts the larger class first (as the reference sorts).
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0][3], kv[0][0], kv[0][1], kv[0][2]), reverse=True)
        kept: list[tuple[tuple[int, int, tuple[str, ...], int], float]] = []
        cum = 0.0
        for key, n in ranked:
            if cum >= popularity * total:
                break
            kept.append((key, n))
            cum += n
        cpu_only = sum(n for (per, count, _, _), n in kept if per == 0 or count == 0) / cum
        gpu = {key: n for key, n in kept if key[0] > 0 and key[1] > 0}
        table = WorkloadTable.from_counts(gpu)
        scale = (sum(gpu.values()) / cum) if gpu else 0.0
        groups = tuple(
            _ClassGroup(g.models, g.per_gpu, g.count, g.prob * scale, g.cpus, tuple(c * scale for c in g.cum))
            for g in table.groups
        )
        return TypicalPods(groups, cpu_only, len(kept))


def fgd_fragmentation(gpus: GpuView, cpu_free: int | None, typical: TypicalPods) -> float:
    """FGD's expected fragmentation of a node: free GPU capacity the next typical pod could not use."""
    total = 0
    for _, f in gpus:
        total += f
    if total == 0:
        return 0.0
    frag = typical.cpu_only * total
    by_models: dict[tuple[str, ...], list[int]] = {}
    for g in typical.groups:
        frees = by_models.get(g.models)
        if frees is None:
            frees = sorted(f for m, f in gpus if not g.models or _model_allowed(g.models, m))
            by_models[g.models] = frees
        k = bisect_left(frees, g.per_gpu)
        if len(frees) - k < g.count:
            frag += g.prob * total  # cannot host it on GPUs (Q1/Q2, or no GPU of its models)
            continue
        stranded = total - sum(frees[k:])
        if cpu_free is None:
            frag += g.prob * stranded
            continue
        ok = g.cum[bisect_right(g.cpus, cpu_free)]  # classes whose CPU fits (Q3); the rest lack CPU (Q4)
        frag += ok * stranded + (g.prob - ok) * total
    return frag


class FgdPolicy(_ViewPolicy):
    """FGD (ATC '23): least growth of expected fragmentation, as an integer score 0-100; first node on ties."""

    name = "fgd"
    POPULARITY = 0.95
    MEMO_LIMIT = 400_000

    def __init__(self, gpu_unit: int = 1000, popularity: float = POPULARITY) -> None:
        if gpu_unit <= 0 or not 0.0 < popularity <= 1.0:
            raise ValueError("fgd: gpu_unit must be positive and popularity in (0, 1]")
        self.gpu_unit = gpu_unit
        self.popularity = popularity
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, int, tuple[str, ...], int], float] = {}
        self._observed = 0
        self._dirty = False
        self._typical = TypicalPods((), 0.0, 0)
        self._typical_observed = 0
        self._memo: dict[Any, float] = {}
        self._eval_memo: dict[tuple[NodeView, Demand], Evaluation] = {}

    def observe(self, demand: Demand) -> None:
        gpu = demand.count > 0 and demand.per_gpu > 0
        key = (
            demand.per_gpu if gpu else 0,
            demand.count if gpu else 0,
            tuple(sorted(m.lower() for m in demand.models)) if gpu else (),
            demand.cpu,
        )
        with self._lock:
            self._counts[key] = self._counts.get(key, 0.0) + 1.0
            self._observed += 1
            if self._observed >= (1.0 + FragPolicy.REFRESH) * max(self._typical_observed, 1):
                self._dirty = True

    @property
    def typical(self) -> TypicalPods:
        """The current target workload (rebuilt lazily after observe())."""
        if self._dirty:
            with self._lock:
                if self._dirty:
                    self._typical = TypicalPods.from_counts(self._counts, self.popularity)
                    self._typical_observed = self._observed
                    self._memo = {}
                    self._eval_memo = {}
                    self._dirty = False
        return self._typical

    def node_fragmentation(self, gpus: GpuView, cpu_free: int | None) -> float:
        key = (tuple(sorted(gpus)), cpu_free)
        v = self._memo.get(key)
        if v is None:
            v = fgd_fragmentation(gpus, cpu_free, self.typical)
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = v
        return v

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        _ = self.typical  # refresh first, so the memo below belongs to the current workload
        key = (view, demand)
        ev = self._eval_memo.get(key, _MISSING)
        if ev is _MISSING:
            ev = self._evaluate(view, demand)
            if len(self._eval_memo) >= self.MEMO_LIMIT:
                self._eval_memo.clear()
            self._eval_memo[key] = ev
        return ev  # type: ignore[return-value]

    def _score(self, before: float, gpus: GpuView, cpu_after: int | None, chosen: tuple[int, ...], per: int) -> int:
        after_gpus = list(gpus)
        for i in chosen:
            m, f = after_gpus[i]
            after_gpus[i] = (m, f - per)
        x = (before - self.node_fragmentation(tuple(after_gpus), cpu_after)) / self.gpu_unit
        # sigmoid without overflow for large |x|
        s = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
        return int(s * 100)

    def _evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        gpus, cpu_free, _ = view
        cpu_after = None if cpu_free is None else cpu_free - demand.cpu
        before = self.node_fragmentation(gpus, cpu_free)
        if demand.count == 1:
            best_score, best = -1, (elig[0],)
            for i in sorted(elig):
                s = self._score(before, gpus, cpu_after, (i,), demand.per_gpu)
                if s > best_score:
                    best_score, best = s, (i,)
            return float(best_score), best
        chosen = _best_fit(view, elig, demand.count) if demand.count > 0 else ()
        return float(self._score(before, gpus, cpu_after, chosen, demand.per_gpu)), chosen


POLICIES: dict[str, type] = {
    "binpack": BinpackPolicy,
    "bestfit": BestFitPolicy,
    "spread": SpreadPolicy,
    "random": RandomPolicy,
    "frag": FragPolicy,
    "fgd": FgdPolicy,
}


def make_policy(name: str, **options: Any) -> Policy:
    """A fresh policy by name; `options` go to its constructor (e.g. `seed` for random)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}: choose one of {', '.join(sorted(POLICIES))}") from None
    return cls(**options)


def best_node(nodes: Sequence[NodeState], demand: Demand, policy: Policy) -> NodeState | None:
    """The node the policy scores highest among those that fit (first on ties)."""
    best, best_score = None, NEG_INF
    for node in nodes:
        s = policy.score(node, demand)
        if s > best_score:
            best, best_score = node, s
    return best
