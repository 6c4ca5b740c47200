"""Holds in the extender: memory held for a pod not bound yet is taken for every pod it applies to, in
filter, prioritize and bind alike, and the book is rebuilt from the API server after a restart."""

from __future__ import annotations

import time

from share_core.contract import ANN_HOLDS
from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import encode_holds
from share_scheduler.cache import ClusterCache
from share_scheduler.starvation import StarvationConfig
from tests.unit.scheduler.conftest import assigned_pod
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until


def with_priority(pod, priority):
    pod["spec"]["priority"] = priority
    return pod


def holder(name="big", mem=10, priority=1000, kind=HoldKind.PREEMPTION, gpus=(0,), node="node-a", ttl=300.0):
    """A pending pod carrying a hold of `mem` on `gpus` of `node`, as the leader writes it."""
    pod = with_priority(make_pod(name, mem), priority)
    h = Hold(kind, node, tuple(gpus), mem, priority, time.time() + ttl, pod["metadata"]["uid"], f"default/{name}")
    pod["metadata"]["annotations"][ANN_HOLDS] = encode_holds([h])
    return pod


def owned(pod, uid="rs", started=False):
    """`pod` owned by the ReplicaSet `uid` (and started by kubelet, `started`)."""
    pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": True}]
    if started:
        pod["status"] = {"phase": "Running", "startTime": "2026-11-29T00:00:00Z"}
    return pod


def passes(ext, pod, nodes=("node-a",)):
    return ext.call("filter", filter_args(pod, list(nodes)))["NodeNames"]


def setup(kube, extender_factory, hold_pod, gpus=(16, 16), busy=((1, 10),), **options):
    """node-a with GPUs of `gpus` GiB, `busy` (GPU, GiB) taken by running pods, and `hold_pod` pending."""
    kube.add_node(make_node("node-a", list(gpus)))
    for i, (gpu, mem) in enumerate(busy):
        kube.add_pod(assigned_pod(f"run{i}", "node-a", gpu, mem))
    kube.add_pod(hold_pod)
    ext = extender_factory(**options).wait_ready()
    wait_until(lambda: ext.cache.holds.active, what="the hold in the book")
    return ext


def test_preemption_hold_keeps_lower_priority_pods_off_the_freed_gpu(kube, extender_factory):
    ext = setup(kube, extender_factory, holder(kind=HoldKind.PREEMPTION, priority=1000))
    low = with_priority(make_pod("low", 8), 10)
    out = ext.call("filter", filter_args(low, ["node-a"]))
    assert out["NodeNames"] == []
    assert "0:6" in out["FailedNodes"]["node-a"]  # GPU 0's 16 GiB less the 10 held: what low sees as free
    assert passes(ext, kube.pods[("default", "big")]) == ["node-a"]  # the holder sees its own hold as its own


def test_preemption_hold_keeps_equal_priority_off_and_lets_higher_pass(kube, extender_factory):
    """As kube-scheduler counts a nominated pod against pods of <= priority (addGENominatedPods): two
    preemptors of one priority must not take each other's freed GPU."""
    ext = setup(kube, extender_factory, holder(kind=HoldKind.PREEMPTION, priority=1000))
    assert passes(ext, with_priority(make_pod("peer", 8), 1000)) == []
    assert passes(ext, with_priority(make_pod("vip", 8), 1001)) == ["node-a"]


def test_reservation_hold_keeps_peers_off_too(kube, extender_factory):
    ext = setup(kube, extender_factory, holder(kind=HoldKind.RESERVATION, priority=100))
    assert passes(ext, with_priority(make_pod("peer", 8), 100)) == []
    assert passes(ext, with_priority(make_pod("vip", 8), 101)) == ["node-a"]


def test_prioritize_and_bind_see_the_hold_too(kube, extender_factory):
    """Both GPUs fit the small pod; the held one must not be chosen, whichever the policy prefers."""
    ext = setup(kube, extender_factory, holder(mem=14, gpus=(1,)), busy=((1, 2),), filter_keeps="fitting")
    small = with_priority(make_pod("small", 4), 0)
    kube.add_pod(small)
    scores = ext.call("prioritize", filter_args(small, ["node-a"]))
    assert scores == [{"Host": "node-a", "Score": 10}]
    assert ext.call("bind", bind_args(small, "node-a"))["Error"] == ""
    annotations = kube.pods[("default", "small")]["metadata"]["annotations"]
    assert annotations["gpushare.io/gpu-index"] == "0"  # binpack would take GPU 1 (fuller) but for the hold


