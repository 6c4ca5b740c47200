"""A ResourceClaim's allocation on this node, and the CDI spec that gives a container its share: pure functions.

kubelet's NodePrepareResources names a claim (namespace, name, UID); the plugin GETs it and reads
`status.allocation.devices.results`: the devices kube-scheduler chose for our driver in this node's pool,
each with the memory it consumed (`consumedCapacity.memory`, KEP-5075). The CDI spec per claim carries the
same env as the device plugin's Allocate answer (share_node.env.gpu_env), one CDI device per
(claim, request, device); where NVIDIA's own CDI spec defines the GPU, the answer names that device too, so
the runtime injects the GPU itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from decimal import InvalidOperation
from typing import Any

from share_core.contract import CDI_NVIDIA_GPU_KIND
from share_core.contract import DRA_CDI_KIND
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import DeviceListStrategy
from share_core.contract import MemoryUnit
from share_core.contract import dra_cdi_device
from share_core.contract import dra_device_name
from share_core.dra import claim_allocated
from share_core.dra import claim_results
from share_node.backend import Gpu
from share_node.env import gpu_env

# The spec-level `annotations` need 0.6.0: a runtime's CDI library rejects an older version that uses them
# ("the spec version must be at least v0.6.0", specs-go version.go requiresV060; seen with containerd 2.4).
CDI_VERSION = "0.6.0"

_SUFFIXES = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|)$")


class ClaimError(ValueError):
    """The claim cannot be prepared here; the message says why (kubelet shows it on the pod)."""


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity ("8Gi", "8589934592", "8G") in bytes, rounded up."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ClaimError(f"{text!r} is not a Kubernetes quantity")
    try:
        value = Decimal(m.group(1)) * Decimal(_SUFFIXES[m.group(2)])
    except InvalidOperation as exc:
        raise ClaimError(f"{text!r} is not a Kubernetes quantity") from exc
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def _device_json(d: AllocatedDevice | PreparedDevice, **fields: Any) -> dict[str, Any]:
    """A device of a claim as the checkpoint keeps it: where it is, what we add, its share."""
    return {"request": d.request, "pool": d.pool, "device": d.device, **fields, "shareID": d.share_id}


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device the scheduler allocated to a claim, and how much of its memory the claim consumed."""

    request: str
    pool: str
    device: str
    memory_mib: int | None  # None: no consumed capacity recorded (the device was allocated whole)
    share_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _device_json(self, memoryMiB=self.memory_mib)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AllocatedDevice:
        return cls(raw["request"], raw["pool"], raw["device"], raw.get("memoryMiB"), raw.get("shareID"))


def allocated_devices(claim: Mapping[str, Any], node: str) -> list[AllocatedDevice]:
    """Our driver's devices in this node's pool from a claim's allocation; raises when it has none."""
    meta = claim.get("metadata") or {}
    what = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    if not claim_allocated(claim):
        raise ClaimError(f"{what} is not allocated (status.allocation is empty): the scheduler has not placed it")
    results, problems = claim_results(claim)
    if problems:
        raise ClaimError(f"{what}: {'; '.join(problems)}")
    out = []
    for r in results:
        if r.pool != node:
            raise ClaimError(f"{what}: device {r.device} is allocated from pool {r.pool!r}, not this node's ({node!r})")
        out.append(AllocatedDevice(r.request, r.pool, r.device, r.mib, r.share_id))
    if not out:
        raise ClaimError(f"{what} has no device of driver {DRA_DRIVER_NAME} allocated")
    return out


def claim_pods(claim: Mapping[str, Any]) -> dict[str, str]:
    """Pod UID -> `namespace/name` of each pod the claim is reserved for (status.reservedFor)."""
    meta = claim.get("metadata") or {}
    out = {}
    for r in (claim.get("status") or {}).get("reservedFor") or []:
        if r.get("resource") == "pods" and r.get("uid"):
            out[str(r["uid"])] = f"{meta.get('namespace')}/{r.get('name')}"
    return out


def claim_memory(allocated: Sequence[AllocatedDevice], gpus: Sequence[Gpu]) -> dict[str, int]:
    """GPU UUID -> bytes the claim consumed on it (--hard-limit); a device allocated whole is not shared and
    takes no limit."""
    by_device = gpu_by_device(gpus)
    out: dict[str, int] = {}
    for a in allocated:
        gpu = by_device.get(a.device)
        if gpu is not None and a.memory_mib is not None:
            out[gpu.uuid] = out.get(gpu.uuid, 0) + a.memory_mib * 1024 * 1024
    return out


def gpu_by_device(gpus: Sequence[Gpu]) -> dict[str, Gpu]:
    """GPUs by their slice device name (`gpu-<index>`)."""
    return {dra_device_name(g.index): g for g in gpus}


