"""--hard-limit on a real node: upstream kubelet, containerd, runc, our device plugin on the sim backend with the
NVML stand-in (share_node/backend/simlimits.py), which behaves as NVIDIA documents the per-cgroup limit and
journals every change with the cgroup's children at that moment.

This machine runs cgroup v1 with the hybrid cgroup v2 hierarchy at /sys/fs/cgroup/unified (the driver needs
v2). Where kubelet's pod cgroups appear in that hierarchy (runc creates them there in hybrid mode) the plugin is
pointed at it, a real cgroup2 mount, and the stand-in checks the paths as cgroup v2; otherwise at the memory
hierarchy, with the stand-in told to accept cgroup v1 paths. Either way the real path is exercised: kubelet's
PreStartContainer call order, the pod cgroup kubelet made, its children (container cgroups) and processes,
its removal. What stays unproven until a cgroup v2 node with an R615 driver: that NVIDIA's driver accepts
these paths and enforces the limit (the GPU tier, tests/gpu/test_hard_limit_on_gpu.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from share_core.contract import ANN_GPU_UUID
from share_core.contract import ANN_NODE_HARD_LIMIT
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_node.backend.simlimits import read_state
from share_node.hardlimit import pod_uid_of_dir
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import wait_for
from tests.controlplane.realgpunode import RealGpuNode
from tests.controlplane.realgpunode import delete_pods
from tests.node import RealNode
from tests.node.host import hard_limit_cgroup_tree

pytestmark = [pytest.mark.integration, pytest.mark.realkubelet]

SIM_GPUS = "2xT4:16GiB"
GIB = 1024**3


@pytest.fixture(scope="module")
def hard(gpu_cluster: GpuCluster, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    state = tmp_path_factory.mktemp("hardlimit") / "limits.json"
    root, extra = hard_limit_cgroup_tree(real_node.cgroup_root)
    node = RealGpuNode(gpu_cluster, real_node, SIM_GPUS)
    node.hard_args = [  # type: ignore[attr-defined]
        "--hard-limit",
        "cgroup",
        "--cgroup-root",
        root,
        "--sim-memory-limits-file",
        str(state),
        *extra,
    ]
    node.state = str(state)  # type: ignore[attr-defined]
    node.cgroup_tree = root  # type: ignore[attr-defined]
    with node.running(extra_args=node.hard_args):  # type: ignore[attr-defined]
        yield node


@pytest.fixture
def hns(hard: RealGpuNode, ns: str) -> Iterator[str]:
    yield ns
    delete_pods(hard.cluster, ns)


def limits_of(hard: Any, pod_uid: str) -> dict[str, dict[str, int]]:
    """GPU UUID -> {soft, hard} the stand-in holds for the pod's cgroup (paths whose cgroup still exists)."""
    out = {}
    for gpu, per_path in read_state(hard.state)["limits"].items():
        for path, lim in per_path.items():
            if pod_uid_of_dir(Path(path).name) == pod_uid and Path(path).is_dir():
                out[gpu] = lim
    return out


def journal_of(hard: Any, pod_uid: str) -> list[dict[str, Any]]:
    return [e for e in read_state(hard.state)["journal"] if pod_uid_of_dir(Path(e["path"]).name) == pod_uid]


def container_ids(pod: dict[str, Any]) -> set[str]:
    return {
        cs["containerID"].rpartition("://")[2]
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
        if cs.get("containerID")
    }


def released(hard: RealGpuNode, who: str) -> str:
    """How the plugin let a deleted pod's limit go: "cleared" (by the plugin, the pod's processes all gone and its
    cgroup still there) or "removed" (kubelet removed the cgroup first, which clears its limits, NVIDIA says):
    the device plugin API has no hook at pod removal, so which comes first is kubelet's timing."""

    def seen() -> str | None:
        log = plugin_log(hard)
        if f"pod {who}: hard GPU memory limit cleared" in log:
            return "cleared"
        if f"pod {who}: its cgroup is gone, and the driver cleared its limits with it" in log:
            return "removed"
        return None

    return wait_for(seen, 30, f"the plugin to let {who}'s limit go")


def plugin_log(hard: RealGpuNode) -> str:
    assert hard.plugin is not None
    return hard.plugin.log_path.read_text(errors="replace").rsplit("### ", 1)[-1]


