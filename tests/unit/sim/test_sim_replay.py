"""`simulate(placements=...)`: every arrival and where it went, the simulated half of the
live-versus-simulated test (which replays the same arrivals through the cluster)."""

from __future__ import annotations

from share_placement import make_policy
from share_scheduler.sim.engine import simulate
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload

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


def test_every_arrival_is_recorded_with_its_node_and_gpus():
    w = Workload(NODES, PODS)
    placements: list = []
    r = simulate(w, make_policy("binpack"), 3, placements=placements)
    assert len(placements) == r.arrivals
    assert sum(1 for _, where in placements if where is None) == r.failed
    # Replaying the records rebuilds the final state the engine reports.
    free = [list(n.gpus) for n in NODES]
    cpu = [n.cpu for n in NODES]
    for k, where in placements:
        if where is None:
            continue
        node, positions = where
        assert len(positions) == PODS[k].count
        for p in positions:
            free[node][p] -= PODS[k].per_gpu
        cpu[node] -= PODS[k].cpu
    assert [[f for _, f in view[0]] for view in r.final] == free
    assert [view[1] for view in r.final] == cpu


def test_arrivals_depend_on_the_seed_not_the_policy():
    w = Workload(NODES, PODS)
    runs = {}
    for policy in ("binpack", "spread", "frag"):
        placements: list = []
        simulate(w, make_policy(policy), 5, placements=placements)
        runs[policy] = placements
    order = [k for k, _ in runs["binpack"]]
    assert all([k for k, _ in p] == order for p in runs.values())
    assert runs["binpack"] != runs["spread"]  # the same pods, placed differently
