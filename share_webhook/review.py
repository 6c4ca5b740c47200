"""AdmissionReview (admission.k8s.io/v1) in and out: pure functions over the API server's JSON.

The decisions are share_core.admission's; this module only reads the request and writes the response
(a JSONPatch, base64, for a mutation; `allowed: false` with a 403 status for a refusal; warnings, which
kubectl prints as "Warning: ..."). A body that is not an AdmissionReview is a BadReview: the server
answers 400 and the API server applies the webhook's failurePolicy.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from share_core.admission import ClusterGpus
from share_core.admission import choose_scheduler
from share_core.admission import review
from share_core.contract import SCHEDULER_NAME

API_VERSION = "admission.k8s.io/v1"
MAX_WARNINGS = 8  # the API server keeps warnings short; a pod has at most a couple
MAX_WARNING_LEN = 400


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer; the message says why."""


@dataclass(frozen=True, slots=True)
class Request:
    uid: str
    kind: str
    namespace: str
    operation: str
    pod: Mapping[str, Any]


def parse_review(raw: bytes) -> Request:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"request body is not JSON: {exc}") from exc
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise BadReview("request body is not an AdmissionReview")
    if body.get("apiVersion") != API_VERSION:
        raise BadReview(f"AdmissionReview apiVersion {body.get('apiVersion')!r} is not {API_VERSION}")
    req = body.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str):
        raise BadReview("AdmissionReview.request with a uid is missing")
    obj = req.get("object")
    if not isinstance(obj, dict):
        raise BadReview("AdmissionReview.request.object is missing or not an object")
    kind = (req.get("kind") or {}).get("kind", "") if isinstance(req.get("kind"), dict) else ""
    namespace = req.get("namespace") or (obj.get("metadata") or {}).get("namespace") or "default"
    return Request(req["uid"], str(kind), str(namespace), str(req.get("operation", "")), obj)


def _response(uid: str, allowed: bool = True, **extra: Any) -> dict[str, Any]:
    warnings = [w[:MAX_WARNING_LEN] for w in extra.pop("warnings", ())][:MAX_WARNINGS]
    resp: dict[str, Any] = {"uid": uid, "allowed": allowed, **extra}
    if warnings:
        resp["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}


def mutate(
    req: Request, opted_in: bool, scheduler_name: str = SCHEDULER_NAME, claims_ours: bool = False
) -> dict[str, Any]:
    """Set the scheduler where admission.choose_scheduler says so; never refuses nor warns (validation does)."""
    if req.kind != "Pod":
        return _response(req.uid)
    chosen = choose_scheduler(req.pod, opted_in, scheduler_name, claims_ours)
    if chosen is None:
        return _response(req.uid)
    spec = req.pod.get("spec") or {}
    op = "replace" if isinstance(spec, dict) and "schedulerName" in spec else "add"
    patch = [{"op": op, "path": "/spec/schedulerName", "value": chosen}]
    return _response(req.uid, patchType="JSONPatch", patch=base64.b64encode(orjson.dumps(patch)).decode())


def validate(
    req: Request, cluster: ClusterGpus | None, unit: str = "GiB", scheduler_name: str = SCHEDULER_NAME
) -> dict[str, Any]:
    """Refuse what can never be scheduled (403, the extender's message); warn about what cannot be today, and
    about a pod stored with another scheduler."""
    if req.kind != "Pod":
        return _response(req.uid)
    verdict = review(req.pod, cluster, unit, scheduler_name)
    if verdict.refusal is not None:
        status = {"code": 403, "reason": "Forbidden", "message": f"gpushare: {verdict.refusal}"}
        return _response(req.uid, allowed=False, status=status)
    return _response(req.uid, warnings=verdict.warnings)
