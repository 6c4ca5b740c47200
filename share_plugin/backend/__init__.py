"""GPU backends: where the plugin learns which GPUs a node has and whether they are healthy.

`nvml` talks to the NVIDIA driver; `sim` invents GPUs for tests and the demo. Both satisfy `GpuBackend`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as the backend sees it; memory in bytes so every unit can be derived."""

    index: int
    uuid: str
    model: str
    memory_bytes: int
    minor: int
    healthy: bool = True

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

    def close(self) -> None: ...


class BackendError(RuntimeError):
    """The backend could not start (no driver, bad --sim-gpus): the message says what to fix."""
