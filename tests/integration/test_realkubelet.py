"""The production path on a real node: real kube-scheduler, our extender, the upstream kubelet with
containerd and runc, our device plugin registering with it, and real containers printing their env.

After each scenario: every running container's env names the GPU its pod's annotations name with its
own limit, no GPU is promised more than it has, and `kubectl inspect gpushare` agrees with the API.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from share_core.accounting import GpuUsage
from share_core.accounting import node_usage
from share_core.assignment import Assignment
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.contract import ANN_ASSIGNED
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_VISIBLE_DEVICES
from share_core.contract import EVENT_ALLOCATE_REFUSED
from share_core.contract import EVENT_RUNS_WITHOUT_GPU
from share_core.contract import RESOURCE_MEM
from share_core.gpus import node_gpus
from share_plugin.podresources import PodResourcesClient
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import Pod
from tests.controlplane.gpucluster import wait_for
from tests.controlplane.realgpunode import RealGpuNode
from tests.controlplane.realgpunode import delete_pods
from tests.node import RealNode

pytestmark = [pytest.mark.integration, pytest.mark.realkubelet]

# Two big and two small GPUs: binpack, multi-GPU pods and a 30-pod burst all fit with room to spare.
SIM_GPUS = "2xA100:80GiB,2xT4:16GiB"
BURST_SIZES = [1, 2, 2, 3, 4, 4, 1, 8, 2, 5]  # repeated: equal sizes on purpose, and mixed


@pytest.fixture(scope="module")
def real_gpu(gpu_cluster: GpuCluster, real_node: RealNode) -> Iterator[RealGpuNode]:
    with RealGpuNode(gpu_cluster, real_node, SIM_GPUS).running() as node:
        yield node


@pytest.fixture
def rns(real_gpu: RealGpuNode, ns: str) -> Iterator[str]:
    """A namespace whose pods are gone from the real node afterwards; the plugin is back to normal."""
    yield ns
    delete_pods(real_gpu.cluster, ns)
    if real_gpu.plugin is None or not real_gpu.plugin.alive() or real_gpu.plugin_pod_resources:
        real_gpu.restart_plugin()


def create(cluster: GpuCluster, *pods: Pod) -> None:
    for pod in pods:
        cluster.create_pod(pod)


def phase(cluster: GpuCluster, ns: str, name: str) -> str:
    return (cluster.admin.get_pod(ns, name).get("status") or {}).get("phase", "")


def settle(cluster: GpuCluster, ns: str, names: list[str], timeout: float = 240.0) -> dict[str, Pod]:
    """Wait until each pod is Running or Failed (no pod stuck Pending); returns name -> pod."""

    def done() -> dict[str, Pod] | None:
        pods = {p["metadata"]["name"]: p for p in cluster.pods(ns)}
        phases = {n: (pods.get(n, {}).get("status") or {}).get("phase") for n in names}
        if all(ph in ("Running", "Failed", "Succeeded") for ph in phases.values()):
            return pods
        return None

    return wait_for(done, timeout, f"{len(names)} pods in {ns} to run or fail", interval=0.5)


def events(cluster: GpuCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    items = cluster.admin.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == pod]


def assignment_of(cluster: GpuCluster, ns: str, name: str) -> Assignment:
    a = parse_assignment(pod_annotations(cluster.admin.get_pod(ns, name)))
    assert a is not None, f"{ns}/{name} has no assignment"
    return a


# -- one pod at a time --------------------------------------------------------------------------------


def test_one_pod(real_gpu: RealGpuNode, rns: str) -> None:
    cluster = real_gpu.cluster
    create(cluster, real_gpu.pod("one", rns, 4))
    pod = cluster.wait_phase(rns, "one", ["Running"], timeout=120)
    assert pod["spec"]["nodeName"] == real_gpu.name
    env = real_gpu.env_of(pod)["c0"]
    a = assignment_of(cluster, rns, "one")
    assert env[ENV_VISIBLE_DEVICES] == a.gpu_uuids[0] and env[ENV_MEM_LIMIT_MIB] == "4096"
    wait_for(lambda: assignment_of(cluster, rns, "one").assigned, 30, "assigned=true")
    real_gpu.check_invariants()


def test_multi_container_pod(real_gpu: RealGpuNode, rns: str) -> None:
    create(real_gpu.cluster, real_gpu.pod("multi", rns, [2, 0, 3]))
    pod = real_gpu.cluster.wait_phase(rns, "multi", ["Running"], timeout=120)
    envs = real_gpu.env_of(pod)
    assert {c: e[ENV_MEM_LIMIT_MIB] for c, e in envs.items()} == {"c0": "2048", "c2": "3072"}
    real_gpu.check_invariants()


@pytest.mark.parametrize(("init", "app"), [(2, 3), (2, 2)], ids=["init-differs", "init-equals"])
def test_init_container_asking_gpu_mem(real_gpu: RealGpuNode, rns: str, init: int, app: int) -> None:
    """PodResources never lists a regular init container (server_v1.go): it must still be served first,
    the app container after it, and the pod marked assigned, so a later pod of the same size is not
    mistaken for it."""
    cluster = real_gpu.cluster
    create(cluster, real_gpu.pod("withinit", rns, app, init_gib=init))
    pod = cluster.wait_phase(rns, "withinit", ["Running"], timeout=120)
    envs = real_gpu.env_of(pod)
    assert envs["init0"][ENV_MEM_LIMIT_MIB] == str(init * 1024)
    assert envs["c0"][ENV_MEM_LIMIT_MIB] == str(app * 1024)
    wait_for(lambda: assignment_of(cluster, rns, "withinit").assigned, 30, "withinit assigned=true")
    create(cluster, real_gpu.pod("after", rns, init))
    cluster.wait_phase(rns, "after", ["Running"], timeout=120)
    real_gpu.check_invariants()


def test_sidecar_asking_gpu_mem(real_gpu: RealGpuNode, rns: str) -> None:
    create(real_gpu.cluster, real_gpu.pod("side", rns, 3, sidecar_gib=1))
    pod = real_gpu.cluster.wait_phase(rns, "side", ["Running"], timeout=120)
    envs = real_gpu.env_of(pod)
    assert envs["sidecar"][ENV_MEM_LIMIT_MIB] == "1024" and envs["c0"][ENV_MEM_LIMIT_MIB] == "3072"
    real_gpu.check_invariants()


def test_two_gpu_pod(real_gpu: RealGpuNode, rns: str) -> None:
    create(real_gpu.cluster, real_gpu.pod("two", rns, 16, gpu_count=2))
    pod = real_gpu.cluster.wait_phase(rns, "two", ["Running"], timeout=120)
    env = real_gpu.env_of(pod)["c0"]
    a = assignment_of(real_gpu.cluster, rns, "two")
    assert len(set(a.gpu_indices)) == 2
    assert env[ENV_VISIBLE_DEVICES].split(",") == list(a.gpu_uuids) and env[ENV_MEM_LIMIT_MIB] == "8192"
    real_gpu.check_invariants()


# -- bursts and restarts ------------------------------------------------------------------------------


def burst(real_gpu: RealGpuNode, ns: str, count: int = 30) -> list[str]:
    """Create `count` pods of mixed and equal sizes at once, from several threads."""
    names = [f"b{i:02d}" for i in range(count)]
    pods = [real_gpu.pod(n, ns, BURST_SIZES[i % len(BURST_SIZES)]) for i, n in enumerate(names)]
    threads = [threading.Thread(target=create, args=(real_gpu.cluster, *pods[k::4])) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return names


def check_burst(real_gpu: RealGpuNode, ns: str, names: list[str], allow_rejected: bool) -> list[str]:
    """Every pod ran or was rejected with kubelet's reason; returns those rejected."""
    pods = settle(real_gpu.cluster, ns, names)
    failed = [n for n in names if pods[n]["status"]["phase"] != "Running"]
    for n in failed:
        status = pods[n]["status"]
        assert allow_rejected, f"{ns}/{n} did not run: {status.get('reason')}: {status.get('message')}"
        # kubelet rejected it at admission (its device plugin was away a moment), or the restart cut a
        # container start short (StartError "context canceled", and restartPolicy Never): said so, never stuck
        rejected = bool(status.get("reason") and status.get("message"))
        start_cut = any(
            (cs.get("state") or {}).get("terminated", {}).get("reason") == "StartError"
            for cs in status.get("containerStatuses") or []
        )
        assert rejected or start_cut, json.dumps(status, indent=1)
        # ...but never by our plugin refusing a gpushare pod: its refusals all start "node <name>:"
        assert f"node {real_gpu.name}:" not in status.get("message", ""), status["message"]
    real_gpu.check_invariants()
    print(f"{ns}: {len(names) - len(failed)} of {len(names)} pods ran; kubelet rejected {failed}")
    return failed


