"""Room for what waits (`--leave-room on`, issue 40): the extender's policy wrapped in RoomForWaiting, told
the shapes of the multi-GPU pods kube-scheduler found no room for, as share-sim's timeline tells it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from share_core.config import parse_args
from share_placement import BinpackPolicy
from share_placement import Demand
from share_placement.room import RoomForWaiting
from share_placement.waiting_shapes import LINGER_S
from share_scheduler.cli import build_parser
from share_scheduler.cli import main
from share_scheduler.cli import starvation_config
from share_scheduler.starvation import StarvationConfig
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import schedule
from tests.unit.scheduler.conftest import wait_until

ON = StarvationConfig(reserve=False, leave_room=True)
OFF = StarvationConfig(reserve=False)
NAMES = ["node-a", "node-b"]
PAIR = Demand(16, 2)  # the waiting pod's shape: two whole 16 GiB GPUs
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}


def cluster(kube):
    """node-a: the last node with two free GPUs (16 GiB each). node-b: two 24 GiB GPUs, one full, so it can
    take no pair of 16s; binpack prefers node-a for an 8 GiB share (8 left on the GPU, not 16). node-c:
    where the pair goes once kube-scheduler retries it."""
    kube.add_node(make_node("node-a", [16, 16]))
    kube.add_node(make_node("node-b", [24, 24]))
    kube.add_node(make_node("node-c", [16, 16]))
    full = make_pod("b1", 24, node="node-b")
    full["metadata"]["annotations"].update(
        {"gpushare.io/gpu-index": "1", "gpushare.io/gpu-uuid": "GPU-node-b-1", "gpushare.io/gpu-mem": "24"}
    )
    kube.add_pod(full)


def waiting_pair(kube, ext, name="pair"):
    """A 2-GPU pod kube-scheduler found no room for (its PodScheduled condition says so)."""
    kube.add_pod(make_pod(name, 32, count=2))
    kube.add_pod_condition("default", name, UNSCHEDULABLE)
    wait_until(lambda: (p := ext.cache.waiting.get(f"default/{name}")) is not None and p.unschedulable,
               what="the pair seen unschedulable")  # fmt: skip


def share_goes(ext, name="share"):
    """Where filter sends an 8 GiB share (`--filter-keeps best`: the one node it keeps). Filter holds the
    node's GPU for the pod's bind; only the answer matters here, so the hold goes."""
    kept = ext.call("filter", filter_args(make_pod(name, 8), NAMES))["NodeNames"]
    ext.cache.forget(f"default/{name}")
    return kept


def room(ext):
    return ext.parts["extender"].leave_room


def test_a_waiting_pair_steers_a_share_off_the_last_node_with_two_free_gpus(kube, extender_factory, caplog):
    cluster(kube)
    ext = extender_factory(policy="binpack", starvation=ON).wait_ready()
    ext.settle()
    assert share_goes(ext) == ["node-a"]  # nothing waits: binpack's choice (and its ranking memoised)
    caplog.set_level(logging.INFO, logger="share_scheduler.leaveroom")
    waiting_pair(kube, ext)
    assert share_goes(ext) == ["node-b"]  # the memo and BestNodeIndex's ranking were started afresh
    assert room(ext).shapes == (PAIR,)
    said = [r.getMessage() for r in caplog.records if "room for what waits" in r.getMessage()]
    assert len(said) == 1 and "now leaving room for 2 GPUs x 16 GiB (waiting: default/pair)" in said[0]
    # Steered, never refused: with node-b out of the request the share still goes to node-a.
    assert ext.call("filter", filter_args(make_pod("s2", 8), ["node-a"]))["NodeNames"] == ["node-a"]
    ext.cache.forget("default/s2")
    # prioritize ranks as filter chooses; bind takes the GPU the wrapper's policy chose on the node.
    ranked = ext.call("prioritize", filter_args(make_pod("s3", 8), NAMES))
    assert {h["Host"]: h["Score"] for h in ranked} == {"node-b": 10, "node-a": 9}
    share = make_pod("share", 8)
    kube.add_pod(share)
    assert ext.call("bind", bind_args(share, "node-b"))["Error"] == ""
    assert kube.pods[("default", "share")]["metadata"]["annotations"]["gpushare.io/gpu-index"] == "0"


def test_the_gauge_lists_the_shapes_left_room_for(kube, extender_factory):
    cluster(kube)
    ext = extender_factory(policy="binpack", starvation=ON).wait_ready()
    waiting_pair(kube, ext)
    text = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_leave_room_shapes{gpus="2",models="",per_gpu="16"} 1.0' in text


def test_a_pair_not_yet_found_unschedulable_or_of_another_profile_leaves_nothing(kube, extender_factory):
    cluster(kube)
    ext = extender_factory(policy="binpack", starvation=ON).wait_ready()
    kube.add_pod(make_pod("fresh", 32, count=2))  # on its way through a cycle: not waiting in share-sim's sense
    other = make_pod("other", 32, count=2)
    other["spec"]["schedulerName"] = "default-scheduler"
    kube.add_pod(other)
    kube.add_pod_condition("default", "other", UNSCHEDULABLE)
    wait_until(
        lambda: (
            (p := ext.cache.waiting.get("default/other")) is not None
            and p.unschedulable
            and ext.cache.waiting.get("default/fresh") is not None
        ),
        what="both seen",
    )
    assert share_goes(ext) == ["node-a"]
    assert room(ext).shapes == ()


def test_the_pair_bound_its_shape_lingers_then_the_steering_stops(kube, extender_factory):
    cluster(kube)
    ext = extender_factory(policy="binpack", starvation=ON).wait_ready()
    now = [time.time()]
    room(ext).clock = lambda: now[0]
    waiting_pair(kube, ext)
    assert share_goes(ext) == ["node-b"]
    pair = kube.pods[("default", "pair")]
    schedule(ext, pair, "node-c")  # kube-scheduler's retry found room on node-c
    wait_until(lambda: ext.cache.waiting.get("default/pair") is None, what="the pair seen bound")
    # share-sim's rule: a shape that just got its room is likely to wait again, for linger_s.
    now[0] += LINGER_S - 1
    assert share_goes(ext) == ["node-b"] and room(ext).shapes == (PAIR,)
    now[0] += 2
    assert share_goes(ext) == ["node-a"] and room(ext).shapes == ()


def test_the_pair_deleted_with_no_linger_the_steering_stops_at_once(kube, extender_factory, caplog):
    cluster(kube)
    config = StarvationConfig(reserve=False, leave_room=True, leave_room_linger=0)
    ext = extender_factory(policy="binpack", starvation=config).wait_ready()
    waiting_pair(kube, ext)
    assert share_goes(ext) == ["node-b"]
    caplog.set_level(logging.INFO, logger="share_scheduler.leaveroom")
    kube.delete_pod("default", "pair")
    wait_until(lambda: ext.cache.waiting.get("default/pair") is None, what="the pair seen gone")
    time.sleep(0.01)  # past the linger (0 s) of its last wait
    assert share_goes(ext) == ["node-a"]
    assert any("no longer for 2 GPUs x 16 GiB" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("policy", ["binpack", "frag"])
def test_off_places_exactly_as_before(kube, extender_factory, policy):
    """--leave-room off: the very policy object, no wrapper, no refresh; the same answers as an extender
    configured without it, a waiting pair or not."""
    cluster(kube)
    before = extender_factory(policy=policy).wait_ready()
    off = extender_factory(policy=policy, starvation=OFF).wait_ready()
    on = extender_factory(policy=policy, starvation=ON).wait_ready()
    for ext in (before, off):
        parts = ext.parts["extender"]
        assert parts.leave_room is None and parts.policy is parts.base_policy
        assert not isinstance(parts.policy, RoomForWaiting) and parts.memo.policy is parts.policy
    assert isinstance(on.parts["extender"].policy, RoomForWaiting)
    waiting_pair(kube, off)
    wait_until(lambda: before.cache.waiting.multi_version == off.cache.waiting.multi_version, what="same view")
    if policy == "binpack":
        assert share_goes(off) == ["node-a"]  # binpack's own choice: not steered
    # The same answers, pod after pod (each filter's hold counted alike in both caches).
    sizes = [8, 4, 12, 16, 2, 24, 6]
    for i, mem in enumerate(sizes):
        pod = make_pod(f"p{i}", mem)
        asked = filter_args(pod, ["node-a", "node-b", "node-c"])
        assert before.call("filter", asked) == off.call("filter", asked), (policy, mem)
        assert before.call("prioritize", asked) == off.call("prioritize", asked)
    assert off.cache.waiting.get("default/pair").unschedulable  # the pair waits, and nothing changed


def test_a_learning_policy_learns_as_before_under_the_wrapper(kube, extender_factory):
    """frag wrapped: its workload table still decides the memo's life (not every observed pod), and the
    cluster's largest GPU still reaches it."""
    cluster(kube)
    on = extender_factory(policy="frag", starvation=ON).wait_ready()
    parts = on.parts["extender"]
    assert parts.memo.learner is parts.base_policy and parts.memo._by_table and not parts.memo.learns
    wait_until(lambda: parts.base_policy.gpu_unit == 24, what="the largest GPU told to frag")
    waiting_pair(kube, on)
    assert share_goes(on) == ["node-b"]


