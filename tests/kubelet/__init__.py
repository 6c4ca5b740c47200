"""A kubelet stand-in that speaks the real device plugin API v1beta1 and PodResources v1 over unix sockets.

It mirrors what upstream kubelet's device manager does (pkg/kubelet/cm/devicemanager/manager.go), where
that matters to a device plugin:

* Registration server on `<dir>/kubelet.sock`; on Register it dials `<dir>/<endpoint>` and runs ListAndWatch.
* Admission: the pod joins the pod manager (and so PodResources List) before its containers are allocated;
  pods are admitted one at a time; init containers first, then app containers; one Allocate per container
  asking for a resource; devices are chosen from healthy, unallocated ones, a regular init container's
  devices are reused by later containers (restartable "sidecar" init containers keep theirs); and the
  container's devices are recorded in podDevices (PodResources) only AFTER Allocate returns, as upstream.
* A failed Allocate rejects the pod and frees what it had taken.
* `restart()`: stop, delete the plugin sockets, recreate kubelet.sock, wait for the plugin to register again;
  allocations survive (upstream keeps them in its checkpoint).

Drive it directly (`admit(pod)`) in unit tests, or `run_with_kube()` to admit the pods a KubeClient shows
bound to its node, in an order a callable picks, and set them Running (the integration tier does this).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from share_core.contract import DEVICE_PLUGIN_API_VERSION, KUBELET_SOCKET_NAME, RESOURCE_MEM
from share_core.request import container_requests
from share_plugin.api import deviceplugin_v1beta1_pb2 as pb
from share_plugin.api import deviceplugin_v1beta1_pb2_grpc as pbgrpc
from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc

log = logging.getLogger("kubelet-standin")

Pod = Mapping[str, Any]
PodRef = tuple[str, str]


class AdmissionError(Exception):
    """kubelet rejected the pod (UnexpectedAdmissionError): Allocate failed; the message is the plugin's."""


@dataclass
class _PodEntry:
    ref: PodRef
    uid: str
    containers: list[str]  # every container name, init first
    devices: dict[str, list[str]] = field(default_factory=dict)  # podDevices: container -> our device IDs
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # container -> env from Allocate
    rejected: str = ""


