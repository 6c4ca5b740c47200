"""DRA allocations as inspect rows: pure functions from the API's ResourceSlices and ResourceClaims.

In DRA mode a node's GPUs are the devices of driver gpushare.io in the ResourceSlice(s) of its pool (one
device per GPU, its shared capacity `memory`), and what is promised on a GPU is what the allocated
ResourceClaims consumed from it (`status.allocation.devices.results[].consumedCapacity.memory`): the
kube-scheduler's own accounting, so inspect shows the figures it schedules by. A claim without
consumedCapacity (the DRAConsumableCapacity gate off) holds its device whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from share_core.contract import (
    DRA_ATTR_INDEX,
    DRA_ATTR_MODEL,
    DRA_ATTR_UUID,
    DRA_CAPACITY_MEMORY,
    MemoryUnit,
)
from share_core.contract import DRA_DRIVER_NAME as DRA_DRIVER
from share_core.request import InvalidRequest, parse_quantity

Obj = Mapping[str, Any]

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DraGpu:
    """One device of driver gpushare.io: a GPU of `node`, `memory_mib` of it shareable."""

    node: str
    device: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True


@dataclass(slots=True)
class DraClaim:
    """One allocated claim's share of the GPUs of one node: MiB per device name, the pods it is reserved for."""

    namespace: str
    name: str
    node: str
    devices: dict[str, int] = field(default_factory=dict)
    pods: list[tuple[str, str]] = field(default_factory=list)  # (namespace, name), from status.reservedFor


@dataclass(slots=True)
class DraState:
    """Everything DRA contributes to the report: GPUs per node, allocated claims, and what could not be read."""

    gpus: dict[str, list[DraGpu]] = field(default_factory=dict)
    claims: list[DraClaim] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)  # node -> problems ("" for no node)

    def problem(self, node: str, text: str) -> None:
        self.problems.setdefault(node, []).append(text)


def quantity_mib(value: Any, what: str) -> int:
    """A memory quantity ("80Gi", "4096Mi", bytes) in whole MiB, rounded down (never more than there is)."""
    if isinstance(value, str) and len(value) > 2 and value[:-2].isdigit():  # what slices and claims carry
        if value.endswith("Gi"):
            return int(value[:-2]) * 1024
        if value.endswith("Mi"):
            return int(value[:-2])
    q = parse_quantity(value, what)
    if q < 0:
        raise InvalidRequest(f"{what}: {value!r} is negative")
    return int(q // MIB)


def _attr(attrs: Mapping[str, Any], name: str) -> Any:
    """A device attribute by its plain or driver-qualified name; the value of its one typed field."""
    raw = attrs.get(name, attrs.get(f"{DRA_DRIVER}/{name}"))
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "version", "bool"):
        if kind in raw:
            return raw[kind]
    return None


def _capacity(caps: Mapping[str, Any], name: str) -> Any:
    cap = caps.get(name, caps.get(f"{DRA_DRIVER}/{name}"))
    return cap.get("value") if isinstance(cap, Mapping) else cap


def _healthy(device: Obj) -> bool:
    """A device tainted NoSchedule or NoExecute takes no new claims: shown like an unhealthy GPU."""
    return not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in device.get("taints") or [])


def slice_gpus(slices: Iterable[Obj], state: DraState) -> None:
    """The GPUs of every node from the gpushare.io slices; devices we cannot read become problems."""
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRA_DRIVER:
            continue
        node = str(spec.get("nodeName") or (spec.get("pool") or {}).get("name") or "")
        if not node:
            state.problem("", f"ResourceSlice {(s.get('metadata') or {}).get('name')}: no node")
            continue
        gpus = state.gpus.setdefault(node, [])
        for d in spec.get("devices") or []:
            name = str(d.get("name", ""))
            attrs = d.get("attributes") or {}
            try:
                memory = quantity_mib(_capacity(d.get("capacity") or {}, DRA_CAPACITY_MEMORY), f"device {name} memory")
                index = _attr(attrs, DRA_ATTR_INDEX)
                if not isinstance(index, int) or isinstance(index, bool):
                    raise InvalidRequest(f"device {name}: attribute index is {index!r}, not an int")
            except InvalidRequest as exc:
                state.problem(node, f"ResourceSlice {(s.get('metadata') or {}).get('name')}: {exc}")
                continue
            uuid, model = str(_attr(attrs, DRA_ATTR_UUID) or ""), str(_attr(attrs, DRA_ATTR_MODEL) or "")
            gpus.append(DraGpu(node, name, index, uuid, model, memory, _healthy(d)))
    for gpus in state.gpus.values():
        gpus.sort(key=lambda g: g.index)


def claim_shares(claims: Iterable[Obj], state: DraState) -> None:
    """Each allocated claim's memory on each gpushare.io device, per node (the result's pool)."""
    by_device = {(g.node, g.device): g for gpus in state.gpus.values() for g in gpus}
    for c in claims:
        meta = c.get("metadata") or {}
        status = c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        pods = [
            (ns, str(r.get("name", "")))
            for r in status.get("reservedFor") or []
            if r.get("resource") == "pods" and not r.get("apiGroup")
        ]
        per_node: dict[str, DraClaim] = {}
        for r in results:
            if r.get("driver") != DRA_DRIVER:
                continue
            node, device = str(r.get("pool", "")), str(r.get("device", ""))
            gpu = by_device.get((node, device))
            if gpu is None:
                state.problem(node, f"claim {ns}/{name}: device {device} of pool {node} is in no gpushare.io slice")
                continue
            consumed = r.get("consumedCapacity") or {}
            raw = consumed.get(DRA_CAPACITY_MEMORY, consumed.get(f"{DRA_DRIVER}/{DRA_CAPACITY_MEMORY}"))
            try:
                mib = gpu.memory_mib if raw is None else quantity_mib(raw, f"claim {ns}/{name} memory")
            except InvalidRequest as exc:
                state.problem(node, str(exc))
                continue
            share = per_node.setdefault(node, DraClaim(ns, name, node, pods=list(pods)))
            share.devices[device] = share.devices.get(device, 0) + mib
        state.claims.extend(per_node.values())


def dra_state(slices: Iterable[Obj], claims: Iterable[Obj]) -> DraState:
    state = DraState()
    slice_gpus(slices, state)
    claim_shares(claims, state)
    return state


def to_units(mib: int, unit: MemoryUnit, *, up: bool) -> int:
    """MiB in the report's unit: a GPU's total rounds down, an allocation up (never understate what is taken)."""
    if unit is MemoryUnit.MiB:
        return mib
    return math.ceil(mib / unit.mib) if up else mib // unit.mib
