"""The timeline engine against timelines worked out by hand, and its fast retry against the full one."""

from __future__ import annotations

import random

import pytest

from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import held_units
from share_placement import BestFitPolicy
from share_placement import BinpackPolicy
from share_scheduler.sim.cluster import ClusterState
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.timeline import DAY
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.timeline import Timeline
from share_scheduler.sim.timeline import TimelineHooks
from share_scheduler.sim.timeline import arrival_rate
from share_scheduler.sim.timeline import percentile
from share_scheduler.sim.timeline import poisson_arrivals
from share_scheduler.sim.timeline import simulate_timeline
from share_scheduler.sim.timeline import trace_arrivals
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload

# Pods by index: 0 share 600, 1 share 300, 2 whole, 3 two GPUs, 4 CPU-only, 5 whole at priority 2.
PODS = (
    SimPod("share600", 600, 1, cpu=1000, duration=100.0),
    SimPod("share300", 300, 1, cpu=1000, duration=100.0),
    SimPod("whole", 1000, 1, cpu=1000, duration=100.0),
    SimPod("pair", 1000, 2, cpu=1000, duration=100.0),
    SimPod("cpu", 0, 0, cpu=1000, duration=100.0),
    SimPod("urgent", 1000, 1, cpu=1000, priority=2, duration=100.0),
)


def one_gpu(nodes: int = 1) -> Workload:
    return Workload(tuple(SimNode(f"n{i}", "T4", (1000,), cpu=64000, memory=10**6) for i in range(nodes)), PODS)


def run(workload: Workload, arrivals: list[Arrival], end: float, warmup: float = 0.0, **kw) -> Timeline:
    tl = Timeline(workload, BinpackPolicy(), arrivals, warmup, end, **kw)
    tl.run()
    return tl


def test_a_pod_that_fits_runs_at_once_and_leaves_after_its_duration():
    # t=0 share600 placed, leaves at 100; t=150 whole placed (the GPU is free again), leaves at 250.
    tl = run(one_gpu(), [Arrival(0, 0, 100), Arrival(150, 2, 100)], end=300)
    assert tl.started == [0.0, 150.0]
    r = tl.result()
    # GPU units x seconds: 600 x 100 + 1000 x 100, over 1000 units x 300 s.
    assert r.alloc_pct == pytest.approx(100 * (600 * 100 + 1000 * 100) / (1000 * 300))
    assert r.classes["share"]["waited_pct"] == 0 and r.classes["whole"]["waited_pct"] == 0
    assert r.placed == 2 and r.arrivals == 2


def test_a_pod_that_fits_nowhere_waits_until_a_departure_frees_room():
    # share600 runs 0-100; whole arrives at 10, waits 90 s, runs 100-200.
    tl = run(one_gpu(), [Arrival(0, 0, 100), Arrival(10, 2, 100)], end=300)
    assert tl.started == [0.0, 100.0]
    r = tl.result()
    assert r.classes["whole"] == {
        "pods": 1,
        "waited_pct": 100.0,
        "p50_s": 90.0,
        "p99_s": 90.0,
        "max_s": 90.0,
        "waiting_at_end": 0,
    }
    # While the whole pod waited (10-100), 400 of 1000 units were free.
    assert r.free_while_waiting_pct == pytest.approx(40.0)
    assert r.gpu_waiting_time_pct == pytest.approx(100 * 90 / 300)


def test_departure_retries_waiting_pods_in_arrival_order_skipping_those_that_do_not_fit():
    # whole runs 0-100; share600 (t=1), share600 (t=2), share300 (t=3) wait. At 100 the first
    # share600 goes (400 left), the second does not fit, share300 does (100 left).
    arrivals = [Arrival(0, 2, 100), Arrival(1, 0, 100), Arrival(2, 0, 100), Arrival(3, 1, 100)]
    tl = run(one_gpu(), arrivals, end=150)
    assert tl.started == [0.0, 100.0, None, 100.0]
    r = tl.result()
    assert r.classes["share"]["waiting_at_end"] == 1
    # Waits: 99, 148 (still waiting at the end: counted up to it), 97.
    assert r.classes["share"]["max_s"] == 148.0
    assert r.classes["share"]["p50_s"] == 99.0


def test_higher_priority_goes_first_whatever_arrived_first():
    # whole runs 0-100; whole (priority 0, t=1) and urgent (priority 2, t=2) wait; at 100 urgent goes.
    tl = run(one_gpu(), [Arrival(0, 2, 100), Arrival(1, 2, 100), Arrival(2, 5, 100)], end=250)
    assert tl.started == [0.0, 200.0, 100.0]
    assert [seq for seq, _, _ in Timeline.waiting(tl)] == []


