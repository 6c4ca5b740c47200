"""Admission decisions (share_core.admission) and the AdmissionReview answers (share_webhook.review)."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pytest

from share_core.admission import ClusterGpus
from share_core.admission import asks_gpu_mem
from share_core.admission import choose_scheduler
from share_core.admission import invalid_request_message
from share_core.admission import review
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.gpus import GpuInfo
from share_core.request import InvalidRequest
from share_core.request import pod_request
from share_webhook import review as rv


def pod(mem: Any = 4, scheduler: str | None = None, init: Any = None, sidecar: bool = False, **ann: str) -> dict:
    containers = [{"name": "app", "resources": {"limits": {RESOURCE_MEM: mem}} if mem is not None else {}}]
    spec: dict[str, Any] = {"containers": containers}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init is not None:
        c = {"name": "init", "resources": {"limits": {RESOURCE_MEM: init}}}
        if sidecar:
            c["restartPolicy"] = "Always"
        spec["initContainers"] = [c]
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": dict(ann)}, "spec": spec}


CLUSTER = ClusterGpus.of(
    [
        [GpuInfo(0, "GPU-a", "NVIDIA A100-SXM4-80GB", 80), GpuInfo(1, "GPU-b", "NVIDIA A100-SXM4-80GB", 80)],
        [GpuInfo(0, "GPU-c", "Tesla T4", 16), GpuInfo(1, "GPU-d", "Tesla T4", 16, healthy=False)],
    ]
)


def test_asks_gpu_mem_sees_every_kind_of_container() -> None:
    assert asks_gpu_mem(pod(4))
    assert asks_gpu_mem(pod(None, init=2))
    assert asks_gpu_mem(pod(None, init=2, sidecar=True))
    assert not asks_gpu_mem(pod(None))
    assert asks_gpu_mem(pod("garbage")), "malformed is still ours, to be refused with its reason"
    req_only = {"spec": {"containers": [{"name": "a", "resources": {"requests": {RESOURCE_MEM: "1"}}}]}}
    assert asks_gpu_mem(req_only)
    assert not asks_gpu_mem({"spec": "nonsense"})


@pytest.mark.parametrize("named", [None, "", "default-scheduler"])
def test_our_pods_without_a_scheduler_get_ours(named: str | None) -> None:
    assert choose_scheduler(pod(4, scheduler=named), opted_in=False) == SCHEDULER_NAME


def test_other_schedulers_are_left_alone_and_warned_at_validation() -> None:
    assert choose_scheduler(pod(4, scheduler="volcano"), opted_in=False) is None
    assert choose_scheduler(pod(4, scheduler=SCHEDULER_NAME), opted_in=False) is None
    warned = review(pod(4, scheduler="volcano"), CLUSTER, scheduler_name=SCHEDULER_NAME)
    assert warned.refusal is None and len(warned.warnings) == 1
    assert "will refuse" in warned.warnings[0] and "'volcano'" in warned.warnings[0]
    # a mutation that failed open leaves the default scheduler: said too, of the pod as stored
    unmutated = review(pod(4, scheduler="default-scheduler"), CLUSTER, scheduler_name=SCHEDULER_NAME)
    assert "'default-scheduler' is not 'gpushare-scheduler'" in unmutated.warnings[0]
    assert review(pod(4, scheduler=SCHEDULER_NAME), CLUSTER, scheduler_name=SCHEDULER_NAME).warnings == ()
    assert review(pod(None, scheduler="volcano"), CLUSTER, scheduler_name=SCHEDULER_NAME).warnings == ()
    # and with the capacity warnings, both
    both = review(pod(120, scheduler="volcano"), CLUSTER, scheduler_name=SCHEDULER_NAME).warnings
    assert len(both) == 2 and "volcano" in both[0] and "80 GiB" in both[1]
    assert review(pod(4, scheduler="volcano"), CLUSTER).warnings == ()  # no scheduler_name: not asked


def test_cpu_only_pods_only_in_opted_in_namespaces() -> None:
    assert choose_scheduler(pod(None), opted_in=False) is None
    assert choose_scheduler(pod(None), opted_in=True) == SCHEDULER_NAME
    assert choose_scheduler(pod(None, scheduler="volcano"), opted_in=True) == choose_scheduler(pod(None), False)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (pod("1.5"), "is fractional"),
        (pod(-1), "is negative"),
        (pod("lots"), "is not a valid quantity"),
        (pod(6, **{ANN_GPU_COUNT: "4"}), "must divide evenly"),
        (pod(4, **{ANN_GPU_COUNT: "zero"}), "is not a whole number"),
    ],
)
def test_never_schedulable_is_refused_with_the_extenders_message(bad: dict, reason: str) -> None:
    verdict = review(bad, CLUSTER)
    assert verdict.refusal is not None and reason in verdict.refusal
    with pytest.raises(InvalidRequest) as exc:
        pod_request(bad)
    assert verdict.refusal == invalid_request_message(bad, exc.value) and verdict.refusal.startswith("pod ns/p: ")


def test_requests_differing_from_limits_is_refused() -> None:
    p = pod(4)
    p["spec"]["containers"][0]["resources"]["requests"] = {RESOURCE_MEM: "2"}
    assert "differs from limits" in (review(p, CLUSTER).refusal or "")


def test_what_may_fit_later_is_a_warning() -> None:
    too_big = review(pod(120), CLUSTER)
    assert too_big.refusal is None and "largest healthy GPU in the cluster today has 80 GiB" in too_big.warnings[0]
    model = review(pod(4, **{ANN_GPU_MODEL: "H100"}), CLUSTER)
    assert model.refusal is None and "model h100" in model.warnings[0]
    two_t4 = review(pod(8, **{ANN_GPU_COUNT: "2", ANN_GPU_MODEL: "T4"}), CLUSTER)
    assert "no node has 2 healthy GPU(s) of model t4" in two_t4.warnings[0], "the second T4 is unhealthy"
    assert review(pod(160, **{ANN_GPU_COUNT: "2"}), CLUSTER).warnings == ()
    assert review(pod(120), None).warnings == (), "no cluster view yet: no warnings rather than wrong ones"
    assert review(pod(None), CLUSTER).request is None


def test_alike_nodes_are_reviewed_once() -> None:
    """5,000 nodes of one shape are one to review: a pod that fits nowhere costs no more than one that fits."""
    a100 = [[GpuInfo(g, f"GPU-{n}-{g}", "NVIDIA A100-SXM4-80GB", 80) for g in range(8)] for n in range(5000)]
    mixed = ClusterGpus.of([*a100, [GpuInfo(0, "GPU-t", "Tesla T4", 16)], [GpuInfo(0, "GPU-u", "Tesla T4", 16)]])
    assert len(mixed.nodes) == 2
    assert "model h100" in review(pod(4, **{ANN_GPU_MODEL: "H100"}), mixed).warnings[0]
    assert review(pod(16, **{ANN_GPU_MODEL: "T4"}), mixed).warnings == ()
    sick = ClusterGpus.of([[GpuInfo(0, "GPU-x", "Tesla T4", 16, healthy=False)], [GpuInfo(0, "GPU-y", "Tesla T4", 16)]])
    assert len(sick.nodes) == 2, "a node's shape is its healthy GPUs"


def admission_review(obj: dict, kind: str = "Pod") -> bytes:
    return orjson.dumps(
        {
            "apiVersion": rv.API_VERSION,
            "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"kind": kind}, "namespace": "ns", "operation": "CREATE", "object": obj},
        }
    )


def test_mutation_is_a_json_patch() -> None:
    answer = rv.mutate(rv.parse_review(admission_review(pod(4, scheduler="default-scheduler"))), opted_in=False)
    resp = answer["response"]
    assert (answer["kind"], resp["uid"], resp["allowed"], resp["patchType"]) == (
        "AdmissionReview",
        "u-1",
        True,
        "JSONPatch",
    )
    patch = json.loads(base64.b64decode(resp["patch"]))
    assert patch == [{"op": "replace", "path": "/spec/schedulerName", "value": SCHEDULER_NAME}]
    added = rv.mutate(rv.parse_review(admission_review(pod(4))), opted_in=False)["response"]
    assert json.loads(base64.b64decode(added["patch"]))[0]["op"] == "add"
    other = rv.mutate(rv.parse_review(admission_review(pod(4, scheduler="volcano"))), opted_in=False)["response"]
    assert other == {"uid": "u-1", "allowed": True}  # left alone; validation warns
    warned = rv.validate(rv.parse_review(admission_review(pod(4, scheduler="volcano"))), CLUSTER)["response"]
    assert warned["allowed"] and "'volcano' is not 'gpushare-scheduler'" in warned["warnings"][0]


def test_validation_refuses_with_403_and_warns() -> None:
    refused = rv.validate(rv.parse_review(admission_review(pod("1.5"))), CLUSTER)["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert refused["status"]["message"].startswith("gpushare: pod ns/p: ")
    warned = rv.validate(rv.parse_review(admission_review(pod(120, scheduler=SCHEDULER_NAME))), CLUSTER)["response"]
    assert warned["allowed"] is True and "80 GiB" in warned["warnings"][0]
    assert rv.validate(rv.parse_review(admission_review({"spec": {}}, kind="Deployment")), CLUSTER)["response"] == {
        "uid": "u-1",
        "allowed": True,
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "not JSON"),
        (b"[]", "not an AdmissionReview"),
        (orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}), "is not admission"),
        (orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}), "uid is missing"),
        (
            orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x"}}),
            "object is missing",
        ),
    ],
)
def test_bad_reviews_name_the_problem(raw: bytes, message: str) -> None:
    with pytest.raises(rv.BadReview, match=message):
        rv.parse_review(raw)
