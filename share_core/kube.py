"""The one adapter over the Kubernetes API that every gpushare program uses.

`KubeClient` is the small interface the rest of the code depends on; `ApiServerClient` speaks to a
real API server (configuration loaded by the `kubernetes` package: kubeconfig or in-cluster), and
`share_core.fake.FakeKube` is the in-memory stand-in for unit tests. Objects are plain dicts in the
API's JSON form, so the same code reads a pod from the API server, from a watch, or from kube-scheduler.

One piece: it is the one place that knows the API's wire behaviour (errors by status, paging, watches in
JSON and protobuf, token refresh, kept-open connections); the interface and its only real implementation
change together.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from typing import Protocol
from urllib.parse import quote
from urllib.parse import urlencode

import orjson
import urllib3

from share_core import kubeproto
from share_core.httpconn import ConnectionPool
from share_core.httpconn import TransportError

log = logging.getLogger(__name__)

Obj = dict[str, Any]

DEFAULT_TIMEOUT = 10.0  # seconds for one ordinary request; a hung API server must not hang us
AUTH_REFRESH_S = 10.0  # seconds a bearer token is reused before the kubernetes client is asked again


class KubeError(Exception):
    """An API call failed. `status` is the HTTP status, or None when the server was not reached."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409: the object changed since we read it (optimistic concurrency), or already exists."""


class Gone(KubeError):
    """410: the watch's resourceVersion is too old; re-list."""


class Forbidden(KubeError):
    pass


class Unavailable(KubeError):
    """The API server could not be reached, timed out, or answered 5xx/429: worth retrying later."""


def error_for_status(status: int, body: bytes, what: str) -> KubeError:
    message, reason = body.decode(errors="replace")[:500], ""
    try:
        st = orjson.loads(body)
        if isinstance(st, dict):
            message, reason = st.get("message", message), st.get("reason", "")
    except orjson.JSONDecodeError:
        pass
    text = f"{what}: HTTP {status}: {message}"
    cls: type[KubeError] = KubeError
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 410:
        cls = Gone
    elif status == 403:
        cls = Forbidden
    elif status == 429 or status >= 500:
        cls = Unavailable
    return cls(text, status, reason)


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[Obj]
    resource_version: str


class Pages:
    """A list read page by page: iterate for the pages (lists of objects); `resource_version` is the
    list's once the last page was read. The API server client fetches the next page while the caller
    works on the current one, so a 40,000-pod list costs the slower of the two, not their sum, and only
    two pages of raw objects are alive at a time."""

    def __init__(self, fetch: Callable[[str | None], Obj] | None = None, items: list[Obj] | None = None,
                 resource_version: str = "") -> None:  # fmt: skip
        self._fetch = fetch  # continue token -> page (a List object); None: `items` is the whole list
        self._items = items
        self.resource_version = "" if fetch is not None else resource_version
        self.count = 0

    def __iter__(self) -> Iterator[list[Obj]]:
        if self._fetch is None:
            self.count = len(self._items or [])
            yield list(self._items or [])
            return
        fetch = self._fetch
        ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
        stop = threading.Event()

        def put(item: tuple[str, Any]) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.5)
                    return True
                except queue.Full:
                    continue
            return False

        def fetcher() -> None:
            cont: str | None = None
            try:
                while True:
                    page = fetch(cont)
                    meta = page.get("metadata") or {}
                    if not put(("page", page)):
                        return
                    cont = meta.get("continue")
                    if not cont:
                        put(("end", None))
                        return
            except BaseException as exc:  # handed to the consumer's thread
                put(("error", exc))

        threading.Thread(target=fetcher, name="gpushare-list-prefetch", daemon=True).start()
        try:
            while True:
                kind, value = ready.get()
                if kind == "error":
                    raise value
                if kind == "end":
                    return
                items = value.get("items") or []
                self.count += len(items)
                self.resource_version = (value.get("metadata") or {}).get("resourceVersion", "")
                yield items
        finally:
            stop.set()


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Obj