def test_waiting_view_is_in_queue_order():
    tl = run(one_gpu(), [Arrival(0, 2, 1000), Arrival(1, 2, 100), Arrival(2, 5, 100), Arrival(3, 0, 100)], end=50)
    assert [(seq, pod) for seq, pod, _ in tl.waiting()] == [(2, 5), (1, 2), (3, 0)]


def test_a_pod_that_never_fits_waits_to_the_end_and_counts_its_whole_wait():
    tl = run(one_gpu(2), [Arrival(10, 3, 100), Arrival(20, 4, 100)], end=1000)
    assert tl.started == [None, 20.0]
    r = tl.result()
    assert r.classes["multi"]["waiting_at_end"] == 1
    assert r.classes["multi"]["max_s"] == 990.0 and r.classes["multi"]["waited_pct"] == 100.0
    assert r.classes["cpu"]["waited_pct"] == 0.0


def test_departures_come_before_arrivals_at_the_same_instant():
    tl = run(one_gpu(), [Arrival(0, 2, 100), Arrival(100, 2, 100)], end=300)
    assert tl.started == [0.0, 100.0]
    assert tl.result().classes["whole"]["waited_pct"] == 0.0


def test_warmup_is_cut_from_every_figure():
    # whole at 0 runs to 100; share600 arrives at 50 and waits to 100 (in the warm-up: not counted);
    # share300 arrives at 160 (after the warm-up of 150) and runs at once.
    arrivals = [Arrival(0, 2, 100), Arrival(50, 0, 100), Arrival(160, 1, 100)]
    tl = run(one_gpu(), arrivals, end=250, warmup=150)
    r = tl.result()
    assert r.classes["share"]["pods"] == 1 and r.classes["share"]["waited_pct"] == 0.0
    assert r.classes["whole"]["pods"] == 0 and r.classes["whole"]["waited_pct"] is None
    # Allocation over [150, 250]: share600 (100-200) for 50 s, share300 (160-260) for 90 s.
    assert r.alloc_pct == pytest.approx(100 * (600 * 50 + 300 * 90) / (1000 * 100))
    assert r.arrivals == 1 and r.placed == 1  # share600 was placed at 100, in the warm-up


def test_duration_cap_and_rate_of_poisson_arrivals():
    long = SimPod("long", 1000, 1, duration=3 * DAY)
    short = SimPod("short", 500, 1, duration=DAY / 2)
    never = SimPod("pending", 1000, 1, duration=None)  # never ran: left out
    cpu = SimPod("cpu", 0, 0, duration=600.0)
    w = Workload((SimNode("n", "T4", (1000,) * 8),), (long, short, never, cpu))
    # Mean over the three runnable pods of units x capped duration: (1000 x 1 day + 500 x 0.5 day + 0) / 3.
    work = (1000 * DAY + 500 * DAY / 2) / 3
    assert arrival_rate(w, 0.9, cap_days=1) == pytest.approx(0.9 * 8000 / work)
    arrivals = poisson_arrivals(w, 0.9, days=200, cap_days=1, seed=3)
    assert {a.pod for a in arrivals} == {0, 1, 3}
    assert max(a.duration for a in arrivals) == DAY
    assert all(a.duration == DAY for a in arrivals if a.pod == 0)
    assert all(0 <= a.time < 200 * DAY for a in arrivals)
    assert [a.time for a in arrivals] == sorted(a.time for a in arrivals)
    # Offered GPU-seconds over the window: rho x capacity x time, within the Poisson noise.
    offered = sum(w.pods[a.pod].gpu_request * a.duration for a in arrivals)
    assert offered / (8000 * 200 * DAY) == pytest.approx(0.9, rel=0.1)
    assert poisson_arrivals(w, 0.9, days=2, cap_days=1, seed=3) == [a for a in arrivals if a.time < 2 * DAY]


def test_trace_arrivals_keep_the_order_and_compress_the_times():
    pods = (
        SimPod("b", 500, 1, duration=50.0, created=1000.0),
        SimPod("a", 500, 1, duration=2 * DAY, created=400.0),
        SimPod("pending", 500, 1, duration=None, created=500.0),
        SimPod("c", 500, 1, duration=10.0, created=1000.0),
    )
    w = Workload((SimNode("n", "T4", (1000,)),), pods)
    got = trace_arrivals(w, compress=2, cap_days=1)
    assert got == [Arrival(0.0, 1, DAY), Arrival(300.0, 0, 50.0), Arrival(300.0, 3, 10.0)]
    assert trace_arrivals(w, compress=2, cap_days=1, days=200 / DAY) == [Arrival(0.0, 1, DAY)]


def test_percentile_is_nearest_rank():
    values = sorted([5.0, 1.0, 3.0, 2.0, 4.0])
    assert percentile(values, 50) == 3.0 and percentile(values, 99) == 5.0 and percentile(values, 1) == 1.0


