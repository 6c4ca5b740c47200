"""`--hard-limit` in the device plugin: the pod's cgroup gets its hard GPU memory limit at PreStartContainer.

Why PreStartContainer (k8s.io/kubernetes v1.37.2, pkg/kubelet): kubelet asks a plugin for its options when it
connects (cm/devicemanager/manager.go PluginConnected -> GetDevicePluginOptions), and for a plugin with
`pre_start_required` it calls PreStartContainer in GetDeviceRunContainerOptions -> callPreStartContainerIfNeeded,
from containerManagerImpl.GetResources <- Kubelet.GenerateRunContainerOptions <- kuberuntime
generateContainerConfig, which startContainer runs in "Step 2: create the container" *before*
runtimeService.CreateContainer: the container does not exist yet, so nothing of it has run. The pod's cgroup
does exist: Kubelet.SyncPod made it (pcm.EnsureExists) before it called containerRuntime.SyncPod, which makes
the sandbox and then the containers. A PreStartContainer error fails that container's start; kubelet retries.
The container's own cgroup is made by the runtime inside CreateContainer, after the hook: so the limit goes on
the pod's cgroup, where cgroup v2's hierarchy makes it one budget for all the pod's containers.

Removal: the device plugin API has no hook at pod removal. kubelet kills the containers and the sandbox
(SyncTerminatingPod), then removes the pod cgroup (HandlePodCleanups -> cleanupOrphanedPodCgroups ->
podContainerManager.Destroy). The plugin watches its limited pod cgroups locally every second: once one that
held processes is empty, the pod is going, and its limits are cleared (soft 0, hard max) before kubelet removes
the cgroup; a cgroup removed first took its limits with it (NVIDIA: removing the cgroup clears them).
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence

from share_core.contract import ANN_NODE_HARD_LIMIT
from share_core.contract import HardLimitMode
from share_core.kube import KubeError
from share_core.kube import now_rfc3339
from share_node.hardlimit import HardLimiter
from share_node.hardlimit import HardLimitError
from share_node.hardlimit import Limits
from share_node.hardlimit import Support
from share_node.hardlimit import check_required
from share_node.hardlimit import gpu_facts
from share_node.hardlimit import pod_gpu_limits
from share_node.hardlimit import probe
from share_plugin.node import PluginNode

log = logging.getLogger(__name__)

AGENT = "share-plugin"


# The allocator's pod_of_devices: device IDs -> (pod uid or "", namespace, name), or None.
PodOfDevices = Callable[[Sequence[str]], "tuple[str, str, str] | None"]


class PluginHardLimit:
    """The plugin's use of the node's hard limit: support, PreStartContainer, restart adoption, cleanup."""

    def __init__(
        self,
        node: PluginNode,
        support: Support,
        limiter: HardLimiter | None,
        pod_of_devices: PodOfDevices | None = None,
        sweep_interval: float = 1.0,
    ) -> None:
        self.node, self.kube, self.backend, self.unit = node.name, node.kube, node.backend, node.unit
        self.support = support
        self.limiter = limiter if support.enforced else None
        self._pod_of_devices = pod_of_devices
        self.sweep_interval = sweep_interval
        self.pre_starts = 0

    @property
    def enforced(self) -> bool:
        return self.limiter is not None

    def _gpus(self) -> list[tuple[int, str]]:
        return [(g.index, g.uuid) for g in self.backend.gpus()]

    def publish(self) -> None:
        """Say once per node what this node does: the log line, the node annotation kubectl inspect shows."""
        level = logging.INFO if self.support.enforced or self.support.mode == HardLimitMode.OFF else logging.WARNING
        log.log(
            level,
            "node %s: hard GPU memory limit (--hard-limit %s) %s: %s",
            self.node,
            self.support.mode,
            "enforced" if self.support.enforced else "NOT enforced",
            self.support.reason,
        )
        try:
            self.kube.patch_node_annotations(
                self.node, {ANN_NODE_HARD_LIMIT: self.support.annotation(AGENT, now_rfc3339())}
            )
        except KubeError as exc:
            log.warning("node %s: cannot publish %s: %s", self.node, ANN_NODE_HARD_LIMIT, exc)

    def active_pods(self) -> dict[str, tuple[str, dict[str, int]]]:
        """Pod UID -> (namespace/name, {GPU UUID: bytes}) for each running gpushare pod on this node."""
        pods = self.kube.list_pods(field_selector=f"spec.nodeName={self.node}").items
        gpus = self._gpus()
        out: dict[str, tuple[str, dict[str, int]]] = {}
        for pod in pods:
            per_gpu = pod_gpu_limits(pod, gpus, self.unit)
            if per_gpu:
                meta = pod.get("metadata") or {}
                out[str(meta.get("uid", ""))] = (f"{meta.get('namespace')}/{meta.get('name')}", per_gpu)
        return out

    def pre_start(self, device_ids: list[str]) -> None:
        """Before kubelet creates the container holding `device_ids`: its pod's cgroup gets the pod's limit.
        Raises HardLimitError (kubelet fails this start and retries)."""
        if self.limiter is None:
            return
        self.pre_starts += 1
        found = self._pod_of_devices(device_ids) if self._pod_of_devices is not None else None
        if found is None:
            raise HardLimitError(
                f"node {self.node}: PreStartContainer for devices {', '.join(sorted(device_ids)[:3])}...: no pod "
                f"holds them (neither served here nor listed by kubelet's PodResources)"
            )
        uid, namespace, name = found
        try:
            pod = self.kube.get_pod(namespace, name)
        except KubeError as exc:
            raise HardLimitError(f"node {self.node}: pod {namespace}/{name}: cannot read it: {exc}") from exc
        uid = uid or str((pod.get("metadata") or {}).get("uid", ""))
        per_gpu = pod_gpu_limits(pod, self._gpus(), self.unit)
        if not per_gpu:
            raise HardLimitError(f"node {self.node}: pod {namespace}/{name}: no GPU assignment to limit it by")
        self.limiter.limit_pod(uid, f"{namespace}/{name}", per_gpu)

    def adopt(self) -> None:
        """After a start: keep the limits the driver still holds for running pods; clear the others."""
        if self.limiter is None:
            return
        self.limiter.adopt(self.active_pods())

    def readings(self) -> dict[str, dict[str, Limits]]:
        return self.limiter.readings() if self.limiter is not None else {}

    def run(self, stop: threading.Event) -> None:
        """Adopt what the driver holds (retrying while the API is away), then sweep every second."""
        if self.limiter is None:
            return
        while not stop.is_set():
            try:
                self.adopt()
                break
            except KubeError as exc:
                log.warning(
                    "node %s: cannot list this node's pods to find their hard limits (%s): retrying", self.node, exc
                )
                stop.wait(5)
        while not stop.wait(self.sweep_interval):
            try:
                self.limiter.sweep()
            except Exception:
                log.exception("node %s: looking at the limited pod cgroups failed", self.node)


def setup(
    mode: str,
    args: argparse.Namespace,
    node: PluginNode,
    pod_of_devices: PodOfDevices | None,
) -> PluginHardLimit:
    """Probe the node for `--hard-limit <mode>`; raises HardLimitError when `cgroup` mode cannot be kept."""
    from share_node.backend.options import open_memory_limits

    limits = open_memory_limits(args, node.backend, node.name)
    support = probe(limits, mode, args.cgroup_root, gpu_facts(node.backend.gpus()), agent="plugin")
    check_required(support)
    limiter = HardLimiter(limits, support, args.cgroup_root, node.name) if support.enforced else None
    return PluginHardLimit(node, support, limiter, pod_of_devices)
