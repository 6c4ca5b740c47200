"""How long `kubectl inspect gpushare` takes on a big cluster: 5,000 nodes x 8 GPUs, 50,000 pods.

Objects are built as the API server returns them (decoded from JSON bytes, as the adapter does), then
the report is built and rendered in each format. Run: python bench/bench_inspect.py [nodes] [pods] [--dra]
(--dra: the same cluster in DRA mode: share-dra's ResourceSlices, one allocated ResourceClaim per pod).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from share_core.assignment import Assignment
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.contract import MemoryUnit
from share_core.gpus import GpuInfo
from share_core.gpus import format_node_gpus
from share_dra.slices import resource_slice
from share_dra.slices import slice_spec
from share_inspect.dra import dra_state
from share_inspect.render import render_details
from share_inspect.render import render_json
from share_inspect.render import render_summary
from share_inspect.render import render_yaml
from share_inspect.report import build_report
from share_node.backend import Gpu

GPUS_PER_NODE = 8
MODELS = [("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA L4", 24), ("Tesla T4", 16)]


def cluster(n_nodes: int, n_pods: int, seed: int = 1) -> tuple[bytes, bytes]:
    """The two list responses, as JSON bytes."""
    rng = random.Random(seed)
    nodes, free = [], []
    for i in range(n_nodes):
        name = f"gpu-node-{i:05d}"
        model, mem = MODELS[i % len(MODELS)]
        gpus = [
            GpuInfo(g, f"GPU-{i:05d}-{g}-0000-0000-000000000000", model, mem, healthy=rng.random() > 0.001)
            for g in range(GPUS_PER_NODE)
        ]
        nodes.append(
            {
                "metadata": {
                    "name": name,
                    "labels": {"gpushare": "true", "kubernetes.io/hostname": name},
                    "annotations": {ANN_NODE_GPUS: format_node_gpus(gpus)},
                },
                "status": {
                    "capacity": {RESOURCE_MEM: str(mem * GPUS_PER_NODE), RESOURCE_COUNT: str(GPUS_PER_NODE)},
                    "addresses": [
                        {"type": "InternalIP", "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"},
                        {"type": "Hostname", "address": name},
                    ],
                },
            }
        )
        free.append([mem] * GPUS_PER_NODE)
    pods = []
    for j in range(n_pods):
        i = rng.randrange(n_nodes)
        g = rng.randrange(GPUS_PER_NODE)
        units = min(rng.choice((1, 2, 4, 8)), free[i][g])
        meta = {"name": f"job-{j:06d}", "namespace": f"team-{j % 40}", "uid": f"uid-{j}", "annotations": {}}
        phase = "Running"
        if units and rng.random() > 0.02:
            free[i][g] -= units
            meta["annotations"] = Assignment(
                (g,), (f"GPU-{i:05d}-{g}",), units, j, rng.random() > 0.01
            ).to_annotations()
        else:
            units = units or 1  # bound, asking, no GPU recorded: pending
        pods.append(
            {
                "metadata": meta,
                "spec": {
                    "nodeName": f"gpu-node-{i:05d}",
                    "schedulerName": "gpushare-scheduler",
                    "containers": [
                        {"name": "main", "image": "cuda", "resources": {"limits": {RESOURCE_MEM: str(units)}}}
                    ],
                },
                "status": {"phase": phase, "podIP": "10.244.0.1"},
            }
        )
    return orjson.dumps({"items": nodes}), orjson.dumps({"items": pods})


def dra_cluster(n_nodes: int, n_pods: int, seed: int = 1) -> tuple[bytes, bytes, bytes, bytes]:
    """Nodes, pods, ResourceSlices (share_dra.slices, as the plugin publishes them) and allocated claims."""
    rng = random.Random(seed)
    nodes, slices, free = [], [], []
    for i in range(n_nodes):
        name = f"gpu-node-{i:05d}"
        model, mem = MODELS[i % len(MODELS)]
        gpus = [Gpu(g, f"GPU-{i:05d}-{g}", model, mem << 30, minor=g) for g in range(GPUS_PER_NODE)]
        nodes.append(
            {"metadata": {"name": name}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}
        )
        slices.append(resource_slice(slice_spec(name, gpus, MemoryUnit.GiB, 1)))
        free.append([mem] * GPUS_PER_NODE)
    pods, claims = [], []
    for j in range(n_pods):
        i, g = rng.randrange(n_nodes), rng.randrange(GPUS_PER_NODE)
        units = min(rng.choice((1, 2, 4, 8)), free[i][g])
        if not units:
            continue
        free[i][g] -= units
        ns, name = f"team-{j % 40}", f"job-{j:06d}"
        pods.append({"metadata": {"name": name, "namespace": ns, "uid": f"uid-{j}"},
                     "spec": {"nodeName": f"gpu-node-{i:05d}", "containers": [{"name": "main"}]},
                     "status": {"phase": "Running"}})  # fmt: skip
        result = {"request": "gpu", "driver": "gpushare.io", "pool": f"gpu-node-{i:05d}", "device": f"gpu-{g}",
                  "consumedCapacity": {"memory": f"{units}Gi"}, "shareID": f"s-{j}"}  # fmt: skip
        claims.append({"metadata": {"name": f"{name}-gpu", "namespace": ns},
                       "status": {"allocation": {"devices": {"results": [result]}},
                                  "reservedFor": [{"resource": "pods", "name": name, "uid": f"uid-{j}"}]}})  # fmt: skip
    dump = orjson.dumps
    return dump({"items": nodes}), dump({"items": pods}), dump({"items": slices}), dump({"items": claims})


def timed(label: str, fn, *args):
    t0 = time.perf_counter()
    result = fn(*args)
    dt = time.perf_counter() - t0
    size = f"  ({len(result) / 1e6:.1f} MB)" if isinstance(result, str) else ""
    print(f"{label:<28}{dt:8.3f} s{size}")
    return result, dt


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--dra"]
    dra = "--dra" in sys.argv[1:]
    n_nodes = int(args[0]) if args else 5000
    n_pods = int(args[1]) if len(args) > 1 else 50000
    print(f"inspect{' (DRA mode)' if dra else ''}: {n_nodes} nodes x {GPUS_PER_NODE} GPUs, {n_pods} pods")
    if dra:
        raw = dra_cluster(n_nodes, n_pods)
        (nodes, pods, slices, claims), _ = timed(
            "decode API lists (orjson)", lambda: tuple(orjson.loads(r)["items"] for r in raw)
        )
        print(f"{'':<28}{len(slices)} slices, {len(claims)} claims")
        state, t_state = timed("read slices and claims", dra_state, slices, claims)
        report, t_build = timed("build report", lambda: build_report(nodes, pods, dra=state))
        t_build += t_state
    else:
        raw_nodes, raw_pods = cluster(n_nodes, n_pods)
        (nodes, pods), _ = timed(
            "decode API lists (orjson)", lambda: (orjson.loads(raw_nodes)["items"], orjson.loads(raw_pods)["items"])
        )
        report, t_build = timed("build report", build_report, nodes, pods)
    _, t_summary = timed("render summary", render_summary, report)
    _, t_details = timed("render details", render_details, report)
    _, t_json = timed("render json", render_json, report)
    timed("render yaml", render_yaml, report)
    print(f"{'build+summary':<28}{t_build + t_summary:8.3f} s")
    print(f"{'build+details':<28}{t_build + t_details:8.3f} s")
    print(f"{'build+json':<28}{t_build + t_json:8.3f} s")
    print(f"cluster: {report.allocated}/{report.total} {report.unit.value}, pending {report.pending}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
