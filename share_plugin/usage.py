"""GPU memory used per container, and what to do about a container over its limit: pure functions over plain data.

The monitor (share_plugin/monitor.py) gathers the inputs at the edges (NVML's process list, `/proc/<pid>/cgroup`,
the pods bound to this node) and acts on the outputs (metrics, Events, kill, the node annotation). Everything
that decides lives here, so it is tested without a GPU, a /proc or an API server.

A container's limit on a GPU is what its Allocate gave it (`GPUSHARE_MEM_LIMIT_MIB`: its units split evenly
over the pod's GPUs) on the GPUs its pod was assigned, and 0 on every other GPU of the node: a gpushare
container that reaches a GPU it was not given (a forged `NVIDIA_VISIBLE_DEVICES`) is over its limit there.
Containers of pods that asked no `nvidia.com/gpu-mem` are measured and reported, never enforced: they may
hold whole GPUs from another device plugin.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any

from share_core.assignment import placed_request
from share_core.assignment import pod_is_finished
from share_core.contract import MemoryUnit
from share_core.gpuusage import UsageSummary
from share_node.backend import GpuReading
from share_node.hardlimit import Limits
from share_plugin.cgroups import CgroupRef
from share_plugin.cgroups import status_container_id

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ContainerKey:
    """Who a process belongs to. `container` is "" when the pod status does not (yet) name its container ID."""

    namespace: str
    pod: str
    container: str
    pod_uid: str
    container_id: str = ""


@dataclass(frozen=True, slots=True)
class PodEntry:
    namespace: str
    name: str
    uid: str
    containers: Mapping[str, str]  # container ID -> container name (from the pod status)
    # container name -> {gpu uuid: limit bytes}; None: the pod asked no gpu-mem, it is not enforced
    limits: Mapping[str, Mapping[str, int]] | None
    pod: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(slots=True)
class ContainerUsage:
    """A container's use of one GPU at one poll."""

    key: ContainerKey
    gpu_index: int
    gpu_uuid: str
    used_bytes: int = 0
    pids: list[int] = field(default_factory=list)
    limit_bytes: int | None = None  # None: not a gpushare container (or its name is unknown): not enforced

    @property
    def over(self) -> bool:
        return self.limit_bytes is not None and self.used_bytes > self.limit_bytes


@dataclass(slots=True)
class GpuUsageStat:
    index: int
    uuid: str
    total_bytes: int
    used_bytes: int  # what NVML says the GPU uses (processes, contexts, driver)
    outside_pods_bytes: int = 0  # used by processes in no pod's cgroup: a GPU used outside Kubernetes


@dataclass(slots=True)
class Usage:
    """One poll's picture of the node."""

    gpus: list[GpuUsageStat]
    containers: list[ContainerUsage]
    unknown_pods: set[str] = field(default_factory=set)  # pod UIDs in a cgroup but not in the pod list
    unknown_containers: set[str] = field(default_factory=set)  # container IDs the pod statuses do not name
    exited: list[int] = field(default_factory=list)  # PIDs NVML listed that were gone when we looked
    # --hard-limit: (namespace, pod) -> {gpu index: (bytes used, hard limit)} from the driver, per pod cgroup
    driver_pods: dict[tuple[str, str], dict[int, tuple[int, int]]] = field(default_factory=dict)

    def pod_used(self) -> dict[tuple[str, str], dict[int, int]]:
        """(namespace, pod) -> {gpu index: bytes} over all the pod's containers."""
        out: dict[tuple[str, str], dict[int, int]] = {}
        for c in self.containers:
            per = out.setdefault((c.key.namespace, c.key.pod), {})
            per[c.gpu_index] = per.get(c.gpu_index, 0) + c.used_bytes
        return out


def container_limits(
    pod: Mapping[str, Any], gpus: Sequence[tuple[int, str]], unit: MemoryUnit
) -> Mapping[str, Mapping[str, int]] | None:
    """{container name: {gpu uuid: limit bytes}} for a pod gpushare placed; None when it is not gpushare's.

    `gpus` are the node's offered GPUs as (index, uuid). The limit matches the env Allocate gave
    (matcher.container_env): the container's units over the pod's GPU count, on the assigned GPUs only.
    """
    placed = placed_request(pod)
    if placed is None:
        return None
    request, assignment = placed
    assigned = set(assignment.uuids_on(dict(gpus)))
    count = len(assignment.gpu_indices)
    out: dict[str, dict[str, int]] = {}
    for c in request.containers:
        per_gpu = c.units * unit.mib // count * MIB
        out[c.name] = {uuid: (per_gpu if uuid in assigned else 0) for _, uuid in gpus}
    return out


def index_pods(
    pods: Iterable[Mapping[str, Any]], gpus: Sequence[tuple[int, str]], unit: MemoryUnit
) -> dict[str, PodEntry]:
    """Pod UID -> what the monitor needs of it; finished pods are left out (their processes are gone)."""
    out: dict[str, PodEntry] = {}
    for pod in pods:
        if pod_is_finished(pod):
            continue
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        ids: dict[str, str] = {}
        for field_name in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(field_name) or []:
                raw = cs.get("containerID")
                if raw:
                    ids[status_container_id(raw)] = str(cs.get("name", ""))
        uid = str(meta.get("uid", ""))
        out[uid] = PodEntry(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=uid,
            containers=ids,
            limits=container_limits(pod, gpus, unit),
            pod=pod,
        )
    return out


