"""Pods waiting for GPU room: unbound, not finished, not gated, asking `nvidia.com/gpu-mem`.

The cache keeps them (fed by the pod watch, so a restarted extender knows at once who has waited how
long: the age is the pod's creationTimestamp, written by the API server) for the reservations loop
(share_scheduler.starvation), which holds room for those that waited too long, and for the metrics of
waits by class. Everything here is plain data and pure functions except `WaitingPods`, a small
thread-safe index.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from share_core.assignment import pod_is_finished
from share_core.assignment import pod_key
from share_core.assignment import pod_node
from share_core.holds import pod_controller_uid
from share_core.holds import pod_is_terminating
from share_core.holds import pod_priority
from share_core.podresources import HostRequest
from share_core.podresources import pod_host_request
from share_core.request import InvalidRequest
from share_core.request import PodRequest
from share_core.request import pod_request
from share_placement import Demand

# Waits are reported by class (metrics, logs): what kind of GPU room the pod needs.
CLASS_SHARE = "share"  # part of one GPU
CLASS_WHOLE = "whole-gpu"  # all of one GPU (its request at least the largest GPU's memory)
CLASS_MULTI = "multi-gpu"  # several GPUs (gpushare.io/gpu-count > 1)
WAIT_CLASSES = (CLASS_SHARE, CLASS_WHOLE, CLASS_MULTI)


@dataclass(frozen=True, slots=True)
class WaitingPod:
    """A pod waiting for GPU room, as the reservations loop weighs it."""

    key: str  # namespace/name
    uid: str
    scheduler: str
    created: float  # seconds since the epoch (creationTimestamp); 0 when the API gave none
    priority: int
    owner_uid: str
    demand: Demand  # count >= 1 GPUs of per_gpu units each, and the pod's CPU and memory
    # kube-scheduler tried it and found no room (PodScheduled False, reason Unschedulable): it waits in the
    # sense share-sim's queue means, not merely on its way through a scheduling cycle.
    unschedulable: bool = False

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return self.key.partition("/")[2]

    @property
    def units(self) -> int:
        """GPU memory the pod asks in all (resource units)."""
        return self.demand.per_gpu * self.demand.count

    def waited(self, now: float) -> float:
        return max(now - self.created, 0.0) if self.created else 0.0

    def ref(self) -> dict[str, Any]:
        """Enough of the pod to post an Event about it."""
        return {"metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}


def parse_timestamp(text: Any) -> float:
    """An RFC 3339 time as the API writes it, in seconds since the epoch; 0 for anything else."""
    if not isinstance(text, str) or not text:
        return 0.0
    return _parse_rfc3339(text)


@lru_cache(maxsize=4096)  # every pending pod's creationTimestamp, and a burst's pods share a few seconds
def _parse_rfc3339(text: str) -> float:
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return stamp.timestamp() if stamp.tzinfo is not None else 0.0


Parsed = tuple["PodRequest | None", HostRequest] | InvalidRequest  # pod_request and pod_host_request, or why not


def found_unschedulable(pod: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler's last try found no node for the pod (condition PodScheduled False with
    reason Unschedulable; a SchedulerError, e.g. an extender that answered "still syncing", is not it)."""
    for c in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled":
            return c.get("status") == "False" and c.get("reason") == "Unschedulable"
    return False


def parse_requests(pod: Mapping[str, Any]) -> Parsed:
    """What the pod asks of GPUs and of the host, worked out once for every reader of one watch event."""
    try:
        return pod_request(pod), pod_host_request(pod)
    except InvalidRequest as exc:
        return exc


