"""Exponential backoff with jitter, for every loop that waits on the API server or kubelet."""

from __future__ import annotations

import random
import threading


class Backoff:
    """Delays that double from `initial` up to `maximum`, with +/-20% jitter; `reset()` after a success."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * self.factor, self.maximum)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.initial

    def wait(self, stop: threading.Event) -> bool:
        """Sleep the next delay; True if `stop` was set meanwhile (the caller should quit)."""
        return stop.wait(self.next_delay())
