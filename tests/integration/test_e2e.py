"""The whole chain through the real kube-scheduler: extender filter/prioritize/bind, device plugin
Allocate through a kubelet stand-in, annotations and env checked against each other."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.contract import ENV_GPU_INDEX
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_MEM_TOTAL_MIB
from share_core.contract import ENV_VISIBLE_DEVICES
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import pod_spec
from tests.controlplane.gpucluster import wait_for

pytestmark = pytest.mark.integration


def _node_name(ns: str, suffix: str) -> str:
    return f"{ns}-{suffix}"


def _assignment(cluster: GpuCluster, ns: str, name: str):
    pod = cluster.admin.get_pod(ns, name)
    return pod, parse_assignment(pod_annotations(pod))


def _events_for(cluster: GpuCluster, ns: str, pod: str) -> list[dict]:
    events = cluster.admin.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in events if e["involvedObject"].get("name") == pod]


def test_one_pod_gets_the_gpu_its_annotations_name(gpu_cluster: GpuCluster, ns: str) -> None:
    node = _node_name(ns, "a")
    gpu_cluster.add_node(node, "2xA100:80GiB")
    gpu_cluster.create_pod(pod_spec("p8", 8, ns))
    pod = gpu_cluster.wait_phase(ns, "p8", ["Running"])
    assert pod["spec"]["nodeName"] == node
    assignment = parse_assignment(pod_annotations(pod))
    assert assignment is not None and assignment.total == 8 and len(assignment.gpu_indices) == 1
    env = gpu_cluster.env_of(pod)["c0"]
    assert env[ENV_VISIBLE_DEVICES] == assignment.gpu_uuids[0]
    assert env[ENV_MEM_LIMIT_MIB] == str(8 * 1024)
    assert env[ENV_MEM_TOTAL_MIB] == str(80 * 1024)
    assert env[ENV_GPU_INDEX] == str(assignment.gpu_indices[0])
    wait_for(
        lambda: pod_annotations(gpu_cluster.admin.get_pod(ns, "p8")).get("gpushare.io/assigned") == "true",
        15,
        "assigned=true",
    )
    reasons = {e["reason"] for e in _events_for(gpu_cluster, ns, "p8")}
    assert "Scheduled" in reasons or any("assigned GPU" in e["message"] for e in _events_for(gpu_cluster, ns, "p8"))
    gpu_cluster.check_invariants()


def test_binpack_fills_gpus_one_at_a_time(gpu_cluster: GpuCluster, ns: str) -> None:
    for suffix in ("a", "b"):
        gpu_cluster.add_node(_node_name(ns, suffix), "2xT4:16GiB")
    used_gpus_after: list[int] = []
    for i in range(8):
        gpu_cluster.create_pod(pod_spec(f"bp{i}", 4, ns))
        gpu_cluster.wait_phase(ns, f"bp{i}", ["Running"])
        placed = Counter()
        for j in range(i + 1):
            pod, a = _assignment(gpu_cluster, ns, f"bp{j}")
            placed[(pod["spec"]["nodeName"], a.gpu_indices[0])] += 4
        used_gpus_after.append(len(placed))
        assert max(placed.values()) <= 16
    # Binpack: a GPU fills (4 x 4 GiB) before the next one is touched.
    assert used_gpus_after == [1, 1, 1, 1, 2, 2, 2, 2]
    gpu_cluster.check_invariants()


def test_pod_larger_than_any_gpu_stays_pending_with_the_extenders_reason(gpu_cluster: GpuCluster, ns: str) -> None:
    gpu_cluster.add_node(_node_name(ns, "a"), "2xT4:16GiB")
    # 24 GiB fits the node's 32 GiB capacity (kube-scheduler's own filter passes) but no single GPU.
    gpu_cluster.create_pod(pod_spec("huge", 24, ns))

    def failed_event() -> str | None:
        for e in _events_for(gpu_cluster, ns, "huge"):
            if e["reason"] == "FailedScheduling":
                return e["message"]
        return None

    message = wait_for(failed_event, 60, "a FailedScheduling event")
    assert "24 GiB" in message and "GPU" in message, message
    assert gpu_cluster.admin.get_pod(ns, "huge")["status"]["phase"] == "Pending"
    assert not gpu_cluster.admin.get_pod(ns, "huge")["spec"].get("nodeName")


def test_multi_container_multi_gpu_and_model_pods(gpu_cluster: GpuCluster, ns: str) -> None:
    gpu_cluster.add_node(_node_name(ns, "t4"), "4xT4:16GiB")
    gpu_cluster.add_node(_node_name(ns, "a100"), "2xA100:80GiB")
    gpu_cluster.create_pod(pod_spec("multi", [2, 3], ns, init_gib=4))
    gpu_cluster.create_pod(pod_spec("twogpu", 16, ns, gpu_count=2))
    gpu_cluster.create_pod(pod_spec("model", 4, ns, model="a100"))
    for name in ("multi", "twogpu", "model"):
        gpu_cluster.wait_phase(ns, name, ["Running"])

    pod, a = _assignment(gpu_cluster, ns, "multi")
    env = gpu_cluster.env_of(pod)
    assert a.total == 5
    assert {env["c0"][ENV_MEM_LIMIT_MIB], env["c1"][ENV_MEM_LIMIT_MIB]} == {"2048", "3072"}
    assert env["init"][ENV_VISIBLE_DEVICES] == env["c0"][ENV_VISIBLE_DEVICES] == env["c1"][ENV_VISIBLE_DEVICES]

    pod, a = _assignment(gpu_cluster, ns, "twogpu")
    assert len(a.gpu_indices) == 2 and a.per_gpu == 8
    env = gpu_cluster.env_of(pod)["c0"]
    assert env[ENV_VISIBLE_DEVICES].split(",") == list(a.gpu_uuids)
    assert env[ENV_MEM_LIMIT_MIB] == str(8 * 1024)

    pod, a = _assignment(gpu_cluster, ns, "model")
    assert pod["spec"]["nodeName"] == _node_name(ns, "a100")
    gpu_cluster.check_invariants()


def test_finished_pod_frees_its_memory(gpu_cluster: GpuCluster, ns: str) -> None:
    gpu_cluster.add_node(_node_name(ns, "a"), "1xT4:16GiB")
    gpu_cluster.create_pod(pod_spec("first", 12, ns))
    gpu_cluster.wait_phase(ns, "first", ["Running"])
    gpu_cluster.create_pod(pod_spec("second", 12, ns))
    time.sleep(3)
    assert gpu_cluster.admin.get_pod(ns, "second")["status"]["phase"] == "Pending"
    gpu_cluster.finish_pod(ns, "first")
    pod = gpu_cluster.wait_phase(ns, "second", ["Running"], timeout=90)
    assert parse_assignment(pod_annotations(pod)).gpu_indices == (0,)
    gpu_cluster.check_invariants()


def _mixed_pods(ns: str, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.15:
            pods.append(pod_spec(f"m{i}", [rng.choice([1, 2]), rng.choice([1, 2, 3])], ns))
        elif kind < 0.22:
            pods.append(pod_spec(f"m{i}", 2 * rng.choice([2, 4]), ns, gpu_count=2))
        else:
            pods.append(pod_spec(f"m{i}", rng.choice([1, 2, 3, 4, 4, 8]), ns))
    return pods


def _adversarial(seed: int):
    rng = random.Random(seed)

    def order(batch: list[dict]) -> list[dict]:
        # Reverse bind order half the time and shuffle the rest: kubelet owes us no order.
        batch = list(reversed(batch)) if rng.random() < 0.5 else rng.sample(batch, len(batch))
        return batch

    return order


def _create_burst(cluster: GpuCluster, pods: list[dict], threads: int = 8) -> None:
    it = iter(pods)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                pod = next(it, None)
            if pod is None:
                return
            cluster.create_pod(pod)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _settled(cluster: GpuCluster, ns: str, expect_running: int | None = None) -> list[dict]:
    """Wait until no pod is bound-but-not-running and scheduling has stopped making progress."""
    last = [-1]

    def quiet() -> bool:
        pods = cluster.pods(ns)
        bound_pending = [p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") == "Pending"]
        running = sum(p["status"].get("phase") == "Running" for p in pods)
        stable = running == last[0] and not bound_pending
        last[0] = running
        return stable and (expect_running is None or running >= expect_running)

    wait_for(quiet, 240, f"pods in {ns} to settle", interval=3)
    return cluster.pods(ns)


def test_burst_of_100_mixed_pods_with_adversarial_admission(gpu_cluster: GpuCluster, ns: str) -> None:
    for k, suffix in enumerate("abc"):
        gpu_cluster.add_node(_node_name(ns, suffix), "4xA100:40GiB", order=_adversarial(k))
    pods = _mixed_pods(ns, 100, seed=7)
    _create_burst(gpu_cluster, pods)
    final = _settled(gpu_cluster, ns)
    phases = Counter(p["status"].get("phase") for p in final)
    assert phases["Failed"] == 0, "kubelet stand-in rejected pods: Allocate failed"
    assert phases["Running"] >= 80, phases
    gpu_cluster.check_invariants()
    # What the extender believes is exactly what the API server holds.
    _assert_extender_view_is_truth(gpu_cluster)


def _assert_extender_view_is_truth(cluster: GpuCluster, timeout: float = 30.0) -> None:
    """The extender's view converges on the API server's truth. It follows the pod watch, so right after a
    restart or a burst it may lag by an event or two: poll, and on timeout show both sides."""
    compared: dict[str, object] = {}

    def agrees() -> bool:
        truth = cluster.check_invariants()
        view = cluster.extender_json("/gpushare-scheduler/inspect")
        nodes = view["nodes"] if isinstance(view, dict) and "nodes" in view else view
        seen = {n["name"]: {g["index"]: g["allocated"] for g in n["gpus"]} for n in nodes if n["name"] in truth}
        compared.update(seen=seen, truth=truth)
        return seen == truth

    try:
        wait_for(agrees, timeout, "the extender's view to match the API server's")
    except TimeoutError:
        assert compared.get("seen") == compared.get("truth")
        raise


def test_restarts_mid_burst_lose_nothing_and_double_book_nothing(gpu_cluster: GpuCluster, ns: str, tmp_path: Path):
    names = [_node_name(ns, s) for s in "abc"]
    for k, name in enumerate(names):
        gpu_cluster.add_node(name, "2xA100:40GiB", order=_adversarial(10 + k))
    pods = _mixed_pods(ns, 60, seed=11)
    _create_burst(gpu_cluster, pods[:30])
    wait_for(lambda: sum(bool(p["spec"].get("nodeName")) for p in gpu_cluster.pods(ns)) >= 10, 60, "10 pods bound")
    gpu_cluster.restart_extender()
    _create_burst(gpu_cluster, pods[30:])
    gpu_cluster.restart_plugin(names[0])
    assert gpu_cluster.restart_kubelet(names[1]) < 10
    final = _settled(gpu_cluster, ns)
    phases = Counter(p["status"].get("phase") for p in final)
    assert phases["Failed"] == 0, phases
    assert phases["Running"] >= 40, phases
    gpu_cluster.check_invariants()
    _assert_extender_view_is_truth(gpu_cluster)


def test_frag_policy_runs_live(gpu_cluster: GpuCluster, ns: str) -> None:
    """`share-scheduler --policy frag` places through the real kube-scheduler like any policy."""
    gpu_cluster.policy = "frag"
    gpu_cluster.restart_extender()
    try:
        for suffix in "ab":
            gpu_cluster.add_node(_node_name(ns, suffix), "2xA100:40GiB")
        pods = _mixed_pods(ns, 24, seed=3)
        _create_burst(gpu_cluster, pods)
        final = _settled(gpu_cluster, ns)
        phases = Counter(p["status"].get("phase") for p in final)
        assert phases["Failed"] == 0 and phases["Running"] >= 20, phases
        assert gpu_cluster.extender_json("/version")["policy"] == "frag"
        _assert_extender_view_is_truth(gpu_cluster)
    finally:
        gpu_cluster.policy = "binpack"
        gpu_cluster.restart_extender()
