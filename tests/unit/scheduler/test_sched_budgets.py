"""PodDisruptionBudgets as preemption reads them: selectors as metav1.LabelSelectorAsSelector matches them
(a missing selector selects nothing, an empty one everything, an invalid one nothing), the namespace, and
pods the API server already counted as disrupted."""

from __future__ import annotations

from share_scheduler.budgets import BudgetIndex
from share_scheduler.budgets import budget_of
from share_scheduler.budgets import selector_matches

APP = {"app": "web", "tier": "gpu"}


def test_selector_semantics() -> None:
    assert not selector_matches(None, APP)  # nil selector: labels.Nothing()
    assert selector_matches({}, APP) and selector_matches({}, {})  # empty: labels.Everything()
    assert selector_matches({"matchLabels": {"app": "web"}}, APP)
    assert not selector_matches({"matchLabels": {"app": "db"}}, APP)
    assert selector_matches({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "x"]}]}, APP)
    assert not selector_matches({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, APP)
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, APP)
    assert selector_matches({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, APP)
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, APP)
    # invalid selectors select nothing (upstream skips a PDB whose selector does not parse)
    assert not selector_matches({"matchExpressions": [{"key": "app", "operator": "In", "values": []}]}, APP)
    assert not selector_matches({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}, APP)
    assert not selector_matches({"matchExpressions": [{"key": "app", "operator": "Near", "values": ["x"]}]}, APP)
    assert not selector_matches({"matchLabels": ["app"]}, APP)


def pdb(name: str, ns: str, selector: object, allowed: object = 1, disrupted: object = None) -> dict:
    status: dict = {"disruptionsAllowed": allowed}
    if disrupted is not None:
        status["disruptedPods"] = disrupted
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"selector": selector}, "status": status}


def test_index_by_namespace_disrupted_pods_and_garbage_status() -> None:
    index = BudgetIndex()
    index.replace(
        [
            pdb("all", "a", {}),
            pdb("none", "a", None),
            pdb("web", "a", {"matchLabels": {"app": "web"}}, allowed=0, disrupted={"p1": "2026-01-01T00:00:00Z"}),
            pdb("other-ns", "b", {}),
        ]
    )
    keys, allowed = index.selecting("a", "p0", APP)
    assert sorted(keys) == ["a/all", "a/web"] and allowed == {"a/all": 1, "a/web": 0}
    keys, _ = index.selecting("a", "p1", APP)  # already counted by the API server: not again
    assert keys == ("a/all",)
    index.delete(pdb("all", "a", {}))
    assert index.selecting("a", "p0", APP)[0] == ("a/web",)
    index.upsert(pdb("all", "a", {}, allowed="lots"))
    assert index.selecting("a", "p0", APP)[1]["a/all"] == 0  # an unreadable status allows nothing
    assert budget_of({"metadata": {}, "spec": {}, "status": {"disruptedPods": []}}).disrupted == frozenset()
