"""Which pod and container an Allocate call is for: a pure function of what kubelet and the API server say.

kubelet's Allocate carries only N fake device IDs, no pod identity. What upstream kubelet (1.33 to 1.37) makes true
during an Allocate (k8s.io/kubernetes pkg/kubelet):

* kubelet admits one pod at a time (kubelet.go HandlePodAdditions): the pod joins the pod manager, so
  PodResources List shows it (apis/podresources/server_v1.go, active pods only from 1.34), then the admit
  handlers run, device allocation first (GetAllocateResourcesPodAdmitHandler), one Allocate per container
  that asks for devices, init containers first, then app containers (topologymanager scope_container.go).
* a container's devices are recorded, and so listed by PodResources, only after Allocate returns
  (cm/devicemanager/manager.go allocateContainerResources), and before the container is created.
* PodResources never lists regular (non-restartable) init containers, only sidecars and app containers
  (server_v1.go List). Whether a regular init container was served is known from this plugin's memory,
  from a later container of the pod holding devices (kubelet serves them in order), or from its status.
* a later admit handler (the predicate handler: OutOfcpu, node affinity...) may reject a pod after it was
  allocated; it is then Failed and no longer active, so it is neither listed (from 1.34) nor counted.
* before 1.34 (and wherever the gate KubeletPodResourcesListUseActivePods is off) List returns every pod
  of the pod manager (server_v1.go List: podsProvider.GetPods()), pods rejected at admission and
  terminated pods included, until the API server deletes them. List first runs the device manager's
  UpdateAllocatedDevices (cm/devicemanager/manager.go), which frees the devices of every pod that is not
  active: such a pod is listed holding nothing, exactly like the pod being admitted. What tells them
  apart: the pod's phase (kubelet writes Failed/Succeeded through its status manager, asynchronously, so
  the API may lag by a moment), a container this plugin served (since this kubelet started: the allocator
  forgets on a kubelet restart) that no longer holds its devices (kubelet freed them: the pod is no
  longer active), and PodResources naming pods by namespace/name only (an old
  pod and its re-created namespace-mate are two entries; the view merges them: only an active one holds
  devices). Whatever stays ambiguous the caller re-reads after a moment (Allocator: settle).
* a pod can run without any Allocate (kubelet restarted, resource not yet registered: predicate.go
  removeMissingExtendedResources); kubelet may Allocate for it later from the pod worker when a container
  starts (manager.go GetDeviceRunContainerOptions). Such a pod is seen here as a started container that
  holds no devices: it is reported (`runs_without_gpu`) and never counted as pending.

So the pod being admitted is the listed pod with a container that asks gpu-mem and is not yet served, and
the container is the first such in kubelet's order. If a pod that gpushare cannot serve (another
scheduler's pod, a static pod, garbage annotations) could be the one, nothing is served. Without
PodResources we fall back to the request size and assume-time order, only when no other pod bound to the
node could be the one. Anything else fails with an error naming the node, the size asked and the
candidates seen: a GPU is never handed out blindly.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Unpack

from share_core.accounting import node_usage
from share_core.assignment import Assignment
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_is_finished
from share_core.assignment import pod_key
from share_core.contract import CDI_NVIDIA_GPU_KIND
from share_core.contract import RESOURCE_MEM
from share_core.contract import VISIBLE_DEVICES_MOUNT_ROOT
from share_core.contract import DeviceListStrategy
from share_core.contract import MemoryUnit
from share_core.request import ContainerRequest
from share_core.request import InvalidRequest
from share_core.request import pod_request
from share_node.backend import Gpu
from share_node.env import EnvOptions
from share_node.env import gpu_env
from share_node.env import visible_ids
from share_plugin.devices import gpu_infos

Pod = Mapping[str, Any]
PodRef = tuple[str, str]  # (namespace, name)
# PodResources as seen by the plugin: every pod kubelet lists -> container -> our resource's device IDs.
PodResourcesView = Mapping[PodRef, Mapping[str, frozenset[str]]]
Served = frozenset[tuple[str, str]]  # (pod uid, container) this plugin answered since it started


class AllocationError(Exception):
    """Allocate cannot be answered; the message is what kubelet shows on the pod.

    `implicated` holds pods gpushare cannot serve that made the answer impossible (another scheduler's
    pod asking the same size, say): the caller tells them so with an Event.
    """

    def __init__(self, message: str, implicated: Sequence[Pod] = ()) -> None:
        super().__init__(message)
        self.implicated = tuple(implicated)


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
    alternatives: int = 0  # other pods that were equally good answers (identical GPU and sizes)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class RunsWithoutGpu:
    """A pod whose containers started without Allocate: kubelet admitted it while our resource was unknown."""

    pod: Pod
    containers: tuple[str, ...]

    @property
    def key(self) -> str:
        return pod_key(self.pod)

    def message(self, node: str) -> str:
        return (
            f"pod {self.key} on node {node}: container(s) {', '.join(self.containers)} ask {RESOURCE_MEM} but "
            f"started without the gpushare device plugin's Allocate (kubelet admitted the pod before the plugin "
            f"registered, e.g. right after a kubelet restart), so they have no GPU env and no GPU limit; "
            f"delete the pod so that it is created and admitted again"
        )


def reported_by_pod_resources(ct: ContainerRequest) -> bool:
    """PodResources List reports app containers and sidecars, never regular init containers (server_v1.go)."""
    return not ct.init or ct.sidecar


def container_started(pod: Pod, name: str) -> bool:
    """The pod's status says the container ran (or runs): kubelet had finished allocating for it."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            if not isinstance(cs, Mapping) or cs.get("name") != name:
                continue
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            if "running" in state or "terminated" in state or "terminated" in last or cs.get("restartCount"):
                return True
    return False


