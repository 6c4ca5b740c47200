"""The pure matcher, device list and backends: the cases a kubelet stand-in cannot easily produce."""

from __future__ import annotations

import threading

import pytest

from share_core.contract import MemoryUnit
from share_core.contract import device_id
from share_core.fake import FakeKube
from share_core.kube import Unavailable
from share_core.retry import Backoff
from share_node.backend import Gpu
from share_node.backend.nvml import DEFAULT_IGNORED_XIDS
from share_node.backend.nvml import parse_xids
from share_node.backend.sim import SimBackend
from share_node.backend.sim import parse_sim_gpus
from share_node.backend.sim import sim_uuid
from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.devices import KUBELET_MAX_RECV_BYTES
from share_plugin.devices import DeviceListTooLarge
from share_plugin.devices import check_message_size
from share_plugin.devices import device_list
from share_plugin.devices import gpu_infos
from share_plugin.matcher import AllocationError
from share_plugin.matcher import container_env
from share_plugin.matcher import match_allocation
from share_plugin.matcher import runs_without_gpu
from share_plugin.podresources import view_from_response
from share_plugin.publisher import Publisher
from tests.unit.plugin.simnode import NODE
from tests.unit.plugin.simnode import assign
from tests.unit.plugin.simnode import make_pod

GPUS = [Gpu(i, f"GPU-{i}", "Tesla T4", 16 * 1024**3, i) for i in range(2)]


def ids(n: int, gpu: int = 0, start: int = 0) -> list[str]:
    return [device_id(f"GPU-{gpu}", k) for k in range(start, start + n)]


def pod(name: str, ctrs: list[tuple[str, int]], gpu: int, t: int, **kw) -> dict:
    p = make_pod(name, ctrs, **kw)
    return assign(p, [gpu], [f"GPU-{gpu}"], sum(u for _, u in ctrs), t)


def test_pod_resources_picks_the_admitting_pod_among_same_sizes():
    a, b = pod("a", [("m", 2)], 0, 1), pod("b", [("m", 2)], 1, 2)
    view = {("default", "b"): {"m": frozenset()}}  # kubelet is admitting b only
    m = match_allocation(NODE, ids(2), [a, b], GPUS, MemoryUnit.GiB, view)
    assert (m.name, m.gpus[0].index, m.last) == ("b", 1, True)


def test_served_containers_come_from_pod_resources():
    p = pod("p", [("a", 1), ("b", 3)], 1, 1)
    view = {("default", "p"): {"a": frozenset(ids(1, 0, 9)), "b": frozenset()}}
    m = match_allocation(NODE, ids(3), [p], GPUS, MemoryUnit.GiB, view)
    assert m.container.name == "b" and m.last


def test_device_ids_recorded_for_a_container_identify_it():
    a = pod("a", [("m", 2)], 0, 1)
    b = pod("b", [("m", 2)], 1, 2)
    view = {("default", "a"): {"m": frozenset()}, ("default", "b"): {"m": frozenset(ids(2))}}
    m = match_allocation(NODE, ids(2), [a, b], GPUS, MemoryUnit.GiB, view)
    assert (m.name, m.container.name) == ("b", "m")
    assert "device IDs" in m.how


def running(p: dict, *names: str) -> dict:
    p["status"] = {"phase": "Running", "containerStatuses": [{"name": n, "state": {"running": {}}} for n in names]}
    return p


def test_regular_init_container_is_served_first_though_pod_resources_never_lists_it():
    """server_v1.go List skips regular init containers: progress comes from our memory of serving it."""
    p = pod("p", [("m", 3)], 1, 1, init=[("i", 2)])
    view = {("default", "p"): {"m": frozenset()}}  # what kubelet lists: no "i"
    first = match_allocation(NODE, ids(2), [p], GPUS, MemoryUnit.GiB, view)
    assert (first.container.name, first.last) == ("i", False)
    second = match_allocation(NODE, ids(3), [p], GPUS, MemoryUnit.GiB, view, frozenset({("uid-p", "i")}))
    assert (second.container.name, second.last) == ("m", True)


def test_equal_init_and_app_sizes_serve_both_and_mark_the_pod_assigned_after_the_app():
    p = pod("p", [("m", 2)], 1, 1, init=[("i", 2)])
    view = {("default", "p"): {"m": frozenset()}}
    first = match_allocation(NODE, ids(2), [p], GPUS, MemoryUnit.GiB, view)
    second = match_allocation(NODE, ids(2), [p], GPUS, MemoryUnit.GiB, view, frozenset({("uid-p", "i")}))
    assert [(x.container.name, x.last) for x in (first, second)] == [("i", False), ("m", True)]
    # once kubelet records the app container's devices, the pod is no longer a candidate
    view = {("default", "p"): {"m": frozenset(ids(2))}}
    q = pod("q", [("m", 2)], 0, 2)
    view[("default", "q")] = {"m": frozenset()}
    assert match_allocation(NODE, ids(2, start=4), [p, q], GPUS, MemoryUnit.GiB, view).name == "q"


