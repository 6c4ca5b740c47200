"""share_core.holds: whom a hold applies to, its annotation, and what it takes from whom."""

from __future__ import annotations

import json

import pytest

from share_core.contract import ANN_HOLDS
from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import InvalidHolds
from share_core.holds import after_bind
from share_core.holds import after_replacement_bound
from share_core.holds import encode_holds
from share_core.holds import held_units
from share_core.holds import may_preempt
from share_core.holds import parse_holds
from share_core.holds import pod_controller_uid
from share_core.holds import pod_holds
from share_core.holds import pod_is_terminating
from share_core.holds import pod_priority

T0 = 1_800_000_000.0


def hold(kind=HoldKind.PREEMPTION, node="n1", gpus=(0,), per_gpu=5, priority=100, expires=T0 + 60, **kw) -> Hold:
    return Hold(kind, node, tuple(gpus), per_gpu, priority, expires, kw.pop("holder_uid", "uid-big"), **kw)


def test_preemption_hold_applies_to_lower_priority_only():
    h = hold(kind=HoldKind.PREEMPTION, priority=100)
    assert h.applies_to(99, "uid-small")
    assert h.applies_to(100, "uid-peer")  # kube-scheduler counts a nominated pod against pods of <= priority
    assert not h.applies_to(101, "uid-vip")
    assert not h.applies_to(1000, "uid-vip")


@pytest.mark.parametrize("kind", [HoldKind.RESERVATION, HoldKind.CONSOLIDATION])
def test_reservation_and_consolidation_holds_keep_peers_off_too(kind):
    h = hold(kind=kind, priority=100)
    assert h.applies_to(99, "a") and h.applies_to(100, "b")
    assert not h.applies_to(101, "c")


def test_holder_and_its_controllers_pods_are_exempt():
    h = hold(priority=100, holder_uid="uid-big", owner_uid="rs-1")
    assert not h.applies_to(0, "uid-big")
    assert not h.applies_to(0, "uid-replacement", "rs-1")
    assert h.applies_to(0, "uid-other", "rs-2")


def test_held_units_sums_per_gpu_and_skips_expired_and_own():
    holds = [
        hold(gpus=(0, 1), per_gpu=5, holder_uid="a"),
        hold(gpus=(1,), per_gpu=3, holder_uid="b"),
        hold(node="n2", gpus=(2,), per_gpu=7, holder_uid="c", expires=T0 - 1),
    ]
    assert held_units(holds, 0, "x", now=T0) == {"n1": {0: 5, 1: 8}}
    assert held_units(holds, 0, "a", now=T0) == {"n1": {1: 3}}
    assert held_units(holds, 0, "x") == {"n1": {0: 5, 1: 8}, "n2": {2: 7}}  # no clock: none expire
    assert held_units(holds, 100, "x", now=T0) == {"n1": {0: 5, 1: 8}}  # a peer of the holders: kept off too
    assert held_units(holds, 101, "x", now=T0) == {}