@dataclass(slots=True)
class _Candidate:
    pod: Pod
    ref: PodRef
    uid: str
    key: str
    containers: tuple[ContainerRequest, ...] = ()  # those asking our resource, in kubelet's order
    assignment: Assignment | None = None
    problem: str = ""
    pending: list[ContainerRequest] = field(default_factory=list)
    without_gpu: tuple[str, ...] = ()  # started containers holding no devices

    def describe(self) -> str:
        if self.problem:
            return f"{self.key} ({self.problem})"
        if self.without_gpu:
            return f"{self.key} (started without Allocate: {', '.join(self.without_gpu)})"
        if not self.pending:
            return f"{self.key} (every container served)"
        nxt = self.pending[0]
        return f"{self.key} (next container {nxt.name!r} asks {nxt.units})"

    def could_take(self, size: int) -> bool:
        """Some container not yet served asks `size`: kubelet might be allocating it now."""
        return any(ct.units == size for ct in self.pending)


def _ref(pod: Pod) -> PodRef:
    meta = pod.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


def _candidates(pods: Sequence[Pod]) -> list[_Candidate]:
    """Live pods asking for gpu-mem, with their parsed request and assignment (or the problem)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if pod_is_finished(pod) or meta.get("deletionTimestamp"):
            continue
        cand = _Candidate(pod, _ref(pod), str(meta.get("uid") or ""), pod_key(pod))
        try:
            request = pod_request(pod)
        except InvalidRequest as exc:
            cand.problem = f"bad request: {exc}"
            out.append(cand)
            continue
        if request is None:
            continue
        cand.containers = tuple(ct for ct in request.containers if ct.units > 0)
        try:
            cand.assignment = parse_assignment(pod_annotations(pod))
        except InvalidRequest as exc:
            cand.problem = f"bad assignment: {exc}"
        if cand.assignment is None and not cand.problem:
            scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
            cand.problem = f"no gpushare assignment: scheduled by {scheduler!r}, not by gpushare-scheduler"
        out.append(cand)
    return out


def _progress_with_view(c: _Candidate, held: Mapping[str, frozenset[str]], served: Served) -> None:
    """Which of the pod's containers kubelet still has to allocate, and which run without devices."""
    pending, without = [], []
    for pos, ct in enumerate(c.containers):
        started = container_started(c.pod, ct.name)
        if reported_by_pod_resources(ct):
            # Served here but holding nothing: kubelet freed its devices (UpdateAllocatedDevices), so the
            # pod is no longer active (rejected after Allocate, or terminated) though still listed (< 1.34).
            done = bool(held.get(ct.name)) or (c.uid, ct.name) in served
            if not done and started:
                without.append(ct.name)
                done = True
        else:  # a regular init container: PodResources never shows its devices
            later_held = any(reported_by_pod_resources(x) and held.get(x.name) for x in c.containers[pos + 1 :])
            done = (c.uid, ct.name) in served or later_held or started
        if not done:
            pending.append(ct)
    c.pending, c.without_gpu = pending, tuple(without)