def test_init_container_known_served_when_a_later_container_holds_devices():
    p = pod("p", [("m1", 2), ("m2", 3)], 1, 1, init=[("i", 2)])
    view = {("default", "p"): {"m1": frozenset(ids(2)), "m2": frozenset()}}  # plugin restarted meanwhile
    m = match_allocation(NODE, ids(3, start=5), [p], GPUS, MemoryUnit.GiB, view)
    assert (m.container.name, m.last) == ("m2", True)


def test_sidecar_is_listed_and_keeps_its_own_devices():
    p = pod("p", [("m", 3)], 0, 1, sidecars=[("s", 1)])
    view = {("default", "p"): {"s": frozenset(), "m": frozenset()}}
    assert match_allocation(NODE, ids(1), [p], GPUS, MemoryUnit.GiB, view).container.name == "s"
    view = {("default", "p"): {"s": frozenset(ids(1)), "m": frozenset()}}
    m = match_allocation(NODE, ids(3, start=1), [p], GPUS, MemoryUnit.GiB, view)
    assert (m.container.name, m.last) == ("m", True)


def test_pod_of_another_scheduler_is_refused_and_named_never_served_a_gpushare_gpu():
    ours = pod("ours", [("m", 2)], 0, 1)
    other = make_pod("other", [("m", 2)])
    other["spec"]["schedulerName"] = "default-scheduler"
    view = {("default", "ours"): {"m": frozenset()}, ("default", "other"): {"m": frozenset()}}
    with pytest.raises(AllocationError, match="gpushare cannot serve") as err:
        match_allocation(NODE, ids(2), [ours, other], GPUS, MemoryUnit.GiB, view)
    assert "default/other" in str(err.value) and "default-scheduler" in str(err.value)
    assert [p["metadata"]["name"] for p in err.value.implicated] == ["other"]
    # alone, it is refused too, with the same clear reason
    with pytest.raises(AllocationError, match="gpushare cannot serve"):
        match_allocation(NODE, ids(2), [other], GPUS, MemoryUnit.GiB, {("default", "other"): {"m": frozenset()}})
    # a different size cannot be it
    m = match_allocation(NODE, ids(2), [ours, make_pod("x", [("m", 5)])], GPUS, MemoryUnit.GiB, view)
    assert m.name == "ours"


def test_without_pod_resources_another_schedulers_pod_of_that_size_blocks_serving():
    ours = pod("ours", [("m", 2)], 0, 1)
    other = make_pod("other", [("m", 2)])
    other["spec"]["schedulerName"] = "default-scheduler"
    with pytest.raises(AllocationError, match="gpushare cannot serve") as err:
        match_allocation(NODE, ids(2), [ours, other], GPUS, MemoryUnit.GiB, None)
    assert err.value.implicated
    # once it runs it was admitted already: it cannot be the pod kubelet is admitting now
    running(other, "m")
    assert match_allocation(NODE, ids(2), [ours, other], GPUS, MemoryUnit.GiB, None).name == "ours"


def test_without_pod_resources_any_other_pending_container_of_that_size_blocks_serving():
    a = pod("a", [("m", 2)], 0, 1)
    b = pod("b", [("m", 3)], 1, 2, init=[("i", 2)])  # b's init container also asks 2
    with pytest.raises(AllocationError, match="assigned different GPUs"):
        match_allocation(NODE, ids(2), [a, b], GPUS, MemoryUnit.GiB, None)


def test_pod_started_without_allocate_is_reported_and_never_pending():
    broken = running(pod("broken", [("m", 2)], 1, 1), "m")
    fresh = pod("fresh", [("m", 2)], 0, 2)
    view = {("default", "broken"): {"m": frozenset()}, ("default", "fresh"): {"m": frozenset()}}
    found = runs_without_gpu([broken, fresh], view)
    assert [(f.key, f.containers) for f in found] == [("default/broken", ("m",))]
    assert "delete the pod" in found[0].message(NODE)
    assert match_allocation(NODE, ids(2), [broken, fresh], GPUS, MemoryUnit.GiB, view).name == "fresh"
    with pytest.raises(AllocationError, match="started without Allocate"):
        match_allocation(NODE, ids(2), [broken], GPUS, MemoryUnit.GiB, {("default", "broken"): {"m": frozenset()}})


