"""A fixed cluster for the inspect tests: heterogeneous GPUs, an unhealthy GPU, pods in every state."""

from __future__ import annotations

from typing import Any

from share_core.assignment import Assignment
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.fake import FakeKube
from share_core.gpus import GpuInfo
from share_core.gpus import format_node_gpus


def node(name: str, ip: str | None, gpus: list[GpuInfo] | None = None, capacity: dict[str, str] | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "labels": {"gpushare": "true"}}
    if gpus is not None:
        meta["annotations"] = {ANN_NODE_GPUS: format_node_gpus(gpus)}
    status: dict[str, Any] = {"capacity": dict(capacity or {})}
    if ip:
        status["addresses"] = [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}]
    return {"metadata": meta, "status": status}


def pod(
    ns: str,
    name: str,
    node_name: str | None,
    mem: int,
    gpus: tuple[int, ...] = (),
    *,
    assigned: bool = True,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
) -> dict:
    ann = dict(annotations or {})
    if gpus:
        ann.update(Assignment(gpus, tuple(f"GPU-{node_name}-{i}" for i in gpus), mem, 1, assigned).to_annotations())
    limits = {RESOURCE_MEM: str(mem)} if mem else {}
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"namespace": ns, "name": name, "annotations": ann},
        "spec": spec,
        "status": {"phase": phase},
    }


def gpu(node_name: str, index: int, model: str, memory: int, healthy: bool = True) -> GpuInfo:
    return GpuInfo(index, f"GPU-{node_name}-{index}", model, memory, healthy)


NODES = [
    # Two GPU sizes on one node.
    node(
        "gpu-a",
        "10.0.0.11",
        [gpu("gpu-a", 0, "NVIDIA A100-SXM4-80GB", 80), gpu("gpu-a", 1, "Tesla T4", 16)],
        {RESOURCE_MEM: "96", RESOURCE_COUNT: "2"},
    ),
    # Four T4s, GPU2 unhealthy.
    node(
        "gpu-b",
        "10.0.0.12",
        [gpu("gpu-b", i, "Tesla T4", 16, healthy=i != 2) for i in range(4)],
        {RESOURCE_MEM: "64", RESOURCE_COUNT: "4"},
    ),
    # No annotation yet: capacity split over the GPU count.
    node("gpu-c", "10.0.0.13", None, {RESOURCE_MEM: "48", RESOURCE_COUNT: "2"}),
    # Not a GPU-share node.
    node("cpu-1", "10.0.0.21", None, {"cpu": "8"}),
]

PODS = [
    pod("default", "train-a", "gpu-a", 40, (0,)),
    pod("ml", "infer-b", "gpu-a", 8, (1,), assigned=False),
    pod("default", "done", "gpu-a", 20, (0,), phase="Succeeded"),
    pod("default", "cpu-only", "gpu-a", 0),
    pod("ml", "multi", "gpu-b", 16, (0, 1)),
    pod("default", "failed", "gpu-b", 16, (3,), phase="Failed"),
    pod("default", "waiting", "gpu-b", 4),
    pod("ml", "on-sick-gpu", "gpu-b", 4, (2,)),
    pod("ml", "notebook", "gpu-c", 10, (1,)),
    pod("ml", "garbage", "gpu-c", 4, annotations={"gpushare.io/gpu-index": "x"}),
    pod("default", "elsewhere", "cpu-1", 4, (0,)),
    pod("default", "unscheduled", None, 4),
]


def fake_cluster() -> FakeKube:
    kube = FakeKube()
    for n in NODES:
        kube.add_node(n)
    for p in PODS:
        kube.add_pod(p)
    return kube