def _progress_without_view(c: _Candidate, served: Served) -> None:
    """Without PodResources: this plugin's memory and the pod's status are all there is."""
    started = [ct.name for ct in c.containers if container_started(c.pod, ct.name)]
    c.pending = [ct for ct in c.containers if (c.uid, ct.name) not in served and ct.name not in started]
    if started and c.pending:
        # Containers ran yet some were never served here: admitted before we registered, or served by a
        # plugin that has since restarted. Either way it is not being admitted now.
        c.without_gpu = tuple(n for n in started if (c.uid, n) not in served)
        c.pending = []


def _equivalent(cands: Sequence[_Candidate]) -> bool:
    """Serving any of them yields the same env now and later: same GPUs, same pending sizes."""
    first = cands[0]
    assert first.assignment is not None

    def shape(c: _Candidate) -> tuple[Any, ...]:
        assert c.assignment is not None
        return (
            c.assignment.gpu_indices,
            c.assignment.gpu_uuids,
            c.assignment.total,
            [(p.units, reported_by_pod_resources(p)) for p in c.pending],
        )

    return all(not c.problem and shape(c) == shape(first) for c in cands)


def runs_without_gpu(pods: Sequence[Pod], view: PodResourcesView) -> list[RunsWithoutGpu]:
    """Pods kubelet lists whose gpu-mem containers started holding none of our devices."""
    out = []
    for c in _candidates(pods):
        if c.ref in view:
            _progress_with_view(c, view[c.ref], frozenset())
            if c.without_gpu:
                out.append(RunsWithoutGpu(c.pod, c.without_gpu))
    return out


def match_allocation(
    node: str,
    device_ids: Sequence[str],
    pods: Sequence[Pod],
    gpus: Sequence[Gpu],
    unit: MemoryUnit,
    view: PodResourcesView | None,
    served: Served = frozenset(),
) -> Match:
    """The pod/container this Allocate serves; raises AllocationError naming node, size and candidates.

    `view` is PodResources (None when kubelet's PodResources API is unreachable); `served` holds
    (pod uid, container) pairs this plugin served since it started.
    """
    size = len(device_ids)
    asked = set(device_ids)
    cands = _candidates(pods)
    for c in cands:
        if view is not None:
            _progress_with_view(c, view.get(c.ref, {}), served)
        else:
            _progress_without_view(c, served)

    how = ""
    alternatives = 0
    chosen: _Candidate | None = None
    container: ContainerRequest | None = None
    if view is not None:
        # 1. The device IDs name the pod when kubelet already records them for one of its containers.
        holders = [c for c in cands if any(ids & asked for ids in view.get(c.ref, {}).values())]
        if len(holders) == 1:
            h = holders[0]
            if h.problem:
                raise AllocationError(
                    f"node {node}: pod {h.describe()} holds the requested devices but cannot be served", [h.pod]
                )
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
            listed = [c for c in cands if c.ref in view and not c.without_gpu]
            admitting = [c for c in listed if c.pending or c.problem]
            rivals = [c for c in admitting if c.problem and (c.could_take(size) or not c.containers)]
            fits = [c for c in admitting if not c.problem and c.pending[0].units == size]
            broken = [c for c in cands if c.ref in view and c.without_gpu]  # named in a refusal, never served
            what = "pods kubelet is admitting"
            chosen, container, how = _pick(node, size, admitting + broken, fits, rivals, what)
            how += " (PodResources)"
            alternatives = len(fits) - 1
    else:
        # 3. No PodResources: request size and assume time, only when no other pod could be the one.
        open_ = [
            c
            for c in cands
            if c.problem or (c.assignment and not c.assignment.assigned and c.pending and not c.without_gpu)
        ]
        rivals = [c for c in open_ if c.problem and _could_be_admitting(c, size)]
        fits = [c for c in open_ if not c.problem and c.pending[0].units == size]
        others = [c for c in open_ if not c.problem and c not in fits and c.could_take(size)]
        if others:
            _fail(node, size, open_, [*fits, *others], [], "unassigned pods bound to the node")
        chosen, container, how = _pick(node, size, open_, fits, rivals, "unassigned pods bound to the node")
        how = "request size and assume time (PodResources unavailable): " + how
        alternatives = len(fits) - 1

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
        uid=chosen.uid,
        resource_version=meta.get("resourceVersion", ""),
        container=container,
        assignment=chosen.assignment,
        gpus=assigned_gpus,
        pod_total=chosen.assignment.total,
        last=not later,
        how=how,
        alternatives=alternatives,
    )


