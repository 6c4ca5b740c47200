"""The device plugin proper: gRPC server on `<dir>/gpushare.sock`, kubelet registration, health, restarts.

Lifecycle, as kubelet expects it: serve first, then register with `<dir>/kubelet.sock`. kubelet removes
every plugin socket when it restarts and recreates kubelet.sock, so a watcher polls both and serves and
registers again as soon as either changes. SIGTERM (handled in cli) stops the server and removes the socket.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from share_core.contract import DEVICE_PLUGIN_API_VERSION
from share_core.contract import KUBELET_SOCKET_NAME
from share_core.contract import PLUGIN_SOCKET_NAME
from share_core.contract import RESOURCE_MEM
from share_core.retry import Backoff
from share_node.hardlimit import HardLimitError
from share_plugin.allocator import Allocator
from share_plugin.api import deviceplugin_v1beta1_pb2 as pb
from share_plugin.api import deviceplugin_v1beta1_pb2_grpc as pbgrpc
from share_plugin.devices import DeviceListTooLarge
from share_plugin.devices import check_device_ids
from share_plugin.devices import check_message_size
from share_plugin.devices import device_list
from share_plugin.devices import gpu_infos
from share_plugin.hardlimit import PluginHardLimit
from share_plugin.matcher import AllocationError
from share_plugin.node import PluginNode
from share_plugin.publisher import Publisher

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Where the plugin meets kubelet and how often it looks (the node itself is the PluginNode)."""

    device_plugin_dir: str
    health_check: bool = True
    resource: str = RESOURCE_MEM
    watch_interval: float = 0.2  # seconds between looks at kubelet.sock and our socket
    audit_interval: float = 15.0  # seconds between looks for pods kubelet started without our Allocate
    inventory_interval: float = 30.0  # seconds between looks for changed GPUs (MIG layout); 0: never

    @property
    def socket_path(self) -> str:
        return os.path.join(self.device_plugin_dir, PLUGIN_SOCKET_NAME)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.device_plugin_dir, KUBELET_SOCKET_NAME)


