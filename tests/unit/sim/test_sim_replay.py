"""`simulate(order=..., placements=...)`: replaying one arrival order (the live-versus-simulated test's
simulated half) is the protocol run on exactly those arrivals, and each placement is reported."""

from __future__ import annotations

import random

from share_scheduler.placement import make_policy
from share_scheduler.sim.engine import simulate
from share_scheduler.sim.workload import SimNode, SimPod, Workload

NODES = (
    SimNode("n0", "T4", (1000, 1000), cpu=8000, memory=64_000),
    SimNode("n1", "T4", (1000, 1000), cpu=8000, memory=64_000),
    SimNode("n2", "V100", (1000,) * 4, cpu=4000, memory=64_000),
)
PODS = (
    SimPod("half", 500, 1, cpu=1000),
    SimPod("small", 250, 1, cpu=1000),
    SimPod("whole", 1000, 1, cpu=2000),
    SimPod("pair", 1000, 2, cpu=2000),
    SimPod("cpu", 0, 0, cpu=3000),
)


def seeded_draws(workload: Workload, seed: int, tune: float) -> list[int]:
    rng = random.Random(seed)
    out: list[int] = []
    requested = 0
    while requested < tune * workload.gpu_capacity:
        k = rng.randrange(len(workload.pods))
        out.append(k)
        requested += workload.pods[k].gpu_request
    return out


def test_replaying_the_seeded_draws_is_the_seeded_run():
    w = Workload(NODES, PODS)
    for policy in ("binpack", "frag"):
        drawn: list = []
        replayed: list = []
        a = simulate(w, make_policy(policy), 3, placements=drawn)
        b = simulate(w, make_policy(policy), 3, order=seeded_draws(w, 3, 1.3), placements=replayed)
        assert drawn == replayed and len(drawn) == a.arrivals == b.arrivals
        assert (a.placed, a.failed, a.final) == (b.placed, b.failed, b.final)


def test_an_order_arrives_whole_and_placements_name_node_and_gpus():
    w = Workload(NODES, PODS)
    placements: list = []
    # Far beyond tune x capacity: a given order arrives in full, failures included.
    order = [3, 3, 3, 3, 4, 4, 4, 4, 4, 0]
    r = simulate(w, make_policy("binpack"), 0, order=order, placements=placements)
    assert r.arrivals == len(order) == len(placements)
    assert placements[:4] == [(0, (0, 1)), (1, (0, 1)), (2, (0, 1)), (2, (2, 3))]
    # CPU-only pods take no GPU and 3 cores: two fit on n0 and two on n1 (6 cores left after "pair";
    # every node is full of GPU, so binpack ties and the first node goes first), none on n2 (0 left).
    assert [p[0] if p else None for p in placements[4:9]] == [0, 0, 1, 1, None]
    assert all(p is None or p[1] == () for p in placements[4:9])
    assert placements[9] is None  # no GPU left anywhere
    assert r.failed == placements.count(None) == 2
