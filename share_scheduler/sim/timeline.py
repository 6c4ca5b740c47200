"""The timeline: pods arrive, wait in kube-scheduler's queue, run for their time and leave.

The ATC'23 protocol (engine.py) reads the cluster once, pods only arriving; a real cluster churns. Here
every pod runs for its duration (the trace's deletion_time - scheduled_time, capped) and leaves, a pod
that fits nowhere waits, and every departure lets the waiting pods try again. Placement is the same
code as engine.py's and the extender's: `cluster.ClusterState` with the policy built by
`engine.build_policy`.

The queue is kube-scheduler's (pkg/scheduler, k8s.io/kubernetes v1.37):
- a new pod goes to activeQ and is tried at once (`PriorityQueue.Add`);
- a pod that fits nowhere goes to the unschedulable pool (`AddUnschedulablePodIfNotPresent`, which
  refreshes its queue timestamp);
- a departure (`deletePodFromCache` in eventhandlers.go: `MoveAllToActiveOrBackoffQueue` with
  `EventAssignedPodDelete`) moves every waiting pod back to activeQ: the extender's rejection leaves no
  rejecting plugin on the pod, so `isPodWorthRequeuing` says requeue for every event;
- activeQ pops by `PrioritySort.Less` (framework/plugins/queuesort/priority_sort.go): higher priority
  first, then the earlier timestamp. As every waiting pod is retried at every departure and fails again
  in the order it was tried, the timestamps keep the order of first failure: arrival order.
Not modelled: backoff (podInitialBackoffSeconds 1 s, doubling up to 10 s) and the time a scheduling
cycle takes: retries are instant. Nothing is preempted; priority only orders the queue.

Speed: a waiting pod fit nowhere at its last try, and since then nodes only lost room except the one a
pod just left; fitting only grows with room (GPU by GPU, CPU, memory), so after a departure a waiting pod
can fit only on that node. The retry therefore checks that node alone, pod by pod in queue order, with
the pods grouped by demand (one check per distinct demand, not per pod). `retry="full"` retries every
waiting pod over the whole cluster instead (tests/unit/sim/test_timeline.py proves the two equal). The
same reasoning spares a search to a new pod whose demand already waits: it fits nowhere either.

Where issue 40's remedies plug in: `TimelineHooks` (room held for some pods against others, a step after
every event for consolidation) and `Timeline.waiting()`, the queue as the policy may see it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field

import share_placement as placement
from share_placement import NodeView
from share_placement import Policy
from share_scheduler.sim.cluster import ClusterState
from share_scheduler.sim.cluster import policy_memo_off
from share_scheduler.sim.cluster import rare_collections
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload

DAY = 86400.0
CLASSES = ("share", "whole", "multi", "cpu")
RETRIES = ("node", "full")
DEFAULT_SAMPLES = 600  # time-series points over a run, when the caller names no interval


@dataclass(frozen=True, slots=True)
class Arrival:
    """A pod of the workload arriving at `time` (s) and running `duration` (s, already capped)."""

    time: float
    pod: int  # index into workload.pods
    duration: float


def pod_class(pod: SimPod, gpu_unit: int) -> str:
    """share (part of one GPU), whole (one whole GPU), multi (2+ GPUs) or cpu (no GPU).

    `gpu_unit`: the size of the cluster's largest GPU (1000 in the openb trace, GiB in a YAML)."""
    if pod.count == 0:
        return "cpu"
    if pod.count > 1:
        return "multi"
    return "whole" if pod.per_gpu >= gpu_unit else "share"


def gpu_unit(workload: Workload) -> int:
    """The cluster's largest GPU: a pod asking that much of one GPU takes it whole."""
    sizes = [g for n in workload.nodes for g in n.gpus]
    if not sizes:
        raise ValueError("the cluster has no GPUs")
    return max(sizes)


def runnable(workload: Workload) -> list[int]:
    """Indices of the pods with a duration: those the trace shows running (Pending pods never ran)."""
    return [k for k, p in enumerate(workload.pods) if p.duration is not None]


def _cap_s(cap_days: float | None) -> float:
    if cap_days is None:
        return math.inf
    if not cap_days > 0:
        raise ValueError(f"cap_days must be positive, got {cap_days!r}")
    return cap_days * DAY


