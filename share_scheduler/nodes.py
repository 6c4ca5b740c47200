"""What the extender's cache is made of: plain facts about pods (what each contributes to which GPUs
and to its node's CPU, memory and pod slots) and nodes (their GPUs and allocatable resources, what is
promised of each, the compact view placement scores).

Pure data and pure functions; `share_scheduler.cache.ClusterCache` keeps them current from the API
server and from our own binds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from typing import Any

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_is_finished
from share_core.assignment import pod_key
from share_core.assignment import pod_node
from share_core.contract import ANN_HOLDS
from share_core.gpus import GpuInfo
from share_core.holds import Hold
from share_core.holds import InvalidHolds
from share_core.holds import pod_controller_uid
from share_core.holds import pod_holds
from share_core.holds import pod_is_terminating
from share_core.holds import pod_priority
from share_core.podresources import Allocatable
from share_core.podresources import pod_host_request
from share_core.request import InvalidRequest
from share_core.request import PodRequest
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import NodeView
from share_placement import node_view
from share_scheduler.waiting import WaitingPod


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one pod takes on one node: `per_gpu` units on each of `indices` (none for a pod without a
    GPU), `cpu` millicores, `memory` bytes and one pod slot, as kube-scheduler's NodeInfo counts it.
    A DRA claim's share of a GPU (or filter's hold on one) takes no pod slot: `pods` 0."""

    node: str
    indices: tuple[int, ...]
    per_gpu: int
    cpu: int = 0
    memory: int = 0
    pods: int = 1


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The facts about a pod that matter to GPU accounting (no full pod dicts are kept: memory)."""

    key: str
    uid: str
    node: str
    contribution: Contribution | None  # None: holds nothing (finished or unbound); a bound pod holds its host share
    assigned: bool = False
    problem: str = ""  # garbage annotations or quantities we could not honour
    priority: int = 0  # spec.priority (preemption weighs victims by it)
    owner_uid: str = ""  # the controller that recreates it ("" for a bare pod)
    terminating: bool = False  # deleted, still in its grace period: still counted, never a victim again
    labels: tuple[tuple[str, str], ...] = ()  # a bound pod's labels: which PodDisruptionBudgets select it
    started: float = 0.0  # status.startTime (epoch s; 0: not started): preemption's last tie-break


@dataclass(frozen=True, slots=True)
class PodFacts:
    """A pod as the cache takes it in: its record, whether it finished, its demand (only worked out when
    a learning policy has not seen the pod yet)."""

    record: PodRecord
    finished: bool
    demand: Demand | None = None
    holds: tuple[Hold, ...] | None = None  # the pod's gpushare.io/holds (None: it has no such annotation)
    hold_problem: str = ""  # why its holds annotation could not be read
    waiting: WaitingPod | None = None  # an unbound pod waiting for GPU room (share_scheduler.waiting)


@dataclass(frozen=True, slots=True)
class Assumed:
    uid: str
    contribution: Contribution
    since: float
    held: bool = False  # held by filter for a bind still to come (short-lived), not chosen by bind


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """Pure: what a pod from the API server holds. Unbound or finished pods hold nothing; a bound one
    holds its CPU, memory and a pod slot whoever scheduled it (kube-scheduler's cache counts every
    assigned, non-terminal pod: DaemonSets, static pods, other schedulers' pods), and the GPUs of our
    assignment where it carries one."""
    key = pod_key(pod)
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    node = pod_node(pod)
    if not node or pod_is_finished(pod):
        return PodRecord(key, uid, node, None, priority=pod_priority(pod), owner_uid=pod_controller_uid(pod))
    who = {
        "priority": pod_priority(pod),
        "owner_uid": pod_controller_uid(pod),
        "terminating": pod_is_terminating(pod),
        "labels": pod_labels(pod),
        "started": pod_started(pod),
    }
    host = pod_host_request(pod)
    problem = f"CPU/memory request: {host.problem}" if host.problem else ""
    try:
        assignment = parse_assignment(pod_annotations(pod))
    except InvalidRequest as exc:
        problem = f"{exc}; {problem}" if problem else str(exc)
        assignment = None
    if assignment is None:
        return PodRecord(key, uid, node, Contribution(node, (), 0, host.cpu, host.memory), problem=problem, **who)
    return PodRecord(
        key,
        uid,
        node,
        Contribution(node, assignment.gpu_indices, assignment.per_gpu, host.cpu, host.memory),
        assignment.assigned,
        problem,
        **who,
    )


def pod_labels(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """metadata.labels as sorted pairs (a tuple: records are frozen, and most pods share few label sets)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, Mapping):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def pod_started(pod: Mapping[str, Any]) -> float:
    """status.startTime as epoch seconds (0.0 when not started or unreadable)."""
    text = (pod.get("status") or {}).get("startTime")
    if not isinstance(text, str) or not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def pod_holds_facts(pod: Mapping[str, Any]) -> tuple[tuple[Hold, ...] | None, str]:
    """(the pod's holds, or None without the annotation; why they could not be read, or "")."""
    if ANN_HOLDS not in pod_annotations(pod):
        return None, ""
    try:
        return tuple(pod_holds(pod)), ""
    except InvalidHolds as exc:
        return (), str(exc)


