"""kubelet's device manager for one extended resource, mirroring k8s.io/kubernetes v1.36.3
pkg/kubelet/cm/devicemanager (manager.go, pod_devices.go, plugin/v1beta1/{server,handler,client}.go).

Each method names the upstream function it mirrors. What is left out: NUMA alignment (no topology manager
policy: every device is "noAffinity"; NUMA nodes are only recorded and reported), DRA-backed extended
resources, CDI/mounts/device nodes (only env is kept), more than one resource, ResourceHealthStatus.

One piece: it mirrors one upstream package function for function, so a reader can hold both side by side.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import grpc

from share_core.contract import DEVICE_PLUGIN_API_VERSION
from share_core.request import parse_units
from share_plugin.api import deviceplugin_v1beta1_pb2 as pb
from share_plugin.api import deviceplugin_v1beta1_pb2_grpc as pbgrpc

log = logging.getLogger("kubelet-standin")

Pod = Mapping[str, Any]
Container = Mapping[str, Any]

HEALTHY = "Healthy"
ENDPOINT_STOP_GRACE = 300.0  # types.go endpointStopGracePeriod (5 minutes)

# grpc-go's codes.Code.String(), for error text as kubelet logs and returns it ("rpc error: code = ... desc = ...")
_GO_CODE = {grpc.StatusCode.CANCELLED: "Canceled"}


class DeviceManagerError(Exception):
    """An error the device manager returns; the text is upstream's."""


def go_rpc_error(exc: grpc.RpcError) -> str:
    """status.Error(...).Error() of grpc-go: how kubelet words a failed RPC to a device plugin."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    name = _GO_CODE.get(code) or "".join(part.capitalize() for part in code.name.split("_"))
    if code == grpc.StatusCode.OK:
        name = "OK"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"rpc error: code = {name} desc = {details}"


def pod_uid(pod: Pod) -> str:
    """The pod's UID; a pod without one (hand-written in a test) is named by namespace/name instead."""
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}")


def init_containers(pod: Pod) -> list[Container]:
    return list((pod.get("spec") or {}).get("initContainers") or [])


def app_containers(pod: Pod) -> list[Container]:
    return list((pod.get("spec") or {}).get("containers") or [])


def is_restartable_init(container: Container) -> bool:
    """pkg/api/v1/pod podutil.IsRestartableInitContainer: a "sidecar" (restartPolicy Always)."""
    return container.get("restartPolicy") == "Always"


def limit(container: Container, resource: str) -> int | None:
    """container.Resources.Limits[resource] as a count, None when the limit is not set at all."""
    limits = (container.get("resources") or {}).get("limits") or {}
    if resource not in limits:
        return None
    return parse_units(limits[resource], f"container {container.get('name')!r} limits[{resource}]")


def effective_request(pod: Pod, resource: str) -> int:
    """The pod's request as the scheduler framework computes it (resourcehelper.PodRequests): the larger of
    sum(app containers) + sidecars and each regular init container plus the sidecars started before it."""
    sidecars = 0
    peak = 0
    for c in init_containers(pod):
        units = limit(c, resource) or 0
        if is_restartable_init(c):
            sidecars += units
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + units)
    app = sum(limit(c, resource) or 0 for c in app_containers(pod))
    return max(app + sidecars, peak)


@dataclass(frozen=True)
class ContainerAllocation:
    """pod_devices.go deviceAllocateInfo: the device IDs and the plugin's answer (only env is kept)."""

    devices: tuple[str, ...]
    env: Mapping[str, str]
    numa: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # device -> NUMA nodes (DevicesPerNUMA)


@dataclass(frozen=True)
class AllocateCall:
    """One Allocate RPC the device manager made (for tests: "no Allocate was made for ...")."""

    pod_uid: str
    container: str
    devices: tuple[str, ...]
    ok: bool


PodDevices = dict[str, dict[str, ContainerAllocation]]  # pod_devices.go podDevices: pod UID -> container -> devices


@dataclass
class Checkpoint:
    """checkpoint/checkpoint.go Data: podDevices and the resources registered (healthyDevices' keys)."""

    pod_devices: PodDevices = field(default_factory=dict)
    registered: bool = False


