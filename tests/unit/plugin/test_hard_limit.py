"""--hard-limit without a GPU: the probe's verdicts, the NVML stand-in as NVIDIA documents it, the limiter on a
cgroup tree of files, and the device plugin's PreStartContainer driven by the kubelet stand-in."""

from __future__ import annotations

import json
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

from share_core.contract import ANN_NODE_HARD_LIMIT
from share_core.contract import HardLimitMode
from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_core.retry import Backoff
from share_node.backend import GpuProcess
from share_node.backend import GpuReading
from share_node.backend.sim import SimBackend
from share_node.backend.simlimits import SimMemoryLimits
from share_node.backend.simlimits import read_state
from share_node.hardlimit import LIMIT_MAX
from share_node.hardlimit import Facts
from share_node.hardlimit import GpuFacts
from share_node.hardlimit import HardLimiter
from share_node.hardlimit import HardLimitError
from share_node.hardlimit import LimitError
from share_node.hardlimit import LimitErrorCode
from share_node.hardlimit import cgroup_populated
from share_node.hardlimit import check_required
from share_node.hardlimit import decide_support
from share_node.hardlimit import find_pod_cgroups
from share_node.hardlimit import pod_gpu_limits
from share_node.hardlimit import pod_uid_of_dir
from share_node.hardlimit import probe
from share_node.hardlimit import static_problem
from share_plugin.allocator import Allocator
from share_plugin.hardlimit import PluginHardLimit
from share_plugin.node import PluginNode
from share_plugin.podresources import PodResourcesClient
from share_plugin.publisher import Publisher
from share_plugin.server import DevicePlugin
from share_plugin.server import PluginConfig
from share_plugin.usage import driver_usage
from share_plugin.usage import index_pods
from share_plugin.usage import summarize
from tests.kubelet import KubeletStandIn
from tests.unit.plugin.simnode import NODE
from tests.unit.plugin.simnode import _short_dir
from tests.unit.plugin.simnode import make_pod

GIB = 1024**3
V2 = lambda _path: "cgroup2"  # noqa: E731 - the stand-in's view of a tmp dir: cgroup v2
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


def facts(**kw: Any) -> Facts:
    base: dict[str, Any] = {
        "mode": HardLimitMode.AUTO,
        "symbol": True,
        "driver": "615.20.01",
        "cgroup_root": "/sys/fs/cgroup",
        "cgroup_v2": True,
        "gpus": (GpuFacts(GPU0, False),),
    }
    return Facts(**{**base, **kw})


# -- the verdicts ---------------------------------------------------------------------------------------------


def test_hard_limit_unsupported_driver_is_named_with_its_version() -> None:
    problem = static_problem(facts(driver="580.159.04"))
    assert problem == "unsupported driver 580.159.04: the per-cgroup GPU memory limit needs R615 or newer"
    support = decide_support(facts(driver="580.159.04"), None)
    assert not support.enforced and "unsupported driver 580.159.04" in support.reason
    assert "falling back" in support.reason


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"mode": HardLimitMode.OFF}, "turned off"),
        ({"symbol": False}, "no nvmlDeviceSetMemoryLimits_v1"),
        ({"cgroup_v2": False}, "not cgroup v2"),
        ({"gpus": (GpuFacts("MIG-a", True), GpuFacts("MIG-b", True))}, "MIG"),
        ({"driver": "garbage"}, "unsupported driver garbage"),
    ],
)
def test_hard_limit_static_problems(kw: dict[str, Any], says: str) -> None:
    problem = static_problem(facts(**kw))
    assert problem is not None and says in problem


def test_hard_limit_enforced_leaves_mig_instances_out() -> None:
    f = facts(gpus=(GpuFacts(GPU0, False), GpuFacts("MIG-x", True)))
    assert static_problem(f) is None
    support = decide_support(f, None)
    assert support.enforced and support.gpus == (GPU0,) and "MIG-x" in support.reason
    assert not decide_support(f, "read back 0 bytes").enforced


def test_hard_limit_cgroup_mode_refuses_an_unsupported_node() -> None:
    with pytest.raises(HardLimitError, match="unsupported driver 580"):
        check_required(decide_support(facts(mode=HardLimitMode.CGROUP, driver="580.95.05"), None))
    check_required(decide_support(facts(mode=HardLimitMode.AUTO, driver="580.95.05"), None))  # auto falls back


def test_hard_limit_annotation_json() -> None:
    support = decide_support(facts(driver="580.95.05"), None)
    raw = json.loads(support.annotation("share-plugin", "2026-11-26T00:00:00Z"))
    assert raw["enforced"] is False and raw["mode"] == "auto" and raw["driver"] == "580.95.05"
    assert raw["agent"] == "share-plugin" and "unsupported driver 580.95.05" in raw["reason"]