class KubeClient(Protocol):
    """What gpushare needs from the API server, and nothing more."""

    def list_nodes(self, label_selector: str | None = None) -> ListResult: ...

    def list_pods(self, field_selector: str | None = None, label_selector: str | None = None) -> ListResult: ...

    def pod_pages(self) -> Pages:
        """Every pod, page by page (the extender's first sync of a large cluster)."""
        ...

    def get_node(self, name: str) -> Obj: ...

    def get_pod(self, namespace: str, name: str) -> Obj: ...

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        """Merge-patch annotations (None deletes a key). With `resource_version`, fail with Conflict
        if the pod changed since it was read: the patch is then all-or-nothing against that version."""
        ...

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Obj: ...

    def patch_node_capacity(self, name: str, capacity: Mapping[str, str | None]) -> Obj:
        """Set `status.capacity` and `status.allocatable` entries (status subresource); None removes one."""
        ...

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None: ...

    def create_event(self, pod: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal") -> None: ...

    def add_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> Obj:
        """Set one `status.conditions` entry (merged by its type, as the status subresource's strategic
        merge patch does): how kube-scheduler marks a victim DisruptionTarget before deleting it."""
        ...

    def remove_pod(self, namespace: str, name: str, uid: str) -> None:
        """DELETE the pod (graceful, its own grace period) if it is still the pod of `uid`: NotFound when it
        is gone, Conflict when that name is another pod now."""

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """Evict through the Eviction API (policy/v1), which honours the pod's PodDisruptionBudgets: a
        budget that allows no disruption now is refused with 429 (Unavailable, status 429); with `uid`,
        only that pod (Conflict if the name now belongs to another)."""
        ...

    def watch_pods(
        self, resource_version: str, field_selector: str | None = None, timeout_seconds: int = 300, slim: bool = False
    ) -> Iterator[WatchEvent]:
        """`slim`: the events' pods may hold only what share_scheduler's cache reads (see
        share_core.kubeproto.slim_pod); the API server client then watches in protobuf."""
        ...

    def watch_nodes(
        self, resource_version: str, label_selector: str | None = None, timeout_seconds: int = 300
    ) -> Iterator[WatchEvent]: ...

    def list_path(self, path: str) -> ListResult:
        """Every object of a collection by its API path (e.g. `/apis/resource.k8s.io/v1/resourceslices`)."""
        ...

    def watch_path(self, path: str, resource_version: str, timeout_seconds: int = 300) -> Iterator[WatchEvent]: ...

    def get_path(self, path: str) -> Obj: ...


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A `kubernetes.client.Configuration`: from the kubeconfig if given, else in-cluster, else ~/.kube/config."""
    from kubernetes import client
    from kubernetes import config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        return cfg
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(context=context, client_configuration=cfg)
    return cfg


def _ssl_context(configuration: Any) -> ssl.SSLContext:
    """The TLS settings urllib3 is given (CA, client certificate, verification), as an SSLContext."""
    if configuration.verify_ssl:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context


def binding_json(namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None) -> Obj:
    """The JSON Binding: for an API server that takes no protobuf, and the bench's comparison."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiServerClient:
    """`KubeClient` over HTTPS; the `kubernetes` package supplies credentials only.

    Raw JSON in and out (orjson) keeps list and watch cheap at 50,000 pods, and avoids the
    generated client's known failure deserialising a Binding response after a successful bind.
    Requests are sent on kept-alive connections of our own (share_core.httpconn: a bind costs a
    quarter of the CPU it costs through urllib3); watches stream through urllib3.
    """

    def __init__(
        self,
        configuration: Any,
        component: str = "gpushare",
        timeout: float = DEFAULT_TIMEOUT,
        page_size: int = 500,
        max_connections: int = 16,
        protobuf_binding: bool = True,
    ) -> None:
        self._cfg = configuration
        # Bindings go as protobuf (less API server CPU per bind than JSON) until a server refuses it (415).
        self.protobuf_binding = protobuf_binding
        self.component = component
        self.timeout = timeout
        self.page_size = page_size
        self.host = configuration.host.rstrip("/")
        self._lock = threading.Lock()
        self._clock = time.monotonic
        self._auth: str | None = None
        self._auth_until = float("-inf")
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=max_connections,  # kept open per host; more callers at once open (TLS) and drop extras
            cert_reqs=ssl.CERT_REQUIRED if configuration.verify_ssl else ssl.CERT_NONE,
            ca_certs=configuration.ssl_ca_cert,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
            retries=False,
            server_hostname=getattr(configuration, "tls_server_name", None) or None,
        )
        self._conns = ConnectionPool(
            self.host,
            ssl_context=(lambda: _ssl_context(configuration)) if self.host.startswith("https:") else None,
            server_hostname=getattr(configuration, "tls_server_name", None) or None,
            max_idle=max_connections,
        )

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None = None, context: str | None = None, component: str = "gpushare", **kw: Any
    ) -> ApiServerClient:
        return cls(load_configuration(kubeconfig, context), component=component, **kw)

    # -- transport -------------------------------------------------------------------------------

    def _headers(self, content_type: str | None = None, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": f"{self.component}/gpushare"}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._authorization()
        if token:
            headers["Authorization"] = token
        return headers

    def _authorization(self) -> str | None:
        """The bearer token, asked of the kubernetes client at most every AUTH_REFRESH_S seconds.

        Its refresh hook (in-cluster service account and kubeconfig tokens) reloads the whole
        configuration on each call, twice per request here: 80-85 us of CPU on a quiet machine, 0.3 ms
        on a busy one, where a whole bind costs the client ~0.28 ms (measured; docs/policies.md "How the
        policy meets kube-scheduler"). The in-cluster loader re-reads a rotated token once a minute
        anyway; a 401 asks again at once (_open)."""
        now = self._clock()
        with self._lock:
            if now < self._auth_until:
                return self._auth
            hook = getattr(self._cfg, "refresh_api_key_hook", None)
            if hook is not None:
                hook(self._cfg)
            # The kubernetes client stores a bearer token (in-cluster service account, kubeconfig
            # token) under "BearerToken" (client >= 29); older ones and hand-made configs use
            # "authorization".
            token = self._cfg.get_api_key_with_prefix("BearerToken") or self._cfg.get_api_key_with_prefix(
                "authorization"
            )
            self._auth, self._auth_until = token or None, now + AUTH_REFRESH_S
            return self._auth

    def _unauthorized(self) -> None:
        with self._lock:
            self._auth_until = float("-inf")  # a rotated or revoked token: ask the client again

    def _open(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] | None = None,
        stream: bool = False,
        accept: str = "application/json",
    ) -> Any:
        """The answer (`.status`, `.data`; a stream's is read with `.stream()`); raises KubeError.
        A `body` given as bytes is sent as it is (with its `content_type`), anything else as JSON."""
        target = path
        if query:
            target += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = body if isinstance(body, bytes) else orjson.dumps(body) if body is not None else None
        t = timeout if timeout is not None else self.timeout
        headers = self._headers(content_type or ("application/json" if data is not None else None), accept)
        what = f"{method} {path}"
        if not stream:
            try:
                answer = self._conns.request(method, target, data, headers, t[1] if isinstance(t, tuple) else t)
            except TransportError as exc:
                raise Unavailable(f"{what}: API server unreachable or timed out: {exc}") from exc
            if answer.status >= 300:
                if answer.status == 401:
                    self._unauthorized()
                raise error_for_status(answer.status, answer.data, what)
            return answer
        to = urllib3.Timeout(connect=t[0], read=t[1]) if isinstance(t, tuple) else urllib3.Timeout(total=t)
        try:
            resp = self._pool.request(
                method,
                self.host + target,
                body=data,
                headers=headers,
                timeout=to,
                preload_content=False,
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"{what}: API server unreachable or timed out: {exc}") from exc
        if resp.status >= 300:
            if resp.status == 401:
                self._unauthorized()
            raise error_for_status(resp.status, resp.read(), what)
        return resp

    def _json(self, method: str, path: str, **kw: Any) -> Obj:
        resp = self._open(method, path, **kw)
        try:
            return orjson.loads(resp.data) if resp.data else {}
        except orjson.JSONDecodeError as exc:
            raise KubeError(f"{method} {path}: response is not JSON: {exc}") from exc

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> Obj:
        """Any API call the KubeClient interface does not name (tests, tools, a kubelet stand-in):
        same credentials, timeouts and typed errors; the JSON answer, or {} when there is none."""
        return self._json(method, path, body=body, query=query, content_type=content_type)

    def pod_log(self, namespace: str, name: str, container: str | None = None, tail_lines: int | None = None) -> str:
        """A container's log through the API server (`pods/log`, served by the node's kubelet)."""
        query = {"container": container, "tailLines": tail_lines}
        return self._open(
            "GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/log", query=query
        ).data.decode(errors="replace")

    def _list(self, path: str, query: dict[str, Any]) -> ListResult:
        items: list[Obj] = []
        cont: str | None = None
        while True:
            page = self._json("GET", path, query={**query, "limit": self.page_size, "continue": cont})
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return ListResult(items, meta.get("resourceVersion", ""))

    def _watch(
        self, path: str, query: dict[str, Any], timeout_seconds: int, protobuf: bool = False
    ) -> Iterator[WatchEvent]:
        q = {**query, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": timeout_seconds}
        accept = kubeproto.WATCH_CONTENT_TYPE if protobuf else "application/json"
        if protobuf:
            kubeproto.prepare()  # build the decoders now, not on the first event (a burst's first pod)
        resp = self._open(
            "GET", path, query=q, timeout=(self.timeout, timeout_seconds + 30), stream=True, accept=accept
        )
        try:
            # A server that cannot answer in protobuf answers in JSON (content negotiation).
            if protobuf and (resp.headers.get("Content-Type") or "").startswith("application/vnd.kubernetes.protobuf"):
                yield from self._protobuf_events(path, resp)
                return
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                if b"\n" not in chunk:
                    buf += chunk
                    continue
                # One split per chunk: a burst brings dozens of events per read, and splitting off one
                # line at a time would copy the rest of the chunk again for each.
                *lines, buf = (buf + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    ev = orjson.loads(line)
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        raise error_for_status(int(obj.get("code") or 500), orjson.dumps(obj), f"watch {path}")
                    yield WatchEvent(ev.get("type", ""), obj)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"watch {path}: connection lost: {exc}") from exc
        finally:
            resp.release_conn()

    @staticmethod
    def _protobuf_events(path: str, resp: Any) -> Iterator[WatchEvent]:
        """Length-prefixed protobuf frames, each a WatchEvent: slim pods (share_core.kubeproto)."""
        buf = b""
        for chunk in resp.stream(65536, decode_content=True):
            frames, buf = kubeproto.split_frames(buf + chunk if buf else chunk)
            for frame in frames:
                try:
                    kind, obj = kubeproto.decode_watch_event(frame)
                except ValueError as exc:
                    raise KubeError(f"watch {path}: {exc}") from exc
                if kind == "ERROR":
                    raise error_for_status(int(obj.get("code") or 500), orjson.dumps(obj), f"watch {path}")
                yield WatchEvent(kind, obj)

    # -- KubeClient ------------------------------------------------------------------------------

    def list_nodes(self, label_selector: str | None = None) -> ListResult:
        return self._list("/api/v1/nodes", {"labelSelector": label_selector})

    def list_pods(self, field_selector: str | None = None, label_selector: str | None = None) -> ListResult:
        return self._list("/api/v1/pods", {"fieldSelector": field_selector, "labelSelector": label_selector})

    def pod_pages(self, page_size: int = 1000) -> Pages:
        def fetch(cont: str | None) -> Obj:
            return self._json("GET", "/api/v1/pods", query={"limit": page_size, "continue": cont})

        return Pages(fetch)

    def get_node(self, name: str) -> Obj:
        return self._json("GET", f"/api/v1/nodes/{quote(name)}")

    def get_pod(self, namespace: str, name: str) -> Obj:
        return self._json("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        meta: Obj = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return self._json(
            "PATCH",
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
            body={"metadata": meta},
            content_type="application/merge-patch+json",
        )

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Obj:
        return self._json(
            "PATCH",
            f"/api/v1/nodes/{quote(name)}",
            body={"metadata": {"annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
        )

    def patch_node_capacity(self, name: str, capacity: Mapping[str, str | None]) -> Obj:
        return self._json(
            "PATCH",
            f"/api/v1/nodes/{quote(name)}/status",
            body={"status": {"capacity": dict(capacity), "allocatable": dict(capacity)}},
            content_type="application/merge-patch+json",
        )

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """Create the pod's Binding; `annotations` land on the pod in the same write.

        The API server merges a Binding's metadata.annotations into the pod atomically with
        spec.nodeName, under the UID precondition (pkg/registry/core/pod/storage/storage.go,
        BindingREST.setPodNodeAndMetadata); a pod already bound, being deleted, gated, or of another
        UID is refused with 409 Conflict, a missing one with 404."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding"
        # The response is a Status, not a Binding: read nothing from it (it comes as JSON: Accept).
        if self.protobuf_binding:
            body = kubeproto.binding_body(namespace, name, uid, node, annotations)
            try:
                self._open("POST", path, body=body, content_type=kubeproto.CONTENT_TYPE)
                return
            except KubeError as exc:
                if exc.status != 415:
                    raise
                log.warning("%s: the API server refuses protobuf (%s); binding in JSON from now on", path, exc)
                self.protobuf_binding = False
        self._open("POST", path, body=binding_json(namespace, name, uid, node, annotations))

    def create_event(self, pod: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal") -> None:
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace", "default")
        now = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'pod')}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._json("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=body)

    def add_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> Obj:
        return self._json(
            "PATCH",
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/status",
            body={"status": {"conditions": [dict(condition)]}},
            content_type="application/strategic-merge-patch+json",
        )

    def remove_pod(self, namespace: str, name: str, uid: str) -> None:
        self._json(
            "DELETE",
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
            body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}},
        )

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """POST pods/eviction: the API server checks the pod's PodDisruptionBudgets and deletes it gracefully
        (pkg/registry/core/pod/storage/eviction.go); 429 when a budget refuses, 404 when it is gone."""
        body: Obj = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        self._open("POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/eviction", body=body)

    def watch_pods(
        self, resource_version: str, field_selector: str | None = None, timeout_seconds: int = 300, slim: bool = False
    ) -> Iterator[WatchEvent]:
        """With `slim`, in protobuf: the API server then shares the encoding of each event with
        kube-scheduler's own (protobuf) watch instead of encoding it again in JSON for us, and only
        what the cache reads is decoded (share_core.kubeproto)."""
        query = {"resourceVersion": resource_version, "fieldSelector": field_selector}
        return self._watch("/api/v1/pods", query, timeout_seconds, protobuf=slim)

    def watch_nodes(
        self, resource_version: str, label_selector: str | None = None, timeout_seconds: int = 300
    ) -> Iterator[WatchEvent]:
        return self._watch(
            "/api/v1/nodes", {"resourceVersion": resource_version, "labelSelector": label_selector}, timeout_seconds
        )

    def list_path(self, path: str) -> ListResult:
        return self._list(path, {})

    def watch_path(self, path: str, resource_version: str, timeout_seconds: int = 300) -> Iterator[WatchEvent]:
        return self._watch(path, {"resourceVersion": resource_version}, timeout_seconds)

    def get_path(self, path: str) -> Obj:
        return self._json("GET", path)
