"""Priority preemption through the real kube-scheduler and the chart's configuration (preemptVerb: preempt):
each preemptor bound within a minute on the GPU(s) freed for it, the victims exactly the cheapest set, no
eviction off other GPUs, no GPU over its memory.

Two paths meet here (share_scheduler/preempt.py): where the node's total `nvidia.com/gpu-mem` does not fit,
kube-scheduler's DefaultPreemption calls the preempt verb and evicts what it answers; where only
fragmentation stands in the way, kube-scheduler 1.33-1.37 find no candidate and the extender's leader
evicts. Nothing here is 1.37-only: both paths run on 1.33 as on 1.37.

The kubelet stand-in does not finish a graceful deletion; `Reaper` does what kubelet does once a deleted
pod's containers stopped (delete it with grace 0, free its devices), and can be paused to keep victims
terminating."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.contract import ANN_HOLDS
from share_core.kube import KubeError
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import pod_spec
from tests.controlplane.gpucluster import wait_for

pytestmark = pytest.mark.integration

CLASSES = {"gs-low": 10, "gs-mid": 100, "gs-high": 1000, "gs-vip": 5000, "gs-high-never": 1000}
BOUND_WITHIN = 60.0


@pytest.fixture(scope="module", autouse=True)
def priority_classes(gpu_cluster: GpuCluster) -> None:
    for name, value in CLASSES.items():
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
        body["value"] = value
        if name.endswith("-never"):  # the Priority admission plugin copies it into the pod's spec
            body["preemptionPolicy"] = "Never"
        try:
            gpu_cluster.admin.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body)
        except KubeError as exc:
            if exc.status != 409:
                raise


class Reaper:
    """kubelet's last step for a deleted pod: once its containers stop, delete it with grace 0."""

    def __init__(self, cluster: GpuCluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns
        self.paused = threading.Event()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            if self.paused.is_set():
                continue
            try:
                self._reap()
            except Exception as exc:  # keep reaping, as kubelet keeps going
                self.errors.append(repr(exc))

    def _reap(self) -> None:
        if True:
            try:
                for pod in self.cluster.pods(self.ns):
                    meta = pod["metadata"]
                    if not meta.get("deletionTimestamp"):
                        continue
                    node = self.cluster.nodes.get(pod["spec"].get("nodeName", ""))
                    if node is not None:
                        node.kubelet.remove_pod(self.ns, meta["name"])
                    self.cluster.admin.request(
                        "DELETE", f"/api/v1/namespaces/{self.ns}/pods/{meta['name']}", query={"gracePeriodSeconds": 0}
                    )
            except KubeError:
                return


@pytest.fixture
def reaper(gpu_cluster: GpuCluster, ns: str) -> Iterator[Reaper]:
    r = Reaper(gpu_cluster, ns)
    yield r
    r.stop.set()


def pod(name: str, gib: int, ns: str, cls: str, gpu_count: int = 1, **labels: str) -> dict:
    p = pod_spec(name, gib, ns, gpu_count=gpu_count)
    p["spec"]["priorityClassName"] = cls
    if labels:
        p["metadata"]["labels"] = dict(labels)
    return p


def run(cluster: GpuCluster, ns: str, *pods: dict) -> None:
    """Create pods and wait until each runs (they fill GPUs in the order given)."""
    for p in pods:
        cluster.create_pod(p)
        cluster.wait_phase(ns, p["metadata"]["name"], ["Running"], timeout=60)


def gpus_of(cluster: GpuCluster, ns: str, name: str) -> tuple[str, tuple[int, ...]]:
    p = cluster.admin.get_pod(ns, name)
    a = parse_assignment(pod_annotations(p))
    assert a is not None, f"{name} has no GPU assignment"
    return p["spec"]["nodeName"], a.gpu_indices


def preempted(cluster: GpuCluster, ns: str, names: list[str]) -> set[str]:
    """Which of `names` are gone or going."""
    out = set()
    for name in names:
        try:
            p = cluster.admin.get_pod(ns, name)
        except KubeError:
            out.add(name)
            continue
        if p["metadata"].get("deletionTimestamp"):
            out.add(name)
    return out


def wait_bound(cluster: GpuCluster, ns: str, name: str) -> tuple[str, tuple[int, ...]]:
    start = time.monotonic()
    cluster.wait_phase(ns, name, ["Running"], timeout=BOUND_WITHIN + 30)
    assert time.monotonic() - start < BOUND_WITHIN + 30
    return gpus_of(cluster, ns, name)


def test_split_free_memory_evicts_one_pod_from_one_gpu(gpu_cluster: GpuCluster, ns: str, reaper: Reaper) -> None:
    """The issue's report: the node's total fits, no GPU does (kube-scheduler has no candidate): the
    extender's leader evicts the cheapest pod on one GPU and the preemptor gets that GPU."""
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("l0", 12, ns, "gs-low"), pod("l1", 10, ns, "gs-low"))
    freed_gpu = gpus_of(gpu_cluster, ns, "l1")[1]
    gpu_cluster.create_pod(pod("big", 8, ns, "gs-high"))
    node, gpus = wait_bound(gpu_cluster, ns, "big")
    assert (node, gpus) == (f"{ns}-a", freed_gpu)
    assert preempted(gpu_cluster, ns, ["l0", "l1"]) == {"l1"}  # the one that frees less memory
    gpu_cluster.check_invariants()
    events = [e for e in gpu_cluster.admin.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]]
    assert any(e["reason"] == "GpuSharePreempting" and e["involvedObject"]["name"] == "big" for e in events)


