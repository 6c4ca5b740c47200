"""How much of each GPU is promised: a pure function of a node's GPUs and the pods on it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field

from share_core.assignment import Pod
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_is_finished
from share_core.assignment import pod_key
from share_core.gpus import GpuInfo
from share_core.request import InvalidRequest


@dataclass(slots=True)
class GpuUsage:
    index: int
    uuid: str
    model: str
    total: int
    healthy: bool
    used: int = 0
    pods: list[tuple[str, int]] = field(default_factory=list)  # (namespace/name, units on this GPU)

    @property
    def free(self) -> int:
        return max(self.total - self.used, 0)


@dataclass(slots=True)
class NodeUsage:
    gpus: list[GpuUsage]
    problems: list[str] = field(default_factory=list)  # pods whose annotations we could not honour

    def by_index(self) -> dict[int, GpuUsage]:
        return {g.index: g for g in self.gpus}


def holds_gpu_memory(pod: Pod) -> bool:
    """A pod holds its GPU memory from bind until it finishes or is deleted."""
    return not pod_is_finished(pod)


def node_usage(gpus: Iterable[GpuInfo], pods: Iterable[Pod]) -> NodeUsage:
    """Per-GPU memory promised on one node, from the assignment annotations of its live pods."""
    usage = NodeUsage([GpuUsage(g.index, g.uuid, g.model, g.memory, g.healthy) for g in gpus])
    by_index = usage.by_index()
    for pod in pods:
        if not holds_gpu_memory(pod):
            continue
        try:
            assignment = parse_assignment(pod_annotations(pod))
        except InvalidRequest as exc:
            usage.problems.append(f"pod {pod_key(pod)}: {exc}")
            continue
        if assignment is None:
            continue
        for index in assignment.gpu_indices:
            gpu = by_index.get(index)
            if gpu is None:
                usage.problems.append(f"pod {pod_key(pod)}: assigned GPU {index}, which the node does not have")
                continue
            gpu.used += assignment.per_gpu
            gpu.pods.append((pod_key(pod), assignment.per_gpu))
    return usage
