"""Pods that waited too long get room: the leader's reservations and consolidation over a FakeKube, and
the pure rules behind them (share_scheduler.starvation_rules)."""

from __future__ import annotations

import time
from datetime import UTC
from datetime import datetime

import pytest

from share_core.contract import ANN_HOLDS
from share_core.contract import ANN_MOVABLE
from share_core.contract import ANN_ROOM_READY
from share_core.contract import EVENT_CONSOLIDATING
from share_core.contract import EVENT_CONSOLIDATION_EVICTED
from share_core.contract import EVENT_CONSOLIDATION_REFUSED
from share_core.contract import EVENT_RESERVED
from share_core.holds import HoldKind
from share_core.holds import parse_holds
from share_core.kube import Unavailable
from share_placement import Demand
from share_scheduler.starvation import EvictionRate
from share_scheduler.starvation import StarvationConfig
from share_scheduler.starvation import movable
from share_scheduler.static_filters import node_refuses
from share_scheduler.waiting import CLASS_MULTI
from share_scheduler.waiting import CLASS_SHARE
from share_scheduler.waiting import CLASS_WHOLE
from share_scheduler.waiting import wait_class
from share_scheduler.waiting import waiting_pod
from tests.unit.scheduler.conftest import assigned_pod
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until

# -- builders -------------------------------------------------------------------------------------


def aged(pod, seconds, priority=None):
    """`pod` created `seconds` ago (and of `priority`)."""
    stamp = datetime.fromtimestamp(time.time() - seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod["metadata"]["creationTimestamp"] = stamp
    if priority is not None:
        pod["spec"]["priority"] = priority
    return pod


def owned(pod, kind="ReplicaSet", uid="rs-1"):
    pod["metadata"]["ownerReferences"] = [{"kind": kind, "name": "owner", "uid": uid, "controller": True}]
    return pod


CONFIG = StarvationConfig(wait_threshold=60, period=3600, hold_seconds=120, max_share=0.5, min_gpus=1)


def loop_of(ext):
    return ext.parts["starvation"]


def events(kube, reason):
    return [e for e in kube.events if e["reason"] == reason]


def flushed(ext):
    assert ext.parts["events"].flush(timeout=60), "Events not posted within a minute"
    return ext


def holds_on(kube, name):
    text = kube.pods[("default", name)]["metadata"].get("annotations", {}).get(ANN_HOLDS)
    return parse_holds(text) if text else []


# -- what the loop reads (the decisions are share_placement.starvation's: tests/unit/placement) -----


def test_waiting_pod_reads_age_priority_and_demand():
    pod = aged(make_pod("big", 16, count=2), 90, priority=7)
    w = waiting_pod(pod)
    assert w is not None
    assert (w.key, w.priority, w.demand.per_gpu, w.demand.count) == ("default/big", 7, 8, 2)
    assert 89 <= w.waited(time.time()) <= 92
    gated = aged(make_pod("gated", 4), 90)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    assert waiting_pod(gated) is None  # it waits for its gates, not for room
    assert waiting_pod(aged(make_pod("bound", 4, node="n"), 90)) is None
    assert waiting_pod(aged(make_pod("cpu", None), 90)) is None
    assert waiting_pod(aged(make_pod("bad", "-1"), 90)) is None


def test_wait_classes():
    assert wait_class(Demand(4), 16) == CLASS_SHARE
    assert wait_class(Demand(16), 16) == CLASS_WHOLE
    assert wait_class(Demand(8, count=2), 16) == CLASS_MULTI


TIER_GPU = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}]}


