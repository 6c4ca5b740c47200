"""The live and the simulated victim choice agree on the same cluster: one function
(`share_placement.preemption.choose_victims`), its input read once from share-sim's node states and once
from the extender's ClusterCache fed the same nodes and pods as the watches would, through the extender's
own `share_scheduler.preempt.preemption_nodes` (tests/unit/sim/live_cache.py)."""

from __future__ import annotations

import random

import pytest

from share_placement import BinpackPolicy
from share_placement.model import Demand
from share_placement.preemption import choose_victims
from share_scheduler.sim.preemption import PreemptionTimeline
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload
from tests.unit.sim.live_cache import cache_from_timeline
from tests.unit.sim.live_cache import live_demand
from tests.unit.sim.live_cache import live_preemption_node


def filled_timeline(seed: int) -> PreemptionTimeline:
    """Six nodes of four 16-unit GPUs, filled with random pods of priority 0-2 (1 or 2 GPUs, CPU, memory)."""
    rng = random.Random(seed)
    nodes = tuple(SimNode(f"n{i}", "T4", (16,) * 4, cpu=32000, memory=131072) for i in range(6))
    pods = tuple(
        SimPod(
            f"p{k}",
            rng.choice([2, 3, 4, 6, 8, 12, 16]),
            rng.choice([1, 1, 1, 2]),
            cpu=rng.choice([500, 1000, 4000]),
            memory=rng.choice([1024, 4096, 16384]),
            priority=rng.choice([0, 0, 1, 2]),
            duration=1000.0,
        )
        for k in range(40)
    )
    arrivals = [Arrival(float(t), rng.randrange(len(pods)), 10_000.0) for t in range(120)]
    tl = PreemptionTimeline(Workload(nodes, pods), BinpackPolicy(), arrivals, 0, 200, seed=seed, preempt=False)
    tl.run()
    return tl


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_live_and_sim_victim_choice_agree(seed):
    tl = filled_timeline(seed)
    assert len(tl.where) > 20, "the cluster should be busy"
    cache, _ = cache_from_timeline(tl)
    compared = with_victims = 0
    for per_gpu in (4, 12, 16):
        for count in (1, 2):
            for priority in (1, 3):
                demand = Demand(per_gpu, count, cpu=1000, memory=2048)
                sim_nodes = [tl.preemption_node(i, {}) for i in range(len(tl.workload.nodes))]
                live_nodes = [live_preemption_node(cache, n.name) for n in tl.workload.nodes]
                assert all(n is not None for n in live_nodes)
                # The same input: per node, each GPU's free units and each pod's priority, GPUs, CPU, memory.
                for s, lv in zip(sim_nodes, live_nodes, strict=True):
                    assert [(g.index, g.total, g.free) for g in s.gpus] == [(g.index, g.total, g.free) for g in lv.gpus]
                    assert sorted((p.uid, p.priority, p.gpus, p.cpu, p.memory * 2**20) for p in s.pods) == sorted(
                        (p.uid, p.priority, p.gpus, p.cpu, p.memory) for p in lv.pods
                    )
                    assert (s.cpu_free, s.memory_free * 2**20) == (lv.cpu_free, lv.memory_free)

                    # The same order of start times (the last tie-break), from the pods' startTime.
                    def by_start(pods):
                        return [p.uid for p in sorted(pods, key=lambda p: (p.start, p.uid))]

                    assert by_start(s.pods) == by_start(lv.pods)
                sim = choose_victims(sim_nodes, demand, priority)
                live = choose_victims(live_nodes, live_demand(demand), priority)  # type: ignore[arg-type]
                key = [(c.node, c.gpus, tuple(v.uid for v in c.victims), c.pdb_violations) for c in sim]
                assert key == [(c.node, c.gpus, tuple(v.uid for v in c.victims), c.pdb_violations) for c in live]
                compared += 1
                with_victims += any(c.victims for c in sim)
    assert with_victims >= 4, f"only {with_victims} of {compared} demands needed victims: the case is too easy"