def test_burst_of_30_pods(real_gpu: RealGpuNode, rns: str) -> None:
    names = burst(real_gpu, rns)
    check_burst(real_gpu, rns, names, allow_rejected=False)


def running_count(cluster: GpuCluster, ns: str) -> int:
    return sum(1 for p in cluster.pods(ns) if (p.get("status") or {}).get("phase") == "Running")


def test_kubelet_restart_in_the_middle_of_a_burst(real_gpu: RealGpuNode, rns: str) -> None:
    cluster = real_gpu.cluster
    names = burst(real_gpu, rns)
    wait_for(lambda: running_count(cluster, rns) >= 8, 120, "a third of the burst running", interval=0.2)
    registrations = real_gpu.registrations()
    real_gpu.node.restart_kubelet()
    wait_for(lambda: real_gpu.registrations() > registrations, 60, "the plugin to register again")
    rejected = check_burst(real_gpu, rns, names, allow_rejected=True)
    # Pods kubelet rejected while its plugin was re-registering are Failed, not stuck; created again, they run.
    again = [real_gpu.pod(f"{n}-again", rns, 2) for n in rejected]
    create(cluster, *again)
    check_burst(real_gpu, rns, [p["metadata"]["name"] for p in again], allow_rejected=False)


def test_plugin_restart_in_the_middle_of_a_burst(real_gpu: RealGpuNode, rns: str) -> None:
    cluster = real_gpu.cluster
    names = burst(real_gpu, rns)
    wait_for(lambda: running_count(cluster, rns) >= 8, 120, "a third of the burst running", interval=0.2)
    real_gpu.restart_plugin()
    rejected = check_burst(real_gpu, rns, names, allow_rejected=True)
    again = [real_gpu.pod(f"{n}-again", rns, 2) for n in rejected]
    create(cluster, *again)
    check_burst(real_gpu, rns, [p["metadata"]["name"] for p in again], allow_rejected=False)


