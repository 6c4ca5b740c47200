"""The two gRPC services kubelet talks to, each on its own unix socket.

- DRA service (`v1.DRAPlugin`) on `<plugins dir>/dra.sock`: NodePrepareResources / NodeUnprepareResources.
- Registration (`pluginregistration.Registration`) on `<plugins_registry>/gpushare.io-reg.sock`: kubelet's
  plugin watcher finds the socket, asks GetInfo (type DRAPlugin, our driver name, the DRA socket, the
  services we serve) and reports the outcome with NotifyRegistrationStatus.

The DRA socket is served before the registration socket appears, so kubelet never finds us half up.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from dataclasses import field

import grpc

from share_core.contract import DEFAULT_DRA_PLUGIN_DIR
from share_core.contract import DEFAULT_PLUGINS_REGISTRY_DIR
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import DRA_PLUGIN_TYPE
from share_core.contract import DRA_REGISTRATION_SOCKET_NAME
from share_core.contract import DRA_SERVICE_V1
from share_core.contract import DRA_SOCKET_NAME
from share_dra.api import dra_v1_pb2 as pb
from share_dra.api import dra_v1_pb2_grpc as pbgrpc
from share_dra.api import pluginregistration_v1_pb2 as regpb
from share_dra.api import pluginregistration_v1_pb2_grpc as reggrpc
from share_dra.driver import ClaimRef
from share_dra.driver import Driver

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sockets:
    """Where the plugin listens (kubelet's defaults; a test node points them under its work dir)."""

    plugins_registry_dir: str = DEFAULT_PLUGINS_REGISTRY_DIR
    plugin_dir: str = DEFAULT_DRA_PLUGIN_DIR
    # The DRA socket's path as kubelet sees it, when it differs (kubelet in another mount namespace).
    endpoint: str = ""

    @property
    def registration(self) -> str:
        return os.path.join(self.plugins_registry_dir, DRA_REGISTRATION_SOCKET_NAME)

    @property
    def dra(self) -> str:
        return os.path.join(self.plugin_dir, DRA_SOCKET_NAME)


def _refs(claims: object) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in claims]  # type: ignore[attr-defined]


class DraServicer(pbgrpc.DRAPluginServicer):
    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> pb.NodePrepareResourcesResponse:
        out = {}
        for uid, result in self.driver.prepare(_refs(request.claims)).items():
            if isinstance(result, str):
                out[uid] = pb.NodePrepareResourceResponse(error=result)
                continue
            out[uid] = pb.NodePrepareResourceResponse(
                devices=[
                    pb.Device(
                        request_names=[d.request],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_device_ids),
                        **({"share_id": d.share_id} if d.share_id else {}),
                    )
                    for d in result
                ]
            )
        return pb.NodePrepareResourcesResponse(claims=out)

    def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnprepareResourcesResponse:
        errors = self.driver.unprepare(_refs(request.claims))
        return pb.NodeUnprepareResourcesResponse(
            claims={uid: pb.NodeUnprepareResourceResponse(error=err) for uid, err in errors.items()}
        )


@dataclass
class RegistrationServicer(reggrpc.RegistrationServicer):
    endpoint: str
    registered: threading.Event = field(default_factory=threading.Event)
    last_error: str = ""
    # Called when kubelet has registered us: kubelet removes its node's slices when it starts (and when a driver
    # goes), so the publisher looks again soon instead of at its next resync.
    on_registered: Callable[[], None] | None = None

    def GetInfo(self, request: regpb.InfoRequest, context: grpc.ServicerContext) -> regpb.PluginInfo:
        return regpb.PluginInfo(
            type=DRA_PLUGIN_TYPE, name=DRA_DRIVER_NAME, endpoint=self.endpoint, supported_versions=[DRA_SERVICE_V1]
        )

    def NotifyRegistrationStatus(
        self, request: regpb.RegistrationStatus, context: grpc.ServicerContext
    ) -> regpb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered driver %s (DRA socket %s)", DRA_DRIVER_NAME, self.endpoint)
            self.last_error = ""
            self.registered.set()
            if self.on_registered is not None:
                self.on_registered()
        else:
            log.error("kubelet refused driver %s: %s", DRA_DRIVER_NAME, request.error)
            self.last_error = request.error
            self.registered.clear()
        return regpb.RegistrationStatusResponse()


def _listen(path: str, add: list, name: str) -> grpc.Server:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)  # a socket left by a previous run
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=name))
    for f in add:
        f(server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


class PluginServers:
    """Both servers, started DRA first, stopped registration first; sockets removed on stop."""

    def __init__(self, driver: Driver, sockets: Sockets, on_registered: Callable[[], None] | None = None) -> None:
        self.sockets = sockets
        self.dra_servicer = DraServicer(driver)
        self.registration = RegistrationServicer(sockets.endpoint or sockets.dra, on_registered=on_registered)
        self._servers: list[tuple[grpc.Server, str]] = []

    def start(self) -> None:
        dra = _listen(
            self.sockets.dra, [lambda s: pbgrpc.add_DRAPluginServicer_to_server(self.dra_servicer, s)], "dra-grpc"
        )
        self._servers.append((dra, self.sockets.dra))
        reg = _listen(
            self.sockets.registration,
            [lambda s: reggrpc.add_RegistrationServicer_to_server(self.registration, s)],
            "dra-reg",
        )
        self._servers.append((reg, self.sockets.registration))
        log.info("serving %s on %s, registration on %s", DRA_SERVICE_V1, self.sockets.dra, self.sockets.registration)

    def stop(self, grace: float = 2.0) -> None:
        for server, path in reversed(self._servers):
            server.stop(grace).wait(grace + 1)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._servers.clear()