def arrival_rate(workload: Workload, rho: float, cap_days: float | None = 1.0) -> float:
    """Pods per second that offer `rho` x the cluster's GPU capacity, drawing the runnable pods uniformly.

    Offered load = rate x mean over the runnable pods of (GPU units x capped duration). CPU-only pods are
    in that mean with 0 units: they arrive in the trace's proportion and add nothing to rho."""
    if not rho > 0:
        raise ValueError(f"rho must be positive, got {rho!r}")
    eligible = runnable(workload)
    if not eligible:
        raise ValueError("no pod of the workload has a duration (all Pending in the trace?): nothing can run")
    cap = _cap_s(cap_days)
    pods = workload.pods
    work = sum(pods[k].gpu_request * min(pods[k].duration or 0.0, cap) for k in eligible) / len(eligible)
    if work <= 0:
        raise ValueError("the runnable pods ask no GPU time: no arrival rate gives a GPU load")
    return rho * workload.gpu_capacity / work


def poisson_arrivals(
    workload: Workload, rho: float, days: float, cap_days: float | None = 1.0, seed: int = 0
) -> list[Arrival]:
    """A Poisson stream over [0, days) at offered GPU load `rho` (see `arrival_rate`): the runnable pods
    drawn uniformly with replacement, each running its trace duration capped at `cap_days`."""
    if not days > 0:
        raise ValueError(f"days must be positive, got {days!r}")
    rate = arrival_rate(workload, rho, cap_days)
    cap = _cap_s(cap_days)
    eligible = runnable(workload)
    pods = workload.pods
    rng = random.Random(f"timeline-{seed}")
    end = days * DAY
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < end:
        k = eligible[rng.randrange(len(eligible))]
        out.append(Arrival(t, k, min(pods[k].duration or 0.0, cap)))
        t += rng.expovariate(rate)
    return out


def trace_arrivals(
    workload: Workload, compress: float, cap_days: float | None = 1.0, days: float | None = None
) -> list[Arrival]:
    """The trace's own runnable pods, once each, in creation order, at (creation - first creation) / compress.

    Durations stay the trace's (capped): `compress` > 1 packs the same pods into less time, a higher
    load with the trace's bursts kept. `days` cuts the stream there (None: the whole trace)."""
    if not compress > 0:
        raise ValueError(f"compress must be positive, got {compress!r}")
    cap = _cap_s(cap_days)
    pods = workload.pods
    timed = [k for k in runnable(workload) if pods[k].created is not None]
    if not timed:
        raise ValueError("no runnable pod has a creation time: the trace cannot be replayed")
    timed.sort(key=lambda k: (pods[k].created, k))
    first = pods[timed[0]].created or 0.0
    end = math.inf if days is None else days * DAY
    out = []
    for k in timed:
        t = ((pods[k].created or 0.0) - first) / compress
        if t >= end:
            break
        out.append(Arrival(t, k, min(pods[k].duration or 0.0, cap)))
    return out


class TimelineHooks:
    """Where issue 40's remedies plug in; this default changes nothing.

    `held` may reduce the room some pods see (reservations, holds for moved pods: share_core.holds'
    `held_units` decides which, `Timeline.held_views` turns its answer into views); `after_event` runs
    after every arrival and departure (a consolidation step: it may `Timeline.release`, `Timeline.place`,
    `Timeline.unqueue` and `Timeline.retry_on`)."""

    def held(self, timeline: Timeline, seq: int) -> dict[int, NodeView] | None:
        """Nodes whose room arrival `seq` must see reduced, as the views it sees; None: no hold applies."""
        return None

    def after_event(self, timeline: Timeline, now: float) -> None:
        """Called after every event, at time `now`."""


@dataclass(slots=True)
class Series:
    """The run over time, sampled every `step_s`: allocation % and waiting pods per class (for plots)."""

    step_s: float
    times: list[float] = field(default_factory=list)
    alloc_pct: list[float] = field(default_factory=list)
    waiting: dict[str, list[int]] = field(default_factory=lambda: {c: [] for c in CLASSES})


