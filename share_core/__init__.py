"""gpushare's contract: names, request parsing, assignment annotations, accounting, the API adapter."""

from share_core.accounting import GpuUsage, NodeUsage, holds_gpu_memory, node_usage
from share_core.assignment import (
    Assignment,
    parse_assignment,
    pod_annotations,
    pod_is_finished,
    pod_key,
    pod_node,
)
from share_core.contract import MemoryUnit
from share_core.gpus import GpuInfo, format_node_gpus, node_gpus, parse_node_gpus
from share_core.request import InvalidRequest, PodRequest, pod_request

__version__ = "0.1.0"

__all__ = [
    "Assignment",
    "GpuInfo",
    "GpuUsage",
    "InvalidRequest",
    "MemoryUnit",
    "NodeUsage",
    "PodRequest",
    "__version__",
    "format_node_gpus",
    "holds_gpu_memory",
    "node_gpus",
    "node_usage",
    "parse_assignment",
    "parse_node_gpus",
    "pod_annotations",
    "pod_is_finished",
    "pod_key",
    "pod_node",
    "pod_request",
]