def test_reallocate_from_the_pod_worker_serves_the_same_gpu_again():
    """GetDeviceRunContainerOptions re-allocates a container with no recorded devices before it starts."""
    p = pod("p", [("m", 2)], 1, 1)
    p["metadata"]["annotations"]["gpushare.io/assigned"] = "true"
    p["status"] = {"phase": "Pending", "containerStatuses": [{"name": "m", "state": {"waiting": {}}}]}
    m = match_allocation(NODE, ids(2), [p], GPUS, MemoryUnit.GiB, {("default", "p"): {"m": frozenset()}})
    assert (m.name, m.gpus[0].index) == ("p", 1)


def test_two_admitting_pods_on_different_gpus_is_an_error_not_a_guess():
    a, b = pod("a", [("m", 2)], 0, 1), pod("b", [("m", 2)], 1, 2)
    view = {("default", "a"): {"m": frozenset()}, ("default", "b"): {"m": frozenset()}}
    with pytest.raises(AllocationError, match="assigned different GPUs") as err:
        match_allocation(NODE, ids(2), [a, b], GPUS, MemoryUnit.GiB, view)
    assert "default/a" in str(err.value) and "default/b" in str(err.value)


def test_identical_candidates_are_interchangeable():
    a, b = pod("a", [("m", 2)], 0, 5), pod("b", [("m", 2)], 0, 3)
    view = {("default", "a"): {"m": frozenset()}, ("default", "b"): {"m": frozenset()}}
    m = match_allocation(NODE, ids(2), [a, b], GPUS, MemoryUnit.GiB, view)
    assert m.name == "b"  # earliest assume time


def test_without_pod_resources_size_must_be_unambiguous():
    a, b, c = pod("a", [("m", 2)], 0, 1), pod("b", [("m", 3)], 1, 2), pod("c", [("m", 3)], 0, 3)
    m = match_allocation(NODE, ids(2), [a, b, c], GPUS, MemoryUnit.GiB, None)
    assert m.name == "a" and "PodResources unavailable" in m.how
    with pytest.raises(AllocationError, match="could take a container asking 3"):
        match_allocation(NODE, ids(3), [a, b, c], GPUS, MemoryUnit.GiB, None)
    # served containers are remembered without PodResources
    with pytest.raises(AllocationError, match="no pod to serve"):
        match_allocation(NODE, ids(2), [a], GPUS, MemoryUnit.GiB, None, frozenset({("uid-a", "m")}))


def test_finished_and_garbage_pods():
    done = pod("done", [("m", 2)], 0, 1)
    done["status"]["phase"] = "Succeeded"
    bad = pod("bad", [("m", 2)], 0, 2)
    bad["metadata"]["annotations"]["gpushare.io/gpu-index"] = "zero"
    view = {("default", "done"): {"m": frozenset()}, ("default", "bad"): {"m": frozenset()}}
    with pytest.raises(AllocationError) as err:
        match_allocation(NODE, ids(2), [done, bad], GPUS, MemoryUnit.GiB, view)
    assert "default/bad (bad assignment" in str(err.value) and "default/done" not in str(err.value)


def test_env_per_container():
    p = pod("p", [("m", 5)], 1, 1)
    m = match_allocation(NODE, ids(5), [p], GPUS, MemoryUnit.GiB, {("default", "p"): {"m": frozenset()}})
    env = container_env(m, MemoryUnit.GiB, device_id_strategy="index", mps=True)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "1" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5120M"
    assert env["GPUSHARE_MEM_TOTAL_MIB"] == "16384" and env["ALIYUN_COM_GPU_MEM_DEV"] == "16"


# -- device list and wire size -------------------------------------------------------------------------


def test_message_sizes_against_kubelet_limit():
    eight_a100 = [Gpu(i, sim_uuid("n", i), "A100", 80 * 1024**3, i) for i in range(8)]
    gib = device_list(eight_a100, MemoryUnit.GiB)
    assert len(gib.devices) == 640 and check_message_size(gib, eight_a100, MemoryUnit.GiB) < 64 * 1024
    mib = device_list(eight_a100, MemoryUnit.MiB)
    assert len(mib.devices) == 655360 and mib.ByteSize() > KUBELET_MAX_RECV_BYTES
    with pytest.raises(DeviceListTooLarge, match="use --memory-unit GiB"):
        check_message_size(mib, eight_a100, MemoryUnit.MiB)
    one_t4 = [Gpu(0, sim_uuid("n", 0), "T4", 16 * 1024**3, 0)]
    assert check_message_size(device_list(one_t4, MemoryUnit.MiB), one_t4, MemoryUnit.MiB) < KUBELET_MAX_RECV_BYTES