def test_hard_limit_set_on_the_pod_cgroup_before_its_containers_start(hard: Any, hns: str) -> None:
    cluster = hard.cluster
    node = json.loads(cluster.admin.get_node(hard.name)["metadata"]["annotations"][ANN_NODE_HARD_LIMIT])
    assert node["enforced"] is True and node["mode"] == "cgroup", node
    cluster.create_pod(hard.pod("two", hns, [2, 3]))
    pod = cluster.wait_phase(hns, "two", ["Running"], timeout=120)
    envs = hard.env_of(pod)
    assert {c: e[ENV_MEM_LIMIT_MIB] for c, e in envs.items()} == {"c0": "2048", "c1": "3072"}
    pod = cluster.admin.get_pod(hns, "two")
    uid = pod["metadata"]["uid"]
    uuid = pod["metadata"]["annotations"][ANN_GPU_UUID]
    # One budget for the pod: its total (5 GiB) on its GPU, soft = hard.
    assert limits_of(hard, uid) == {uuid: {"soft": 5 * GIB, "hard": 5 * GIB}}
    sets = [e for e in journal_of(hard, uid) if e["op"] == "set"]
    assert len(sets) == 1, sets  # set at the first container's PreStartContainer, kept for the second
    ids = container_ids(pod)
    assert len(ids) == 2
    # When the limit was set, neither app container's cgroup existed under the pod's cgroup yet...
    assert not ids & set(sets[0]["children"]), (ids, sets[0]["children"])
    # ...and now both do (so the check above could have failed): the limit came before the containers.
    children = {p.name for p in Path(sets[0]["path"]).iterdir() if p.is_dir()}
    assert ids <= children, (ids, children)
    assert f"pod {hns}/two: hard GPU memory limit set on its cgroup" in plugin_log(hard)


def test_hard_limit_cleared_when_the_pod_is_deleted(hard: Any, hns: str) -> None:
    cluster = hard.cluster
    cluster.create_pod(hard.pod("gone", hns, 4))
    cluster.wait_phase(hns, "gone", ["Running"], timeout=120)
    uid = cluster.admin.get_pod(hns, "gone")["metadata"]["uid"]
    assert limits_of(hard, uid)
    t0 = time.monotonic()
    delete_pods(cluster, hns)
    wait_for(lambda: not limits_of(hard, uid), 60, f"the limit of {hns}/gone to go")
    how = released(hard, f"{hns}/gone")
    ops = [e["op"] for e in journal_of(hard, uid)]
    assert ops[0] == "set" and set(ops[1:]) <= {"clear", "removed-with-cgroup"}, ops
    if how == "cleared":
        # Cleared by the plugin while the cgroup still existed, once every process of the pod had exited:
        # soft 0 and hard max, NVIDIA's way to clear.
        clear = next(e for e in journal_of(hard, uid) if e["op"] == "clear")
        assert clear["procs"] == 0 and clear["hard"] == 2**64 - 1
    print(f"limit gone {time.monotonic() - t0:.1f}s after the delete was sent: {how}")


def test_hard_limit_plugin_restart_finds_and_keeps_the_limits(hard: Any, hns: str) -> None:
    cluster = hard.cluster
    cluster.create_pod(hard.pod("stays", hns, 3))
    cluster.wait_phase(hns, "stays", ["Running"], timeout=120)
    uid = cluster.admin.get_pod(hns, "stays")["metadata"]["uid"]
    before = limits_of(hard, uid)
    assert before
    hard.restart_plugin()
    wait_for(lambda: "hard limits found at start" in plugin_log(hard), 30, "the restarted plugin's adoption")
    assert f"1 kept ({hns}/stays)" in plugin_log(hard) or f"kept ({hns}/stays" in plugin_log(hard)
    assert limits_of(hard, uid) == before
    assert [e["op"] for e in journal_of(hard, uid)] == ["set"]  # never cleared, never set again
    # The new process owns it: deleting the pod clears it.
    delete_pods(cluster, hns)
    wait_for(lambda: not limits_of(hard, uid), 60, f"the limit of {hns}/stays to go")
    print(f"after the restart, {hns}/stays's limit went: {released(hard, f'{hns}/stays')}")


def test_hard_limit_unsupported_node_falls_back_and_says_so(hard: Any, hns: str) -> None:
    """An R580 driver (the stand-in told so), --hard-limit auto: said once (log, node annotation), and pods run
    as before with their env limit and no driver limit."""
    cluster = hard.cluster
    hard.stop_plugin()
    auto = ["auto" if a == "cgroup" else a for a in hard.hard_args]  # --hard-limit auto, the rest as before
    hard.start_plugin(extra_args=[*auto, "--sim-driver-version", "580.95.05"])
    try:
        node = json.loads(cluster.admin.get_node(hard.name)["metadata"]["annotations"][ANN_NODE_HARD_LIMIT])
        assert node["enforced"] is False and node["mode"] == "auto"
        assert "unsupported driver 580.95.05" in node["reason"], node
        log = plugin_log(hard)
        assert log.count("hard GPU memory limit (--hard-limit auto) NOT enforced: unsupported driver 580.95.05") == 1
        cluster.create_pod(hard.pod("plain", hns, 2))
        pod = cluster.wait_phase(hns, "plain", ["Running"], timeout=120)
        assert hard.env_of(pod)["c0"][ENV_MEM_LIMIT_MIB] == "2048"
        uid = cluster.admin.get_pod(hns, "plain")["metadata"]["uid"]
        assert limits_of(hard, uid) == {} and journal_of(hard, uid) == []
    finally:
        delete_pods(cluster, hns)
        hard.stop_plugin()
        hard.start_plugin(extra_args=hard.hard_args)
