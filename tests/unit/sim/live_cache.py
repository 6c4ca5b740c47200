"""A share-sim timeline's cluster as the extender's ClusterCache holds it, and the victim choice's input read
from that cache: what the live preempt path sees, for tests and bench/bench_preemption.py.

The cache is fed exactly as the pod and node watches feed it (`replace_nodes`, `replace_pods` with Node and
Pod objects: the gpushare.io/gpus annotation, bound pods with their gpu-index annotation, `spec.priority`,
CPU and memory requests). `live_preemption_node` reads a node back the way the extender's preemption does:
the cache's node state (each GPU's free units, its host room) and `pods_on` (each pod's priority, GPUs,
CPU, memory, whether it is terminating), through the extender's own `share_scheduler.preempt.preemption_nodes`,
the function its preempt verb and its own preemption call. Sim memory is in MiB; the cache counts bytes. Each
pod's `status.startTime` is EPOCH + its sim start, so the victim choice's last tie-break (start times) reads
the same order from both.
"""

from __future__ import annotations

import json
from datetime import UTC
from datetime import datetime
from typing import Any

from share_core.contract import ANN_ASSIGNED
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_INDEX
from share_core.contract import ANN_GPU_MEM
from share_core.contract import ANN_GPU_UUID
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_MEM
from share_placement.model import Demand
from share_placement.preemption import PreemptionNode
from share_scheduler.budgets import BudgetIndex
from share_scheduler.cache import ClusterCache
from share_scheduler.preempt import preemption_nodes
from share_scheduler.sim.timeline import Timeline

MIB = 2**20
EPOCH = 1_700_000_000  # sim time 0 as a wall-clock time (startTime must be a real date)


def node_object(tl: Timeline, node: int) -> dict[str, Any]:
    n = tl.workload.nodes[node]
    gpus = [
        {"index": i, "uuid": f"GPU-{n.name}-{i}", "model": n.model, "memory": mem, "healthy": True}
        for i, mem in enumerate(n.gpus)
    ]
    alloc = {RESOURCE_MEM: str(sum(n.gpus)), "pods": "1000"}
    if n.cpu is not None:
        alloc["cpu"] = f"{n.cpu}m"
    if n.memory is not None:
        alloc["memory"] = f"{n.memory}Mi"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": n.name, "labels": {"gpushare": "true"}, "annotations": {ANN_NODE_GPUS: json.dumps(gpus)}},
        "status": {"capacity": dict(alloc), "allocatable": alloc},
    }


def pod_object(tl: Timeline, seq: int) -> dict[str, Any]:
    """Running arrival `seq` as the API server shows it once our bind wrote its annotations."""
    pod = tl.workload.pods[tl.arrivals[seq].pod]
    node, positions = tl.where[seq]
    node_name = tl.workload.nodes[node].name
    requests: dict[str, str] = {}
    if pod.cpu:
        requests["cpu"] = f"{pod.cpu}m"
    if pod.memory:
        requests["memory"] = f"{pod.memory}Mi"
    limits = {RESOURCE_MEM: str(pod.per_gpu * pod.count)} if pod.count else {}
    annotations: dict[str, str] = {}
    if pod.count:
        annotations = {
            ANN_GPU_INDEX: ",".join(str(p) for p in positions),
            ANN_GPU_UUID: ",".join(f"GPU-{node_name}-{p}" for p in positions),
            ANN_GPU_MEM: str(pod.per_gpu * pod.count),
            ANN_ASSIGNED: "true",
        }
        if pod.count > 1:
            annotations[ANN_GPU_COUNT] = str(pod.count)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"a{seq}", "namespace": "sim", "uid": str(seq), "annotations": annotations},
        "spec": {
            "schedulerName": "gpushare-scheduler",
            "nodeName": node_name,
            "priority": tl.pod_priority[tl.arrivals[seq].pod],
            "containers": [{"name": "main", "image": "x", "resources": {"requests": requests, "limits": limits}}],
        },
        "status": {"phase": "Running", "startTime": start_time(tl.started[seq] or 0.0)},
    }


def start_time(sim_s: float) -> str:
    return datetime.fromtimestamp(EPOCH + int(sim_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cache_from_timeline(tl: Timeline) -> tuple[ClusterCache, dict[int, str]]:
    """An extender cache holding the timeline's nodes and running pods; and each running seq's pod key."""
    cache = ClusterCache()
    cache.replace_nodes([node_object(tl, i) for i in range(len(tl.workload.nodes))])
    pods = [pod_object(tl, seq) for seq in sorted(tl.where)]
    cache.replace_pods(pods)
    return cache, {int(p["metadata"]["uid"]): f"sim/{p['metadata']['name']}" for p in pods}


def live_preemption_node(cache: ClusterCache, name: str) -> PreemptionNode | None:
    """Node `name` as the extender's preemption reads it from the cache (None: unknown node), no PDBs, no
    holds."""
    nodes, _ = preemption_nodes(cache, BudgetIndex(), [name], {})
    return nodes[0] if nodes else None


def live_demand(demand: Demand) -> Demand:
    """A sim demand (memory in MiB) in the cache's units (bytes)."""
    return Demand(demand.per_gpu, demand.count, demand.models, demand.cpu, demand.memory * MIB)
