"""The kubelet stand-in on its own, against a trivial device plugin (fakeplugin.py): each behaviour of upstream
kubelet v1.36.3 the stand-in mirrors (see tests/kubelet/__init__.py for the upstream functions)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from share_core.fake import FakeKube
from share_plugin.api import deviceplugin_v1beta1_pb2 as pb
from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc
from tests.kubelet import AdmissionError
from tests.kubelet import KubeletStandIn
from tests.unit.kubelet.fakeplugin import FIXED_ENV
from tests.unit.kubelet.fakeplugin import RESOURCE
from tests.unit.kubelet.fakeplugin import FakePlugin

RES = RESOURCE
NODE = "n1"


@dataclass
class Node:
    kubelet: KubeletStandIn
    plugin: FakePlugin
    dir: str


def make_node(devices: int = 8, start_plugin: bool = True, options: pb.DevicePluginOptions | None = None, **kw: Any):
    d = tempfile.mkdtemp(prefix="ks", dir="/tmp")  # unix socket paths must stay short
    kubelet = KubeletStandIn(f"{d}/dp", f"{d}/pr/kubelet.sock", resource=RES, **kw)
    kubelet.start()
    plugin = FakePlugin(f"{d}/dp", [f"dev-{i}" for i in range(devices)], options=options)
    if start_plugin:
        plugin.start()
        kubelet.wait_for(lambda: len(kubelet.healthy_devices()) == devices, 5, "the plugin's devices")
    return Node(kubelet, plugin, d)


def stop_node(node: Node) -> None:
    node.plugin.stop()
    node.kubelet.stop()
    shutil.rmtree(node.dir, ignore_errors=True)


@pytest.fixture
def node() -> Iterator[Node]:
    n = make_node()
    yield n
    stop_node(n)


def make_pod(
    name: str,
    app: list[tuple[Any, ...]] | None = None,
    init: list[tuple[Any, ...]] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """Containers as (name, units) or, for init containers, (name, units, "Always") for a sidecar."""

    def ctr(n: str, units: int | None, restart: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"name": n, "image": "x", "resources": {}}
        if units is not None:
            c["resources"] = {"limits": {RES: str(units)}}
        if restart:
            c["restartPolicy"] = restart
        return c

    spec: dict[str, Any] = {"nodeName": NODE, "containers": [ctr(*c) for c in (app or [("main", 1)])]}
    if init:
        spec["initContainers"] = [ctr(*c) for c in init]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def pr_stub(kubelet: KubeletStandIn) -> tuple[grpc.Channel, prgrpc.PodResourcesListerStub]:
    channel = grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}")
    return channel, prgrpc.PodResourcesListerStub(channel)


def list_raw(kubelet: KubeletStandIn) -> prpb.ListPodResourcesResponse:
    channel, stub = pr_stub(kubelet)
    with channel:
        return stub.List(prpb.ListPodResourcesRequest(), timeout=5)


def listed(kubelet: KubeletStandIn) -> dict[tuple[str, str], list[tuple[str, list[str]]]]:
    """PodResources List: (namespace, name) -> [(container, sorted device IDs)] in the order reported."""
    return {
        (p.namespace, p.name): [(c.name, sorted(i for d in c.devices for i in d.device_ids)) for c in p.containers]
        for p in list_raw(kubelet).pod_resources
    }


def calls(kubelet: KubeletStandIn) -> list[tuple[str, str]]:
    return [(c.pod_uid, c.container) for c in kubelet.allocate_calls]


def cpu_rejects(*names: str):
    msg = "Node didn't have enough resource: cpu, requested: 2000, used: 63000, capacity: 64000"
    return lambda pod: ("OutOfcpu", msg) if pod["metadata"]["name"] in names else None


# -- PodResources ----------------------------------------------------------------------------------------


def test_list_and_get_report_sidecars_then_app_containers_never_regular_init(node):
    pod = make_pod("p", app=[("app", 1)], init=[("setup", 2), ("side", 1, "Always"), ("setup2", 1)])
    node.kubelet.admit(pod)
    devs = node.kubelet.pod_devices()[("default", "p")]
    assert set(devs) == {"setup", "side", "setup2", "app"}  # kubelet holds them all...
    expected = [("side", sorted(devs["side"])), ("app", sorted(devs["app"]))]
    assert listed(node.kubelet)[("default", "p")] == expected  # ...and reports no regular init container
    channel, stub = pr_stub(node.kubelet)
    with channel:
        got = stub.Get(prpb.GetPodResourcesRequest(pod_name="p", pod_namespace="default"), timeout=5)
    assert [(c.name, sorted(i for d in c.devices for i in d.device_ids)) for c in got.pod_resources.containers] == (
        expected
    )
    # one ContainerDevices per device (cm containerDevicesFromResourceDeviceInstances)
    (entry,) = list_raw(node.kubelet).pod_resources
    assert all(len(d.device_ids) == 1 and d.resource_name == RES for c in entry.containers for d in c.devices)


def test_list_reports_active_pods_only_unless_asked_for_every_pod():
    node = make_node(predicate=cpu_rejects("rejected"))
    try:
        k = node.kubelet
        k.admit(make_pod("running", [("m", 1)]))
        with pytest.raises(AdmissionError):
            k.admit(make_pod("rejected", [("m", 1)]))
        k.admit(make_pod("done", [("m", 1)]))
        k.finish_pod("default", "done")
        assert set(listed(k)) == {("default", "running")}
        k.list_all_pods = True  # before 1.34: every pod in the pod manager; inactive pods' devices already freed
        assert listed(k) == {
            ("default", "running"): [("m", sorted(k.pod_devices()[("default", "running")]["m"]))],
            ("default", "rejected"): [("m", [])],
            ("default", "done"): [("m", [])],
        }
    finally:
        stop_node(node)


def test_get_finds_a_rejected_pod_and_an_unknown_one_is_a_plain_error():
    node = make_node(predicate=cpu_rejects("rejected"))
    try:
        with pytest.raises(AdmissionError):
            node.kubelet.admit(make_pod("rejected", [("m", 1)]))
        channel, stub = pr_stub(node.kubelet)
        with channel:
            got = stub.Get(prpb.GetPodResourcesRequest(pod_name="rejected", pod_namespace="default"), timeout=5)
            assert got.pod_resources.name == "rejected"
            with pytest.raises(grpc.RpcError) as err:
                stub.Get(prpb.GetPodResourcesRequest(pod_name="nope", pod_namespace="default"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert err.value.details() == "pod nope in namespace default not found"
    finally:
        stop_node(node)


def test_pod_resources_is_rate_limited(node):
    channel, stub = pr_stub(node.kubelet)
    codes = []
    with channel:
        for _ in range(40):
            try:
                stub.List(prpb.ListPodResourcesRequest(), timeout=5)
                codes.append("ok")
            except grpc.RpcError as exc:
                assert exc.details() == "rejected by rate limit"
                codes.append(exc.code().name)
    assert codes[:10] == ["ok"] * 10  # burst of 10
    assert "RESOURCE_EXHAUSTED" in codes


def test_allocatable_resources_are_the_healthy_devices(node):
    node.plugin.set_health("dev-3", "Unhealthy")
    node.kubelet.wait_for(lambda: len(node.kubelet.healthy_devices()) == 7, 5, "dev-3 unhealthy")
    channel, stub = pr_stub(node.kubelet)
    with channel:
        resp = stub.GetAllocatableResources(prpb.AllocatableResourcesRequest(), timeout=5)
    assert sorted(i for d in resp.devices for i in d.device_ids) == [f"dev-{i}" for i in range(8) if i != 3]


# -- pods keyed by UID -----------------------------------------------------------------------------------


def test_pods_are_keyed_by_uid_a_recreated_pod_is_another_pod(node):
    k = node.kubelet
    k.admit(make_pod("p", [("m", 2)], uid="uid-1"))
    first = k.pod_devices()[("default", "p")]["m"]
    k.remove_pod("default", "p")  # deleted
    k.admit(make_pod("p", [("m", 2)], uid="uid-2"))  # recreated under the same name
    assert calls(k) == [("uid-1", "m"), ("uid-2", "m")]  # a new pod: allocated again
    assert set(k.pod_devices_by_uid()) == {"uid-2"}  # the deleted pod's devices were freed first
    assert listed(k) == {("default", "p"): [("m", sorted(k.pod_devices()[("default", "p")]["m"]))]}
    # a third UID under the name while uid-2 still runs: both hold devices
    k.admit(make_pod("p", [("m", 2)], uid="uid-3"))
    held = k.pod_devices_by_uid()
    assert set(held) == {"uid-2", "uid-3"} and not set(held["uid-2"]["m"]) & set(held["uid-3"]["m"])
    assert len(first) == 2


# -- admission order -------------------------------------------------------------------------------------


def test_pod_is_listed_before_its_allocate_and_devices_recorded_only_after(node):
    seen: list[Any] = []
    node.plugin.on_allocate = lambda ids: seen.append(listed(node.kubelet).get(("default", "p")))
    node.kubelet.admit(make_pod("p", app=[("a", 1), ("b", 2)]))
    assert seen[0] == [("a", []), ("b", [])]  # in the pod manager, nothing recorded yet
    (a_name, a_ids), b = seen[1]
    assert a_name == "a" and len(a_ids) == 1 and b == ("b", [])  # a recorded once its Allocate returned


def test_init_containers_first_regular_init_devices_reused_sidecar_keeps_its_own(node):
    pod = make_pod("p", app=[("a", 2)], init=[("setup", 3), ("side", 1, "Always")])
    envs = node.kubelet.admit(pod)
    assert calls(node.kubelet) == [("uid-p", "setup"), ("uid-p", "side"), ("uid-p", "a")]
    devs = {c: set(ids) for c, ids in node.kubelet.pod_devices()[("default", "p")].items()}
    assert devs["side"] <= devs["setup"]  # reusable devices first
    assert devs["a"] <= devs["setup"] - devs["side"]  # the sidecar keeps its device
    assert len(set().union(*devs.values())) == 3
    assert envs["a"] == {**FIXED_ENV, "FAKE_DEVICES": ",".join(sorted(devs["a"]))}


def test_container_without_the_resource_gets_no_allocate(node):
    envs = node.kubelet.admit(make_pod("p", app=[("cpu", None), ("gpu", 2)]))
    assert set(envs) == {"gpu"} and calls(node.kubelet) == [("uid-p", "gpu")]


# -- rejection -------------------------------------------------------------------------------------------


def test_rejected_after_allocate_is_failed_inactive_and_frees_its_devices():
    node = make_node(devices=4, predicate=cpu_rejects("big"))
    try:
        k = node.kubelet
        with pytest.raises(AdmissionError) as err:
            k.admit(make_pod("big", [("m", 4)]))
        assert err.value.reason == "OutOfcpu"
        assert node.plugin.allocations and calls(k) == [("uid-big", "m")]  # Allocate ran, then the predicate
        rec = k.pod_record("uid-big")
        assert rec is not None and rec.phase == "Failed" and rec.reason == "OutOfcpu"
        assert rec.message == "Pod was rejected: " + err.value.message
        assert ("default", "big") not in listed(k) and ("default", "big") not in k.envs()
        envs = k.admit(make_pod("next", [("m", 4)]))  # all 4 devices are free again
        assert len(envs["m"]["FAKE_DEVICES"].split(",")) == 4
    finally:
        stop_node(node)


def test_allocate_failure_is_an_unexpected_admission_error(node):
    node.plugin.failures[1] = (grpc.StatusCode.FAILED_PRECONDITION, "no widget for you")
    with pytest.raises(AdmissionError) as err:
        node.kubelet.admit(make_pod("p", app=[("a", 1), ("b", 1)]))
    assert err.value.reason == "UnexpectedAdmissionError"
    assert err.value.message == (
        "Allocate failed due to rpc error: code = FailedPrecondition desc = no widget for you, which is unexpected"
    )
    assert ("default", "p") not in listed(node.kubelet)  # inactive; List ran UpdateAllocatedDevices...
    assert node.kubelet.pod_devices_by_uid() == {}  # ...which freed container a's devices


def test_too_few_devices_fails_before_any_allocate(node):
    with pytest.raises(AdmissionError, match=rf"requested number of devices unavailable for {RES}\. Requested: 9"):
        node.kubelet.admit(make_pod("p", [("m", 9)]))
    assert node.plugin.allocations == []


# -- admission without Allocate; Allocate from the pod worker ---------------------------------------------


def test_unknown_resource_is_admitted_without_allocate_then_allocated_when_its_container_starts():
    node = make_node(start_plugin=False)
    try:
        k = node.kubelet
        late, early = make_pod("late", [("m", 2)]), make_pod("early", [("m", 1)])
        assert k.admit(late) == {} and k.admit(early) == {}  # removeMissingExtendedResources: admitted
        assert k.allocate_calls == [] and k.node_allocatable() is None
        assert listed(k)[("default", "late")] == [("m", [])]
        assert k.start_containers(early) == {}  # started before the plugin registered: no devices, no env
        node.plugin.start()
        k.wait_for(lambda: len(k.healthy_devices()) == 8, 5, "the plugin")
        env = k.start_containers(late)  # GetDeviceRunContainerOptions: nothing recorded → Allocate now
        assert calls(k) == [("uid-late", "m")]
        assert env["m"]["FAKE_PLUGIN"] == "fixed"
        assert k.start_containers(early) == {}  # already started: left alone
        assert k.started_envs()[("default", "early")] == {"m": {}}
    finally:
        stop_node(node)


def test_known_resource_without_healthy_devices_rejects(node):
    node.plugin.stop()  # the plugin goes away: kubelet marks every device unhealthy
    node.kubelet.wait_for(lambda: not node.kubelet.healthy_devices(), 5, "devices unhealthy")
    assert len(node.kubelet.devices) == 8 and node.kubelet.node_allocatable() == 0
    with pytest.raises(AdmissionError) as err:
        node.kubelet.admit(make_pod("p", [("m", 1)]))
    assert err.value.reason == "UnexpectedAdmissionError"
    assert err.value.message == (
        f"Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {RES}, "
        "which is unexpected"
    )


def test_resource_gone_but_still_allocated_is_unregistered_once_freed_it_is_unknown():
    node = make_node(endpoint_stop_grace=0)
    try:
        k = node.kubelet
        k.admit(make_pod("holder", [("m", 2)]))
        node.plugin.stop()
        k.wait_for(lambda: not k.healthy_devices(), 5, "devices unhealthy")
        time.sleep(0.01)
        assert k.node_allocatable() is None  # GetCapacity: the stopped endpoint's grace expired
        with pytest.raises(AdmissionError, match=f"cannot allocate unregistered device {RES}"):
            k.admit(make_pod("p1", [("m", 1)]))  # isDevicePluginResource: still allocated to holder
        k.finish_pod("default", "holder")
        listed(k)  # UpdateAllocatedDevices: holder's devices freed, the resource is unknown now
        assert k.admit(make_pod("p2", [("m", 1)])) == {}
        assert calls(k) == [("uid-holder", "m")]
    finally:
        stop_node(node)


def test_pre_start_container_and_preferred_allocation_when_the_plugin_asks():
    options = pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
    node = make_node(options=options)
    try:
        node.plugin.preferred = lambda available, must, size: sorted(available)[-size:]
        pod = make_pod("p", [("m", 2)])
        node.kubelet.admit(pod)
        assert [sorted(a) for a in node.plugin.allocations] == [["dev-6", "dev-7"]]
        node.kubelet.start_containers(pod)
        assert [sorted(p) for p in node.plugin.prestarts] == [["dev-6", "dev-7"]]
    finally:
        stop_node(node)


# -- kubelet restart -------------------------------------------------------------------------------------


def test_restart_keeps_pod_devices_running_containers_need_no_allocate(node):
    k = node.kubelet
    p = make_pod("p", app=[("app", 1)], init=[("setup", 2), ("side", 1, "Always")])
    q = make_pod("q", [("m", 3)])
    for pod in (p, q):
        k.admit(pod)
        k.start_containers(pod)
    before = k.pod_devices()
    n_calls, serves = len(k.allocate_calls), node.plugin.serves
    assert k.restart(timeout=10) < 5
    assert node.plugin.serves > serves  # kubelet removed the plugin's socket: it served again
    assert len(k.allocate_calls) == n_calls  # "Container detected running", "Found pre-allocated devices"
    assert k.pod_devices() == before
    assert {r.name for r in k.active_pods()} == {"p", "q"}
    assert set(listed(k)) == {("default", "p"), ("default", "q")}


def test_restart_pods_arriving_before_the_plugin_registers_again():
    node = make_node()
    try:
        k = node.kubelet
        running = make_pod("running", [("m", 2)])
        waiting = make_pod("waiting", [("m", 1)])  # admitted, its container not started yet
        ran_init = make_pod("ran-init", app=[("app", 1)], init=[("setup", 1)])
        for pod in (running, waiting, ran_init):
            k.admit(pod)
        k.start_containers(running)
        k.start_containers(ran_init)
        n_calls = len(k.allocate_calls)
        k.restart(timeout=10, pods_first=True)
        assert len(k.allocate_calls) == n_calls
        assert [r.name for r in k.active_pods()] == ["running"]  # detected running: kept, no Allocate
        for name in ("waiting", "ran-init"):  # devices recorded but not running: resource known, none healthy
            rec = k.pod_by_name("default", name)
            assert rec is not None and rec.phase == "Failed" and rec.reason == "UnexpectedAdmissionError"
            assert "no healthy devices present" in rec.message
        envs = k.admit(make_pod("new", [("m", 1)]))  # the plugin is back
        assert envs["m"]["FAKE_PLUGIN"] == "fixed"
    finally:
        stop_node(node)


def test_restart_with_the_checkpoint_dropped_admits_without_allocate():
    node = make_node()
    try:
        k = node.kubelet
        running = make_pod("running", [("m", 2)])
        k.admit(running)
        k.start_containers(running)
        new = make_pod("new", [("m", 3)])  # bound to the node while kubelet was down
        n_calls = len(k.allocate_calls)
        k.restart(timeout=10, drop_checkpoint=True, pods_first=True, new_pods=[new])
        assert len(k.allocate_calls) == n_calls  # the resource was unknown: nothing allocated
        assert {r.name for r in k.active_pods()} == {"running", "new"}
        assert k.pod_devices_by_uid() == {}  # kubelet forgot which devices the running pod holds
        env = k.start_containers(new)  # the plugin registered meanwhile: Allocate from the pod worker
        assert calls(k)[n_calls:] == [("uid-new", "m")] and env["m"]["FAKE_PLUGIN"] == "fixed"
        # the running container is not started again: it keeps the env it started with, no Allocate for it
        assert k.start_containers(running)["m"]["FAKE_DEVICES"] == "dev-0,dev-1"
        assert calls(k)[n_calls:] == [("uid-new", "m")]
        # kubelet no longer knows those devices are taken: it handed them out again (upstream does too)
        assert env["m"]["FAKE_DEVICES"] == "dev-0,dev-1,dev-2"
    finally:
        stop_node(node)


# -- driven by the API server ------------------------------------------------------------------------------


def test_run_with_kube_reports_phase_reason_and_message_and_tells_uids_apart():
    node = make_node(predicate=cpu_rejects("c-hog"))
    kube = FakeKube()
    try:
        node.plugin.failures[1] = (grpc.StatusCode.INTERNAL, "boom")  # the 2nd Allocate: pod b
        for name in ("a-ok", "b-broken", "c-hog"):
            kube.add_pod(make_pod(name, [("m", 1)]))

        def status(name: str) -> dict[str, Any]:
            return kube.pods[("default", name)]["status"]

        node.kubelet.run_with_kube(kube, NODE, order=lambda b: sorted(b, key=lambda p: p["metadata"]["name"]))
        node.kubelet.wait_for(
            lambda: [status(n)["phase"] for n in ("a-ok", "b-broken", "c-hog")] == ["Running", "Failed", "Failed"],
            10,
            "phases written",
        )
        assert status("b-broken")["reason"] == "UnexpectedAdmissionError"
        assert status("b-broken")["message"] == (
            "Pod was rejected: Allocate failed due to rpc error: code = Internal desc = boom, which is unexpected"
        )
        assert [(c["name"], list(c["state"])) for c in status("a-ok")["containerStatuses"]] == [("m", ["running"])]
        assert status("c-hog")["reason"] == "OutOfcpu"
        assert status("c-hog")["message"].startswith("Pod was rejected: Node didn't have enough resource: cpu")
        # a-ok deleted and created again under its name: another pod, allocated afresh
        kube.delete_pod("default", "a-ok")
        kube.add_pod(make_pod("a-ok", [("m", 1)], uid="uid-a-ok-2"))
        node.kubelet.wait_for(lambda: ("uid-a-ok-2", "m") in calls(node.kubelet), 10, "the new a-ok allocated")
        node.kubelet.wait_for(lambda: status("a-ok")["phase"] == "Running", 10, "the new a-ok Running")
        assert node.kubelet.pod_record("uid-a-ok") is None
    finally:
        stop_node(node)