def attribute(
    readings: Sequence[GpuReading],
    cgroups: Mapping[int, CgroupRef | None],
    pods: Mapping[str, PodEntry],
) -> Usage:
    """Sum each GPU's process memory by container.

    `cgroups` holds every PID NVML listed: its pod/container, None when it is in no pod, and no entry
    when the process exited before its cgroup could be read (it holds no memory any more: skipped).
    """
    usage = Usage(gpus=[], containers=[])
    by_key: dict[tuple[ContainerKey, str], ContainerUsage] = {}
    for r in readings:
        stat = GpuUsageStat(r.index, r.uuid, r.total_bytes, r.used_bytes)
        usage.gpus.append(stat)
        for p in r.processes:
            if p.pid not in cgroups:
                usage.exited.append(p.pid)
                continue
            ref = cgroups[p.pid]
            if ref is None:
                stat.outside_pods_bytes += p.used_bytes
                continue
            entry = pods.get(ref.pod_uid)
            if entry is None:
                usage.unknown_pods.add(ref.pod_uid)
                key = ContainerKey("", f"uid-{ref.pod_uid}", "", ref.pod_uid, ref.container_id)
                limit = None
            else:
                name = entry.containers.get(ref.container_id, "")
                if not name and ref.container_id:
                    usage.unknown_containers.add(ref.container_id)
                # A container the pod status does not name yet is labelled by its ID; a process in the pod's
                # cgroup but in no container's (a sandbox) by "". Neither has a known limit.
                label = name or (f"id:{ref.container_id[:12]}" if ref.container_id else "")
                key = ContainerKey(entry.namespace, entry.name, label, entry.uid, ref.container_id)
                limit = None
                if entry.limits is not None and name:
                    limit = (entry.limits.get(name) or {}).get(r.uuid, 0)
            cu = by_key.get((key, r.uuid))
            if cu is None:
                cu = by_key[(key, r.uuid)] = ContainerUsage(key, r.index, r.uuid, limit_bytes=limit)
                usage.containers.append(cu)
            cu.used_bytes += p.used_bytes
            cu.pids.append(p.pid)
    return usage


# -- over the limit ---------------------------------------------------------------------------------------


class OverLimitMode(enum.Enum):
    WARN = "warn"
    KILL = "kill"


@dataclass(frozen=True, slots=True)
class OverState:
    """A container over its limit on one GPU: since when, and when we last ended its processes."""

    since: float
    killed_at: float | None = None


StateKey = tuple[str, str, str]  # (pod uid, container name, gpu uuid)


@dataclass(frozen=True, slots=True)
class Crossed:
    """The container just went over its limit: one Event and one log line per crossing."""

    usage: ContainerUsage


@dataclass(frozen=True, slots=True)
class Cleared:
    """The container is back under its limit (or gone)."""

    key: StateKey
    usage: ContainerUsage | None


@dataclass(frozen=True, slots=True)
class Kill:
    """End these processes: the container stayed over its limit for the whole grace period."""

    usage: ContainerUsage
    over_for: float


Action = Crossed | Cleared | Kill


def state_key(c: ContainerUsage) -> StateKey:
    return (c.key.pod_uid, c.key.container, c.gpu_uuid)


def decide(
    usage: Usage,
    state: Mapping[StateKey, OverState],
    now: float,
    mode: OverLimitMode,
    grace: float,
) -> tuple[dict[StateKey, OverState], list[Action]]:
    """The next over-limit state and what to do, for one poll.

    A crossing is told once (Crossed) until the container is back under its limit (Cleared). In kill mode a
    container still over after `grace` seconds has its processes on that GPU ended (Kill); if it is still
    over `grace` seconds after that (a process that ignored the signal, a new one), it is ended again.
    """
    new: dict[StateKey, OverState] = {}
    actions: list[Action] = []
    current = {state_key(c): c for c in usage.containers}
    for key, c in current.items():
        if not c.over:
            continue
        prev = state.get(key)
        if prev is None:
            prev = OverState(since=now)
            actions.append(Crossed(c))
        if mode is OverLimitMode.KILL:
            last = prev.killed_at if prev.killed_at is not None else prev.since
            if now - last >= grace:
                actions.append(Kill(c, now - prev.since))
                prev = replace(prev, killed_at=now)
        new[key] = prev
    for key in state:
        if key not in new:
            actions.append(Cleared(key, current.get(key)))
    return new, actions


# -- the node annotation kubectl inspect reads --------------------------------------------------------------


def driver_usage(
    limits: Mapping[str, Mapping[str, Limits]], pods: Mapping[str, PodEntry], readings: Sequence[GpuReading]
) -> dict[tuple[str, str], dict[int, tuple[int, int]]]:
    """The driver's per-pod figures (pod UID -> {GPU UUID: Limits}) by (namespace, pod) and GPU index; pods not
    in the pod list and readings without `currentUsed` are left out."""
    index = {r.uuid: r.index for r in readings}
    out: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}
    for uid, per_gpu in limits.items():
        entry = pods.get(uid)
        if entry is None:
            continue
        for uuid, lim in per_gpu.items():
            if lim.current_used is not None and uuid in index:
                out.setdefault((entry.namespace, entry.name), {})[index[uuid]] = (lim.current_used, lim.hard)
    return out


def summarize(usage: Usage) -> UsageSummary:
    """MiB per GPU index and per pod (namespace/name) per GPU index, for `gpushare.io/gpu-usage`; a pod under a
    hard limit counts what the driver charges its cgroup (exact, the CUDA contexts included)."""
    pods: dict[str, dict[int, int]] = {}
    for (ns, name), per in usage.pod_used().items():
        if ns:
            pods[f"{ns}/{name}"] = {i: b // MIB for i, b in per.items()}
    for (ns, name), per_driver in usage.driver_pods.items():
        pods[f"{ns}/{name}"] = {i: used // MIB for i, (used, _hard) in per_driver.items()}
    return UsageSummary({g.index: g.used_bytes // MIB for g in usage.gpus}, pods)
