"""PodDisruptionBudgets as preemption weighs them (share_scheduler.preempt): which budgets count a pod and
how many disruptions each allows, kept current by the syncer's `pdbs` watch (a few objects per namespace).

Matching mirrors kube-scheduler's filterPodsWithPDBViolation (pkg/scheduler/framework/preemption): a
budget counts a pod of its namespace that its selector matches (metav1.LabelSelectorAsSelector: a missing
selector matches nothing, an empty one everything, an invalid one nothing) and that its
`status.disruptedPods` does not list yet.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector(selector).Matches(labels), as kube-scheduler's PDB check uses it: a
    missing selector matches nothing, an empty one everything; an invalid one matches nothing (upstream
    skips a PDB whose selector does not parse)."""
    if selector is None or not isinstance(selector, Mapping):
        return False
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return False
    for k, v in match_labels.items():
        if labels.get(k) != v:
            return False
    for e in expressions:
        if not isinstance(e, Mapping):
            return False
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if not isinstance(key, str) or not isinstance(values, list):
            return False
        if op == "In":
            if not values or labels.get(key) not in values:
                return False
        elif op == "NotIn":
            if not values or (key in labels and labels[key] in values):
                return False
        elif op == "Exists":
            if values or key not in labels:
                return False
        elif op == "DoesNotExist":
            if values or key in labels:
                return False
        else:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Budget:
    """What preemption reads of a PodDisruptionBudget."""

    key: str  # namespace/name
    namespace: str
    selector: Any
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str]  # status.disruptedPods: pod names the API server already counted


def budget_of(obj: Mapping[str, Any]) -> Budget:
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed")
    disrupted = status.get("disruptedPods") or {}
    return Budget(
        f"{ns}/{name}",
        ns,
        (obj.get("spec") or {}).get("selector"),
        allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
    )


class BudgetIndex:
    """The cluster's PodDisruptionBudgets by namespace (fed by the syncer's `pdbs` watch; few objects)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_ns: dict[str, dict[str, Budget]] = {}
        self.synced = False

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        fresh: dict[str, dict[str, Budget]] = {}
        for obj in objs:
            b = budget_of(obj)
            fresh.setdefault(b.namespace, {})[b.key] = b
        with self._lock:
            self._by_ns = fresh
            self.synced = True

    def upsert(self, obj: Mapping[str, Any]) -> None:
        b = budget_of(obj)
        with self._lock:
            self._by_ns.setdefault(b.namespace, {})[b.key] = b

    def delete(self, obj: Mapping[str, Any]) -> None:
        b = budget_of(obj)
        with self._lock:
            self._by_ns.get(b.namespace, {}).pop(b.key, None)

    def selecting(self, namespace: str, name: str, labels: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, int]]:
        """The keys of the budgets that count a pod (as filterPodsWithPDBViolation: its namespace, a
        matching selector, not already in disruptedPods) and their allowed disruptions."""
        with self._lock:
            budgets = list(self._by_ns.get(namespace, {}).values())
        keys, allowed = [], {}
        for b in budgets:
            if name in b.disrupted or not selector_matches(b.selector, labels):
                continue
            keys.append(b.key)
            allowed[b.key] = b.allowed
        return tuple(keys), allowed
