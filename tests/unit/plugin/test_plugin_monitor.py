"""GPU memory per container through the nvml backend (an NVML stand-in) and a fake `/proc`, warn and kill,
the metrics and the node annotation, on a node with a whole GPU and a GPU in MIG mode."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from share_core.assignment import Assignment
from share_core.contract import ANN_NODE_GPU_USAGE
from share_core.contract import EVENT_OVER_LIMIT
from share_core.contract import EVENT_OVER_LIMIT_KILLED
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_core.gpuusage import parse_gpu_usage
from share_node.backend.nvml import NvmlBackend
from share_plugin.cgroups import CgroupRef
from share_plugin.metrics import registry_for
from share_plugin.monitor import Killer
from share_plugin.monitor import Monitor
from share_plugin.monitor import ProcFs
from share_plugin.node import PluginNode
from share_plugin.usage import OverLimitMode
from tests.unit.plugin.test_plugin_nvml import FakeDevice
from tests.unit.plugin.test_plugin_nvml import fake_pynvml
from tests.unit.plugin.test_plugin_nvml import mig_a100

GIB = 1024**3
MIB = 1024**2
NODE = "n1"

H100 = FakeDevice("GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", 80 * GIB, 0)
A100, (MIG_A, MIG_B) = mig_a100("bbbbbbbb", 80, 1, [True, False, True])


def cid(n: int) -> str:
    return f"{n:064x}"


def uid(name: str) -> str:
    return f"{abs(hash(name)) % 10**8:08d}-1111-2222-3333-444455556666"


def pod(
    name: str,
    containers: list[tuple[str, int, int]],
    gpu: tuple[int, str] | None,
    namespace: str = "team",
) -> dict[str, Any]:
    """A running pod; containers as (name, gpu-mem units, container ID number); `gpu` its assigned (index, uuid)."""
    spec_containers = [
        {"name": n, "image": "x", "resources": {"limits": {RESOURCE_MEM: str(u)}} if u else {}}
        for n, u, _ in containers
    ]
    annotations: dict[str, str] = {}
    if gpu is not None:
        total = sum(u for _, u, _ in containers)
        annotations = Assignment((gpu[0],), (gpu[1],), total, 1, assigned=True).to_annotations()
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid(name), "annotations": annotations},
        "spec": {"schedulerName": SCHEDULER_NAME, "nodeName": NODE, "containers": spec_containers},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": n, "containerID": f"containerd://{cid(c)}"} for n, _, c in containers],
        },
    }


class FakeProc(ProcFs):
    """A tmp-dir /proc: <root>/<pid>/cgroup."""

    def put(self, pid: int, text: str) -> None:
        (self.root / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.root / str(pid) / "cgroup").write_text(text)

    def drop(self, pid: int) -> None:
        (self.root / str(pid) / "cgroup").unlink()
        (self.root / str(pid)).rmdir()


def v2_containerd(pod_uid: str, container: int) -> str:
    u = pod_uid.replace("-", "_")
    slices = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
    return f"0::{slices}/cri-containerd-{cid(container)}.scope\n"


def v1_cgroupfs(pod_uid: str, container: int) -> str:
    return f"11:memory:/kubepods/burstable/pod{pod_uid}/{cid(container)}\n0::/\n"


def v2_crio(pod_uid: str, container: int) -> str:
    return f"0::/kubepods.slice/kubepods-pod{pod_uid.replace('-', '_')}.slice/crio-{cid(container)}.scope\n"


def v2_docker(pod_uid: str, container: int) -> str:
    u = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/docker-{cid(container)}.scope\n"
    )


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class RecordingKiller(Killer):
    """The real checks (cgroup read again before the signal); the signal itself recorded."""

    def __init__(self, proc: ProcFs) -> None:
        self.signalled: list[int] = []
        fds: dict[int, int] = {}

        def open_pidfd(pid: int) -> int:
            if not (proc.root / str(pid)).exists():
                raise ProcessLookupError(pid)
            fds[pid + 10000] = pid
            return pid + 10000

        super().__init__(proc, open_pidfd, lambda fd, sig: self.signalled.append(fds[fd]), lambda fd: None)


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> types.SimpleNamespace:
    for d in (H100, A100, MIG_A, MIG_B):
        d.used, d.processes = 0, []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([H100, A100]))
    backend = NvmlBackend()
    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE, "labels": {"gpushare": "true"}}, "status": {"capacity": {}}})
    proc = FakeProc(str(tmp_path / "proc"))
    clock = Clock()
    return types.SimpleNamespace(backend=backend, kube=kube, proc=proc, clock=clock)


def monitor(n: types.SimpleNamespace, mode: OverLimitMode = OverLimitMode.WARN, grace: float = 30.0) -> Monitor:
    return Monitor(
        PluginNode(NODE, n.kube, n.backend, MemoryUnit.GiB),
        mode=mode,
        grace=grace,
        proc=n.proc,
        killer=RecordingKiller(n.proc),
        annotation_interval=30,
        annotation_threshold_mib=256,
        clock=n.clock,
    )


def test_mig_and_whole_gpus_are_offered_side_by_side(node: types.SimpleNamespace) -> None:
    gpus = node.backend.gpus()
    assert [(g.index, g.uuid, g.memory_bytes, g.device, g.parent_uuid) for g in gpus] == [
        (0, H100.uuid, 80 * GIB, "0", ""),
        (1, MIG_A.uuid, 40 * GIB, "1:0", A100.uuid),
        (2, MIG_B.uuid, 40 * GIB, "1:2", A100.uuid),
    ]
    assert gpus[1].model == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"


def setup_workload(n: types.SimpleNamespace) -> dict[str, dict[str, Any]]:
    """Four kinds of process on the node: a gpushare pod within its limit (v2 systemd containerd), one over
    its limit on a MIG instance (CRI-O), a pod that asked no gpu-mem (docker-shim), a process outside any pod,
    and one that NVML lists but that exited before its cgroup was read."""
    pods = {
        "within": pod("within", [("main", 8, 1), ("side", 0, 2)], (0, H100.uuid)),
        "over": pod("over", [("train", 4, 3)], (1, MIG_A.uuid)),
        "plain": pod("plain", [("app", 0, 4)], None, namespace="other"),
    }
    for p in pods.values():
        n.kube.add_pod(p)
    n.proc.put(101, v2_containerd(pods["within"]["metadata"]["uid"], 1))
    n.proc.put(102, v1_cgroupfs(pods["within"]["metadata"]["uid"], 1))
    n.proc.put(301, v2_crio(pods["over"]["metadata"]["uid"], 3))
    n.proc.put(401, v2_docker(pods["plain"]["metadata"]["uid"], 4))
    n.proc.put(501, "0::/system.slice/render-farm.service\n")
    H100.processes = [(101, 5 * GIB), (102, 1 * GIB), (401, 2 * GIB), (501, 3 * GIB), (999, 1 * GIB)]
    H100.used = 12 * GIB + 300 * MIB
    MIG_A.processes = [(301, 5 * GIB)]
    MIG_A.used = 5 * GIB + 100 * MIB
    return pods


def by_container(usage: Any) -> dict[tuple[str, str, str, int], tuple[int, int | None, list[int]]]:
    return {
        (c.key.namespace, c.key.pod, c.key.container, c.gpu_index): (c.used_bytes, c.limit_bytes, sorted(c.pids))
        for c in usage.containers
    }


def test_processes_map_to_their_containers(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    usage = monitor(node).poll_once()
    assert by_container(usage) == {
        ("team", "within", "main", 0): (6 * GIB, 8 * GIB, [101, 102]),  # v2 containerd + v1 cgroupfs, one container
        ("team", "over", "train", 1): (5 * GIB, 4 * GIB, [301]),  # MIG instance, CRI-O
        ("other", "plain", "app", 0): (2 * GIB, None, [401]),  # no gpu-mem asked: measured, not enforced
    }
    gpus = {g.index: g for g in usage.gpus}
    assert gpus[0].outside_pods_bytes == 3 * GIB  # PID 501, in no pod
    assert gpus[0].used_bytes == 12 * GIB + 300 * MIB and gpus[0].total_bytes == 80 * GIB
    assert gpus[2].used_bytes == 0
    assert usage.exited == [999]  # listed by NVML, gone from /proc


def test_warn_tells_once_per_crossing(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    m = monitor(node)
    m.poll_once()
    node.clock.t += 5
    m.poll_once()  # still over: no second Event
    events = [e for e in node.kube.events if e["reason"] == EVENT_OVER_LIMIT]
    assert len(events) == 1 and events[0]["pod"] == "over" and events[0]["type"] == "Warning"
    assert "5.00 GiB" in events[0]["message"] and "limit is 4.00 GiB" in events[0]["message"]
    assert "GPU 1 (" + MIG_A.uuid in events[0]["message"] and "--over-limit warn" in events[0]["message"]
    MIG_A.processes = [(301, 3 * GIB)]  # back under
    node.clock.t += 5
    m.poll_once()
    MIG_A.processes = [(301, 6 * GIB)]  # over again: a new crossing
    node.clock.t += 5
    m.poll_once()
    assert len([e for e in node.kube.events if e["reason"] == EVENT_OVER_LIMIT]) == 2
    assert not [e for e in node.kube.events if e["reason"] == EVENT_OVER_LIMIT_KILLED]
    assert m.killer.signalled == []  # type: ignore[attr-defined]


def test_kill_after_grace_touches_only_that_container(node: types.SimpleNamespace) -> None:
    pods = setup_workload(node)
    # another process of another pod on the same MIG instance, within its limit
    neighbour = pod("neighbour", [("n", 8, 5)], (1, MIG_A.uuid))
    node.kube.add_pod(neighbour)
    node.proc.put(302, v2_containerd(neighbour["metadata"]["uid"], 5))
    MIG_A.processes = [(301, 5 * GIB), (302, 7 * GIB)]
    m = monitor(node, OverLimitMode.KILL, grace=30)
    m.poll_once()
    assert m.killer.signalled == []  # type: ignore[attr-defined]  # within the grace period
    assert "ended if it is still over in 30s" in node.kube.events[0]["message"]
    node.clock.t += 31
    m.poll_once()
    assert m.killer.signalled == [301]  # type: ignore[attr-defined]
    killed = [e for e in node.kube.events if e["reason"] == EVENT_OVER_LIMIT_KILLED]
    assert len(killed) == 1 and killed[0]["pod"] == "over"
    assert "ended its process(es) 301" in killed[0]["message"] and "no other container or pod" in killed[0]["message"]
    assert pods["within"]["metadata"]["name"] not in killed[0]["message"]


def test_kill_skips_a_pid_that_left_the_container(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    m = monitor(node, OverLimitMode.KILL, grace=0)

    class Reused(FakeProc):
        reads = 0

        def cgroup(self, pid: int) -> str | None:
            text = super().cgroup(pid)
            if pid == 301:
                Reused.reads += 1
                if Reused.reads > 1:  # the re-read right before the signal: PID 301 is now another process
                    return "0::/system.slice/sshd.service\n"
            return text

    proc = Reused(str(node.proc.root))
    m.proc = proc
    m.killer = RecordingKiller(proc)
    m.poll_once()
    assert m.killer.signalled == []
    killed = [e for e in node.kube.events if e["reason"] == EVENT_OVER_LIMIT_KILLED]
    assert "PID 301 no longer in the container" in killed[0]["message"]


def test_kill_ends_real_processes_of_that_container_only(node: types.SimpleNamespace) -> None:
    """The real Killer (pidfd_open, pidfd_send_signal) on real processes whose cgroup the fake /proc names."""
    pods = setup_workload(node)
    offender = subprocess.Popen(["sleep", "60"])
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        node.proc.put(offender.pid, v2_crio(pods["over"]["metadata"]["uid"], 3))
        node.proc.put(bystander.pid, v2_containerd(pods["within"]["metadata"]["uid"], 1))
        MIG_A.processes = [(offender.pid, 5 * GIB)]
        H100.processes = [(bystander.pid, 7 * GIB)]
        m = Monitor(
            PluginNode(NODE, node.kube, node.backend, MemoryUnit.GiB), OverLimitMode.KILL, grace=0, proc=node.proc
        )
        m.poll_once()
        assert offender.wait(5) == -9
        assert bystander.poll() is None
        assert m.stats.kills == 1
    finally:
        for p in (offender, bystander):
            p.kill()
            p.wait()


def test_a_process_that_exits_between_polls_leaves_no_series(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    m = monitor(node)
    m.poll_once()
    MIG_A.processes = []  # PID 301 exited: NVML no longer lists it
    node.proc.drop(301)
    node.clock.t += 5
    usage = m.poll_once()
    assert ("team", "over", "train", 1) not in by_container(usage)
    text = generate_latest(registry_for(m)).decode()
    assert 'pod="over"' not in text
    assert m._state == {}  # the crossing is cleared: the next one is told again


def test_metrics_values_and_labels(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    m = monitor(node)
    m.poll_once()
    reg = registry_for(m)
    c = {"namespace": "team", "pod": "within", "container": "main", "node": NODE, "gpu": "0", "uuid": H100.uuid}
    assert reg.get_sample_value("gpushare_container_gpu_memory_used_bytes", c) == 6 * GIB
    assert reg.get_sample_value("gpushare_container_gpu_memory_limit_bytes", c) == 8 * GIB
    assert reg.get_sample_value("gpushare_container_gpu_memory_over_limit", c) == 0
    o = {"namespace": "team", "pod": "over", "container": "train", "node": NODE, "gpu": "1", "uuid": MIG_A.uuid}
    assert reg.get_sample_value("gpushare_container_gpu_memory_over_limit", o) == 1
    p = {"namespace": "other", "pod": "plain", "container": "app", "node": NODE, "gpu": "0", "uuid": H100.uuid}
    assert reg.get_sample_value("gpushare_container_gpu_memory_used_bytes", p) == 2 * GIB
    assert reg.get_sample_value("gpushare_container_gpu_memory_limit_bytes", p) is None
    g = {"node": NODE, "gpu": "0", "uuid": H100.uuid}
    assert reg.get_sample_value("gpushare_gpu_memory_used_bytes", g) == 12 * GIB + 300 * MIB
    assert reg.get_sample_value("gpushare_gpu_memory_total_bytes", g) == 80 * GIB
    assert reg.get_sample_value("gpushare_gpu_memory_outside_pods_bytes", g) == 3 * GIB
    g2 = {"node": NODE, "gpu": "2", "uuid": MIG_B.uuid}
    assert reg.get_sample_value("gpushare_gpu_memory_total_bytes", g2) == 40 * GIB
    assert reg.get_sample_value("gpushare_over_limit_crossings_total", {"node": NODE}) == 1
    assert reg.get_sample_value("gpushare_monitor_polls_total", {"node": NODE}) == 1


def test_usage_annotation_is_written_on_change_at_a_bounded_rate(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    m = monitor(node)
    m.poll_once()
    raw = node.kube.nodes[NODE]["metadata"]["annotations"][ANN_NODE_GPU_USAGE]
    published = parse_gpu_usage(raw)
    assert published.gpus == {0: 12 * 1024 + 300, 1: 5 * 1024 + 100, 2: 0}
    assert published.pods == {"team/within": {0: 6 * 1024}, "team/over": {1: 5 * 1024}, "other/plain": {0: 2048}}
    assert json.loads(raw)["time"]
    writes = node.kube.calls["patch_node_annotations"]
    MIG_A.processes = [(301, 6 * GIB)]  # a big change, but within the interval: not yet
    node.clock.t += 10
    m.poll_once()
    assert node.kube.calls["patch_node_annotations"] == writes
    node.clock.t += 25  # interval passed: written
    m.poll_once()
    assert node.kube.calls["patch_node_annotations"] == writes + 1
    MIG_A.processes = [(301, 6 * GIB + 100 * MIB)]  # under the threshold: never written
    node.clock.t += 60
    m.poll_once()
    assert node.kube.calls["patch_node_annotations"] == writes + 1
    assert m.stats.annotation_writes == 2


def test_pods_are_listed_again_only_for_an_unknown_container(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    m = monitor(node)
    m.poll_once()
    lists = node.kube.calls["list_pods"]
    node.clock.t += 6
    m.poll_once()
    assert node.kube.calls["list_pods"] == lists  # nothing new: the cached list serves
    late = pod("late", [("l", 2, 9)], (2, MIG_B.uuid))
    node.kube.add_pod(late)
    node.proc.put(701, v2_containerd(late["metadata"]["uid"], 9))
    MIG_B.processes = [(701, 1 * GIB)]
    node.clock.t += 6
    usage = m.poll_once()
    assert node.kube.calls["list_pods"] == lists + 1
    assert by_container(usage)[("team", "late", "l", 2)] == (1 * GIB, 2 * GIB, [701])


def test_killer_never_signals_an_exited_pid(tmp_path: Path) -> None:
    proc = FakeProc(str(tmp_path))
    k = Killer(proc, open_pidfd=lambda pid: (_ for _ in ()).throw(ProcessLookupError(pid)))
    assert k.kill(4242, CgroupRef("u", "c")).why == "already exited"


def test_sim_backend_reports_the_processes_of_its_file(tmp_path: Path) -> None:
    from share_node.backend.sim import SimBackend

    f = tmp_path / "procs.json"
    sim = SimBackend("2xT4:16GiB", NODE, processes_file=str(f))
    assert [r.processes for r in sim.readings()] == [(), ()]  # no file yet: no processes
    f.write_text(json.dumps([{"pid": 7, "gpu": 1, "usedMiB": 300}, {"pid": 8, "gpu": "bogus", "usedMiB": 1}, {}]))
    r = sim.readings()
    assert r[0].used_bytes == 0 and [(p.pid, p.used_bytes) for p in r[1].processes] == [(7, 300 * MIB)]
    assert r[1].used_bytes == 300 * MIB and r[1].total_bytes == 16 * GIB
    sim.set_processes([(9, 0, 100)])  # in-process wins over the file
    assert [p.pid for p in sim.readings()[0].processes] == [9] and sim.readings()[1].processes == ()


def test_a_pod_the_api_does_not_know_is_not_listed_again_every_poll(node: types.SimpleNamespace) -> None:
    setup_workload(node)
    node.proc.put(801, v1_cgroupfs("6d3d4fd3a1b2c3d4e5f60718293a4b5c", 7))  # a static pod: its config hash
    H100.processes = [*H100.processes, (801, 1 * GIB)]
    m = monitor(node)
    usage = m.poll_once()
    lists = node.kube.calls["list_pods"]
    for _ in range(5):
        node.clock.t += 6
        usage = m.poll_once()
    assert node.kube.calls["list_pods"] == lists  # until the periodic refresh
    node.clock.t += 60
    m.poll_once()
    assert node.kube.calls["list_pods"] == lists + 1
    static = [c for c in usage.containers if c.key.pod_uid == "6d3d4fd3a1b2c3d4e5f60718293a4b5c"]
    assert [(c.key.namespace, c.key.pod, c.used_bytes, c.limit_bytes) for c in static] == [
        ("", "uid-6d3d4fd3a1b2c3d4e5f60718293a4b5c", 1 * GIB, None)
    ]
