"""Allocate's imperative shell: read the pods and PodResources, match, build the env, record the pod.

Nothing is written before the answer is known: the only write is `gpushare.io/assigned: "true"` after
the pod's last container, made with the resourceVersion we read (re-read and re-checked on Conflict).
If that write fails, Allocate fails: kubelet rejects the pod and no annotation claims it was served.

kubelet before 1.34 lists inactive pods in PodResources (matcher.py says how they are told apart). A pod
it rejected at admission is listed holding nothing until the API server shows it Failed, which kubelet's
status manager writes asynchronously (status/status_manager.go SetPodStatus -> syncBatch): a moment in
which it looks exactly like the pod being admitted. So when the match is ambiguous on such a kubelet,
Allocate re-reads both, for up to `settle` seconds, before it refuses or picks among identical pods.
kubelet's Allocate call has no deadline (cm/devicemanager/endpoint.go allocate: context.Background()).

Besides answering, it tells people what it sees: an Event on a pod gpushare cannot serve that asked for
gpu-mem, and (from `audit`, run periodically by the plugin) on a pod kubelet started without Allocate.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Protocol

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_is_finished
from share_core.contract import ANN_ASSIGNED
from share_core.contract import DEFAULT_MPS_PIPE_DIR
from share_core.contract import DEVICE_LIST_STRATEGIES
from share_core.contract import EVENT_ALLOCATE_REFUSED
from share_core.contract import EVENT_RUNS_WITHOUT_GPU
from share_core.contract import RESOURCE_MEM
from share_core.contract import DeviceListStrategy
from share_core.kube import Conflict
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_core.request import InvalidRequest
from share_plugin.matcher import AllocationError
from share_plugin.matcher import BindMount
from share_plugin.matcher import Match
from share_plugin.matcher import Pod
from share_plugin.matcher import PodResourcesView
from share_plugin.matcher import container_cdi_devices
from share_plugin.matcher import container_env
from share_plugin.matcher import container_mounts
from share_plugin.matcher import match_allocation
from share_plugin.matcher import runs_without_gpu
from share_plugin.mps import control_problem
from share_plugin.node import PluginNode
from share_plugin.podresources import PodResourcesUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ContainerAnswer:
    """One container's part of the Allocate response."""

    envs: dict[str, str]
    mounts: list[BindMount] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)


class PodResourcesSource(Protocol):
    def list(self) -> PodResourcesView: ...


@dataclass(frozen=True, slots=True)
class AllocateOptions:
    """How Allocate answers: share-plugin's flags of the same names."""

    device_id_strategy: str = "uuid"
    device_list_strategy: str = DeviceListStrategy.ENVVAR
    mps: bool = False
    mps_pipe_dir: str = DEFAULT_MPS_PIPE_DIR
    mps_shm_dir: str = ""
    conflict_retries: int = 5  # writes of the assigned annotation tried again on Conflict
    settle: float = 3.0  # seconds an ambiguous match may wait for the API to show rejected pods Failed

    def __post_init__(self) -> None:
        if self.device_list_strategy not in DEVICE_LIST_STRATEGIES:
            choices = ", ".join(DEVICE_LIST_STRATEGIES)
            raise ValueError(f"device list strategy {self.device_list_strategy!r}: expected one of {choices}")


