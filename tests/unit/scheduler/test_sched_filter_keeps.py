"""`--filter-keeps`: best (filter answers with the policy's best nodes, no prioritize call) against
fitting (every node the pod fits on, ranked by prioritize). Best must pass exactly the nodes that
prioritize would rank first, so the live placement is the policy's, not a random pick among fits."""

from __future__ import annotations

import random

import pytest

from share_core.contract import ANN_GPU_INDEX
from tests.unit.scheduler.conftest import assigned_pod
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until


@pytest.fixture
def cluster(kube):
    kube.add_node(make_node("empty-1", [16, 16]))
    kube.add_node(make_node("empty-2", [16, 16]))
    kube.add_node(make_node("tight", [16, 16]))
    kube.add_node(make_node("small", [4]))
    kube.add_pod(assigned_pod("h1", "tight", 0, 12))  # 4 GiB left on tight/0: binpack's first choice
    return kube


NAMES = ["empty-1", "empty-2", "tight", "small"]


def test_best_passes_only_the_policys_first_choice(cluster, extender_factory):
    ext = extender_factory(policy="binpack").wait_ready()
    # tight/0 and small/0 both end exactly full; binpack's score ranks them, and only the top passes.
    ranked = {h["Host"]: h["Score"] for h in ext.call("prioritize", filter_args(make_pod("p", 4), NAMES))}
    body = ext.call("filter", filter_args(make_pod("p", 4), NAMES))
    top = max(ranked.values())
    assert body["NodeNames"] == [n for n in NAMES if ranked[n] == top]
    assert "empty-1" not in body["NodeNames"] and "empty-2" not in body["NodeNames"]
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}


def test_best_breaks_ties_to_the_lowest_node_name(cluster, extender_factory):
    ext = extender_factory(policy="binpack").wait_ready()
    # Equal states, equal scores: one node, the lowest name, whatever order kube-scheduler sends them in
    # (it would pick at random among ties; share-sim takes the first node, and lists nodes by name).
    body = ext.call("filter", filter_args(make_pod("p", 8), ["empty-2", "small", "empty-1"]))
    assert body["NodeNames"] == ["empty-1"]


def test_best_leaves_a_random_ties_policys_ties_to_kube_scheduler(cluster, extender_factory):
    # bestfit's ties are meant to be broken at random (the paper's Best-fit; share-sim does it too):
    # every tied node passes, for kube-scheduler's selectHost to pick from.
    ext = extender_factory(policy="bestfit").wait_ready()
    body = ext.call("filter", filter_args(make_pod("p", 8), ["empty-2", "small", "empty-1"]))
    assert body["NodeNames"] == ["empty-2", "empty-1"]


def test_fitting_passes_every_node_the_pod_fits(cluster, extender_factory):
    ext = extender_factory(policy="binpack", filter_keeps="fitting").wait_ready()
    body = ext.call("filter", filter_args(make_pod("p", 4), NAMES))
    assert body["NodeNames"] == NAMES
    body = ext.call("filter", filter_args(make_pod("p", 8), NAMES))
    assert body["NodeNames"] == ["empty-1", "empty-2", "tight"]


def test_nothing_fits_explains_every_node_in_both_modes(cluster, extender_factory):
    for keeps in ("best", "fitting"):
        ext = extender_factory(policy="binpack", filter_keeps=keeps).wait_ready()
        body = ext.call("filter", filter_args(make_pod("p", 20), NAMES))
        assert body["NodeNames"] == []
        assert set(body["FailedAndUnresolvableNodes"]) == set(NAMES)


