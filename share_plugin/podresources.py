"""Client of kubelet's PodResources API v1: which pod/container holds which of our device IDs."""

from __future__ import annotations

import time

import grpc

from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc
from share_plugin.matcher import PodResourcesView

# kubelet's own PodResources clients accept 16 MiB (pkg/kubelet/apis/podresources); so do we.
MAX_RECV_BYTES = 16 * 1024 * 1024


class PodResourcesUnavailable(Exception):
    pass


def view_from_response(resp: prpb.ListPodResourcesResponse, resource: str) -> PodResourcesView:
    """Every listed pod, with each container's device IDs of `resource` (empty when it holds none).

    PodResources names pods without their UID. Before 1.34 kubelet lists inactive pods too (server_v1.go
    List), so a terminated pod and the pod re-created under its name can both be listed: their entries
    are merged. Only an active pod holds devices (UpdateAllocatedDevices frees the others' first), so the
    union is what the live pod holds.
    """
    view: dict[tuple[str, str], dict[str, frozenset[str]]] = {}
    for pr in resp.pod_resources:
        containers = view.setdefault((pr.namespace, pr.name), {})
        for c in pr.containers:
            ids = [i for d in c.devices if d.resource_name == resource for i in d.device_ids]
            containers[c.name] = containers.get(c.name, frozenset()) | frozenset(ids)
    return view


class PodResourcesClient:
    def __init__(self, socket_path: str, resource: str, timeout: float = 5.0, busy_retries: int = 3) -> None:
        self.socket_path = socket_path
        self.resource = resource
        self.timeout = timeout
        # kubelet rate-limits this socket (apis/podresources/grpc/ratelimit.go: 100 qps, burst 10) and
        # answers ResourceExhausted when other clients use it up: wait a moment rather than go blind.
        self.busy_retries = busy_retries
        self._channel: grpc.Channel | None = None

    def _stub(self) -> prgrpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}", options=[("grpc.max_receive_message_length", MAX_RECV_BYTES)]
            )
        return prgrpc.PodResourcesListerStub(self._channel)

    def list(self) -> PodResourcesView:
        for attempt in range(self.busy_retries + 1):
            try:
                resp = self._stub().List(prpb.ListPodResourcesRequest(), timeout=self.timeout)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and attempt < self.busy_retries:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                self.close()  # a restarted kubelet recreates the socket: dial afresh next time
                raise PodResourcesUnavailable(
                    f"PodResources List on {self.socket_path} failed ({exc.code().name}): {exc.details()}"
                ) from exc
            return view_from_response(resp, self.resource)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
