"""Whether a node could ever take a pod, whatever runs there: kube-scheduler's static filters, for the few
nodes the reservations loop weighs (share_scheduler.starvation). The extender is told only the nodes that
passed them for pods kube-scheduler could place; a pod that waits for room may not even reach it, so the
loop reads the pod and the node from the API and asks here. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  # corev1.TaintNodeUnschedulable


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """corev1 Toleration.ToleratesTaint: same effect (or none), same key (or none with Exists), and
    Exists, or Equal (the default) with the same value."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        operator = t.get("operator") or "Equal"
        if t.get("key"):
            if t.get("key") != taint.get("key"):
                continue
        elif operator != "Exists":
            continue
        if operator == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement, as nodeaffinity's NodeSelector reads it."""
    key, op = str(expr.get("key") or ""), expr.get("operator")
    values = [str(v) for v in expr.get("values") or ()]
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_holds(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False  # nodeaffinity: an empty term matches no node
    if not all(_expression_holds(e, labels) for e in exprs):
        return False
    return all(_expression_holds(f, {"metadata.name": name}) for f in fields)


def node_refuses(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """Why kube-scheduler's static filters would refuse `pod` on `node` whatever runs there ("" if not):
    NodeUnschedulable, NodeAffinity (nodeSelector and required affinity) and TaintToleration, as
    pkg/scheduler/framework/plugins/{nodeunschedulable,nodeaffinity,tainttoleration} judge them."""
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    node_spec = node.get("spec") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    name = str(meta.get("name") or "")
    tolerations = list(spec.get("tolerations") or ())
    cordon = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    if node_spec.get("unschedulable") and not _tolerates(tolerations, cordon):
        return "node is unschedulable (cordoned)"
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"node lacks the label {key}={value} of the pod's nodeSelector"
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if terms is not None and not any(_term_holds(t, labels, name) for t in terms):
        return "node does not match the pod's required node affinity"
    for taint in node_spec.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
            what = f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}"
            return f"node has the taint {what}, which the pod does not tolerate"
    return ""
