"""A DRA pod whose claims ask gpushare.io gets the gpushare scheduler (DRA placement by the policy); one
with other drivers' claims, or whose claims cannot be read, is left as it is."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from share_core.admission import choose_scheduler
from share_core.admission import other_scheduler
from share_core.fake import FakeKube
from share_core.kube import KubeError
from share_webhook import review
from share_webhook.claims import ClaimClasses
from tests.controlplane.draworkload import memory_claim

CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
TEMPLATES = "/apis/resource.k8s.io/v1/resourceclaimtemplates"


def pod(**entry: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c"}], "resourceClaims": [{"name": "gpu", **entry}]},
    }


def kube() -> FakeKube:
    k = FakeKube()
    k.put_object(CLAIMS, memory_claim("ml", "ours", 4))
    other = memory_claim("ml", "theirs", 4)
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "example.com"
    k.put_object(CLAIMS, other)
    template = {"metadata": {"name": "t", "namespace": "ml"}, "spec": {"spec": memory_claim("ml", "x", 2)["spec"]}}
    k.put_object(TEMPLATES, template)
    return k


def test_claims_and_templates_of_our_class_are_ours() -> None:
    classes = ClaimClasses(kube().get_path)
    assert classes.ours(pod(resourceClaimName="ours"))
    assert classes.ours(pod(resourceClaimTemplateName="t"))
    assert not classes.ours(pod(resourceClaimName="theirs"))
    assert not classes.ours(pod(resourceClaimName="not-made-yet"))


def test_an_unreadable_claim_leaves_the_pod_alone() -> None:
    k = kube()
    k.fail("get_path", KubeError("API server down", 503))
    assert not ClaimClasses(k.get_path).ours(pod(resourceClaimName="ours"))


def test_the_mutation_sets_the_scheduler_only_where_it_is_unset() -> None:
    assert choose_scheduler(pod(resourceClaimName="ours"), False, claims_ours=True) == "gpushare-scheduler"
    named = pod(resourceClaimName="ours")
    named["spec"]["schedulerName"] = "volcano"
    decision = choose_scheduler(named, False, claims_ours=True)
    assert decision is None  # a DRA pod runs under any scheduler
    assert other_scheduler(named) is None  # and is not warned: it asks no gpu-mem
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"kind": "Pod"}, "object": pod(resourceClaimName="ours")}}  # fmt: skip
    answer = review.mutate(review.parse_review(orjson.dumps(body)), False, claims_ours=True)["response"]
    patch = orjson.loads(base64.b64decode(answer["patch"]))
    assert patch == [{"op": "add", "path": "/spec/schedulerName", "value": "gpushare-scheduler"}]