def waiting_pod(pod: Mapping[str, Any], parsed: Callable[[], Parsed] | None = None) -> WaitingPod | None:
    """The pod as a waiting pod, or None: bound, finished, terminating, gated (it waits for its gates,
    not for room), asking no GPU memory, or asking it in a way nobody could honour. `parsed`: the
    caller's (memoised) `parse_requests` of this pod, so one watch event parses the containers once."""
    if pod_node(pod) or pod_is_finished(pod) or pod_is_terminating(pod):
        return None
    spec = pod.get("spec") or {}
    if spec.get("schedulingGates"):
        return None
    both = parsed() if parsed is not None else parse_requests(pod)
    if isinstance(both, InvalidRequest):
        return None
    request, host = both
    if request is None or request.gpu_count < 1 or request.per_gpu < 1:
        return None
    meta = pod.get("metadata") or {}
    return WaitingPod(
        key=pod_key(pod),
        uid=str(meta.get("uid") or ""),
        scheduler=str(spec.get("schedulerName") or ""),
        created=parse_timestamp(meta.get("creationTimestamp")),
        priority=pod_priority(pod),
        owner_uid=pod_controller_uid(pod),
        demand=Demand(
            per_gpu=request.per_gpu, count=request.gpu_count, models=request.models, cpu=host.cpu, memory=host.memory
        ),
        unschedulable=found_unschedulable(pod),
    )


def wait_class(demand: Demand, largest_gpu: int) -> str:
    """share, whole-gpu or multi-gpu (largest_gpu: the cluster's largest GPU, units; 0 when unknown)."""
    if demand.count > 1:
        return CLASS_MULTI
    if largest_gpu and demand.per_gpu >= largest_gpu:
        return CLASS_WHOLE
    return CLASS_SHARE


class WaitingPods:
    """key -> WaitingPod for every pod waiting for GPU room; `on_bound(pod, node)` is told when one is
    seen bound (the wait it ended is a metric), under the caller's lock: keep it quick.

    The pods asking several GPUs are indexed apart (`multi_gpu`), and `multi_version` counts the changes
    among them, so a reader that follows them (room for what waits, share_scheduler.leaveroom) learns
    that something changed by comparing one number, not by reading every waiting pod."""

    def __init__(self, on_bound: Callable[[WaitingPod, str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, WaitingPod] = {}
        self._multi: dict[str, WaitingPod] = {}
        self.multi_version = 0
        self.multi_changed_at = 0.0  # when multi_version last moved (seconds since the epoch)
        self.on_bound = on_bound

    def _set_multi(self, key: str, waiting: WaitingPod | None) -> None:
        """Under self._lock: the multi-GPU index follows the pod (`waiting` None: it is gone)."""
        old = self._multi.get(key)
        if waiting is not None and waiting.demand.count > 1:
            if old != waiting:
                self._multi[key] = waiting
                self.multi_version += 1
                self.multi_changed_at = time.time()
        elif old is not None:
            del self._multi[key]
            self.multi_version += 1
            self.multi_changed_at = time.time()

    def seen(self, key: str, uid: str, node: str, waiting: WaitingPod | None) -> None:
        """A pod as the watch shows it (`waiting` None: it does not wait, or no longer)."""
        with self._lock:
            self._set_multi(key, waiting)
            if waiting is not None:
                self._pods[key] = waiting
                return
            old = self._pods.pop(key, None)
        if old is not None and node and old.uid == uid and self.on_bound is not None:
            self.on_bound(old, node)

    def gone(self, key: str) -> None:
        with self._lock:
            self._pods.pop(key, None)
            self._set_multi(key, None)

    def keep_only(self, keys: set[str]) -> None:
        with self._lock:
            for key in set(self._pods) - keys:
                del self._pods[key]
                self._set_multi(key, None)

    def get(self, key: str) -> WaitingPod | None:
        with self._lock:
            return self._pods.get(key)

    def pods(self) -> list[WaitingPod]:
        with self._lock:
            return list(self._pods.values())

    def multi_gpu(self) -> tuple[int, float, list[WaitingPod]]:
        """(multi_version, multi_changed_at, the waiting pods asking 2+ GPUs) read together."""
        with self._lock:
            return self.multi_version, self.multi_changed_at, list(self._multi.values())

    def __len__(self) -> int:
        return len(self._pods)