# -- pods gpushare cannot serve, and a blind plugin ----------------------------------------------------


def bound_pod(real_gpu: RealGpuNode, name: str, ns: str, gib: int, **extra: Any) -> Pod:
    """A pod that bypasses gpushare-scheduler: bound to the node at creation, as another scheduler
    (or a user setting spec.nodeName) would do."""
    pod = real_gpu.pod(name, ns, gib)
    pod["spec"]["schedulerName"] = "default-scheduler"
    pod["spec"]["nodeName"] = real_gpu.name
    pod["spec"].update(extra)
    return pod


def test_pod_of_another_scheduler_is_refused_with_an_event(real_gpu: RealGpuNode, rns: str) -> None:
    cluster = real_gpu.cluster
    create(cluster, bound_pod(real_gpu, "stranger", rns, 2))
    pod = cluster.wait_phase(rns, "stranger", ["Failed"], timeout=120)
    # kubelet rejects the pod at admission with our message (UnexpectedAdmissionError)
    assert "gpushare" in pod["status"].get("message", ""), pod["status"]
    wait_for(
        lambda: any(e["reason"] == EVENT_ALLOCATE_REFUSED for e in events(cluster, rns, "stranger")),
        30,
        f"a {EVENT_ALLOCATE_REFUSED} event on the pod",
    )
    # ...and gpushare pods of the same size are served as before
    create(cluster, real_gpu.pod("ours", rns, 2))
    cluster.wait_phase(rns, "ours", ["Running"], timeout=120)
    real_gpu.check_invariants()


