"""The pure half of the live-versus-simulated test: the openb sample, the arrival order, the objects.

Everything here is plain data and share-sim's own code; `test_live_vs_sim.py` drives the cluster.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

import share_placement as placement
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_MEM
from share_placement import Policy
from share_scheduler.sim.engine import SeedResult
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.engine import simulate
from share_scheduler.sim.workload import MILLI
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload

OPENB = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"
GATE = "gpushare.io/live-vs-sim"  # the scheduling gate every arrival waits behind until its turn

Placement = tuple[str, tuple[int, ...]] | None  # (node, GPU indices), or None: the pod failed


def sample_nodes(nodes: Sequence[SimNode], count: int, seed: int) -> tuple[SimNode, ...]:
    """`count` nodes drawn per GPU model in the trace's proportions (largest remainder), listed by name.

    Listed by name because that is where the two tie rules meet: share-sim takes the first node in
    input order, the extender the lowest name."""
    by_model: dict[str, list[SimNode]] = defaultdict(list)
    for n in nodes:
        by_model[n.model].append(n)
    quota = {m: count * len(v) / len(nodes) for m, v in by_model.items()}
    take = {m: int(q) for m, q in quota.items()}
    for m in sorted(quota, key=lambda m: (take[m] - quota[m], m))[: count - sum(take.values())]:
        take[m] += 1
    rng = random.Random(seed)
    picked = [n for m in sorted(by_model) for n in rng.sample(by_model[m], take[m])]
    return tuple(sorted(picked, key=lambda n: n.name))


def protocol_arrivals(workload: Workload, seed: int, tune: float) -> list[int]:
    """The pods share-sim's protocol draws for this seed (indices into `workload.pods`), in order.

    Whatever policy places them: the draws depend on the seed and the units asked, not on placement."""
    recorded: list[tuple[int, Any]] = []
    simulate(workload, placement.make_policy("binpack"), seed, tune, placements=recorded)
    return [k for k, _ in recorded]


def simulate_sample(
    nodes: Sequence[SimNode], population: Sequence[SimPod], seed: int, tune: float, policy: str, as_live: bool
) -> tuple[SeedResult, list[SimPod], list[Placement]]:
    """share-sim's engine on the sample: the run's result, the pods that arrived and where each went.

    The policy sees what the extender sees, the whole node (one view since issue 31). `as_live`: it has
    learned what the extender learns, the pods that arrive (the live run lists them all before the
    first is scheduled); else share-sim's own run (its policy taught the whole population)."""
    workload = Workload(tuple(nodes), tuple(population))
    arrivals = protocol_arrivals(workload, seed, tune)
    taught = Workload(tuple(nodes), tuple(population[k] for k in arrivals)) if as_live else workload
    chosen: Policy = build_policy(policy, seed, taught)
    raw: list[tuple[int, tuple[int, tuple[int, ...]] | None]] = []
    result = simulate(workload, chosen, seed, tune, placements=raw)
    assert [k for k, _ in raw] == arrivals, "the protocol's arrivals depend on the policy"
    # All GPUs are healthy and listed by index, so view positions are GPU indices.
    where = [None if w is None else (nodes[w[0]].name, tuple(sorted(w[1]))) for _, w in raw]
    return result, [population[k] for k in arrivals], where


def unallocated_at(
    nodes: Sequence[SimNode], arrivals: Sequence[SimPod], placements: Sequence[Placement], mark: int = 100
) -> float | None:
    """share-sim's `unallocated_pct[mark]` for these placements: 100 - GPU units placed / capacity, in %,
    once the units asked reach `mark` % of the capacity (engine.simulate's marks); None before."""
    capacity = sum(n.gpu_capacity for n in nodes)
    requested = placed = 0
    for p, where in zip(arrivals, placements, strict=True):
        requested += p.gpu_request
        if where is not None:
            placed += p.gpu_request
        if requested * 100 >= mark * capacity:
            return 100.0 - 100.0 * placed / capacity
    return None


def allocation_pct(nodes: Sequence[SimNode], arrivals: Sequence[SimPod], placements: Sequence[Placement]) -> float:
    """GPU units placed / the cluster's capacity, in percent."""
    capacity = sum(n.gpu_capacity for n in nodes)
    placed = sum(p.gpu_request for p, where in zip(arrivals, placements, strict=True) if where is not None)
    return 100.0 * placed / capacity


# --------------------------------------------------------------------------- API objects


def node_object(node: SimNode) -> dict[str, Any]:
    """A Node: one GPU of MILLI units per openb GPU (the extender runs with --memory-unit MiB, so a
    unit is a "MiB" and openb's gpu_milli maps one to one), the model in the annotation."""
    gpus = [
        {"index": i, "uuid": f"GPU-{node.name}-{i}", "model": node.model, "memory": mem, "healthy": True}
        for i, mem in enumerate(node.gpus)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {"kubernetes.io/hostname": node.name},
            "annotations": {ANN_NODE_GPUS: orjson.dumps(gpus).decode()},
        },
    }


def node_resources(node: SimNode) -> dict[str, str]:
    """Capacity = allocatable: the trace's CPU and memory, and the GPU units."""
    return {
        "cpu": f"{node.cpu or 0}m",
        "memory": f"{node.memory or 0}Mi",
        "pods": "1000",  # the protocol has no pod-count limit
        RESOURCE_MEM: str(node.gpu_capacity),
    }


def pod_object(name: str, pod: SimPod, scheduler: str) -> dict[str, Any]:
    """An arrival behind the scheduling gate: its trace CPU and memory as real requests, its GPU units
    as `nvidia.com/gpu-mem` (a multi-GPU pod asks count x per_gpu with `gpushare.io/gpu-count`); a
    CPU-only pod goes through the extender like any other (no pin: the policy places it)."""
    resources: dict[str, Any] = {"requests": {"cpu": f"{pod.cpu}m", "memory": f"{pod.memory}Mi"}}
    annotations: dict[str, str] = {}
    if pod.count:
        assert pod.per_gpu <= MILLI
        resources["limits"] = {RESOURCE_MEM: str(pod.per_gpu * pod.count)}
        if pod.count > 1:
            annotations[ANN_GPU_COUNT] = str(pod.count)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "schedulingGates": [{"name": GATE}],
        "containers": [{"name": "main", "image": "none", "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, "labels": {"trace-pod": pod.name}},
        "spec": spec,
    }