def file_id(path: str) -> tuple[int, int] | None:
    """Which file stands at `path` (inode, change time), None while none does: kubelet recreating its socket
    or deleting ours changes it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class DevicePluginServicer(pbgrpc.DevicePluginServicer):
    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        # --hard-limit: kubelet reads this when the plugin connects (devicemanager PluginConnected) and then calls
        # PreStartContainer before it creates each container (share_plugin/hardlimit.py).
        return self.plugin.options()

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext):  # type: ignore[no-untyped-def]
        seen = -1
        while context.is_active() and not self.plugin.stopping.is_set():
            resp, version = self.plugin.wait_devices(seen, timeout=0.5)
            if version != seen:
                seen = version
                log.info(
                    "ListAndWatch: sending %d devices (%d unhealthy)",
                    len(resp.devices),
                    sum(1 for d in resp.devices if d.health != "Healthy"),
                )
                yield resp

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        # Not advertised (the IDs carry no meaning), but answer sensibly if asked.
        out = pb.PreferredAllocationResponse()
        for creq in request.container_requests:
            ids = list(creq.must_include_deviceIDs)
            ids += [i for i in creq.available_deviceIDs if i not in ids]
            out.container_responses.append(
                pb.ContainerPreferredAllocationResponse(deviceIDs=ids[: creq.allocation_size])
            )
        return out

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        out = pb.AllocateResponse()
        for creq in request.container_requests:
            try:
                answer = self.plugin.allocator.allocate(list(creq.devices_ids))
            except AllocationError as exc:
                log.error("Allocate failed: %s", exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except Exception as exc:
                log.exception("Allocate of %d devices failed unexpectedly", len(creq.devices_ids))
                context.abort(grpc.StatusCode.INTERNAL, f"node {self.plugin.node.name}: Allocate failed: {exc}")
            out.container_responses.append(
                pb.ContainerAllocateResponse(
                    envs=answer.envs,
                    mounts=[
                        pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                        for m in answer.mounts
                    ],
                    cdi_devices=[pb.CDIDevice(name=n) for n in answer.cdi_devices],
                )
            )
        return out

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        hard = self.plugin.hard_limit
        if hard is not None and hard.enforced:
            try:
                hard.pre_start(list(request.devices_ids))
            except HardLimitError as exc:
                log.error("PreStartContainer: %s", exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except Exception as exc:
                log.exception("PreStartContainer failed unexpectedly")
                context.abort(grpc.StatusCode.INTERNAL, f"node {self.plugin.node.name}: PreStartContainer: {exc}")
        return pb.PreStartContainerResponse()


class DevicePlugin:
    def __init__(
        self,
        node: PluginNode,
        config: PluginConfig,
        allocator: Allocator,
        publisher: Publisher | None = None,
        hard_limit: PluginHardLimit | None = None,
    ) -> None:
        self.node = node
        self.config = config
        self.hard_limit = hard_limit
        self.backend = node.backend
        self.allocator = allocator
        self.publisher = publisher
        self.stopping = threading.Event()
        self.registered = threading.Event()
        self.registrations = 0  # how many times we registered (tests watch re-registration)
        self._cond = threading.Condition()
        self._version = 0
        gpus = node.backend.gpus()
        check_device_ids(gpus, node.unit)
        self._devices = device_list(gpus, node.unit)
        self.message_bytes = check_message_size(self._devices, gpus, node.unit)
        self._server: grpc.Server | None = None
        self._threads: list[threading.Thread] = []
        self._served_ids: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None)

    def options(self) -> pb.DevicePluginOptions:
        """What kubelet is told at registration and when it connects: PreStartContainer only with a hard limit."""
        pre_start = self.hard_limit is not None and self.hard_limit.enforced
        return pb.DevicePluginOptions(pre_start_required=pre_start, get_preferred_allocation_available=False)

    # -- devices -----------------------------------------------------------------------------------

    def devices(self) -> pb.ListAndWatchResponse:
        with self._cond:
            return self._devices

    def wait_devices(self, seen: int, timeout: float) -> tuple[pb.ListAndWatchResponse, int]:
        """The device list once its version differs from `seen` (or after `timeout`)."""
        with self._cond:
            if self._version == seen:
                self._cond.wait(timeout)
            return self._devices, self._version

    def on_health_change(self, uuid: str, healthy: bool, reason: str) -> None:
        gpus = self.backend.gpus()
        gpu = next((g for g in gpus if g.uuid == uuid), None)
        log.warning(
            "node %s: GPU %s %s is now %s (%s): its %s devices turn %s",
            self.node.name,
            gpu.index if gpu else "?",
            uuid,
            "healthy" if healthy else "UNHEALTHY",
            reason,
            RESOURCE_MEM,
            "Healthy" if healthy else "Unhealthy",
        )
        with self._cond:
            self._devices = device_list(gpus, self.node.unit)
            self._version += 1
            self._cond.notify_all()
        if self.publisher:
            self.publisher.publish(gpu_infos(gpus, self.node.unit))

    def refresh_inventory(self) -> bool:
        """Enumerate the GPUs again; a changed list (a new MIG layout) is sent to kubelet and republished."""
        if not self.backend.refresh():
            return False
        gpus = self.backend.gpus()
        try:
            check_device_ids(gpus, self.node.unit)
            devices = device_list(gpus, self.node.unit)
            size = check_message_size(devices, gpus, self.node.unit)
        except DeviceListTooLarge as exc:
            log.error("node %s: the GPUs changed but cannot be advertised: %s", self.node.name, exc)
            return False
        with self._cond:
            self._devices, self.message_bytes = devices, size
            self._version += 1
            self._cond.notify_all()
        log.warning(
            "node %s: the GPUs changed: now %s; %d devices sent to kubelet, node annotation republished",
            self.node.name,
            ", ".join(f"{g.index}:{g.uuid}:{g.memory_mib}MiB" for g in gpus),
            len(devices.devices),
        )
        if self.publisher:
            self.publisher.publish(gpu_infos(gpus, self.node.unit))
        return True

    def _watch_inventory(self) -> None:
        while not self.stopping.wait(self.config.inventory_interval):
            try:
                self.refresh_inventory()
            except Exception:
                log.exception("node %s: looking for changed GPUs failed", self.node.name)

    # -- serving and registration --------------------------------------------------------------------

    def _serve(self) -> None:
        path = self.config.socket_path
        Path(self.config.device_plugin_dir).mkdir(parents=True, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="dp-grpc"))
        pbgrpc.add_DevicePluginServicer_to_server(DevicePluginServicer(self), server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._server = server
        log.info("node %s: serving the device plugin API on %s", self.node.name, path)

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None

    def _register(self) -> bool:
        """Register with kubelet, retrying until it answers; False if we are stopping."""
        backoff = Backoff(initial=0.1, maximum=2.0)
        while not self.stopping.is_set():
            try:
                with grpc.insecure_channel(f"unix://{self.config.kubelet_socket}") as ch:
                    grpc.channel_ready_future(ch).result(timeout=2)
                    pbgrpc.RegistrationStub(ch).Register(
                        pb.RegisterRequest(
                            version=DEVICE_PLUGIN_API_VERSION,
                            endpoint=os.path.basename(self.config.socket_path),
                            resource_name=self.config.resource,
                            options=self.options(),
                        ),
                        timeout=5,
                    )
            except (grpc.RpcError, grpc.FutureTimeoutError) as exc:
                detail = exc.details() if isinstance(exc, grpc.RpcError) else "kubelet not answering"
                log.warning(
                    "node %s: registering with kubelet at %s failed: %s; retrying",
                    self.node.name,
                    self.config.kubelet_socket,
                    detail,
                )
                if backoff.wait(self.stopping):
                    return False
                continue
            self.registrations += 1
            self.registered.set()
            log.info(
                "node %s: registered %s with kubelet (%d devices, %d bytes per ListAndWatch)",
                self.node.name,
                self.config.resource,
                len(self.devices().devices),
                self.message_bytes,
            )
            return True
        return False

    def _serve_and_register(self) -> None:
        self._stop_server()
        self.registered.clear()
        self._serve()
        self._served_ids = (file_id(self.config.socket_path), file_id(self.config.kubelet_socket))
        if self._register():
            # kubelet may have restarted while we waited: remember the kubelet.sock we registered with.
            self._served_ids = (file_id(self.config.socket_path), file_id(self.config.kubelet_socket))

    def _watch_kubelet(self) -> None:
        """Serve and register again when kubelet removes our socket or recreates kubelet.sock."""
        while not self.stopping.wait(self.config.watch_interval):
            ours, kubelet = file_id(self.config.socket_path), file_id(self.config.kubelet_socket)
            if ours is None or (kubelet is not None and kubelet != self._served_ids[1]):
                log.warning(
                    "node %s: kubelet restarted (%s): serving and registering again",
                    self.node.name,
                    "our socket was removed" if ours is None else "kubelet.sock was recreated",
                )
                self.allocator.kubelet_restarted()
                self._serve_and_register()

    def _audit(self) -> None:
        """Report pods kubelet started without Allocate: soon after each registration, then periodically."""
        seen_registrations = -1
        while not self.stopping.is_set():
            if self.registrations != seen_registrations and self.registered.is_set():
                seen_registrations = self.registrations
                self.stopping.wait(2.0)  # kubelet starts the pods it admitted meanwhile: look after that
            try:
                self.allocator.audit()
            except Exception:
                log.exception("node %s: audit of running pods failed", self.node.name)
            self.stopping.wait(self.config.audit_interval)

    def start(self) -> None:
        """Serve, register (blocking until kubelet answers or stop), start health and restart watchers."""
        if self.publisher:
            self.publisher.start()
            self.publisher.publish(gpu_infos(self.backend.gpus(), self.node.unit))
        if self.hard_limit is not None:
            self.hard_limit.publish()
            t = threading.Thread(target=self.hard_limit.run, args=(self.stopping,), name="hard-limit", daemon=True)
            t.start()
            self._threads.append(t)
        if self.config.health_check:
            t = threading.Thread(
                target=self.backend.watch_health,
                args=(self.stopping, self.on_health_change),
                name="health",
                daemon=True,
            )
            t.start()
            self._threads.append(t)
        self._serve_and_register()
        t = threading.Thread(target=self._watch_kubelet, name="kubelet-watch", daemon=True)
        t.start()
        self._threads.append(t)
        if self.config.inventory_interval > 0:
            t = threading.Thread(target=self._watch_inventory, name="inventory", daemon=True)
            t.start()
            self._threads.append(t)
        if self.config.audit_interval > 0:
            t = threading.Thread(target=self._audit, name="audit", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop serving and remove our socket, so kubelet sees the plugin gone."""
        self.stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._stop_server()
        for t in self._threads:
            t.join(timeout=3)
        self.backend.close()
        if self.publisher:
            self.publisher.stop()
        try:
            os.unlink(self.config.socket_path)
        except FileNotFoundError:
            pass
        log.info("node %s: device plugin stopped, socket %s removed", self.node.name, self.config.socket_path)