def test_annotation_round_trip():
    holds = [
        hold(kind=HoldKind.RESERVATION, gpus=(3, 1), per_gpu=80, priority=-5, holder="ml/train", shortfall=(1, 24)),
        hold(kind=HoldKind.CONSOLIDATION, owner_uid="rs-9", holder_uid="uid-moved"),
    ]
    back = parse_holds(encode_holds(holds))
    assert [(h.kind, h.gpus, h.per_gpu, h.priority, h.holder, h.owner_uid, h.shortfall) for h in back] == [
        (HoldKind.RESERVATION, (3, 1), 80, -5, "ml/train", "", (1, 24)),
        (HoldKind.CONSOLIDATION, (0,), 5, 100, "", "rs-9", None),  # absent: an older extender's hold
    ]
    assert "shortfall" not in json.loads(encode_holds(holds[1:]))[0]
    assert all(b.expires >= h.expires for b, h in zip(back, holds, strict=True))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ('{"kind": "preemption"}', "expected a JSON list"),
        ("[1]", "expected an object"),
        ('[{"kind": "steal"}]', "'kind' must be one of"),
        ('[{"kind": "preemption", "node": ""}]', "'node' must name a node"),
        ('[{"kind": "preemption", "node": "n", "gpus": []}]', "'gpus' must be a non-empty list"),
        ('[{"kind": "preemption", "node": "n", "gpus": [0, 0]}]', "names a GPU twice"),
        ('[{"kind": "preemption", "node": "n", "gpus": [-1]}]', "at least 0"),
        ('[{"kind": "preemption", "node": "n", "gpus": [0], "holderUID": ""}]', "'holderUID'"),
        ('[{"kind": "preemption", "node": "n", "gpus": [0], "holderUID": "u", "perGpu": 0}]', "'perGpu'"),
        (
            '[{"kind": "preemption", "node": "n", "gpus": [0], "holderUID": "u", "perGpu": 1, "priority": 1.5}]',
            "'priority' must be a whole number",
        ),
        (
            '[{"kind":"preemption","node":"n","gpus":[0],"holderUID":"u","perGpu":1,"priority":1,"expires":"soon"}]',
            "not an RFC 3339 time",
        ),
        (
            '[{"kind":"preemption","node":"n","gpus":[0],"holderUID":"u","perGpu":1,"priority":1,'
            '"expires":"2027-01-01T00:00:00"}]',
            "needs a time zone",
        ),
        (
            '[{"kind":"reservation","node":"n","gpus":[0],"holderUID":"u","perGpu":1,"priority":1,'
            '"expires":"2027-01-01T00:00:00Z","shortfall":[1]}]',
            "'shortfall' must be \\[GPUs short, units to drain\\]",
        ),
        (
            '[{"kind":"reservation","node":"n","gpus":[0],"holderUID":"u","perGpu":1,"priority":1,'
            '"expires":"2027-01-01T00:00:00Z","shortfall":[1, -2]}]',
            "'shortfall' must be at least 0",
        ),
    ],
)
def test_garbage_annotations_are_refused_with_the_problem_named(text, says):
    with pytest.raises(InvalidHolds, match=says):
        parse_holds(text)


def test_too_many_holds_are_refused_not_half_read():
    many = json.loads(encode_holds([hold()])) * 65
    with pytest.raises(InvalidHolds, match="at most 64"):
        parse_holds(json.dumps(many))


def test_pod_holds_names_the_pod_in_its_error():
    pod = {"metadata": {"namespace": "ml", "name": "train", "annotations": {ANN_HOLDS: "nope"}}}
    with pytest.raises(InvalidHolds, match="pod ml/train"):
        pod_holds(pod)
    assert pod_holds({"metadata": {}}) == []


def test_after_bind_spends_own_holds_and_one_owner_hold_on_that_node():
    holds = [
        hold(holder_uid="waiting"),
        hold(holder_uid="moved-1", owner_uid="rs", node="n1"),
        hold(holder_uid="moved-2", owner_uid="rs", node="n1"),
        hold(holder_uid="moved-3", owner_uid="rs", node="n2"),
    ]
    assert [h.holder_uid for h in after_bind(holds, "waiting")] == ["moved-1", "moved-2", "moved-3"]
    left = after_replacement_bound(holds, "replacement", "rs", "n1")
    assert [h.holder_uid for h in left] == ["waiting", "moved-2", "moved-3"]
    assert after_replacement_bound(holds, "replacement", "", "n1") == holds  # no controller: nothing of its


def test_the_moved_pod_itself_never_spends_the_hold_kept_for_its_replacement():
    """The moved pod is still bound (its eviction under way) when the hold is made; its own later events
    carry its controller and its node, as the replacement's will."""
    holds = [hold(holder_uid="waiting"), hold(holder_uid="moved-1", owner_uid="rs", node="n1")]
    assert after_replacement_bound(holds, "moved-1", "rs", "n1") == holds
    assert [h.holder_uid for h in after_replacement_bound(holds, "new-1", "rs", "n1")] == ["waiting"]


def test_what_a_pod_says_about_itself():
    assert pod_priority({"spec": {}}) == 0
    assert pod_priority({"spec": {"priority": -10}}) == -10
    assert pod_priority({"spec": {"priority": "high"}}) == 0  # garbage reads as the default, never crashes
    assert may_preempt({"spec": {}})
    assert not may_preempt({"spec": {"preemptionPolicy": "Never"}})
    owned = {"metadata": {"ownerReferences": [{"uid": "x"}, {"uid": "rs-1", "controller": True}]}}
    assert pod_controller_uid(owned) == "rs-1"
    assert pod_controller_uid({"metadata": {"ownerReferences": [{"uid": "x"}]}}) == ""
    assert pod_is_terminating({"metadata": {"deletionTimestamp": "2026-11-28T00:00:00Z"}})
    assert not pod_is_terminating({"metadata": {}})