# -- what a pod gets ------------------------------------------------------------------------------------------


def assigned(pod: dict[str, Any], uuids: list[str], total: int) -> dict[str, Any]:
    from share_core.assignment import Assignment

    pod["metadata"]["uid"] = str(uuidlib.uuid4())
    pod["metadata"]["annotations"].update(Assignment(tuple(range(len(uuids))), tuple(uuids), total, 1).to_annotations())
    return pod


def test_hard_limit_pod_total_per_gpu() -> None:
    gpus = [(0, GPU0), (1, GPU1)]
    two = assigned(make_pod("p", [("a", 2), ("b", 3)]), [GPU0], 5)
    assert pod_gpu_limits(two, gpus, MemoryUnit.GiB) == {GPU0: 5 * GIB}
    init = assigned(make_pod("i", [("a", 2)], init=[("setup", 4)]), [GPU0], 4)
    assert pod_gpu_limits(init, gpus, MemoryUnit.GiB) == {GPU0: 4 * GIB}  # max(init, app sum)
    spread = assigned(make_pod("s", [("a", 8)], gpu_count=2), [GPU0, GPU1], 8)
    assert pod_gpu_limits(spread, gpus, MemoryUnit.GiB) == {GPU0: 4 * GIB, GPU1: 4 * GIB}
    mib = assigned(make_pod("m", [("a", 1536)]), [GPU0], 1536)
    assert pod_gpu_limits(mib, gpus, MemoryUnit.MiB) == {GPU0: 1536 * 1024 * 1024}
    assert pod_gpu_limits(make_pod("unplaced", [("a", 1)]), gpus, MemoryUnit.GiB) is None
    done = assigned(make_pod("done", [("a", 1)]), [GPU0], 1)
    done["status"]["phase"] = "Succeeded"
    assert pod_gpu_limits(done, gpus, MemoryUnit.GiB) is None


def test_hard_limit_pod_cgroup_names() -> None:
    uid = "5e0b4c1a-9d2f-4f7e-8a3b-1c2d3e4f5a6b"
    assert pod_uid_of_dir(f"pod{uid}") == uid
    assert pod_uid_of_dir(f"kubepods-burstable-pod{uid.replace('-', '_')}.slice") == uid
    assert pod_uid_of_dir(f"kubepods-pod{uid.replace('-', '_')}.slice") == uid
    assert pod_uid_of_dir("burstable") is None and pod_uid_of_dir("kubepods.slice") is None


# -- the stand-in, as NVIDIA documents the API ------------------------------------------------------------------


def pod_cgroup(root: Path, uid: str, systemd: bool = False) -> Path:
    if systemd:
        name = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        path = root / "kubepods.slice" / "kubepods-burstable.slice" / name
    else:
        path = root / "kubepods" / "burstable" / f"pod{uid}"
    path.mkdir(parents=True)
    (path / "cgroup.procs").write_text("")
    return path


def standin(tmp_path: Path, **kw: Any) -> SimMemoryLimits:
    kw.setdefault("fstype", V2)
    kw.setdefault("euid", lambda: 0)
    return SimMemoryLimits(str(tmp_path / "limits.json"), **kw)