def _copy_pod_devices(pd: PodDevices) -> PodDevices:
    return {uid: dict(containers) for uid, containers in pd.items()}


class _Registration(pbgrpc.RegistrationServicer):
    def __init__(self, dm: DeviceManager) -> None:
        self.dm = dm

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        """plugin/v1beta1/server.go Register: version check, resource name check, then connectClient."""
        if request.version != DEVICE_PLUGIN_API_VERSION:
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported version is {DEVICE_PLUGIN_API_VERSION!r}",
            )
        if request.resource_name != self.dm.resource:
            # upstream accepts any extended resource name; this stand-in manages exactly one
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"kubelet stand-in manages {self.dm.resource!r} only, not {request.resource_name!r}",
            )
        try:
            self.dm.connect(request.endpoint)
        except DeviceManagerError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return pb.Empty()


class DeviceManager:
    """manager.go ManagerImpl, for `resource`. State is guarded by `lock` (the kubelet's), held as upstream
    holds m.mutex; RPCs to the plugin are made without it, as upstream, so the plugin may call PodResources."""

    def __init__(
        self,
        plugin_dir: str,
        resource: str,
        lock: threading.RLock,
        changed: threading.Condition,
        active_pods: Callable[[], set[str]],
        sources_ready: Callable[[], bool],
        container_running: Callable[[str, str], bool],
        choose: Callable[[list[str], int], list[str]] | None = None,
        endpoint_stop_grace: float = ENDPOINT_STOP_GRACE,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.lock = lock
        self.changed = changed
        self.active_pods = active_pods  # ActivePodsFunc (kubelet.GetActivePods), as pod UIDs
        self.sources_ready = sources_ready  # config.SourcesReady.AllReady
        self.container_running = container_running  # isContainerAlreadyRunning over the runtime's list at Start
        # Upstream iterates Go sets (random order); the default takes sorted IDs so runs are reproducible.
        self.choose = choose or (lambda free, n: sorted(free)[:n])
        self.endpoint_stop_grace = endpoint_stop_grace
        # genericDeviceUpdateCallback's allDevices / healthyDevices; `registered` is "resource in healthyDevices
        # (and endpoints)", which upstream keeps in step.
        self.devices: dict[str, str] = {}
        self.topology: dict[str, tuple[int, ...]] = {}  # allDevices' Topology: device -> NUMA node IDs
        self.healthy: set[str] = set()
        self.registered = False
        self.endpoint = ""  # the plugin's socket name, from Register
        self.options: pb.DevicePluginOptions | None = None  # None: endpoint restored from the checkpoint
        self.stopped_at: float | None = None  # endpointImpl.stopTime
        self.pod_devices: PodDevices = {}
        self.allocated: set[str] | None = None  # allocatedDevices[resource]; None: no such key
        self.devices_to_reuse: dict[str, set[str]] = {}
        self.checkpoint = Checkpoint()
        self.registrations = 0
        self.updates = 0
        self.last_message_bytes = 0
        self.allocate_calls: list[AllocateCall] = []
        # (pod uid, container) -> the plugin's whole answer (mounts, CDI devices: kubelet hands them to the runtime)
        self.responses: dict[tuple[str, str], pb.ContainerAllocateResponse] = {}
        self._channel: grpc.Channel | None = None
        self._stub: pbgrpc.DevicePluginStub | None = None
        self._generation = 0
        self._server: grpc.Server | None = None

    # -- registration server (plugin/v1beta1/server.go) ------------------------------------------------

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, "kubelet.sock")

    def cleanup_plugin_directory(self) -> None:
        """manager.go CleanupPluginDirectory: remove every socket in the directory (kubelet.sock included)."""
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.stat(path).st_mode):
                    os.unlink(path)

    def start_server(self) -> None:
        """plugin/v1beta1/server.go Start: make the directory, clean it up, serve Registration on kubelet.sock."""
        from concurrent import futures

        os.makedirs(self.plugin_dir, exist_ok=True)
        self.cleanup_plugin_directory()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-reg"))
        pbgrpc.add_RegistrationServicer_to_server(_Registration(self), self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()

    def stop_server(self) -> None:
        """The kubelet process ends: the registration server and the plugin connection go with it."""
        with self.lock:
            self._generation += 1  # the ListAndWatch stream ending now is no disconnect the state would see
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()
        if self._server is not None:
            self._server.stop(grace=0).wait(2)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def connect(self, endpoint: str) -> None:
        """handler.go connectClient + client.go Connect + manager.go PluginConnected, then runClient."""
        path = os.path.join(self.plugin_dir, endpoint)
        channel = grpc.insecure_channel(f"unix://{path}")
        stub = pbgrpc.DevicePluginStub(channel)
        try:
            grpc.channel_ready_future(channel).result(timeout=10)  # dial: WithBlock, 10 s
        except grpc.FutureTimeoutError as exc:
            channel.close()
            raise DeviceManagerError(f"failed to dial device plugin: context deadline exceeded ({path})") from exc
        try:
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
        except grpc.RpcError as exc:
            channel.close()
            raise DeviceManagerError(f"failed to get device plugin options: {go_rpc_error(exc)}") from exc
        with self.lock:
            old, self._channel, self._stub = self._channel, channel, stub
            self._generation += 1
            generation = self._generation
            self.endpoint = endpoint
            self.options = options
            self.stopped_at = None
            self.registrations += 1
            self.changed.notify_all()
        if old is not None:
            old.close()
        stream = stub.ListAndWatch(pb.Empty())
        threading.Thread(target=self._run_client, args=(stream, generation), name="kubelet-law", daemon=True).start()

    def _run_client(self, stream: Iterable[pb.ListAndWatchResponse], generation: int) -> None:
        """client.go Run (ListAndWatch into PluginListAndWatchReceiver); when it ends, handler.go runClient
        disconnects: PluginDisconnected."""
        try:
            for resp in stream:
                with self.lock:
                    if generation != self._generation:
                        return
                    self.updates += 1
                    self.last_message_bytes = resp.ByteSize()
                self.generic_device_update_callback(resp.devices)
        except grpc.RpcError as exc:
            log.info("ListAndWatch ended unexpectedly for device plugin %s: %s", self.resource, exc.code())
        with self.lock:
            if generation == self._generation:
                self.plugin_disconnected()

    def generic_device_update_callback(self, devices: Iterable[pb.Device]) -> None:
        """manager.go genericDeviceUpdateCallback: replace the device sets, then writeCheckpoint."""
        with self.lock:
            devices = list(devices)
            self.devices = {d.ID: d.health for d in devices}
            self.topology = {d.ID: tuple(n.ID for n in d.topology.nodes) for d in devices if d.HasField("topology")}
            self.healthy = {i for i, h in self.devices.items() if h == HEALTHY}
            self.registered = True
            self.changed.notify_all()
        self.write_checkpoint()

    def plugin_disconnected(self) -> None:
        """manager.go PluginDisconnected: markResourceUnhealthy (no healthy device left), endpoint stopTime."""
        with self.lock:
            if self.registered:
                self.healthy = set()
                self.stopped_at = time.monotonic()
            self._stub = None
            self.changed.notify_all()

    # -- capacity and checkpoint ------------------------------------------------------------------------

    def get_capacity(self) -> int | None:
        """manager.go GetCapacity, as the node status sees it: the resource's allocatable (healthy devices),
        None when the node does not report the resource. An endpoint stopped longer than the grace period
        drops the resource (and writes the checkpoint)."""
        with self.lock:
            if not self.registered:
                return None
            expired = self.stopped_at is not None and time.monotonic() - self.stopped_at > self.endpoint_stop_grace
            if not expired:
                return len(self.healthy)
            self.registered = False
            self.healthy = set()
            self.devices = {}
            self.topology = {}
            self.options = None
            self.stopped_at = None
        self.write_checkpoint()
        return None

    def write_checkpoint(self) -> None:
        """manager.go writeCheckpoint: podDevices and the registered resources."""
        with self.lock:
            self.checkpoint = Checkpoint(_copy_pod_devices(self.pod_devices), self.registered)

    def read_checkpoint(self, dropped: bool = False) -> None:
        """A fresh device manager (NewManagerImpl) then manager.go Start → readCheckpoint: podDevices from the
        checkpoint; a registered resource starts with no healthy device and a stopped endpoint until its
        plugin registers again. `dropped`: the checkpoint file is gone (ErrCheckpointNotFound)."""
        with self.lock:
            if dropped:
                self.checkpoint = Checkpoint()
            cp = self.checkpoint
            self.pod_devices = _copy_pod_devices(cp.pod_devices)
            self.allocated = self._pod_devices_devices()
            self.devices_to_reuse = {}
            self.devices = {}
            self.topology = {}
            self.healthy = set()
            self.registered = cp.registered
            self.options = None
            self.stopped_at = time.monotonic() if cp.registered else None  # newStoppedEndpointImpl
            self.endpoint = ""
            self.changed.notify_all()

    # -- podDevices (pod_devices.go) ---------------------------------------------------------------------

    def _pod_devices_devices(self) -> set[str] | None:
        """pod_devices.go devices(): every allocated device ID; None when no pod holds the resource."""
        if not any(self.pod_devices.values()):
            return None
        return {d for cs in self.pod_devices.values() for a in cs.values() for d in a.devices}

    def container_devices(self, uid: str, container: str) -> tuple[str, ...] | None:
        """pod_devices.go containerDevices: None when nothing is recorded for the container."""
        with self.lock:
            alloc = self.pod_devices.get(uid, {}).get(container)
            return None if alloc is None else alloc.devices

    def has_pod(self, uid: str) -> bool:
        with self.lock:
            return uid in self.pod_devices

    def get_devices(self, uid: str, container: str) -> list[tuple[str, tuple[int, ...]]]:
        """manager.go GetDevices (pod_devices.go getContainerDevices): the container's devices with the NUMA
        nodes recorded at allocation, empty when none."""
        with self.lock:
            alloc = self.pod_devices.get(uid, {}).get(container)
            return [] if alloc is None else [(d, alloc.numa.get(d, ())) for d in alloc.devices]

    def container_env(self, uid: str, container: str) -> dict[str, str] | None:
        """pod_devices.go deviceRunContainerOptions (env only): None when nothing is recorded."""
        with self.lock:
            alloc = self.pod_devices.get(uid, {}).get(container)
            return None if alloc is None else dict(alloc.env)

    def allocated_count(self) -> int | None:
        with self.lock:
            return None if self.allocated is None else len(self.allocated)

    def get_allocatable_devices(self) -> list[tuple[str, tuple[int, ...]]]:
        """manager.go GetAllocatableDevices: allDevices filtered by healthyDevices, with their NUMA nodes."""
        with self.lock:
            return [(i, self.topology.get(i, ())) for i in self.devices if i in self.healthy]

    def forget_pod(self, uid: str) -> None:
        with self.lock:
            self.pod_devices.pop(uid, None)
            self.allocated = self._pod_devices_devices()

    # -- allocation (manager.go) -----------------------------------------------------------------------

    def is_device_plugin_resource(self) -> bool:
        """manager.go isDevicePluginResource: registered (healthyDevices key) or previously allocated."""
        with self.lock:
            return self.registered or self.allocated is not None

    def update_allocated_devices(self) -> None:
        """manager.go UpdateAllocatedDevices: forget podDevices of pods no longer active (not before all pod
        sources were seen); allocatedDevices is rebuilt only when something was removed."""
        active = self.active_pods()
        if not self.sources_ready():
            return
        with self.lock:
            gone = [uid for uid in self.pod_devices if uid not in active]
            if not gone:
                return
            log.debug("Pods to be removed: %s", sorted(gone))
            for uid in gone:
                del self.pod_devices[uid]
            self.allocated = self._pod_devices_devices()
            self.changed.notify_all()

    def allocate(self, pod: Pod, container: Container) -> None:
        """manager.go Allocate: devicesToReuse holds only this pod's entry; a regular init container's devices
        join it (later containers reuse them), a sidecar's and an app container's leave it."""
        uid = pod_uid(pod)
        name = container.get("name", "")
        with self.lock:
            reuse = self.devices_to_reuse.setdefault(uid, set())
            for other in [u for u in self.devices_to_reuse if u != uid]:
                del self.devices_to_reuse[other]
        init = next((c for c in init_containers(pod) if c.get("name") == name), None)
        self.allocate_container_resources(pod, container, reuse)
        with self.lock:
            mine = set(self.container_devices(uid, name) or ())
            if init is not None and not is_restartable_init(init):
                reuse |= mine  # podDevices.addContainerAllocatedResources
            else:
                reuse -= mine  # podDevices.removeContainerAllocatedResources

    def allocate_container_resources(self, pod: Pod, container: Container, reuse: set[str]) -> None:
        """manager.go allocateContainerResources: skip a resource that is not a device plugin resource;
        devicesToAllocate; one Allocate RPC; record the answer in podDevices only after it returned."""
        uid = pod_uid(pod)
        name = container.get("name", "")
        needed = limit(container, self.resource)
        if needed is None or not self.is_device_plugin_resource():
            return
        self.update_allocated_devices()
        devs = self.devices_to_allocate(uid, name, needed, reuse)
        if not devs:
            return
        with self.lock:
            registered, stub, stopped = self.registered, self._stub, self.stopped_at is not None
        if not registered:
            with self.lock:
                self.allocated = self._pod_devices_devices()
            raise DeviceManagerError(f"unknown Device Plugin {self.resource}")
        log.debug("Making allocation request for device plugin %s: %s/%s %s", self.resource, uid, name, devs)
        try:
            if stopped or stub is None:  # endpoint.go allocate on a stopped endpoint
                raise DeviceManagerError(f"endpoint {self.resource} has been stopped")
            resp = stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=devs)]), timeout=60
            )
        except (grpc.RpcError, DeviceManagerError) as exc:
            with self.lock:
                self.allocated = self._pod_devices_devices()  # restore from podDevices
                self.allocate_calls.append(AllocateCall(uid, name, tuple(devs), False))
            if isinstance(exc, DeviceManagerError):
                raise
            raise DeviceManagerError(go_rpc_error(exc)) from exc
        with self.lock:
            self.allocate_calls.append(AllocateCall(uid, name, tuple(devs), True))
        if not resp.container_responses:
            raise DeviceManagerError(f"no containers return in allocation response {resp}")
        with self.lock:
            env = dict(resp.container_responses[0].envs)
            self.responses[(uid, name)] = resp.container_responses[0]
            numa = {d: self.topology[d] for d in devs if self.topology.get(d)}
            self.pod_devices.setdefault(uid, {})[name] = ContainerAllocation(tuple(devs), env, numa)
            self.changed.notify_all()
        self.write_checkpoint()

    def devices_to_allocate(self, uid: str, container: str, required: int, reusable: set[str]) -> list[str]:
        """manager.go devicesToAllocate, its checks in its order: pre-allocated devices (a changed request
        fails); a running container after a kubelet restart needs nothing; unregistered resource; no healthy
        device; previously allocated devices unhealthy; nothing needed; reusable devices first, then free
        healthy ones (GetPreferredAllocation when the plugin offers it). Returns [] when nothing is needed."""
        res = self.resource
        with self.lock:
            needed = required
            pre = self.container_devices(uid, container)
            if pre is not None:
                log.debug("Found pre-allocated devices for resource %s on pod %s container %s", res, uid, container)
                needed -= len(pre)
                if needed != 0:
                    raise DeviceManagerError(
                        f'pod "{uid}" container "{container}" changed request for resource "{res}" '
                        f"from {len(pre)} to {required}"
                    )
            if not self.sources_ready() and self.container_running(uid, container):
                log.debug("Container detected running, nothing to do: %s/%s", uid, container)
                return []
            if not self.registered:
                raise DeviceManagerError(f"cannot allocate unregistered device {res}")
            if not self.healthy:
                raise DeviceManagerError(f"no healthy devices present; cannot allocate unhealthy devices {res}")
            if pre and not set(pre) <= self.healthy:
                raise DeviceManagerError(
                    f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {res}"
                )
            if needed == 0:
                return []
            allocated: list[str] = []

            def allocate_remaining_from(candidates: Iterable[str]) -> bool:
                nonlocal needed
                if self.allocated is None:
                    self.allocated = set()
                pool = sorted(set(candidates) - set(allocated))
                for device in self.choose(pool, min(needed, len(pool))):
                    self.allocated.add(device)
                    allocated.append(device)
                    needed -= 1
                    if needed == 0:
                        return True
                return False

            if allocate_remaining_from(reusable):
                return allocated
            available = self.healthy - (self.allocated or set())
            if len(available) < needed:
                raise DeviceManagerError(
                    f"requested number of devices unavailable for {res}. Requested: {needed}, "
                    f"Available: {len(available)}"
                )
            # filterByAffinity: without a topology hint every available device is "noAffinity"
            want_preferred = self.options is not None and self.options.get_preferred_allocation_available
            stub = self._stub
        if want_preferred and stub is not None:
            # callGetPreferredAllocationIfAvailable: the plugin is asked without the lock held
            preferred = self._preferred_allocation(stub, available | set(allocated), set(allocated), required)
            with self.lock:
                if allocate_remaining_from(preferred & available):
                    return allocated
        with self.lock:
            if allocate_remaining_from(available):
                return allocated
        raise DeviceManagerError(
            f"unexpectedly allocated less resources than required. Requested: {required}, Got: {required - needed}"
        )

    def _preferred_allocation(
        self, stub: pbgrpc.DevicePluginStub, available: set[str], must_include: set[str], size: int
    ) -> set[str]:
        try:
            resp = stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=sorted(available),
                            must_include_deviceIDs=sorted(must_include),
                            allocation_size=size,
                        )
                    ]
                ),
                timeout=60,
            )
        except grpc.RpcError as exc:
            with self.lock:
                self.allocated = self._pod_devices_devices()
            raise DeviceManagerError(
                f"device plugin GetPreferredAllocation rpc failed with err: {go_rpc_error(exc)}"
            ) from exc
        if resp.container_responses:
            return set(resp.container_responses[0].deviceIDs)
        return set()

    def get_device_run_container_options(self, pod: Pod, container: Container) -> dict[str, str] | None:
        """manager.go GetDeviceRunContainerOptions, called when the container is about to start: PreStart if
        the plugin asks for it; a device plugin resource with nothing recorded for an active pod is
        Allocated now (a pod admitted before its plugin registered). Returns the env (None: no devices)."""
        uid = pod_uid(pod)
        name = container.get("name", "")
        units = limit(container, self.resource)
        needs_reallocate = False
        if units and self.is_device_plugin_resource():
            self._pre_start_container_if_needed(uid, name)
            if uid in self.active_pods():  # checkPodActive
                if self.container_devices(uid, name) is None:
                    needs_reallocate = True
            else:
                log.debug("Pod deleted from activePods, skip to reAllocate: %s/%s", uid, name)
        if needs_reallocate:
            log.info("Needs to re-allocate device plugin resources for pod %s container %s", uid, name)
            self.allocate(pod, container)
        return self.container_env(uid, name)

    def _pre_start_container_if_needed(self, uid: str, container: str) -> None:
        """manager.go callPreStartContainerIfNeeded."""
        with self.lock:
            if not self.registered:
                raise DeviceManagerError(f"endpoint not found in cache for a registered resource: {self.resource}")
            if self.options is None or not self.options.pre_start_required:
                return
            devices = self.container_devices(uid, container)
            if devices is None:
                raise DeviceManagerError(
                    f"no devices found allocated in local cache for pod {uid}, container {container}, "
                    f"resource {self.resource}"
                )
            stub = None if self.stopped_at is not None else self._stub
        try:
            if stub is None:
                raise DeviceManagerError(f"endpoint {self.resource} has been stopped")
            stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=list(devices)), timeout=60)
        except grpc.RpcError as exc:
            why = go_rpc_error(exc)
            raise DeviceManagerError(f"device plugin PreStartContainer rpc failed with err: {why}") from exc
        except DeviceManagerError as exc:
            raise DeviceManagerError(f"device plugin PreStartContainer rpc failed with err: {exc}") from exc
