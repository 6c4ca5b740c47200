"""What a pod asks for: its `nvidia.com/gpu-mem` request, parsed with Kubernetes semantics.

Pods are plain dicts in the API's JSON form (camelCase keys), as the API server and kube-scheduler send them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from decimal import InvalidOperation
from typing import Any

from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import RESOURCE_MEM

Pod = Mapping[str, Any]


class InvalidRequest(ValueError):
    """A pod spec or annotation we cannot honour; the message names the problem for a person."""


# Kubernetes quantity suffixes: decimal SI (k = 10^3, M = 10^6, ...), binary (Ki = 2^10, Mi = 2^20, ...), milli.
_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{p: Decimal(10) ** (3 * n) for n, p in enumerate("kMGTPE", 1)},
    **{f"{p}i": Decimal(2) ** (10 * n) for n, p in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")


def parse_quantity(value: Any, what: str = "quantity") -> Decimal:
    """A Kubernetes resource quantity ("8", 8, "1k", "500m") as an exact Decimal."""
    if isinstance(value, bool):
        raise InvalidRequest(f"{what}: {value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise InvalidRequest(f"{what}: {value!r} is not a quantity")
    match = _QUANTITY.match(value.strip())
    if not match:
        raise InvalidRequest(f"{what}: {value!r} is not a valid quantity")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]
    except (InvalidOperation, ArithmeticError) as exc:  # also decimal.Overflow for "1e999999Ei"
        raise InvalidRequest(f"{what}: {value!r} is not a valid quantity") from exc


MAX_UNITS = 2**63 - 1  # Kubernetes counts extended resources in an int64


def parse_units(value: Any, what: str) -> int:
    """A whole, non-negative count of gpu-mem units; extended resources cannot be fractional."""
    quantity = parse_quantity(value, what)
    if quantity < 0:
        raise InvalidRequest(f"{what}: {value!r} is negative")
    if quantity > MAX_UNITS:  # before int(): "1e999999" would build a million-digit integer
        raise InvalidRequest(f"{what}: {value!r} is too large (at most {MAX_UNITS})")
    if quantity != quantity.to_integral_value():
        raise InvalidRequest(f"{what}: {value!r} is fractional; {RESOURCE_MEM} is counted in whole units")
    return int(quantity)


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    name: str
    units: int
    init: bool = False
    sidecar: bool = False  # an init container with restartPolicy Always runs beside the app containers


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod's GPU memory request: `total` units spread evenly over `gpu_count` GPUs."""

    total: int
    gpu_count: int
    containers: tuple[ContainerRequest, ...]
    models: tuple[str, ...] = ()

    @property
    def per_gpu(self) -> int:
        return self.total // self.gpu_count

    def model_allowed(self, model: str) -> bool:
        """`gpushare.io/gpu-model`: case-insensitive substring match against any listed name."""
        if not self.models:
            return True
        lowered = model.lower()
        return any(m in lowered for m in self.models)


def _container_units(container: Mapping[str, Any], kind: str) -> int:
    name = container.get("name", "?")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise InvalidRequest(f"{kind} {name!r}: resources is not an object")
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        raise InvalidRequest(f"{kind} {name!r}: resources.limits/requests must be objects")
    in_limits = RESOURCE_MEM in limits
    in_requests = RESOURCE_MEM in requests
    if not in_limits and not in_requests:
        return 0
    if not in_limits:
        raise InvalidRequest(
            f"{kind} {name!r}: {RESOURCE_MEM} is set in requests but not in limits; "
            "extended resources must be set in limits"
        )
    units = parse_units(limits[RESOURCE_MEM], f"{kind} {name!r} limits[{RESOURCE_MEM}]")
    if in_requests:
        req = parse_units(requests[RESOURCE_MEM], f"{kind} {name!r} requests[{RESOURCE_MEM}]")
        if req != units:
            raise InvalidRequest(
                f"{kind} {name!r}: requests[{RESOURCE_MEM}]={req} differs from limits={units}; "
                "they must be equal for an extended resource"
            )
    return units


def container_requests(pod: Pod) -> tuple[ContainerRequest, ...]:
    """Every container's request, init containers first, in spec order."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidRequest("pod spec is not an object")
    out: list[ContainerRequest] = []
    for field, kind, init in (("initContainers", "init container", True), ("containers", "container", False)):
        containers = spec.get(field) or []
        if not isinstance(containers, list):
            raise InvalidRequest(f"spec.{field} is not a list")
        for c in containers:
            if not isinstance(c, Mapping):
                raise InvalidRequest(f"spec.{field} holds a non-object entry")
            sidecar = init and c.get("restartPolicy") == "Always"
            out.append(ContainerRequest(str(c.get("name", "?")), _container_units(c, kind), init, sidecar))
    return tuple(out)


def pod_total(containers: tuple[ContainerRequest, ...]) -> int:
    """Kubernetes' effective pod request: max(any init container, sum of app containers and sidecars).

    A regular init container runs alone before the app containers (but alongside sidecars started
    before it), so the pod needs the larger of the two phases.
    """
    app = sum(c.units for c in containers if not c.init or c.sidecar)
    peak_init = 0
    sidecars_so_far = 0
    for c in containers:
        if not c.init:
            continue
        if c.sidecar:
            sidecars_so_far += c.units
        else:
            peak_init = max(peak_init, sidecars_so_far + c.units)
    return max(app, peak_init)


def parse_gpu_count(annotations: Mapping[str, str]) -> int:
    raw = annotations.get(ANN_GPU_COUNT)
    if raw is None or str(raw).strip() == "":
        return 1
    try:
        count = int(str(raw).strip())
    except ValueError as exc:
        raise InvalidRequest(f"annotation {ANN_GPU_COUNT}={raw!r} is not a whole number") from exc
    if count < 1:
        raise InvalidRequest(f"annotation {ANN_GPU_COUNT}={raw!r} must be at least 1")
    return count


def parse_models(annotations: Mapping[str, str]) -> tuple[str, ...]:
    raw = annotations.get(ANN_GPU_MODEL) or ""
    return tuple(m.strip().lower() for m in str(raw).split(",") if m.strip())


def pod_request(pod: Pod) -> PodRequest | None:
    """The pod's GPU memory request, or None when it does not ask for `nvidia.com/gpu-mem`.

    Raises InvalidRequest with a message naming the problem for anything we cannot honour.
    """
    containers = container_requests(pod)
    total = pod_total(containers)
    if total == 0:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    gpu_count = parse_gpu_count(annotations)
    if total % gpu_count:
        raise InvalidRequest(
            f"pod asks {total} {RESOURCE_MEM} over {gpu_count} GPUs ({ANN_GPU_COUNT}); "
            f"the request must divide evenly by the GPU count"
        )
    return PodRequest(total, gpu_count, containers, parse_models(annotations))
