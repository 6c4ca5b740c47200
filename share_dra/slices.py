"""The node's ResourceSlice, as pure functions of its GPU inventory (resource.k8s.io/v1).

One pool per node (named after the node), one slice in it, one device per healthy GPU: `gpu-<index>` with
the attributes the DeviceClass and users select on, a `memory` capacity that claims consume in steps
(KEP-5075 consumable capacity, `allowMultipleAllocations: true`), so kube-scheduler itself packs claims
onto a GPU and never past its memory. An unhealthy GPU is withdrawn from the slice by default: nothing new
is allocated on it on every minor we support, and claims already allocated on it keep their allocation
(kubelet has prepared them). `unhealthy="taint"` keeps it listed with a NoSchedule taint instead, so people
see it and why; that needs DRADeviceTaints (on by default from 1.36; an API server without it drops taints).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from share_core.contract import DRA_ATTR_DRIVER_VERSION
from share_core.contract import DRA_ATTR_INDEX
from share_core.contract import DRA_ATTR_MODEL
from share_core.contract import DRA_ATTR_UUID
from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import DRA_TAINT_UNHEALTHY
from share_core.contract import DRA_UNHEALTHY_TAINT
from share_core.contract import DRA_UNHEALTHY_WITHDRAW
from share_core.contract import MemoryUnit
from share_core.contract import dra_device_name
from share_node.backend import Gpu

Obj = dict[str, Any]
RESOURCE_API = "resource.k8s.io/v1"
# Longest string attribute value the API server accepts (resource.k8s.io DeviceAttributeMaxValueLength).
ATTRIBUTE_MAX_LEN = 64


def quantity(mib: int) -> str:
    """A Kubernetes quantity for `mib` MiB, in Gi when whole (what people read in the slice)."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def capacity_mib(gpu: Gpu, unit: MemoryUnit) -> int:
    """The memory a GPU offers, rounded down to whole units (never advertise memory it lacks)."""
    return gpu.memory_mib // unit.mib * unit.mib


def semver(version: str) -> str | None:
    """NVIDIA's driver version as the semantic version a `version` attribute must be ("535.104.05" ->
    "535.104.5", "550.54" -> "550.54.0"); None when it has no such shape."""
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"\d+", p) for p in parts):
        return None
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)


def device(gpu: Gpu, unit: MemoryUnit, driver_version: str = "", unhealthy: str = DRA_UNHEALTHY_WITHDRAW) -> Obj:
    """The slice entry of one GPU (tainted NoSchedule when unhealthy and `unhealthy` is "taint")."""
    step = quantity(unit.mib)
    attrs: Obj = {
        DRA_ATTR_MODEL: {"string": gpu.model[:ATTRIBUTE_MAX_LEN]},
        DRA_ATTR_UUID: {"string": gpu.uuid[:ATTRIBUTE_MAX_LEN]},
        DRA_ATTR_INDEX: {"int": gpu.index},
    }
    version = semver(driver_version) if driver_version else None
    if version:
        attrs[DRA_ATTR_DRIVER_VERSION] = {"version": version}
    out: Obj = {
        "name": dra_device_name(gpu.index),
        "attributes": attrs,
        "capacity": {
            DRA_CAPACITY_MEMORY: {
                "value": quantity(capacity_mib(gpu, unit)),
                "requestPolicy": {"default": step, "validRange": {"min": step, "step": step}},
            }
        },
        "allowMultipleAllocations": True,
    }
    if not gpu.healthy and unhealthy == DRA_UNHEALTHY_TAINT:
        out["taints"] = [{"key": DRA_TAINT_UNHEALTHY, "effect": "NoSchedule"}]
    return out


def offered(gpus: Sequence[Gpu], unit: MemoryUnit, unhealthy: str = DRA_UNHEALTHY_WITHDRAW) -> list[Gpu]:
    """The GPUs the slice lists: those with at least one unit of memory, healthy ones only unless tainting."""
    if unhealthy not in (DRA_UNHEALTHY_WITHDRAW, DRA_UNHEALTHY_TAINT):
        raise ValueError(f"unhealthy GPUs: {unhealthy!r} is neither withdraw nor taint")
    keep_unhealthy = unhealthy == DRA_UNHEALTHY_TAINT
    return [g for g in gpus if (g.healthy or keep_unhealthy) and capacity_mib(g, unit) >= unit.mib]


def in_order(gpus: Sequence[Gpu], order: Sequence[int] = ()) -> list[Gpu]:
    """The GPUs as `order` lists their indices (the policy's preference: kube-scheduler's allocator takes
    the first that fits); any it does not name follow in index order."""
    rank = {index: i for i, index in enumerate(order)}
    return sorted(gpus, key=lambda g: (rank.get(g.index, len(rank)), g.index))


def slice_spec(
    node: str,
    gpus: Sequence[Gpu],
    unit: MemoryUnit,
    generation: int,
    driver_version: str = "",
    unhealthy: str = DRA_UNHEALTHY_WITHDRAW,
    order: Sequence[int] = (),
) -> Obj:
    """The spec of the node's one slice; `generation` is the pool's (bumped on every change); devices
    listed in `order` (GPU indices; empty: index order)."""
    listed = in_order(offered(gpus, unit, unhealthy), order)
    return {
        "driver": DRA_DRIVER_NAME,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "devices": [device(g, unit, driver_version, unhealthy) for g in listed],
    }


def slice_name(node: str) -> str:
    """The slice's object name: one per node and driver, stable across restarts."""
    return f"{node}-{DRA_DRIVER_NAME}"


def resource_slice(spec: Obj) -> Obj:
    """The whole ResourceSlice object to create for a `slice_spec`."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(spec["nodeName"])},
        "spec": spec,
    }


def same_devices(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """True when a slice read from the API server already lists what `wanted` lists (generation aside).

    Compared on the fields we set, so defaults the API server adds do not look like a change."""

    def ours(spec: Mapping[str, Any]) -> Any:
        return (
            spec.get("driver"),
            spec.get("nodeName"),
            (spec.get("pool") or {}).get("name"),
            [
                (
                    d.get("name"),
                    d.get("attributes") or {},
                    {k: (v.get("value"), v.get("requestPolicy")) for k, v in (d.get("capacity") or {}).items()},
                    bool(d.get("allowMultipleAllocations")),
                    sorted((t.get("key"), t.get("value", ""), t.get("effect")) for t in d.get("taints") or []),
                )
                for d in spec.get("devices") or []
            ],
        )

    return ours(current) == ours(wanted)


def sharing_dropped(served: Mapping[str, Any], wanted: Mapping[str, Any] | None = None) -> str:
    """What of the sharing fields a served slice spec lacks ("" when intact): an API server with the
    DRAConsumableCapacity gate off drops `allowMultipleAllocations` and the capacity's `requestPolicy`, one
    with DRADeviceTaints off drops the `taints` we asked for (`wanted`)."""
    missing = set()
    asked = {d["name"] for d in (wanted or {}).get("devices") or [] if d.get("taints")}
    if any(d.get("name") in asked and not d.get("taints") for d in served.get("devices") or []):
        missing.add("taints (DRADeviceTaints)")
    for d in served.get("devices") or []:
        if not d.get("allowMultipleAllocations"):
            missing.add("allowMultipleAllocations")
        if any("requestPolicy" not in c for c in (d.get("capacity") or {}).values()):
            missing.add("capacity.requestPolicy")
    return ", ".join(sorted(missing))
