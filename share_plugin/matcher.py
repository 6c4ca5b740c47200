"""Which pod and container an Allocate call is for: a pure function of what kubelet and the API server say.

kubelet's Allocate carries only N fake device IDs, no pod identity. Upstream kubelet
(pkg/kubelet/cm/devicemanager/manager.go, allocateContainerResources) calls the plugin's Allocate first
and records the container's devices in podDevices (what PodResources List reports) only after Allocate
returns. So during Allocate, PodResources does NOT yet know the requested IDs for the container being
served; it does know:

* every pod kubelet has admitted or is admitting (kubelet adds a pod to its pod manager before admission,
  and admits one pod at a time, calling Allocate for its init containers, then its app containers), and
* which of their containers already hold devices of our resource.

So the pod being admitted is the one PodResources lists with a container that asks for gpu-mem but holds
none yet, and the container is the first such in kubelet's order. Device IDs still identify the pod when
they are known: an app container reuses its init containers' devices, and a kubelet that records before
calling would list them. Only when PodResources is unreachable do we fall back to the request size and
assume-time order, and then only when every candidate would get the same answer. Anything else fails
with an error naming the node, the size asked and the candidates seen: a GPU is never handed out blindly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from share_core.accounting import node_usage
from share_core.assignment import Assignment, parse_assignment, pod_annotations, pod_is_finished, pod_key
from share_core.contract import (
    ENV_ALIYUN_CONTAINER,
    ENV_ALIYUN_DEV,
    ENV_ALIYUN_IDX,
    ENV_ALIYUN_POD,
    ENV_GPU_INDEX,
    ENV_MEM_LIMIT_MIB,
    ENV_MEM_TOTAL_MIB,
    ENV_MPS_PINNED_LIMIT,
    ENV_VISIBLE_DEVICES,
    RESOURCE_MEM,
    MemoryUnit,
)
from share_core.request import ContainerRequest, InvalidRequest, pod_request
from share_plugin.backend import Gpu
from share_plugin.devices import gpu_infos, gpu_units

Pod = Mapping[str, Any]
PodRef = tuple[str, str]  # (namespace, name)
# PodResources as seen by the plugin: every pod kubelet lists -> container -> our resource's device IDs.
PodResourcesView = Mapping[PodRef, Mapping[str, frozenset[str]]]


class AllocationError(Exception):
    """Allocate cannot be answered; the message is what kubelet shows on the pod."""


@dataclass(frozen=True, slots=True)
class Match:
    """The container an Allocate call serves, and what is needed to answer and record it."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    container: ContainerRequest
    assignment: Assignment
    gpus: tuple[Gpu, ...]  # the assigned GPUs, in annotation order
    pod_total: int
    last: bool  # no container of the pod is left to serve: mark it assigned
    how: str  # how the pod was identified, for the log

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(slots=True)
class _Candidate:
    pod: Pod
    ref: PodRef
    key: str
    containers: tuple[ContainerRequest, ...] = ()
    assignment: Assignment | None = None
    problem: str = ""
    pending: list[ContainerRequest] = field(default_factory=list)

    def describe(self) -> str:
        if self.problem:
            return f"{self.key} ({self.problem})"
        if not self.pending:
            return f"{self.key} (every container served)"
        nxt = self.pending[0]
        return f"{self.key} (next container {nxt.name!r} asks {nxt.units})"


def _ref(pod: Pod) -> PodRef:
    meta = pod.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


