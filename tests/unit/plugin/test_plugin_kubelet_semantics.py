"""Our plugin under upstream kubelet's semantics (the stand-in in tests/kubelet mirrors kubelet v1.36.3):
regular init containers never listed by PodResources, sidecars, a pod rejected after its Allocate, a pod
admitted without Allocate and allocated later from the pod worker. Each test asserts what a correct plugin
must do: every container's env names the GPU its pod's annotations name, with its own limit;
`gpushare.io/assigned` is "true" once every container is served; a rejected pod blocks no later pod."""

from __future__ import annotations

from typing import Any

import pytest

from share_core.assignment import parse_assignment
from share_core.contract import ANN_ASSIGNED
from tests.kubelet import AdmissionError
from tests.unit.plugin.simnode import NODE
from tests.unit.plugin.simnode import SimNode
from tests.unit.plugin.simnode import make_pod
from tests.unit.plugin.simnode import start_node
from tests.unit.plugin.simnode import stop_node


def cpu_rejects(*names: str):
    """The predicate admit handler rejecting pods after their Allocate, as kubelet does for OutOfcpu."""
    msg = "Node didn't have enough resource: cpu, requested: 2000, used: 63000, capacity: 64000"
    return lambda pod: ("OutOfcpu", msg) if pod["metadata"]["name"] in names else None


def annotations(node: SimNode, name: str) -> dict[str, str]:
    return node.kube.pods[("default", name)]["metadata"]["annotations"]


