"""`--hard-limit` in share-dra: a pod's cgroup gets the sum of its claims' consumed memory on each GPU at
NodePrepareResources (share_dra/driver.py says why that point), cleared at NodeUnprepareResources."""

from __future__ import annotations

import argparse
import logging
import threading

from share_core.contract import ANN_NODE_HARD_LIMIT
from share_core.contract import HardLimitMode
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.kube import now_rfc3339
from share_node.backend import GpuBackend
from share_node.hardlimit import HardLimiter
from share_node.hardlimit import Support
from share_node.hardlimit import check_required
from share_node.hardlimit import gpu_facts
from share_node.hardlimit import probe

log = logging.getLogger(__name__)

AGENT = "share-dra"


def setup(mode: str, args: argparse.Namespace, node: str, backend: GpuBackend) -> tuple[Support, HardLimiter | None]:
    """Probe the node; raises HardLimitError when `--hard-limit cgroup` cannot be kept."""
    from share_node.backend.options import open_memory_limits

    limits = open_memory_limits(args, backend, node)
    support = probe(limits, mode, args.cgroup_root, gpu_facts(backend.gpus()), agent="dra")
    check_required(support)
    if not support.enforced:
        return support, None
    return support, HardLimiter(limits, support, args.cgroup_root, node, clear_when_empty=False)


def publish(support: Support, node: str, kube: KubeClient) -> None:
    """Once per start: the log line and the node annotation `kubectl inspect gpushare` shows."""
    level = logging.INFO if support.enforced or support.mode == HardLimitMode.OFF else logging.WARNING
    log.log(
        level,
        "node %s: hard GPU memory limit (--hard-limit %s) %s: %s",
        node,
        support.mode,
        "enforced" if support.enforced else "NOT enforced",
        support.reason,
    )
    try:
        kube.patch_node_annotations(node, {ANN_NODE_HARD_LIMIT: support.annotation(AGENT, now_rfc3339())})
    except KubeError as exc:
        log.warning("node %s: cannot publish %s: %s", node, ANN_NODE_HARD_LIMIT, exc)


def run(limiter: HardLimiter, pod_limits: dict[str, tuple[str, dict[str, int]]], stop: threading.Event) -> None:
    """Keep what the driver holds for the pods of the checkpointed claims, clear the rest, then sweep."""
    limiter.adopt(pod_limits)
    while not stop.wait(1.0):
        try:
            limiter.sweep()
        except Exception:
            log.exception("looking at the limited pod cgroups failed")