def test_hooks_can_hold_a_node_against_a_pod():
    class HoldFirstNode(TimelineHooks):
        """Node 0's GPU counted as taken for everyone but arrival 1."""

        def __init__(self) -> None:
            self.events = 0

        def held(self, timeline, seq):
            if seq == 1:
                return None
            gpus, cpu, mem = timeline.cluster.view(0)
            return {0: (tuple((m, 0) for m, _ in gpus), cpu, mem)}

        def after_event(self, timeline, now):
            self.events += 1

    hooks = HoldFirstNode()
    # Binpack ties go to the first node; with node 0 held, arrival 0 goes to node 1, arrival 1 to node 0,
    # arrival 2 finds both taken (node 0 held) and waits until arrival 0 leaves node 1.
    tl = run(one_gpu(2), [Arrival(0, 2, 100), Arrival(1, 2, 100), Arrival(2, 2, 100)], end=300, hooks=hooks)
    assert tl.started == [0.0, 1.0, 100.0]
    # 3 arrivals and the 3 departures that happen before 300 (the third leaves at 200).
    assert hooks.events == 6


def churn(seed: int) -> Workload:
    """A small cluster of mixed nodes and a mix of pods, to churn hard."""
    rng = random.Random(seed)
    nodes = tuple(
        SimNode(f"n{i}", rng.choice(["T4", "V100"]), (1000,) * rng.choice([1, 2, 4, 8]), cpu=rng.choice([32000, 96000]))
        for i in range(12)
    )
    pods = []
    for i in range(40):
        kind = rng.random()
        per, count = (rng.choice([250, 300, 500, 700]), 1) if kind < 0.45 else (1000, 1) if kind < 0.8 else (0, 0)
        if 0.8 <= kind < 0.9:
            per, count = 1000, rng.choice([2, 4])
        pods.append(
            SimPod(
                f"p{i}",
                per,
                count,
                models=("v100",) if rng.random() < 0.1 and count else (),
                cpu=rng.choice([1000, 4000, 16000]),
                priority=rng.choice([0, 0, 1, 2]),
                duration=rng.uniform(60, 4 * 3600),
            )
        )
    return Workload(nodes, tuple(pods))


@pytest.mark.parametrize("name", ["bestfit", "binpack", "frag", "fgd"])
def test_retrying_only_the_node_that_changed_equals_retrying_everything(name):
    w = churn(7)
    arrivals = poisson_arrivals(w, 1.1, days=1.5, cap_days=1, seed=2)
    placements = {}
    for retry in ("node", "full"):
        tl = Timeline(w, build_policy(name, 0, w), arrivals, 0.25 * DAY, 1.5 * DAY, seed=0, retry=retry)
        tl.run()
        placements[retry] = (tl.started, sorted(tl.where.items()), [s for s, _, _ in tl.waiting()])
    started, _, waiting = placements["node"]
    assert sum(s is not None and s > a.time for s, a in zip(started, arrivals, strict=False)) > 20  # pods waited
    assert waiting  # and some still wait
    assert placements["node"] == placements["full"]


@pytest.mark.parametrize("name", ["bestfit", "frag", "random"])
def test_a_pod_of_a_waiting_demand_queued_without_a_search_waits_as_a_searched_one(name, monkeypatch):
    """The shortcut for a demand that already waits leaves every placement and the random policy's
    draws as they were (it draws what the failed search would have)."""
    w = churn(7)
    arrivals = poisson_arrivals(w, 1.3, days=1.5, cap_days=1, seed=4)
    runs = {}
    for skip in (True, False):
        monkeypatch.setattr(Timeline, "skip_search_for_waiting", skip)
        tl = Timeline(w, build_policy(name, 0, w), arrivals, 0.25 * DAY, 1.5 * DAY, seed=0)
        tl.run()
        runs[skip] = (tl.started, sorted(tl.where.items()), [s for s, _, _ in tl.waiting()])
    started = runs[True][0]
    assert sum(s is None or s > a.time for s, a in zip(started, arrivals, strict=False)) > 50  # many waited
    assert runs[True] == runs[False]


def test_simulate_timeline_is_deterministic_and_samples_a_series():
    w = churn(3)
    arrivals = poisson_arrivals(w, 0.9, days=1, cap_days=1, seed=0)
    a = simulate_timeline(w, BestFitPolicy(cpu_spec=96000), arrivals, 0.2 * DAY, DAY, seed=1, sample_s=3600)
    b = simulate_timeline(w, BestFitPolicy(cpu_spec=96000), arrivals, 0.2 * DAY, DAY, seed=1, sample_s=3600)
    assert a.figures() == b.figures()
    assert a.series.times == [3600.0 * i for i in range(25)]
    assert len(a.series.alloc_pct) == 25 and all(len(v) == 25 for v in a.series.waiting.values())
    assert 0 < a.alloc_pct < 100


