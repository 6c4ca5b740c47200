"""No big pod starved: the leader's loop that gives pods which waited too long their room.

Every `period` seconds, on the leader only (share_scheduler.leader), once the cache is synced:

- **Reservations.** The pods of our profile that have waited at least `wait_threshold` seconds (their
  age from creationTimestamp), by priority then age, at most `max_reservations` at a time: each gets the
  GPUs where it will fit soonest (fewest GPUs short, then the least memory to drain, on a node whose
  static filters admit it), held against pods of the same or lower priority (HoldKind.RESERVATION) for
  `hold_seconds`. The hold goes into the HoldBook first, then into the pod's `gpushare.io/holds`
  annotation, so a restarted extender or the other replica rebuilds it; it is released when the pod is
  bound or deleted (the book sees that in the pod watch) or when it expires.
- **Consolidation** (opt-in). A waiting pod that fits nowhere although the room exists, split over GPUs:
  at most `max_moves` pods that may move (a controller recreates them: `movable`) are evicted through the
  Eviction API (a PodDisruptionBudget's 429 is honoured: the plan stops and that pod is left alone for
  `refusal_cooldown`), only when the policy places every moved pod again on a copy of the cluster; the
  waiting pod's GPUs and each moved pod's new GPUs are held (HoldKind.CONSOLIDATION; a moved pod's hold
  names its controller, so its replacement may use it). At most `evictions_per_minute`.

Never a deadlock: holds are bounded in count and in `max_share` of the cluster's GPU memory, expire on
their own, and every other node stays free for the small pods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from share_core.assignment import parse_assignment
from share_core.contract import ANN_HOLDS
from share_core.contract import ANN_MOVABLE
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
from share_scheduler.cache import ClusterCache
from share_scheduler.holds import Asker
from share_scheduler.starvation_rules import ConsolidationPlan
from share_scheduler.starvation_rules import Movable
from share_scheduler.starvation_rules import Spot
from share_scheduler.starvation_rules import node_refuses
from share_scheduler.starvation_rules import plan_consolidation
from share_scheduler.starvation_rules import reservation_order
from share_scheduler.starvation_rules import soonest_spots
from share_scheduler.starvation_rules import starving
from share_scheduler.starvation_rules import within_budget
from share_scheduler.waiting import WaitingPod

log = logging.getLogger(__name__)

# Controllers that recreate a pod they own (controller: true) when it is evicted.
RECREATING_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Job"})
NODES_WEIGHED = 8  # nodes read from the API per decision to check the pod's static filters (soonest first)
MY_KINDS = (HoldKind.RESERVATION, HoldKind.CONSOLIDATION)


@dataclass(frozen=True, slots=True)
class StarvationConfig:
    """The loop's knobs (the chart's `starvation` and `consolidation` values; CLI flags of share-scheduler)."""

    reserve: bool = True
    wait_threshold: float = 300.0  # seconds a pod waits before it gets a reservation
    max_reservations: int = 4  # pods holding room at once (reservations and consolidations)
    max_share: float = 0.25  # of the cluster's GPU memory that holds may take at most
    hold_seconds: float = 600.0  # how long one hold lasts (a pod still waiting then gets a new one)
    period: float = 10.0  # seconds between two passes
    scheduler: str = SCHEDULER_NAME  # the profile whose pods are weighed
    consolidate: bool = False
    max_moves: int = 2  # pods one consolidation may evict
    evictions_per_minute: int = 6
    refusal_cooldown: float = 300.0  # seconds a pod whose eviction was refused (its PDB) is left alone

    def check(self) -> None:
        """ValueError naming the first knob out of range."""
        if self.wait_threshold < 0 or self.hold_seconds <= 0 or self.period <= 0:
            raise ValueError("wait threshold must be >= 0, hold seconds and period > 0")
        if self.max_reservations < 0 or self.max_moves < 0 or self.evictions_per_minute < 0:
            raise ValueError("max reservations, max moves and evictions per minute must be >= 0")
        if not 0 <= self.max_share <= 1:
            raise ValueError(f"max share must be between 0 and 1, got {self.max_share}")


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


def movable_record(pod: Mapping[str, Any]) -> Movable | None:
    """A bound pod with a GPU assignment that may move, as the planner weighs it; None otherwise."""
    if not movable(pod):
        return None
    meta = pod.get("metadata") or {}
    try:
        assignment = parse_assignment(meta.get("annotations") or {})
        request = pod_request(pod)
    except (InvalidRequest, ValueError):
        return None
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if assignment is None or request is None or not node:
        return None
    host = pod_host_request(pod)
    return Movable(
        key=f"{meta.get('namespace', 'default')}/{meta.get('name', '')}",
        uid=str(meta.get("uid") or ""),
        owner_uid=pod_controller_uid(pod),
        node=node,
        gpus=tuple(assignment.gpu_indices),
        per_gpu=assignment.per_gpu,
        priority=pod_priority(pod),
        demand=Demand(request.per_gpu, request.gpu_count, request.models, host.cpu, host.memory),
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
    skipped: str = ""


class StarvationMetrics:
    """Hooks into share_scheduler.metrics (kept as callables so the loop is testable without Prometheus)."""

    def __init__(
        self,
        reservation: Callable[[str], None] = lambda outcome: None,
        consolidation: Callable[[str], None] = lambda outcome: None,
        eviction: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.reservation = reservation
        self.consolidation = consolidation
        self.eviction = eviction


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
        config.check()
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
        self._told: dict[str, str] = {}  # waiting pod key -> the last refusal it was told (one Event each)
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
        waiting = starving(self.cache.waiting.pods(), now, self.config.wait_threshold, self.config.scheduler)
        report.starving = len(waiting)
        mine = [(key, h) for key, h in self.cache.holds.holds() if h.kind in MY_KINDS]
        holding = {h.holder_uid for _, h in mine}
        slots = self.config.max_reservations - len({key for key, _ in mine})
        for pod in reservation_order(waiting):
            if slots <= 0:
                break
            if pod.uid in holding:
                continue
            if not self.is_leader():
                report.skipped = "lost the lead mid-pass"
                break
            if self._serve(pod, now, report):
                slots -= 1
        return report

    def _held_units(self) -> int:
        return sum(h.per_gpu * len(h.gpus) for _, h in self.cache.holds.holds() if h.kind in MY_KINDS)

    def _cluster_units(self) -> int:
        total = 0
        for _, snap in self.cache.entries(self.cache.node_names()):
            if snap is not None:
                total += sum(g.memory for g in snap.gpus if g.healthy)
        return total

    def _states_for(self, pod: WaitingPod) -> dict[str, NodeState]:
        """Every node as `pod` sees it: holds for other pods that apply to it count as taken."""
        asker = Asker(pod.uid, pod.priority, pod.owner_uid)
        held = self.cache.holds.against(asker) if self.cache.holds.active else {}
        return {
            name: snap.state for name, snap in self.cache.entries(self.cache.node_names(), held) if snap is not None
        }

    def _serve(self, pod: WaitingPod, now: float, report: PassReport) -> bool:
        """Give `pod` room: a consolidation where one is allowed and needed, else a reservation. True if
        something is now held for it."""
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
        states = self._states_for(pod)
        if self.config.consolidate and self._consolidate(pod, full, states, now, report):
            return True
        if self.config.reserve:
            return self._reserve(pod, full, states, now, report)
        return False

    # -- reservations -------------------------------------------------------------------------------

    def _admitting(self, pod: Mapping[str, Any], spots: list[Spot]) -> Spot | None:
        """The first spot (soonest first) whose node the pod's static filters admit; at most NODES_WEIGHED reads."""
        for spot in spots[:NODES_WEIGHED]:
            try:
                node = self.kube.get_node(spot.node)
            except KubeError as exc:
                log.debug("node %s: cannot read it: %s", spot.node, exc)
                continue
            why = node_refuses(pod, node)
            if not why:
                return spot
            log.debug("pod %s: node %s left out of its reservation: %s", (pod.get("metadata") or {}).get("name"),
                      spot.node, why)  # fmt: skip
        return None

    def _reserve(
        self, pod: WaitingPod, full: Mapping[str, Any], states: Mapping[str, NodeState], now: float, report: PassReport
    ) -> bool:
        demand = pod.demand
        spots = [s for s in soonest_spots(demand, states.values()) if self._host_could_fit(s.node, demand)]
        spot = self._admitting(full, spots)
        if spot is None:
            self.metrics.reservation("no_node")
            log.info("pod %s waited %.0fs but no node could ever take it: no reservation", pod.key, pod.waited(now))
            return False
        units = demand.per_gpu * len(spot.gpus)
        if not within_budget(self._held_units(), units, self._cluster_units(), self.config.max_share):
            self.metrics.reservation("over_budget")
            log.info(
                "pod %s waited %.0fs: holding %d more units would pass %.0f%% of the cluster's GPU memory; it waits",
                pod.key,
                pod.waited(now),
                units,
                100 * self.config.max_share,
            )
            return False
        hold = Hold(
            HoldKind.RESERVATION,
            spot.node,
            spot.gpus,
            demand.per_gpu,
            pod.priority,
            now + self.config.hold_seconds,
            pod.uid,
            pod.key,
        )
        if not self._write_holds(pod, [hold]):
            return False
        self.metrics.reservation("made")
        report.reserved.append(pod.key)
        gpus = ",".join(map(str, spot.gpus))
        short = (
            "it fits there now"
            if not spot.short_units
            else f"{spot.short_units} {self.cache.unit.value} still to drain on {spot.short_gpus} GPU(s)"
        )
        message = (
            f"waited {pod.waited(now):.0f}s: {demand.per_gpu} {self.cache.unit.value} held on GPU {gpus} of node "
            f"{spot.node} against pods of priority {pod.priority} or lower for {self.config.hold_seconds:.0f}s "
            f"({short})"
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

    def _write_holds(self, pod: WaitingPod, holds: list[Hold]) -> bool:
        """Into the book first (filter respects them at once), then onto the pod (restarts, the other
        replica). A pod gone meanwhile takes its holds with it."""
        book = self.cache.holds
        book.add(pod.key, pod.uid, holds)
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

    def _movable_on(self, nodes: list[str], now: float) -> dict[str, list[Movable]]:
        """node -> its pods that may move, read from the API (the cache keeps no owners' kinds nor labels)."""
        out: dict[str, list[Movable]] = {}
        for name in nodes:
            try:
                pods = self.kube.list_pods(field_selector=f"spec.nodeName={name}").items
            except KubeError as exc:
                log.debug("node %s: cannot list its pods: %s", name, exc)
                continue
            found = []
            for p in pods:
                record = movable_record(p)
                if record is not None and self._refused.get(record.key, 0.0) <= now:
                    found.append(record)
            if found:
                out[name] = found
        return out

    def _consolidate(
        self,
        pod: WaitingPod,
        full: Mapping[str, Any],
        states: Mapping[str, NodeState],
        now: float,
        report: PassReport,
    ) -> bool:
        demand = pod.demand
        # Only where the room exists on the node, split over its GPUs: nodes whose usable free memory sums
        # to the pod's need, soonest first, whose static filters admit the pod.
        spots = [s for s in soonest_spots(demand, states.values()) if self._host_could_fit(s.node, demand)]
        if spots and not spots[0].short_units:
            return False  # it fits now: kube-scheduler places it on its next try (a reservation keeps it)
        split = [s for s in spots if self._split_room(states[s.node], demand)]
        if not split:
            self._refuse(pod, "its room is not on any one node (a reservation waits for it to drain)")
            return False
        candidates = []
        for spot in split[:NODES_WEIGHED]:
            try:
                node = self.kube.get_node(spot.node)
            except KubeError:
                continue
            if not node_refuses(full, node):
                candidates.append(spot.node)
        movable_pods = self._movable_on(candidates, now)
        if not movable_pods:
            self._refuse(pod, "no pod on the nodes that could make room may move (bare pods never move)")
            self.metrics.consolidation("refused")
            return False
        with self.policy_lock:
            plan, why = plan_consolidation(
                self.policy, demand, pod.priority, states, movable_pods, self.config.max_moves
            )
        if plan is None:
            self._refuse(pod, why)
            self.metrics.consolidation("refused")
            return False
        if self.rate.available() < len(plan.moves):
            self.metrics.consolidation("rate_limited")
            log.info("pod %s: consolidation waits: at most %d evictions a minute", pod.key,
                     self.config.evictions_per_minute)  # fmt: skip
            return False
        units = demand.per_gpu * len(plan.gpus) + plan.moved_units
        if not within_budget(self._held_units(), units, self._cluster_units(), self.config.max_share):
            self.metrics.consolidation("over_budget")
            return False
        return self._execute(pod, plan, now, report)

    @staticmethod
    def _split_room(state: NodeState, demand: Demand) -> bool:
        """The node's usable GPUs have the room in all, just not on `count` of them."""
        usable = [g for g in state.gpus if g.healthy and g.total >= demand.per_gpu]
        return sum(g.free for g in usable) >= demand.per_gpu * demand.count

    def _execute(self, pod: WaitingPod, plan: ConsolidationPlan, now: float, report: PassReport) -> bool:
        expires = now + self.config.hold_seconds
        unit = self.cache.unit.value
        mine = Hold(
            HoldKind.CONSOLIDATION, plan.node, plan.gpus, pod.demand.per_gpu, pod.priority, expires, pod.uid, pod.key
        )
        theirs = [
            Hold(
                HoldKind.CONSOLIDATION,
                m.node,
                m.gpus,
                m.pod.demand.per_gpu,
                m.pod.priority,
                expires,
                m.pod.uid,
                m.pod.key,
                m.pod.owner_uid,
            )
            for m in plan.moves
        ]
        if not self._write_holds(pod, [mine, *theirs]):
            return False
        self.metrics.consolidation("started")
        report.consolidated.append(pod.key)
        gpus = ",".join(map(str, plan.gpus))
        moves = "; ".join(f"{m.pod.key} to node {m.node} GPU {','.join(map(str, m.gpus))}" for m in plan.moves)
        self._event(
            pod.ref(),
            EVENT_CONSOLIDATING,
            f"moving {len(plan.moves)} pod(s) to make room on GPU {gpus} of node {plan.node}: {moves}",
        )
        log.info("pod %s: consolidation on node %s GPU %s: %s", pod.key, plan.node, gpus, moves)
        for i, move in enumerate(plan.moves):
            namespace, _, name = move.pod.key.partition("/")
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
                    self._refused[move.pod.key] = now + self.config.refusal_cooldown
                    report.refused.append(move.pod.key)
                    why = f"its eviction was refused (a PodDisruptionBudget allows no disruption now): {exc}"
                    self._event(ref, EVENT_CONSOLIDATION_REFUSED, f"not moved for {pod.key}: {why}", "Warning")
                    self._refuse(pod, f"pod {move.pod.key}: {why}")
                else:
                    self.metrics.eviction("failed")
                    log.warning("pod %s: eviction for %s failed: %s", move.pod.key, pod.key, exc)
                self._abandon(pod, plan, i, f"evicting {move.pod.key} failed")
                return True
            self.metrics.eviction("evicted")
            report.evicted.append(move.pod.key)
            self._event(
                ref,
                EVENT_CONSOLIDATION_EVICTED,
                f"evicted to make room for {pod.key} on node {plan.node} GPU {gpus} ({pod.demand.per_gpu} {unit} "
                f"each); its replacement is held {move.pod.demand.per_gpu} {unit} on GPU "
                f"{','.join(map(str, move.gpus))} of node {move.node}",
            )
            log.info("pod %s evicted for %s (consolidation); its replacement goes to node %s", move.pod.key,
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