def test_on_with_nothing_waiting_is_the_policy_exactly(kube, extender_factory):
    cluster(kube)
    plain = extender_factory(policy="binpack").wait_ready()
    on = extender_factory(policy="binpack", starvation=ON).wait_ready()
    for i, mem in enumerate([8, 4, 12, 16, 24]):
        asked = filter_args(make_pod(f"p{i}", mem), ["node-a", "node-b", "node-c"])
        assert plain.call("prioritize", asked) == on.call("prioritize", asked)
        assert plain.call("filter", asked) == on.call("filter", asked)
    assert room(on).shapes == () and isinstance(room(on).policy.base, BinpackPolicy)


def test_the_flag_and_its_config_field():
    parser = build_parser()
    assert starvation_config(parser.parse_args([])).leave_room is False
    assert starvation_config(parser.parse_args(["--leave-room", "on"])).leave_room is True
    on = starvation_config(parser.parse_args(["serve", "--leave-room", "on", "--leave-room-linger", "60"]))
    assert (on.leave_room, on.leave_room_linger) == (True, 60.0)
    assert starvation_config(parser.parse_args(["--leave-room", "off"])).leave_room is False


@pytest.mark.parametrize("value", ["maybe", "true", "ON", ""])
def test_a_bad_flag_value_is_refused_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--leave-room", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--leave-room" in err and "invalid choice" in err and "'on', 'off'" in err


