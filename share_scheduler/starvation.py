"""No big pod starved: the leader's loop that gives pods which waited too long their room.

The decisions are share_placement.starvation's, the very functions share-sim's timeline runs
(plan_reservations, plan_consolidation); this is their imperative shell. Every `period` seconds, on the
leader only (share_scheduler.leader), once the cache is synced, for the pods of our profile asking at
least `min_gpus` GPUs that have waited `wait_threshold` seconds (their age from creationTimestamp),
highest priority then longest wait first:

- **Consolidation** (opt-in), when the pod fits nowhere now: at most `max_moves` pods that may move
  (`movable`: a controller recreates them; never one that outranks the waiting pod) are evicted through
  the Eviction API, only when the policy places every moved pod again on the cluster as the plan leaves
  it. A PodDisruptionBudget's 429 is honoured: the plan stops there and that pod is left alone for
  `refusal_cooldown`. The waiting pod's GPUs and each moved pod's new GPUs are held
  (HoldKind.CONSOLIDATION; a moved pod's hold names its controller, so its replacement may use it). At
  most `evictions_per_minute`.
- **Reservations** otherwise: the GPUs where the pod will fit soonest (fewest GPUs short, then the least
  memory to drain, one reservation per node, on a node whose static filters admit it), held against pods
  of the same or lower priority (HoldKind.RESERVATION) for `hold_seconds`. One due to expire before the
  pass after next while its pod still waits, on a node that kept draining since the hold was made (the
  hold records the node's shortfall then: share_placement.starvation.keeps_draining), is planned again
  first: renewed on that node while it is still the soonest (else moved), so the room drained under it is
  not handed back to the stream of small pods at the expiry only to be drained again elsewhere. A node
  that did not drain (its last pods run on) is let go at the expiry: the pod may then be held elsewhere.

A hold goes into the HoldBook first, then into the pod's `gpushare.io/holds` annotation, so a restarted
extender or the other replica rebuilds it; it goes when the pod is bound or deleted (the book sees that
in the pod watch) or when it expires. Never a deadlock: reservations are bounded in count
(`max_reservations`) and in `max_share` of the cluster's GPU memory, one a node, and expire on their own.

One piece: the pass, its leader check, the pod re-read before acting, the hold writing (book, then
annotation) and the Events are shared by both remedies and by a renewal, and must stay in step with the
one function share-sim runs (the decisions themselves are pure, in share_placement.starvation).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any

from share_core.assignment import parse_assignment
from share_core.contract import ANN_HOLDS
from share_core.contract import ANN_MOVABLE
from share_core.contract import ANN_ROOM_READY
from share_core.contract import EVENT_CONSOLIDATING
from share_core.contract import EVENT_CONSOLIDATION_EVICTED
from share_core.contract import EVENT_CONSOLIDATION_REFUSED
from share_core.contract import EVENT_RESERVED
from share_core.contract import SCHEDULER_NAME
from share_core.events import EventQueue
from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import encode_holds
from share_core.holds import pod_controller_uid
from share_core.holds import pod_is_terminating
from share_core.holds import pod_priority
from share_core.holds import rfc3339
from share_core.kube import Conflict
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_core.podresources import pod_host_request
from share_core.request import InvalidRequest
from share_core.request import pod_request
from share_placement import Demand
from share_placement import NodeState
from share_placement import Policy
from share_placement import fits
from share_placement.starvation import ConsolidationPlan
from share_placement.starvation import ReservationLimits
from share_placement.starvation import Resident
from share_placement.starvation import Waiter
from share_placement.starvation import held_total
from share_placement.starvation import keeps_draining
from share_placement.starvation import plan_consolidation
from share_placement.starvation import plan_reservations
from share_placement.starvation import queue_order
from share_placement.starvation import renewal_horizon
from share_placement.starvation import shortfall
from share_placement.waiting_shapes import LINGER_S
from share_scheduler.cache import ClusterCache
from share_scheduler.holds import Asker
from share_scheduler.static_filters import node_refuses
from share_scheduler.waiting import WaitingPod

log = logging.getLogger(__name__)

# Controllers that recreate a pod they own (controller: true) when it is evicted.
RECREATING_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Job"})
NODES_WEIGHED = 8  # nodes read from the API per decision to check the pod's static filters (soonest first)
MY_KINDS = (HoldKind.RESERVATION, HoldKind.CONSOLIDATION)
NUDGE_EVERY = 60.0  # seconds between two nudges of one pod (`Starvation._nudge`)


_SIM = ReservationLimits()  # share-sim's defaults: the extender's too (one set of rules)


@dataclass(frozen=True, slots=True)
class StarvationConfig:
    """The loop's knobs (the chart's `reservations` and `consolidation` values; share-scheduler's flags).
    The defaults are share-sim's (share_placement.starvation.ReservationLimits, sim/remedies.py)."""

    reserve: bool = True
    wait_threshold: float = _SIM.after_s  # seconds a pod waits before it gets a reservation (or a consolidation)
    max_reservations: int = _SIM.max_holds  # reservations at once, cluster-wide
    max_share: float = _SIM.max_share  # of the cluster's GPU memory reservations may take together
    hold_seconds: float = _SIM.ttl_s  # how long one hold lasts (a pod still waiting then gets a new one)
    period: float = 10.0  # seconds between two passes
    scheduler: str = SCHEDULER_NAME  # the profile whose pods are weighed
    min_gpus: int = 2  # pods asking at least this many GPUs get room (share-sim's --remedy-min-gpus)
    consolidate: bool = False
    max_moves: int = 2  # pods one consolidation may evict
    evictions_per_minute: int = 2
    refusal_cooldown: float = 600.0  # seconds before a pod is weighed again / a refused pod may be moved again
    leave_room: bool = False  # room for what waits (share_scheduler.leaveroom), lingering as share-sim's does
    leave_room_linger: float = LINGER_S
    # Reservations yield to a pod of fewer than min_gpus GPUs that kube-scheduler found no room for and that
    # has waited longer than this (s); None: never (share_core.holds.reservations_yield; share-sim's
    # `--hold-yield-after`).
    yield_after: float | None = None

    def check(self) -> ReservationLimits:
        """The rules' limits; ValueError naming the first knob out of range."""
        if self.period <= 0 or self.min_gpus < 1:
            raise ValueError("the starvation period must be > 0 and min GPUs >= 1")
        if self.yield_after is not None and not self.yield_after >= 0:
            raise ValueError(f"the hold yield bound must be >= 0 seconds (or unset), got {self.yield_after}")
        if not self.leave_room_linger >= 0:
            raise ValueError(f"the leave-room linger must be >= 0 seconds, got {self.leave_room_linger}")
        if self.max_moves < 0 or self.evictions_per_minute < 0 or self.refusal_cooldown < 0:
            raise ValueError("max moves, evictions per minute and the refusal cooldown must be >= 0")
        if not 0 <= self.max_share <= 1:
            raise ValueError(f"max share must be between 0 and 1, got {self.max_share}")
        return ReservationLimits(self.wait_threshold, self.max_reservations, self.max_share, self.hold_seconds)