def test_verb_answers_one_gpu_where_kube_scheduler_frees_the_node(
    gpu_cluster: GpuCluster, ns: str, reaper: Reaper
) -> None:
    """The node's total does not fit: kube-scheduler proposes victims by its count and calls the verb,
    which answers the cheapest pod that frees ONE GPU."""
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("a10", 10, ns, "gs-low"), pod("b12", 12, ns, "gs-low"), pod("a5", 5, ns, "gs-low"))
    target = gpus_of(gpu_cluster, ns, "a10")[1]
    gpu_cluster.create_pod(pod("big", 9, ns, "gs-high"))
    _, gpus = wait_bound(gpu_cluster, ns, "big")
    assert preempted(gpu_cluster, ns, ["a10", "b12", "a5"]) == {"a10"}
    assert gpus == target
    gpu_cluster.check_invariants()


def test_priority_inversion_evicts_the_mid_pod_only_where_it_must(
    gpu_cluster: GpuCluster, ns: str, reaper: Reaper
) -> None:
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("mid", 12, ns, "gs-mid"), pod("vip", 10, ns, "gs-vip"))
    only = gpus_of(gpu_cluster, ns, "mid")[1]  # the only GPU that can be freed
    gpu_cluster.create_pod(pod("big", 14, ns, "gs-high"))
    _, gpus = wait_bound(gpu_cluster, ns, "big")
    assert preempted(gpu_cluster, ns, ["mid", "vip"]) == {"mid"}
    assert gpus == only
    gpu_cluster.check_invariants()


def test_gpu_count_two_frees_two_gpus_and_choice_between_nodes(
    gpu_cluster: GpuCluster, ns: str, reaper: Reaper
) -> None:
    gpu_cluster.add_node(f"{ns}-a", "3xT4:16GiB")
    run(
        gpu_cluster,
        ns,
        pod("m0", 12, ns, "gs-mid"),
        pod("l1", 12, ns, "gs-low"),
        pod("l2", 12, ns, "gs-low"),
    )
    gpu_cluster.create_pod(pod("pair", 16, ns, "gs-high", gpu_count=2))  # 8 GiB on each of 2 GPUs
    _, gpus = wait_bound(gpu_cluster, ns, "pair")
    assert preempted(gpu_cluster, ns, ["m0", "l1", "l2"]) == {"l1", "l2"}
    assert len(gpus) == 2
    gpu_cluster.check_invariants()


def test_pdb_is_respected_where_another_way_exists(gpu_cluster: GpuCluster, ns: str, reaper: Reaper) -> None:
    gpu_cluster.admin.request(
        "POST",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        body={
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "keep"}}},
        },
    )
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("kept", 10, ns, "gs-low", app="keep"), pod("other", 12, ns, "gs-mid"))
    gpu_cluster.create_pod(pod("big", 8, ns, "gs-high"))
    wait_bound(gpu_cluster, ns, "big")
    assert preempted(gpu_cluster, ns, ["kept", "other"]) == {"other"}  # a PDB violation ranks after priority
    gpu_cluster.check_invariants()