def test_hard_limit_standin_per_cgroup_path(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    nvml = standin(tmp_path)
    nvml.set(GPU0, str(a), 2 * GIB, 2 * GIB)
    assert nvml.get(GPU0, str(a)).hard == 2 * GIB
    assert not nvml.get(GPU0, str(b)).limited  # another cgroup: no limit
    assert not nvml.get(GPU1, str(a)).limited  # another GPU: no limit
    # The driver holds it, not the process: another instance (a restarted agent) reads it.
    assert standin(tmp_path).get(GPU0, str(a)).hard == 2 * GIB
    nvml.set(GPU0, str(a), 0, LIMIT_MAX)  # NVIDIA's way to clear
    assert not nvml.get(GPU0, str(a)).limited
    nvml.set(GPU0, str(b), GIB, GIB)
    b.rmdir()  # removing the cgroup clears its limits too
    with pytest.raises(LimitError) as err:
        nvml.get(GPU0, str(b))
    assert err.value.code is LimitErrorCode.NOT_FOUND
    ops = [(e["op"], e["path"]) for e in read_state(str(tmp_path / "limits.json"))["journal"]]
    assert ("clear", str(a)) in ops and ("removed-with-cgroup", str(b)) in ops


def test_hard_limit_standin_refuses_old_drivers_mig_and_non_root(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    for nvml, gpu in (
        (standin(tmp_path, driver_version="580.95.05"), GPU0),
        (standin(tmp_path, mig_uuids=["MIG-1"]), "MIG-1"),
    ):
        with pytest.raises(LimitError) as err:
            nvml.set(gpu, str(a), GIB, GIB)
        assert err.value.code is LimitErrorCode.NOT_SUPPORTED
    user = standin(tmp_path, euid=lambda: 1000)
    with pytest.raises(LimitError) as err:
        user.set(GPU0, str(a), GIB, GIB)
    assert err.value.code is LimitErrorCode.NO_PERMISSION
    assert not user.get(GPU0, str(a)).limited  # reading needs no root
    v1 = standin(tmp_path, fstype=lambda _p: "cgroup")
    with pytest.raises(LimitError) as err:
        v1.set(GPU0, str(a), GIB, GIB)
    assert err.value.code is LimitErrorCode.INVALID_ARGUMENT
    standin(tmp_path, fstype=lambda _p: "cgroup", accept_cgroup_v1=True).set(GPU0, str(a), GIB, GIB)


def test_hard_limit_standin_current_used_counts_the_cgroups_processes(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, path in ((11, "/kubepods/burstable/podA/c1"), (12, "/kubepods/burstable/podA/c2"), (13, "/other")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::{path}\n")
    reading = GpuReading(
        0, GPU0, 16 * GIB, 0, (GpuProcess(GPU0, 11, GIB), GpuProcess(GPU0, 12, 2 * GIB), GpuProcess(GPU0, 13, GIB))
    )
    nvml = standin(tmp_path, readings=lambda: [reading], proc_root=str(proc))
    pod = Path("/kubepods/burstable/podA")
    nvml._check = lambda *_a: None  # type: ignore[method-assign]  # the path exists only in the fake /proc
    assert nvml.get(GPU0, str(pod)).current_used == 3 * GIB


# -- the probe ---------------------------------------------------------------------------------------------------


def test_hard_limit_probe_sets_reads_back_clears_and_removes_its_scratch(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    nvml = standin(tmp_path)
    support = probe(nvml, HardLimitMode.AUTO, str(root), [GpuFacts(GPU0, False)], fstype=V2)
    assert support.enforced, support.reason
    assert list(root.iterdir()) == []  # the scratch cgroup is gone
    ops = [e["op"] for e in read_state(str(tmp_path / "limits.json"))["journal"]]
    assert ops == ["set", "clear"]  # cleared before the cgroup was removed


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"driver_version": "580.95.05"}, "unsupported driver 580.95.05"),
        ({"euid": lambda: 1000}, "no permission"),
        ({"fstype": lambda _p: "cgroup"}, "invalid argument"),
    ],
)
def test_hard_limit_probe_falls_back_and_says_why(tmp_path: Path, kw: dict[str, Any], says: str) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    support = probe(standin(tmp_path, **kw), HardLimitMode.AUTO, str(root), [GpuFacts(GPU0, False)], fstype=V2)
    assert not support.enforced and says in support.reason, support.reason
    assert list(root.iterdir()) == []


def test_hard_limit_probe_cgroup_v1_node(tmp_path: Path) -> None:
    support = probe(
        standin(tmp_path), HardLimitMode.AUTO, "/sys/fs/cgroup", [GpuFacts(GPU0, False)], fstype=lambda _p: "tmpfs"
    )
    assert not support.enforced and "/sys/fs/cgroup is not cgroup v2" in support.reason


# -- the limiter on a tree of files --------------------------------------------------------------------------------


def limiter_on(tmp_path: Path, gpus: tuple[str, ...] = (GPU0, GPU1)) -> tuple[HardLimiter, SimMemoryLimits, Path]:
    root = tmp_path / "cg"
    root.mkdir(exist_ok=True)
    nvml = standin(tmp_path)
    support = decide_support(facts(gpus=tuple(GpuFacts(g, False) for g in gpus)), None)
    return HardLimiter(nvml, support, str(root), NODE), nvml, root


def test_hard_limit_pod_cgroup_gets_soft_and_hard(tmp_path: Path) -> None:
    limiter, nvml, root = limiter_on(tmp_path)
    uid = str(uuidlib.uuid4())
    path = pod_cgroup(root, uid, systemd=True)
    limiter.limit_pod(uid, "ns/p", {GPU0: 3 * GIB, "MIG-x": GIB})
    got = nvml.get(GPU0, str(path))
    assert (got.soft, got.hard) == (3 * GIB, 3 * GIB)
    limiter.limit_pod(uid, "ns/p", {GPU0: 3 * GIB})  # the pod's next container: nothing new
    sets = [e for e in read_state(str(tmp_path / "limits.json"))["journal"] if e["op"] == "set"]
    assert len(sets) == 1
    with pytest.raises(HardLimitError, match="is not under"):
        limiter.limit_pod(str(uuidlib.uuid4()), "ns/nocgroup", {GPU0: GIB})


def test_hard_limit_released_when_the_pod_cgroup_empties(tmp_path: Path) -> None:
    limiter, nvml, root = limiter_on(tmp_path)
    uid = str(uuidlib.uuid4())
    path = pod_cgroup(root, uid)
    (path / "cgroup.procs").write_text("4242\n")  # the sandbox runs
    limiter.limit_pod(uid, "ns/p", {GPU0: GIB})
    assert limiter.sweep() == [] and uid in limiter.pods()
    (path / "cgroup.procs").write_text("")  # every container and the sandbox exited
    assert limiter.sweep() == [uid]
    assert not nvml.get(GPU0, str(path)).limited  # cleared while the cgroup still exists
    # A pod whose cgroup was removed first: the driver cleared its limits with it; the limiter forgets it.
    uid2 = str(uuidlib.uuid4())
    path2 = pod_cgroup(root, uid2)
    limiter.limit_pod(uid2, "ns/q", {GPU1: GIB})
    (path2 / "cgroup.procs").unlink()
    path2.rmdir()
    assert limiter.sweep() == [uid2] and limiter.pods() == {}


def test_hard_limit_populated_from_cgroup_events(tmp_path: Path) -> None:
    (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert cgroup_populated(tmp_path)
    (tmp_path / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert not cgroup_populated(tmp_path)


def test_hard_limit_adopt_after_restart_keeps_sets_and_clears(tmp_path: Path) -> None:
    limiter, nvml, root = limiter_on(tmp_path)
    kept, late, gone = (str(uuidlib.uuid4()) for _ in range(3))
    for uid in (kept, late, gone):
        pod_cgroup(root, uid)
    limiter.limit_pod(kept, "ns/kept", {GPU0: 2 * GIB})
    limiter.limit_pod(gone, "ns/gone", {GPU1: GIB})
    assert set(find_pod_cgroups(root)) == {kept, late, gone}
    fresh, _, _ = limiter_on(tmp_path)  # a restarted plugin: it knows nothing
    report = fresh.adopt({kept: ("ns/kept", {GPU0: 2 * GIB}), late: ("ns/late", {GPU0: GIB})})
    assert report.kept == ["ns/kept"] and report.set_late == ["ns/late"] and report.cleared == [gone]
    assert set(fresh.pods()) == {kept, late}
    assert not nvml.get(GPU1, str(find_pod_cgroups(root)[gone])).limited


# -- the monitor's figure ----------------------------------------------------------------------------------------


def test_hard_limit_monitor_takes_the_drivers_current_used(tmp_path: Path) -> None:
    from share_node.hardlimit import Limits
    from share_plugin.usage import Usage

    pod = assigned(make_pod("p", [("a", 4)]), [GPU0], 4)
    pods = index_pods([pod], [(0, GPU0)], MemoryUnit.GiB)
    uid = pod["metadata"]["uid"]
    readings = [GpuReading(0, GPU0, 16 * GIB, 3 * GIB)]
    driver = driver_usage({uid: {GPU0: Limits(4 * GIB, 4 * GIB, 3 * GIB + 5 * 1024 * 1024)}}, pods, readings)
    assert driver == {("default", "p"): {0: (3 * GIB + 5 * 1024 * 1024, 4 * GIB)}}
    usage = Usage(gpus=[], containers=[], driver_pods=driver)
    assert summarize(usage).pods == {"default/p": {0: 3 * 1024 + 5}}


# -- PreStartContainer through the kubelet stand-in ---------------------------------------------------------------


def test_hard_limit_set_at_pre_start_before_the_container(tmp_path: Path) -> None:
    """kubelet (the stand-in, as devicemanager does) reads pre_start_required when the plugin connects and calls
    PreStartContainer before it starts each container: the pod cgroup holds the limit by then."""
    d = _short_dir()
    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE, "labels": {"gpushare": "true"}}, "status": {"capacity": {}}})
    backend = SimBackend("2xT4:16GiB", NODE, poll_interval=0.05)
    kubelet = KubeletStandIn(f"{d}/dp", f"{d}/pr/kubelet.sock")
    kubelet.start()
    pr = PodResourcesClient(kubelet.pod_resources_socket, "nvidia.com/gpu-mem")
    node = PluginNode(NODE, kube, backend, MemoryUnit.GiB)
    allocator = Allocator(node, pr)
    limiter, nvml, root = limiter_on(tmp_path, tuple(g.uuid for g in backend.gpus()))
    hard = PluginHardLimit(
        PluginNode(NODE, kube, backend, MemoryUnit.GiB), limiter.support, limiter, allocator.pod_of_devices
    )
    config = PluginConfig(device_plugin_dir=f"{d}/dp", watch_interval=0.05, audit_interval=0)
    plugin = DevicePlugin(node, config, allocator, Publisher(NODE, kube, Backoff(0.05, 0.2)), hard_limit=hard)
    plugin.start()
    try:
        kubelet.wait_for(lambda: bool(kubelet.devices), 10, "device list")
        assert kubelet.dm.options is not None and kubelet.dm.options.pre_start_required
        annotation = json.loads(kube.get_node(NODE)["metadata"]["annotations"][ANN_NODE_HARD_LIMIT])
        assert annotation["enforced"] is True
        uuid0 = backend.gpus()[0].uuid
        pod = make_pod("two", [("a", 2), ("b", 3)])
        pod["metadata"]["uid"] = str(uuidlib.uuid4())
        from tests.unit.plugin.simnode import assign

        kube.add_pod(assign(pod, [0], [uuid0], 5, 1))
        path = pod_cgroup(root, pod["metadata"]["uid"])
        kubelet.admit(kube.get_pod("default", "two"))
        assert not nvml.get(uuid0, str(path)).limited  # Allocate alone sets nothing
        kubelet.start_containers(kube.get_pod("default", "two"))
        got = nvml.get(uuid0, str(path))
        assert (got.soft, got.hard) == (5 * GIB, 5 * GIB)  # the pod's total: one budget for both containers
        assert hard.pre_starts == 2
        # A pod whose cgroup kubelet has not made: the container's start fails, kubelet retries.
        other = make_pod("nocg", [("a", 1)])
        other["metadata"]["uid"] = str(uuidlib.uuid4())
        kube.add_pod(assign(other, [1], [backend.gpus()[1].uuid], 1, 2))
        kubelet.admit(kube.get_pod("default", "nocg"))
        with pytest.raises(Exception, match="PreStartContainer rpc failed"):
            kubelet.start_containers(kube.get_pod("default", "nocg"))
    finally:
        plugin.stop()
        kubelet.stop()