@dataclass(slots=True)
class TimelineResult:
    policy: str
    seed: int
    warmup_s: float
    end_s: float
    alloc_pct: float  # time-averaged allocated GPU units over [warmup, end], % of capacity
    classes: dict[str, dict[str, float | int | None]]
    # Time-averaged free GPU capacity (% of capacity) while at least one GPU pod waits, and the share of
    # the measured time that some GPU pod waited (None / 0 when none ever did).
    free_while_waiting_pct: float | None
    gpu_waiting_time_pct: float
    arrivals: int  # arrivals in the measured window
    placed: int  # placements in the measured window (at arrival or after a wait)
    seconds: float
    series: Series
    evictions: int = 0  # pods moved by consolidation (issue 40's remedies) in the measured window

    def figures(self) -> dict:
        """This seed's figures in the JSON schema (the `mean` shape, plus the seed)."""
        return {
            "seed": self.seed,
            "alloc_pct": round(self.alloc_pct, 3),
            "free_while_waiting_pct": None
            if self.free_while_waiting_pct is None
            else round(self.free_while_waiting_pct, 3),
            "gpu_waiting_time_pct": round(self.gpu_waiting_time_pct, 3),
            "arrivals": self.arrivals,
            "placed": self.placed,
            "evictions_per_1000_placed": round(1000.0 * self.evictions / self.placed, 3) if self.placed else 0.0,
            "classes": self.classes,
        }


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest rank: the smallest value with at least `pct` % of the values at or below it."""
    if not sorted_values:
        raise ValueError("percentile of nothing")
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


class Timeline:
    """One run's state: the cluster, the running pods, the queue, and the figures as time passes.

    Arrivals are numbered by their position in the stream (`seq`); a pod's queue key is
    (-priority, seq), kube-scheduler's activeQ order."""

    # A new pod of a demand that already waits is queued without a search (see `arrive`); False: searched.
    skip_search_for_waiting = True

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        arrivals: list[Arrival],
        warmup_s: float,
        end_s: float,
        seed: int = 0,
        hooks: TimelineHooks | None = None,
        retry: str = "node",
        sample_s: float | None = None,
    ) -> None:
        if retry not in RETRIES:
            raise ValueError(f"unknown retry {retry!r}: choose one of {', '.join(RETRIES)}")
        if not 0 <= warmup_s < end_s:
            raise ValueError(f"need 0 <= warmup ({warmup_s}) < end ({end_s})")
        if any(b.time < a.time for a, b in itertools.pairwise(arrivals)):
            raise ValueError("arrivals must be in time order")
        self.capacity = workload.gpu_capacity
        if self.capacity <= 0:
            raise ValueError("the cluster has no GPU capacity")
        self.workload = workload
        self.policy = policy
        self.arrivals = arrivals
        self.warmup_s = warmup_s
        self.end_s = end_s
        self.seed = seed
        self.hooks = hooks
        self.retry = retry
        policy_memo_off(policy)  # the cluster below keeps every answer per live state
        # Ties broken as kube-scheduler's selectHost (random among the best), drawn only among 2+ nodes.
        self.cluster = ClusterState(workload, policy, random.Random(f"ties-{seed}"), draw_single_tie=False)
        self._pick_rng = random.Random(f"pick-{seed}")  # the random policy's uniform pick among fitting nodes
        unit = gpu_unit(workload)
        self.pod_class = [CLASSES.index(pod_class(p, unit)) for p in workload.pods]
        self.pod_gpu = [p.gpu_request for p in workload.pods]
        self.pod_priority = [p.priority for p in workload.pods]
        self.node_index = {n.name: i for i, n in enumerate(workload.nodes)}
        n = len(arrivals)
        self.started: list[float | None] = [None] * n  # when each arrival was placed
        self.where: dict[int, tuple[int, tuple[int, ...]]] = {}  # running seq -> (node, view positions)
        self.departures: list[tuple[float, int]] = []  # heap of (time, seq); stale entries skipped
        self.ends: dict[int, float] = {}  # running seq -> when it leaves (its live departure entry)
        self.queues: dict[int, list[tuple[int, int]]] = {}  # demand id -> heap of (-priority, seq)
        self.waiting_count = [0] * len(CLASSES)
        self.used = 0  # GPU units allocated
        self.now = 0.0
        self.arrived = 0  # arrivals processed so far (those up to the end)
        # Integrals over [warmup, end].
        self._alloc_area = 0.0
        self._free_waiting_area = 0.0
        self._waiting_time = 0.0
        self.series = Series(sample_s if sample_s else end_s / DEFAULT_SAMPLES)
        self._next_sample = 0.0

    # --- the queue as the policy (and issue 40) may see it ---
    def waiting(self) -> Iterator[tuple[int, int, float]]:
        """(seq, pod index, waiting since) of every waiting pod, in kube-scheduler's queue order."""
        keys = sorted(key for heap in self.queues.values() for key in heap)
        for _, seq in keys:
            a = self.arrivals[seq]
            yield seq, a.pod, a.time

    def held_views(self, held: Mapping[str, Mapping[int, int]]) -> dict[int, NodeView]:
        """share_core.holds.held_units' answer (node name -> GPU index -> units held against a pod) as the
        reduced views `TimelineHooks.held` returns: those units counted as taken (never below 0 free)."""
        out: dict[int, NodeView] = {}
        for name, per_gpu in held.items():
            node = self.node_index.get(name)
            if node is None:
                raise ValueError(f"a hold names node {name!r}, which is not in the simulated cluster")
            gpus, cpu, mem = self.cluster.view(node)
            reduced = list(gpus)
            for g, units in per_gpu.items():
                if not 0 <= g < len(reduced):
                    raise ValueError(f"a hold names GPU {g} of node {name!r}, which has {len(reduced)}")
                model, free = reduced[g]
                reduced[g] = (model, max(0, free - units))
            out[node] = (tuple(reduced), cpu, mem)
        return out

    # --- time ---
    def _advance(self, t: float) -> None:
        """Move the clock to `t`, integrating the figures over the part inside [warmup, end]."""
        series = self.series
        while self._next_sample <= t and self._next_sample <= self.end_s:
            series.times.append(self._next_sample)
            series.alloc_pct.append(100.0 * self.used / self.capacity)
            for c, name in enumerate(CLASSES):
                series.waiting[name].append(self.waiting_count[c])
            self._next_sample += series.step_s
        lo = max(self.now, self.warmup_s)
        hi = min(t, self.end_s)
        if hi > lo:
            dt = hi - lo
            self._alloc_area += self.used * dt
            if self.waiting_count[0] or self.waiting_count[1] or self.waiting_count[2]:
                self._free_waiting_area += (self.capacity - self.used) * dt
                self._waiting_time += dt
        self.now = t

    # --- moves ---
    def place(self, seq: int, node: int, positions: tuple[int, ...]) -> None:
        """Run arrival `seq` on `node`'s GPUs at view `positions`, from now until now + its duration."""
        a = self.arrivals[seq]
        self.cluster.place(node, self.cluster.pod_demand[a.pod], positions)
        self.where[seq] = (node, positions)
        if self.started[seq] is None:  # its first placement ends its wait (a move does not start one)
            self.started[seq] = self.now
        self.used += self.pod_gpu[a.pod]
        self.ends[seq] = self.now + a.duration
        heapq.heappush(self.departures, (self.now + a.duration, seq))

    def release(self, seq: int) -> int:
        """Stop arrival `seq` (it left, or a hook moves it): its room is free again. Returns its node; the
        caller retries the waiting pods there (`retry_on`). Placed again, it runs its whole duration anew."""
        node, positions = self.where.pop(seq)
        del self.ends[seq]
        pod = self.arrivals[seq].pod
        self.cluster.release(node, self.cluster.pod_demand[pod], positions)
        self.used -= self.pod_gpu[pod]
        return node

    def _enqueue(self, seq: int) -> None:
        pod = self.arrivals[seq].pod
        heapq.heappush(self.queues.setdefault(self.cluster.pod_demand[pod], []), (-self.pod_priority[pod], seq))
        self.waiting_count[self.pod_class[pod]] += 1

    def _dequeue(self, dix: int) -> int:
        heap = self.queues[dix]
        _, seq = heapq.heappop(heap)
        if not heap:
            del self.queues[dix]
        self.waiting_count[self.pod_class[self.arrivals[seq].pod]] -= 1
        return seq

    def _choose(self, seq: int) -> tuple[int, placement.Evaluation] | None:
        """Where the policy puts arrival `seq` now, over the whole cluster (None: fits nowhere)."""
        dix = self.cluster.pod_demand[self.arrivals[seq].pod]
        held = self.hooks.held(self, seq) if self.hooks is not None else None
        if not held:
            return self.cluster.best_indexed(dix, self._pick_rng)
        return self._choose_held(dix, held)

    def _choose_held(self, dix: int, held: dict[int, NodeView]) -> tuple[int, placement.Evaluation] | None:
        """The slower exact path when holds apply: node by node, held nodes seen through their reduced views."""
        cluster = self.cluster
        demand = cluster.demands[dix]
        best_score = placement.NEG_INF
        tied: list[tuple[int, placement.Evaluation]] = []
        for node, sid in enumerate(cluster.node_state):
            view = held.get(node)
            ev = cluster.evaluation(sid, dix) if view is None else cluster.evaluate(view, demand)
            if ev is None or ev[0] < best_score:
                continue
            if ev[0] > best_score:
                best_score, tied = ev[0], []
            tied.append((node, ev))
        if not tied:
            return None
        if cluster.tie_rng is not None and len(tied) > 1:
            return tied[cluster.tie_rng.randrange(len(tied))]
        return tied[0]

    def arrive(self, seq: int) -> bool:
        """Arrival `seq` is tried at once; if it fits nowhere it waits. True when placed.

        Without hooks, a demand that has pods waiting fits nowhere (each retry leaves no waiting demand
        that fits the node it retried, and no other node gained room): its new pod waits without a search."""
        if self.skip_search_for_waiting and self.hooks is None and self.retry == "node":
            dix = self.cluster.pod_demand[self.arrivals[seq].pod]
            if dix in self.queues:
                self.cluster.refuse(self._pick_rng)
                self._enqueue(seq)
                return False
        chosen = self._choose(seq)
        if chosen is None:
            self._enqueue(seq)
            return False
        node, ev = chosen
        self.place(seq, node, ev[1])
        return True

    def retry_on(self, node: int) -> None:
        """`node` gained room: the waiting pods try again, in queue order, on that node alone (see the module
        docstring for why that is all a full retry could place)."""
        if not self.queues:
            return
        if self.retry == "full":
            self._retry_full()
            return
        cluster = self.cluster
        if self.hooks is not None:
            self._retry_node_exact(node)
            return
        candidates = list(self.queues)
        fits = cluster.fits
        while candidates:
            sid = cluster.node_state[node]
            mask = cluster.fitmask[sid]  # `FitIndex` first (what `fits` asks first): few waiting demands pass
            fitting = [(self.queues[dix][0], dix) for dix in candidates if mask >> dix & 1 and fits(sid, dix)]
            if not fitting:
                return
            _, dix = min(fitting)
            ev = cluster.evaluation(sid, dix)
            if ev is None:  # pragma: no cover - fits() and evaluate() disagree: a policy bug
                raise AssertionError(f"{self.policy!r} refused node {node} that fits")
            self.place(self._dequeue(dix), node, ev[1])
            # Room only shrank: only demands that fitted before may fit now.
            candidates = [d for _, d in fitting if d in self.queues]

    def _retry_node_exact(self, node: int) -> None:
        """Pod by pod on `node`, each through its own holds (with hooks: pods of one demand may differ)."""
        cluster = self.cluster
        for seq in [s for s, _, _ in list(self.waiting())]:
            dix = cluster.pod_demand[self.arrivals[seq].pod]
            held = self.hooks.held(self, seq) if self.hooks is not None else None
            view = (held or {}).get(node)
            if view is None:
                ev = cluster.evaluation(cluster.node_state[node], dix)
            else:
                ev = cluster.evaluate(view, cluster.demands[dix])
            if ev is not None:
                self.unqueue(seq)
                self.place(seq, node, ev[1])

    def unqueue(self, seq: int) -> None:
        """Take waiting arrival `seq` out of the queue (to place it, as a retry or a hook does)."""
        pod = self.arrivals[seq].pod
        dix = self.cluster.pod_demand[pod]
        heap = self.queues[dix]
        key = (-self.pod_priority[pod], seq)
        if heap[0] == key:
            heapq.heappop(heap)
        else:
            heap.remove(key)
            heapq.heapify(heap)
        if not heap:
            del self.queues[dix]
        self.waiting_count[self.pod_class[pod]] -= 1

    def _retry_full(self) -> None:
        """Every waiting pod, in queue order, over the whole cluster (the reference the node retry equals)."""
        for seq in [s for s, _, _ in list(self.waiting())]:
            chosen = self._choose(seq)
            if chosen is not None:
                self.unqueue(seq)
                node, ev = chosen
                self.place(seq, node, ev[1])

    def run(self) -> None:
        with rare_collections():
            self._run()

    def _run(self) -> None:
        arrivals, departures = self.arrivals, self.departures
        n = len(arrivals)
        i = 0
        end = self.end_s
        while True:
            ta = arrivals[i].time if i < n else math.inf
            td = departures[0][0] if departures else math.inf
            if td <= ta:  # departures first at the same instant: their room is there for the arrival
                if td > end:
                    break
                self._advance(td)
                _, seq = heapq.heappop(departures)
                if self.ends.get(seq) != td:  # released by a hook since: this departure is void
                    continue
                self.retry_on(self.release(seq))
            else:
                if ta > end:
                    break
                self._advance(ta)
                self.arrive(i)
                i += 1
            if self.hooks is not None:
                self.hooks.after_event(self, self.now)
        self._advance(end)
        self.arrived = i

    def result(self, seconds: float = 0.0) -> TimelineResult:
        """The figures, the warm-up cut: per-pod figures for pods arriving in [warmup, end]; waits of pods
        still waiting at the end counted up to the end; waiting_at_end counts every pod then waiting."""
        span = self.end_s - self.warmup_s
        waits: list[list[float]] = [[] for _ in CLASSES]
        arrived = placed = 0
        for seq in range(self.arrived):
            a = self.arrivals[seq]
            started = self.started[seq]
            if started is not None and started >= self.warmup_s:
                placed += 1
            if a.time < self.warmup_s:
                continue
            arrived += 1
            waits[self.pod_class[a.pod]].append((self.end_s if started is None else started) - a.time)
        classes: dict[str, dict[str, float | int | None]] = {}
        for c, name in enumerate(CLASSES):
            w = sorted(waits[c])
            classes[name] = {
                "pods": len(w),
                "waited_pct": round(100.0 * sum(1 for x in w if x > 0) / len(w), 3) if w else None,
                "p50_s": round(percentile(w, 50), 1) if w else None,
                "p99_s": round(percentile(w, 99), 1) if w else None,
                "max_s": round(w[-1], 1) if w else None,
                "waiting_at_end": self.waiting_count[c],
            }
        return TimelineResult(
            policy=getattr(self.policy, "name", type(self.policy).__name__),
            seed=self.seed,
            warmup_s=self.warmup_s,
            end_s=self.end_s,
            alloc_pct=100.0 * self._alloc_area / (self.capacity * span),
            classes=classes,
            free_while_waiting_pct=100.0 * self._free_waiting_area / (self.capacity * self._waiting_time)
            if self._waiting_time > 0
            else None,
            gpu_waiting_time_pct=100.0 * self._waiting_time / span,
            arrivals=arrived,
            placed=placed,
            seconds=seconds,
            series=self.series,
        )


def simulate_timeline(
    workload: Workload,
    policy: Policy,
    arrivals: list[Arrival],
    warmup_s: float,
    end_s: float,
    seed: int = 0,
    hooks: TimelineHooks | None = None,
    retry: str = "node",
    sample_s: float | None = None,
) -> TimelineResult:
    """Run `arrivals` through the cluster with `policy` until `end_s`; figures over [warmup_s, end_s].

    `seed` seeds the tie-breaking among equally scored nodes (bestfit); `retry` "full" is the slow
    reference retry (see the module docstring); `sample_s`: the time series' step (default: 600 points)."""
    started = time.perf_counter()
    tl = Timeline(workload, policy, arrivals, warmup_s, end_s, seed, hooks, retry, sample_s)
    tl.run()
    return tl.result(time.perf_counter() - started)
