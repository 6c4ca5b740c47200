"""The preempt verb and the leader's own preemption over a fake API server: victims that free ONE GPU,
one answered node, the hold that keeps the freed GPU for the preemptor, PDBs, and what is refused."""

from __future__ import annotations

import time
from typing import Any

from share_core.contract import ANN_HOLDS
from share_core.holds import HoldKind
from share_core.holds import pod_holds
from share_scheduler.syncer import PDB_PATH
from tests.unit.scheduler.conftest import assigned_pod
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until

LOW, MID, HIGH = 10, 100, 1000


def prio(pod: dict[str, Any], priority: int, **spec: Any) -> dict[str, Any]:
    pod["spec"]["priority"] = priority
    pod["spec"].update(spec)
    return pod


def running(name: str, node: str, gpu: int, mem: int, priority: int = LOW, **labels: str) -> dict[str, Any]:
    pod = prio(assigned_pod(name, node, gpu, mem), priority)
    pod["metadata"]["labels"] = dict(labels)
    pod["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    return pod


def preempt_args(pod: dict[str, Any], proposal: dict[str, list[str]]) -> dict[str, Any]:
    """What kube-scheduler POSTs with nodeCacheCapable (callExtenders -> HTTPExtender.ProcessPreemption)."""
    return {
        "Pod": pod,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for node, uids in proposal.items()
        },
    }


def answer(out: dict[str, Any]) -> dict[str, list[str]]:
    return {node: [p["UID"] for p in v["Pods"]] for node, v in out["NodeNameToMetaVictims"].items()}


def cluster(kube, extender_factory, *pods: dict[str, Any], gpus=(16, 16), nodes=("node-a",), **options):
    for n in nodes:
        kube.add_node(make_node(n, list(gpus)))
    for p in pods:
        kube.add_pod(p)
    ext = extender_factory(**options).wait_ready()
    ext.parts["extender"].preemption.defer = 0.05
    return ext


def test_verb_answers_the_victim_that_frees_one_gpu(kube, extender_factory):
    # GPU 0: 10 of 16 taken (6 free), GPU 1: 12 (4 free); an 8 GiB pod fits neither. kube-scheduler,
    # counting the node's total, may well propose the bigger pod b; one pod on one GPU is enough.
    ext = cluster(kube, extender_factory, running("a", "node-a", 0, 10), running("b", "node-a", 1, 12))
    ext.parts["extender"].preemption.ready_grace = 1000.0
    ext.parts["extender"].preemption.stop()  # this test runs the worker's rounds itself
    big = prio(make_pod("big", 8), HIGH)
    kube.add_pod(big)
    out = ext.call("preempt", preempt_args(big, {"node-a": ["uid-default-b"]}))
    assert answer(out) == {"node-a": ["uid-default-a"]}  # the same rank, less memory freed
    assert out["NodeNameToMetaVictims"]["node-a"]["NumPDBViolations"] == 0
    holds = ext.cache.holds.of("default/big")
    assert [(h.kind, h.node, h.gpus, h.per_gpu) for h in holds] == [(HoldKind.PREEMPTION, "node-a", (0,), 8)]
    wait_until(lambda: ANN_HOLDS in kube.pods[("default", "big")]["metadata"]["annotations"], what="annotation")
    assert pod_holds(kube.pods[("default", "big")])[0].gpus == (0,)
    # the worker judges a hold only for a pod its watch has brought (a loaded machine delays the watch)
    wait_until(lambda: ext.cache.record("default/big") is not None, what="the pod watch brings big")
    ext.parts["extender"].preemption.tick()  # the worker sees the freed GPU still waiting for its victim
    assert ("uid-default-big", "node-a", (0,)) in ext.parts["extender"].preemption._waiting
    # kube-scheduler evicts a; until a is gone its memory still counts, and a low pod cannot take GPU 0 after
    kube.update_pod("default", "a", lambda p: p["metadata"].__setitem__("deletionTimestamp", "2026-01-01T00:00:00Z"))
    kube.delete_pod("default", "a")
    low = prio(make_pod("low", 10), LOW)
    wait_until(lambda: ext.cache.usage()["node-a"][0] == 0, what="a gone")
    out = ext.call("filter", filter_args(low, ["node-a"]))
    assert out["NodeNames"] == [] and "0:8" in out["FailedNodes"]["node-a"]  # 16 free less the 8 held
    assert ext.call("filter", filter_args(big, ["node-a"]))["NodeNames"] == ["node-a"]
    # its victim gone, the hold runs a fresh minute from now, written to the pod (kube-scheduler retries it)
    preemption = ext.parts["extender"].preemption

    def renewed() -> bool:
        preemption.tick()
        return any(h.expires > time.time() + 500 for h in pod_holds(kube.pods[("default", "big")]))

    wait_until(renewed, timeout=60, what="renewed hold")