def test_hard_limit_metrics_and_usage_annotation_from_the_driver(tmp_path: Path) -> None:
    """The monitor asks the driver for each limited pod's currentUsed; /metrics shows it with the limit, and
    whether the node enforces hard limits at all."""
    from prometheus_client import generate_latest

    from share_plugin.metrics import registry_for
    from share_plugin.monitor import Monitor
    from share_plugin.monitor import ProcFs

    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE, "labels": {"gpushare": "true"}}, "status": {"capacity": {}}})
    backend = SimBackend("1xT4:16GiB", NODE)
    uuid0 = backend.gpus()[0].uuid
    limiter, nvml, root = limiter_on(tmp_path, (uuid0,))
    pod = assigned(make_pod("p", [("a", 4)]), [uuid0], 4)
    pod["spec"]["nodeName"] = NODE
    kube.add_pod(pod)
    uid = pod["metadata"]["uid"]
    path = pod_cgroup(root, uid)
    limiter.limit_pod(uid, "default/p", {uuid0: 4 * GIB})
    nvml.readings = lambda: [GpuReading(0, uuid0, 16 * GIB, GIB, (GpuProcess(uuid0, 77, GIB),))]
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cgroup").write_text(f"0::{path}/abc\n")
    nvml.proc_root = proc
    hard = PluginHardLimit(PluginNode(NODE, kube, backend, MemoryUnit.GiB), limiter.support, limiter)
    monitor = Monitor(PluginNode(NODE, kube, backend, MemoryUnit.GiB), proc=ProcFs(str(proc)), hard_limit=hard)
    usage = monitor.poll_once()
    assert usage.driver_pods == {("default", "p"): {0: (GIB, 4 * GIB)}}
    text = generate_latest(registry_for(monitor)).decode()
    assert f'gpushare_hard_limit_enforced{{mode="auto",node="{NODE}"}} 1.0' in text
    labels = f'gpu="0",namespace="default",node="{NODE}",pod="p",uuid="{uuid0}"'
    assert f"gpushare_pod_gpu_memory_hard_limit_bytes{{{labels}}} 4.294967296e+09" in text
    assert f"gpushare_pod_gpu_memory_driver_used_bytes{{{labels}}} 1.073741824e+09" in text
