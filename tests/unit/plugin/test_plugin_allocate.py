"""Allocate through the kubelet stand-in: one pod, multi-container, init/sidecar, multi-GPU, bursts, errors."""

from __future__ import annotations

import random
from typing import Any

import pytest

from share_core.assignment import parse_assignment
from share_core.contract import ANN_ASSIGNED
from share_core.contract import MemoryUnit
from share_core.kube import Conflict
from share_core.kube import Unavailable
from tests.kubelet import AdmissionError
from tests.unit.plugin.simnode import NODE
from tests.unit.plugin.simnode import SimNode
from tests.unit.plugin.simnode import assign
from tests.unit.plugin.simnode import make_pod
from tests.unit.plugin.simnode import start_node
from tests.unit.plugin.simnode import stop_node


def annotations(node: SimNode, name: str) -> dict[str, str]:
    return node.kube.pods[("default", name)]["metadata"]["annotations"]


def test_one_pod(sim_node):
    pod = sim_node.add(make_pod("p1", [("main", 4)]), [2], 4, 100)
    env = sim_node.kubelet.admit(pod)["main"]
    uuid = sim_node.uuid(2)
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "GPUSHARE_MEM_LIMIT_MIB": "4096",
        "GPUSHARE_MEM_TOTAL_MIB": "16384",
        "GPUSHARE_GPU_INDEX": "2",
        "ALIYUN_COM_GPU_MEM_CONTAINER": "4",
        "ALIYUN_COM_GPU_MEM_DEV": "16",
        "ALIYUN_COM_GPU_MEM_IDX": "2",
        "ALIYUN_COM_GPU_MEM_POD": "4",
    }
    assert annotations(sim_node, "p1")[ANN_ASSIGNED] == "true"


def test_multi_container_pod_each_gets_its_limit(sim_node):
    pod = sim_node.add(make_pod("mc", [("a", 2), ("cpu-only", 0), ("b", 6)]), [1], 8, 1)
    envs = sim_node.kubelet.admit(pod)
    assert set(envs) == {"a", "b"}
    assert envs["a"]["GPUSHARE_MEM_LIMIT_MIB"] == "2048" and envs["b"]["GPUSHARE_MEM_LIMIT_MIB"] == "6144"
    assert {e["NVIDIA_VISIBLE_DEVICES"] for e in envs.values()} == {sim_node.uuid(1)}
    assert {e["ALIYUN_COM_GPU_MEM_POD"] for e in envs.values()} == {"8"}
    assert annotations(sim_node, "mc")[ANN_ASSIGNED] == "true"


def test_not_assigned_until_last_container(sim_node):
    """A failure between containers leaves the pod unassigned: nothing claims it was served."""
    pod = sim_node.add(make_pod("half", [("a", 2), ("b", 2)]), [0], 4, 1)
    sim_node.kube.fail("list_pods", Unavailable("API server unreachable: connect timeout"), times=1)
    sim_node.kube.delay("list_pods", 0)  # the first Allocate succeeds, the second hits the fault
    sim_node.kube._faults["list_pods"].reverse()
    with pytest.raises(AdmissionError, match="cannot read the pods bound to this node"):
        sim_node.kubelet.admit(pod)
    assert annotations(sim_node, "half")[ANN_ASSIGNED] == "false"


