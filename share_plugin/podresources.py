"""Client of kubelet's PodResources API v1: which pod/container holds which of our device IDs."""

from __future__ import annotations

import grpc

from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc
from share_plugin.matcher import PodResourcesView

# kubelet's own PodResources clients accept 16 MiB (pkg/kubelet/apis/podresources); so do we.
MAX_RECV_BYTES = 16 * 1024 * 1024


class PodResourcesUnavailable(Exception):
    pass


def view_from_response(resp: prpb.ListPodResourcesResponse, resource: str) -> PodResourcesView:
    """Every listed pod, with each container's device IDs of `resource` (empty when it holds none)."""
    view: dict[tuple[str, str], dict[str, frozenset[str]]] = {}
    for pr in resp.pod_resources:
        containers: dict[str, frozenset[str]] = {}
        for c in pr.containers:
            ids = [i for d in c.devices if d.resource_name == resource for i in d.device_ids]
            containers[c.name] = frozenset(ids)
        view[(pr.namespace, pr.name)] = containers
    return view


class PodResourcesClient:
    def __init__(self, socket_path: str, resource: str, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.resource = resource
        self.timeout = timeout
        self._channel: grpc.Channel | None = None

    def _stub(self) -> prgrpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}", options=[("grpc.max_receive_message_length", MAX_RECV_BYTES)]
            )
        return prgrpc.PodResourcesListerStub(self._channel)

    def list(self) -> PodResourcesView:
        try:
            resp = self._stub().List(prpb.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            self.close()  # a restarted kubelet recreates the socket: dial afresh next time
            raise PodResourcesUnavailable(f"PodResources List on {self.socket_path} failed: {exc.details()}") from exc
        return view_from_response(resp, self.resource)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
