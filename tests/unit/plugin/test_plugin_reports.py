"""What the plugin tells people: Events on pods it cannot serve or that run without Allocate, and
PodResources answers it waits for rather than going blind."""

from __future__ import annotations

import tempfile
from concurrent import futures

import grpc
import pytest

from share_core.contract import EVENT_ALLOCATE_REFUSED
from share_core.contract import EVENT_RUNS_WITHOUT_GPU
from share_core.contract import RESOURCE_MEM
from share_core.contract import MemoryUnit
from share_core.contract import device_id
from share_core.fake import FakeKube
from share_node.backend.sim import SimBackend
from share_plugin.allocator import Allocator
from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc
from share_plugin.matcher import AllocationError
from share_plugin.matcher import PodResourcesView
from share_plugin.node import PluginNode
from share_plugin.podresources import PodResourcesClient
from share_plugin.podresources import PodResourcesUnavailable
from tests.unit.plugin.simnode import NODE
from tests.unit.plugin.simnode import assign
from tests.unit.plugin.simnode import make_pod


class StaticView:
    """PodResources as a test sets it."""

    def __init__(self, view: PodResourcesView) -> None:
        self.view = view

    def list(self) -> PodResourcesView:
        return self.view


def allocator(kube: FakeKube, view: PodResourcesView) -> tuple[Allocator, SimBackend]:
    backend = SimBackend("2xT4:16GiB", NODE)
    return Allocator(PluginNode(NODE, kube, backend, MemoryUnit.GiB), StaticView(view)), backend


def ids(backend: SimBackend, n: int) -> list[str]:
    return [device_id(backend.gpus()[0].uuid, k) for k in range(n)]


def test_pod_of_another_scheduler_gets_one_warning_event_naming_the_refusal():
    kube = FakeKube()
    other = make_pod("other", [("m", 2)])
    other["spec"]["schedulerName"] = "default-scheduler"
    kube.add_pod(other)
    alloc, backend = allocator(kube, {("default", "other"): {"m": frozenset()}})
    for _ in range(2):  # kubelet may retry: one Event, not one per attempt
        with pytest.raises(AllocationError, match="gpushare cannot serve"):
            alloc.allocate(ids(backend, 2))
    assert [(e["pod"], e["reason"], e["type"]) for e in kube.events] == [("other", EVENT_ALLOCATE_REFUSED, "Warning")]
    assert "default-scheduler" in kube.events[0]["message"]


def test_audit_reports_pods_started_without_allocate_once():
    kube = FakeKube()
    backend = SimBackend("2xT4:16GiB", NODE)
    pod = make_pod("late", [("m", 2)])
    assign(pod, [0], [backend.gpus()[0].uuid], 2, 1)
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "m", "state": {"running": {}}}]}
    kube.add_pod(pod)
    alloc = Allocator(
        PluginNode(NODE, kube, backend, MemoryUnit.GiB), StaticView({("default", "late"): {"m": frozenset()}})
    )
    assert alloc.audit() == 1 and alloc.audit() == 1
    assert [(e["pod"], e["reason"]) for e in kube.events] == [("late", EVENT_RUNS_WITHOUT_GPU)]
    assert "delete the pod" in kube.events[0]["message"]


class Busy(prgrpc.PodResourcesListerServicer):
    """kubelet's rate limiter (apis/podresources/grpc/ratelimit.go) answers ResourceExhausted."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.calls = 0

    def List(self, request, context):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls <= self.busy:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        resp = prpb.ListPodResourcesResponse()
        pr = resp.pod_resources.add(name="p", namespace="default")
        pr.containers.add(name="m").devices.add(resource_name=RESOURCE_MEM, device_ids=["a"])
        return resp


@pytest.mark.parametrize(("busy", "ok"), [(2, True), (10, False)])
def test_pod_resources_rate_limit_is_waited_out_then_reported(busy: int, ok: bool):
    sock = tempfile.mkdtemp(prefix="gs", dir="/tmp") + "/pr.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Busy(busy)
    prgrpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    client = PodResourcesClient(sock, RESOURCE_MEM, timeout=2)
    try:
        if ok:
            assert client.list() == {("default", "p"): {"m": frozenset({"a"})}}
        else:
            with pytest.raises(PodResourcesUnavailable, match="RESOURCE_EXHAUSTED"):
                client.list()
    finally:
        client.close()
        server.stop(0)


def test_pod_admitted_again_by_a_restarted_kubelet_is_served_again():
    """The old kubelet asked for the pod's Allocate, then stopped before its rejection reached the API
    (seen on v1.37.2: "Allocate failed due to ... context canceled"); the new kubelet admits the pod
    again, holding nothing. Within one kubelet a served container holding nothing is inactive; across a
    restart it is admitting."""
    kube = FakeKube()
    backend = SimBackend("2xT4:16GiB", NODE)
    pod = make_pod("again", [("m", 2)])
    assign(pod, [0], [backend.gpus()[0].uuid], 2, 1)
    kube.add_pod(pod)
    alloc = Allocator(
        PluginNode(NODE, kube, backend, MemoryUnit.GiB), StaticView({("default", "again"): {"m": frozenset()}})
    )
    alloc.allocate(ids(backend, 2))
    with pytest.raises(AllocationError, match="no pod to serve"):
        alloc.allocate(ids(backend, 2))  # the same kubelet: that pod was served, it is not admitting
    alloc.kubelet_restarted()
    env = alloc.allocate(ids(backend, 2)).envs
    assert env["NVIDIA_VISIBLE_DEVICES"] == backend.gpus()[0].uuid
