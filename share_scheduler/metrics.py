"""The extender's metrics: request latency, bind outcomes, cache state and per-GPU gauges."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.utils import floatToGoString

from share_core.holds import HoldKind
from share_scheduler.cache import ClusterCache
from share_scheduler.leaveroom import LeaveRoom
from share_scheduler.starvation import StarvationMetrics
from share_scheduler.waiting import WAIT_CLASSES
from share_scheduler.waiting import WaitingPod
from share_scheduler.waiting import wait_class

# Fine where a healthy extender answers (filter ~1 ms, bind one API call ~5-20 ms), coarse beyond.
_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.035, 0.05,
            0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip


class _LeadingCollector:
    """gpushare_extender_leading, read at scrape time from `Leadership.is_leader`."""

    def __init__(self, is_leader: Callable[[], bool]) -> None:
        self.is_leader = is_leader

    def collect(self) -> Any:
        leading = GaugeMetricFamily(
            "gpushare_extender_leading",
            "1 while this replica acts on its own (evictions, reservations, consolidation): the one beside the "
            "kube-scheduler that holds the leader Lease, or the only replica",
        )
        leading.add_metric([], 1 if self.is_leader() else 0)
        yield leading


class _SyncedCollector:
    """gpushare_cache_synced, read at scrape time."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def collect(self) -> Any:
        synced = GaugeMetricFamily("gpushare_cache_synced", "1 once nodes and pods were fully listed")
        synced.add_metric([], 1 if self.cache.synced else 0)
        yield synced


def _label(value: str) -> str:
    """A label value escaped as the text exposition format asks (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class GpuGauges:
    """Per-GPU gauges (allocated, total) as exposition text, re-rendered only for nodes that changed.

    At 5,000 nodes x 8 GPUs, building them per scrape through prometheus_client's collector (the
    cache's /inspect view, a sample object per value) cost ~1 s of CPU holding the GIL, and the
    serial filter path stalled behind every scrape. Each node's lines are kept, and a scrape
    re-renders only the nodes the cache logged as changed since the last one (ClusterCache.node_changes)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._cursor: int | None = None
        self._allocated: dict[str, str] = {}
        self._total: dict[str, str] = {}
        self._lock = threading.Lock()

    def text(self) -> str:
        with self._lock:
            cursor, changed, afresh = self.cache.node_changes(self._cursor)
            if afresh:
                self._allocated, self._total = {}, {}
            for name, snap in changed:
                if snap is None:
                    self._allocated.pop(name, None)
                    self._total.pop(name, None)
                    continue
                allocated, total = [], []
                node = _label(name)
                for g, used in zip(snap.gpus, snap.used, strict=True):
                    labels = f'{{gpu="{g.index}",node="{node}",uuid="{_label(g.uuid)}"}} '
                    allocated.append(f"gpushare_gpu_memory_allocated{labels}{floatToGoString(used)}\n")
                    total.append(f"gpushare_gpu_memory_total{labels}{floatToGoString(g.memory if g.healthy else 0)}\n")
                self._allocated[name] = "".join(allocated)
                self._total[name] = "".join(total)
            self._cursor = cursor
            names = sorted(self._allocated)
            unit = self.cache.unit.value
            return "".join(
                [
                    f"# HELP gpushare_gpu_memory_allocated GPU memory promised to pods ({unit})\n",
                    "# TYPE gpushare_gpu_memory_allocated gauge\n",
                    *(self._allocated[n] for n in names),
                    f"# HELP gpushare_gpu_memory_total GPU memory ({unit}); 0 when unhealthy\n",
                    "# TYPE gpushare_gpu_memory_total gauge\n",
                    *(self._total[n] for n in names),
                ]
            )