def test_lone_node_hold_of_filter_respects_the_book(kube, extender_factory):
    """filter's own short hold for a lone node's bind chooses a GPU the same way bind does."""
    ext = setup(kube, extender_factory, holder(mem=14, gpus=(1,)), busy=((1, 2),))
    small = kube.add_pod(with_priority(make_pod("small", 4), 0))
    assert passes(ext, small) == ["node-a"]
    assert ext.call("bind", bind_args(small, "node-a"))["Error"] == ""
    assert kube.pods[("default", "small")]["metadata"]["annotations"]["gpushare.io/gpu-index"] == "0"


def test_a_restarted_extender_rebuilds_the_hold_from_the_annotation(kube, extender_factory):
    first = setup(kube, extender_factory, holder())
    first.stop()
    second = extender_factory().wait_ready()
    wait_until(lambda: second.cache.holds.active, what="the hold rebuilt from the API server")
    assert passes(second, with_priority(make_pod("low", 8), 0)) == []


def test_the_hold_ends_when_its_holder_is_bound(kube, extender_factory):
    ext = setup(kube, extender_factory, holder(mem=10))
    big = kube.pods[("default", "big")]
    assert ext.call("bind", bind_args(big, "node-a"))["Error"] == ""
    wait_until(lambda: not ext.cache.holds.active, what="the holder's hold to end at its bind")
    annotations = kube.pods[("default", "big")]["metadata"]["annotations"]
    assert annotations["gpushare.io/gpu-index"] == "0"


def test_the_hold_ends_when_its_holder_is_deleted(kube, extender_factory):
    ext = setup(kube, extender_factory, holder())
    kube.delete_pod("default", "big")
    wait_until(lambda: not ext.cache.holds.active, what="the hold to end with its pod")
    assert passes(ext, with_priority(make_pod("low", 8), 0)) == ["node-a"]


def test_an_expired_hold_takes_nothing(kube, extender_factory):
    ext = setup(kube, extender_factory, holder(ttl=1.0))
    low = with_priority(make_pod("low", 8), 0)
    assert passes(ext, low) == []
    wait_until(lambda: passes(ext, low) == ["node-a"], timeout=10, what="the hold's expiry")
    assert not ext.cache.holds.active