def test_verb_fills_kube_scheduler_138_placeholders_and_refuses_a_second_decision(kube, extender_factory):
    ext = cluster(kube, extender_factory, running("a", "node-a", 0, 10), running("b", "node-a", 1, 12))
    big = prio(make_pod("big", 8), HIGH)
    kube.add_pod(big)
    out = ext.call("preempt", preempt_args(big, {"node-a": []}))  # 1.38: the node's total already fits
    assert answer(out) == {"node-a": ["uid-default-a"]}
    again = ext.call("preempt", preempt_args(big, {"node-a": ["uid-default-b"]}))
    assert again == {"NodeNameToMetaVictims": {}}  # its victims are still going: once per decision


def test_verb_never_answers_an_empty_list_and_leaves_out_nodes_where_nothing_works(kube, extender_factory):
    ext = cluster(
        kube,
        extender_factory,
        running("a", "node-a", 0, 10),
        running("vip0", "node-a", 1, 12, priority=HIGH + 1),
        running("vip", "node-b", 0, 16, priority=HIGH + 1),
        running("vip2", "node-b", 1, 16, priority=HIGH + 1),
        nodes=("node-a", "node-b"),
    )
    fits = prio(make_pod("fits", 6), HIGH)  # fits node-a's GPU 0 as it is: no victim needed there
    kube.add_pod(fits)
    assert ext.call("preempt", preempt_args(fits, {"node-a": ["uid-default-a"], "node-b": []})) == {
        "NodeNameToMetaVictims": {}
    }
    big = prio(make_pod("big", 16), HIGH)
    kube.add_pod(big)
    assert answer(ext.call("preempt", preempt_args(big, {"node-b": ["uid-default-vip"], "node-a": []}))) == {
        "node-a": ["uid-default-a"]
    }


def test_verb_refuses_never_policy_unknown_and_bad_input(kube, extender_factory):
    ext = cluster(kube, extender_factory, running("a", "node-a", 0, 16), running("b", "node-a", 1, 16))
    polite = prio(make_pod("polite", 8), HIGH, preemptionPolicy="Never")
    assert ext.call("preempt", preempt_args(polite, {"node-a": ["uid-default-a"]})) == {"NodeNameToMetaVictims": {}}
    big = prio(make_pod("big", 8), HIGH)
    out = ext.call("preempt", preempt_args(big, {"node-a": ["uid-unknown"], "node-zz": ["uid-x"]}))
    assert list(answer(out)) == ["node-a"]  # an unknown UID and an unknown node: answered from our own view
    status, body = ext.post("preempt", {"Pod": "nope"})
    assert status == 400 and "Pod" in body["Error"]
    status, body = ext.post("preempt", {"Pod": big, "NodeNameToMetaVictims": {"node-a": {"Pods": [{}]}}})
    assert status == 400 and "UID" in body["Error"]
    lowly = prio(make_pod("lowly", 8), LOW)  # no priority above anyone's: nothing to evict
    assert ext.call("preempt", preempt_args(lowly, {"node-a": ["uid-default-a"]})) == {"NodeNameToMetaVictims": {}}


def test_pdb_is_a_preference_and_counted(kube, extender_factory):
    kube.put_object(
        PDB_PATH,
        {
            "metadata": {"name": "keep-a", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "a"}}},
            "status": {"disruptionsAllowed": 0},
        },
    )
    ext = cluster(
        kube,
        extender_factory,
        running("a", "node-a", 0, 16, app="a"),
        running("b1", "node-a", 1, 8, priority=MID),
        running("b2", "node-a", 1, 8, priority=MID),
    )
    wait_until(lambda: ext.parts["extender"].preemption.budgets.synced, what="PDBs listed")
    big = prio(make_pod("big", 16), HIGH)
    out = ext.call("preempt", preempt_args(big, {"node-a": ["uid-default-a"]}))
    assert sorted(answer(out)["node-a"]) == ["uid-default-b1", "uid-default-b2"]  # no violation beats priority
    assert out["NodeNameToMetaVictims"]["node-a"]["NumPDBViolations"] == 0