def test_a_negative_linger_is_refused(capsys):
    assert main(["--leave-room", "on", "--leave-room-linger", "-1"]) == 2
    assert "leave-room linger must be >= 0" in capsys.readouterr().err


def test_an_unquoted_on_in_the_config_file_is_refused_with_a_hint(tmp_path: Path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("apiVersion: gpushare.io/v1\nkind: Configuration\nscheduler:\n  leaveRoom: on\n")
    with pytest.raises(SystemExit):
        main(["--config", str(path)])
    err = capsys.readouterr().err
    assert "scheduler.leaveRoom" in err and "quote" in err
    path.write_text('apiVersion: gpushare.io/v1\nkind: Configuration\nscheduler:\n  leaveRoom: "on"\n')
    assert starvation_config(parse_args(build_parser(), ["--config", str(path)])).leave_room is True


def test_room_is_left_only_where_the_waiting_pod_could_ever_run(kube, extender_factory, caplog):
    """A pair asking 32 cores: only node-a (H100, 64 cores) could ever host it; node-b (A100, 8 cores)
    never could, however much of it drains. binpack sends a share to node-a (8 GiB left on a GPU against
    16); leaving room for the pair where it could run, the share breaks node-b instead."""
    kube.add_node(make_node("node-a", [16, 16], model="H100", host={"cpu": "64"}))
    kube.add_node(make_node("node-b", [24, 24], model="A100", host={"cpu": "8"}))
    ext = extender_factory(policy="binpack", starvation=ON).wait_ready()
    ext.settle()
    assert share_goes(ext) == ["node-a"]
    caplog.set_level(logging.INFO, logger="share_scheduler.leaveroom")
    pair = make_pod("pair", 32, count=2)
    pair["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "32"}
    kube.add_pod(pair)
    kube.add_pod_condition("default", "pair", UNSCHEDULABLE)
    wait_until(lambda: (p := ext.cache.waiting.get("default/pair")) is not None and p.unschedulable,
               what="the pair seen unschedulable")  # fmt: skip
    assert share_goes(ext) == ["node-b"]
    [shape] = room(ext).shapes
    assert (shape.count, shape.per_gpu, shape.models) == (2, 16, ("H100",))
    said = [r.getMessage() for r in caplog.records if "room for what waits" in r.getMessage()]
    assert "now leaving room for 2 GPUs x 16 GiB of model H100 (waiting: default/pair)" in said[0]
    # A node that could host it joins: every GPU model could again, so the shape is the pair's own.
    kube.add_node(make_node("node-c", [16, 16], model="A100", host={"cpu": "64"}))
    wait_until(lambda: ext.cache.node_snapshot("node-c") is not None, what="node-c in the cache")
    wait_until(lambda: room(ext).refresh() or PAIR in room(ext).shapes, what="the shape widened")
    assert set(room(ext).shapes) == {PAIR, shape}  # the narrow one lingers, as any shape no pod waits for
