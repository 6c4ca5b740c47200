"""What a pod takes of a node's CPU, memory and pod slots, counted as kube-scheduler counts it.

The extender places by the whole node (issue 31): it must see the CPU and memory every pod bound there
holds, whoever scheduled it, exactly as NodeResourcesFit does, or its choice is not kube-scheduler's.
Mirrored from upstream (v1.37, every feature gate below on by default there):
- k8s.io/component-helpers/resource/helpers.go `PodRequests` with `UseStatusResources` (in-place
  resize, InPlacePodVerticalScaling GA), `InPlacePodLevelResourcesVerticalScalingEnabled` and
  pod-level resources (PodLevelResources beta): `AggregateContainerRequests` (app containers summed;
  restartable init containers, "sidecars", added; each regular init container with the sidecars
  started before it as a floor), the max of spec, allocated and actuated requests unless the resize
  is infeasible, pod-level requests replacing the containers' sum, then `spec.overhead` added;
- pkg/scheduler/framework/types.go `NodeInfo.SetNode` (`NewResource(node.Status.Allocatable)`: a
  missing entry is 0, so a node without allocatable takes no pod: allowed pods 0) and
  `PodInfo.CalculateResource` (requests are ceil'd to millicores and bytes, as Quantity's
  MilliValue/Value round up).
DRA node-allocatable claims (DRANodeAllocatableResources) are not counted: gpushare does not use them.

Quantities the API server stored are valid; anything else (a fake, a corrupt object) counts 0 and is
named in `problem`: it never raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from functools import lru_cache
from typing import Any
from typing import NamedTuple

from share_core.request import InvalidRequest
from share_core.request import parse_quantity

CPU = "cpu"
MEMORY = "memory"
HOST_RESOURCES = (CPU, MEMORY)
RESIZE_PENDING = "PodResizePending"
REASON_INFEASIBLE = "Infeasible"
SIDECAR_RESTART_POLICY = "Always"


class HostRequest(NamedTuple):
    """A pod's effective CPU (millicores) and memory (bytes) request; `problem` names what was unreadable."""

    cpu: int
    memory: int
    problem: str = ""


class Allocatable(NamedTuple):
    """A node's allocatable CPU (millicores), memory (bytes) and pod slots."""

    cpu: int
    memory: int
    pods: int
    problem: str = ""


@lru_cache(maxsize=4096)
def _scaled(value: str | int | float, scale: int) -> int:
    """ceil(quantity x scale), as Quantity.MilliValue (scale 1000) and Value (scale 1) round up."""
    q: Decimal = parse_quantity(value, "quantity") * scale
    if not q.is_finite() or q < 0:
        raise InvalidRequest(f"quantity {value!r} is negative or not finite")
    if q > 2**63 - 1:
        raise InvalidRequest(f"quantity {value!r} is too large")
    return math.ceil(q)


def quantity(value: Any, scale: int, what: str, problems: list[str]) -> int:
    """One quantity in whole units of 1/`scale`; 0 (and a note in `problems`) if it is not one."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        problems.append(f"{what}: {value!r} is not a quantity")
        return 0
    try:
        return _scaled(value, scale)
    except InvalidRequest as exc:
        problems.append(f"{what}: {exc}")
        return 0


_SCALE = {CPU: 1000, MEMORY: 1}


def _list(rl: Any, what: str, problems: list[str]) -> dict[str, int] | None:
    """A ResourceList's cpu and memory (None when the list itself is absent, as a nil map upstream)."""
    if rl is None:
        return None
    if not isinstance(rl, Mapping):
        problems.append(f"{what} is not an object")
        return {}
    return {r: quantity(rl[r], _SCALE[r], f"{what}[{r}]", problems) for r in HOST_RESOURCES if r in rl}


def _add(into: dict[str, int], other: Mapping[str, int] | None) -> None:
    for r, v in (other or {}).items():
        into[r] = into.get(r, 0) + v


def _max_into(into: dict[str, int], other: Mapping[str, int] | None) -> None:
    for r, v in (other or {}).items():
        if r not in into or v > into[r]:
            into[r] = v