def demand_of(request: PodRequest | None, cpu: int = 0, memory: int = 0) -> Demand:
    """The placement demand: the GPU request (None: a pod that asks no GPU, count 0) and the pod's
    own CPU (millicores) and memory (bytes)."""
    if request is None:
        return Demand(per_gpu=0, count=0, cpu=cpu, memory=memory)
    return Demand(per_gpu=request.per_gpu, count=request.gpu_count, models=request.models, cpu=cpu, memory=memory)


NO_ALLOCATABLE = Allocatable(0, 0, 0)  # a node that reports none takes no pod (allowed pods 0)
_view_ids = itertools.count(1)  # process-wide, never reused: a view id names one NodeView forever


@dataclass(frozen=True, slots=True, eq=False)
class NodeSnapshot:
    """One node frozen at one moment: what filter, prioritize and bind read, outside the cache lock.

    Built once per change of the node (lazily, on the first read after it) and then shared by every
    request until the node changes again, so the hot path builds nothing per node. `view_id` names
    `view` (the placement view, see `placement.node_view`): equal ids mean equal views, so a memo
    keyed on it can never answer for another state. `memo` is this snapshot's own scratch (e.g. the
    filter's reasons): it dies with the snapshot, so nothing in it can outlive the state it describes.
    """

    name: str
    gpus: tuple[GpuInfo, ...]
    used: tuple[int, ...]
    problem: str
    state: NodeState
    view: NodeView
    view_id: int
    free_desc: tuple[int, ...]  # free units of the healthy GPUs, largest first (O(1) fits, any model)
    allocatable: Allocatable = NO_ALLOCATABLE
    requested: tuple[int, int, int] = (0, 0, 0)  # CPU millicores, memory bytes, pods bound here
    order: tuple[int, ...] = ()  # a DRA node: GPU indices in the order its slice lists them (first fit)
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)


@dataclass(slots=True)
class NodeEntry:
    """One node: its GPUs (index order) and units promised on each, plus its current snapshot."""

    name: str
    gpus: tuple[GpuInfo, ...]
    used: list[int]
    position: dict[int, int]  # GPU index -> position in `gpus`
    problem: str = ""
    allocatable: Allocatable = NO_ALLOCATABLE
    cpu: int = 0  # millicores requested by the pods bound here (and ours assumed or held)
    memory: int = 0  # bytes, likewise
    pods: int = 0  # pods counted here
    order: tuple[int, ...] = ()  # GPUs from our ResourceSlices (DRA mode): their indices in slice order
    _snap: NodeSnapshot | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls, name: str, gpus: Iterable[GpuInfo], problem: str = "", allocatable: Allocatable = NO_ALLOCATABLE
    ) -> NodeEntry:
        ordered = tuple(sorted(gpus, key=lambda g: g.index))
        return cls(name, ordered, [0] * len(ordered), {g.index: i for i, g in enumerate(ordered)}, problem, allocatable)

    def host_free(self) -> tuple[int, int]:
        """(CPU, memory) free as placement sees them: NodeResourcesFit's test `request == 0 or request <=
        allocatable - requested` is `free >= request` with free floored at 0; a node at its pod limit
        fits no pod ("Too many pods"), shown as -1 so that no demand, even one asking nothing, fits."""
        a = self.allocatable
        if self.pods + 1 > a.pods:
            return -1, -1
        return max(a.cpu - self.cpu, 0), max(a.memory - self.memory, 0)

    def touch(self) -> None:
        self._snap = None

    def holding(self, held: Mapping[int, int]) -> NodeEntry:
        """A copy with `held` units (GPU index -> units) more taken on its GPUs (a pod that must respect
        holds sees the node so); the original and its snapshot are untouched."""
        used = list(self.used)
        for index, units in held.items():
            pos = self.position.get(index)
            if pos is not None:
                used[pos] += units
        return NodeEntry(
            self.name,
            self.gpus,
            used,
            self.position,
            self.problem,
            self.allocatable,
            self.cpu,
            self.memory,
            self.pods,
            self.order,
        )

    def snapshot(self, intern: dict[NodeView, int] | None = None) -> NodeSnapshot:
        """The node as it is now (memoised until it changes; call under the cache lock).

        `intern` maps views already seen to their ids, so nodes in the same state share a view id
        (and so share memoised scores); without it every snapshot gets a fresh id."""
        snap = self._snap
        if snap is None:
            used = tuple(self.used)
            cpu_free, memory_free = self.host_free()
            state = NodeState(
                self.name,
                tuple(
                    GpuSlot(g.index, g.model, g.memory, max(g.memory - u, 0), g.healthy)
                    for g, u in zip(self.gpus, used, strict=True)
                ),
                cpu_free,
                memory_free,
            )
            view = node_view(state)[0]
            if intern is None:
                view_id = next(_view_ids)
            else:
                view_id = intern.get(view, 0)
                if not view_id:
                    view_id = intern[view] = next(_view_ids)
            free_desc = tuple(sorted((s.free for s in state.gpus if s.healthy), reverse=True))
            snap = self._snap = NodeSnapshot(
                self.name,
                self.gpus,
                used,
                self.problem,
                state,
                view,
                view_id,
                free_desc,
                self.allocatable,
                (self.cpu, self.memory, self.pods),
                self.order,
            )
        return snap

    def state(self) -> NodeState:
        """The plain-data view placement policies take (memoised until the node changes)."""
        return self.snapshot().state

    def free_desc(self) -> tuple[int, ...]:
        return self.snapshot().free_desc