def movable(pod: Mapping[str, Any]) -> bool:
    """Whether consolidation may evict `pod`: a controller (ReplicaSet, StatefulSet, Job, or any
    controller when the operator marked the pod `gpushare.io/movable: "true"`) recreates it, and it is not
    marked "false". Never a bare pod: nobody would bring it back."""
    meta = pod.get("metadata") or {}
    mark = str((meta.get("annotations") or {}).get(ANN_MOVABLE, "")).lower()
    if mark == "false" or pod_is_terminating(pod):
        return False
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid"):
            return ref.get("kind") in RECREATING_KINDS or mark == "true"
    return False


def resident(pod: Mapping[str, Any]) -> Resident | None:
    """A bound pod with a GPU assignment, as the consolidation rules weigh it (movable per `movable`);
    None for anything else."""
    meta = pod.get("metadata") or {}
    try:
        assignment = parse_assignment(meta.get("annotations") or {})
        request = pod_request(pod)
    except (InvalidRequest, ValueError):
        return None
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if assignment is None or request is None or not node or pod_is_terminating(pod):
        return None
    host = pod_host_request(pod)
    return Resident(
        uid=str(meta.get("uid") or ""),
        name=f"{meta.get('namespace', 'default')}/{meta.get('name', '')}",
        node=node,
        gpus=tuple(assignment.gpu_indices),
        demand=Demand(assignment.per_gpu, len(assignment.gpu_indices), request.models, host.cpu, host.memory),
        movable=movable(pod),
        owner_uid=pod_controller_uid(pod),
    )