class Allocator:
    def __init__(
        self,
        node: PluginNode,
        pod_resources: PodResourcesSource | None,
        options: AllocateOptions = AllocateOptions(),
    ) -> None:
        self.node, self.kube, self.backend, self.unit = node.name, node.kube, node.backend, node.unit
        self.pod_resources = pod_resources
        self.options = options
        self._lock = threading.Lock()  # kubelet calls one at a time; keep it so if another client does not
        # (pod uid, container) served since start: regular init containers are invisible in PodResources.
        self._served: set[tuple[str, str]] = set()
        self._reported: set[tuple[str, str]] = set()  # (pod uid, event reason) already told, once each
        # device IDs -> (pod uid, namespace, name) each container was served: PreStartContainer names only the
        # devices (--hard-limit finds the pod's cgroup by it). kubelet never gives one device to two live
        # containers; the oldest entries go first.
        self._served_devices: dict[frozenset[str], tuple[str, str, str]] = {}
        self._tell_lock = threading.Lock()  # audit runs beside Allocate

    def _view(self) -> PodResourcesView | None:
        if self.pod_resources is None:
            return None
        try:
            return self.pod_resources.list()
        except PodResourcesUnavailable as exc:
            log.warning("node %s: %s; matching by request size and assume time instead", self.node, exc)
            return None

    def mps_problem(self) -> str | None:
        """Why the MPS control daemon cannot be reached (share_plugin.mps), or None."""
        return control_problem(self.options.mps_pipe_dir)

    def allocate(self, device_ids: list[str]) -> ContainerAnswer:
        """What the container kubelet is starting with `device_ids` gets (env, mounts, CDI devices);
        AllocationError if none."""
        if self.options.mps:
            problem = self.mps_problem()
            if problem is not None:
                # Without the daemon CUDA runs without MPS, i.e. without the hard limit this node promises.
                raise AllocationError(
                    f"node {self.node}: the MPS control daemon is not running ({problem}); gpushare runs in MPS mode "
                    f"and does not hand out GPU memory without its hard limit: start the daemon (chart "
                    f"devicePlugin.mps) and the pod will be admitted when it is retried"
                )
        with self._lock:
            match = self._match(device_ids)
            env = container_env(
                match,
                self.unit,
                device_id_strategy=self.options.device_id_strategy,
                mps=self.options.mps,
                device_list_strategy=self.options.device_list_strategy,
                mps_pipe_dir=self.options.mps_pipe_dir,
            )
            answer = ContainerAnswer(
                env,
                container_mounts(
                    match,
                    self.options.device_id_strategy,
                    self.options.device_list_strategy,
                    self.options.mps,
                    self.options.mps_pipe_dir,
                    self.options.mps_shm_dir,
                ),
                container_cdi_devices(match, self.options.device_id_strategy, self.options.device_list_strategy),
            )
            if match.last and not match.assignment.assigned:
                self._mark_assigned(match)
            self._served.add((match.uid, match.container.name))
            self._served_devices[frozenset(device_ids)] = (match.uid, match.namespace, match.name)
            while len(self._served_devices) > 4096:
                del self._served_devices[next(iter(self._served_devices))]
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
            return answer

    def pod_of_devices(self, device_ids: Sequence[str]) -> tuple[str, str, str] | None:
        """(pod uid or "", namespace, name) of the container kubelet gave `device_ids`: what this process served,
        else what kubelet's PodResources says (after a plugin restart between Allocate and the container's
        start; the UID is then read from the API by the caller)."""
        key = frozenset(device_ids)
        with self._lock:
            known = self._served_devices.get(key)
        if known is not None:
            return known
        view = self._view() or {}
        for (namespace, name), containers in view.items():
            if any(key <= ids for ids in containers.values()):
                return ("", namespace, name)
        return None

    def kubelet_restarted(self) -> None:
        """A new kubelet: forget which containers we served. A pod whose admission the old kubelet cut
        short (its Allocate answered, then kubelet stopped before the rejection reached the API) is
        admitted again by the new one, holding nothing: it is admitting, not inactive. Called before we
        register again, so no Allocate of the new kubelet precedes it; the lock lets one in flight finish."""
        with self._lock:
            self._served.clear()

    def _match(self, device_ids: list[str]) -> Match:
        """Read pods and PodResources, match; on an ambiguous answer from a kubelet that lists inactive
        pods, read again until the API settles or `settle` runs out."""
        deadline = time.monotonic() + self.options.settle
        delay = 0.05
        while True:
            try:
                pods = self.kube.list_pods(field_selector=f"spec.nodeName={self.node}").items
            except KubeError as exc:
                raise AllocationError(
                    f"node {self.node}: cannot read the pods bound to this node from the API server, so the "
                    f"container asking {len(device_ids)} {RESOURCE_MEM} cannot be matched to its pod: {exc}"
                ) from exc
            view = self._view()
            live = {(p.get("metadata") or {}).get("uid") for p in pods}
            self._served = {s for s in self._served if s[0] in live}  # forget pods that are gone
            try:
                match = match_allocation(
                    self.node, device_ids, pods, self.backend.gpus(), self.unit, view, frozenset(self._served)
                )
                failure = None
                if not match.alternatives:
                    return match
            except AllocationError as exc:
                failure = exc
            if view is None or time.monotonic() >= deadline or not self._lists_inactive_pods(pods, view):
                if failure is None:
                    return match
                for pod in failure.implicated:
                    self._tell(pod, EVENT_ALLOCATE_REFUSED, str(failure))
                raise failure
            log.info(
                "node %s: %s for %d %s is ambiguous and kubelet lists inactive pods; reading again",
                self.node,
                "the match" if failure is None else "Allocate",
                len(device_ids),
                RESOURCE_MEM,
            )
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)

    def _lists_inactive_pods(self, pods: Sequence[Pod], view: PodResourcesView) -> bool:
        """kubelet's PodResources List includes pods that are not active: kubelet before 1.34, or
        KubeletPodResourcesListUseActivePods off (pkg/features/kube_features.go; server_v1.go List).

        Seen directly when it lists a pod the API shows finished (kubelet wrote that phase, so it knows
        the pod is not active; a pod being deleted may still be active); otherwise by the kubelet version
        its Node reports (the gate's default). A Node that cannot be read counts as yes (waiting
        only costs time); one without a kubelet version was not registered by a kubelet: no.
        """
        for pod in pods:
            meta = pod.get("metadata") or {}
            if pod_is_finished(pod) and (meta.get("namespace") or "default", meta.get("name") or "") in view:
                return True
        try:
            node = self.kube.get_node(self.node)
        except KubeError:
            return True
        version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or ""
        m = re.match(r"v?(\d+)\.(\d+)", version)
        return bool(m) and (int(m.group(1)), int(m.group(2))) < (1, 34)

    def audit(self) -> int:
        """Find pods kubelet started without our Allocate; log and record an Event once per pod.

        Returns how many such pods run now. Quiet when the API server or PodResources cannot be read:
        this is a report, not a decision.
        """
        if self.pod_resources is None:
            return 0
        try:
            pods = self.kube.list_pods(field_selector=f"spec.nodeName={self.node}").items
            view = self.pod_resources.list()
        except (KubeError, PodResourcesUnavailable) as exc:
            log.debug("node %s: audit skipped: %s", self.node, exc)
            return 0
        found = runs_without_gpu(pods, view)
        live = {str((p.get("metadata") or {}).get("uid")) for p in pods}
        with self._tell_lock:
            self._reported = {r for r in self._reported if r[0] in live or "/" in r[0]}
        for item in found:
            self._tell(item.pod, EVENT_RUNS_WITHOUT_GPU, item.message(self.node))
        return len(found)

    def _tell(self, pod: Pod, reason: str, message: str) -> None:
        """Log and record a Warning Event on the pod, once per pod and reason; never fails the caller."""
        meta = pod.get("metadata") or {}
        key = (str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"), reason)
        with self._tell_lock:
            if key in self._reported:
                return
            self._reported.add(key)
        log.warning("node %s: %s: %s", self.node, reason, message)
        try:
            self.kube.create_event(pod, reason, message, "Warning")
        except KubeError as exc:
            log.warning(
                "node %s: cannot record event %s on pod %s/%s: %s",
                self.node,
                reason,
                meta.get("namespace"),
                meta.get("name"),
                exc,
            )

    def _mark_assigned(self, match: Match) -> None:
        """Patch `assigned: "true"` against the version we matched; on Conflict re-read and re-check."""
        rv = match.resource_version
        for _ in range(self.options.conflict_retries):
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
        raise self._patch_failed(match, Exception(f"still conflicting after {self.options.conflict_retries} attempts"))

    def _patch_failed(self, match: Match, exc: Exception) -> AllocationError:
        return AllocationError(
            f"node {self.node}: pod {match.key} container {match.container.name!r} matched GPU "
            f"{','.join(str(i) for i in match.assignment.gpu_indices)}, but marking the pod "
            f"{ANN_ASSIGNED}=true failed, so it is not served (nothing was written): {exc}"
        )