@pytest.mark.parametrize(
    ("pod_spec", "node_spec", "labels", "refused"),
    [
        ({}, {}, {}, ""),
        ({"nodeSelector": {"zone": "a"}}, {}, {"zone": "b"}, "nodeSelector"),
        ({"nodeSelector": {"zone": "a"}}, {}, {"zone": "a"}, ""),
        ({}, {"unschedulable": True}, {}, "cordoned"),
        ({}, {"taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]}, {}, "taint"),
        (
            {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
            {"taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]},
            {},
            "",
        ),
        ({}, {"taints": [{"key": "gpu", "effect": "PreferNoSchedule"}]}, {}, ""),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": TIER_GPU}}},
            {},
            {"tier": "cpu"},
            "affinity",
        ),
    ],
)
def test_node_refuses_as_kube_scheduler_static_filters(pod_spec, node_spec, labels, refused):
    pod = {"spec": pod_spec}
    node = {"metadata": {"name": "n", "labels": labels}, "spec": node_spec}
    why = node_refuses(pod, node)
    assert (refused in why) if refused else why == ""


def test_movable_needs_a_recreating_controller():
    assert movable(owned(make_pod("rs", 4, node="n")))
    assert movable(owned(make_pod("job", 4, node="n"), kind="Job"))
    assert not movable(make_pod("bare", 4, node="n"))  # never a bare pod
    assert not movable(make_pod("bare-marked", 4, node="n", annotations={ANN_MOVABLE: "true"}))
    assert movable(owned(make_pod("custom", 4, node="n", annotations={ANN_MOVABLE: "true"}), kind="Notebook"))
    assert not movable(owned(make_pod("custom", 4, node="n"), kind="Notebook"))
    assert not movable(owned(make_pod("opted-out", 4, node="n", annotations={ANN_MOVABLE: "false"})))


def test_eviction_rate_is_a_token_bucket():
    now = [0.0]
    rate = EvictionRate(6, clock=lambda: now[0])
    assert rate.available() == 6
    rate.take(6)
    assert rate.available() == 0
    now[0] += 10  # one token every 10 s
    assert rate.available() == 1


def test_config_refuses_out_of_range_knobs():
    with pytest.raises(ValueError, match="max share"):
        StarvationConfig(max_share=1.5).check()
    with pytest.raises(ValueError, match="ttl_s > 0"):
        StarvationConfig(hold_seconds=0).check()  # share_placement.starvation.ReservationLimits says so
    with pytest.raises(ValueError, match="min GPUs"):
        StarvationConfig(min_gpus=0).check()


# -- the loop over a FakeKube ---------------------------------------------------------------------


def cluster(kube, big=None):
    """node-a: GPU 0 with 10 GiB taken, GPU 1 with 12; node-b: both GPUs with 14 taken. 16 GiB GPUs."""
    kube.add_node(make_node("node-a", [16, 16]))
    kube.add_node(make_node("node-b", [16, 16]))
    kube.add_pod(assigned_pod("a0", "node-a", 0, 10))
    kube.add_pod(assigned_pod("a1", "node-a", 1, 12))
    kube.add_pod(assigned_pod("b0", "node-b", 0, 14))
    kube.add_pod(assigned_pod("b1", "node-b", 1, 14))
    if big is not None:
        kube.add_pod(big)


def ready(ext, *keys):
    ext.wait_ready()
    wait_until(lambda: all(ext.cache.waiting.get(k) for k in keys), what="the waiting pods in the cache")
    return ext


def test_reservation_holds_the_soonest_gpu_against_small_pods_until_the_big_pod_is_bound(kube, extender_factory):
    cluster(kube, aged(make_pod("big", 16), 120))
    ext = ready(extender_factory(starvation=CONFIG), "default/big")
    report = loop_of(ext).run_once()
    assert report.reserved == ["default/big"]
    [hold] = holds_on(kube, "big")
    assert (hold.kind, hold.node, hold.gpus, hold.per_gpu) == (HoldKind.RESERVATION, "node-a", (0,), 16)
    assert 100 <= hold.expires - time.time() <= 121
    assert "GPU 0 of node node-a" in events(flushed(ext).kube, EVENT_RESERVED)[0]["message"]
    # A small pod of the same priority may not take GPU 0's free 6 GiB; GPU 1's 4 stay its to take.
    out = ext.call("filter", filter_args(make_pod("small6", 6), ["node-a"]))
    assert out["NodeNames"] == []
    assert ext.call("filter", filter_args(make_pod("small4", 4), ["node-a"]))["NodeNames"] == ["node-a"]
    # A second pass holds nothing more for it.
    assert loop_of(ext).run_once().reserved == []
    # GPU 0 drains: the big pod fits, binds there, and its hold is gone.
    kube.set_pod_phase("default", "a0", "Succeeded")
    wait_until(lambda: ext.cache.usage()["node-a"][0] == 0, what="a0 gone")
    big = kube.pods[("default", "big")]
    assert ext.call("filter", filter_args(big, ["node-a", "node-b"]))["NodeNames"] == ["node-a"]
    assert ext.call("bind", bind_args(big, "node-a"))["Error"] == ""
    wait_until(lambda: not ext.cache.holds.active, what="the hold released at bind")
    metrics = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_pod_wait_seconds_count{class="whole-gpu"} 1.0' in metrics  # its wait, from creation to bind
    assert ext.call("filter", filter_args(make_pod("after", 4), ["node-b"]))["NodeNames"] == []


def test_a_holder_whose_room_is_ready_but_not_retried_is_nudged_once_a_pass_later(kube, extender_factory):
    """kube-scheduler retries a pod the extender turned down only on a cluster event (or after five
    minutes): when the event that freed the held room reached it before the extender's cache, nothing
    else comes. The leader writes gpushare.io/room-ready on such a pod (an update kube-scheduler requeues
    it on), a pass after it first saw the room fit, at most once a minute, and never while it does not fit."""
    cluster(kube, aged(make_pod("big", 16), 120))
    config = StarvationConfig(wait_threshold=60, period=10, hold_seconds=600, max_share=0.5, min_gpus=1)
    ext = ready(extender_factory(starvation=config), "default/big")
    loop = loop_of(ext)
    t0 = time.time()

    def pass_at(offset):
        loop._clock = lambda: t0 + offset
        return loop.run_once()

    def nudged():
        return kube.pods[("default", "big")]["metadata"]["annotations"].get(ANN_ROOM_READY)

    assert pass_at(0).reserved == ["default/big"]
    assert pass_at(30).nudged == [] and nudged() is None  # GPU 0 not drained: nothing to say
    kube.set_pod_phase("default", "a0", "Succeeded")
    wait_until(lambda: ext.cache.usage()["node-a"][0] == 0, what="a0 gone")
    assert pass_at(40).nudged == []  # first seen ready: kube-scheduler's own retry may be on its way
    assert pass_at(50).nudged == ["default/big"]
    assert nudged() == datetime.fromtimestamp(t0 + 50, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert pass_at(60).nudged == [] and pass_at(100).nudged == []  # once a minute at most
    assert pass_at(111).nudged == ["default/big"]
    assert "gpushare_room_ready_nudges_total 2.0" in ext.client.get("/metrics").get_data(as_text=True)
    # Taken again (a pod of the same priority cannot, but the cache may see anything): no longer ready.
    kube.add_pod(assigned_pod("late", "node-a", 0, 8))
    wait_until(lambda: ext.cache.usage()["node-a"][0] == 8, what="GPU 0 taken")
    assert pass_at(200).nudged == [] and pass_at(300).nudged == []


def test_a_reservation_about_to_expire_while_its_pod_waits_is_renewed_in_place(kube, extender_factory):
    cluster(kube, aged(make_pod("big", 16), 120))
    config = StarvationConfig(wait_threshold=60, period=40, hold_seconds=100, max_share=0.5, min_gpus=1)
    ext = ready(extender_factory(starvation=config), "default/big")
    loop = loop_of(ext)
    assert loop.renew_within == 50  # two periods, but at most half a hold's life
    assert loop.run_once().reserved == ["default/big"]
    [first] = holds_on(kube, "big")
    assert first.shortfall == (1, 10)  # node-a then: GPU 0 short, 10 GiB to drain on it
    assert loop.run_once().reserved == []  # 100 s left: not due
    # 60 s on, 40 left: due within the next two passes, but node-a has not drained: not renewed.
    later = time.time() + 60
    loop._clock = lambda: later
    assert loop.run_once().reserved == []
    assert holds_on(kube, "big") == [first]
    # GPU 0 drains (a0's 10 GiB end; a pod of 4 that holds nothing against it took part of the room before
    # the hold): planned again, GPU 0 (still the soonest) is held anew for the pod, replacing the old hold
    # in the book and on the pod, with the node's shortfall now.
    kube.set_pod_phase("default", "a0", "Succeeded")
    kube.add_pod(assigned_pod("a0s", "node-a", 0, 4))
    wait_until(lambda: ext.cache.usage()["node-a"][0] == 4, what="GPU 0 drained to 4 GiB")
    assert loop.run_once().reserved == ["default/big"]
    [renewed] = holds_on(kube, "big")
    assert (renewed.node, renewed.gpus, renewed.per_gpu) == (first.node, first.gpus, first.per_gpu)
    assert renewed.shortfall == (1, 4)
    assert renewed.expires == pytest.approx(later + 100, abs=1) and renewed.expires > first.expires + 50
    [booked] = [h for _, h in ext.cache.holds.holds()]  # the old one gone from the book too
    assert (booked.node, booked.gpus) == (renewed.node, renewed.gpus)
    assert booked.expires == pytest.approx(renewed.expires, abs=1)  # the annotation keeps whole seconds
    assert loop.run_once().reserved == []  # renewed: not due again for a while
    flushed(ext)
    assert events(kube, EVENT_RESERVED)[-1]["message"].startswith("renewed (the same node): waited ")
    text = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_reservations_total{outcome="renewed"} 1.0' in text
    assert 'gpushare_reservations_total{outcome="made"} 1.0' in text
    assert ext_filter(ext, make_pod("small6", 6)) == []  # still held against small pods


def test_only_the_leader_reserves(kube, extender_factory):
    cluster(kube, aged(make_pod("big", 16), 120))
    ext = ready(extender_factory(starvation=CONFIG), "default/big")
    ext.parts["extender"].leadership._leader = False
    ext.parts["extender"].leadership._valid_until = 0.0
    report = loop_of(ext).run_once()
    assert report.skipped == "not the leader" and not report.reserved
    assert holds_on(kube, "big") == []
    assert "gpushare_extender_leading 0.0" in ext.client.get("/metrics").get_data(as_text=True)


def test_a_lone_replica_leads_and_says_so_in_its_metrics(kube, extender_factory):
    cluster(kube)
    ext = extender_factory(starvation=CONFIG)
    assert "gpushare_extender_leading 1.0" in ext.client.get("/metrics").get_data(as_text=True)


def test_young_pods_and_other_schedulers_get_nothing(kube, extender_factory):
    theirs = aged(make_pod("theirs", 16), 120)
    theirs["spec"]["schedulerName"] = "default-scheduler"
    cluster(kube, aged(make_pod("young", 16), 5))
    kube.add_pod(theirs)
    ext = ready(extender_factory(starvation=CONFIG), "default/young", "default/theirs")
    assert loop_of(ext).run_once().reserved == []


def test_reservations_are_bounded_in_count_and_share(kube, extender_factory):
    cluster(kube)
    for i, (age, prio) in enumerate(((300, 0), (200, 0), (100, 50))):
        kube.add_pod(aged(make_pod(f"big{i}", 16), age, priority=prio))
    config = StarvationConfig(wait_threshold=60, period=3600, max_reservations=2, max_share=1.0, min_gpus=1)
    ext = ready(extender_factory(starvation=config), "default/big0", "default/big1", "default/big2")
    assert loop_of(ext).run_once().reserved == ["default/big2", "default/big0"]  # priority, then age
    assert loop_of(ext).run_once().reserved == []  # two at a time (and one a node)
    # big1 met the limit in both passes
    assert 'gpushare_reservations_total{outcome="at_limit"} 2.0' in ext.client.get("/metrics").get_data(as_text=True)
    # The share: 64 GiB in the cluster; 25% is 16, which one reservation takes.
    kube.delete_pod("default", "big2")
    kube.delete_pod("default", "big0")
    wait_until(lambda: not ext.cache.holds.active, what="holds of deleted pods gone")


def test_reservations_stop_at_the_share_of_cluster_memory(kube, extender_factory):
    cluster(kube)
    kube.add_pod(aged(make_pod("big0", 16), 300))
    kube.add_pod(aged(make_pod("big1", 16), 200))
    config = StarvationConfig(wait_threshold=60, period=3600, max_reservations=4, max_share=0.25, min_gpus=1)
    ext = ready(extender_factory(starvation=config), "default/big0", "default/big1")
    assert loop_of(ext).run_once().reserved == ["default/big0"]  # 16 of 64 GiB: the share is spent
    text = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_reservations_total{outcome="over_budget"} 1.0' in text
    assert 'gpushare_held_memory{kind="reservation"} 16.0' in text
    assert 'gpushare_waiting_pods{class="whole-gpu"} 2.0' in text


def test_a_restarted_extender_keeps_the_reservation(kube, extender_factory):
    cluster(kube, aged(make_pod("big", 16), 120))
    first = ready(extender_factory(starvation=CONFIG), "default/big")
    assert first.parts["starvation"].run_once().reserved == ["default/big"]
    first.stop()
    second = ready(extender_factory(starvation=CONFIG), "default/big")
    wait_until(lambda: second.cache.holds.active, what="the hold rebuilt from the annotation")
    assert ext_filter(second, make_pod("small6", 6)) == []
    assert second.parts["starvation"].run_once().reserved == []  # it holds already: nothing new
    view = second.client.get("/gpushare-scheduler/inspect").get_json()
    [held] = view["holds"]
    assert (held["holder"], held["kind"], held["node"], held["gpus"]) == ("default/big", "reservation", "node-a", [0])


def ext_filter(ext, pod, nodes=("node-a",)):
    return ext.call("filter", filter_args(pod, list(nodes)))["NodeNames"]


def test_a_pod_that_can_go_nowhere_gets_no_reservation(kube, extender_factory):
    big = aged(make_pod("big", 16), 120)
    big["spec"]["nodeSelector"] = {"zone": "elsewhere"}
    cluster(kube, big)
    ext = ready(extender_factory(starvation=CONFIG), "default/big")
    assert loop_of(ext).run_once().reserved == []


# -- consolidation --------------------------------------------------------------------------------

CONSOLIDATE = StarvationConfig(
    wait_threshold=60, period=3600, hold_seconds=120, max_share=0.5, min_gpus=1, consolidate=True, max_moves=1
)


def split_cluster(kube, movers=True):
    """node-a: 8 GiB taken on each 16 GiB GPU (by pods a ReplicaSet owns, or bare ones); node-b: 10 of 16."""
    kube.add_node(make_node("node-a", [16, 16]))
    kube.add_node(make_node("node-b", [16]))
    for gpu in (0, 1):
        pod = assigned_pod(f"m{gpu}", "node-a", gpu, 8)
        kube.add_pod(owned(pod, uid=f"rs-{gpu}") if movers else pod)
    kube.add_pod(assigned_pod("b0", "node-b", 0, 10))
    kube.add_pod(aged(make_pod("big", 16), 120))


def test_consolidation_moves_one_movable_pod_and_holds_both_places(kube, extender_factory):
    split_cluster(kube)
    ext = ready(extender_factory(starvation=CONSOLIDATE), "default/big")
    report = loop_of(ext).run_once()
    assert report.consolidated == ["default/big"] and len(report.evicted) == 1
    moved = report.evicted[0].split("/")[1]
    assert kube.evictions == [("default", moved)]
    holds = {h.holder: h for h in holds_on(kube, "big")}
    mine, theirs = holds["default/big"], holds[f"default/{moved}"]
    assert mine.kind == theirs.kind == HoldKind.CONSOLIDATION
    assert mine.node == "node-a" and mine.gpus == (int(moved[1]),)
    assert theirs.owner_uid == f"rs-{moved[1]}" and theirs.node == "node-a" and theirs.gpus != mine.gpus
    flushed(ext)
    assert events(kube, EVENT_CONSOLIDATING) and events(kube, EVENT_CONSOLIDATION_EVICTED)
    wait_until(lambda: ext.cache.usage()["node-a"][mine.gpus[0]] == 0, what="the moved pod gone")
    # The replacement (same controller) may take its held GPU; a stranger of the same priority may not.
    replacement = owned(make_pod(f"{moved}-new", 8), uid=f"rs-{moved[1]}")
    assert ext_filter(ext, replacement) == ["node-a"]
    assert ext_filter(ext, make_pod("stranger", 8)) == []
    assert ext_filter(ext, kube.pods[("default", "big")]) == ["node-a"]
    text = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_consolidation_evictions_total{outcome="evicted"} 1.0' in text


def test_consolidation_never_moves_bare_pods(kube, extender_factory):
    split_cluster(kube, movers=False)
    ext = ready(extender_factory(starvation=CONSOLIDATE), "default/big")
    report = loop_of(ext).run_once()
    assert report.consolidated == [] and kube.evictions == []
    assert report.reserved == ["default/big"]  # it gets a reservation instead
    assert "bare pods never move" in events(flushed(ext).kube, EVENT_CONSOLIDATION_REFUSED)[0]["message"]


def test_consolidation_honours_a_disruption_budget(kube, extender_factory):
    split_cluster(kube)
    ext = ready(extender_factory(starvation=CONSOLIDATE), "default/big")
    kube.fail("evict_pod", Unavailable("Cannot evict pod as it would violate the pod's disruption budget", 429))
    report = loop_of(ext).run_once()
    assert kube.evictions == [] and len(report.refused) == 1
    assert [h for h in holds_on(kube, "big") if h.holder == "default/big"] == []  # its hold dropped
    refused = events(flushed(ext).kube, EVENT_CONSOLIDATION_REFUSED)
    assert any("disruption budget" in e["message"] for e in refused)
    # The refused pod is left alone: the next pass moves the other one, not the same one again.
    report = loop_of(ext).run_once()
    assert report.evicted and report.evicted != report.refused
