"""The extender itself: filter, prioritize and bind as methods of one object over the cache, the policy
and the binder. Request body in, (HTTP status, JSON-able body) out: no HTTP here, so tests and benches
call the verbs directly, and `share_scheduler.app` only routes to them.

Status codes: kube-scheduler treats any status but 200 as a failed call and throws the body away, so
a request it could have sent (a well-formed ExtenderArgs for a pod we cannot place) is answered 200
with `Error` set — that message reaches the pod's FailedScheduling event. A body kube-scheduler would
never send (not JSON, missing or mistyped fields) is answered 400, still with a JSON `Error`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import orjson

from share_core.admission import invalid_request_message
from share_core.contract import EXTENDER_PREFIX
from share_core.contract import MemoryUnit
from share_core.events import EventQueue
from share_core.kube import KubeClient
from share_core.request import InvalidRequest
from share_core.retry import Backoff
from share_placement import Demand
from share_placement import Policy
from share_placement import learns
from share_placement import make_policy
from share_placement.room import RoomForWaiting
from share_scheduler.bestnodes import BestNodeIndex
from share_scheduler.binder import BIND_EVENTS
from share_scheduler.binder import Binder
from share_scheduler.binder import BindError
from share_scheduler.binder import parse_bind_args
from share_scheduler.cache import ClusterCache
from share_scheduler.claimdemand import ClaimDemands
from share_scheduler.extender import FILTER_KEEPS
from share_scheduler.extender import BadRequest
from share_scheduler.extender import ScoreMemo
from share_scheduler.extender import best_nodes
from share_scheduler.extender import filter_nodes
from share_scheduler.extender import filter_result
from share_scheduler.extender import host_priorities
from share_scheduler.extender import parse_extender_request
from share_scheduler.extender import pod_demand
from share_scheduler.extender import policy_scores
from share_scheduler.holds import Asker
from share_scheduler.leader import Leadership
from share_scheduler.leaveroom import LeaveRoom
from share_scheduler.metrics import Metrics
from share_scheduler.preempt import DEFAULT_HOLD_SECONDS
from share_scheduler.preempt import BudgetIndex
from share_scheduler.preempt import Preemption
from share_scheduler.starvation import Starvation
from share_scheduler.starvation import StarvationConfig
from share_scheduler.syncer import Syncer

# A verb as the servers call it: raw request body in, (status, JSON bytes) out, its latency recorded.
TimedVerb = Callable[[bytes], tuple[int, bytes]]
NOT_SYNCED = "gpushare extender is still syncing its cache; retry"


def read_body(raw: bytes) -> Any:
    if not raw:
        raise BadRequest("request body is empty")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from exc


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


class Extender:
    """The scheduling verbs and the parts they share. `start()` begins the list+watch (call it in the
    serving process); until the first full sync, filter and bind answer "still syncing"."""

    def __init__(
        self,
        kube: KubeClient,
        policy: Policy | str = "binpack",
        unit: MemoryUnit = MemoryUnit.GiB,
        cache: ClusterCache | None = None,
        watch_timeout: int = 300,
        assume_ttl: float | None = None,
        sync_backoff: Callable[[], Backoff] = Backoff,
        filter_keeps: str = "best",
        bind_events: str = "failures",
        dra: bool = False,
        leader_lease: str | None = None,
        leader_identity: str | None = None,
        preemption_hold: float = DEFAULT_HOLD_SECONDS,
        starvation: StarvationConfig | None = None,
    ) -> None:
        if isinstance(policy, str):
            policy = make_policy(policy)
        config = starvation or StarvationConfig(reserve=False)
        # The policy's own learned state (frag's workload table, its GPU unit) is the wrapped policy's; with
        # --leave-room off there is no wrapper and `base_policy` is `policy` itself.
        self.base_policy = policy
        if config.leave_room:
            policy = RoomForWaiting(policy)
        if bind_events not in BIND_EVENTS:
            raise ValueError(f"bind_events must be one of {', '.join(BIND_EVENTS)}, not {bind_events!r}")
        if filter_keeps not in FILTER_KEEPS:
            raise ValueError(f"filter_keeps must be one of {', '.join(FILTER_KEEPS)}, not {filter_keeps!r}")
        if cache is None:
            ttl = {} if assume_ttl is None else {"assume_ttl": assume_ttl}
            cache = ClusterCache(unit=unit, dra=dra, **ttl)
        self.kube = kube
        self.policy = policy
        self.unit = unit
        self.cache = cache
        self.keep_best = filter_keeps == "best"
        self.random_ties = bool(getattr(policy, "random_ties", False))  # bestfit: kube-scheduler breaks its ties
        self.metrics = Metrics(cache)
        self.events = EventQueue(kube, on_drop=self.metrics.events_dropped.inc, on_error=self.metrics.events_failed.inc)
        self.binder = Binder(
            kube,
            cache,
            policy,
            unit,
            on_failure=lambda r: self.metrics.bind_failures.labels(r).inc(),
            events=self.events,
            on_pod_read=self.metrics.bind_pod_reads.inc,
            assigned_events=bind_events == "all",
        )
        self.memo = ScoreMemo(policy, learner=self.base_policy)
        self.index = (
            BestNodeIndex(policy, cache, self.memo, self.binder.policy_lock) if BestNodeIndex.usable(policy) else None
        )
        # Room for what waits: the wrapper told the waiting shapes, the memo forgotten when they change.
        self.leave_room = (
            LeaveRoom(
                policy,
                cache.waiting,
                self.binder.policy_lock,
                self.memo.clear,
                scheduler=config.scheduler,
                linger_s=config.leave_room_linger,
                unit=unit.value,
                hosts=cache.hosts,
            )
            if isinstance(policy, RoomForWaiting)
            else None
        )
        if self.leave_room is not None:
            self.metrics.watch_leave_room(self.leave_room)
        if learns(self.base_policy):  # reading every pod's request costs a third of the first sync: only when it counts
            cache.set_observer(self.observe)
        if hasattr(self.base_policy, "set_gpu_unit"):  # frag: its gap price packs shares into the cluster's largest GPU
            cache.set_largest_gpu_observer(self._largest_gpu)
        budgets = BudgetIndex()  # PodDisruptionBudgets, for preemption
        self.syncer = Syncer(kube, cache, watch_timeout=watch_timeout, backoff=sync_backoff, budgets=budgets)
        # Who acts unasked (preemption's evictions, reservations): the replica beside the leading kube-scheduler.
        self.leadership = Leadership(kube, leader_lease, leader_identity)
        self.metrics.watch_leadership(self.leadership.is_leader)
        self.claims = ClaimDemands(kube, cache, unit) if cache.dra else None
        # The preempt verb and the leader's own preemption (share_scheduler.preempt); its PDBs come with the sync.
        self.preemption = Preemption(
            kube,
            cache,
            unit,
            self.events,
            self.metrics,
            self.leadership.is_leader,
            hold_seconds=preemption_hold,
            budgets=budgets,
        )
        # Reservations may yield to small pods that waited (off unless configured): filter and bind read it.
        cache.holds.yield_after_s = config.yield_after
        cache.holds.min_gpus = config.min_gpus
        # Room for pods that waited too long (reservations, consolidation): off unless configured.
        self.starvation = Starvation(
            kube,
            cache,
            policy,
            self.binder.policy_lock,
            self.leadership.is_leader,
            self.events,
            config,
            metrics=self.metrics.starvation_hooks(),
        )

    def start(self) -> None:
        self.syncer.start()
        self.leadership.start()
        self.preemption.start()
        self.starvation.start()

    def stop(self) -> None:
        self.preemption.stop()
        self.leadership.stop()
        self.starvation.stop()
        self.syncer.stop()

    def observe(self, demand: Demand) -> None:
        """Workload-aware policies (frag) learn the pod-size distribution from every pod we see, the
        initial list included, so a restarted extender relearns it from the cluster."""
        with self.binder.policy_lock:
            self.policy.observe(demand)
        self.memo.invalidate()  # a learning policy may now score a view differently (no-op for binpack)

    def _largest_gpu(self, units: int) -> None:
        with self.binder.policy_lock:
            self.base_policy.set_gpu_unit(units or None)  # type: ignore[attr-defined]
        self.memo.invalidate()

    def filter(self, raw: bytes) -> tuple[int, Any]:
        try:
            args = parse_extender_request(raw)
        except BadRequest as exc:
            return 400, filter_error(str(exc))
        try:
            wanted = pod_demand(args.pod)
        except InvalidRequest as exc:
            return 200, filter_result(args, None, {}, {}, invalid_request_message(args.pod, exc))
        if not self.cache.synced:
            return 200, filter_result(args, None, {}, {}, NOT_SYNCED)
        if self.leave_room is not None:
            self.leave_room.refresh()  # one comparison unless the waiting multi-GPU pods changed
        # A pod that asks no GPU is placed by the policy too (frag prices the gaps its CPU and memory
        # strand; binpack packs it where GPUs are taken): every pod of the profile reaches us.
        request, demand = wanted
        self.binder.remember(args.pod, request, demand)
        # A pod filtered again is in a new scheduling attempt (the last one stopped before its bind, e.g.
        # a Reserve plugin failed): the GPUs its earlier filter held for it must not count against it.
        self.binder.release_hold(args.pod)
        claims = self.claims.demand(args.pod, demand) if self.claims is not None else None
        if claims is not None and claims.demand is None:
            return 200, filter_result(args, list(args.names), {}, {})  # a shape left to kube-scheduler
        placement = claims.demand if claims is not None and claims.demand is not None else demand
        if placement is not demand:
            self.cache.note_demand(str((args.pod.get("metadata") or {}).get("uid") or ""), placement)
        held = self._held(args.pod, placement.count)
        if held:
            # Memory held for another pod this one must respect (a preemptor's freed GPU, a reservation):
            # the exact path over the nodes as this pod sees them; the fast paths know no holds.
            entries = self.cache.entries(args.names, held)
            passed, failed, unresolvable = filter_nodes(placement, entries, self.unit)
            if self.keep_best and passed:
                kept = set(passed)
                scores = policy_scores(
                    self.policy, placement, [e for e in entries if e[0] in kept], self.memo, self.binder.policy_lock
                )
                passed = best_nodes(scores, self.random_ties)
        elif self.keep_best:
            passed = self._best(placement, args.names)
            if not passed and placement is not demand:
                # kube-scheduler's own DRA filter found room for the claims on these nodes; our view of the
                # claims lags it (a watch behind): rank them by the rest of the pod rather than refuse it.
                passed = self._best(demand, args.names)
            failed, unresolvable = {}, {}
            if not passed:
                _, failed, unresolvable = filter_nodes(placement, self.cache.entries(args.names), self.unit)
        else:
            passed, failed, unresolvable = filter_nodes(placement, self.cache.entries(args.names), self.unit)
        if len(passed) == 1:
            # kube-scheduler takes a lone node without scoring (schedulePod): hold its GPUs for the bind.
            self.binder.hold(args.pod, passed[0], demand)
            if claims is not None:
                self.claims.hold(args.pod, passed[0], claims)
        if not passed and failed:
            # No node: preemption may help on the failed ones; where kube-scheduler finds no candidate of
            # its own (fragmentation only), the leader acts on this note (share_scheduler.preempt).
            self.preemption.after_filter(args.pod, failed)
        return 200, filter_result(args, passed, failed, unresolvable)

    def _held(self, pod: Mapping[str, Any], gpu_count: int) -> dict[str, dict[int, int]]:
        """node -> GPU index -> units held for other pods that `pod` (asking `gpu_count` GPUs) must respect
        ({}: none, the usual)."""
        holds = self.cache.holds
        return holds.against(Asker.of(pod, gpu_count)) if holds.active else {}

    def _best(self, demand: Demand, names: Sequence[str]) -> list[str]:
        if self.index is not None:
            return self.index.best(demand, names)
        scores = policy_scores(self.policy, demand, self.cache.entries(names), self.memo, self.binder.policy_lock)
        return best_nodes(scores, self.random_ties)

    def prioritize(self, raw: bytes) -> tuple[int, Any]:
        try:
            args = parse_extender_request(raw)
            wanted = pod_demand(args.pod)
        except (BadRequest, InvalidRequest) as exc:
            # kube-scheduler only logs a failed prioritize; 400 keeps our scores out of the sum.
            return 400, {"Error": str(exc)}
        _, demand = wanted
        claims = self.claims.demand(args.pod, demand) if self.claims is not None else None
        if claims is not None and claims.demand is not None:
            demand = claims.demand  # a DRA pod: ranked with its claims' GPUs
        if self.leave_room is not None:
            self.leave_room.refresh()
        entries = self.cache.entries(args.names, self._held(args.pod, demand.count))
        raw = policy_scores(self.policy, demand, entries, self.memo, self.binder.policy_lock)
        return 200, host_priorities(args.names, raw)

    def bind(self, raw: bytes) -> tuple[int, Any]:
        failures = self.metrics.bind_failures
        try:
            args = parse_bind_args(read_body(raw))
        except BadRequest as exc:
            failures.labels("bad_request").inc()
            return 400, {"Error": str(exc)}
        if not self.cache.synced:
            failures.labels("not_synced").inc()
            return 200, {"Error": NOT_SYNCED}
        if self.leave_room is not None:
            self.leave_room.refresh()
        try:
            self.binder.bind(args)
        except BindError as exc:
            return 200, {"Error": str(exc)}
        self.metrics.binds.inc()
        return 200, {"Error": ""}

    def timed_verbs(self) -> dict[str, TimedVerb]:
        """The verbs by URL path, each timed and answering JSON bytes: the Flask routes call them, and so
        does share_scheduler.server's lean front for kube-scheduler."""
        verbs = {
            "filter": self.filter,
            "prioritize": self.prioritize,
            "bind": self.bind,
            "preempt": self.preemption.preempt,
        }
        return {f"{EXTENDER_PREFIX}/{name}": self._timed(name, fn) for name, fn in verbs.items()}

    def _timed(self, name: str, fn: Callable[[bytes], tuple[int, Any]]) -> TimedVerb:
        latency = self.metrics.latency.labels(name)

        def run(raw: bytes) -> tuple[int, bytes]:
            start = time.perf_counter()
            try:
                status, body = fn(raw)
                return status, orjson.dumps(body)
            finally:
                latency.observe(time.perf_counter() - start)

        return run