def _candidates(pods: Sequence[Pod]) -> list[_Candidate]:
    """Live pods asking for gpu-mem, with their parsed request and assignment (or the problem)."""
    out = []
    for pod in pods:
        if pod_is_finished(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        cand = _Candidate(pod, _ref(pod), pod_key(pod))
        try:
            request = pod_request(pod)
        except InvalidRequest as exc:
            cand.problem = f"bad request: {exc}"
            out.append(cand)
            continue
        if request is None:
            continue
        cand.containers = request.containers
        try:
            cand.assignment = parse_assignment(pod_annotations(pod))
        except InvalidRequest as exc:
            cand.problem = f"bad assignment: {exc}"
        if cand.assignment is None and not cand.problem:
            cand.problem = "no gpushare assignment: was it scheduled by gpushare-scheduler?"
        out.append(cand)
    return out


def _equivalent(cands: Sequence[_Candidate]) -> bool:
    """Serving any of them yields the same env now and later: same GPUs, same pending sizes."""
    first = cands[0]
    assert first.assignment is not None

    def shape(c: _Candidate) -> tuple[Any, ...]:
        assert c.assignment is not None
        return (c.assignment.gpu_indices, c.assignment.gpu_uuids, c.assignment.total, [p.units for p in c.pending])

    return all(not c.problem and shape(c) == shape(first) for c in cands)


def match_allocation(
    node: str,
    device_ids: Sequence[str],
    pods: Sequence[Pod],
    gpus: Sequence[Gpu],
    unit: MemoryUnit,
    view: PodResourcesView | None,
    served: frozenset[tuple[str, str]] = frozenset(),
) -> Match:
    """The pod/container this Allocate serves; raises AllocationError naming node, size and candidates.

    `view` is PodResources (None when kubelet's PodResources API is unreachable); `served` holds
    (pod uid, container) pairs this plugin served since it started, used only without `view`.
    """
    size = len(device_ids)
    asked = set(device_ids)
    cands = _candidates(pods)
    for c in cands:
        if c.problem:
            continue
        uid = (c.pod.get("metadata") or {}).get("uid", "")
        if view is not None:
            held = view.get(c.ref, {})
            c.pending = [ct for ct in c.containers if ct.units > 0 and not held.get(ct.name)]
        else:
            c.pending = [ct for ct in c.containers if ct.units > 0 and (uid, ct.name) not in served]

    how = ""
    chosen: _Candidate | None = None
    container: ContainerRequest | None = None
    if view is not None:
        # 1. The device IDs name the pod when kubelet already records them (init-container reuse).
        holders = [c for c in cands if any(ids & asked for ids in view.get(c.ref, {}).values())]
        if len(holders) == 1:
            h = holders[0]
            if h.problem:
                raise AllocationError(
                    f"node {node}: pod {h.describe()} holds the requested devices but cannot be served"
                )
            if h.pending:
                chosen, container, how = h, h.pending[0], "device IDs already held by the pod (PodResources)"
            else:
                held = view.get(h.ref, {})
                exact = [ct for ct in h.containers if held.get(ct.name) == frozenset(asked)]
                if exact:
                    chosen, container, how = h, exact[0], "device IDs recorded for the container (PodResources)"
        elif len(holders) > 1:
            raise AllocationError(
                f"node {node}: the {size} requested {RESOURCE_MEM} devices are held by several pods "
                f"({', '.join(h.key for h in holders)}) according to kubelet's PodResources; refusing to guess"
            )
        if chosen is None:
            # 2. The pod kubelet is admitting: listed by PodResources with a container not yet served.
            admitting = [c for c in cands if c.ref in view and (c.pending or c.problem)]
            fits = [c for c in admitting if not c.problem and c.pending[0].units == size]
            if len(fits) == 1 or (len(fits) > 1 and _equivalent(fits)):
                chosen = min(fits, key=lambda c: c.assignment.assume_time_ns if c.assignment else 0)
                container = chosen.pending[0]
                how = "the pod kubelet is admitting (PodResources)"
                if len(fits) > 1:
                    how += f", one of {len(fits)} identical candidates"
            else:
                _fail(node, size, admitting, fits, "pods kubelet is admitting (PodResources)")
    else:
        # 3. No PodResources: request size and assume time, only when the answer is unambiguous.
        open_ = [c for c in cands if c.problem or (c.assignment and not c.assignment.assigned and c.pending)]
        fits = [c for c in open_ if not c.problem and c.pending[0].units == size]
        if len(fits) == 1 or (len(fits) > 1 and _equivalent(fits)):
            chosen = min(fits, key=lambda c: c.assignment.assume_time_ns if c.assignment else 0)
            container = chosen.pending[0]
            how = "request size and assume time (PodResources unavailable)"
        else:
            _fail(node, size, open_, fits, "unassigned pods bound to the node (PodResources unavailable)")

    assert chosen is not None and container is not None and chosen.assignment is not None
    if container.units != size:
        raise AllocationError(
            f"node {node}: pod {chosen.key} container {container.name!r} asks {container.units} {RESOURCE_MEM} "
            f"but kubelet requested {size} devices"
        )
    assigned_gpus = _assigned_gpus(node, chosen, gpus)
    _check_capacity(node, chosen, pods, gpus, unit)
    meta = chosen.pod.get("metadata") or {}
    later = [p for p in chosen.pending if p is not container]
    return Match(
        namespace=chosen.ref[0],
        name=chosen.ref[1],
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        container=container,
        assignment=chosen.assignment,
        gpus=assigned_gpus,
        pod_total=chosen.assignment.total,
        last=not later,
        how=how,
    )


def _fail(node: str, size: int, seen: list[_Candidate], fits: list[_Candidate], what: str) -> None:
    listing = "; ".join(c.describe() for c in seen) or "none"
    if len(fits) > 1:
        raise AllocationError(
            f"node {node}: {len(fits)} pods could take a container asking {size} {RESOURCE_MEM} and they are "
            f"assigned different GPUs, so serving either could give a container the wrong GPU: {listing}"
        )
    raise AllocationError(f"node {node}: no pod to serve a container asking {size} {RESOURCE_MEM}; {what}: {listing}")


def _assigned_gpus(node: str, cand: _Candidate, gpus: Sequence[Gpu]) -> tuple[Gpu, ...]:
    """The node's GPUs the annotation names; the annotation must agree with the hardware."""
    assert cand.assignment is not None
    by_index = {g.index: g for g in gpus}
    out = []
    for pos, index in enumerate(cand.assignment.gpu_indices):
        gpu = by_index.get(index)
        if gpu is None:
            raise AllocationError(f"node {node}: pod {cand.key} is assigned GPU {index}, which this node does not have")
        if cand.assignment.gpu_uuids and cand.assignment.gpu_uuids[pos] != gpu.uuid:
            raise AllocationError(
                f"node {node}: pod {cand.key} is assigned GPU {index} {cand.assignment.gpu_uuids[pos]}, "
                f"but GPU {index} of this node is {gpu.uuid}"
            )
        out.append(gpu)
    return tuple(out)


def _check_capacity(node: str, cand: _Candidate, pods: Sequence[Pod], gpus: Sequence[Gpu], unit: MemoryUnit) -> None:
    """Refuse to serve a GPU the annotations already over-commit (an extender bug must not reach a GPU)."""
    assert cand.assignment is not None
    usage = node_usage(gpu_infos(list(gpus), unit), pods).by_index()
    for index in cand.assignment.gpu_indices:
        g = usage[index]
        if g.used > g.total:
            holders = ", ".join(f"{k}={u}" for k, u in g.pods)
            raise AllocationError(
                f"node {node}: GPU {index} ({g.uuid}) is promised {g.used} of {g.total} {RESOURCE_MEM} ({holders}); "
                f"refusing to serve pod {cand.key} on an over-committed GPU"
            )


def container_env(
    match: Match, unit: MemoryUnit, device_id_strategy: str = "uuid", mps: bool = False
) -> dict[str, str]:
    """The env DESIGN.md promises a container: its GPU(s), its limit and the GPU's total."""
    count = len(match.gpus)
    ids = [g.uuid if device_id_strategy == "uuid" else str(g.index) for g in match.gpus]
    limit_mib = match.container.units * unit.mib // count
    per_gpu_units = match.container.units // count
    env = {
        ENV_VISIBLE_DEVICES: ",".join(ids),
        ENV_MEM_LIMIT_MIB: str(limit_mib),
        ENV_MEM_TOTAL_MIB: ",".join(str(g.memory_mib) for g in match.gpus),
        ENV_GPU_INDEX: ",".join(str(g.index) for g in match.gpus),
        ENV_ALIYUN_CONTAINER: str(per_gpu_units),
        ENV_ALIYUN_DEV: ",".join(str(gpu_units(g, unit)) for g in match.gpus),
        ENV_ALIYUN_IDX: ",".join(str(g.index) for g in match.gpus),
        ENV_ALIYUN_POD: str(match.pod_total),
    }
    if mps:
        env[ENV_MPS_PINNED_LIMIT] = ",".join(f"{i}={limit_mib}M" for i in ids)
    return env
