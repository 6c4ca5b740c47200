"""FGD as published (Weng et al., USENIX ATC '23), kept apart from `frag` so `frag` is measured against it."""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from share_placement.binpack import best_fit
from share_placement.model import MISSING
from share_placement.model import Demand
from share_placement.model import Evaluation
from share_placement.model import GpuView
from share_placement.model import NodeView
from share_placement.model import ViewPolicy
from share_placement.model import eligible_positions
from share_placement.model import model_allowed
from share_placement.workload import ClassGroup
from share_placement.workload import ClassKey
from share_placement.workload import ObservedClasses
from share_placement.workload import WorkloadTable

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
    """FGD's target workload: GPU classes as `ClassGroup`s, plus the share of CPU-only classes."""

    groups: tuple[ClassGroup, ...]
    cpu_only: float  # probability mass of CPU-only classes (all free GPU capacity is theirs to strand)
    classes: int  # how many classes survived the popularity cut
    # Every group's CPU asks, sorted: free CPU enters `fgd_fragmentation` only through each group's
    # `bisect_right(g.cpus, cpu_free)`, so nodes whose free CPU falls between the same two of these count
    # alike (`FgdPolicy.node_fragmentation`'s memo: a churning cluster has a new free CPU at every event).
    cpu_cuts: tuple[int, ...] = ()

    @staticmethod
    def from_counts(counts: dict[ClassKey, float], popularity: float) -> TypicalPods:
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
            ClassGroup(g.models, g.per_gpu, g.count, g.prob * scale, g.cpus, tuple(c * scale for c in g.cum))
            for g in table.groups
        )
        return TypicalPods(groups, cpu_only, len(kept), tuple(sorted({c for g in groups for c in g.cpus})))


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
            frees = sorted(f for m, f in gpus if not g.models or model_allowed(g.models, m))
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


class FgdPolicy(ViewPolicy):
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
        self._classes = ObservedClasses()
        self._typical = TypicalPods((), 0.0, 0)
        self._memo: dict[Any, float] = {}
        self._eval_memo: dict[tuple[NodeView, Demand], Evaluation] = {}
        # Whether `evaluate` keeps its answers per (view, demand) (see FragPolicy.memo_evaluations).
        self.memo_evaluations = True

    def observe(self, demand: Demand) -> None:
        gpu = demand.count > 0 and demand.per_gpu > 0
        key = (
            demand.per_gpu if gpu else 0,
            demand.count if gpu else 0,
            tuple(sorted(m.lower() for m in demand.models)) if gpu else (),
            demand.cpu,
        )
        with self._lock:
            self._classes.add(key)

    @property
    def typical(self) -> TypicalPods:
        """The current target workload (rebuilt lazily after observe())."""
        self._classes.refresh(self._lock, self._rebuild)
        return self._typical

    def _rebuild(self, counts: dict[ClassKey, float]) -> None:
        self._typical = TypicalPods.from_counts(counts, self.popularity)
        self._memo = {}
        self._eval_memo = {}

    def node_fragmentation(self, gpus: GpuView, cpu_free: int | None) -> float:
        return self._node_fragmentation(gpus, cpu_free, self.typical)

    def _node_fragmentation(self, gpus: GpuView, cpu_free: int | None, typical: TypicalPods) -> float:
        """`fgd_fragmentation`, memoised per sorted GPUs and CPU class under `typical` (the current workload,
        read once per evaluation)."""
        key = (tuple(sorted(gpus)), None if cpu_free is None else bisect_right(typical.cpu_cuts, cpu_free))
        v = self._memo.get(key)
        if v is None:
            v = fgd_fragmentation(gpus, cpu_free, typical)
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = v
        return v

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        typical = self.typical  # refresh first, so the memo below belongs to the current workload
        if not self.memo_evaluations:
            return self._evaluate(view, demand, typical)
        key = (view, demand)
        ev = self._eval_memo.get(key, MISSING)
        if ev is MISSING:
            ev = self._evaluate(view, demand, typical)
            if len(self._eval_memo) >= self.MEMO_LIMIT:
                self._eval_memo.clear()
            self._eval_memo[key] = ev
        return ev  # type: ignore[return-value]

    def _score(
        self,
        before: float,
        gpus: GpuView,
        cpu_after: int | None,
        chosen: tuple[int, ...],
        per: int,
        typical: TypicalPods,
    ) -> int:
        after_gpus = list(gpus)
        for i in chosen:
            m, f = after_gpus[i]
            after_gpus[i] = (m, f - per)
        x = (before - self._node_fragmentation(tuple(after_gpus), cpu_after, typical)) / self.gpu_unit
        # sigmoid without overflow for large |x|
        s = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
        return int(s * 100)

    def _evaluate(self, view: NodeView, demand: Demand, typical: TypicalPods) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        gpus, cpu_free, _ = view
        cpu_after = None if cpu_free is None else cpu_free - demand.cpu
        before = self._node_fragmentation(gpus, cpu_free, typical)
        if demand.count == 1:
            # GPUs in the same state score alike (the node after differs only in order): each state once,
            # at its first position, which is the one a tie keeps anyway.
            best_score, best = -1, (elig[0],)
            seen = set()
            for i in sorted(elig):
                g = gpus[i]
                if g in seen:
                    continue
                seen.add(g)
                s = self._score(before, gpus, cpu_after, (i,), demand.per_gpu, typical)
                if s > best_score:
                    best_score, best = s, (i,)
            return float(best_score), best
        chosen = best_fit(view, elig, demand.count) if demand.count > 0 else ()
        return float(self._score(before, gpus, cpu_after, chosen, demand.per_gpu, typical)), chosen
