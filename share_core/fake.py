"""An in-memory `KubeClient` for unit tests: resource versions, optimistic concurrency, watches and
injectable faults, so code can be tested against API behaviour without an API server."""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections import defaultdict
from collections import deque
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

from share_core.kube import Conflict
from share_core.kube import KubeError
from share_core.kube import ListResult
from share_core.kube import NotFound
from share_core.kube import Obj
from share_core.kube import Pages
from share_core.kube import WatchEvent
from share_core.kube import now_rfc3339

HISTORY = 10_000  # changes kept for watches that start from an older resourceVersion


def _match_fields(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        negate = "!=" in term
        key, _, want = term.partition("!=" if negate else "=")
        want = want.lstrip("=")
        value: Any = obj
        for part in key.strip().split("."):
            value = (value or {}).get(part) if isinstance(value, dict) else None
        value = "" if value is None else str(value)
        if (value == want) == negate:
            return False
    return True


def _match_labels(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        key, _, want = term.partition("=")
        if labels.get(key.strip()) != want.strip():
            return False
    return True


class FakeKube:
    """Thread-safe store of nodes, pods, events and bindings behind the `KubeClient` interface."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rv = 0
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[tuple[str, str], Obj] = {}
        self.events: list[Obj] = []
        self.bindings: list[tuple[str, str, str]] = []
        self.evictions: list[tuple[str, str]] = []
        self.calls: dict[str, int] = defaultdict(int)
        self._faults: dict[str, list[Callable[[], None]]] = defaultdict(list)
        self._watchers: list[tuple[str, queue.Queue[WatchEvent | None], Callable[[Obj], bool]]] = []
        # Every change, by resource version, so that a watch from a list's resourceVersion misses none made
        # between the list and the watch (as the API server's watch cache replays them).
        self._history: deque[tuple[int, str, str, Obj]] = deque(maxlen=HISTORY)
        # Any other collection by its API path (ResourceSlices, ResourceClaims): path -> name key -> object.
        self.objects: dict[str, dict[tuple[str, str], Obj]] = defaultdict(dict)

    # -- test controls ---------------------------------------------------------------------------

    def fail(self, method: str, error: KubeError | Exception, times: int = 1) -> None:
        """The next `times` calls of `method` raise `error` (before touching state)."""

        def raise_it() -> None:
            raise error

        with self._lock:
            self._faults[method].extend([raise_it] * times)

    def delay(self, method: str, seconds: float, times: int = 1) -> None:
        with self._lock:
            self._faults[method].extend([lambda: time.sleep(seconds)] * times)

    def _enter(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1
            hook = self._faults[method].pop(0) if self._faults[method] else None
        if hook:
            hook()

    def _bump(self, obj: Obj) -> Obj:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        return obj

    def _notify(self, kind: str, event_type: str, obj: Obj) -> None:
        self._history.append((self._rv, kind, event_type, copy.deepcopy(obj)))
        for k, q, pred in list(self._watchers):
            if k == kind and pred(obj):
                q.put(WatchEvent(event_type, copy.deepcopy(obj)))

    def _modified(self, kind: str, obj: Obj) -> Obj:
        """A stored object was changed: a new resource version, a MODIFIED event; the caller's copy."""
        self._bump(obj)
        self._notify(kind, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def _node(self, name: str) -> Obj:
        node = self.nodes.get(name)
        if node is None:
            raise NotFound(f"node {name} not found", 404, "NotFound")
        return node

    def _pod(self, namespace: str, name: str) -> Obj:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise NotFound(f"pod {namespace}/{name} not found", 404, "NotFound")
        return pod

    def add_node(self, node: Obj) -> Obj:
        with self._lock:
            node = self._bump(copy.deepcopy(node))
            self.nodes[node["metadata"]["name"]] = node
            self._notify("nodes", "ADDED", node)
            return copy.deepcopy(node)

    def delete_node(self, name: str) -> None:
        with self._lock:
            node = self.nodes.pop(name)
            self._bump(node)
            self._notify("nodes", "DELETED", node)

    def add_pod(self, pod: Obj) -> Obj:
        with self._lock:
            pod = copy.deepcopy(pod)
            meta = pod.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            meta.setdefault("uid", f"uid-{meta['namespace']}-{meta['name']}")
            pod.setdefault("status", {}).setdefault("phase", "Pending")
            self._bump(pod)
            self.pods[(meta["namespace"], meta["name"])] = pod
            self._notify("pods", "ADDED", pod)
            return copy.deepcopy(pod)

    def update_pod(self, namespace: str, name: str, mutate: Callable[[Obj], None]) -> Obj:
        with self._lock:
            pod = self.pods[(namespace, name)]
            mutate(pod)
            return self._modified("pods", pod)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> Obj:
        return self.update_pod(namespace, name, lambda p: p.setdefault("status", {}).__setitem__("phase", phase))

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self.pods.pop((namespace, name))
            self._bump(pod)
            self._notify("pods", "DELETED", pod)

    def put_object(self, path: str, obj: Obj) -> Obj:
        """Create or replace an object of the collection at `path` (cluster-wide path, as listed)."""
        with self._lock:
            obj = self._bump(copy.deepcopy(obj))
            meta = obj["metadata"]
            key = (str(meta.get("namespace", "")), str(meta["name"]))
            kind = "MODIFIED" if key in self.objects[path] else "ADDED"
            self.objects[path][key] = obj
            self._notify(path, kind, obj)
            return copy.deepcopy(obj)

    def delete_object(self, path: str, namespace: str, name: str) -> None:
        with self._lock:
            obj = self._bump(self.objects[path].pop((namespace, name)))
            self._notify(path, "DELETED", obj)

    def close_watches(self) -> None:
        """End every open watch, as an API server does on timeout or restart."""
        with self._lock:
            for _, q, _ in self._watchers:
                q.put(None)
            self._watchers.clear()

    # -- KubeClient ------------------------------------------------------------------------------

    def pod_pages(self) -> Pages:
        listed = self.list_pods()
        return Pages(items=listed.items, resource_version=listed.resource_version)

    def list_nodes(self, label_selector: str | None = None) -> ListResult:
        self._enter("list_nodes")
        with self._lock:
            items = [copy.deepcopy(n) for n in self.nodes.values() if _match_labels(n, label_selector)]
            return ListResult(items, str(self._rv))

    def list_pods(self, field_selector: str | None = None, label_selector: str | None = None) -> ListResult:
        self._enter("list_pods")
        with self._lock:
            items = [
                copy.deepcopy(p)
                for p in self.pods.values()
                if _match_fields(p, field_selector) and _match_labels(p, label_selector)
            ]
            return ListResult(items, str(self._rv))

    def get_node(self, name: str) -> Obj:
        self._enter("get_node")
        with self._lock:
            return copy.deepcopy(self._node(name))

    def get_pod(self, namespace: str, name: str) -> Obj:
        self._enter("get_pod")
        with self._lock:
            return copy.deepcopy(self._pod(namespace, name))

    @staticmethod
    def _merge(target: dict[str, Any], patch: Mapping[str, str | None]) -> None:
        """A JSON merge patch of one map: null removes the key."""
        for k, v in patch.items():
            if v is None:
                target.pop(k, None)
            else:
                target[k] = v

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        self._enter("patch_pod_annotations")
        with self._lock:
            pod = self._pod(namespace, name)
            if resource_version and pod["metadata"]["resourceVersion"] != resource_version:
                raise Conflict(
                    f"pod {namespace}/{name} changed since resourceVersion {resource_version}", 409, "Conflict"
                )
            self._merge(pod["metadata"].setdefault("annotations", {}), annotations)
            return self._modified("pods", pod)

    def add_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> Obj:
        self._enter("add_pod_condition")
        with self._lock:
            pod = self._pod(namespace, name)
            conditions = pod.setdefault("status", {}).setdefault("conditions", [])
            conditions[:] = [c for c in conditions if c.get("type") != condition.get("type")] + [dict(condition)]
            return self._modified("pods", pod)

    def remove_pod(self, namespace: str, name: str, uid: str) -> None:
        """As the API server deletes a pod with a grace period: deletionTimestamp set (the pod keeps running
        until `finish_deletion` or a test deletes it outright)."""
        self._enter("remove_pod")
        with self._lock:
            pod = self._pod(namespace, name)
            if uid and pod["metadata"].get("uid") != uid:
                raise Conflict(
                    f"pod {namespace}/{name} has UID {pod['metadata'].get('uid')}, not {uid}", 409, "Conflict"
                )
            pod["metadata"].setdefault("deletionTimestamp", now_rfc3339())
            self._modified("pods", pod)

    def _patch_node(self, call: str, name: str, patch: Mapping[str, str | None], *maps: tuple[str, str]) -> Obj:
        """Node `name` with `patch` merged into each of its `maps` ((section, field): metadata.annotations)."""
        self._enter(call)
        with self._lock:
            node = self._node(name)
            for section, field in maps:
                self._merge(node.setdefault(section, {}).setdefault(field, {}), patch)
            return self._modified("nodes", node)

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Obj:
        return self._patch_node("patch_node_annotations", name, annotations, ("metadata", "annotations"))

    def patch_node_capacity(self, name: str, capacity: Mapping[str, str | None]) -> Obj:
        return self._patch_node(
            "patch_node_capacity", name, capacity, ("status", "capacity"), ("status", "allocatable")
        )

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """As BindingREST.setPodNodeAndMetadata (pkg/registry/core/pod/storage/storage.go): UID
        precondition, refusals as 409 Conflict (assignPod wraps them), annotations merged with nodeName."""
        self._enter("bind_pod")
        with self._lock:
            pod = self._pod(namespace, name)
            meta = pod["metadata"]
            if uid and meta.get("uid") != uid:
                raise Conflict(
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta.get('uid')}",
                    409,
                    "Conflict",
                )
            spec = pod.setdefault("spec", {})
            if meta.get("deletionTimestamp"):
                raise Conflict(f"pod {name} is being deleted, cannot be assigned to a host", 409, "Conflict")
            if spec.get("nodeName"):
                raise Conflict(f'pod {name} is already assigned to node "{spec["nodeName"]}"', 409, "Conflict")
            if spec.get("schedulingGates"):
                raise Conflict(f"pod {name} has non-empty .spec.schedulingGates", 409, "Conflict")
            spec["nodeName"] = node
            if annotations:
                meta.setdefault("annotations", {}).update(annotations)
            self.bindings.append((namespace, name, node))
            self._bump(pod)
            self._notify("pods", "MODIFIED", pod)

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """As the Eviction API with no budget in the way: the pod goes (a budget's 429 is a test's `fail`)."""
        self._enter("evict_pod")
        with self._lock:
            pod = self._pod(namespace, name)
            if uid and pod["metadata"].get("uid") != uid:
                raise Conflict(f"pod {namespace}/{name}: UID precondition failed: {uid}", 409, "Conflict")
            self.evictions.append((namespace, name))
        self.delete_pod(namespace, name)

    def create_event(self, pod: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal") -> None:
        self._enter("create_event")
        meta = pod.get("metadata") or {}
        with self._lock:
            self.events.append(
                {
                    "namespace": meta.get("namespace"),
                    "pod": meta.get("name"),
                    "reason": reason,
                    "message": message,
                    "type": event_type,
                }
            )

    def _watch(
        self, kind: str, pred: Callable[[Obj], bool], timeout_seconds: int, resource_version: str = ""
    ) -> Iterator[WatchEvent]:
        """Every change after `resource_version` (a list's), then each new one: the API server's watch cache
        replays what changed since that version (k8s.io/apiserver/pkg/storage/cacher, watchCache
        getAllEventsSinceLocked). The watch is open when this returns, not when it is first read."""
        q: queue.Queue[WatchEvent | None] = queue.Queue()
        with self._lock:
            since = int(resource_version) if resource_version.isdigit() else self._rv
            for rv, k, event_type, obj in self._history:
                if rv > since and k == kind and pred(obj):
                    q.put(WatchEvent(event_type, copy.deepcopy(obj)))
            self._watchers.append((kind, q, pred))
        return self._events(q, timeout_seconds)

    def _events(self, q: queue.Queue[WatchEvent | None], timeout_seconds: int) -> Iterator[WatchEvent]:
        deadline = time.monotonic() + timeout_seconds
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    ev = q.get(timeout=min(remaining, 0.5))
                except queue.Empty:
                    continue
                if ev is None:
                    return
                yield ev
        finally:
            with self._lock:
                self._watchers = [w for w in self._watchers if w[1] is not q]

    def watch_pods(
        self, resource_version: str, field_selector: str | None = None, timeout_seconds: int = 300, slim: bool = False
    ) -> Iterator[WatchEvent]:
        self._enter("watch_pods")  # `slim` allows fewer fields; whole pods are always allowed
        return self._watch("pods", lambda p: _match_fields(p, field_selector), timeout_seconds, resource_version)

    def watch_nodes(
        self, resource_version: str, label_selector: str | None = None, timeout_seconds: int = 300
    ) -> Iterator[WatchEvent]:
        self._enter("watch_nodes")
        return self._watch("nodes", lambda n: _match_labels(n, label_selector), timeout_seconds, resource_version)

    def list_path(self, path: str) -> ListResult:
        self._enter("list_path")
        with self._lock:
            return ListResult([copy.deepcopy(o) for o in self.objects[path].values()], str(self._rv))

    def watch_path(self, path: str, resource_version: str, timeout_seconds: int = 300) -> Iterator[WatchEvent]:
        self._enter("watch_path")
        return self._watch(path, lambda _: True, timeout_seconds, resource_version)

    def get_path(self, path: str) -> Obj:
        self._enter("get_path")
        collection, _, name = path.rpartition("/")
        namespace = ""
        if "/namespaces/" in collection:
            prefix, _, rest = collection.partition("/namespaces/")
            namespace, _, resource = rest.partition("/")
            collection = f"{prefix}/{resource}"
        with self._lock:
            obj = self.objects[collection].get((namespace, name))
            if obj is None:
                raise NotFound(f"{path} not found", 404, "NotFound")
            return copy.deepcopy(obj)
