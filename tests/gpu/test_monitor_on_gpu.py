"""The monitor on a real GPU: CUDA processes in pods' cgroups, NVML's per-process memory attributed to the
pod and container, an over-limit container warned about and then ended, its neighbour and a process outside
any pod left alone."""

from __future__ import annotations

import dataclasses
import signal

import pytest

from share_core.contract import EVENT_OVER_LIMIT
from share_core.contract import EVENT_OVER_LIMIT_KILLED
from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_node.backend import Gpu
from share_node.backend.nvml import NvmlBackend
from share_plugin.monitor import Monitor
from share_plugin.node import PluginNode
from share_plugin.usage import OverLimitMode
from share_plugin.usage import Usage
from tests.gpu.conftest import GIB
from tests.gpu.conftest import MIB
from tests.gpu.conftest import NODE
from tests.gpu.conftest import SAMPLES
from tests.gpu.conftest import PodCgroups
from tests.gpu.conftest import container_id
from tests.gpu.conftest import holding
from tests.gpu.conftest import running
from tests.gpu.conftest import running_pod
from tests.gpu.conftest import share_env
from tests.gpu.conftest import wait_for


def monitor(nvml: NvmlBackend, kube: FakeKube, mode: OverLimitMode, grace: float = 0.0) -> Monitor:
    kube.add_node({"metadata": {"name": NODE, "annotations": {}}, "status": {}})  # the usage annotation's home
    return Monitor(
        PluginNode(NODE, kube, nvml, MemoryUnit.GiB), mode=mode, grace=grace, pod_refresh=0.0, min_relist=0.0
    )


def of(usage: Usage, pod: str, container: str):
    return next(c for c in usage.containers if (c.key.pod, c.key.container) == (pod, container))


def test_memory_is_attributed_to_the_pod_and_container(nvml: NvmlBackend, gpu: Gpu, pod_cgroups: PodCgroups) -> None:
    kube = FakeKube()
    cid = container_id()
    pod = kube.add_pod(running_pod("train", [("main", 2, cid)], gpu))
    cgroup = pod_cgroups.container(pod["metadata"]["uid"], cid)
    with holding(1024, share_env(gpu, 2048), before_cuda=lambda pid: pod_cgroups.move(pid, cgroup)) as proc:
        usage = monitor(nvml, kube, OverLimitMode.WARN).poll_once()
        c = of(usage, "train", "main")
        print(f"\ncontainer main of team/train: {c.used_bytes // MIB} MiB of {c.limit_bytes // MIB} (pids {c.pids})")
        assert c.pids == [proc.pid] and c.gpu_uuid == gpu.uuid
        assert 1024 * MIB <= c.used_bytes < 2 * GIB and c.limit_bytes == 2 * GIB and not c.over
        assert kube.events == []


def test_over_limit_is_warned_then_only_the_offender_is_ended(
    nvml: NvmlBackend, gpu: Gpu, pod_cgroups: PodCgroups
) -> None:
    kube = FakeKube()
    hog_id, calm_id = container_id(), container_id()
    hog = kube.add_pod(running_pod("hog", [("main", 1, hog_id)], gpu))
    calm = kube.add_pod(running_pod("calm", [("main", 2, calm_id)], gpu))
    hog_cg = pod_cgroups.container(hog["metadata"]["uid"], hog_id)
    calm_cg = pod_cgroups.container(calm["metadata"]["uid"], calm_id)
    mon = monitor(nvml, kube, OverLimitMode.KILL, grace=1.0)
    with (
        holding(2048, share_env(gpu, 1024), before_cuda=lambda pid: pod_cgroups.move(pid, hog_cg)) as hog_proc,
        holding(512, share_env(gpu, 2048), before_cuda=lambda pid: pod_cgroups.move(pid, calm_cg)) as calm_proc,
    ):
        first = mon.poll_once()
        assert of(first, "hog", "main").over and not of(first, "calm", "main").over
        assert [e["reason"] for e in kube.events] == [EVENT_OVER_LIMIT]
        assert hog_proc.alive()  # the grace period first
        wait_for("the grace period to pass and the kill", lambda: mon.poll_once() and not hog_proc.alive(), 10, 0.5)
        assert hog_proc.wait_exit() == -signal.SIGKILL
        assert calm_proc.alive()
        killed = [e for e in kube.events if e["reason"] == EVENT_OVER_LIMIT_KILLED]
        assert len(killed) == 1 and str(hog_proc.pid) in killed[0]["message"]
        assert (killed[0]["namespace"], killed[0]["pod"], killed[0]["type"]) == ("team", "hog", "Warning")
        print("\n" + "\n".join(e["message"] for e in kube.events))
        wait_for(
            "NVML to drop the ended process",
            lambda: hog_proc.pid not in {p for c in mon.poll_once().containers for p in c.pids},
        )
        assert calm_proc.alive() and mon.stats.kills == 1