def test_pod_resources_unreachable_refuses_rather_than_guess(real_gpu: RealGpuNode, rns: str, tmp_path) -> None:
    cluster = real_gpu.cluster
    real_gpu.restart_plugin(pod_resources_socket=str(tmp_path / "no-such-kubelet.sock"))
    # Alone, a pod's size names it: served by request size and assume time.
    create(cluster, real_gpu.pod("alone", rns, 3))
    cluster.wait_phase(rns, "alone", ["Running"], timeout=120)
    # A pod gpushare cannot serve, asking the same size, bound alongside: no one is served blindly.
    create(cluster, bound_pod(real_gpu, "stranger", rns, 2), real_gpu.pod("rival", rns, 2))
    pods = settle(cluster, rns, ["stranger", "rival"])
    assert pods["stranger"]["status"]["phase"] == "Failed"
    assert "gpushare" in pods["stranger"]["status"].get("message", "")
    if pods["rival"]["status"]["phase"] == "Failed":
        assert "gpushare cannot serve" in pods["rival"]["status"].get("message", ""), pods["rival"]["status"]
    real_gpu.check_invariants()
    assert "PodResources" in real_gpu.plugin.log_tail(200)


def over_cpu_pod(real_gpu: RealGpuNode, name: str, ns: str) -> tuple[dict[str, Any], GpuUsage]:
    """A gpushare pod bound here with 4 GiB on a GPU with room, asking more CPU than the node has: kubelet
    has the plugin serve it, then rejects it OutOfcpu. Returns the pod and the GPU's usage before it."""
    usage = node_usage(node_gpus(real_gpu.cluster.admin.get_node(real_gpu.name)), real_gpu.pods())
    gpu = next(g for g in usage.gpus if g.total - g.used >= 4)
    pod = bound_pod(real_gpu, name, ns, 4)
    pod["spec"]["schedulerName"] = "gpushare-scheduler"
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1000"}
    pod["metadata"]["annotations"].update(Assignment((gpu.index,), (gpu.uuid,), 4, time.time_ns()).to_annotations())
    return pod, gpu


def test_pod_rejected_after_allocate_frees_its_memory(real_gpu: RealGpuNode, rns: str) -> None:
    """kubelet runs the device allocation before its predicate admit handler (kubelet.go): a pod can be
    served and then rejected (here OutOfcpu). It is Failed, and its memory counts for nothing."""
    cluster = real_gpu.cluster
    pod, gpu = over_cpu_pod(real_gpu, "greedy", rns)
    create(cluster, pod)
    failed = cluster.wait_phase(rns, "greedy", ["Failed"], timeout=120)
    assert failed["status"].get("reason") == "OutOfcpu", failed["status"]
    # the plugin had served it (the predicate runs after allocation), then kubelet rejected it
    assert pod_annotations(failed).get(ANN_ASSIGNED) == "true"
    used = real_gpu.check_invariants()
    assert used[gpu.index] == gpu.used
    create(cluster, real_gpu.pod("next", rns, 4))
    cluster.wait_phase(rns, "next", ["Running"], timeout=120)
    real_gpu.check_invariants()


def kubelet_lists_inactive_pods(real_gpu: RealGpuNode) -> bool:
    """kubelet before 1.34 lists every pod of its pod manager in PodResources (the gate
    KubeletPodResourcesListUseActivePods, pkg/features/kube_features.go, defaults on from 1.34)."""
    version = real_gpu.cluster.admin.get_node(real_gpu.name)["status"]["nodeInfo"]["kubeletVersion"]
    major, minor = (int(x) for x in version.lstrip("v").split(".")[:2])
    return (major, minor) < (1, 34)


