"""DRA objects for nodes without a kubelet: a DeviceClass, one ResourceSlice per node, one
ResourceClaim per pod — what kube-scheduler's DRA plugin reads and writes, nothing else.

Shapes follow k8s.io/api resource/v1 (ResourceSlice spec.devices[].capacity with a requestPolicy and
allowMultipleAllocations, KEP-5075 consumable capacity; ResourceClaim spec.devices.requests[].exactly
with capacity.requests). The names are the product's (share_core.contract), so what the benches and
tests measure is what share-dra publishes. Used by bench/bench_dra.py and the side-by-side test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from share_core.contract import DRA_ATTR_MODEL
from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_DEVICE_CLASS
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import MemoryUnit
from share_dra.slices import resource_slice
from share_dra.slices import slice_spec
from share_node.backend import Gpu

RESOURCE_API = "/apis/resource.k8s.io/v1"


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER_NAME}"'}}]},
    }


def gpu_slice(node: str, gpus: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """The slice share-dra publishes for `node` with these GPUs: (model, memory in GiB) each."""
    inventory = [
        Gpu(index=i, uuid=f"GPU-{node}-{i}", model=model, memory_bytes=gib << 30, minor=i)
        for i, (model, gib) in enumerate(gpus)
    ]
    return resource_slice(slice_spec(node, inventory, MemoryUnit.GiB, generation=1))


def memory_claim(namespace: str, name: str, per_gpu: int, count: int = 1, models: Sequence[str] = ()) -> dict[str, Any]:
    """A claim for `count` GPUs with `per_gpu` GiB on each (models: any of these, by CEL)."""
    exactly: dict[str, Any] = {
        "deviceClassName": DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": count,
        "capacity": {"requests": {DRA_CAPACITY_MEMORY: f"{per_gpu}Gi"}},
    }
    if models:
        allowed = ", ".join(f'"{m}"' for m in models)
        expression = f'device.attributes["{DRA_DRIVER_NAME}"].{DRA_ATTR_MODEL} in [{allowed}]'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def claim_pod(namespace: str, name: str, claim: str | None, cpu_milli: int = 0, memory_mib: int = 0) -> dict[str, Any]:
    """A pod for the default scheduler that uses `claim` (None: no GPU); it never runs (no kubelet)."""
    requests = {}
    if cpu_milli:
        requests["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        requests["memory"] = f"{memory_mib}Mi"
    container: dict[str, Any] = {"name": "main", "image": "none", "resources": {"requests": requests}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if claim is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def allocated_devices(claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(pool, device, consumed memory quantity) of each device result of an allocated claim."""
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return [
        (r["pool"], r["device"], str((r.get("consumedCapacity") or {}).get(DRA_CAPACITY_MEMORY, "")))
        for r in results
        if r.get("driver") == DRA_DRIVER_NAME
    ]