def test_a_garbled_holds_annotation_holds_nothing_and_says_why(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    bad = make_pod("big", 10)
    bad["metadata"]["annotations"][ANN_HOLDS] = '[{"kind": "steal"}]'
    kube.add_pod(bad)
    ext = extender_factory().wait_ready()
    wait_until(lambda: "default/big" in ext.cache.holds.problems(), what="the problem recorded")
    assert "'kind' must be one of" in ext.cache.holds.problems()["default/big"]
    assert passes(ext, make_pod("low", 8)) == ["node-a"]


def waited(pod, seconds, found_no_room=True):
    """`pod` created `seconds` ago and, with `found_no_room`, marked by kube-scheduler as unschedulable."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds))
    pod["metadata"]["creationTimestamp"] = stamp
    if found_no_room:
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": stamp}
        ]
    return pod


def yielding(after=30.0, min_gpus=2):
    return StarvationConfig(yield_after=after, min_gpus=min_gpus)


def test_a_reservation_yields_to_a_small_pod_that_found_no_room_and_waited(kube, extender_factory):
    """share-sim's `--hold-yield-after`, live: GPU 0 is reserved (10 of 16 GiB), GPU 1 has 6 free. An
    8 GiB share fits only the held GPU; it takes it once kube-scheduler found no room for it and it has
    waited longer than the bound, and not before (a pod's first try always sees the holds)."""
    ext = setup(kube, extender_factory, holder(kind=HoldKind.RESERVATION, priority=100), starvation=yielding(30))
    share = lambda name: with_priority(make_pod(name, 8), 100)  # noqa: E731
    assert passes(ext, share("fresh")) == []  # its first try: the hold redirects it (nowhere else here)
    assert passes(ext, waited(share("young"), 10)) == []  # unschedulable, but 10 s is not past 30
    assert passes(ext, waited(share("untried"), 60, found_no_room=False)) == []  # never found without room
    small = kube.add_pod(waited(share("small"), 60))
    assert passes(ext, small) == ["node-a"]
    assert ext.call("bind", bind_args(small, "node-a"))["Error"] == ""
    assert kube.pods[("default", "small")]["metadata"]["annotations"]["gpushare.io/gpu-index"] == "0"
    text = ext.client.get("/metrics").get_data(as_text=True)
    assert "gpushare_reservation_yields_total 1.0" in text  # one pod, however often it was asked about


def test_only_reservations_yield_and_only_to_small_pods_and_only_when_configured(kube, extender_factory):
    # A preemption's freed GPU stays its preemptor's: the rule is about reservations alone.
    ext = setup(kube, extender_factory, holder(kind=HoldKind.PREEMPTION, priority=100), starvation=yielding(0))
    assert passes(ext, waited(with_priority(make_pod("share", 8), 100), 600)) == []
    ext.stop()
    kube.delete_pod("default", "big")
    # Not configured (the default): a reservation never yields.
    kube.add_pod(holder("big2", kind=HoldKind.RESERVATION, priority=100))
    plain = extender_factory().wait_ready()
    wait_until(lambda: plain.cache.holds.active, what="the reservation in the book")
    assert passes(plain, waited(with_priority(make_pod("share", 8), 100), 600)) == []
    plain.stop()


def test_a_reservation_never_yields_to_the_pods_it_serves(kube, extender_factory):
    """A pod of min_gpus GPUs or more keeps seeing every reservation, however long it waited: the holds
    order the big pods among themselves."""
    ext = setup(
        kube, extender_factory, holder(kind=HoldKind.RESERVATION, priority=100), busy=(), starvation=yielding(0)
    )
    pair = waited(with_priority(make_pod("pair", 16, count=2), 100), 3600)  # 8 GiB on each
    assert passes(ext, pair) == []  # GPU 0 shows 6 free: the pair needs 8 on each of two
    solo = waited(with_priority(make_pod("solo", 8, count=1), 100), 3600)
    assert passes(ext, solo) == ["node-a"]


def test_only_a_newly_bound_pod_of_the_controller_uses_the_hold_kept_for_a_moved_pod():
    """A consolidation holds GPU 1 for the replacement of the pod it moves off GPU 0 (same node). The moved
    pod's own later events (bound, of that controller, its eviction under way) and a running sibling's
    must leave that hold alone; the replacement's Binding uses it up (issue 40's live flake: the moved
    pod's events spent it, and it came back with the anchor's next echo)."""
    cache = ClusterCache()
    cache.upsert_node(make_node("node-a", [16, 16]))
    mover = owned(assigned_pod("mover", "node-a", 0, 4), started=True)
    cache.upsert_pod(mover)
    now = time.time()
    big = make_pod("big", 8)
    big_uid, mover_uid = big["metadata"]["uid"], mover["metadata"]["uid"]
    mine = Hold(HoldKind.CONSOLIDATION, "node-a", (0,), 8, 0, now + 300, big_uid, "default/big")
    theirs = Hold(HoldKind.CONSOLIDATION, "node-a", (1,), 4, 0, now + 300, mover_uid, "default/mover", "rs")
    big["metadata"]["annotations"][ANN_HOLDS] = encode_holds([mine, theirs])
    cache.upsert_pod(big)

    def held() -> list[str]:
        return sorted(h.holder for _, h in cache.holds.holds())

    assert held() == ["default/big", "default/mover"]
    mover["metadata"]["labels"] = {"touched": "yes"}  # any later event of the moved pod
    cache.upsert_pod(mover)
    cache.upsert_pod(owned(assigned_pod("sibling", "node-a", 1, 2), started=True))  # first seen, running
    assert held() == ["default/big", "default/mover"]
    replacement = owned(make_pod("mover-2", 4))
    cache.upsert_pod(replacement)  # pending first
    assert held() == ["default/big", "default/mover"]
    cache.upsert_pod(owned(assigned_pod("mover-2", "node-a", 1, 4)))  # its Binding's echo
    assert held() == ["default/big"]


def test_a_replacement_first_seen_bound_and_not_started_uses_the_hold():
    """After a restart the list shows the replacement already bound: not started yet, it is the one the
    hold was kept for."""
    cache = ClusterCache()
    cache.upsert_node(make_node("node-a", [16, 16]))
    theirs = Hold(HoldKind.CONSOLIDATION, "node-a", (1,), 4, 0, time.time() + 300, "uid-gone", "default/mover", "rs")
    big = make_pod("big", 8)
    big["metadata"]["annotations"][ANN_HOLDS] = encode_holds([theirs])
    cache.replace_pods([big, owned(assigned_pod("mover-2", "node-a", 1, 4))])
    assert cache.holds.holds() == []
