"""The preempt verb's wire form (k8s.io/kube-scheduler/extender/v1 ExtenderPreemptionArgs and
ExtenderPreemptionResult; JSON keys are the Go field names): kube-scheduler's proposal in, our victims out,
by UID (nodeCacheCapable). share_scheduler.preempt answers with it."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from share_placement.preemption import Candidate
from share_scheduler.extender import BadRequest
from share_scheduler.extender import _field


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    proposal: dict[str, tuple[str, ...]]  # node -> victim UIDs kube-scheduler proposed ([] on 1.38 placeholders)


def parse_preemption_args(raw: bytes) -> PreemptionArgs:
    """An ExtenderPreemptionArgs body (k8s.io/kube-scheduler/extender/v1): `Pod` and
    `NodeNameToMetaVictims` (nodeCacheCapable) or `NodeNameToVictims` (whole pods); BadRequest otherwise."""
    if not raw:
        raise BadRequest("request body is empty")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from exc
    if not isinstance(body, Mapping):
        raise BadRequest("request body must be a JSON object (ExtenderPreemptionArgs)")
    pod = _field(body, "Pod")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("metadata") or {}, Mapping):
        raise BadRequest("ExtenderPreemptionArgs.Pod is missing or not a pod object")
    meta = _field(body, "NodeNameToMetaVictims")
    whole = _field(body, "NodeNameToVictims")
    source, by_uid = (meta, True) if meta is not None else (whole, False)
    if source is None:
        source = {}
    if not isinstance(source, Mapping):
        raise BadRequest("NodeNameToMetaVictims must map node names to victims")
    proposal: dict[str, tuple[str, ...]] = {}
    for node, victims in source.items():
        if victims is None:
            proposal[str(node)] = ()
            continue
        if not isinstance(victims, Mapping):
            raise BadRequest(f"victims of node {node!r} must be an object with Pods")
        pods = _field(victims, "Pods") or []
        if not isinstance(pods, list):
            raise BadRequest(f"victims of node {node!r}: Pods must be a list")
        uids = []
        for p in pods:
            if not isinstance(p, Mapping):
                raise BadRequest(f"victims of node {node!r}: each pod must be an object")
            uid = _field(p, "UID") if by_uid else (p.get("metadata") or {}).get("uid")
            if not isinstance(uid, str) or not uid:
                raise BadRequest(f"victims of node {node!r}: a pod without a UID")
            uids.append(uid)
        proposal[str(node)] = tuple(uids)
    return PreemptionArgs(pod, proposal)


def preemption_result(candidates: Sequence[Candidate]) -> dict[str, Any]:
    """The ExtenderPreemptionResult: victims by UID, most important first (kube-scheduler reads Pods[0])."""
    return {
        "NodeNameToMetaVictims": {
            c.node: {"Pods": [{"UID": v.uid} for v in c.victims], "NumPDBViolations": c.pdb_violations}
            for c in candidates
        }
    }
