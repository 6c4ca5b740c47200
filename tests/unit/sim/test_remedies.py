"""Issue 40's remedies in the timeline, against timelines worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from share_placement import BinpackPolicy
from share_placement import Demand
from share_placement import SpreadPolicy
from share_placement.starvation import ReservationLimits
from share_scheduler.sim import cli
from share_scheduler.sim import engine
from share_scheduler.sim.remedies import RemedyHooks
from share_scheduler.sim.remedies import RemedyOptions
from share_scheduler.sim.remedies import RemedyTimeline
from share_scheduler.sim.remedies import simulate_with_remedies
from share_scheduler.sim.timeline import DAY
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.timeline import poisson_arrivals
from share_scheduler.sim.timeline import simulate_timeline
from share_scheduler.sim.timeline_cli import parse_args
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload
from tests.unit.sim.test_timeline import churn

# Pods by index: 0 a half-GPU share, 1 a two-GPU pod, 2 a CPU-only pod (its arrivals make the remedies'
# loop run at a chosen time, as the extender's timer would), 3 a 300-unit share, 4 a whole GPU.
PODS = (
    SimPod("share500", 500, 1, cpu=1000, duration=100.0),
    SimPod("pair", 1000, 2, cpu=1000, duration=100.0),
    SimPod("cpu", 0, 0, cpu=1, duration=1.0),
    SimPod("share300", 300, 1, cpu=1000, duration=100.0),
    SimPod("whole", 1000, 1, cpu=1000, duration=100.0),
)


def cluster(*gpus: int) -> Workload:
    return Workload(
        tuple(SimNode(f"n{i}", "T4", (1000,) * g, cpu=64000, memory=10**6) for i, g in enumerate(gpus)), PODS
    )


def timeline(workload, policy, arrivals, options, end=1000.0) -> RemedyTimeline:
    hooks = RemedyHooks(workload, arrivals, options, seed=0)
    tl = RemedyTimeline(workload, policy, arrivals, 0.0, end, 0, hooks)
    tl.run()
    return tl


# A share on the 2-GPU node at 0 (runs to 100); the pair arrives at 1 and waits; the loop runs at 20;
# a second share arrives at 60, a third at 150.
STREAM = [
    Arrival(0, 0, 100),
    Arrival(1, 1, 100),
    Arrival(20, 2, 1),
    Arrival(60, 0, 100),
    Arrival(150, 0, 100),
]


def test_without_a_reservation_the_stream_of_shares_keeps_the_pair_waiting():
    r = simulate_timeline(cluster(2), BinpackPolicy(), STREAM, 0.0, 400.0)
    # 60: the second share takes GPU 0's other half; 100: the first leaves, 150: the third takes its half;
    # 160: the second leaves; GPU 0 is busy until 250, when the pair finally fits.
    assert r.classes["multi"]["max_s"] == pytest.approx(249.0)


def test_a_reservation_holds_the_gpus_against_the_stream_until_the_pair_is_placed():
    options = RemedyOptions(reserve=True, limits=ReservationLimits(after_s=10, max_holds=1, max_share=1.0), tick_s=1)
    tl = timeline(cluster(2), BinpackPolicy(), STREAM, options, end=400)
    # 20: the pair has waited 19 s: both GPUs held for it. 60: the share sees them taken and waits.
    # 100: the first share leaves, the pair takes both GPUs; its hold goes. 150: the third share waits
    # too (the pair runs); 200: the pair leaves, the two shares run.
    assert tl.started == [0.0, 100.0, 20.0, 200.0, 200.0]
    assert tl.hooks.holds == []


@pytest.mark.parametrize("yield_after", [None, 30.0, 0.0])
def test_a_reservation_yields_to_a_pod_that_waited_past_the_bound(yield_after):
    """The first share runs until 500, so the pair waits for GPU 0 whatever happens; the share arriving at
    60 fits only the held half of GPU 0. Never yielding, it waits behind the pair until 600; yielding after
    30 s, it takes that half at the first event past 90 (a CPU pod at 95) and is gone at 195, before the
    pair could start: the pair starts at 500 either way. Yielding after 0 s, it still sees the hold when it
    arrives (and waits), and takes the half at the next event, 95."""
    stream = [Arrival(0, 0, 500), Arrival(1, 1, 100), Arrival(20, 2, 1), Arrival(60, 0, 100), Arrival(95, 2, 1)]
    options = RemedyOptions(
        reserve=True,
        limits=ReservationLimits(after_s=10, max_holds=1, max_share=1.0),
        tick_s=1,
        yield_after_s=yield_after,
    )
    tl = timeline(cluster(2), BinpackPolicy(), stream, options, end=1000)
    share_starts = 600.0 if yield_after is None else 95.0
    assert tl.started == [0.0, 500.0, 20.0, share_starts, 95.0]


def test_a_reservation_yields_only_to_pods_below_the_remedies_size_once_they_waited_the_bound():
    stream = [Arrival(0, 0, 500), Arrival(1, 1, 100), Arrival(2, 4, 100)]  # a share, a pair, a whole GPU
    tl = timeline(cluster(1), BinpackPolicy(), stream, RemedyOptions(reserve=True, yield_after_s=30.0), end=10)
    yielded = tl.hooks.yielded
    tl.now = 31.5
    assert yielded(tl, 0)  # the share waited 31.5 s
    assert not yielded(tl, 1)  # the pair waited 30.5 s, but the remedies serve pods of 2+ GPUs: never
    assert not yielded(tl, 2)  # the whole GPU pod waited 29.5 s: not yet
    tl.now = 32.0
    assert not yielded(tl, 2)  # 30 s: strictly longer is needed (at S = 0, a pod just arrived sees the holds)
    tl.now = 32.5
    assert yielded(tl, 2)
    tl.now = 1e6
    assert not yielded(tl, 1)


def test_a_reservation_due_to_expire_is_renewed_while_its_node_drains_and_its_room_kept():
    # A whole GPU runs on the 2-GPU node until 120, a 300-unit share beside it until 60.5; the pair waits
    # from 1; the loop runs at 20, 55 and 76 (CPU pods); a share arrives at 85. Holds last 60 s and are due
    # within 30 s of their end (renewal_horizon: half their life here). Made at 20 (2 GPUs short, 1,300
    # units to drain), the pair's hold is due at 55 but the node has not drained: not renewed. At 76 the
    # small share has gone (1 short, 1,000 to drain): renewed to 136. The share of 85 waits, the pair runs
    # at 120 when the whole GPU ends. Without the renewal the hold ends at 80, the share takes the freed
    # GPU at 85 and the pair waits until 185.
    arrivals = [
        Arrival(0, 4, 120),
        Arrival(0.5, 3, 60),
        Arrival(1, 1, 100),
        Arrival(20, 2, 1),
        Arrival(55, 2, 1),
        Arrival(76, 2, 1),
        Arrival(85, 0, 100),
    ]
    limits = ReservationLimits(after_s=10, max_holds=1, max_share=1.0, ttl_s=60)
    options = RemedyOptions(reserve=True, limits=limits, tick_s=20)
    run = (cluster(2), BinpackPolicy(), arrivals, options)
    tl = timeline(*run, end=400)
    assert tl.started == [0.0, 0.5, 120.0, 20.0, 55.0, 76.0, 220.0]
    assert tl.hooks.holds == []
    seen = {
        end: [(h.holder_uid, h.node, h.expires, h.shortfall) for h in timeline(*run, end=end).hooks.holds]
        for end in (60.0, 78.0)
    }
    assert seen == {60.0: [("a2", "n0", 80.0, (2, 1300))], 78.0: [("a2", "n0", 136.0, (1, 1000))]}


def test_a_reservation_goes_only_to_a_node_whose_cpu_and_memory_could_ever_host_the_pod():
    # n0: 2 GPUs and 16 cores; n1: 2 GPUs and 64 cores. The pair asks 32 cores: it can never run on n0,
    # however much of it drains. Whole-GPU pods fill n0, then n1 (binpack); the pair arrives at 1 and
    # waits; at 10 n0's first pod leaves, so n0 is one GPU short of the pair and n1 two. At 20 (the
    # loop, run by a CPU-only arrival) the pair's reservation must be on n1, the only node it could use.
    pods = (*PODS[:2], SimPod("big-pair", 1000, 2, cpu=32000, duration=100.0), PODS[2], PODS[4])
    nodes = (
        SimNode("n0", "T4", (1000, 1000), cpu=16000, memory=10**6),
        SimNode("n1", "T4", (1000, 1000), cpu=64000, memory=10**6),
    )
    arrivals = [
        Arrival(0, 4, 10),
        Arrival(0.5, 4, 300),
        Arrival(0.6, 4, 300),
        Arrival(0.7, 4, 300),
        Arrival(1, 2, 100),
        Arrival(20, 3, 1),
    ]
    options = RemedyOptions(reserve=True, limits=ReservationLimits(after_s=10, max_holds=1, max_share=1.0), tick_s=1)
    tl = timeline(Workload(nodes, pods), BinpackPolicy(), arrivals, options, end=50)
    assert [tl.where[seq][0] for seq in (1, 2, 3)] == [0, 1, 1]
    assert [h.node for h in tl.hooks.holds] == ["n1"]
    assert tl.started[4] is None  # n1's pods run to 300: the pair still waits, with n1 held for it


def test_a_reservation_does_not_hold_against_a_higher_priority_pod():
    pods = (*PODS[:3], SimPod("urgent", 500, 1, cpu=1000, priority=2, duration=100.0))
    workload = Workload(cluster(2).nodes, pods)
    arrivals = [Arrival(0, 0, 100), Arrival(1, 1, 100), Arrival(20, 2, 1), Arrival(60, 3, 100)]
    options = RemedyOptions(reserve=True, limits=ReservationLimits(after_s=10, max_holds=1, max_share=1.0), tick_s=1)
    tl = timeline(workload, BinpackPolicy(), arrivals, options, end=400)
    assert tl.started[3] == 60.0  # the urgent share passes the hold
    assert tl.started[1] == 160.0  # the pair runs once both shares are gone


def test_consolidation_moves_a_movable_share_to_place_the_waiting_pair():
    # Spread puts the share on the 2-GPU node n0 (the emptiest); the pair waits. At 20 the loop moves
    # the share to n1's GPU and places the pair on n0's two GPUs.
    arrivals = [Arrival(0, 3, 500), Arrival(1, 1, 100), Arrival(20, 2, 1)]
    options = RemedyOptions(consolidate=True, consolidate_after_s=10, tick_s=1, movable_fraction=1.0)
    tl = timeline(cluster(2, 1), SpreadPolicy(), arrivals, options, end=1000)
    assert tl.started == [0.0, 20.0, 20.0]
    assert tl.hooks.evictions == 1
    assert tl.where == {} and tl.ends == {}  # everyone left; the share restarted at 20, ran 500 s to 520
    r = tl.result()
    assert r.figures()["evictions_per_1000_placed"] == pytest.approx(1000 / 3)
    # At 510 the moved share still runs, on n1: it restarted at 20 (its first start stays 0).
    tl = timeline(cluster(2, 1), SpreadPolicy(), arrivals, options, end=510)
    assert tl.where[0] == (1, (0,)) and tl.ends[0] == 520.0


def test_consolidation_never_moves_a_pod_no_controller_recreates():
    arrivals = [Arrival(0, 3, 500), Arrival(1, 1, 100), Arrival(20, 2, 1)]
    options = RemedyOptions(consolidate=True, consolidate_after_s=10, tick_s=1, movable_fraction=0.0)
    tl = timeline(cluster(2, 1), SpreadPolicy(), arrivals, options, end=1000)
    assert tl.started[1] == 500.0 and tl.hooks.evictions == 0


@pytest.mark.parametrize("leave_room", [False, True])
def test_leaving_room_sends_a_whole_gpu_pod_where_it_breaks_no_waiting_pair(leave_room):
    # n0 has 2 GPUs, n1 one. 0: X takes n1 (binpack: the fuller node), leaves at 2.5. 1: Y takes n0's GPU 0.
    # 2: the pair waits (n0 has one free GPU). 3: Z, a whole GPU: binpack alone takes n0's GPU 1 (the
    # first of two equal nodes), and the pair waits until Z leaves at 503; leaving room, Z takes n1 (a
    # 1-GPU node is no room for a pair) and the pair runs when Y leaves at 101.
    arrivals = [Arrival(0, 4, 2.5), Arrival(1, 4, 100), Arrival(2, 1, 100), Arrival(3, 4, 500)]
    r = timeline(cluster(2, 1), BinpackPolicy(), arrivals, RemedyOptions(leave_room=leave_room), end=1000)
    assert r.where == {} and r.started[:3] == [0.0, 1.0, 101.0 if leave_room else 503.0]


def test_room_is_left_only_on_nodes_that_could_ever_host_the_waiting_pod():
    # n0 (model A, 64 cores, 3 GPUs) and n1 (model B, 16 cores, 2 GPUs); the pair asks 32 cores: only n0
    # could ever host it. 0: a 20-core whole GPU takes n0's GPU 0 (to 100), 1: one its GPU 1 (to 500); 2: the
    # pair waits. 3: Z, a whole GPU. Counting GPUs only, n1's two free GPUs would be the pair's nearest room
    # and Z would break n0 instead (the pair then waits until 500); with the shape narrowed to model A, n1
    # is no room for the pair at all, Z takes it, and the pair runs on n0 when its first pod leaves at 100.
    wide = SimPod("wide", 1000, 1, cpu=20_000, duration=100.0)  # a whole GPU with 20 cores: never on n1
    pods = (wide, SimPod("pair", 1000, 2, cpu=32_000, duration=100.0), *PODS[2:])
    nodes = (
        SimNode("n0", "A", (1000,) * 3, cpu=64_000, memory=10**6),
        SimNode("n1", "B", (1000,) * 2, cpu=16_000, memory=10**6),
    )
    arrivals = [Arrival(0, 0, 100), Arrival(1, 0, 500), Arrival(2, 1, 100), Arrival(3, 4, 500)]
    tl = timeline(Workload(nodes, pods), BinpackPolicy(), arrivals, RemedyOptions(leave_room=True), end=150)
    assert tl.policy.shapes == (Demand(1000, 2, ("A",)),)
    assert tl.started == [0.0, 1.0, 100.0, 3.0]
    assert tl.where[3][0] == 1 and tl.where[2][0] == 0


def test_remedies_off_change_nothing_and_leave_room_on_a_quiet_cluster_changes_nothing():
    arrivals = [Arrival(t * 7.0, k % 4, 50.0) for t, k in enumerate(range(200))]
    base = simulate_timeline(cluster(2, 4, 8), BinpackPolicy(), arrivals, 0.0, 2000.0)
    same = simulate_with_remedies(
        cluster(2, 4, 8), BinpackPolicy(), arrivals, 0.0, 2000.0, RemedyOptions(leave_room=True, reserve=True)
    )
    assert same.classes == base.classes and same.alloc_pct == pytest.approx(base.alloc_pct)


def test_cli_switches_and_bad_knobs():
    args = parse_args(["--yaml", "x.yaml", "--reserve", "on", "--consolidate", "off", "--max-moves", "3"])
    assert args.remedies.reserve and not args.remedies.consolidate and args.remedies.max_moves == 3
    assert not args.remedies.leave_room
    with pytest.raises(SystemExit):
        parse_args(["--yaml", "x.yaml", "--reserve", "maybe"])
    with pytest.raises(SystemExit):
        parse_args(["--yaml", "x.yaml", "--movable-fraction", "2"])
    assert args.remedies.yield_after_s is None  # reservations never yield unless told
    assert parse_args(["--yaml", "x.yaml", "--hold-yield-after", "60"]).remedies.yield_after_s == 60.0
    with pytest.raises(SystemExit):
        parse_args(["--yaml", "x.yaml", "--hold-yield-after", "-1"])


def test_cli_json_carries_evictions_per_1000_placed_in_mean_and_every_seed(capsys):
    example = Path(engine.__file__).parent / "examples" / "inference-cluster.yaml"
    argv = ["timeline", "--yaml", str(example), "--days", "1", "--warmup-days", "0.25", "--rho", "1.2"]
    assert cli.main([*argv, "--seeds", "2", "--json"]) == 0
    off = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert off["mean"]["evictions_per_1000_placed"] == 0.0
    on = ["--leave-room", "on", "--reserve", "on", "--consolidate", "on", "--movable-fraction", "1"]
    assert cli.main([*argv, "--seeds", "2", "--json", *on]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for entry in [doc["mean"], *doc["seeds"]]:
        assert entry["evictions_per_1000_placed"] >= 0
    assert doc["mean"]["evictions_per_1000_placed"] == pytest.approx(
        sum(s["evictions_per_1000_placed"] for s in doc["seeds"]) / 2, abs=0.002
    )


@pytest.mark.parametrize("name", ["binpack", "bestfit", "frag"])
def test_the_quick_retry_on_held_nodes_places_as_the_pod_by_pod_one(name):
    """RemedyTimeline retries a held node checking only each demand's head and the holders: the same pods
    start at the same times on the same GPUs as the pod-by-pod retry (`exact_retry`), with priorities and
    several holds of different priorities standing at once."""
    w = churn(7)
    arrivals = poisson_arrivals(w, 1.2, days=1.5, cap_days=1, seed=3)
    options = RemedyOptions(
        leave_room=True,
        reserve=True,
        consolidate=True,
        limits=ReservationLimits(after_s=300, max_holds=3, max_share=0.5, ttl_s=2 * 3600),
        tick_s=60,
        consolidate_after_s=1200,
    )
    runs = {}
    holds_seen = {}
    for exact in (True, False):
        hooks = RemedyHooks(w, arrivals, options, seed=0)
        tl = RemedyTimeline(w, engine.build_policy(name, 0, w), arrivals, 0.25 * DAY, 1.5 * DAY, 0, hooks)
        tl.exact_retry = exact
        seen: set[tuple[int, ...]] = set()
        real_retry = tl.retry_on

        def spy(node, tl=tl, seen=seen, real=real_retry):
            here = tuple(sorted({h.priority for h in tl.hooks.holds if h.node == tl.hooks.names[node]}))
            if here:
                seen.add(here)
            real(node)

        tl.retry_on = spy
        tl.run()
        runs[exact] = (tl.started, sorted(tl.where.items()), [s for s, _, _ in tl.waiting()], hooks.evictions)
        holds_seen[exact] = seen
    assert holds_seen[True], "no retry ever ran on a held node: the test shows nothing"
    assert sum(s is not None and s > a.time for s, a in zip(runs[True][0], arrivals, strict=False)) > 20
    assert runs[False] == runs[True]