def _maxed(*lists: Mapping[str, int] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for rl in lists:
        _max_into(out, rl)
    return out


def _objects(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _aggregate(spec: Mapping[str, Any], statuses: dict[str, Mapping[str, Any]], pick: str, infeasible: bool,
               problems: list[str]) -> dict[str, int]:  # fmt: skip
    """`aggregateContainerResourcesByFn` with containerSpec/Allocated/ActuatedRequests as `pick`."""

    def requests(c: Mapping[str, Any], kind: str) -> dict[str, int] | None:
        name = str(c.get("name", "?"))
        res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
        spec_req = _list(res.get("requests"), f"{kind} {name!r} requests", problems)
        if pick == "spec":
            return spec_req
        cs = statuses.get(name)
        if cs is not None:
            cs_res = cs.get("resources") if isinstance(cs.get("resources"), Mapping) else {}
            if pick == "actuated" and cs_res.get("requests") is not None:
                return _list(cs_res.get("requests"), f"{kind} {name!r} status resources", problems)
            if cs.get("allocatedResources") is not None:
                return _list(cs.get("allocatedResources"), f"{kind} {name!r} allocatedResources", problems)
        return None if infeasible else spec_req

    result: dict[str, int] = {}
    for c in _objects(spec.get("containers")):
        _add(result, requests(c, "container"))
    sidecars: dict[str, int] = {}
    inits: dict[str, int] = {}
    for c in _objects(spec.get("initContainers")):
        own = requests(c, "init container") or {}
        if c.get("restartPolicy") == SIDECAR_RESTART_POLICY:
            _add(result, own)
            _add(sidecars, own)
            phase = dict(sidecars)
        else:
            phase = dict(own)
            _add(phase, sidecars)
        _max_into(inits, phase)
    _max_into(result, inits)
    return result


def _resize_infeasible(status: Mapping[str, Any]) -> bool:
    """`IsPodResizeInfeasible`: the first PodResizePending condition says Infeasible."""
    for cond in _objects(status.get("conditions")):
        if cond.get("type") == RESIZE_PENDING:
            return cond.get("reason") == REASON_INFEASIBLE
    return False


def pod_host_request(pod: Mapping[str, Any]) -> HostRequest:
    """`PodRequests(pod, {UseStatusResources, InPlacePodLevelResourcesVerticalScalingEnabled})` for CPU
    and memory, as kube-scheduler's NodeInfo counts a pod (see the module docstring)."""
    problems: list[str] = []
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    infeasible = _resize_infeasible(status)
    statuses: dict[str, Mapping[str, Any]] = {}
    for field in ("initContainerStatuses", "containerStatuses"):  # containers' statuses win (found first)
        for cs in _objects(status.get(field)):
            statuses[str(cs.get("name", ""))] = cs
    spec_reqs = _aggregate(spec, {}, "spec", False, problems)
    pod_status_res = status.get("resources") if isinstance(status.get("resources"), Mapping) else None
    if (
        status.get("allocatedResources") is not None
        and pod_status_res is not None
        and (pod_status_res.get("requests") is not None)
    ):
        allocated = _list(status.get("allocatedResources"), "status.allocatedResources", problems)
        actuated = _list(pod_status_res.get("requests"), "status.resources.requests", problems)
    elif statuses:
        allocated = _aggregate(spec, statuses, "allocated", infeasible, problems)
        actuated = _aggregate(spec, statuses, "actuated", infeasible, problems)
    else:  # no status yet: both fall back to the spec (a pending pod)
        allocated = actuated = None
    reqs = _maxed(actuated, allocated) if infeasible else _maxed(spec_reqs, actuated, allocated)
    pod_res = spec.get("resources") if isinstance(spec.get("resources"), Mapping) else {}
    pod_level = _list(pod_res.get("requests"), "spec.resources.requests", problems)
    if pod_level:  # IsPodLevelRequestsSet: cpu or memory named at pod level
        effective: Mapping[str, int] | None = pod_level
        if pod_status_res is not None:
            effective = _maxed(
                None if infeasible else pod_level,
                _list(pod_status_res.get("requests"), "status.resources.requests", problems),
                _list(status.get("allocatedResources"), "status.allocatedResources", problems),
            )
        reqs.update(effective or {})
    _add(reqs, _list(spec.get("overhead"), "spec.overhead", problems))
    return HostRequest(reqs.get(CPU, 0), reqs.get(MEMORY, 0), "; ".join(dict.fromkeys(problems)))


def node_allocatable(node: Mapping[str, Any]) -> Allocatable:
    """`NewResource(node.Status.Allocatable)`: cpu, memory and pods, each 0 where absent."""
    problems: list[str] = []
    status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
    alloc = status.get("allocatable")
    if alloc is not None and not isinstance(alloc, Mapping):
        problems.append("status.allocatable is not an object")
        alloc = None
    alloc = alloc or {}
    cpu = quantity(alloc[CPU], 1000, "allocatable[cpu]", problems) if CPU in alloc else 0
    memory = quantity(alloc[MEMORY], 1, "allocatable[memory]", problems) if MEMORY in alloc else 0
    pods = quantity(alloc["pods"], 1, "allocatable[pods]", problems) if "pods" in alloc else 0
    return Allocatable(cpu, memory, pods, "; ".join(problems))