def test_a_container_on_a_gpu_its_pod_was_not_given_is_over_at_once(
    nvml: NvmlBackend, gpu: Gpu, pod_cgroups: PodCgroups
) -> None:
    """Isolation: a pod placed on another GPU whose program reaches this one (a forged NVIDIA_VISIBLE_DEVICES)
    has a limit of 0 here, so any use is over, and the Event says the GPU was not assigned to it."""
    kube = FakeKube()
    cid = container_id()
    elsewhere = dataclasses.replace(gpu, index=gpu.index + 1, uuid="GPU-00000000-0000-0000-0000-0000000000ff")
    pod = kube.add_pod(running_pod("forger", [("main", 8, cid)], elsewhere))
    cgroup = pod_cgroups.container(pod["metadata"]["uid"], cid)
    with holding(256, share_env(gpu, 8192), before_cuda=lambda pid: pod_cgroups.move(pid, cgroup)):
        c = of(monitor(nvml, kube, OverLimitMode.WARN).poll_once(), "forger", "main")
    assert c.limit_bytes == 0 and c.over
    (event,) = kube.events
    assert event["reason"] == EVENT_OVER_LIMIT
    assert f"GPU {gpu.index} ({gpu.uuid}) was not assigned to it" in event["message"]


@pytest.mark.parametrize(
    ("sample", "ready", "reserve", "over"),
    [
        ("pytorch_limit.py", "pytorch: allocator stopped", 768, False),
        ("jax_limit.py", "jax: computed", 768, False),
        ("pytorch_limit.py", "pytorch: allocator stopped", 0, True),
    ],
)
def test_a_sample_stays_under_its_limit_only_with_the_context_reserve(
    nvml: NvmlBackend, gpu: Gpu, pod_cgroups: PodCgroups, sample: str, ready: str, reserve: int, over: bool
) -> None:
    """What the monitor measures is the process's whole use, its CUDA context included. A sample with the
    reserve the PyTorch Job sets (768 MiB) stays under a 4 GiB limit; without a reserve PyTorch fills its
    allocator to the limit and the context puts it over."""
    kube = FakeKube()
    cid = container_id()
    pod = kube.add_pod(running_pod("sample", [("main", 4, cid)], gpu))
    cgroup = pod_cgroups.container(pod["metadata"]["uid"], cid)
    env = {**share_env(gpu, 4096), "GPUSHARE_CONTEXT_RESERVE_MIB": str(reserve), "HOLD_SECONDS": "120"}
    with running([str(SAMPLES / sample)], ready, env, lambda pid: pod_cgroups.move(pid, cgroup)) as proc:
        c = of(monitor(nvml, kube, OverLimitMode.WARN).poll_once(), "sample", "main")
        print(f"\n{sample}, reserve {reserve} MiB: {c.used_bytes // MIB} MiB of 4096, over {c.over}\n{proc.output}")
    assert c.over is over
    assert (c.used_bytes <= 4096 * MIB) is not over


def test_a_process_in_no_pod_is_reported_never_ended(nvml: NvmlBackend, gpu: Gpu) -> None:
    """A GPU used outside Kubernetes (this test's own cgroup): counted per GPU, never enforced."""
    kube = FakeKube()
    mon = monitor(nvml, kube, OverLimitMode.KILL, grace=0.0)
    with holding(1024, share_env(gpu, 1024)) as outsider:
        for _ in range(3):
            usage = mon.poll_once()
        stat = next(g for g in usage.gpus if g.uuid == gpu.uuid)
        assert stat.outside_pods_bytes >= 1024 * MIB
        assert usage.containers == [] and outsider.alive() and mon.stats.kills == 0
