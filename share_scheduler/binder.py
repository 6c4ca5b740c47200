"""bind: choose the GPU(s) and bind with them recorded on the pod, in one API call; never over-commit.

Order matters for the invariants of DESIGN.md:
1. under the node's lock, re-check the node against the cache, let the policy choose GPU(s) and
   count the choice in the cache at once (an "assumed" pod), so any later bind sees it; release the
   lock: binds to one node pipeline, each waits for the API server on its own;
2. create the Binding with the assignment in its metadata.annotations: the API server writes them
   and spec.nodeName in one update, under the pod's UID precondition
   (pkg/registry/core/pod/storage/storage.go, BindingREST.setPodNodeAndMetadata). There is no
   window where a pod carries annotations but no node, or a node but no annotations, so a failed
   bind leaves nothing on the pod to roll back: only the assumption is forgotten.
The pod is not read from the API server: filter, which kube-scheduler calls first, saw it and left
its request here (a GET is the fallback when it did not, e.g. after an extender restart). Events go
to a bounded queue (share_core.events) and never hold a bind up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

from cachetools import TTLCache

from share_core.assignment import Assignment
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_node
from share_core.contract import EVENT_BIND_FAILED
from share_core.contract import EVENT_GPU_ASSIGNED
from share_core.contract import MemoryUnit
from share_core.events import EventQueue
from share_core.kube import Conflict
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_core.kube import Unavailable
from share_core.request import InvalidRequest
from share_core.request import PodRequest
from share_core.request import pod_request
from share_placement import Demand
from share_placement import Policy
from share_scheduler.cache import ClusterCache
from share_scheduler.extender import BadRequest
from share_scheduler.extender import pod_demand
from share_scheduler.extender import unfit_reason
from share_scheduler.holds import Asker
from share_scheduler.nodes import Contribution
from share_scheduler.nodes import NodeSnapshot

log = logging.getLogger(__name__)

BIND_EVENTS = ("failures", "all")  # `--bind-events`: Events for failed binds only, or for every bind as well
SEEN_TTL = 600.0  # seconds filter's view of a pod is kept for its bind
SEEN_LIMIT = 100_000  # pods remembered between filter and bind (a burst far larger than any queue)


@dataclass(frozen=True, slots=True)
class BindArgs:
    name: str
    namespace: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_bind_args(body: Any) -> BindArgs:
    """Validate ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}; raises BadRequest."""
    if not isinstance(body, Mapping):
        raise BadRequest("request body must be a JSON object (ExtenderBindingArgs)")
    lowered = {k.lower(): v for k, v in body.items() if isinstance(k, str)}
    values = {}
    for field in ("PodName", "PodNamespace", "PodUID", "Node"):
        v = body.get(field, lowered.get(field.lower()))
        if v is None and field == "PodUID":
            v = ""
        if not isinstance(v, str) or (field != "PodUID" and not v):
            raise BadRequest(f"ExtenderBindingArgs.{field} is missing or not a non-empty string")
        values[field] = v
    return BindArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


class BindError(Exception):
    """A bind that failed; `reason` labels the metric, the message goes to kube-scheduler and the Event."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Binder:
    """Serialises the choice per node; the API calls of binds to one node run side by side."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ClusterCache,
        policy: Policy,
        unit: MemoryUnit = MemoryUnit.GiB,
        on_failure: Callable[[str], None] | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        events: EventQueue | None = None,
        on_pod_read: Callable[[], None] | None = None,
        assigned_events: bool = False,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.policy = policy
        self.unit = unit
        self.events = events if events is not None else EventQueue(kube)
        self.assigned_events = assigned_events  # False: Events for failures only (one API write less per pod)
        self._on_failure = on_failure
        self._on_pod_read = on_pod_read
        self._clock_ns = clock_ns
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.policy_lock = threading.Lock()  # policies need not be thread-safe
        # PodUID -> (namespace/name, GPU request, demand) as filter saw it; a pending pod's resources do
        # not change (an in-place resize applies to bound pods only).
        self._seen: TTLCache[str, tuple[str, PodRequest | None, Demand, Asker]] = TTLCache(
            maxsize=SEEN_LIMIT, ttl=SEEN_TTL
        )
        self._seen_lock = threading.Lock()

    def _node_lock(self, node: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(node)
            if lock is None:
                lock = self._locks[node] = threading.Lock()
            return lock

    def remember(self, pod: Mapping[str, Any], request: PodRequest | None, demand: Demand) -> None:
        """Filter saw this pod ask for `request` (None: no GPU) and `demand`: its bind need not read the
        pod again."""
        uid = _uid(pod)
        if uid:
            with self._seen_lock:
                self._seen[uid] = (_key(pod), request, demand, Asker.of(pod, demand.count))

    def _recall(self, args: BindArgs) -> tuple[PodRequest | None, Demand, Asker] | None:
        if not args.uid:
            return None
        with self._seen_lock:
            seen = self._seen.get(args.uid)
        if seen is None or seen[0] != args.key:
            return None
        return seen[1], seen[2], seen[3]

    def _snapshot_for(self, node: str, asker: Asker) -> NodeSnapshot | None:
        """The node as `asker` may use it: memory held for other pods it must respect counts as taken."""
        holds = self.cache.holds
        held = holds.against(asker).get(node) if holds.active else None
        return self.cache.node_snapshot(node, held)

    def bind(self, args: BindArgs) -> str:
        """Bind the pod; returns a human summary. Raises BindError."""
        ref: Mapping[str, Any] = {"metadata": {"name": args.name, "namespace": args.namespace, "uid": args.uid}}
        try:
            summary = self._bind(args)
        except BindError as exc:
            log.warning("bind %s to node %s failed: %s", args.key, args.node, exc)
            if self._on_failure:
                self._on_failure(exc.reason)
            self.events.record(ref, EVENT_BIND_FAILED, f"bind to node {args.node} failed: {exc}", "Warning")
            raise
        log.info("pod %s: %s", args.key, summary)
        if self.assigned_events:
            self.events.record(ref, EVENT_GPU_ASSIGNED, summary)
        return summary

    def _bind(self, args: BindArgs) -> str:
        recalled = self._recall(args)
        if recalled is None:
            pod = self._read_pod(args)
            if not args.uid:
                args = replace(args, uid=_uid(pod))  # the Binding's UID precondition, from what we read
            bound_to = pod_node(pod)
            if bound_to:
                return self._already_bound(args, pod, None)
            try:
                request, demand = pod_demand(pod)
            except InvalidRequest as exc:
                raise BindError(f"pod {args.key}: {exc}", "invalid_request") from exc
            asker = Asker.of(pod, demand.count)
        else:
            request, demand, asker = recalled
        assignment, summary = self._reserve(args, request, demand, asker)
        self._bind_with(args, assignment)
        return summary

    def release_hold(self, pod: Mapping[str, Any]) -> None:
        """Forget the hold an earlier filter made for this pod (not a bind's assumption: a pod whose bind
        is in flight is not filtered again)."""
        key = _key(pod)
        held = self.cache.assumption(key)
        if held is not None and held.held:
            with self._node_lock(held.contribution.node):
                self.cache.forget(key)

    def hold(self, pod: Mapping[str, Any], node: str, demand: Demand) -> bool:
        """Filter left kube-scheduler one node: choose the GPUs now and count them until the bind.

        kube-scheduler's next cycle starts before this pod's bind reaches us; without the hold the
        next pod's filter would offer the same GPU memory again and one of the two binds would fail
        ("no longer fits", a retry with backoff). False if the node cannot take the pod any more."""
        key, uid = _key(pod), _uid(pod)
        if not uid:
            return False
        with self._node_lock(node):
            if self.cache.assumption(key) is not None:
                self.cache.forget(key)  # a retried pod: its earlier hold must not count against itself
            snap = self._snapshot_for(node, Asker.of(pod, demand.count))
            if snap is None:
                return False
            with self.policy_lock:
                chosen = self.policy.choose(snap.state, demand)
            if chosen is None:
                return False
            self.cache.hold(key, uid, Contribution(node, chosen, demand.per_gpu, demand.cpu, demand.memory))
            return True

    def _reserve(
        self, args: BindArgs, request: PodRequest | None, demand: Demand, asker: Asker
    ) -> tuple[Assignment | None, str]:
        """Choose under the node's lock and count the choice before the lock is released.

        A hold filter made for this pod on this node is the choice (it is already counted). A pod that
        asks no GPU gets no assignment: its CPU and memory are counted, its Binding is the plain one."""
        with self._node_lock(args.node):
            held = self.cache.assumption(args.key)
            if (
                held is not None
                and held.held
                and held.uid == args.uid
                and held.contribution.node == args.node
                and held.contribution.per_gpu == demand.per_gpu
                and len(held.contribution.indices) == demand.count
                and (held.contribution.cpu, held.contribution.memory) == (demand.cpu, demand.memory)
            ):
                chosen = held.contribution.indices
                snap = self.cache.node_snapshot(args.node)
                if snap is None:
                    self.cache.forget(args.key)
                    raise BindError(f"node {args.node} is not known to the gpushare extender", "unknown_node")
            else:
                if held is not None:
                    self.cache.forget(args.key)  # held elsewhere: kube-scheduler chose otherwise
                snap = self._snapshot_for(args.node, asker)
                if snap is None:
                    raise BindError(f"node {args.node} is not known to the gpushare extender", "unknown_node")
                with self.policy_lock:
                    chosen = self.policy.choose(snap.state, demand)
                if chosen is None:
                    reason = unfit_reason(snap, demand, self.unit)[0]
                    raise BindError(f"pod {args.key} no longer fits on node {args.node}: {reason}", "no_fit")
            self.cache.assume(
                args.key, args.uid, Contribution(args.node, chosen, demand.per_gpu, demand.cpu, demand.memory)
            )
        if request is None:
            return None, f"bound to node {args.node} (no GPU asked; {demand.cpu}m CPU, {demand.memory} bytes counted)"
        uuid_of = {g.index: g.uuid for g in snap.gpus}
        uuids = tuple(uuid_of.get(i, "") for i in chosen)
        total = {g.index: g.memory for g in snap.gpus}
        gpus = ", ".join(f"GPU {i} ({demand.per_gpu} of {total.get(i, '?')} {self.unit.value})" for i in chosen)
        assignment = Assignment(chosen, uuids, request.total, self._clock_ns(), assigned=False)
        return assignment, f"assigned {gpus} on {args.node}"

    def _bind_with(self, args: BindArgs, assignment: Assignment | None) -> None:
        """One API call; on failure forget the reservation (nothing was written to the pod). No
        assignment (a pod that asks no GPU): the plain Binding, as kube-scheduler's DefaultBinder."""
        try:
            annotations = assignment.to_annotations() if assignment is not None else None
            self.kube.bind_pod(args.namespace, args.name, args.uid, args.node, annotations)
            return
        except Unavailable as exc:
            # Timeout or 5xx: the Binding may have been created. Ask before forgetting anything.
            pod = self._read_back(args)
            if pod is None:
                # Unknown: keep the assumption; it expires unless the watch shows the pod bound, and a
                # retried bind of this pod replaces it.
                raise BindError(
                    f"Binding of {args.key} to {args.node} has an unknown outcome: {exc}", "unknown_outcome"
                ) from exc
            if pod and pod_node(pod):
                self._already_bound(args, pod, exc)
                return
            failure: KubeError = exc
        except Conflict as exc:
            # Refused: already bound (maybe by our own earlier attempt whose answer was lost), being
            # deleted, scheduling-gated, or another pod by that name.
            pod = self._read_back(args)
            if pod and (pod_node(pod) or (args.uid and _uid(pod) != args.uid)):
                self._already_bound(args, pod, exc)  # ours already, or a clear refusal
                return
            failure = exc
        except KubeError as exc:
            failure = exc
        except Exception as exc:  # never leave an assumption behind on an unexpected error
            self.cache.forget(args.key)
            raise BindError(f"unexpected error binding {args.key}: {exc!r}", "internal") from exc
        self.cache.forget(args.key)
        if isinstance(failure, NotFound):
            raise BindError(f"pod {args.key} was deleted before it could be bound", "not_found") from failure
        raise BindError(f"could not bind pod {args.key} to node {args.node}: {failure}", _reason(failure)) from failure

    def _already_bound(self, args: BindArgs, pod: Mapping[str, Any], cause: KubeError | None) -> str:
        """The pod is bound already: success only if to our node with a GPU assignment on it."""
        bound_to = pod_node(pod)
        if args.uid and _uid(pod) and _uid(pod) != args.uid:
            self.cache.forget(args.key)
            raise BindError(
                f"pod {args.key} has UID {_uid(pod)}, not {args.uid}: it was deleted and re-created", "uid_mismatch"
            ) from cause
        if bound_to == args.node and (self._has_assignment(pod) or not self._asks_gpu(pod)):
            # The API server's version wins over any reservation of ours (the watch would say the same).
            self.cache.upsert_pod(pod)
            return f"already bound to node {args.node} with what it asked (nothing to do)"
        self.cache.forget(args.key)
        raise BindError(f"pod {args.key} is already bound to node {bound_to}", "already_bound") from cause

    def _read_pod(self, args: BindArgs) -> Mapping[str, Any]:
        if self._on_pod_read:
            self._on_pod_read()
        try:
            pod = self.kube.get_pod(args.namespace, args.name)
        except NotFound as exc:
            raise BindError(f"pod {args.key} not found: it was deleted before it could be bound", "not_found") from exc
        except KubeError as exc:
            raise BindError(f"could not read pod {args.key} from the API server: {exc}", "api_error") from exc
        uid = _uid(pod)
        if args.uid and uid and uid != args.uid:
            raise BindError(
                f"pod {args.key} has UID {uid}, not {args.uid}: it was deleted and re-created", "uid_mismatch"
            )
        return pod

    def _read_back(self, args: BindArgs) -> Mapping[str, Any] | None:
        """The pod as the API server has it now; {} when it is gone, None when we cannot tell."""
        try:
            return self.kube.get_pod(args.namespace, args.name)
        except NotFound:
            return {}
        except KubeError:
            return None

    @staticmethod
    def _has_assignment(pod: Mapping[str, Any]) -> bool:
        try:
            return parse_assignment(pod_annotations(pod)) is not None
        except InvalidRequest:
            return False

    @staticmethod
    def _asks_gpu(pod: Mapping[str, Any]) -> bool:
        try:
            return pod_request(pod) is not None
        except InvalidRequest:
            return True


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def _reason(exc: KubeError) -> str:
    if isinstance(exc, Conflict):
        return "conflict"
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, Unavailable):
        return "api_unavailable"
    return "api_error"
