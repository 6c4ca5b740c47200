"""A tiny share-sim timeline through the real control plane: pods created at their arrival, deleted at their
departure, kube-scheduler (the chart's configuration) and the extender (the chart's, on its ServiceAccount)
deciding when a waiting pod gets its turn (tests/integration/livetimeline.py).

Three nodes, five GPUs, 33 arrivals over 400 simulated seconds at 10x: five whole-GPU pods fill every
GPU, a 2-GPU pod and four half-GPU pods then have to wait for departures, and a steady mix follows. The
live run must free every departed pod's GPUs (the extender counts exactly the pods still bound), bind the
waiting pods only after a departure made room, never promise a GPU more than it has, and its figures,
computed by share-sim's own Timeline.result, must tell the same story as share-sim's run of the same
arrivals.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from share_core.contract import SCHEDULER_NAME
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.timeline import simulate_timeline
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload
from tests.controlplane import ControlPlane
from tests.integration.livefigures import live_figures
from tests.integration.livetimeline import CHART_SCHEDULER
from tests.integration.livetimeline import NAMESPACE
from tests.integration.livetimeline import run_live_timeline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

POLICY = "frag"  # the chart's default
COMPRESSION = 10.0  # simulated seconds per wall second
END_S = 400.0

NODES = (
    SimNode("tl-a", "T4", (1000, 1000), cpu=32000, memory=131072),
    SimNode("tl-b", "T4", (1000, 1000), cpu=32000, memory=131072),
    SimNode("tl-c", "T4", (1000,), cpu=32000, memory=131072),
)
PODS = (
    SimPod("whole", 1000, 1, cpu=1000, memory=2048),
    SimPod("share", 500, 1, cpu=1000, memory=2048),
    SimPod("multi", 1000, 2, cpu=2000, memory=4096),
    SimPod("cpu", 0, 0, cpu=2000, memory=4096),
)
WHOLE, SHARE, MULTI, CPU = range(4)


def arrivals() -> list[Arrival]:
    out = [Arrival(2.0 * k, WHOLE, 100.0 + 22.0 * k) for k in range(5)]  # every GPU taken, leaving from ~100 s
    out.append(Arrival(30.0, MULTI, 60.0))  # needs two free GPUs on one node: waits
    out += [Arrival(40.0 + 5.0 * k, SHARE, 30.0) for k in range(4)]  # wait for the first departure
    out += [Arrival(50.0 + 40.0 * k, CPU, 40.0) for k in range(3)]  # never wait
    mix = (SHARE, WHOLE, SHARE, CPU, SHARE, WHOLE)
    out += [Arrival(200.0 + 7.0 * k, mix[k % len(mix)], 40.0 + 3.0 * (k % 5)) for k in range(20)]
    return sorted(out, key=lambda a: a.time)


@pytest.fixture
def plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("live-timeline-plane"), k8s_bin_dir) as cp:
        yield cp


def test_live_timeline_frees_waits_and_agrees_with_share_sim(plane: ControlPlane, tmp_path: Path) -> None:
    assert CHART_SCHEDULER == SCHEDULER_NAME
    started = time.monotonic()
    workload = Workload(NODES, PODS, unit="milli-GPU")
    timeline = arrivals()
    policy = build_policy(POLICY, 0, Workload(NODES, tuple(PODS[a.pod] for a in timeline)))
    sim = simulate_timeline(workload, policy, timeline, 0.0, END_S)

    live = run_live_timeline(plane, tmp_path, POLICY, workload, timeline, COMPRESSION, END_S, sample_every_s=2.0)
    records = live.records

    # Every arrival was created, bound by the end and, but for the ones still running, deleted.
    assert all(r.created is not None for r in records)
    unbound = [i for i, r in enumerate(records) if r.bound is None]
    assert not unbound, f"arrivals never bound: {unbound}"
    assert not live.gpus_over, f"GPUs promised more than they have: {live.gpus_over[:5]}"

    # Every pod that departed freed its GPUs: the extender counts exactly the pods still bound, where bound.
    running = {
        f"{NAMESPACE}/t-{i:05d}": (r.node, r.gpus)
        for i, r in enumerate(records)
        if r.deleted is None and PODS[timeline[i].pod].count
    }
    assert live.extender_holds == running

    # The 2-GPU pod and the four half-GPU pods found every GPU taken and waited; each was bound only once
    # a departure had made room, the 2-GPU pod once both GPUs of one node were free.
    departures = sorted(r.deleted for r in records if r.deleted is not None)
    waiters = [i for i, a in enumerate(timeline) if a.pod in (MULTI, SHARE) and a.time < 100.0]
    assert len(waiters) == 5
    for i in waiters:
        r = records[i]
        assert r.waited, f"arrival {i} ({PODS[timeline[i].pod].name}) was bound at its first try"
        assert r.bound is not None and any(d <= r.bound for d in departures), (i, r, departures[:3])
    multi = records[next(i for i in waiters if timeline[i].pod == MULTI)]
    wholes = [records[i] for i, a in enumerate(timeline) if a.pod == WHOLE and a.time < 10.0]
    on_its_node = [w for w in wholes if w.node == multi.node]
    assert len(on_its_node) == 2 and all(w.deleted is not None and w.deleted <= multi.bound for w in on_its_node)
    assert all(not records[i].waited for i, a in enumerate(timeline) if a.pod == CPU)

    # The live figures, computed by share-sim's Timeline.result, beside share-sim's own.
    live_f = live_figures(workload, timeline, records, 0.0, END_S, policy).figures()
    sim_f = sim.figures()
    print(
        f"\nlive timeline: {len(timeline)} arrivals, allocation live {live_f['alloc_pct']:.2f} % / share-sim "
        f"{sim_f['alloc_pct']:.2f} %; multi waited p50 live {live_f['classes']['multi']['p50_s']} s / sim "
        f"{sim_f['classes']['multi']['p50_s']} s; replay {live.replay_s:.0f} s, whole test "
        f"{time.monotonic() - started:.0f} s"
    )
    for figures in (live_f, sim_f):
        assert figures["classes"]["multi"]["waited_pct"] == 100.0
        assert figures["classes"]["share"]["waited_pct"] > 0
        assert figures["classes"]["cpu"]["waited_pct"] == 0.0
        assert sum(c["waiting_at_end"] for c in figures["classes"].values()) == 0
    assert live_f["classes"]["multi"]["p50_s"] >= 60.0  # from 30 s to a departure after ~120 s
    assert abs(live_f["alloc_pct"] - sim_f["alloc_pct"]) <= 5.0
