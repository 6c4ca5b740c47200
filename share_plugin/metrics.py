"""The device plugin's Prometheus metrics: GPU memory used per container and per GPU, from the monitor's last poll.

Served on `--metrics-port` (`GET /metrics`). Series (labels: node, gpu = the GPU index on the node, uuid):

| metric | extra labels | what |
|---|---|---|
| gpushare_container_gpu_memory_used_bytes | namespace, pod, container | the container's processes on that GPU |
| gpushare_container_gpu_memory_limit_bytes | namespace, pod, container | its limit there (gpushare containers only) |
| gpushare_container_gpu_memory_over_limit | namespace, pod, container | 1 while over its limit |
| gpushare_gpu_memory_used_bytes | | what NVML reports used on the GPU |
| gpushare_gpu_memory_total_bytes | | the GPU's memory |
| gpushare_gpu_memory_outside_pods_bytes | | used by processes in no pod (a GPU used outside Kubernetes) |

With `--hard-limit` on a node that enforces it (labels namespace, pod, node, gpu, uuid):
`gpushare_pod_gpu_memory_hard_limit_bytes` (the driver's limit on the pod's cgroup) and
`gpushare_pod_gpu_memory_driver_used_bytes` (what the driver charges it, `currentUsed`); on every node
`gpushare_hard_limit_enforced{node, mode}` (1: this node enforces hard limits; 0: it fell back, the node
annotation `gpushare.io/hard-limit` says why),
and the monitor's own counters (polls, poll errors, over-limit crossings, processes ended, annotation writes)
and the last poll's duration.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric

from share_plugin.monitor import Monitor
from share_plugin.monitor import Snapshot

log = logging.getLogger(__name__)

CONTAINER_LABELS = ["namespace", "pod", "container", "node", "gpu", "uuid"]
GPU_LABELS = ["node", "gpu", "uuid"]


class MonitorCollector:
    """Reads the monitor's last snapshot at scrape time: a scrape never touches NVML or the API server."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def describe(self) -> list[Metric]:
        return []  # series come and go with containers: no fixed description

    def collect(self) -> Iterator[Metric]:
        node = self.monitor.node
        used = GaugeMetricFamily(
            "gpushare_container_gpu_memory_used_bytes",
            "GPU memory used by a container's processes",
            labels=CONTAINER_LABELS,
        )
        limit = GaugeMetricFamily(
            "gpushare_container_gpu_memory_limit_bytes",
            "A gpushare container's GPU memory limit on a GPU (0 on a GPU it was not assigned)",
            labels=CONTAINER_LABELS,
        )
        over = GaugeMetricFamily(
            "gpushare_container_gpu_memory_over_limit",
            "1 while a container uses more than its limit",
            labels=CONTAINER_LABELS,
        )
        gpu_used = GaugeMetricFamily("gpushare_gpu_memory_used_bytes", "GPU memory used (NVML)", labels=GPU_LABELS)
        gpu_total = GaugeMetricFamily("gpushare_gpu_memory_total_bytes", "GPU memory in total", labels=GPU_LABELS)
        outside = GaugeMetricFamily(
            "gpushare_gpu_memory_outside_pods_bytes",
            "GPU memory used by processes that belong to no pod (used outside Kubernetes)",
            labels=GPU_LABELS,
        )
        snap = self.monitor.snapshot
        if snap is not None:
            for g in snap.usage.gpus:
                labels = [node, str(g.index), g.uuid]
                gpu_used.add_metric(labels, g.used_bytes)
                gpu_total.add_metric(labels, g.total_bytes)
                outside.add_metric(labels, g.outside_pods_bytes)
            for c in snap.usage.containers:
                labels = [c.key.namespace, c.key.pod, c.key.container, node, str(c.gpu_index), c.gpu_uuid]
                used.add_metric(labels, c.used_bytes)
                if c.limit_bytes is not None:
                    limit.add_metric(labels, c.limit_bytes)
                    over.add_metric(labels, 1 if c.over else 0)
        yield from (used, limit, over, gpu_used, gpu_total, outside)
        yield from self._hard_limit(node, snap)
        stats = self.monitor.stats
        counters: list[tuple[str, str, float]] = [
            ("gpushare_monitor_polls", "GPU memory polls made", stats.polls),
            ("gpushare_monitor_poll_errors", "GPU memory polls that failed", stats.poll_errors),
            ("gpushare_over_limit_crossings", "Times a container went over its limit", stats.over_limit_events),
            ("gpushare_over_limit_processes_killed", "Processes ended by --over-limit kill", stats.kills),
            ("gpushare_usage_annotation_writes", "Writes of the node's gpu-usage annotation", stats.annotation_writes),
        ]
        for name, doc, value in counters:
            fam = CounterMetricFamily(name, doc, labels=["node"])
            fam.add_metric([node], value)
            yield fam
        last = GaugeMetricFamily("gpushare_monitor_last_poll_seconds", "Duration of the last poll", labels=["node"])
        last.add_metric([node], stats.last_poll_seconds)
        yield last

    def _hard_limit(self, node: str, snap: Snapshot | None) -> Iterator[Metric]:
        hard = self.monitor.hard_limit
        support = getattr(hard, "support", None)
        if support is None:
            return
        enforced = GaugeMetricFamily(
            "gpushare_hard_limit_enforced",
            "1 when this node puts the driver's hard GPU memory limit on each pod (--hard-limit), 0 when it fell back",
            labels=["node", "mode"],
        )
        enforced.add_metric([node, support.mode], 1 if support.enforced else 0)
        yield enforced
        pod_labels = ["namespace", "pod", "node", "gpu", "uuid"]
        limit = GaugeMetricFamily(
            "gpushare_pod_gpu_memory_hard_limit_bytes", "The driver's hard limit on a pod's cgroup", labels=pod_labels
        )
        used = GaugeMetricFamily(
            "gpushare_pod_gpu_memory_driver_used_bytes",
            "GPU memory the driver charges a pod's cgroup (currentUsed)",
            labels=pod_labels,
        )
        if snap is not None:
            uuids = {g.index: g.uuid for g in snap.usage.gpus}
            for (ns, pod), per in snap.usage.driver_pods.items():
                for index, (n_used, n_hard) in per.items():
                    labels = [ns, pod, node, str(index), uuids.get(index, "")]
                    used.add_metric(labels, n_used)
                    limit.add_metric(labels, n_hard)
        yield from (limit, used)


def registry_for(monitor: Monitor) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))  # type: ignore[arg-type]
    return registry


def serve(monitor: Monitor, port: int, address: str = "0.0.0.0") -> Any:
    """Serve /metrics in a daemon thread; returns the server (its `shutdown()` stops it)."""
    server, _thread = start_http_server(port, addr=address, registry=registry_for(monitor))
    log.info("node %s: serving Prometheus metrics on %s:%d/metrics", monitor.node, address, server.server_port)
    return server
