"""DRA allocations as inspect rows: pure functions from the API's ResourceSlices and ResourceClaims.

In DRA mode a node's GPUs are the devices of driver gpushare.io in the ResourceSlice(s) of its pool (one
device per GPU, its shared capacity `memory`), and what is promised on a GPU is what the allocated
ResourceClaims consumed from it (`status.allocation.devices.results[].consumedCapacity.memory`): the
kube-scheduler's own accounting, so inspect shows the figures it schedules by. A claim without
consumedCapacity (the DRAConsumableCapacity gate off) holds its device whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from share_core.contract import DRA_DRIVER_NAME as DRA_DRIVER
from share_core.contract import MemoryUnit
from share_core.dra import DraGpu
from share_core.dra import claim_name
from share_core.dra import claim_pods
from share_core.dra import claim_results
from share_core.dra import quantity_mib
from share_core.dra import slice_devices

__all__ = ["DRA_DRIVER", "DraClaim", "DraGpu", "DraState", "dra_state", "quantity_mib", "to_units"]

Obj = Mapping[str, Any]


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


def slice_gpus(slices: Iterable[Obj], state: DraState) -> None:
    """The GPUs of every node from the gpushare.io slices; devices we cannot read become problems."""
    for s in slices:
        node, gpus, problems = slice_devices(s)
        for text in problems:
            state.problem(node, text)
        if node:
            state.gpus.setdefault(node, []).extend(gpus)
    for gpus in state.gpus.values():
        gpus.sort(key=lambda g: g.index)


def claim_shares(claims: Iterable[Obj], state: DraState) -> None:
    """Each allocated claim's memory on each gpushare.io device, per node (the result's pool)."""
    by_device = {(g.node, g.device): g for gpus in state.gpus.values() for g in gpus}
    for c in claims:
        ns, name = claim_name(c)
        pods = [(pns, pname) for pns, pname, _ in claim_pods(c)]
        results, problems = claim_results(c)
        for text in problems:
            state.problem("", text)
        per_node: dict[str, DraClaim] = {}
        for r in results:
            gpu = by_device.get((r.pool, r.device))
            if gpu is None:
                where = f"device {r.device} of pool {r.pool}"
                state.problem(r.pool, f"claim {ns}/{name}: {where} is in no {DRA_DRIVER} slice")
                continue
            mib = gpu.memory_mib if r.mib is None else r.mib
            share = per_node.setdefault(r.pool, DraClaim(ns, name, r.pool, pods=list(pods)))
            share.devices[r.device] = share.devices.get(r.device, 0) + mib
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
