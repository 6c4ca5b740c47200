"""A trivial device plugin for testing the kubelet stand-in on its own: fixed devices, a fixed env, every
Allocate recorded; it serves, registers, and (like a real plugin) serves and registers again when kubelet
removes its socket or recreates kubelet.sock."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from concurrent import futures

import grpc

from share_core.contract import DEVICE_PLUGIN_API_VERSION
from share_plugin.api import deviceplugin_v1beta1_pb2 as pb
from share_plugin.api import deviceplugin_v1beta1_pb2_grpc as pbgrpc
from share_plugin.server import file_id

RESOURCE = "example.com/widget"
FIXED_ENV = {"FAKE_PLUGIN": "fixed"}


class FakePlugin(pbgrpc.DevicePluginServicer):
    def __init__(
        self,
        plugin_dir: str,
        devices: Sequence[str] = tuple(f"dev-{i}" for i in range(8)),
        resource: str = RESOURCE,
        endpoint: str = "fake.sock",
        options: pb.DevicePluginOptions | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.endpoint = endpoint
        self.options = options or pb.DevicePluginOptions()
        self.health = {d: "Healthy" for d in devices}
        self.allocations: list[tuple[str, ...]] = []  # device IDs of every Allocate, in order
        self.failures: dict[int, tuple[grpc.StatusCode, str]] = {}  # Allocate number (from 0) -> its error
        self.on_allocate: Callable[[tuple[str, ...]], None] | None = None
        self.preferred: Callable[[list[str], list[str], int], list[str]] | None = None
        self.prestarts: list[tuple[str, ...]] = []
        self.serves = 0
        self.registers = 0
        self._cond = threading.Condition()
        self._version = 0
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def socket(self) -> str:
        return os.path.join(self.plugin_dir, self.endpoint)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, "kubelet.sock")

    # -- lifecycle -------------------------------------------------------------------------------------

    def serve(self) -> None:
        self._stop_server()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-dp"))
        pbgrpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()
        self.serves += 1

    def register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            pbgrpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=DEVICE_PLUGIN_API_VERSION,
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=self.options,
                ),
                timeout=10,
            )
        self.registers += 1

    def start(self, watch: bool = True) -> None:
        self._stop.clear()
        self.serve()
        self.register()
        if watch:
            self._watcher = threading.Thread(target=self._watch, name="fake-dp-watch", daemon=True)
            self._watcher.start()

    def stop(self) -> None:
        """The plugin goes away: its ListAndWatch stream ends, its socket is removed."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(2)
            self._watcher = None
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(2)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)

    def _watch(self) -> None:
        registered_with = file_id(self.kubelet_socket)
        while not self._stop.wait(0.02):
            kubelet = file_id(self.kubelet_socket)
            mine = os.path.exists(self.socket)
            if kubelet is None or (mine and kubelet == registered_with):
                continue
            if not mine:
                self.serve()
            with contextlib.suppress(grpc.RpcError):
                self.register()
                registered_with = kubelet

    def set_health(self, device: str, health: str) -> None:
        with self._cond:
            self.health[device] = health
            self._version += 1
            self._cond.notify_all()

    # -- DevicePlugin ----------------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return self.options

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        sent = -1
        while context.is_active() and not self._stop.is_set():
            with self._cond:
                if sent == self._version:
                    self._cond.wait(0.05)
                    continue
                sent = self._version
                devices = [pb.Device(ID=d, health=h) for d, h in self.health.items()]
            yield pb.ListAndWatchResponse(devices=devices)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        ids = tuple(request.container_requests[0].devices_ids)
        if self.on_allocate is not None:
            self.on_allocate(ids)
        failure = self.failures.get(len(self.allocations))
        self.allocations.append(ids)
        if failure is not None:
            context.abort(*failure)
        env = {**FIXED_ENV, "FAKE_DEVICES": ",".join(sorted(ids))}
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs=env)])

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        out = pb.PreferredAllocationResponse()
        for creq in request.container_requests:
            available, must = list(creq.available_deviceIDs), list(creq.must_include_deviceIDs)
            ids = self.preferred(available, must, creq.allocation_size) if self.preferred else []
            out.container_responses.add(deviceIDs=ids)
        return out

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        self.prestarts.append(tuple(request.devices_ids))
        return pb.PreStartContainerResponse()