def test_unhealthy_gpu_devices_and_infos():
    gpus = [GPUS[0], Gpu(1, "GPU-1", "T4", 16 * 1024**3 + 5, 1, healthy=False)]
    resp = device_list(gpus, MemoryUnit.GiB)
    assert sum(d.health == "Unhealthy" for d in resp.devices) == 16
    assert [(g.memory, g.healthy) for g in gpu_infos(gpus, MemoryUnit.GiB)] == [(16, True), (16, False)]


# -- backends --------------------------------------------------------------------------------------------


def test_sim_spec_and_stable_uuids():
    assert parse_sim_gpus("2xA100:80GiB,1xT4:16GiB") == [
        ("NVIDIA A100-SXM4-80GB", 80 * 1024**3),
        ("NVIDIA A100-SXM4-80GB", 80 * 1024**3),
        ("Tesla T4", 16 * 1024**3),
    ]
    for bad in ("", "2A100:80GiB", "0xT4:16GiB", "1xT4:16GB"):
        with pytest.raises(Exception, match="sim-gpus"):
            parse_sim_gpus(bad)
    a, b = SimBackend("2xT4:16GiB", "node-a"), SimBackend("2xT4:16GiB", "node-a")
    assert [g.uuid for g in a.gpus()] == [g.uuid for g in b.gpus()]
    assert a.gpus()[0].uuid != SimBackend("2xT4:16GiB", "node-b").gpus()[0].uuid
    assert a.gpus()[0].uuid.startswith("GPU-") and len(device_id(a.gpus()[0].uuid, 9999)) <= 63


def test_sim_set_health_reports_change():
    sim = SimBackend("2xT4:16GiB", "n", poll_interval=0.01)
    seen: list[tuple[str, bool, str]] = []
    stop = threading.Event()
    t = threading.Thread(target=sim.watch_health, args=(stop, lambda *a: seen.append(a)))
    t.start()
    sim.set_health(1, False)
    for _ in range(200):
        if seen:
            break
        stop.wait(0.01)
    stop.set()
    t.join()
    assert seen == [(sim.gpus()[1].uuid, False, "set by test")] and not sim.gpus()[1].healthy
    with pytest.raises(KeyError):
        sim.set_health(7, False)


def test_xid_parsing():
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_IGNORED_XIDS
    assert parse_xids("13, 48,") == {13, 48}
    with pytest.raises(ValueError, match="'x'"):
        parse_xids("13,x")


def test_publisher_retries_in_background_until_api_server_answers():
    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE}})
    kube.fail("patch_node_annotations", Unavailable("API server unreachable"), times=3)
    pub = Publisher(NODE, kube, Backoff(initial=0.01, maximum=0.02))
    pub.start()
    pub.publish(gpu_infos(GPUS, MemoryUnit.GiB))  # returns at once
    for _ in range(300):
        if pub.published:
            break
        threading.Event().wait(0.01)
    pub.stop()
    assert pub.published and kube.calls["patch_node_annotations"] == 4
    assert kube.nodes[NODE]["status"]["capacity"]["nvidia.com/gpu-count"] == "2"


def test_listed_twice_under_one_name_merges_what_each_entry_holds():
    """Before 1.34 PodResources lists a terminated pod and its re-created namesake (no UIDs): one view
    entry; only the active one can hold devices (UpdateAllocatedDevices freed the other's)."""

    def entry(held: list[str]) -> prpb.PodResources:
        dev = prpb.ContainerDevices(resource_name="nvidia.com/gpu-mem", device_ids=held)
        return prpb.PodResources(
            name="p", namespace="default", containers=[prpb.ContainerResources(name="m", devices=[dev])]
        )

    for order in ([[], ids(2)], [ids(2), []]):
        resp = prpb.ListPodResourcesResponse(pod_resources=[entry(h) for h in order])
        assert view_from_response(resp, "nvidia.com/gpu-mem") == {("default", "p"): {"m": frozenset(ids(2))}}


def test_served_container_holding_nothing_is_not_admitting():
    """A container this plugin served whose devices kubelet freed belongs to a pod that is no longer active
    (rejected after Allocate, or terminated; listed before 1.34 until the API shows it Failed)."""
    a, b = pod("a", [("m", 2)], 0, 1), pod("b", [("m", 2)], 1, 2)
    view = {("default", "a"): {"m": frozenset()}, ("default", "b"): {"m": frozenset()}}
    with pytest.raises(AllocationError, match="2 pods could take"):
        match_allocation(NODE, ids(2), [a, b], GPUS, MemoryUnit.GiB, view)
    m = match_allocation(NODE, ids(2), [a, b], GPUS, MemoryUnit.GiB, view, frozenset({("uid-a", "m")}))
    assert (m.name, m.gpus[0].index, m.alternatives) == ("b", 1, 0)
    assert runs_without_gpu([a, b], view) == []
