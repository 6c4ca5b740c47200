"""gpushare's contract: names, request parsing, assignment annotations, accounting, the API adapter."""

from share_core.accounting import GpuUsage
from share_core.accounting import NodeUsage
from share_core.accounting import holds_gpu_memory
from share_core.accounting import node_usage
from share_core.assignment import Assignment
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_is_finished
from share_core.assignment import pod_key
from share_core.assignment import pod_node
from share_core.contract import MemoryUnit
from share_core.gpus import GpuInfo
from share_core.gpus import format_node_gpus
from share_core.gpus import node_gpus
from share_core.gpus import parse_node_gpus
from share_core.request import InvalidRequest
from share_core.request import PodRequest
from share_core.request import pod_request

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
