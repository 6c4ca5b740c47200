"""What the extender's cache is made of: plain facts about pods (what each contributes to which GPUs)
and nodes (their GPUs, what is promised on each, the compact view placement scores).

Pure data and pure functions; `share_scheduler.cache.ClusterCache` keeps them current from the API
server and from our own binds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from share_core.assignment import parse_assignment, pod_annotations, pod_is_finished, pod_key, pod_node
from share_core.gpus import GpuInfo
from share_core.request import InvalidRequest, PodRequest
from share_placement import Demand, GpuSlot, NodeState, NodeView, node_view


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one pod takes on one node: `per_gpu` units on each of `indices`."""

    node: str
    indices: tuple[int, ...]
    per_gpu: int


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The facts about a pod that matter to GPU accounting (no full pod dicts are kept: memory)."""

    key: str
    uid: str
    node: str
    contribution: Contribution | None  # None: holds no GPU memory (no assignment, finished, unbound)
    assigned: bool = False
    problem: str = ""  # garbage annotations we could not honour


@dataclass(frozen=True, slots=True)
class PodFacts:
    """A pod as the cache takes it in: its record, whether it finished, its request (only parsed when a
    learning policy has not seen the pod yet)."""

    record: PodRecord
    finished: bool
    request: PodRequest | None = None


@dataclass(frozen=True, slots=True)
class Assumed:
    uid: str
    contribution: Contribution
    since: float
    held: bool = False  # held by filter for a bind still to come (short-lived), not chosen by bind


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """Pure: what a pod from the API server holds. Unbound or finished pods hold nothing."""
    key = pod_key(pod)
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    node = pod_node(pod)
    if not node or pod_is_finished(pod):
        return PodRecord(key, uid, node, None)
    try:
        assignment = parse_assignment(pod_annotations(pod))
    except InvalidRequest as exc:
        return PodRecord(key, uid, node, None, problem=str(exc))
    if assignment is None:
        return PodRecord(key, uid, node, None)
    return PodRecord(
        key, uid, node, Contribution(node, assignment.gpu_indices, assignment.per_gpu), assignment.assigned
    )


def demand_of(request: PodRequest) -> Demand:
    return Demand(per_gpu=request.per_gpu, count=request.gpu_count, models=request.models)


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
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)


@dataclass(slots=True)
class NodeEntry:
    """One node: its GPUs (index order) and units promised on each, plus its current snapshot."""

    name: str
    gpus: tuple[GpuInfo, ...]
    used: list[int]
    position: dict[int, int]  # GPU index -> position in `gpus`
    problem: str = ""
    _snap: NodeSnapshot | None = field(default=None, repr=False)

    @classmethod
    def build(cls, name: str, gpus: Iterable[GpuInfo], problem: str = "") -> NodeEntry:
        ordered = tuple(sorted(gpus, key=lambda g: g.index))
        return cls(name, ordered, [0] * len(ordered), {g.index: i for i, g in enumerate(ordered)}, problem)

    def touch(self) -> None:
        self._snap = None

    def snapshot(self, intern: dict[NodeView, int] | None = None) -> NodeSnapshot:
        """The node as it is now (memoised until it changes; call under the cache lock).

        `intern` maps views already seen to their ids, so nodes in the same state share a view id
        (and so share memoised scores); without it every snapshot gets a fresh id."""
        snap = self._snap
        if snap is None:
            used = tuple(self.used)
            state = NodeState(
                self.name,
                tuple(
                    GpuSlot(g.index, g.model, g.memory, max(g.memory - u, 0), g.healthy)
                    for g, u in zip(self.gpus, used, strict=True)
                ),
            )
            view = node_view(state)[0]
            if intern is None:
                view_id = next(_view_ids)
            else:
                view_id = intern.get(view, 0)
                if not view_id:
                    view_id = intern[view] = next(_view_ids)
            free_desc = tuple(sorted((s.free for s in state.gpus if s.healthy), reverse=True))
            snap = self._snap = NodeSnapshot(self.name, self.gpus, used, self.problem, state, view, view_id, free_desc)
        return snap

    def state(self) -> NodeState:
        """The plain-data view placement policies take (memoised until the node changes)."""
        return self.snapshot().state

    def free_desc(self) -> tuple[int, ...]:
        return self.snapshot().free_desc