def test_never_policy_evicts_nothing(gpu_cluster: GpuCluster, ns: str, reaper: Reaper) -> None:
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("l0", 12, ns, "gs-low"), pod("l1", 10, ns, "gs-low"))
    gpu_cluster.create_pod(pod("polite", 8, ns, "gs-high-never"))
    time.sleep(8)
    assert preempted(gpu_cluster, ns, ["l0", "l1"]) == set()
    assert gpu_cluster.admin.get_pod(ns, "polite")["status"].get("phase") == "Pending"


def test_held_gpu_is_not_taken_by_a_low_pod_arriving_meanwhile(
    gpu_cluster: GpuCluster, ns: str, reaper: Reaper
) -> None:
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("l0", 12, ns, "gs-low"), pod("l1", 10, ns, "gs-low"))
    reaper.paused.set()  # victims stay terminating
    gpu_cluster.create_pod(pod("big", 8, ns, "gs-high"))
    wait_for(lambda: preempted(gpu_cluster, ns, ["l0", "l1"]) == {"l1"}, 60, "l1 preempted")
    freed = gpus_of(gpu_cluster, ns, "l1")[1]
    gpu_cluster.create_pod(pod("sneak", 10, ns, "gs-low"))  # would fit the freed GPU if nothing held it
    time.sleep(2)
    reaper.paused.clear()
    _, gpus = wait_bound(gpu_cluster, ns, "big")
    assert gpus == freed
    time.sleep(3)
    assert gpu_cluster.admin.get_pod(ns, "sneak")["status"].get("phase") == "Pending"
    gpu_cluster.check_invariants()


def test_held_gpu_survives_a_low_pod_and_an_extender_restart(gpu_cluster: GpuCluster, ns: str, reaper: Reaper) -> None:
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("l0", 12, ns, "gs-low"), pod("l1", 10, ns, "gs-low"))
    reaper.paused.set()  # victims stay terminating
    gpu_cluster.create_pod(pod("big", 8, ns, "gs-high"))
    wait_for(lambda: preempted(gpu_cluster, ns, ["l0", "l1"]) == {"l1"}, 60, "l1 preempted")
    wait_for(lambda: ANN_HOLDS in pod_annotations(gpu_cluster.admin.get_pod(ns, "big")), 30, "the hold annotation")
    freed = gpus_of(gpu_cluster, ns, "l1")[1]
    gpu_cluster.restart_extender()  # the new process rebuilds the hold from the annotation
    gpu_cluster.create_pod(pod("sneak", 10, ns, "gs-low"))  # would fit the freed GPU if nothing held it
    reaper.paused.clear()
    try:
        _, gpus = wait_bound(gpu_cluster, ns, "big")
    except TimeoutError:
        state = {
            p["metadata"]["name"]: (p["metadata"].get("deletionTimestamp"), p["status"].get("phase"))
            for p in gpu_cluster.pods(ns)
        }
        raise AssertionError(f"pods {state}; reaper errors {reaper.errors}; alive {reaper.thread.is_alive()}") from None
    assert gpus == freed
    time.sleep(3)
    assert gpu_cluster.admin.get_pod(ns, "sneak")["status"].get("phase") == "Pending"
    gpu_cluster.check_invariants()


def test_two_preemptors_racing_each_get_a_gpu(gpu_cluster: GpuCluster, ns: str, reaper: Reaper) -> None:
    gpu_cluster.add_node(f"{ns}-a", "2xT4:16GiB")
    run(gpu_cluster, ns, pod("l0", 12, ns, "gs-low"), pod("l1", 12, ns, "gs-low"))
    gpu_cluster.create_pod(pod("p1", 10, ns, "gs-high"))
    gpu_cluster.create_pod(pod("p2", 9, ns, "gs-high"))
    _, g1 = wait_bound(gpu_cluster, ns, "p1")
    _, g2 = wait_bound(gpu_cluster, ns, "p2")
    assert {g1, g2} == {(0,), (1,)}
    assert preempted(gpu_cluster, ns, ["l0", "l1"]) == {"l0", "l1"}
    gpu_cluster.check_invariants()
