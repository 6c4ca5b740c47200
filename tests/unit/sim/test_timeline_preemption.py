"""share-sim's timeline with priority preemption, against timelines worked out by hand.

One node of two GPUs of 1000 units, binpack (first GPU among equals). Pods by index:
0 lowA 500 (priority 0, runs 25 s), 1 lowB 500 (0, 1000 s), 2 mid 900 (priority 1), 3 high 1000 (priority 2,
100 s), 4 small 400 (0), 5 peer 500 (priority 2), 6 vip 500 (priority 3). lowA and lowB fill GPU 0, mid
takes 900 of GPU 1.
"""

from __future__ import annotations

import json

import pytest

from share_placement import BinpackPolicy
from share_scheduler.sim.preemption import GRACE_S
from share_scheduler.sim.preemption import PreemptionTimeline
from share_scheduler.sim.preemption import num_candidates
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload

PODS = (
    SimPod("lowA", 500, 1, cpu=1000, duration=25.0),
    SimPod("lowB", 500, 1, cpu=1000, duration=1000.0),
    SimPod("mid", 900, 1, cpu=1000, priority=1, duration=1000.0),
    SimPod("high", 1000, 1, cpu=1000, priority=2, duration=100.0),
    SimPod("small", 400, 1, cpu=1000, duration=100.0),
    SimPod("peer", 500, 1, cpu=1000, priority=2, duration=1000.0),
    SimPod("vip", 500, 1, cpu=1000, priority=3, duration=1000.0),
)
FILLED = [Arrival(0, 0, 25), Arrival(1, 1, 1000), Arrival(2, 2, 1000)]


def workload() -> Workload:
    return Workload((SimNode("n0", "T4", (1000, 1000), cpu=64000, memory=10**6),), PODS)


def run(arrivals: list[Arrival], end: float = 1500, **kw) -> PreemptionTimeline:
    tl = PreemptionTimeline(workload(), BinpackPolicy(), arrivals, 0, end, **kw)
    tl.run()
    return tl


def test_priority_inversion_evicts_the_lowest_priority_gpu_and_holds_it_for_the_preemptor():
    # high (t=10) fits no GPU. GPU 1 could be freed by evicting mid (priority 1); GPU 0 by evicting lowA and
    # lowB (priority 0): the lower highest-victim priority wins, as kube-scheduler ranks candidates, though
    # it takes two pods. lowA finishes by itself at 25 (inside the 30 s grace); lowB goes at 40.
    # small (t=30, priority 0) would fit the 500 lowA left on GPU 0, but that is held for high: it waits.
    # At 40 high takes GPU 0; lowB comes back as a new pod for the rest of its time (1001 - 40 = 961 s).
    tl = run([*FILLED, Arrival(10, 3, 100), Arrival(30, 4, 100)])
    (p,) = tl.stats.preemptions
    assert (p.preemptor, p.time, p.victims, p.hold.gpus, p.outcome) == (3, 10, (0, 1), (0,), "placed")
    assert p.hold.per_gpu == 1000 and p.hold.priority == 2 and p.hold.expires == 10 + GRACE_S + 60
    assert tl.started[3] == 10 + GRACE_S
    # The recreated lowB (seq 5) and small wait until high leaves at 140; both fit GPU 0 then.
    assert [(a.time, a.pod, a.duration) for a in tl.arrivals[5:]] == [(40.0, 1, 961.0)]
    assert tl.started[4] == 140.0 and tl.started[5] == 140.0
    f = tl.result().figures()["preemption"]
    assert (f["preemptions"], f["victims"], f["wasted_preemptions"], f["recreated"]) == (1, 2, 0, 1)
    # Lost work: only lowB's (lowA finished): 39 s of half a GPU.
    assert f["lost_gpu_hours"] == pytest.approx(39 * 0.5 / 3600, abs=1e-3)
    assert f["by_priority"]["2"]["p50_s"] == GRACE_S


def test_without_preemption_the_high_priority_pod_waits_for_a_departure():
    tl = run([*FILLED, Arrival(10, 3, 100), Arrival(30, 4, 100)], preempt=False)
    assert tl.started[3] == 1001  # lowB leaves at 1001: GPU 0 whole again
    assert tl.started[4] == 30  # small takes the 500 lowA left on GPU 0
    f = tl.result().figures()["preemption"]
    assert f["preemptions"] == 0 and f["attempts"] == 0
    assert f["by_priority"]["2"]["p50_s"] == 991


def test_a_pod_of_higher_priority_may_take_held_room_and_the_preemption_is_wasted():
    # vip (priority 3, t=30) is not kept off by high's hold (it keeps off the same or lower priorities): it
    # takes the 500 lowA left on GPU 0. At 40 lowB is gone but high still does not fit; its hold expires at
    # 100 (wasted: two victims for nothing), it preempts again (mid, GPU 1) and runs at 130. The recreated
    # lowB takes GPU 0's 500 once the hold is gone (100); the recreated mid waits until high leaves (230).
    tl = run([*FILLED, Arrival(10, 3, 100), Arrival(30, 6, 1000)])
    first, second = tl.stats.preemptions
    assert (first.victims, first.outcome) == ((0, 1), "expired")
    assert (second.time, second.victims, second.hold.gpus, second.outcome) == (100.0, (2,), (1,), "placed")
    assert tl.started[3] == 100 + GRACE_S and tl.started[4] == 30
    assert [(a.time, a.pod) for a in tl.arrivals[5:]] == [(40.0, 1), (130.0, 2)]
    assert tl.started[5:] == [100.0, 230.0]
    f = tl.result().figures()["preemption"]
    assert (f["preemptions"], f["victims"], f["wasted_preemptions"], f["wasted_victims"]) == (2, 3, 1, 2)
    assert f["preemptions_placed_on_hold"] == 1


