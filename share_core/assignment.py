"""The GPU choice the extender records on a pod at bind, and the plugin consumes at Allocate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from share_core.contract import ANN_ASSIGNED
from share_core.contract import ANN_ASSUME_TIME
from share_core.contract import ANN_GPU_INDEX
from share_core.contract import ANN_GPU_MEM
from share_core.contract import ANN_GPU_UUID
from share_core.contract import TERMINAL_PHASES
from share_core.request import InvalidRequest
from share_core.request import PodRequest
from share_core.request import pod_request

Pod = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Assignment:
    """GPU indices/UUIDs (same order) and the pod's total memory, split evenly over them."""

    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    total: int
    assume_time_ns: int
    assigned: bool = False

    @property
    def per_gpu(self) -> int:
        return self.total // len(self.gpu_indices)

    def uuids_on(self, offered: Mapping[int, str]) -> list[str]:
        """The assigned GPUs' UUIDs, in order: the annotation's, else the node's GPU at that index (an
        older or hand-made assignment may name indices only); a GPU the node does not offer is left out."""
        out = []
        for i, idx in enumerate(self.gpu_indices):
            uuid = (self.gpu_uuids[i] if i < len(self.gpu_uuids) else "") or offered.get(idx, "")
            if uuid:
                out.append(uuid)
        return out

    def to_annotations(self) -> dict[str, str]:
        return {
            ANN_GPU_INDEX: ",".join(str(i) for i in self.gpu_indices),
            ANN_GPU_UUID: ",".join(self.gpu_uuids),
            ANN_GPU_MEM: str(self.total),
            ANN_ASSUME_TIME: str(self.assume_time_ns),
            ANN_ASSIGNED: "true" if self.assigned else "false",
        }


ASSIGNMENT_KEYS = (ANN_GPU_INDEX, ANN_GPU_UUID, ANN_GPU_MEM, ANN_ASSUME_TIME, ANN_ASSIGNED)


def parse_assignment(annotations: Mapping[str, str] | None) -> Assignment | None:
    """The assignment recorded in pod annotations; None if the pod has none.

    Raises InvalidRequest for garbage, naming the annotation.
    """
    annotations = annotations or {}
    raw_index = annotations.get(ANN_GPU_INDEX)
    if raw_index is None or str(raw_index).strip() == "":
        return None
    try:
        indices = tuple(int(p) for p in str(raw_index).split(","))
    except ValueError as exc:
        raise InvalidRequest(f"annotation {ANN_GPU_INDEX}={raw_index!r} is not a list of GPU indices") from exc
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise InvalidRequest(f"annotation {ANN_GPU_INDEX}={raw_index!r} is not a list of distinct GPU indices")
    raw_uuid = str(annotations.get(ANN_GPU_UUID) or "")
    uuids = tuple(u for u in raw_uuid.split(",")) if raw_uuid else ()
    if uuids and len(uuids) != len(indices):
        raise InvalidRequest(f"annotation {ANN_GPU_UUID}={raw_uuid!r} does not match {ANN_GPU_INDEX}={raw_index!r}")
    raw_mem = annotations.get(ANN_GPU_MEM)
    try:
        total = int(str(raw_mem))
    except ValueError as exc:
        raise InvalidRequest(f"annotation {ANN_GPU_MEM}={raw_mem!r} is not a whole amount") from exc
    if total < 0 or total % len(indices):
        raise InvalidRequest(f"annotation {ANN_GPU_MEM}={raw_mem!r} does not split evenly over {len(indices)} GPU(s)")
    raw_time = annotations.get(ANN_ASSUME_TIME) or "0"
    try:
        assume = int(str(raw_time))
    except ValueError as exc:
        raise InvalidRequest(f"annotation {ANN_ASSUME_TIME}={raw_time!r} is not nanoseconds") from exc
    assigned = str(annotations.get(ANN_ASSIGNED, "false")).strip().lower() == "true"
    return Assignment(indices, uuids, total, assume, assigned)


def placed_request(pod: Pod) -> tuple[PodRequest, Assignment] | None:
    """A pod gpushare placed: its request and its assignment; None for any other pod, or garbage."""
    try:
        request = pod_request(pod)
        assignment = parse_assignment(pod_annotations(pod))
    except InvalidRequest:
        return None
    if request is None or assignment is None:
        return None
    return request, assignment


def pod_key(pod: Pod) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def pod_annotations(pod: Pod) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def pod_node(pod: Pod) -> str:
    return (pod.get("spec") or {}).get("nodeName") or ""


def pod_is_finished(pod: Pod) -> bool:
    """Succeeded or Failed: its containers are gone and its GPU memory is free again."""
    return ((pod.get("status") or {}).get("phase")) in TERMINAL_PHASES