def _could_be_admitting(c: _Candidate, size: int) -> bool:
    """A pod gpushare cannot serve, bound here, that kubelet may be admitting with a container of `size`."""
    status = c.pod.get("status") or {}
    if status.get("phase") not in (None, "", "Pending"):
        return False
    if c.containers:
        return any(ct.units == size and not container_started(c.pod, ct.name) for ct in c.containers)
    return True  # a request we could not even parse: it may ask anything


def _pick(
    node: str, size: int, seen: list[_Candidate], fits: list[_Candidate], rivals: list[_Candidate], what: str
) -> tuple[_Candidate, ContainerRequest, str]:
    """The one pod to serve, or AllocationError; `rivals` are unservable pods that could be the one."""
    if rivals:
        _fail(node, size, seen, fits, rivals, what)
    if len(fits) == 1 or (len(fits) > 1 and _equivalent(fits)):
        chosen = min(fits, key=lambda c: c.assignment.assume_time_ns if c.assignment else 0)
        how = "the pod kubelet is admitting"
        if len(fits) > 1:
            how += f", one of {len(fits)} identical candidates"
        return chosen, chosen.pending[0], how
    _fail(node, size, seen, fits, rivals, what)
    raise AssertionError("unreachable")


def _fail(
    node: str, size: int, seen: list[_Candidate], fits: list[_Candidate], rivals: list[_Candidate], what: str
) -> None:
    listing = "; ".join(c.describe() for c in seen) or "none"
    if rivals:
        names = ", ".join(c.describe() for c in rivals)
        raise AllocationError(
            f"node {node}: refusing a container asking {size} {RESOURCE_MEM}: it may belong to {names}, which "
            f"gpushare cannot serve (a pod must be scheduled by gpushare-scheduler to get a shared GPU); "
            f"serving anyone else could give a container the wrong GPU. {what}: {listing}",
            [c.pod for c in rivals],
        )
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


def container_env(match: Match, unit: MemoryUnit, **options: Unpack[EnvOptions]) -> dict[str, str]:
    """The env DESIGN.md promises a container: its GPU(s), its limit and the GPU's total (gpu_env's options)."""
    count = len(match.gpus)
    return gpu_env(
        match.gpus,
        limit_mib=match.container.units * unit.mib // count,
        container_units=match.container.units // count,
        pod_units=match.pod_total,
        unit=unit,
        **options,
    )


@dataclass(frozen=True, slots=True)
class BindMount:
    container_path: str
    host_path: str
    read_only: bool = True


def container_mounts(
    match: Match,
    device_id_strategy: str,
    device_list_strategy: str,
    mps: bool,
    mps_pipe_dir: str,
    mps_shm_dir: str = "",
) -> list[BindMount]:
    """volume-mounts: one `/dev/null` mount per GPU at `/var/run/nvidia-container-devices/<id>`, which the
    NVIDIA toolkit reads with `accept-nvidia-visible-devices-as-volume-mounts = true` (NVIDIA k8s-device-plugin
    does the same); MPS: the control daemon's pipe directory, where CUDA finds the daemon, and the daemon's
    shared memory as /dev/shm (MPS clients and server share memory; a pod has its own IPC namespace)."""
    out = []
    if device_list_strategy == DeviceListStrategy.VOLUME_MOUNTS:
        out += [
            BindMount(f"{VISIBLE_DEVICES_MOUNT_ROOT}/{i}", "/dev/null")
            for i in visible_ids(match.gpus, device_id_strategy)
        ]
    if mps:
        out.append(BindMount(mps_pipe_dir, mps_pipe_dir, read_only=False))
        if mps_shm_dir:
            out.append(BindMount("/dev/shm", mps_shm_dir, read_only=False))
    return out


def container_cdi_devices(match: Match, device_id_strategy: str, device_list_strategy: str) -> list[str]:
    """cdi-cri: fully qualified CDI names (`nvidia.com/gpu=<uuid or index>`) of the devices the NVIDIA
    toolkit's generated CDI spec defines; the runtime injects them when it has CDI enabled."""
    if device_list_strategy != DeviceListStrategy.CDI_CRI:
        return []
    return [f"{CDI_NVIDIA_GPU_KIND}={i}" for i in visible_ids(match.gpus, device_id_strategy)]