def nvidia_cdi_names(specs: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The device names NVIDIA's CDI specs on the node define for kind `nvidia.com/gpu` (uuids, indexes)."""
    names: set[str] = set()
    for spec in specs:
        if spec.get("kind") == CDI_NVIDIA_GPU_KIND:
            names.update(str(d.get("name")) for d in spec.get("devices") or [] if d.get("name"))
    return frozenset(names)


def nvidia_cdi_device(gpu: Gpu, nvidia_names: frozenset[str]) -> str | None:
    """NVIDIA's fully qualified CDI name of a GPU (by UUID, else by index), when its spec defines one."""
    for name in (gpu.uuid, gpu.device_index):
        if name in nvidia_names:
            return f"{CDI_NVIDIA_GPU_KIND}={name}"
    return None


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """What NodePrepareResources answers for one allocated device."""

    request: str
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _device_json(self, cdiDeviceIDs=list(self.cdi_device_ids))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PreparedDevice:
        return cls(raw["request"], raw["pool"], raw["device"], tuple(raw["cdiDeviceIDs"]), raw.get("shareID"))


@dataclass(frozen=True, slots=True)
class Preparation:
    """A claim's CDI spec (its file name and content) and the devices to answer kubelet with."""

    spec_file: str
    spec: dict[str, Any]
    devices: tuple[PreparedDevice, ...]


def prepare(
    claim_uid: str,
    allocated: Sequence[AllocatedDevice],
    gpus: Sequence[Gpu],
    unit: MemoryUnit,
    nvidia_names: frozenset[str] = frozenset(),
    device_id_strategy: str = "uuid",
    spec_file: str = "",
) -> Preparation:
    """The CDI spec and kubelet answer for a claim's allocated devices.

    Every CDI device of the claim carries the claim's whole env (the same on each, so a container that gets
    several of them sees one consistent set); a device allocated whole (no consumed capacity) gets its
    GPU's whole memory as the limit."""
    by_name = gpu_by_device(gpus)
    claim_gpus: list[Gpu] = []
    limits: list[int] = []
    for a in allocated:
        gpu = by_name.get(a.device)
        if gpu is None:
            raise ClaimError(f"device {a.device} of claim {claim_uid} is not a GPU of this node ({sorted(by_name)})")
        claim_gpus.append(gpu)
        limits.append(gpu.memory_mib if a.memory_mib is None else a.memory_mib)
    # Deduplicate GPUs for the env (two requests may land on the same GPU): their limits add up.
    order: list[Gpu] = []
    per_gpu: dict[str, int] = {}
    for gpu, mib in zip(claim_gpus, limits, strict=True):
        if gpu.uuid not in per_gpu:
            order.append(gpu)
        per_gpu[gpu.uuid] = per_gpu.get(gpu.uuid, 0) + mib
    gpu_limits = [per_gpu[g.uuid] for g in order]
    limit: int | str = gpu_limits[0] if len(set(gpu_limits)) == 1 else ",".join(map(str, gpu_limits))
    nvidia = [nvidia_cdi_device(g, nvidia_names) for g in order]
    via_cdi = all(nvidia)
    env = gpu_env(
        order,
        limit_mib=limit,
        container_units=min(gpu_limits) // unit.mib,
        pod_units=sum(gpu_limits) // unit.mib,
        unit=unit,
        device_id_strategy=device_id_strategy,
        device_list_strategy=DeviceListStrategy.CDI_CRI if via_cdi else DeviceListStrategy.ENVVAR,
    )
    env_list = [f"{k}={v}" for k, v in sorted(env.items())]
    cdi_devices = []
    prepared = []
    unique_devices = len(allocated) == len({x.device for x in allocated})
    for a, gpu in zip(allocated, claim_gpus, strict=True):
        name = cdi_name(claim_uid, a, unique_devices)
        cdi_devices.append({"name": name, "containerEdits": {"env": env_list}})
        ids = [f"{DRA_CDI_KIND}={name}"]
        ref = nvidia_cdi_device(gpu, nvidia_names) if via_cdi else None
        if ref:
            ids.append(ref)
        prepared.append(PreparedDevice(a.request, a.pool, a.device, tuple(ids), a.share_id))
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": DRA_CDI_KIND,
        "annotations": {f"{DRA_DRIVER_NAME}/claim-uid": claim_uid},
        "devices": cdi_devices,
    }
    return Preparation(spec_file, spec, tuple(prepared))


def cdi_name(claim_uid: str, a: AllocatedDevice, unique_devices: bool) -> str:
    """`<claim-uid>-<device>`; with the request's name too when two requests of the claim share a device."""
    if unique_devices:
        return dra_cdi_device(claim_uid, a.device)
    request = re.sub(r"[^A-Za-z0-9_.:-]", "_", a.request)
    return dra_cdi_device(claim_uid, f"{request}-{a.device}")


def spec_text(spec: Mapping[str, Any]) -> str:
    """The CDI spec as the file holds it (JSON is YAML; CDI accepts both)."""
    return json.dumps(spec, indent=2, sort_keys=True) + "\n"
