"""What kube-scheduler's own preemption does for a pod whose ResourceClaim fits no GPU (DRA mode, issue 38).

The question: a high-priority pod's claim fits on no GPU's remaining `memory`, but would once a lower-priority
pod on that node is gone. Does the real kube-scheduler (its DefaultPreemption beside its DynamicResources
plugin) pick victims per device correctly, wastefully, or not at all?

Measured through the real kube-apiserver, kube-scheduler (default profile) and kube-controller-manager's
resourceclaim controller, with the ResourceSlice share-dra publishes (`share_dra.slices`, via
tests/controlplane/draworkload.py): not at all. On v1.37 the DynamicResources plugin has no
PreFilterExtensions (`PreFilterExtensions` returns nil in
pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go), and its allocator is built in PreFilter
from every allocated claim of the cluster (`GatherAllocatedState`). Its Filter fails a node where the claim
does not fit with `statusUnschedulable`, which is UnschedulableAndUnresolvable: DefaultPreemption's
`findCandidates` (framework/preemption) takes only nodes marked Unschedulable, finds none, and
`Evaluator.evaluate` ends with "No preemption candidate is found" (the pod's message: "preemption: ...
Preemption is not helpful for scheduling"). Even were the node tried, its dry run (`SelectVictimsOnNode`)
removes the lower-priority pods from its NodeInfo copy only, and with no PreFilterExtensions the DRA Filter
would still count their claims as allocated. Nothing is evicted and the pod waits until something else
frees the GPU (kubernetes/enhancements#5690 is the upstream work to change that). The control test shows
the same scheduler preempting at once where the shortage is CPU, so the outcome is the DRA plugin's, not
this set-up's. docs/dra.md ("Priorities and preemption") says what this means for users.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from share_core.kube import NotFound
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import create_node
from tests.controlplane.draworkload import RESOURCE_API
from tests.controlplane.draworkload import device_class
from tests.controlplane.draworkload import gpu_slice
from tests.controlplane.gpucluster import wait_for
from tests.integration.test_dra import DraCluster
from tests.integration.test_dra import claim_template
from tests.integration.test_dra import consumed_by_device
from tests.integration.test_dra import start_dra_control_plane
from tests.integration.test_dra import unschedulable

pytestmark = [pytest.mark.integration, pytest.mark.k8s_min("1.34", "no resource.k8s.io/v1 before 1.34 (DRA GA)")]

NODE = "drapre-0"
GPUS = [("Tesla T4", 16), ("Tesla T4", 16)]
NODE_CPU = "4"
LOW, HIGH = "gpushare-test-low", "gpushare-test-high"
# How long a preemptor is watched after it was first found unschedulable: kube-scheduler runs its
# PostFilter (preemption) in that very cycle, and evicts asynchronously right after.
WATCH_S = 20.0


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": "PreemptLowerPriority",
    }


def prio_pod(ns: str, name: str, priority_class_name: str, gib: int | None, cpu_milli: int = 100) -> dict[str, Any]:
    """A pod of `priority_class_name` asking `cpu_milli` and, unless `gib` is None, a claim of `gib` GiB of one
    GPU from the template `gpu-<gib>gi`; terminationGracePeriodSeconds 0, so an eviction deletes it at once
    (no kubelet runs here)."""
    container: dict[str, Any] = {"name": "main", "image": "none", "resources": {"requests": {"cpu": f"{cpu_milli}m"}}}
    spec: dict[str, Any] = {
        "priorityClassName": priority_class_name,
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
    }
    if gib is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"gpu-{gib}gi"}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


class PreemptionCluster(DraCluster):
    """One node of two 16 GiB GPUs, its slice as share-dra publishes it, and two PriorityClasses."""

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        super().__init__(cp, workdir)
        self.nodes = {}

    def create(self, ns: str, pod: dict[str, Any]) -> None:
        self.admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)

    def template(self, ns: str, gib: int) -> None:
        try:
            self.admin.request(
                "POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaimtemplates", body=claim_template(ns, gib)
            )
        except Exception as exc:  # made by an earlier pod of the namespace
            if "already exists" not in str(exc).lower() and "alreadyexists" not in str(exc).lower():
                raise

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self.admin.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        except NotFound:
            return None

    def bound(self, ns: str, name: str) -> dict[str, Any] | None:
        pod = self.pod(ns, name)
        return pod if pod is not None and pod["spec"].get("nodeName") else None

    def scheduler_log(self) -> str:
        path = self.cp.log_dir / "kube-scheduler.log"
        return path.read_text(errors="replace") if path.exists() else ""


def device_of(cluster: PreemptionCluster, ns: str, pod: dict[str, Any]) -> str:
    """The device the pod's (one) claim was allocated on."""
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    assert statuses, f"pod {pod['metadata']['name']} has no resourceClaimStatuses"
    claim = cluster.admin.request(
        "GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def disruption_target(pod: dict[str, Any] | None) -> bool:
    """Whether kube-scheduler marked the pod as a preemption victim (the DisruptionTarget condition)."""
    if pod is None:
        return False
    return any(c.get("type") == "DisruptionTarget" for c in (pod.get("status") or {}).get("conditions") or [])


@pytest.fixture(scope="module")
def pre_cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PreemptionCluster]:
    workdir = tmp_path_factory.mktemp("drapre")
    cp, _ = start_dra_control_plane(workdir, k8s_bin_dir)
    cluster = PreemptionCluster(cp, workdir)
    try:
        admin = cluster.admin
        admin.request("POST", f"{RESOURCE_API}/deviceclasses", body=device_class())
        admin.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=priority_class(LOW, 100))
        admin.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=priority_class(HIGH, 1000))
        create_node(admin, NODE, {"cpu": NODE_CPU, "memory": "64Gi", "pods": "110"})
        admin.request("POST", f"{RESOURCE_API}/resourceslices", body=gpu_slice(NODE, GPUS))
        yield cluster
    finally:
        cp.stop()