def test_pods_rejected_at_admission_followed_by_pods_of_the_same_size(real_gpu: RealGpuNode, rns: str) -> None:
    """Two pods rejected at admission (one served then OutOfcpu, one refused by our Allocate), with pods
    of their size right behind them and again once they are Failed. Before 1.34 kubelet keeps listing the
    rejected pods in PodResources, holding nothing, like a pod being admitted: every later pod still runs
    on the GPU its annotations name."""
    cluster = real_gpu.cluster
    greedy, _ = over_cpu_pod(real_gpu, "a-greedy", rns)
    first = [real_gpu.pod(f"b-next{i}", rns, 4) for i in range(3)]
    create(cluster, greedy, bound_pod(real_gpu, "a-stranger", rns, 4), *first)
    pods = settle(cluster, rns, ["a-greedy", "a-stranger"] + [p["metadata"]["name"] for p in first])
    assert pods["a-greedy"]["status"].get("reason") == "OutOfcpu", pods["a-greedy"]["status"]
    assert "gpushare" in pods["a-stranger"]["status"].get("message", ""), pods["a-stranger"]["status"]
    for p in first:
        status = pods[p["metadata"]["name"]]["status"]
        assert status["phase"] == "Running", (p["metadata"]["name"], status)
    # what kubelet's PodResources lists now: the rejected pods only before 1.34
    client = PodResourcesClient(str(real_gpu.node.pod_resources_socket), RESOURCE_MEM)
    try:
        listed = set(client.list())
    finally:
        client.close()
    rejected_listed = listed & {(rns, "a-greedy"), (rns, "a-stranger")}
    assert bool(rejected_listed) == kubelet_lists_inactive_pods(real_gpu), (sorted(listed), rejected_listed)
    later = [real_gpu.pod(f"c-later{i}", rns, 4) for i in range(2)]
    create(cluster, *later)
    for p in later:
        cluster.wait_phase(rns, p["metadata"]["name"], ["Running"], timeout=120)
    real_gpu.check_invariants()


def test_pod_admitted_without_allocate_after_kubelet_restart(real_gpu: RealGpuNode, rns: str) -> None:
    """kubelet restarted without its device checkpoint while the plugin is away does not know our
    resource: it admits a gpu-mem pod with no Allocate (predicate.go removeMissingExtendedResources).
    The plugin, once back, says so on the pod and never counts it as pending."""
    cluster = real_gpu.cluster
    real_gpu.stop_plugin()
    real_gpu.node.restart_kubelet(drop_device_checkpoint=True)
    create(cluster, real_gpu.pod("blind", rns, 2))
    pod = cluster.wait_phase(rns, "blind", ["Running"], timeout=120)
    env = real_gpu.env_of(pod)["c0"]
    assert ENV_VISIBLE_DEVICES not in env, env  # it really got no GPU
    real_gpu.start_plugin()
    wait_for(
        lambda: any(e["reason"] == EVENT_RUNS_WITHOUT_GPU for e in events(cluster, rns, "blind")),
        60,
        f"a {EVENT_RUNS_WITHOUT_GPU} event on the pod",
    )
    assert (
        "delete the pod"
        in next(e for e in events(cluster, rns, "blind") if e["reason"] == EVENT_RUNS_WITHOUT_GPU)["message"]
    )
    # a pod of the same size after it is served normally: the blind one is not a candidate
    create(cluster, real_gpu.pod("seeing", rns, 2))
    cluster.wait_phase(rns, "seeing", ["Running"], timeout=120)
    real_gpu.check_invariants(namespaces=[rns + "-none"])  # capacity and inspect; "blind" has no GPU env
    env = real_gpu.env_of(cluster.admin.get_pod(rns, "seeing"))["c0"]
    assert env[ENV_VISIBLE_DEVICES] == assignment_of(cluster, rns, "seeing").gpu_uuids[0]