class _Registration(pbgrpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        if request.version != DEVICE_PLUGIN_API_VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported device plugin API {request.version!r}")
        if request.resource_name != self.kubelet.resource:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected resource {request.resource_name!r}")
        self.kubelet._connect(request.endpoint)
        return pb.Empty()


class _PodResources(prgrpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self.kubelet = kubelet

    def List(
        self, request: prpb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> prpb.ListPodResourcesResponse:
        self.kubelet.pod_resources_calls += 1
        resp = prpb.ListPodResourcesResponse()
        with self.kubelet._lock:
            for entry in self.kubelet._pods.values():
                if entry.rejected and not self.kubelet.list_rejected:
                    continue
                pr = resp.pod_resources.add(name=entry.ref[1], namespace=entry.ref[0])
                for cname in entry.containers:
                    c = pr.containers.add(name=cname)
                    ids = entry.devices.get(cname)
                    if ids:
                        c.devices.add(resource_name=self.kubelet.resource, device_ids=ids)
        return resp

    def GetAllocatableResources(
        self, request: prpb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> prpb.AllocatableResourcesResponse:
        with self.kubelet._lock:
            ids = [i for i, h in self.kubelet.devices.items() if h == "Healthy"]
        resp = prpb.AllocatableResourcesResponse()
        resp.devices.add(resource_name=self.kubelet.resource, device_ids=ids)
        return resp

    def Get(self, request: prpb.GetPodResourcesRequest, context: grpc.ServicerContext) -> prpb.GetPodResourcesResponse:
        full = self.List(prpb.ListPodResourcesRequest(), context)
        for pr in full.pod_resources:
            if (pr.namespace, pr.name) == (request.pod_namespace, request.pod_name):
                return prpb.GetPodResourcesResponse(pod_resources=pr)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("unreachable")


class KubeletStandIn:
    def __init__(
        self,
        plugin_dir: str,
        pod_resources_socket: str,
        resource: str = RESOURCE_MEM,
        choose: Callable[[list[str], int], list[str]] | None = None,
        list_rejected: bool = False,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.resource = resource
        self.choose = choose or (lambda free, n: sorted(free)[:n])  # upstream takes sorted IDs
        self.list_rejected = list_rejected
        self._lock = threading.RLock()
        self._admit_lock = threading.Lock()  # kubelet admits one pod at a time
        self.devices: dict[str, str] = {}  # device ID -> health, from ListAndWatch
        self.updates = 0  # ListAndWatch messages received
        self.last_message_bytes = 0
        self.registrations = 0
        self.endpoint = ""
        self.pod_resources_calls = 0
        self._pods: dict[PodRef, _PodEntry] = {}
        self._changed = threading.Condition(self._lock)
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._stub: pbgrpc.DevicePluginStub | None = None
        self._law_thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET_NAME)

    def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.kubelet_socket)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-reg"))
        pbgrpc.add_RegistrationServicer_to_server(_Registration(self), self._server)
        self._server.add_insecure_port(f"unix://{self.kubelet_socket}")
        self._server.start()
        if self.pod_resources_socket:
            os.makedirs(os.path.dirname(self.pod_resources_socket), exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.pod_resources_socket)
            self._pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-pr"))
            prgrpc.add_PodResourcesListerServicer_to_server(_PodResources(self), self._pr_server)
            self._pr_server.add_insecure_port(f"unix://{self.pod_resources_socket}")
            self._pr_server.start()

    def stop(self) -> None:
        self._stop.set()
        self._disconnect()
        for srv in (self._server, self._pr_server):
            if srv is not None:
                srv.stop(grace=0).wait(2)
        self._server = self._pr_server = None
        for path in (self.kubelet_socket, self.pod_resources_socket):
            with contextlib.suppress(FileNotFoundError, TypeError):
                os.unlink(path)

    def restart(self, timeout: float = 10.0) -> float:
        """Simulate a kubelet restart; returns seconds until the plugin registered again."""
        before = self.registrations
        self.stop()
        for name in os.listdir(self.plugin_dir):
            if name != KUBELET_SOCKET_NAME and name.endswith(".sock"):
                os.unlink(os.path.join(self.plugin_dir, name))  # as kubelet does on start
        with self._lock:
            self.devices = {}
        self._stop = threading.Event()
        t0 = time.monotonic()
        self.start()
        self.wait_for(lambda: self.registrations > before and bool(self.devices), timeout, "re-registration")
        return time.monotonic() - t0

    def _connect(self, endpoint: str) -> None:
        self._disconnect()
        self.endpoint = endpoint
        path = os.path.join(self.plugin_dir, endpoint)
        self._channel = grpc.insecure_channel(f"unix://{path}")
        self._stub = pbgrpc.DevicePluginStub(self._channel)
        self._stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        stream = self._stub.ListAndWatch(pb.Empty())
        self._law_thread = threading.Thread(target=self._list_and_watch, args=(stream,), daemon=True)
        self._law_thread.start()
        with self._lock:
            self.registrations += 1
            self._changed.notify_all()

    def _disconnect(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def _list_and_watch(self, stream: Iterable[pb.ListAndWatchResponse]) -> None:
        try:
            for resp in stream:
                with self._lock:
                    self.devices = {d.ID: d.health for d in resp.devices}
                    self.updates += 1
                    self.last_message_bytes = resp.ByteSize()
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            if not self._stop.is_set():
                log.info("ListAndWatch ended: %s", exc.code())

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"kubelet stand-in: timed out waiting for {what}")
                self._changed.wait(min(left, 0.1))

    def healthy_devices(self) -> list[str]:
        with self._lock:
            return [i for i, h in self.devices.items() if h == "Healthy"]

    # -- admission (the device manager part of kubelet) ---------------------------------------------

    def _in_use(self) -> set[str]:
        return {i for e in self._pods.values() if not e.rejected for ids in e.devices.values() for i in ids}

    def admit(self, pod: Pod) -> dict[str, dict[str, str]]:
        """Admit one pod: Allocate for each container asking for the resource. Returns container -> env.

        Raises AdmissionError (pod rejected, its devices freed) when the plugin fails an Allocate.
        """
        with self._admit_lock:
            meta = pod.get("metadata") or {}
            ref = (meta.get("namespace") or "default", meta.get("name") or "")
            spec = pod.get("spec") or {}
            init_names = [c["name"] for c in spec.get("initContainers") or []]
            sidecars = {c["name"] for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
            with self._lock:
                entry = self._pods.get(ref)
                if entry is None or entry.rejected:
                    entry = _PodEntry(
                        ref, meta.get("uid", ""), init_names + [c["name"] for c in spec.get("containers") or []]
                    )
                    self._pods[ref] = entry  # in the pod manager (and PodResources) before admission
            reuse: set[str] = set()
            for creq in container_requests(pod):
                if creq.units == 0 or creq.name in entry.devices:
                    continue
                with self._lock:
                    healthy = {i for i, h in self.devices.items() if h == "Healthy"}
                    take = sorted(reuse)[: creq.units]
                    free = sorted(healthy - self._in_use() - set(take))
                    if len(take) + len(free) < creq.units:
                        self._reject(entry, f"OutOf{self.resource}: {creq.name} needs {creq.units}, {len(free)} free")
                        raise AdmissionError(entry.rejected)
                    take += self.choose(free, creq.units - len(take))
                if self._stub is None:
                    self._reject(entry, f"no device plugin registered for {self.resource}")
                    raise AdmissionError(entry.rejected)
                try:
                    resp = self._stub.Allocate(
                        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=take)]),
                        timeout=30,
                    )
                except grpc.RpcError as exc:
                    self._reject(entry, f"Allocate failed for container {creq.name!r}: {exc.details()}")
                    raise AdmissionError(entry.rejected) from exc
                with self._lock:  # recorded only after Allocate returned, as upstream
                    entry.devices[creq.name] = list(take)
                    entry.env[creq.name] = dict(resp.container_responses[0].envs)
                    self._changed.notify_all()
                if creq.name in init_names and creq.name not in sidecars:
                    reuse |= set(take)
                else:
                    reuse -= set(take)
            return dict(entry.env)

    def _reject(self, entry: _PodEntry, why: str) -> None:
        with self._lock:
            entry.rejected = why
            entry.devices.clear()

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod finished or was deleted: its devices are free again."""
        with self._lock:
            self._pods.pop((namespace, name), None)

    def envs(self) -> dict[PodRef, dict[str, dict[str, str]]]:
        with self._lock:
            return {ref: dict(e.env) for ref, e in self._pods.items() if not e.rejected}

    def pod_devices(self) -> dict[PodRef, dict[str, list[str]]]:
        with self._lock:
            return {ref: dict(e.devices) for ref, e in self._pods.items() if not e.rejected}

    # -- driven by the API server -------------------------------------------------------------------

    def run_with_kube(
        self,
        kube: Any,
        node: str,
        order: Callable[[list[Pod]], list[Pod]] | None = None,
        interval: float = 0.2,
        stop: threading.Event | None = None,
    ) -> threading.Thread:
        """Admit pods bound to `node` as they appear (each batch reordered by `order`) and set them
        Running, or Failed when admission is rejected. Returns the (daemon) thread."""
        stop = stop or self._stop
        seen: set[str] = set()

        def loop() -> None:
            while not stop.is_set():
                try:
                    pods = kube.list_pods(field_selector=f"spec.nodeName={node}").items
                except Exception as exc:
                    log.warning("kubelet stand-in: listing pods failed: %s", exc)
                    stop.wait(interval)
                    continue
                batch = [
                    p
                    for p in pods
                    if p["metadata"].get("uid") not in seen
                    and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                ]
                for p in order(batch) if order else batch:
                    seen.add(p["metadata"].get("uid"))
                    try:
                        self.admit(p)
                        phase = "Running"
                    except AdmissionError as exc:
                        log.warning("kubelet stand-in: pod %s rejected: %s", p["metadata"]["name"], exc)
                        phase = "Failed"
                    set_pod_phase(kube, p["metadata"].get("namespace", "default"), p["metadata"]["name"], phase)
                stop.wait(interval)

        t = threading.Thread(target=loop, name="kubelet-standin", daemon=True)
        t.start()
        return t


def set_pod_phase(kube: Any, namespace: str, name: str, phase: str) -> None:
    """Set a pod's phase: FakeKube directly, a real API server through the status subresource."""
    if hasattr(kube, "set_pod_phase"):
        kube.set_pod_phase(namespace, name, phase)
        return
    kube.request(  # ApiServerClient: KubeClient has no status write, and only kubelet needs one
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        body={"status": {"phase": phase}},
        content_type="application/merge-patch+json",
    )