def test_the_lowest_priority_never_preempts_and_nothing_is_evicted_for_a_pod_no_victim_can_help():
    # small (priority 0) fits nowhere at 5 (GPU 0 full, GPU 1 has 100): nobody is lower, no dry run.
    tl = run([*FILLED, Arrival(5, 4, 100)])
    assert tl.stats.attempts == 0 and tl.started[3] == 25  # lowA's departure makes room
    # The second high arrives while only its peers run: a dry run finds no candidate; it waits, tries again
    # every retry_s, and runs when GPU 0 is whole again (the peers leave at 1000 and 1001).
    pods = [Arrival(0, 5, 1000), Arrival(1, 5, 1000), Arrival(2, 3, 5000), Arrival(3, 3, 100)]
    tl = run(pods, end=1200, retry_s=300)
    assert tl.started[2] == 2 and tl.started[3] == 1001
    assert tl.stats.preemptions == []
    assert tl.stats.attempts == 4  # at 3, then 303, 603, 903


class CheckedTimeline(PreemptionTimeline):
    """Checks after every event that no GPU is given more than it has, nor frees more than it holds."""

    def step(self, now: float) -> None:
        super().step(now)
        for node, totals in enumerate(self.gpu_total):
            frees = [f for _, f in self.cluster.view(node)[0]]
            assert all(0 <= f <= t for f, t in zip(frees, totals, strict=True)), (now, node, frees)


def test_busy_run_never_overcommits_and_accounts_for_every_preemption():
    arrivals = [Arrival(float(t), t % 6, 50.0 + 37 * (t % 5)) for t in range(0, 600, 7)]
    tl = CheckedTimeline(workload(), BinpackPolicy(), arrivals, 0, 2000)
    tl.run()
    f = tl.result().figures()["preemption"]
    assert f["preemptions"] > 0
    assert f["preemptions_placed_on_hold"] + f["wasted_preemptions"] + f["still_open"] == f["preemptions"]
    assert f["victims"] == sum(len(p.victims) for p in tl.stats.preemptions)
    # Every victim was of lower priority than its preemptor.
    for p in tl.stats.preemptions:
        assert all(tl.pod_priority[tl.arrivals[v].pod] < p.hold.priority for v in p.victims)


def test_candidate_count_is_upstreams():
    # calculateNumCandidates: 10 % of the nodes preemption might help, at least 100, at most all of them.
    assert num_candidates(50) == 50
    assert num_candidates(1000) == 100
    assert num_candidates(5000) == 500


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="grace_s"):
        PreemptionTimeline(workload(), BinpackPolicy(), FILLED, 0, 100, grace_s=-1)


def test_cli_preempt_on_and_off_print_preemption_figures(tmp_path, capsys):
    from share_scheduler.sim import cli

    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,2,T4\nn1,64000,100000,2,T4\n")
    header = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
    )
    rows = [
        "be,1000,10,1,600,,BE,Running,0,40000,0",
        "burst,1000,10,1,700,,Burstable,Running,0,20000,0",
        "ls,1000,10,1,1000,,LS,Running,0,3000,0",
        "ls2,1000,10,2,1000,,LS,Running,0,5000,0",
    ]
    pods.write_text(header + "\n" + "\n".join(rows) + "\n")
    common = ["timeline", "--nodes", str(nodes), "--pods", str(pods), "--rho", "1.2", "--days", "0.5"]
    common += ["--warmup-days", "0.1", "--seeds", "2", "--policy", "binpack", "--json"]
    figures = {}
    for mode in ("on", "off"):
        assert cli.main([*common, "--preempt", mode]) == 0
        row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        figures[mode] = row["mean"]["preemption"]
        assert all("preemption" in s for s in row["seeds"])
        assert set(figures[mode]["by_priority"]) == {"2", "1", "0"}
    assert figures["off"]["preemptions"] == 0 and figures["off"]["enabled"] is False
    assert figures["on"]["preemptions"] > 0 and figures["on"]["victims"] >= figures["on"]["preemptions"]
    # Preemption shortens the highest priority's waits.
    assert figures["on"]["by_priority"]["2"]["p99_s"] < figures["off"]["by_priority"]["2"]["p99_s"]
    # The table prints the preemption line too.
    assert cli.main([*[a for a in common if a != "--json"], "--preempt", "on"]) == 0
    out = capsys.readouterr().out
    assert "preemptions" in out and "waits per priority" in out


def test_the_hold_keeps_a_pod_of_the_same_priority_off_too():
    # peer (priority 2, like high) arrives at 30: the 500 lowA left on GPU 0 is held for high (kube-scheduler
    # counts a nominated pod against pods of no higher priority), so peer fits nowhere and preempts for
    # itself: mid on GPU 1 (GPU 0 is held, its lowB already terminating). high takes GPU 0 at 40, peer GPU 1
    # at 60.
    tl = run([*FILLED, Arrival(10, 3, 100), Arrival(30, 5, 1000)])
    first, second = tl.stats.preemptions
    assert (first.preemptor, first.hold.gpus, first.outcome) == (3, (0,), "placed")
    assert (second.preemptor, second.victims, second.hold.gpus, second.outcome) == (4, (2,), (1,), "placed")
    assert tl.started[3] == 10 + GRACE_S and tl.started[4] == 30 + GRACE_S