def test_init_containers_and_sidecar(sim_node):
    """Init containers are served first; app containers reuse their devices as upstream kubelet does."""
    pod = make_pod("ini", [("app", 3), ("app2", 1)], init=[("setup", 6), ("setup2", 2)], sidecars=[("side", 1)])
    # effective request: max(max init incl. sidecars before it, sum(app)+sidecars) = max(6, 2, 3+1+1) = 6
    pod = sim_node.add(pod, [3], 6, 5)
    envs = sim_node.kubelet.admit(pod)
    assert set(envs) == {"setup", "setup2", "side", "app", "app2"}
    limits = {c: int(e["GPUSHARE_MEM_LIMIT_MIB"]) // 1024 for c, e in envs.items()}
    assert limits == {"setup": 6, "setup2": 2, "side": 1, "app": 3, "app2": 1}
    assert {e["NVIDIA_VISIBLE_DEVICES"] for e in envs.values()} == {sim_node.uuid(3)}
    # the stand-in reused init devices: the app container's IDs were already held by the pod
    devs = sim_node.kubelet.pod_devices()[("default", "ini")]
    assert set(devs["app"]) <= set(devs["setup"]) | set(devs["setup2"])
    assert annotations(sim_node, "ini")[ANN_ASSIGNED] == "true"


def test_multi_gpu_pod():
    node = start_node("4xT4:16GiB", mps=True)
    try:
        pod = node.add(make_pod("mg", [("a", 8), ("b", 4)], gpu_count=2), [3, 1], 12, 7)
        envs = node.kubelet.admit(pod)
        u3, u1 = node.uuid(3), node.uuid(1)
        assert envs["a"]["NVIDIA_VISIBLE_DEVICES"] == f"{u3},{u1}"
        assert envs["a"]["GPUSHARE_GPU_INDEX"] == "3,1"
        assert envs["a"]["GPUSHARE_MEM_LIMIT_MIB"] == "4096"  # 8 over 2 GPUs
        assert envs["b"]["GPUSHARE_MEM_LIMIT_MIB"] == "2048"
        assert envs["a"]["GPUSHARE_MEM_TOTAL_MIB"] == "16384,16384"
        # CUDA ordinals inside the container, which sees its two GPUs as 0 and 1 (NVIDIA MPS documentation)
        assert envs["a"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
        assert envs["a"]["CUDA_MPS_PIPE_DIRECTORY"] == f"{node.dir}/mps"
        assert annotations(node, "mg")[ANN_ASSIGNED] == "true"
    finally:
        stop_node(node)


def test_index_strategy_and_mps_by_index():
    node = start_node("2xA100:80GiB", strategy="index", mps=True)
    try:
        env = node.kubelet.admit(node.add(make_pod("ix", [("m", 10)]), [1], 10, 1))["m"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == "1"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
        assert env["GPUSHARE_MEM_TOTAL_MIB"] == "81920"
    finally:
        stop_node(node)


def test_mib_unit():
    node = start_node("1xT4:16GiB", unit=MemoryUnit.MiB)
    try:
        assert len(node.kubelet.devices) == 16384
        env = node.kubelet.admit(node.add(make_pod("mib", [("m", 1500)]), [0], 1500, 1))["m"]
        assert env["GPUSHARE_MEM_LIMIT_MIB"] == "1500" and env["ALIYUN_COM_GPU_MEM_DEV"] == "16384"
    finally:
        stop_node(node)


def test_no_matching_pod_names_node_size_and_candidates(sim_node):
    sim_node.add(make_pod("other", [("m", 3)]), [0], 3, 1)
    stray = make_pod("stray", [("m", 5)])  # bound to the node but never given a gpushare assignment
    sim_node.kube.add_pod(stray)
    with pytest.raises(AdmissionError) as err:
        sim_node.kubelet.admit(stray)
    msg = str(err.value)
    assert f"node {NODE}" in msg and "asking 5 nvidia.com/gpu-mem" in msg
    assert "default/stray (no gpushare assignment" in msg
    assert "default/other" not in msg  # kubelet has not admitted it: not a candidate
    assert sim_node.kubelet.pod_devices().get(("default", "stray")) is None


def test_assignment_naming_wrong_gpu_is_refused(sim_node):
    pod = make_pod("liar", [("m", 2)])
    pod = sim_node.kube.add_pod(assign(pod, [1], ["GPU-00000000-0000-0000-0000-000000000000"], 2, 1))
    with pytest.raises(AdmissionError, match="GPU 1 of this node is"):
        sim_node.kubelet.admit(pod)
    assert annotations(sim_node, "liar")[ANN_ASSIGNED] == "false"


def test_over_committed_gpu_is_refused(sim_node):
    sim_node.add(make_pod("big1", [("m", 10)]), [0], 10, 1)
    pod = sim_node.add(make_pod("big2", [("m", 10)]), [0], 10, 2)  # an extender bug: 20 of 16
    with pytest.raises(AdmissionError, match=r"GPU 0 .* promised 20 of 16"):
        sim_node.kubelet.admit(pod)


def test_api_server_errors_fail_cleanly(sim_node):
    pod = sim_node.add(make_pod("e1", [("m", 2)]), [0], 2, 1)
    before = dict(annotations(sim_node, "e1"))
    sim_node.kube.fail("list_pods", Unavailable("GET /api/v1/pods: API server unreachable or timed out"))
    with pytest.raises(AdmissionError, match=rf"node {NODE}: cannot read the pods .* timed out"):
        sim_node.kubelet.admit(pod)
    assert annotations(sim_node, "e1") == before
    # the patch fails: Allocate fails, nothing half-written
    sim_node.kube.fail("patch_pod_annotations", Unavailable("PATCH pods/e1: API server unreachable or timed out"))
    with pytest.raises(AdmissionError, match=r"marking the pod gpushare\.io/assigned=true failed"):
        sim_node.kubelet.admit(pod)
    assert annotations(sim_node, "e1") == before
    # the API server is back: kubelet's next attempt (a new pod in real life) is served
    env = sim_node.kubelet.admit(pod)
    assert env["m"]["NVIDIA_VISIBLE_DEVICES"] == sim_node.uuid(0)
    assert annotations(sim_node, "e1")[ANN_ASSIGNED] == "true"


def test_patch_conflict_is_reread_and_retried(sim_node):
    pod = sim_node.add(make_pod("c1", [("m", 2)]), [0], 2, 1)
    sim_node.kube.fail("patch_pod_annotations", Conflict("pod c1 changed", 409))
    sim_node.kubelet.admit(pod)
    assert annotations(sim_node, "c1")[ANN_ASSIGNED] == "true"
    assert sim_node.kube.calls["get_pod"] >= 1


def test_conflict_with_changed_assignment_is_refused(sim_node):
    pod = sim_node.add(make_pod("c2", [("m", 2)]), [0], 2, 1)
    real_patch = sim_node.kube.patch_pod_annotations

    def racing_patch(ns: str, name: str, ann: dict[str, Any], resource_version: str | None = None) -> Any:
        # someone rewrites the assignment between our read and our write
        sim_node.kube.update_pod(
            ns, name, lambda p: p["metadata"]["annotations"].update({"gpushare.io/gpu-index": "1"})
        )
        return real_patch(ns, name, ann, resource_version)

    sim_node.kube.patch_pod_annotations = racing_patch  # type: ignore[method-assign]
    with pytest.raises(AdmissionError, match="changed while its container"):
        sim_node.kubelet.admit(pod)
    assert annotations(sim_node, "c2")[ANN_ASSIGNED] == "false"


def test_slow_api_server_still_answers(sim_node):
    pod = sim_node.add(make_pod("slow", [("m", 1)]), [0], 1, 1)
    sim_node.kube.delay("list_pods", 0.3)
    sim_node.kube.delay("patch_pod_annotations", 0.3)
    assert sim_node.kubelet.admit(pod)["m"]["GPUSHARE_GPU_INDEX"] == "0"


# -- bursts ------------------------------------------------------------------------------------------


def extender_bind(node: SimNode, pods: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Place pods like the extender would (random fit, never over a GPU's size), annotate and store them."""
    free = {g.index: 16 for g in node.backend.gpus()}
    out = []
    for t, pod in enumerate(pods, start=1):
        size = sum(
            int(c["resources"]["limits"]["nvidia.com/gpu-mem"]) for c in pod["spec"]["containers"] if c["resources"]
        )
        fits = [i for i, f in free.items() if f >= size]
        if not fits:
            continue
        gpu = rng.choice(fits)
        free[gpu] -= size
        out.append(node.add(pod, [gpu], size, 1_000_000 + t))
    return out


def check_truth(node: SimNode, pods: list[dict[str, Any]]) -> None:
    """Every container runs on its own pod's GPU with its own limit; every pod assigned; no GPU over 16."""
    envs = node.kubelet.envs()
    used: dict[str, int] = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        ann = node.kube.pods[("default", name)]["metadata"]["annotations"]
        a = parse_assignment(ann)
        assert a is not None and a.assigned, f"{name} not assigned"
        for c in pod["spec"]["containers"]:
            units = int((c["resources"].get("limits") or {}).get("nvidia.com/gpu-mem", 0))
            if not units:
                continue
            env = envs[("default", name)][c["name"]]
            assert env["NVIDIA_VISIBLE_DEVICES"] == a.gpu_uuids[0], f"{name}/{c['name']} on the wrong GPU"
            assert env["GPUSHARE_GPU_INDEX"] == str(a.gpu_indices[0])
            assert env["GPUSHARE_MEM_LIMIT_MIB"] == str(units * 1024)
            used[env["NVIDIA_VISIBLE_DEVICES"]] = used.get(env["NVIDIA_VISIBLE_DEVICES"], 0) + units
    assert all(u <= 16 for u in used.values()), used


ORDERS = {
    "bind order": lambda pods, rng: pods,
    "reversed": lambda pods, rng: pods[::-1],
    "shuffled": lambda pods, rng: rng.sample(pods, len(pods)),
    "largest first": lambda pods, rng: sorted(
        pods, key=lambda p: -int(p["metadata"]["annotations"]["gpushare.io/gpu-mem"])
    ),
    "interleaved GPUs": lambda pods, rng: sorted(
        pods,
        key=lambda p: (
            p["metadata"]["annotations"]["gpushare.io/gpu-index"],
            -int(p["metadata"]["annotations"]["gpushare.io/assume-time"]),
        ),
    ),
}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("sizes", ["same", "mixed"])
def test_burst_of_50_pods_in_adversarial_order(order: str, sizes: str):
    rng = random.Random(f"{order}/{sizes}")
    # 4 GPUs x 16 GiB; 50 pods of 1 GiB (same) or 1-2 GiB over 1-2 containers (mixed): all fit
    node = start_node("4xT4:16GiB", health_check=False, choose=lambda free, n: rng.sample(free, n))
    try:
        raw = []
        for i in range(50):
            if sizes == "same":
                raw.append(make_pod(f"b{i:02d}", [("m", 1)]))
            else:
                ctrs = [("m", rng.choice([1, 1, 2]))] + ([("s", 1)] if rng.random() < 0.2 else [])
                raw.append(make_pod(f"b{i:02d}", ctrs))
        pods = extender_bind(node, raw, rng)
        assert len(pods) >= 40
        for pod in ORDERS[order](pods, rng):
            node.kubelet.admit(pod)
        check_truth(node, pods)
    finally:
        stop_node(node)


def test_burst_driven_through_kube_watch_with_reordering():
    """The integration-tier mode: the stand-in admits what the API shows on its node, reordered."""
    rng = random.Random(7)
    node = start_node("4xT4:16GiB", health_check=False)
    try:
        pods = extender_bind(node, [make_pod(f"w{i:02d}", [("m", rng.choice([1, 2, 3]))]) for i in range(30)], rng)
        node.kubelet.run_with_kube(node.kube, NODE, order=lambda batch: rng.sample(batch, len(batch)), interval=0.05)
        node.kubelet.wait_for(
            lambda: sum(1 for e in node.kubelet.envs().values() if e) == len(pods), 20, "all pods admitted"
        )
        check_truth(node, pods)
        import time

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            node.kube.pods[("default", p["metadata"]["name"])]["status"]["phase"] != "Running" for p in pods
        ):
            time.sleep(0.05)
        assert all(node.kube.pods[("default", p["metadata"]["name"])]["status"]["phase"] == "Running" for p in pods)
    finally:
        stop_node(node)


def test_plugin_restart_rebuilds_served_containers_from_pod_resources():
    """A multi-container pod half-served when the plugin restarts: the new plugin serves the rest."""
    node = start_node("2xT4:16GiB")
    try:
        pod = node.add(make_pod("rs", [("a", 2), ("b", 3)]), [1], 5, 1)
        # serve container a only, as if the plugin died right after
        node.kubelet.admit({**pod, "spec": {**pod["spec"], "containers": pod["spec"]["containers"][:1]}})
        assert node.kube.pods[("default", "rs")]["metadata"]["annotations"][ANN_ASSIGNED] == "false"
        node.plugin.stop()
        fresh = start_node("2xT4:16GiB", kube=node.kube)  # new plugin process state, same API server
        # kubelet kept its podDevices (checkpoint): hand them to the fresh stand-in
        fresh.kubelet._pods = node.kubelet._pods
        env = fresh.kubelet.admit(pod)
        assert env["b"]["GPUSHARE_MEM_LIMIT_MIB"] == "3072" and env["b"]["GPUSHARE_GPU_INDEX"] == "1"
        assert node.kube.pods[("default", "rs")]["metadata"]["annotations"][ANN_ASSIGNED] == "true"
        stop_node(fresh)
    finally:
        node.kubelet.stop()