class Metrics:
    """Every metric the extender exports, in one registry (GET /metrics adds GpuGauges' text)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpushare_extender_request_seconds",
            "filter/prioritize/bind latency",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.bind_failures = Counter(
            "gpushare_bind_failures", "binds that returned Error, by reason", ["reason"], registry=self.registry
        )
        self.binds = Counter("gpushare_binds", "successful binds", registry=self.registry)
        self.bind_pod_reads = Counter(
            "gpushare_bind_pod_reads",
            "binds that had to read the pod from the API server (filter had not seen it: e.g. after a restart)",
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "gpushare_events_dropped",
            "Events not posted because the queue was full (the API server is slow)",
            registry=self.registry,
        )
        self.events_failed = Counter(
            "gpushare_events_failed", "Events the API server refused or did not answer", registry=self.registry
        )
        self.registry.register(_SyncedCollector(cache))
        # Preemption (share_scheduler.preempt): the verb's answers, the decisions and how they ended.
        self.preempt_calls = Counter(
            "gpushare_preempt_calls", "preempt verb calls by result", ["result"], registry=self.registry
        )
        self.preempt_unknown_victims = Counter(
            "gpushare_preempt_unknown_victims",
            "victims kube-scheduler proposed that the extender's cache does not know (watch lag)",
            registry=self.registry,
        )
        self.preempt_victims_added = Counter(
            "gpushare_preempt_victims_added",
            "victims the extender chose that kube-scheduler had not proposed on that node",
            registry=self.registry,
        )
        self.preempt_victims_dropped = Counter(
            "gpushare_preempt_victims_dropped",
            "victims kube-scheduler proposed on the chosen node that the extender spared",
            registry=self.registry,
        )
        self.preemptions = Counter(
            "gpushare_preemptions",
            "preemption decisions (verb: kube-scheduler evicts; extender: the leader evicts itself)",
            ["source"],
            registry=self.registry,
        )
        self.preemption_victims = Histogram(
            "gpushare_preemption_victims",
            "victims per preemption",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16),
            registry=self.registry,
        )
        self.preempt_evictions = Counter(
            "gpushare_preempt_evictions", "victims the extender itself evicted", registry=self.registry
        )
        self.preempt_eviction_errors = Counter(
            "gpushare_preempt_eviction_errors", "evictions the API server refused or failed", registry=self.registry
        )
        self.preemption_outcomes = Counter(
            "gpushare_preemption_outcomes",
            "how preemptions ended: bound_on_freed_gpus, bound_elsewhere, timed_out, preemptor_deleted, "
            "not_carried_out",
            ["outcome"],
            registry=self.registry,
        )
        self.preemption_wasted_evictions = Counter(
            "gpushare_preemption_wasted_evictions",
            "victims of preemptions whose preemptor was not bound on the freed GPUs within the hold's time",
            registry=self.registry,
        )
        self.gpus = GpuGauges(cache)
        self._add_starvation(cache)

    # -- waiting pods, holds, reservations and consolidation (share_scheduler.starvation) -----------

    def _add_starvation(self, cache: ClusterCache) -> None:
        self.reservations = Counter(
            "gpushare_reservations",
            "room the leader tried to hold for a pod that waited too long, by outcome (made, renewed, at_limit, "
            "over_budget, no_node)",
            ["outcome"],
            registry=self.registry,
        )
        self.consolidations = Counter(
            "gpushare_consolidations",
            "consolidations weighed for a waiting pod, by outcome (started, refused, rate_limited, over_budget, "
            "stopped)",
            ["outcome"],
            registry=self.registry,
        )
        self.consolidation_evictions = Counter(
            "gpushare_consolidation_evictions",
            "pods consolidation evicted, by outcome (evicted; refused: a PodDisruptionBudget said no; failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.room_ready_nudges = Counter(
            "gpushare_room_ready_nudges",
            "pods whose held room fit them while kube-scheduler did not try them again, asked to (the "
            "gpushare.io/room-ready annotation): its try had come before this extender saw the room free",
            registry=self.registry,
        )
        self.pod_wait = Histogram(
            "gpushare_pod_wait_seconds",
            "how long GPU pods waited from creation until bound, by class (share, whole-gpu, multi-gpu)",
            ["class"],
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
            registry=self.registry,
        )
        self.registry.register(_WaitingCollector(cache))
        self._cache = cache
        cache.waiting.on_bound = self._waited

    def _waited(self, pod: WaitingPod, node: str) -> None:
        if pod.created:
            self.pod_wait.labels(wait_class(pod.demand, self._cache.largest_gpu)).observe(pod.waited(time.time()))

    def watch_leadership(self, is_leader: Callable[[], bool]) -> None:
        """gpushare_extender_leading: which replica of an HA pair acts on its own (read at scrape time)."""
        self.registry.register(_LeadingCollector(is_leader))

    def watch_leave_room(self, leave_room: LeaveRoom) -> None:
        """`--leave-room on`: export the shapes the policy leaves room for."""
        self.registry.register(_LeaveRoomCollector(leave_room))

    def starvation_hooks(self) -> StarvationMetrics:
        return StarvationMetrics(
            reservation=lambda outcome: self.reservations.labels(outcome).inc(),
            consolidation=lambda outcome: self.consolidations.labels(outcome).inc(),
            eviction=lambda outcome: self.consolidation_evictions.labels(outcome).inc(),
            nudge=self.room_ready_nudges.inc,
        )


class _WaitingCollector:
    """Holds by kind (count, units) and pods waiting by class (count, longest wait), read at scrape time."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def collect(self) -> Any:
        unit = self.cache.unit.value
        holds = GaugeMetricFamily("gpushare_holds", "GPU memory holds for pods not bound yet, by kind", labels=["kind"])
        held = GaugeMetricFamily(
            "gpushare_held_memory", f"GPU memory held for pods not bound yet ({unit}), by kind", labels=["kind"]
        )
        count = dict.fromkeys(HoldKind, 0)
        units = dict.fromkeys(HoldKind, 0)
        for _, h in self.cache.holds.holds():
            count[h.kind] += 1
            units[h.kind] += h.per_gpu * len(h.gpus)
        for kind in HoldKind:
            holds.add_metric([str(kind)], count[kind])
            held.add_metric([str(kind)], units[kind])
        yield holds
        yield held
        yields = CounterMetricFamily(
            "gpushare_reservation_yields",
            "pods that reservations yielded to: small pods kube-scheduler found no room for that waited past "
            "--hold-yield-after (they may take the held memory)",
            value=self.cache.holds.yields,
        )
        yield yields
        waiting = GaugeMetricFamily(
            "gpushare_waiting_pods", "unbound pods asking GPU memory, by class", labels=["class"]
        )
        oldest = GaugeMetricFamily(
            "gpushare_waiting_longest_seconds", "the longest wait of an unbound GPU pod, by class", labels=["class"]
        )
        now = time.time()
        largest = self.cache.largest_gpu
        by_class = {c: (0, 0.0) for c in WAIT_CLASSES}
        for pod in self.cache.waiting.pods():
            c = wait_class(pod.demand, largest)
            n, longest = by_class[c]
            by_class[c] = (n + 1, max(longest, pod.waited(now)))
        for c, (n, longest) in by_class.items():
            waiting.add_metric([c], n)
            oldest.add_metric([c], longest)
        yield waiting
        yield oldest


class _LeaveRoomCollector:
    """The shapes the placement policy leaves room for (`--leave-room on`), read at scrape time."""

    def __init__(self, leave_room: LeaveRoom) -> None:
        self.leave_room = leave_room

    def collect(self) -> Any:
        room = self.leave_room
        room.refresh()  # current even while no pod is being scheduled
        shapes = GaugeMetricFamily(
            "gpushare_leave_room_shapes",
            f"the multi-GPU shapes the placement policy leaves room for (GPUs, {room.unit} per GPU, allowed "
            "models): the value is how many pods of the shape wait now (0: none since a while, it lingers)",
            labels=["gpus", "per_gpu", "models"],
        )
        for s in room.shapes:
            shapes.add_metric([str(s.count), str(s.per_gpu), "|".join(s.models)], room.waiting_now(s))
        yield shapes
