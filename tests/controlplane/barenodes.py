"""Nodes without a kubelet: a Node object with our GPU annotation, capacity and a Ready condition.

Enough for kube-scheduler and the extender (they read only the Node object), for throughput benches
and scheduling tests where pods are only bound, never run."""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_MEM
from share_core.kube import ApiServerClient

MODEL = "NVIDIA A100-SXM4-80GB"


def gpus_annotation(name: str, gpus: int, mem: int, model: str = MODEL) -> str:
    items = [{"index": i, "uuid": f"GPU-{name}-{i}", "model": model, "memory": mem, "healthy": True}
             for i in range(gpus)]  # fmt: skip
    return orjson.dumps(items).decode()


def ready_condition() -> dict[str, str]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
            "lastTransitionTime": now}  # fmt: skip


def create_node(
    admin: ApiServerClient,
    name: str,
    resources: dict[str, str],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    addresses: list[dict[str, str]] | None = None,
) -> None:
    """One Node object, Ready, with `resources` as its capacity and allocatable (no kubelet behind it)."""
    metadata: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
    if annotations:
        metadata["annotations"] = annotations
    admin.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": metadata})
    status: dict[str, Any] = {"capacity": resources, "allocatable": resources, "conditions": [ready_condition()]}
    if addresses:
        status["addresses"] = addresses
    admin.request(
        "PATCH", f"/api/v1/nodes/{name}/status", body={"status": status}, content_type="application/merge-patch+json"
    )


def create_bare_nodes(
    admin: ApiServerClient,
    names: Iterable[str],
    gpus: int,
    mem: int,
    threads: int = 16,
    extra: dict[str, str] | None = None,
) -> None:
    """Create each node and set its status (capacity of RESOURCE_MEM = gpus x mem, plus `extra`), in parallel."""

    def make(name: str) -> None:
        res = {"cpu": "256", "memory": "2Ti", "pods": "1000", RESOURCE_MEM: str(gpus * mem), **(extra or {})}
        create_node(admin, name, res, {"gpushare": "true"}, {ANN_NODE_GPUS: gpus_annotation(name, gpus, mem)})

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(make, names))


def gpu_pod(namespace: str, name: str, scheduler: str, mem: int) -> dict[str, Any]:
    """A pod asking `mem` units of GPU memory from `scheduler`; it never runs (no kubelet)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "none", "resources": {"limits": {RESOURCE_MEM: str(mem)}}}],
            "terminationGracePeriodSeconds": 0,
        },
    }
