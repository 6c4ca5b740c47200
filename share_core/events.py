"""Events posted off the hot path: a bounded queue and one background thread.

An Event is a courtesy to the person reading `kubectl describe pod`; it must never make a bind (or an
Allocate) wait on a slow API server. When the queue is full the Event is dropped and counted, so an
operator can see the loss on a metric instead of in scheduling latency.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from share_core.kube import KubeClient
from share_core.kube import KubeError

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 1024  # Events waiting for the API server before new ones are dropped


@dataclass(frozen=True, slots=True)
class PendingEvent:
    pod: Mapping[str, Any]  # enough of the pod to name it: metadata name, namespace, uid
    reason: str
    message: str
    event_type: str


class EventQueue:
    """`record()` returns at once; one daemon thread posts the Events in order."""

    def __init__(
        self,
        kube: KubeClient,
        capacity: int = DEFAULT_CAPACITY,
        on_drop: Callable[[], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self._queue: queue.Queue[PendingEvent | None] = queue.Queue(maxsize=capacity)
        self._on_drop = on_drop
        self._on_error = on_error
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.sent = 0
        self.dropped = 0
        self.failed = 0

    def record(self, pod: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal") -> bool:
        """Queue an Event; False if it was dropped because the queue is full."""
        self._ensure_started()
        try:
            self._queue.put_nowait(PendingEvent(pod, reason, message, event_type))
        except queue.Full:
            self.dropped += 1
            if self._on_drop:
                self._on_drop()
            meta = pod.get("metadata") or {}
            log.debug("event queue full: dropped %s for pod %s/%s", reason, meta.get("namespace"), meta.get("name"))
            return False
        return True

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpushare-events", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._post(item)
            finally:
                self._queue.task_done()

    def _post(self, item: PendingEvent) -> None:
        try:
            self.kube.create_event(item.pod, item.reason, item.message, item.event_type)
            self.sent += 1
        except KubeError as exc:
            self.failed += 1
            if self._on_error:
                self._on_error()
            meta = item.pod.get("metadata") or {}
            log.warning(
                "pod %s/%s: could not record event %s (%s): %s",
                meta.get("namespace"),
                meta.get("name"),
                item.reason,
                item.message,
                exc,
            )
        except Exception:  # the poster must outlive any one bad Event
            self.failed += 1
            log.exception("posting event %s failed", item.reason)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued Event was posted or failed (tests, shutdown); False on timeout."""
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        return done.wait(timeout)

    def depth(self) -> int:
        return self._queue.qsize()
