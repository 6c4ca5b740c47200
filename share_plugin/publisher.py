"""Publish the node's GPUs to the API server, in the background, retrying until it succeeds.

kubelet registration never waits on this: a node whose API server is down still serves its pods.
The latest desired state always wins; a failed attempt is retried with backoff.
"""

from __future__ import annotations

import logging
import threading

from share_core.contract import ANN_NODE_GPU_USAGE
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import ANN_NODE_HARD_LIMIT
from share_core.contract import NODE_LABEL
from share_core.contract import NODE_LABEL_VALUE
from share_core.contract import RESOURCE_COUNT
from share_core.gpus import GpuInfo
from share_core.gpus import format_node_gpus
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.retry import Backoff

log = logging.getLogger(__name__)


class Publisher:
    def __init__(self, node: str, kube: KubeClient, backoff: Backoff | None = None) -> None:
        self.node = node
        self.kube = kube
        self.backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self._lock = threading.Lock()
        self._desired: list[GpuInfo] | None = None
        self._published: list[GpuInfo] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str = ""

    def publish(self, gpus: list[GpuInfo]) -> None:
        """Ask for `gpus` to be published; returns at once."""
        with self._lock:
            self._desired = list(gpus)
        self._wake.set()

    @property
    def published(self) -> list[GpuInfo] | None:
        with self._lock:
            return self._published

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)

    def publish_once(self, gpus: list[GpuInfo]) -> None:
        """Write the annotation, then capacity; raises KubeError."""
        self.kube.patch_node_annotations(self.node, {ANN_NODE_GPUS: format_node_gpus(gpus)})
        self.kube.patch_node_capacity(self.node, {RESOURCE_COUNT: str(len(gpus))})

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                with self._lock:
                    desired = self._desired
                if desired is None or desired == self._published:
                    break
                try:
                    self.publish_once(desired)
                except KubeError as exc:
                    self.last_error = str(exc)
                    delay_stop = self.backoff.wait(self._stop)
                    log.warning(
                        "node %s: publishing %d GPUs to the API server failed, will retry: %s",
                        self.node,
                        len(desired),
                        exc,
                    )
                    if delay_stop:
                        return
                    continue
                except Exception as exc:  # never let the thread die: the next change must still go out
                    self.last_error = str(exc)
                    log.exception("node %s: publishing GPUs failed unexpectedly", self.node)
                    if self.backoff.wait(self._stop):
                        return
                    continue
                self.backoff.reset()
                self.last_error = ""
                with self._lock:
                    self._published = desired
                log.info(
                    "node %s: published %s=%s and %s (%s)",
                    self.node,
                    RESOURCE_COUNT,
                    len(desired),
                    ANN_NODE_GPUS,
                    ", ".join(f"GPU {g.index} {g.memory} {'healthy' if g.healthy else 'UNHEALTHY'}" for g in desired),
                )


def unpublish(kube: KubeClient, node: str | None = None) -> list[str]:
    """Remove what plugins published (the GPU annotation, the GPU-count capacity) from `node`, or from
    every node that carries it: `helm uninstall` must leave no gpushare state on the nodes.

    Returns the nodes cleaned; raises KubeError (the chart's hook Job then fails and says why).
    """
    if node is not None:
        names = [node]
    else:
        nodes = kube.list_nodes().items
        names = [
            n["metadata"]["name"]
            for n in nodes
            if ANN_NODE_GPUS in (n["metadata"].get("annotations") or {})
            or ANN_NODE_HARD_LIMIT in (n["metadata"].get("annotations") or {})
            or RESOURCE_COUNT in ((n.get("status") or {}).get("capacity") or {})
            or (n["metadata"].get("labels") or {}).get(NODE_LABEL) == NODE_LABEL_VALUE
        ]
    for name in names:
        kube.patch_node_annotations(name, {ANN_NODE_GPUS: None, ANN_NODE_GPU_USAGE: None, ANN_NODE_HARD_LIMIT: None})
        kube.patch_node_capacity(name, {RESOURCE_COUNT: None})
        log.info("node %s: removed %s and %s", name, ANN_NODE_GPUS, RESOURCE_COUNT)
    return names