class EvictionRate:
    """A token bucket: at most `per_minute` evictions in any minute (refilled continuously)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._tokens = float(per_minute)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.per_minute), self._tokens + (now - self._at) * self.per_minute / 60.0)
        self._at = now

    def available(self) -> int:
        self._refill()
        return int(self._tokens)

    def take(self, n: int = 1) -> None:
        self._refill()
        self._tokens -= n


@dataclass
class PassReport:
    """What one pass did (tests and logs): pod keys."""

    starving: int = 0
    reserved: list[str] = field(default_factory=list)
    consolidated: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    nudged: list[str] = field(default_factory=list)  # holders told their room is ready (ANN_ROOM_READY)
    skipped: str = ""


class StarvationMetrics:
    """Hooks into share_scheduler.metrics (kept as callables so the loop is testable without Prometheus)."""

    def __init__(
        self,
        reservation: Callable[[str], None] = lambda outcome: None,
        consolidation: Callable[[str], None] = lambda outcome: None,
        eviction: Callable[[str], None] = lambda outcome: None,
        nudge: Callable[[], None] = lambda: None,
    ) -> None:
        self.reservation = reservation
        self.consolidation = consolidation
        self.eviction = eviction
        self.nudge = nudge


class Starvation:
    """The loop. `run_once()` is one pass (tests call it); `start()` runs passes in a daemon thread."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ClusterCache,
        policy: Policy,
        policy_lock: threading.Lock,
        is_leader: Callable[[], bool],
        events: EventQueue | None,
        config: StarvationConfig,
        metrics: StarvationMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = config.check()
        self.kube = kube
        self.cache = cache
        self.policy = policy
        self.policy_lock = policy_lock
        self.is_leader = is_leader
        self.events = events
        self.config = config
        self.metrics = metrics or StarvationMetrics()
        self._clock = clock
        self.rate = EvictionRate(config.evictions_per_minute)
        self._refused: dict[str, float] = {}  # pod key -> until when consolidation leaves it alone
        self._tried: dict[str, float] = {}  # waiting pod uid -> when consolidation last weighed it
        self._told: dict[str, str] = {}  # waiting pod key -> the last refusal it was told (one Event each)
        self._ready: dict[str, float] = {}  # holder uid -> since when its held room fits it (`_nudge`)
        self._nudged: dict[str, float] = {}  # holder uid -> when it was last told so
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0

    @property
    def enabled(self) -> bool:
        return self.config.reserve or self.config.consolidate

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gpushare-starvation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.config.period):
            try:
                self.run_once()
            except Exception:  # a bug must not end the loop; the next pass tries again
                log.exception("starvation pass failed")

    # -- one pass -----------------------------------------------------------------------------------

    def _waiters(self, now: float) -> dict[str, tuple[Waiter, WaitingPod]]:
        """uid -> (the rules' Waiter, the cache's record) for our profile's pods past the threshold."""
        out = {}
        for pod in self.cache.waiting.pods():
            if (
                pod.scheduler != self.config.scheduler
                or not pod.created
                or pod.demand.count < self.config.min_gpus
                or pod.waited(now) < self.config.wait_threshold
            ):
                continue
            out[pod.uid] = (Waiter(pod.uid, pod.key, pod.priority, pod.created, pod.demand), pod)
        return out

    def run_once(self) -> PassReport:
        report = PassReport()
        if not self.is_leader():
            report.skipped = "not the leader"
            return report
        if not self.cache.synced:
            report.skipped = "cache not synced"
            return report
        self.passes += 1
        now = self._clock()
        waiting = self._waiters(now)
        report.starving = len(waiting)
        self._forget(waiting, now)
        mine = [h for _, h in self.cache.holds.holds() if h.kind in MY_KINDS]
        self._nudge(waiting, mine, now, report)
        holding = {h.holder_uid for h in mine}
        due = {
            h.holder_uid: h
            for h in mine
            if h.kind is HoldKind.RESERVATION and h.expires - now <= self.renew_within and self.config.reserve
        }
        for waiter in queue_order(w for w, _ in waiting.values()):
            if waiter.uid in holding and waiter.uid not in due:
                continue
            if not self.is_leader():
                report.skipped = "lost the lead mid-pass"
                break
            self._serve(waiting[waiter.uid][1], waiter, now, report, renewing=due.get(waiter.uid))
        return report

    @property
    def renew_within(self) -> float:
        """A reservation expiring sooner than this is renewed now (`renewal_horizon`: the next pass comes
        `period` after this one ends)."""
        return renewal_horizon(self.config.period, self.limits)

    def _forget(self, waiting: Mapping[str, tuple[Waiter, WaitingPod]], now: float) -> None:
        """Keep the bookkeeping to the pods that still wait (and refusals still in force)."""
        keys = {pod.key for _, pod in waiting.values()}
        self._tried = {uid: t for uid, t in self._tried.items() if uid in waiting}
        self._told = {key: why for key, why in self._told.items() if key in keys}
        self._nudged = {uid: t for uid, t in self._nudged.items() if uid in waiting}
        self._refused = {key: until for key, until in self._refused.items() if until > now}

    def _nudge(
        self, waiting: Mapping[str, tuple[Waiter, WaitingPod]], mine: list[Hold], now: float, report: PassReport
    ) -> None:
        """Ask kube-scheduler to try again a pod whose held room fits it now, a pass after it first did.

        kube-scheduler retries a pod the extender turned down only on a cluster event (any, for an
        extender's refusal) or after five minutes (podMaxInUnschedulablePodsDuration). When the event
        that freed the room (a consolidation's eviction, the last pod leaving a reserved GPU) reached it
        before this extender's cache, the try it caused was turned down and, in a quiet cluster, nothing
        comes for minutes. Writing ANN_ROOM_READY on the pod is an update kube-scheduler requeues it on;
        at most once per NUDGE_EVERY a pod, and only for the few pods that hold room."""
        nodes: dict[str, set[str]] = {}
        for h in mine:
            if h.holder_uid in waiting:
                nodes.setdefault(h.holder_uid, set()).add(h.node)
        ready: dict[str, float] = {}
        for uid, held_nodes in nodes.items():
            pod = waiting[uid][1]
            against = self.cache.holds.against(Asker(pod.uid, pod.priority, pod.owner_uid))
            for node in sorted(held_nodes):
                snap = self.cache.node_snapshot(node, against.get(node))
                if snap is not None and fits(snap.state, pod.demand):
                    ready[uid] = self._ready.get(uid, now)
                    break
        self._ready = ready
        for uid, since in ready.items():
            if now - since < self.config.period or now - self._nudged.get(uid, float("-inf")) < NUDGE_EVERY:
                continue
            pod = waiting[uid][1]
            self._nudged[uid] = now
            try:
                self.kube.patch_pod_annotations(pod.namespace, pod.name, {ANN_ROOM_READY: rfc3339(now)})
            except NotFound:
                continue
            except KubeError as exc:
                log.warning("pod %s: could not ask kube-scheduler to try it again: %s", pod.key, exc)
                continue
            self.metrics.nudge()
            report.nudged.append(pod.key)
            log.info(
                "pod %s: the room held for it fits it now, but kube-scheduler has not placed it for %.0fs (its "
                "last try came before this extender saw the room free): asking it to try again (%s)",
                pod.key,
                now - since,
                ANN_ROOM_READY,
            )

    def _cluster_units(self, states: Mapping[str, NodeState]) -> int:
        return sum(g.total for n in states.values() for g in n.gpus if g.healthy)

    def _states(self) -> dict[str, NodeState]:
        """Every node as the cache has it (holds apart: the rules weigh them themselves)."""
        return {name: snap.state for name, snap in self.cache.entries(self.cache.node_names()) if snap is not None}

    def _serve(
        self, pod: WaitingPod, waiter: Waiter, now: float, report: PassReport, renewing: Hold | None = None
    ) -> bool:
        """Give `pod` room: a consolidation where one is allowed and needed, else a reservation (`renewing`:
        its reservation due to expire, planned again). True if something is now held for it."""
        if renewing is not None and not self._keeps_draining(pod, renewing):
            return False  # before reading the pod: a hold that is let go costs no API call
        try:
            full = self.kube.get_pod(pod.namespace, pod.name)
        except NotFound:
            return False
        except KubeError as exc:
            log.warning("pod %s: cannot read it to weigh a reservation: %s", pod.key, exc)
            return False
        meta = full.get("metadata") or {}
        if meta.get("uid") != pod.uid or (full.get("spec") or {}).get("nodeName") or pod_is_terminating(full):
            return False  # bound, deleted or replaced since the watch told us
        states = {n: s for n, s in self._states().items() if self._host_could_fit(n, pod.demand)}
        if renewing is None and self.config.consolidate and self._consolidate(pod, waiter, full, states, now, report):
            return True
        if self.config.reserve:
            return self._reserve(pod, waiter, full, states, now, report, renewing)
        return False

    # -- reservations -------------------------------------------------------------------------------

    def _keeps_draining(self, pod: WaitingPod, hold: Hold) -> bool:
        """share_placement.starvation.keeps_draining on the cache's view of the held node; logs a hold let go."""
        snap = self.cache.node_snapshot(hold.node)
        if keeps_draining(hold, snap.state if snap is not None else None, pod.demand):
            return True
        log.info(
            "pod %s: its reservation on node %s is not renewed: the node has not drained since it was made "
            "(GPUs short, units to drain then: %s); it ends at its expiry and the pod may be held elsewhere",
            pod.key,
            hold.node,
            hold.shortfall,
        )
        return False

    def _reserve(
        self,
        pod: WaitingPod,
        waiter: Waiter,
        full: Mapping[str, Any],
        states: Mapping[str, NodeState],
        now: float,
        report: PassReport,
        renewing: Hold | None = None,
    ) -> bool:
        """share_placement.starvation.plan_reservations for this one pod, over the nodes its static filters
        admit (the soonest node is read from the API and, when it refuses the pod, left out and the rules
        asked again, at most NODES_WEIGHED times). `renewing`: the pod's own reservation, due to expire;
        its count and units are the new one's to take."""
        live = [h for _, h in self.cache.holds.holds()]
        capacity = self._cluster_units(self._states())
        reservations = [h for h in live if h.kind is HoldKind.RESERVATION and h != renewing]
        if len(reservations) >= self.limits.max_holds:
            self.metrics.reservation("at_limit")
            return False
        if pod.units > self.limits.max_share * capacity - held_total(reservations):
            self.metrics.reservation("over_budget")
            log.info(
                "pod %s waited %.0fs: holding %d more units would pass %.0f%% of the cluster's GPU memory; it waits",
                pod.key,
                pod.waited(now),
                pod.units,
                100 * self.limits.max_share,
            )
            return False
        left = dict(states)
        for _ in range(NODES_WEIGHED):
            planned = plan_reservations(
                [waiter], list(left.values()), live, now, self.limits, capacity, renew_within=self.renew_within
            )
            if not planned:
                break
            hold = planned[0]
            why = self._node_refuses(full, hold.node)
            if why:
                log.debug("pod %s: node %s left out of its reservation: %s", pod.key, hold.node, why)
                del left[hold.node]
                continue
            return self._made(pod, hold, states[hold.node], now, report, renewing)
        self.metrics.reservation("no_node")
        log.info("pod %s waited %.0fs but no node without a reservation could ever take it", pod.key, pod.waited(now))
        return False

    def _node_refuses(self, pod: Mapping[str, Any], node: str) -> str:
        try:
            return node_refuses(pod, self.kube.get_node(node))
        except KubeError as exc:
            return f"cannot read the node: {exc}"

    def _made(
        self, pod: WaitingPod, hold: Hold, state: NodeState, now: float, report: PassReport, renewing: Hold | None
    ) -> bool:
        if not self._write_holds(pod, [hold], replacing=() if renewing is None else (renewing,)):
            return False
        self.metrics.reservation("made" if renewing is None else "renewed")
        report.reserved.append(pod.key)
        unit = self.cache.unit.value
        free = {g.index: g.free for g in state.gpus}
        drain = sum(max(hold.per_gpu - free.get(g, 0), 0) for g in hold.gpus)
        gpus = ",".join(map(str, hold.gpus))
        again = "" if renewing is None else f"renewed ({'the same node' if renewing.node == hold.node else 'moved'}): "
        message = again + (
            f"waited {pod.waited(now):.0f}s: {hold.per_gpu} {unit} held on GPU {gpus} of node {hold.node} against "
            f"pods of priority {pod.priority} or lower for {self.limits.ttl_s:.0f}s "
            f"({f'{drain} {unit} still to drain there' if drain else 'it fits there now'})"
        )
        log.info("pod %s: %s", pod.key, message)
        self._event(pod.ref(), EVENT_RESERVED, message)
        return True

    def _host_could_fit(self, node: str, demand: Demand) -> bool:
        """Whether the node's allocatable CPU and memory could ever take the pod (what drains is GPU memory)."""
        snap = self.cache.node_snapshot(node)
        if snap is None:
            return False
        a = snap.allocatable
        return a.cpu >= demand.cpu and a.memory >= demand.memory and a.pods >= 1

    def _write_holds(self, pod: WaitingPod, holds: list[Hold], replacing: tuple[Hold, ...] = ()) -> bool:
        """Into the book first (filter respects them at once), then onto the pod (restarts, the other
        replica), in place of `replacing`. A pod gone meanwhile takes its holds with it."""
        book = self.cache.holds
        book.add(pod.key, pod.uid, holds, replacing)
        try:
            self._patch(pod.namespace, pod.name, book.of(pod.key))
        except (NotFound, Conflict):
            book.release(pod.key, "the pod went away before its holds were written")
            return False
        except KubeError as exc:
            book.release(pod.key, f"writing the holds failed: {exc}")
            log.warning("pod %s: holds not written: %s", pod.key, exc)
            return False
        return True

    def _patch(self, namespace: str, name: str, holds: tuple[Hold, ...] | list[Hold]) -> None:
        value = encode_holds(holds) if holds else None
        self.kube.patch_pod_annotations(namespace, name, {ANN_HOLDS: value})

    def _event(self, pod: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal") -> None:
        if self.events is not None:
            self.events.record(pod, reason, message, event_type)

    # -- consolidation ------------------------------------------------------------------------------

    def _refuse(self, pod: WaitingPod, why: str) -> None:
        """Tell the waiting pod once per distinct reason why nothing moves for it."""
        if self._told.get(pod.key) == why:
            return
        self._told[pod.key] = why
        self._event(pod.ref(), EVENT_CONSOLIDATION_REFUSED, f"no consolidation: {why}")

    def _residents(self, nodes: list[str], priority: int, now: float) -> dict[str, list[Resident]]:
        """node -> its GPU pods, read from the API (the cache keeps no owners' kinds nor labels): movable
        when a controller recreates them, they do not outrank the waiting pod, and no eviction of theirs
        was refused lately."""
        out: dict[str, list[Resident]] = {}
        for name in nodes:
            try:
                pods = self.kube.list_pods(field_selector=f"spec.nodeName={name}").items
            except KubeError as exc:
                log.debug("node %s: cannot list its pods: %s", name, exc)
                continue
            found = []
            for p in pods:
                r = resident(p)
                if r is None:
                    continue
                if r.movable and (pod_priority(p) > priority or self._refused.get(r.name, 0.0) > now):
                    r = replace(r, movable=False)
                found.append(r)
            out[name] = found
        return out

    def _consolidate(
        self,
        pod: WaitingPod,
        waiter: Waiter,
        full: Mapping[str, Any],
        states: Mapping[str, NodeState],
        now: float,
        report: PassReport,
    ) -> bool:
        """share_placement.starvation.plan_consolidation over the cluster as the pod sees it (holds for
        others taken), on candidate nodes whose static filters admit it, executed through the Eviction API."""
        if now - self._tried.get(pod.uid, -1e18) < self.config.refusal_cooldown:
            return False
        asker = Asker(pod.uid, pod.priority, pod.owner_uid)
        held = self.cache.holds.against(asker) if self.cache.holds.active else {}
        shorts = [sf for n in states.values() if (sf := shortfall(n, pod.demand, held.get(n.name))) is not None]
        if not shorts or any(sf.short == 0 for sf in shorts):
            return False  # it fits now (kube-scheduler places it on its next try), or can never fit
        self._tried[pod.uid] = now
        shorts.sort(key=lambda sf: sf.key)
        candidates = [sf.node for sf in shorts if sf.short <= self.config.max_moves][:NODES_WEIGHED]
        candidates = [n for n in candidates if not self._node_refuses(full, n)]
        residents = self._residents(candidates, pod.priority, now)
        if not any(r.movable for rs in residents.values() for r in rs):
            self._refuse(pod, "no pod on the nodes that could make room may move (bare pods never move)")
            self.metrics.consolidation("refused")
            return False
        tokens = self.rate.available()
        if tokens < 1:
            self.metrics.consolidation("rate_limited")
            log.info("pod %s: consolidation waits: at most %d evictions a minute", pod.key,
                     self.config.evictions_per_minute)  # fmt: skip
            return False
        with self.policy_lock:
            plan, why_not = plan_consolidation(
                waiter,
                list(states.values()),
                residents,
                policy=self.policy,
                max_moves=min(self.config.max_moves, tokens),
                held=held,
            )
        if plan is None:
            self._refuse(pod, why_not or "the policy would not place every moved pod again")
            self.metrics.consolidation("refused")
            return False
        return self._execute(pod, plan, now, report)

    def _execute(self, pod: WaitingPod, plan: ConsolidationPlan, now: float, report: PassReport) -> bool:
        unit = self.cache.unit.value
        if not self._write_holds(pod, plan.holds(now, self.limits.ttl_s)):
            return False
        self.metrics.consolidation("started")
        report.consolidated.append(pod.key)
        gpus = ",".join(map(str, plan.gpus))
        moves = "; ".join(f"{m.pod.name} to node {m.node} GPU {','.join(map(str, m.gpus))}" for m in plan.moves)
        self._event(
            pod.ref(),
            EVENT_CONSOLIDATING,
            f"moving {len(plan.moves)} pod(s) to make room on GPU {gpus} of node {plan.node}: {moves}",
        )
        log.info("pod %s: consolidation on node %s GPU %s: %s", pod.key, plan.node, gpus, moves)
        for i, move in enumerate(plan.moves):
            namespace, _, name = move.pod.name.partition("/")
            ref = {"metadata": {"name": name, "namespace": namespace, "uid": move.pod.uid}}
            if not self.is_leader():
                self._abandon(pod, plan, i, "lost the lead")
                return True
            try:
                self.rate.take()
                self.kube.evict_pod(namespace, name, move.pod.uid)
            except NotFound:
                continue  # gone already: its room is free
            except KubeError as exc:
                if exc.status == 429:
                    self.metrics.eviction("refused")
                    self._refused[move.pod.name] = now + self.config.refusal_cooldown
                    self._tried.pop(pod.uid, None)  # another pod may move for it at the next pass
                    report.refused.append(move.pod.name)
                    why = f"its eviction was refused (a PodDisruptionBudget allows no disruption now): {exc}"
                    self._event(ref, EVENT_CONSOLIDATION_REFUSED, f"not moved for {pod.key}: {why}", "Warning")
                    self._refuse(pod, f"pod {move.pod.name}: {why}")
                else:
                    self.metrics.eviction("failed")
                    log.warning("pod %s: eviction for %s failed: %s", move.pod.name, pod.key, exc)
                self._abandon(pod, plan, i, f"evicting {move.pod.name} failed")
                return True
            self.metrics.eviction("evicted")
            report.evicted.append(move.pod.name)
            self._event(
                ref,
                EVENT_CONSOLIDATION_EVICTED,
                f"evicted to make room for {pod.key} on node {plan.node} GPU {gpus} ({pod.demand.per_gpu} {unit} "
                f"each); its replacement is held {move.pod.demand.per_gpu} {unit} on GPU "
                f"{','.join(map(str, move.gpus))} of node {move.node}",
            )
            log.info("pod %s evicted for %s (consolidation); its replacement goes to node %s", move.pod.name,
                     pod.key, move.node)  # fmt: skip
        return True

    def _abandon(self, pod: WaitingPod, plan: ConsolidationPlan, done: int, why: str) -> None:
        """A plan stopped after `done` evictions: keep the holds of the pods already moved (their
        replacements come), drop the waiting pod's and the unmoved pods'."""
        moved = {m.pod.uid for m in plan.moves[:done]}
        book = self.cache.holds
        left = [h for h in book.of(pod.key) if h.holder_uid in moved or h.kind not in MY_KINDS]
        book.release(pod.key, f"consolidation stopped: {why}")
        if left:
            book.add(pod.key, pod.uid, left)
        try:
            self._patch(pod.namespace, pod.name, left)
        except KubeError as exc:
            log.warning("pod %s: could not rewrite its holds after a stopped consolidation: %s", pod.key, exc)
        self.metrics.consolidation("stopped")
        log.info("pod %s: consolidation stopped after %d eviction(s): %s", pod.key, done, why)


def hold_summary(book_holds: list[tuple[str, Hold]], now: float) -> list[dict[str, Any]]:
    """The holds as /inspect lists them: for whom, what kind, where, how much, until when."""
    return [
        {
            "anchor": key,
            "holder": h.holder or h.holder_uid,
            "kind": str(h.kind),
            "node": h.node,
            "gpus": list(h.gpus),
            "perGpu": h.per_gpu,
            "priority": h.priority,
            "expiresIn": max(round(h.expires - now), 0),
            **({"ownerUID": h.owner_uid} if h.owner_uid else {}),
        }
        for key, h in sorted(book_holds, key=lambda kh: (kh[1].node, kh[1].gpus, kh[0]))
    ]
