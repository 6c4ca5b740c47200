"""Allocate's imperative shell: read the pods and PodResources, match, build the env, record the pod.

Nothing is written before the answer is known: the only write is `gpushare.io/assigned: "true"` after
the pod's last container, made with the resourceVersion we read (re-read and re-checked on Conflict).
If that write fails, Allocate fails: kubelet rejects the pod and no annotation claims it was served.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from share_core.assignment import parse_assignment, pod_annotations
from share_core.contract import ANN_ASSIGNED, RESOURCE_MEM, MemoryUnit
from share_core.kube import Conflict, KubeClient, KubeError, NotFound
from share_core.request import InvalidRequest
from share_plugin.backend import GpuBackend
from share_plugin.matcher import AllocationError, Match, PodResourcesView, container_env, match_allocation
from share_plugin.podresources import PodResourcesUnavailable

log = logging.getLogger(__name__)


class PodResourcesSource(Protocol):
    def list(self) -> PodResourcesView: ...


class Allocator:
    def __init__(
        self,
        node: str,
        kube: KubeClient,
        backend: GpuBackend,
        unit: MemoryUnit,
        pod_resources: PodResourcesSource | None,
        device_id_strategy: str = "uuid",
        mps: bool = False,
        conflict_retries: int = 5,
    ) -> None:
        self.node = node
        self.kube = kube
        self.backend = backend
        self.unit = unit
        self.pod_resources = pod_resources
        self.device_id_strategy = device_id_strategy
        self.mps = mps
        self.conflict_retries = conflict_retries
        self._lock = threading.Lock()  # kubelet calls one at a time; keep it so if another client does not
        self._served: set[tuple[str, str]] = set()  # (pod uid, container): only used without PodResources

    def _view(self) -> PodResourcesView | None:
        if self.pod_resources is None:
            return None
        try:
            return self.pod_resources.list()
        except PodResourcesUnavailable as exc:
            log.warning("node %s: %s; matching by request size and assume time instead", self.node, exc)
            return None

    def allocate(self, device_ids: list[str]) -> dict[str, str]:
        """The env for the container kubelet is starting with `device_ids`; AllocationError if none."""
        with self._lock:
            try:
                pods = self.kube.list_pods(field_selector=f"spec.nodeName={self.node}").items
            except KubeError as exc:
                raise AllocationError(
                    f"node {self.node}: cannot read the pods bound to this node from the API server, so the "
                    f"container asking {len(device_ids)} {RESOURCE_MEM} cannot be matched to its pod: {exc}"
                ) from exc
            view = self._view()
            match = match_allocation(
                self.node, device_ids, pods, self.backend.gpus(), self.unit, view, frozenset(self._served)
            )
            env = container_env(match, self.unit, self.device_id_strategy, self.mps)
            if match.last and not match.assignment.assigned:
                self._mark_assigned(match)
            self._served.add((match.uid, match.container.name))
            unhealthy = [g.index for g in match.gpus if not g.healthy]
            log.info(
                "node %s: pod %s container %s: %d %s on GPU %s (%s) by %s%s%s",
                self.node,
                match.key,
                match.container.name,
                match.container.units,
                RESOURCE_MEM,
                ",".join(str(g.index) for g in match.gpus),
                ",".join(g.uuid for g in match.gpus),
                match.how,
                "; pod fully served, marked assigned" if match.last else "",
                f"; WARNING GPU {unhealthy} is unhealthy" if unhealthy else "",
            )
            return env

    def _mark_assigned(self, match: Match) -> None:
        """Patch `assigned: "true"` against the version we matched; on Conflict re-read and re-check."""
        rv = match.resource_version
        for _ in range(self.conflict_retries):
            try:
                self.kube.patch_pod_annotations(
                    match.namespace, match.name, {ANN_ASSIGNED: "true"}, resource_version=rv
                )
                return
            except Conflict:
                try:
                    pod = self.kube.get_pod(match.namespace, match.name)
                except KubeError as exc:
                    raise self._patch_failed(match, exc) from exc
                meta = pod.get("metadata") or {}
                try:
                    now = parse_assignment(pod_annotations(pod))
                except InvalidRequest as exc:
                    raise self._patch_failed(match, exc) from exc
                if (
                    meta.get("uid") != match.uid
                    or now is None
                    or (now.gpu_indices, now.gpu_uuids)
                    != (
                        match.assignment.gpu_indices,
                        match.assignment.gpu_uuids,
                    )
                ):
                    raise AllocationError(
                        f"node {self.node}: pod {match.key} changed while its container {match.container.name!r} "
                        f"was being served (its GPU assignment or UID is no longer the one matched); not serving it"
                    ) from None
                if now.assigned:
                    return
                rv = meta.get("resourceVersion", "")
            except NotFound as exc:
                raise AllocationError(f"node {self.node}: pod {match.key} was deleted while being served") from exc
            except KubeError as exc:
                raise self._patch_failed(match, exc) from exc
        raise self._patch_failed(match, Exception(f"still conflicting after {self.conflict_retries} attempts"))

    def _patch_failed(self, match: Match, exc: Exception) -> AllocationError:
        return AllocationError(
            f"node {self.node}: pod {match.key} container {match.container.name!r} matched GPU "
            f"{','.join(str(i) for i in match.assignment.gpu_indices)}, but marking the pod "
            f"{ANN_ASSIGNED}=true failed, so it is not served (nothing was written): {exc}"
        )
