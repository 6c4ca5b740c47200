"""bind: choose the GPU(s), record the choice on the pod, create the Binding — never over-commit.

Order matters for the invariants of DESIGN.md:
1. under the node's lock, re-check the node against the cache and let the policy choose GPU(s);
2. count the choice in the cache at once (an "assumed" pod), so a concurrent bind sees it;
3. patch the pod's annotations with its resourceVersion (a concurrent writer makes it Conflict:
   re-read and retry a few times), so the plugin can serve Allocate;
4. create the Binding; only then release the lock.
Any failure rolls the cache back (and removes the annotations if they were written), records an
Event on the pod and returns `Error` to kube-scheduler, which retries the pod later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from share_core.assignment import ASSIGNMENT_KEYS, Assignment, parse_assignment, pod_annotations, pod_node
from share_core.contract import MemoryUnit
from share_core.kube import Conflict, KubeClient, KubeError, NotFound, Unavailable
from share_core.request import InvalidRequest
from share_scheduler.cache import ClusterCache, Contribution
from share_scheduler.extender import BadRequest, pod_demand, unfit_reason
from share_scheduler.placement import Policy

log = logging.getLogger(__name__)

PATCH_ATTEMPTS = 4  # annotation patches tried on Conflict before giving up
ROLLBACK_ATTEMPTS = 3


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
    """Serialises binds per node; everything else (other nodes, filter, watches) runs concurrently."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ClusterCache,
        policy: Policy,
        unit: MemoryUnit = MemoryUnit.GiB,
        on_failure: Callable[[str], None] | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.policy = policy
        self.unit = unit
        self._on_failure = on_failure
        self._clock_ns = clock_ns
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.policy_lock = threading.Lock()  # policies need not be thread-safe

    def _node_lock(self, node: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(node)
            if lock is None:
                lock = self._locks[node] = threading.Lock()
            return lock

    def _event(self, pod: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal") -> None:
        try:
            self.kube.create_event(pod, reason, message, event_type)
        except KubeError as exc:  # an Event is a courtesy: never fail a bind over it
            log.warning("pod %s: could not record event %s (%s): %s", _key(pod), reason, message, exc)

    def bind(self, args: BindArgs) -> str:
        """Bind the pod; returns a human summary. Raises BindError."""
        pod: Mapping[str, Any] = {"metadata": {"name": args.name, "namespace": args.namespace, "uid": args.uid}}
        try:
            pod = self._read_pod(args)
            summary = self._bind(args, pod)
        except BindError as exc:
            log.warning("bind %s to node %s failed: %s", args.key, args.node, exc)
            if self._on_failure:
                self._on_failure(exc.reason)
            self._event(pod, "FailedGPUShareBinding", f"bind to node {args.node} failed: {exc}", "Warning")
            raise
        log.info("pod %s: %s", args.key, summary)
        self._event(pod, "GPUShareAssigned", summary)
        return summary

    def _read_pod(self, args: BindArgs) -> Mapping[str, Any]:
        try:
            pod = self.kube.get_pod(args.namespace, args.name)
        except NotFound as exc:
            raise BindError(f"pod {args.key} not found: it was deleted before it could be bound", "not_found") from exc
        except KubeError as exc:
            raise BindError(f"could not read pod {args.key} from the API server: {exc}", "api_error") from exc
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if args.uid and uid and uid != args.uid:
            raise BindError(
                f"pod {args.key} has UID {uid}, not {args.uid}: it was deleted and re-created", "uid_mismatch"
            )
        return pod

    def _bind(self, args: BindArgs, pod: Mapping[str, Any]) -> str:
        bound_to = pod_node(pod)
        if bound_to:
            if bound_to == args.node and self._has_assignment(pod):
                return f"already bound to node {args.node} with its GPU assignment (nothing to do)"
            raise BindError(f"pod {args.key} is already bound to node {bound_to}", "already_bound")
        try:
            wanted = pod_demand(pod)
        except InvalidRequest as exc:
            raise BindError(f"pod {args.key}: {exc}", "invalid_request") from exc
        if wanted is None:
            # Not a GPU-sharing pod: bind it like the default binder would.
            self._create_binding(args)
            return f"bound to node {args.node} (no {self.unit.value} of GPU memory requested)"
        request, demand = wanted
        with self._node_lock(args.node):
            snap = self.cache.node_snapshot(args.node)
            if snap is None:
                raise BindError(f"node {args.node} is not known to the gpushare extender", "unknown_node")
            with self.policy_lock:
                chosen = self.policy.choose(snap.state, demand)
            if chosen is None:
                reason = unfit_reason(snap, demand, self.unit)[0]
                raise BindError(f"pod {args.key} no longer fits on node {args.node}: {reason}", "no_fit")
            by_index = {g.index: g for g in snap.state.gpus}
            uuid_of = {g.index: g.uuid for g in snap.gpus}
            uuids = tuple(uuid_of.get(i, "") for i in chosen)
            assignment = Assignment(chosen, uuids, request.total, self._clock_ns(), assigned=False)
            self.cache.assume(args.key, args.uid or _uid(pod), Contribution(args.node, chosen, demand.per_gpu))
            try:
                pod = self._patch(args, pod, assignment)
                self._bind_or_rollback(args, pod)
            except BindError:
                raise
            except Exception as exc:  # never leave an assumption behind on an unexpected error
                self.cache.forget(args.key)
                raise BindError(f"unexpected error binding {args.key}: {exc!r}", "internal") from exc
            gpus = ", ".join(f"GPU {i} ({demand.per_gpu} of {by_index[i].total} {self.unit.value})" for i in chosen)
            return f"assigned {gpus} on {args.node}"

    @staticmethod
    def _has_assignment(pod: Mapping[str, Any]) -> bool:
        try:
            return parse_assignment(pod_annotations(pod)) is not None
        except InvalidRequest:
            return False

    def _patch(self, args: BindArgs, pod: Mapping[str, Any], assignment: Assignment) -> Mapping[str, Any]:
        """Write the assignment, conditioned on the pod's resourceVersion; re-read on Conflict."""
        for attempt in range(1, PATCH_ATTEMPTS + 1):
            rv = str((pod.get("metadata") or {}).get("resourceVersion") or "") or None
            try:
                return self.kube.patch_pod_annotations(
                    args.namespace, args.name, assignment.to_annotations(), resource_version=rv
                )
            except Conflict as exc:
                log.info("pod %s changed while binding (attempt %d): %s; re-reading", args.key, attempt, exc)
                try:
                    pod = self.kube.get_pod(args.namespace, args.name)
                except KubeError as read_exc:
                    self.cache.forget(args.key)
                    raise BindError(f"pod {args.key} could not be re-read: {read_exc}", "api_error") from read_exc
                if pod_node(pod):
                    self.cache.forget(args.key)
                    raise BindError(f"pod {args.key} was bound to {pod_node(pod)} meanwhile", "already_bound") from exc
                if args.uid and _uid(pod) != args.uid:
                    self.cache.forget(args.key)
                    raise BindError(f"pod {args.key} was re-created meanwhile", "uid_mismatch") from exc
            except NotFound as exc:
                self.cache.forget(args.key)
                raise BindError(f"pod {args.key} was deleted while binding", "not_found") from exc
            except KubeError as exc:
                self.cache.forget(args.key)
                raise BindError(f"could not record the GPU assignment on pod {args.key}: {exc}", "api_error") from exc
        self.cache.forget(args.key)
        raise BindError(f"pod {args.key} kept changing: gave up after {PATCH_ATTEMPTS} conflicts", "conflict")

    def _create_binding(self, args: BindArgs) -> None:
        try:
            self.kube.bind_pod(args.namespace, args.name, args.uid, args.node)
        except KubeError as exc:
            raise BindError(f"could not bind pod {args.key} to node {args.node}: {exc}", _reason(exc)) from exc

    def _bind_or_rollback(self, args: BindArgs, pod: Mapping[str, Any]) -> None:
        try:
            self.kube.bind_pod(args.namespace, args.name, args.uid, args.node)
            return
        except Unavailable as exc:
            # Timeout or 5xx: the Binding may have been created. Ask before undoing anything.
            outcome = self._check_bound(args)
            if outcome is True:
                log.info("pod %s: Binding call failed (%s) but the pod is bound to %s", args.key, exc, args.node)
                return
            if outcome is None:
                # Unknown: keep the assumption (it expires unless the watch shows the pod bound) and
                # the annotations (harmless on an unbound pod: the next bind overwrites them).
                raise BindError(
                    f"Binding of {args.key} to {args.node} has an unknown outcome: {exc}", "unknown_outcome"
                ) from exc
            failure: KubeError = exc
        except KubeError as exc:
            failure = exc
        self.cache.forget(args.key)
        self._remove_annotations(args)
        raise BindError(f"could not bind pod {args.key} to node {args.node}: {failure}", _reason(failure)) from failure

    def _check_bound(self, args: BindArgs) -> bool | None:
        """True: bound to our node; False: not (or elsewhere); None: we cannot tell."""
        try:
            pod = self.kube.get_pod(args.namespace, args.name)
        except NotFound:
            return False
        except KubeError:
            return None
        return pod_node(pod) == args.node

    def _remove_annotations(self, args: BindArgs) -> None:
        removal: dict[str, str | None] = dict.fromkeys(ASSIGNMENT_KEYS)
        for attempt in range(1, ROLLBACK_ATTEMPTS + 1):
            try:
                pod = self.kube.get_pod(args.namespace, args.name)
                if pod_node(pod) == args.node:
                    return  # bound to our node after all: its annotations tell the truth, keep them
                rv = (pod.get("metadata") or {}).get("resourceVersion")
                self.kube.patch_pod_annotations(args.namespace, args.name, removal, resource_version=rv)
                return
            except NotFound:
                return
            except KubeError as exc:
                log.warning("pod %s: removing the GPU assignment failed (attempt %d): %s", args.key, attempt, exc)
        log.error(
            "pod %s: could not remove its GPU assignment annotations; they are stale until the next bind", args.key
        )


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
