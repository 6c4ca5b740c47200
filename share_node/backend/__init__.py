"""GPU backends: where the plugin learns which GPUs a node has and whether they are healthy.

`nvml` talks to the NVIDIA driver; `sim` invents GPUs for tests and the demo. Both satisfy `GpuBackend`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute process NVML lists on an offered GPU (a whole GPU or a MIG instance)."""

    gpu_uuid: str
    pid: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One offered GPU at one poll: NVML's used and total memory and its compute processes."""

    index: int
    uuid: str
    total_bytes: int
    used_bytes: int
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU the plugin offers: a whole GPU, or one MIG instance of a GPU in MIG mode.

    Memory in bytes so every unit can be derived. `index` is the position on the node (what the node
    annotation and the pod annotations carry); `device` is what NVIDIA's toolkit calls it by index in
    NVIDIA_VISIBLE_DEVICES: the NVML index, or `<gpu>:<mig device>` for a MIG instance. `parent_uuid` is the
    physical GPU of a MIG instance ("" for a whole GPU).
    """

    index: int
    uuid: str
    model: str
    memory_bytes: int
    minor: int
    healthy: bool = True
    device: str = ""
    parent_uuid: str = ""

    @property
    def device_index(self) -> str:
        return self.device or str(self.index)

    @property
    def physical_uuid(self) -> str:
        return self.parent_uuid or self.uuid

    @property
    def memory_mib(self) -> int:
        return self.memory_bytes // (1024 * 1024)


# Called with (gpu uuid, healthy, reason) whenever a GPU's health changes.
HealthCallback = Callable[[str, bool, str], None]


class GpuBackend(Protocol):
    name: str

    def gpus(self) -> list[Gpu]:
        """Every GPU on the node, ordered by index, with its current health."""
        ...

    def watch_health(self, stop: threading.Event, on_change: HealthCallback) -> None:
        """Block until `stop` is set, calling `on_change` for every health change."""
        ...

    def readings(self) -> list[GpuReading]:
        """Each offered GPU's used memory and compute processes now (the monitor polls this)."""
        ...

    def refresh(self) -> bool:
        """Look at the GPUs again (a MIG layout may have changed); True when the offered list changed."""
        ...

    def close(self) -> None: ...


class BackendError(RuntimeError):
    """The backend could not start (no driver, bad --sim-gpus): the message says what to fix."""