@pytest.fixture
def pre_ns(pre_cluster: PreemptionCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"pre-{request.node.name.replace('_', '-')[5:40].strip('-')}"
    pre_cluster.admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    yield name
    pods = [p["metadata"]["name"] for p in pre_cluster.pods(name)]
    # Pending pods first, so that nothing waiting lands on the room the bound ones leave.
    pending = [n for n in pods if not pre_cluster.bound(name, n)]
    for group in (pending, [n for n in pods if n not in pending]):
        for pod in group:
            try:
                pre_cluster.admin.request(
                    "DELETE", f"/api/v1/namespaces/{name}/pods/{pod}", query={"gracePeriodSeconds": 0}
                )
            except NotFound:
                pass
        wait_for(lambda g=group: not set(g) & {p["metadata"]["name"] for p in pre_cluster.pods(name)}, 60, "pods gone")

    def claims_freed() -> bool:
        return not [
            c
            for c in pre_cluster.claims()
            if c["metadata"]["namespace"] == name and (c.get("status") or {}).get("allocation")
        ]

    wait_for(claims_freed, 120, f"claims of {name} freed")


def place_low_pods(cluster: PreemptionCluster, ns: str) -> None:
    """low-a (12 GiB) then low-b (8 GiB), one at a time: first fit puts low-a on gpu-0 and low-b on gpu-1,
    leaving 4 GiB and 8 GiB free (12 GiB on the node)."""
    for name, gib in (("low-a", 12), ("low-b", 8)):
        cluster.template(ns, gib)
        cluster.create(ns, prio_pod(ns, name, LOW, gib))
        wait_for(lambda n=name: cluster.bound(ns, n), 60, f"{name} bound")
    used = consumed_by_device(cluster.claims())
    assert used == {(NODE, "gpu-0"): 12 * 1024, (NODE, "gpu-1"): 8 * 1024}, used
    assert device_of(cluster, ns, cluster.bound(ns, "low-a")) == "gpu-0"
    assert device_of(cluster, ns, cluster.bound(ns, "low-b")) == "gpu-1"


def watch_preemptor(cluster: PreemptionCluster, ns: str, name: str, victims: list[str]) -> dict[str, Any]:
    """Wait for kube-scheduler's first verdict on `name`, then watch WATCH_S more: return the pod as last seen.
    Fails as soon as a victim is marked or gone (what preemption would do)."""
    first = wait_for(lambda: unschedulable(cluster.pod(ns, name) or {}) is not None, 60, f"{name} found unschedulable")
    assert first
    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:
        for v in victims:
            pod = cluster.pod(ns, v)
            assert pod is not None and not disruption_target(pod), f"{v} was preempted: {pod and pod['status']}"
        time.sleep(1.0)
    pod = cluster.pod(ns, name)
    assert pod is not None
    return pod


def test_kube_scheduler_does_not_preempt_for_a_claim(pre_cluster: PreemptionCluster, pre_ns: str) -> None:
    """A high-priority claim of 10 GiB fits no GPU (4 and 8 GiB free); evicting low-b alone would free
    16 GiB on gpu-1. kube-scheduler evicts nothing, nominates no node, and the pod waits."""
    place_low_pods(pre_cluster, pre_ns)
    pre_cluster.template(pre_ns, 10)
    pre_cluster.create(pre_ns, prio_pod(pre_ns, "high", HIGH, 10))
    pod = watch_preemptor(pre_cluster, pre_ns, "high", ["low-a", "low-b"])

    assert not pod["spec"].get("nodeName"), "the high-priority pod was bound with no GPU room"
    assert not (pod.get("status") or {}).get("nominatedNodeName"), "kube-scheduler nominated a node"
    message = unschedulable(pod) or ""
    print(f"\nhigh-priority pod's PodScheduled message: {message}")
    # The DRA Filter failed the node as UnschedulableAndUnresolvable ("cannot allocate all claims"), so
    # DefaultPreemption did not even try it: no node is a potential preemption node.
    fit, _, preemption = message.partition("preemption:")
    assert "cannot allocate all claims" in fit, message
    assert "Preemption is not helpful for scheduling" in preemption, message
    log = pre_cluster.scheduler_log()
    assert "No preemption candidate is found" in log, "kube-scheduler's --v=2 log shows no preemption attempt"
    assert consumed_by_device(pre_cluster.claims()) == {(NODE, "gpu-0"): 12 * 1024, (NODE, "gpu-1"): 8 * 1024}

    # What a per-device preemption would have done: low-b is the one victim (lowest cost: one pod, 8 GiB).
    # Deleting it by hand, the waiting pod lands on the GPU it freed.
    pre_cluster.admin.request("DELETE", f"/api/v1/namespaces/{pre_ns}/pods/low-b", query={"gracePeriodSeconds": 0})
    high = wait_for(lambda: pre_cluster.bound(pre_ns, "high"), 90, "high bound once low-b is gone")
    assert device_of(pre_cluster, pre_ns, high) == "gpu-1"
    assert pre_cluster.bound(pre_ns, "low-a"), "low-a must still run"


def test_control_kube_scheduler_preempts_for_cpu(pre_cluster: PreemptionCluster, pre_ns: str) -> None:
    """The same scheduler, the same node: where the shortage is CPU (the claim fits), DefaultPreemption
    evicts the lower-priority pod that holds the CPU, and the preemptor gets its claim. Preemption works;
    only claims are invisible to it."""
    place_low_pods(pre_cluster, pre_ns)
    # low-a and low-b take 0.2 CPU; low-cpu takes 3.5 of the node's 4: 0.3 left.
    pre_cluster.create(pre_ns, prio_pod(pre_ns, "low-cpu", LOW, None, cpu_milli=3500))
    wait_for(lambda: pre_cluster.bound(pre_ns, "low-cpu"), 60, "low-cpu bound")
    pre_cluster.template(pre_ns, 2)
    pre_cluster.create(pre_ns, prio_pod(pre_ns, "high-cpu", HIGH, 2, cpu_milli=1000))
    high = wait_for(lambda: pre_cluster.bound(pre_ns, "high-cpu"), 90, "high-cpu bound after preemption")
    assert pre_cluster.pod(pre_ns, "low-cpu") is None, "low-cpu, the one pod whose CPU was needed, was not evicted"
    assert pre_cluster.bound(pre_ns, "low-a") and pre_cluster.bound(pre_ns, "low-b"), "a GPU pod was evicted for CPU"
    assert device_of(pre_cluster, pre_ns, high) == "gpu-0"  # first fit: 2 GiB of gpu-0's 4
    print(f"\ncontrol: high-cpu bound to {high['spec']['nodeName']} after low-cpu was preempted")