def test_a_lone_node_is_held_until_its_bind(cluster, extender_factory):
    ext = extender_factory(policy="binpack").wait_ready()
    first, second = make_pod("first", 4), make_pod("second", 4)
    for p in (first, second):
        cluster.add_pod(p)
    assert ext.call("filter", filter_args(first, NAMES))["NodeNames"] == ["small"]
    assert ext.cache.usage()["small"] == {0: 4}  # held for first's bind
    # kube-scheduler's next cycle runs before first's bind arrives: the held memory is not offered.
    assert ext.call("filter", filter_args(second, NAMES))["NodeNames"] == ["tight"]
    assert ext.call("bind", bind_args(second, "tight")) == {"Error": ""}
    assert ext.call("bind", bind_args(first, "small")) == {"Error": ""}
    assert cluster.pods[("default", "second")]["metadata"]["annotations"][ANN_GPU_INDEX] == "0"
    ext.settle()
    assert ext.cache.usage()["tight"] == {0: 16, 1: 0} and ext.cache.usage()["small"] == {0: 4}


def test_a_hold_kube_scheduler_did_not_use_is_released(cluster, extender_factory):
    ext = extender_factory(policy="binpack").wait_ready()
    ext.cache.hold_ttl = 0.2
    pod = cluster.add_pod(make_pod("p", 4))
    assert ext.call("filter", filter_args(pod, NAMES))["NodeNames"] == ["small"]
    # kube-scheduler bound it elsewhere (say, a Reserve plugin failed on small): the hold moves.
    assert ext.call("bind", bind_args(pod, "empty-1")) == {"Error": ""}
    assert ext.cache.usage()["small"] == {0: 0} and ext.cache.usage()["empty-1"] == {0: 4, 1: 0}
    # A hold no bind ever claims lapses.
    other = cluster.add_pod(make_pod("q", 4))
    assert ext.call("filter", filter_args(other, NAMES))["NodeNames"] == ["small"]
    assert ext.cache.usage()["small"] == {0: 4}
    wait_until(lambda: ext.cache.usage()["small"] == {0: 0}, timeout=3, what="the hold to lapse")


def test_a_pod_filtered_again_does_not_see_its_own_earlier_hold(cluster, extender_factory):
    ext = extender_factory(policy="binpack").wait_ready()
    pod = cluster.add_pod(make_pod("p", 4))
    assert ext.call("filter", filter_args(pod, ["small"]))["NodeNames"] == ["small"]
    assert ext.cache.usage()["small"] == {0: 4}  # held for p's bind
    # That attempt stopped before the bind (a Reserve plugin failed): kube-scheduler tries p again, and
    # the 4 GiB small has are still p's to take, not taken by p's own earlier hold.
    assert ext.call("filter", filter_args(pod, ["small"]))["NodeNames"] == ["small"]
    assert ext.cache.usage()["small"] == {0: 4}  # one hold, the new one
    other = cluster.add_pod(make_pod("q", 4))
    assert ext.call("filter", filter_args(other, ["small"]))["NodeNames"] == []  # p's hold counts for q


def test_unknown_filter_keeps_is_refused(kube):
    from share_scheduler.app import create_app

    with pytest.raises(ValueError, match="filter_keeps"):
        create_app(kube, start_sync=False, filter_keeps="some")


@pytest.mark.parametrize("policy", ["binpack", "spread", "frag"])
def test_best_equals_prioritize_top_on_random_clusters(kube, extender_factory, policy):
    rng = random.Random(11)
    names = []
    for n in range(30):
        name = f"n{n}"
        names.append(name)
        sizes = [rng.choice([16, 24, 40, 80]) for _ in range(rng.choice([1, 2, 4, 8]))]
        kube.add_node(make_node(name, sizes))
        for g, size in enumerate(sizes):
            used = rng.randint(0, size)
            if used:
                kube.add_pod(assigned_pod(f"h-{name}-{g}", name, g, used))
    ext = extender_factory(policy=policy).wait_ready()
    for i in range(40):
        mem, count = rng.choice([1, 2, 4, 8, 12, 20]), rng.choice([1, 1, 1, 2])
        pod = make_pod(f"p{i}", mem * count, count=count if count > 1 else None)
        ranked = {h["Host"]: h["Score"] for h in ext.call("prioritize", filter_args(pod, names))}
        body = ext.call("filter", filter_args(pod, names))  # a lone best node is then held: state moves on
        top = max(ranked.values())
        expected = [min(n for n in names if ranked[n] == top)] if top > 0 else []
        assert body["NodeNames"] == expected, (policy, mem, count)