def test_leader_preempts_where_kube_scheduler_has_no_candidate(kube, extender_factory):
    """1.33-1.37 with the node's total fitting: the verb is never called; filter's note is acted on."""
    ext = cluster(kube, extender_factory, running("a", "node-a", 0, 10), running("b", "node-a", 1, 12))
    big = prio(make_pod("big", 8), HIGH)
    kube.add_pod(big)
    out = ext.call("filter", filter_args(big, ["node-a"]))
    assert out["NodeNames"] == [] and "node-a" in out["FailedNodes"]

    def evicted() -> bool:
        a = kube.pods[("default", "a")]
        return bool(a["metadata"].get("deletionTimestamp"))

    wait_until(evicted, what="the victim deleted")
    conditions = kube.pods[("default", "a")]["status"]["conditions"]
    assert {"type": "DisruptionTarget", "reason": "PreemptionByScheduler"}.items() <= conditions[-1].items()
    assert not kube.pods[("default", "b")]["metadata"].get("deletionTimestamp")  # only the cheapest
    assert [h.gpus for h in ext.cache.holds.of("default/big")] == [(0,)]
    # retries while a terminates: no second decision, no storm
    for _ in range(3):
        ext.call("filter", filter_args(big, ["node-a"]))
    ext.parts["extender"].preemption.tick()
    assert ext.parts["extender"].metrics.preemptions.labels("extender")._value.get() == 1
    kube.delete_pod("default", "a")
    wait_until(lambda: ext.call("filter", filter_args(big, ["node-a"]))["NodeNames"] == ["node-a"], what="room")


def test_no_leader_no_eviction_and_never_policy_waits(kube, extender_factory):
    ext = cluster(
        kube,
        extender_factory,
        running("a", "node-a", 0, 10),
        running("b", "node-a", 1, 12),
        leader_lease="kube-system/not-ours",
    )
    big = prio(make_pod("big", 8), HIGH)
    ext.call("filter", filter_args(big, ["node-a"]))
    ext.parts["extender"].preemption.tick()
    assert ext.parts["extender"].preemption.pending() == {"noted": {}, "decisions": {}}
    assert not kube.pods[("default", "a")]["metadata"].get("deletionTimestamp")


def test_never_policy_is_not_noted(kube, extender_factory):
    ext = cluster(kube, extender_factory, running("a", "node-a", 0, 10), running("b", "node-a", 1, 12))
    polite = prio(make_pod("polite", 8), HIGH, preemptionPolicy="Never")
    ext.call("filter", filter_args(polite, ["node-a"]))
    assert ext.parts["extender"].preemption.pending()["noted"] == {}


def test_preemptor_deleted_mid_way_releases_its_hold(kube, extender_factory):
    ext = cluster(kube, extender_factory, running("a", "node-a", 0, 10), running("b", "node-a", 1, 12))
    big = prio(make_pod("big", 8), HIGH)
    kube.add_pod(big)
    ext.call("preempt", preempt_args(big, {"node-a": ["uid-default-a"]}))
    wait_until(lambda: ANN_HOLDS in kube.pods[("default", "big")]["metadata"]["annotations"], what="annotation")
    kube.delete_pod("default", "big")
    wait_until(lambda: not ext.cache.holds.of("default/big"), what="hold gone with its pod")
    wait_until(lambda: ext.parts["extender"].preemption.pending()["decisions"] == {}, what="decision closed")


def test_a_restarted_extender_rebuilds_the_hold(kube, extender_factory):
    ext = cluster(kube, extender_factory, running("a", "node-a", 0, 10), running("b", "node-a", 1, 12))
    big = prio(make_pod("big", 8), HIGH)
    kube.add_pod(big)
    ext.call("preempt", preempt_args(big, {"node-a": ["uid-default-a"]}))
    wait_until(lambda: ANN_HOLDS in kube.pods[("default", "big")]["metadata"]["annotations"], what="annotation")
    ext.stop()
    again = extender_factory().wait_ready()
    wait_until(lambda: again.cache.holds.active, what="hold rebuilt")
    assert [h.gpus for h in again.cache.holds.of("default/big")] == [(0,)]
