"""The extender learns how long GPU pods run from those it sees leave, and a reservation goes where the
pods in the way are expected to leave soonest (share_placement.lifetimes, share_placement.starvation.ready_in)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC
from datetime import datetime

from share_core.contract import EVENT_RESERVED
from share_core.holds import HoldKind
from share_placement.lifetimes import GRID
from share_placement.lifetimes import MIN_SAMPLES
from tests.unit.scheduler.conftest import assigned_pod
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until
from tests.unit.scheduler.test_sched_starvation import CONFIG
from tests.unit.scheduler.test_sched_starvation import aged
from tests.unit.scheduler.test_sched_starvation import events
from tests.unit.scheduler.test_sched_starvation import flushed
from tests.unit.scheduler.test_sched_starvation import holds_on
from tests.unit.scheduler.test_sched_starvation import loop_of
from tests.unit.scheduler.test_sched_starvation import ready


def started(pod, seconds_ago):
    """`pod` running since `seconds_ago` (status.startTime)."""
    stamp = datetime.fromtimestamp(time.time() - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod.setdefault("status", {})["startTime"] = stamp
    pod["status"]["phase"] = "Running"
    return pod


def test_the_cache_learns_how_long_gpu_pods_ran_when_they_end_or_go(kube, extender_factory):
    kube.add_node(make_node("node-a", [16, 16]))
    kube.add_pod(started(assigned_pod("done", "node-a", 0, 4), 600))
    kube.add_pod(started(assigned_pod("gone", "node-a", 1, 4), 60))
    kube.add_pod(started(make_pod("cpu", 0, node="node-a"), 60))  # no GPU: not a GPU pod's run time
    ext = extender_factory()
    ext.wait_ready()
    life = ext.cache.lifetimes
    assert len(life) == 0
    kube.set_pod_phase("default", "done", "Succeeded")
    wait_until(lambda: len(life) == 1, what="the finished pod's run time")
    kube.delete_pod("default", "gone")
    kube.delete_pod("default", "cpu")
    wait_until(lambda: len(life) == 2, what="the deleted pod's run time")
    life.min_samples = 1
    # Ran ~600 s and ~60 s: a new pod is likely gone (even odds) once the shorter run's time has passed.
    assert 55 <= life.gone_by([0]) <= 80
    time.sleep(0.2)
    assert len(life) == 2  # the CPU-only pod taught nothing


def lifetimes_cluster(kube):
    """node-a: GPU 0 with 10 GiB taken by a pod that has just started; node-b: GPU 0 with 14 GiB taken by
    one that has run 50 minutes. Both nodes' GPU 1 full for good (a pod of 16 that has run a day)."""
    kube.add_node(make_node("node-a", [16, 16]))
    kube.add_node(make_node("node-b", [16, 16]))
    kube.add_pod(started(assigned_pod("a0", "node-a", 0, 10), 5))
    kube.add_pod(started(assigned_pod("b0", "node-b", 0, 14), 3000))
    kube.add_pod(started(assigned_pod("a1", "node-a", 1, 16), 86400))
    kube.add_pod(started(assigned_pod("b1", "node-b", 1, 16), 86400))
    kube.add_pod(aged(make_pod("big", 16), 120))


def taught(ext, runs=MIN_SAMPLES, seconds=3600.0):
    """As if `runs` GPU pods had been seen leaving after `seconds` each."""
    for _ in range(runs):
        ext.cache.lifetimes.observe(seconds)
    return ext


def test_a_reservation_goes_where_the_pods_in_the_way_are_expected_to_leave_soonest(kube, extender_factory):
    lifetimes_cluster(kube)
    ext = taught(ready(extender_factory(starvation=CONFIG), "default/big"))
    assert loop_of(ext).run_once().reserved == ["default/big"]
    [hold] = holds_on(kube, "big")
    # GPU pods have run an hour each: a0 has ~an hour left, b0 ~10 minutes: node-b, though more to drain.
    assert (hold.kind, hold.node, hold.gpus) == (HoldKind.RESERVATION, "node-b", (0,))
    assert hold.shortfall == (1, 14)
    message = events(flushed(ext).kube, EVENT_RESERVED)[0]["message"]
    minutes = next(t for t in GRID if t >= 600) / 60  # the run times' answer, in their grid's steps
    assert f"likely free (even odds) in {minutes:.0f} min by the run times of 100 pods that left" in message


def test_without_enough_departures_or_when_off_the_fewest_gpus_short_decides(kube, extender_factory):
    lifetimes_cluster(kube)
    ext = taught(ready(extender_factory(starvation=CONFIG), "default/big"), runs=MIN_SAMPLES - 1)
    assert loop_of(ext).run_once().reserved == ["default/big"]
    [hold] = holds_on(kube, "big")
    assert (hold.node, hold.gpus) == ("node-a", (0,))  # 10 GiB to drain against 14
    assert "likely free" not in events(flushed(ext).kube, EVENT_RESERVED)[0]["message"]


def test_the_switch_turns_it_off(kube, extender_factory):
    lifetimes_cluster(kube)
    ext = taught(ready(extender_factory(starvation=replace(CONFIG, by_lifetimes=False)), "default/big"))
    assert loop_of(ext).run_once().reserved == ["default/big"]
    assert holds_on(kube, "big")[0].node == "node-a"