def run(node: SimNode, pod: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Admit the pod and start its containers, as kubelet does; returns container -> env it started with."""
    node.kubelet.admit(pod)
    return node.kubelet.start_containers(pod)


def assert_served(node: SimNode, name: str, limits: dict[str, int]) -> None:
    """Each listed container runs on the GPU(s) the pod's annotations name, with its own limit; assigned."""
    ann = annotations(node, name)
    a = parse_assignment(ann)
    assert a is not None, f"{name}: no assignment"
    envs = node.kubelet.started_envs()[("default", name)]
    assert {c for c, e in envs.items() if e} == set(limits), f"{name}: containers served {sorted(envs)}"
    for container, units in limits.items():
        env = envs[container]
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(a.gpu_uuids), f"{name}/{container} on the wrong GPU"
        assert env["GPUSHARE_GPU_INDEX"] == ",".join(str(i) for i in a.gpu_indices)
        assert env["GPUSHARE_MEM_LIMIT_MIB"] == str(units * 1024), f"{name}/{container}: wrong limit"
    assert ann[ANN_ASSIGNED] == "true", f"{name}: not marked assigned"


def test_regular_init_container_asking_other_size_than_app(sim_node):
    """PodResources never lists the init container: the app container's Allocate must still be matched."""
    pod = sim_node.add(make_pod("ini", [("app", 2)], init=[("setup", 6)]), [3], 6, 10)
    run(sim_node, pod)
    assert_served(sim_node, "ini", {"setup": 6, "app": 2})


def test_regular_init_container_asking_same_size_as_app(sim_node):
    """kubelet hands the app container exactly the init container's devices (reused): same IDs twice."""
    pod = sim_node.add(make_pod("same", [("app", 4)], init=[("setup", 4)]), [1], 4, 10)
    run(sim_node, pod)
    devs = sim_node.kubelet.pod_devices()[("default", "same")]
    assert set(devs["app"]) == set(devs["setup"])
    assert_served(sim_node, "same", {"setup": 4, "app": 4})


def test_sidecar_asking_gpu_mem(sim_node):
    pod = sim_node.add(make_pod("side", [("app", 3)], init=[("setup", 2)], sidecars=[("proxy", 1)]), [2], 4, 10)
    run(sim_node, pod)
    assert_served(sim_node, "side", {"setup": 2, "proxy": 1, "app": 3})


def test_two_pods_with_init_containers_back_to_back(sim_node):
    first = sim_node.add(make_pod("i1", [("app", 2)], init=[("setup", 5)]), [0], 5, 10)
    second = sim_node.add(make_pod("i2", [("app", 2)], init=[("setup", 5)]), [1], 5, 11)
    run(sim_node, first)
    run(sim_node, second)
    assert_served(sim_node, "i1", {"setup": 5, "app": 2})
    assert_served(sim_node, "i2", {"setup": 5, "app": 2})


# kubelet before 1.34 (KubeletPodResourcesListUseActivePods off) lists every pod of its pod manager,
# rejected and terminated pods included: each rejected-pod scenario runs under both semantics.
LIST_SEMANTICS = pytest.mark.parametrize("list_all_pods", [False, True], ids=["active-pods", "all-pods-pre-1.34"])


@LIST_SEMANTICS
def test_pod_rejected_after_allocate_then_another_pod_of_the_same_size(list_all_pods: bool):
    node = start_node(predicate=cpu_rejects("a-rejected"), list_all_pods=list_all_pods)
    try:
        rejected = node.add(make_pod("a-rejected", [("m", 4)]), [0], 4, 10)
        with pytest.raises(AdmissionError) as err:
            node.kubelet.admit(rejected)
        assert err.value.reason == "OutOfcpu" and node.kubelet.allocate_calls  # it was allocated first
        later = node.add(make_pod("b-later", [("m", 4)]), [1], 4, 11)
        run(node, later)
        assert_served(node, "b-later", {"m": 4})
    finally:
        stop_node(node)


@LIST_SEMANTICS
def test_pod_rejected_after_allocate_reported_failed_then_another_pod_of_the_same_size(list_all_pods: bool):
    """Through the API: kubelet writes the rejected pod Failed; the next pod of its size is served."""
    node = start_node(predicate=cpu_rejects("a-rejected"), list_all_pods=list_all_pods)
    try:
        node.add(make_pod("a-rejected", [("m", 4)]), [0], 4, 10)
        node.add(make_pod("b-later", [("m", 4)]), [1], 4, 11)
        node.kubelet.run_with_kube(node.kube, NODE, order=lambda b: sorted(b, key=lambda p: p["metadata"]["name"]))

        def phase(name: str) -> str:
            return node.kube.pods[("default", name)]["status"]["phase"]

        node.kubelet.wait_for(lambda: phase("a-rejected") == "Failed" and phase("b-later") != "Pending", 10, "both")
        assert node.kube.pods[("default", "a-rejected")]["status"]["reason"] == "OutOfcpu"
        assert phase("b-later") == "Running"
        assert_served(node, "b-later", {"m": 4})
    finally:
        stop_node(node)


def _phase(node: SimNode, name: str) -> str:
    return node.kube.pods[("default", name)]["status"]["phase"]


def _run_batch(node: SimNode) -> None:
    """kubelet admits the batch in name order; its status manager writes a moment later (status_lag)."""
    node.kubelet.run_with_kube(node.kube, NODE, order=lambda b: sorted(b, key=lambda p: p["metadata"]["name"]))


def _run_batch_first_fails(node: SimNode, first: str, reason: str) -> None:
    """Run the batch: `first` ends Failed for `reason`; b-first and c-second, 4 GiB each, run with their GPU."""
    _run_batch(node)
    node.kubelet.wait_for(
        lambda: (
            _phase(node, first) == "Failed"
            and _phase(node, "b-first") == "Running"
            and _phase(node, "c-second") == "Running"
        ),
        20,
        f"{first} Failed, both later pods running",
    )
    assert node.kube.pods[("default", first)]["status"]["reason"] == reason
    assert_served(node, "b-first", {"m": 4})
    assert_served(node, "c-second", {"m": 4})


@LIST_SEMANTICS
def test_pod_refused_at_admission_then_pods_of_the_same_size(list_all_pods: bool):
    """Another scheduler's pod is refused by our Allocate (kubelet rejects it: UnexpectedAdmissionError);
    the next two pods of its size, admitted right after, are served while the API still shows it Pending.
    Before 1.34 kubelet lists the rejected pod, holding nothing, exactly like a pod being admitted."""
    node = start_node(predicate=None, list_all_pods=list_all_pods, status_lag=0.5)
    try:
        stranger = make_pod("a-stranger", [("m", 4)])
        stranger["spec"]["schedulerName"] = "default-scheduler"
        node.kube.add_pod(stranger)
        node.add(make_pod("b-first", [("m", 4)]), [1], 4, 11)
        node.add(make_pod("c-second", [("m", 4)]), [2], 4, 12)
        _run_batch_first_fails(node, "a-stranger", "UnexpectedAdmissionError")
    finally:
        stop_node(node)


@LIST_SEMANTICS
def test_pod_rejected_after_allocate_then_pods_of_the_same_size_while_its_status_lags(list_all_pods: bool):
    """Served, then rejected (OutOfcpu): its devices are freed at once, its Failed status arrives later.
    A container this plugin served that holds nothing is not admitting: the later pods are served."""
    node = start_node(predicate=cpu_rejects("a-rejected"), list_all_pods=list_all_pods, status_lag=0.5)
    try:
        node.add(make_pod("a-rejected", [("m", 4)]), [0], 4, 10)
        node.add(make_pod("b-first", [("m", 4)]), [0], 4, 11)
        node.add(make_pod("c-second", [("m", 4)]), [1], 4, 12)
        _run_batch_first_fails(node, "a-rejected", "OutOfcpu")
    finally:
        stop_node(node)


def test_pod_admitted_without_allocate_after_restart_with_the_checkpoint_dropped(sim_node):
    """kubelet restarted, lost its checkpoint and admitted the pod before the plugin registered again (the
    resource unknown: no Allocate); when the container starts, kubelet Allocates from the pod worker."""
    pod = sim_node.add(make_pod("late", [("m", 4)]), [2], 4, 10)
    sim_node.kubelet.restart(timeout=10, drop_checkpoint=True, pods_first=True, new_pods=[pod])
    assert sim_node.kubelet.allocate_calls == []
    assert sim_node.kubelet.pod_record("uid-late").admitted
    sim_node.kubelet.start_containers(pod)
    assert [c.container for c in sim_node.kubelet.allocate_calls] == ["m"]
    assert_served(sim_node, "late", {"m": 4})
