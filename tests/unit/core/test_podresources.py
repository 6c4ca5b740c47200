"""share_core.podresources against upstream's PodRequests rules (k8s.io/component-helpers resource
helpers.go, as kube-scheduler's PodInfo.CalculateResource calls it in v1.37)."""

from __future__ import annotations

from typing import Any

from share_core.podresources import Allocatable
from share_core.podresources import HostRequest
from share_core.podresources import node_allocatable
from share_core.podresources import pod_host_request

GI = 2**30


def c(name: str, cpu: str | None = None, mem: str | None = None, **extra: Any) -> dict[str, Any]:
    req = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    return {"name": name, "resources": {"requests": req}, **extra}


def pod(containers=(), init=(), **spec: Any) -> dict[str, Any]:
    status = spec.pop("status", None)
    out: dict[str, Any] = {"spec": {"containers": list(containers), "initContainers": list(init), **spec}}
    if status is not None:
        out["status"] = status
    return out


def test_containers_sum_and_quantities_round_up() -> None:
    p = pod([c("a", "500m", "1Gi"), c("b", "1.5", "512Mi"), c("c", "0.0001")])
    assert pod_host_request(p) == HostRequest(500 + 1500 + 1, GI + GI // 2)  # 0.1m -> 1m (MilliValue rounds up)


def test_init_containers_are_a_floor_and_sidecars_add() -> None:
    # KEP 753: InitContainerUse(i) = sum(sidecars before i) + init i; the pod needs
    # max(app containers + all sidecars, max_i InitContainerUse(i)).
    p = pod(
        [c("app", "1", "1Gi")],
        [
            c("sc1", "200m", "100Mi", restartPolicy="Always"),
            c("big", "3", "4Gi"),
            c("sc2", "300m", restartPolicy="Always"),
        ],
    )
    r = pod_host_request(p)
    assert r.cpu == max(1000 + 200 + 300, 200 + 3000)
    assert r.memory == max(GI + 100 * 2**20, 100 * 2**20 + 4 * GI)


def test_overhead_is_added_and_pod_level_requests_replace_the_sum() -> None:
    p = pod([c("a", "1", "1Gi")], overhead={"cpu": "250m", "memory": "64Mi"})
    assert pod_host_request(p) == HostRequest(1250, GI + 64 * 2**20)
    p = pod([c("a", "1", "1Gi")], resources={"requests": {"cpu": "4"}}, overhead={"cpu": "250m"})
    assert pod_host_request(p) == HostRequest(4250, GI)  # memory not set at pod level: the containers'


def test_in_place_resize_counts_the_larger_of_spec_allocated_and_actuated() -> None:
    spec = [c("a", "2", "1Gi")]
    grown = {
        "containerStatuses": [
            {"name": "a", "allocatedResources": {"cpu": "1"}, "resources": {"requests": {"cpu": "3"}}}
        ]
    }
    assert pod_host_request(pod(spec, status=grown)).cpu == 3000  # actuated 3 > spec 2
    shrinking = {"containerStatuses": [{"name": "a", "allocatedResources": {"cpu": "4", "memory": "2Gi"}}]}
    assert pod_host_request(pod(spec, status=shrinking)) == HostRequest(4000, 2 * GI)  # allocated still 4
    infeasible = {
        "conditions": [{"type": "PodResizePending", "reason": "Infeasible"}],
        "containerStatuses": [{"name": "a", "allocatedResources": {"cpu": "1", "memory": "1Gi"}}],
    }
    assert pod_host_request(pod([c("a", "8", "1Gi")], status=infeasible)).cpu == 1000  # the spec's 8 never counts
    pod_level = {"allocatedResources": {"cpu": "5"}, "resources": {"requests": {"cpu": "6"}}}
    assert pod_host_request(pod(spec, status=pod_level)).cpu == 6000


def test_garbage_counts_zero_and_is_named() -> None:
    r = pod_host_request(pod([c("a", "lots", "1Gi"), c("b", "-1"), {"name": "x", "resources": "no"}]))
    assert (r.cpu, r.memory) == (0, GI)
    assert "'lots'" in r.problem and "negative" in r.problem
    assert pod_host_request({"spec": "nonsense"}) == HostRequest(0, 0)
    assert pod_host_request({"spec": {"containers": [c("a", "1")], "overhead": ["x"]}}).problem


def test_node_allocatable_missing_is_zero() -> None:
    assert node_allocatable({"status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}) == (
        Allocatable(64000, 256 * GI, 110)
    )
    assert node_allocatable({"metadata": {"name": "bare"}}) == Allocatable(0, 0, 0)
    bad = node_allocatable({"status": {"allocatable": {"cpu": "x", "pods": "10"}}})
    assert (bad.cpu, bad.pods) == (0, 10) and "allocatable[cpu]" in bad.problem