def test_bad_runs_are_refused_with_the_reason():
    w = one_gpu()
    with pytest.raises(ValueError, match="warmup"):
        Timeline(w, BinpackPolicy(), [], 100, 50)
    with pytest.raises(ValueError, match="time order"):
        Timeline(w, BinpackPolicy(), [Arrival(5, 0, 1), Arrival(1, 0, 1)], 0, 50)
    with pytest.raises(ValueError, match="retry"):
        Timeline(w, BinpackPolicy(), [], 0, 50, retry="sometimes")
    with pytest.raises(ValueError, match="rho"):
        poisson_arrivals(w, 0, 1)
    no_duration = Workload(w.nodes, (SimPod("x", 500, 1),))
    with pytest.raises(ValueError, match="no pod of the workload has a duration"):
        poisson_arrivals(no_duration, 0.9, 1)
    with pytest.raises(ValueError, match="creation time"):
        trace_arrivals(Workload(w.nodes, (SimPod("x", 500, 1, duration=5.0),)), 2)


@pytest.mark.parametrize("name", ["binpack", "frag", "fgd", "bestfit"])
def test_the_indexed_choice_is_the_scans_choice_as_the_cluster_churns(name):
    w = churn(11)
    cluster = ClusterState(w, build_policy(name, 0, w))
    rng = random.Random(5)
    running: list[tuple[int, int, tuple[int, ...]]] = []
    ndemands = len(cluster.demands)
    for step in range(600):
        if running and (rng.random() < 0.45 or step % 50 == 49):
            node, dix, positions = running.pop(rng.randrange(len(running)))
            cluster.release(node, dix, positions)
            continue
        dix = rng.randrange(ndemands)
        scan = cluster.best(dix)
        indexed = cluster.best_indexed(dix)
        assert (scan is None) == (indexed is None), (step, dix)
        if scan is None:
            continue
        if cluster.tie_rng is None:  # first node on ties: the very same node and GPUs
            assert indexed == scan, (step, dix)
        else:  # random ties: a node of the same best score
            assert indexed[1][0] == scan[1][0], (step, dix)
        node, ev = indexed
        cluster.place(node, dix, ev[1])
        running.append((node, dix, ev[1]))


def test_holds_from_share_core_reduce_the_room_only_of_the_pods_they_apply_to():
    class Reservation(TimelineHooks):
        """A reservation of node n0's GPU for arrival 2 (priority 0): same-or-lower priority pods see it taken."""

        hold = Hold(HoldKind.RESERVATION, "n0", (0,), 1000, 0, expires=1e12, holder_uid="2")

        def held(self, timeline, seq):
            pod = timeline.workload.pods[timeline.arrivals[seq].pod]
            return timeline.held_views(held_units([self.hold], pod.priority, str(seq))) or None

    # Arrival 0 (whole, priority 0) is kept off n0 and runs on n1; arrival 1 (urgent, priority 2) may take
    # n0 past the reservation; arrival 2, the holder, waits as both are taken, then gets n1 at 100.
    arrivals = [Arrival(0, 2, 100), Arrival(1, 5, 150), Arrival(2, 2, 100)]
    tl = run(one_gpu(2), arrivals, end=300, hooks=Reservation())
    assert tl.started == [0.0, 1.0, 100.0]
    assert tl.where == {} and tl.result().classes["whole"]["max_s"] == 98.0
    with pytest.raises(ValueError, match="node 'elsewhere'"):
        tl.held_views({"elsewhere": {0: 5}})
    with pytest.raises(ValueError, match="GPU 3 of node 'n0'"):
        tl.held_views({"n0": {3: 5}})


def test_a_hook_may_move_a_running_pod_and_its_old_departure_is_void():
    class MoveAtFifty(TimelineHooks):
        """At t=50, move arrival 0 from node 0 to node 1: it runs its whole duration anew there."""

        def after_event(self, timeline, now):
            if now >= 50 and 0 in timeline.where and timeline.where[0][0] == 0:
                node = timeline.release(0)
                timeline.place(0, 1, (0,))
                timeline.retry_on(node)

    # whole (100 s) on node 0 at t=0; the CPU-only pod arriving at 50 is the event after which the hook
    # moves it to node 1, where it runs to 50 + 100 = 150 (not 100); a second whole at 60 gets node 0.
    arrivals = [Arrival(0, 2, 100), Arrival(50, 4, 100), Arrival(60, 2, 100)]
    tl = run(one_gpu(2), arrivals, end=130, hooks=MoveAtFifty())
    assert tl.where[0] == (1, (0,)) and tl.where[2] == (0, (0,))
    assert tl.ends[0] == 150.0 and tl.ends[2] == 160.0
    assert tl.started == [0.0, 50.0, 60.0]  # the move is no wait
