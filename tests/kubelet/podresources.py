"""kubelet's PodResources v1 server, mirroring k8s.io/kubernetes v1.36.3 pkg/kubelet/apis/podresources/server_v1.go
(List, Get, GetAllocatableResources) behind the rate limiter of pkg/kubelet/apis/grpc/ratelimit.go."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING
from typing import Any

import grpc

from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc
from tests.kubelet.devicemanager import app_containers
from tests.kubelet.devicemanager import init_containers
from tests.kubelet.devicemanager import is_restartable_init

if TYPE_CHECKING:
    from tests.kubelet.standin import KubeletStandIn
    from tests.kubelet.standin import PodRecord

DEFAULT_QPS = 100.0  # apis/podresources/constants.go DefaultQPS
DEFAULT_BURST = 10  # DefaultBurstTokens


class RateLimiter:
    """golang.org/x/time/rate.Limiter as apis/grpc/ratelimit.go uses it: a token bucket, full at start."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False


def _add_devices(out: Any, resource: str, devices: list[tuple[str, tuple[int, ...]]]) -> None:
    """cm/container_manager.go containerDevicesFromResourceDeviceInstances: one ContainerDevices per device
    (one per device and NUMA node when the device has a topology)."""
    for device, nodes in devices:
        if not nodes:
            out.add(resource_name=resource, device_ids=[device])
            continue
        for node in nodes:
            cd = out.add(resource_name=resource, device_ids=[device])
            cd.topology.nodes.add(ID=node)


class PodResourcesServer(prgrpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletStandIn, limiter: RateLimiter | None) -> None:
        self.kubelet = kubelet
        self.limiter = limiter

    def _admit(self, context: grpc.ServicerContext) -> None:
        """ratelimit.go LimiterUnaryServerInterceptor: ResourceExhausted "rejected by rate limit"."""
        if self.limiter is not None and not self.limiter.allow():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    def _pod_resources(self, rec: PodRecord) -> prpb.PodResources:
        """server_v1.go List/Get: restartable init containers ("sidecars") first, then app containers;
        regular init containers are never reported. Devices from podDevices (GetDevices)."""
        dm = self.kubelet.dm
        pr = prpb.PodResources(name=rec.name, namespace=rec.namespace)
        containers = [c for c in init_containers(rec.pod) if is_restartable_init(c)] + app_containers(rec.pod)
        for c in containers:
            cr = pr.containers.add(name=c.get("name", ""))
            _add_devices(cr.devices, dm.resource, dm.get_devices(rec.uid, c.get("name", "")))
        return pr

    def List(
        self, request: prpb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> prpb.ListPodResourcesResponse:
        """server_v1.go List: the active pods (KubeletPodResourcesListUseActivePods, default since 1.34) or,
        with `list_all_pods`, every pod in the pod manager; UpdateAllocatedDevices runs first."""
        self._admit(context)
        kubelet = self.kubelet
        with kubelet._lock:
            kubelet.pod_resources_calls += 1
        pods = kubelet.active_pods() if not kubelet.list_all_pods else kubelet.pods()
        kubelet.dm.update_allocated_devices()
        resp = prpb.ListPodResourcesResponse()
        with kubelet._lock:
            for rec in pods:
                resp.pod_resources.append(self._pod_resources(rec))
        return resp

    def Get(self, request: prpb.GetPodResourcesRequest, context: grpc.ServicerContext) -> prpb.GetPodResourcesResponse:
        """server_v1.go Get: any pod the pod manager knows by name (GetPodByName: rejected and terminal pods
        too), without UpdateAllocatedDevices; a plain error (code Unknown) when there is none."""
        self._admit(context)
        rec = self.kubelet.pod_by_name(request.pod_namespace, request.pod_name)
        if rec is None:
            context.abort(
                grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
            )
        with self.kubelet._lock:
            return prpb.GetPodResourcesResponse(pod_resources=self._pod_resources(rec))

    def GetAllocatableResources(
        self, request: prpb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> prpb.AllocatableResourcesResponse:
        """server_v1.go GetAllocatableResources: GetAllocatableDevices (healthy devices the plugin listed)."""
        self._admit(context)
        dm = self.kubelet.dm
        resp = prpb.AllocatableResourcesResponse()
        _add_devices(resp.devices, dm.resource, dm.get_allocatable_devices())
        return resp
