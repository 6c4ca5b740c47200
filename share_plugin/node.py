"""The node a device plugin serves, as all of its parts share it."""

from __future__ import annotations

from dataclasses import dataclass

from share_core.contract import MemoryUnit
from share_core.kube import KubeClient
from share_node.backend import GpuBackend


@dataclass(frozen=True, slots=True)
class PluginNode:
    """The node's name, the API, its GPUs and the unit gpu-mem counts in: the allocator, the hard limit and
    the monitor each work on all four, so they are handed over as one and never in the wrong order."""

    name: str
    kube: KubeClient
    backend: GpuBackend
    unit: MemoryUnit
