"""The real backend: GPUs and their health from the NVIDIA driver through NVML (nvidia-ml-py).

`pynvml` is imported lazily, inside `NvmlBackend`, so the sim backend and the tests run on machines
without a driver. Health follows NVIDIA's k8s-device-plugin: critical XID events mark a GPU unhealthy;
application XIDs (a crashing CUDA program, not a sick GPU) are ignored.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from share_plugin.backend import BackendError, Gpu, HealthCallback

log = logging.getLogger(__name__)

# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
# 45 preemptive cleanup, 68 NVDEC0 exception, 109 context switch timeout: caused by applications.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def parse_xids(text: str) -> frozenset[int]:
    """`13,31,43` -> {13, 31, 43}; raises ValueError naming the bad entry."""
    out = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"XID {part!r} is not a number")
        out.add(int(part))
    return frozenset(out)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    name = "nvml"

    def __init__(self, ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - the package is a dependency
            raise BackendError("nvidia-ml-py is not installed: pip install nvidia-ml-py") from exc
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendError(
                f"NVML failed to initialise ({exc}): is the NVIDIA driver installed and the plugin "
                "running with the NVIDIA container runtime? Use --backend sim to run without GPUs."
            ) from exc
        self.ignored_xids = ignored_xids
        self._lock = threading.Lock()
        self._gpus = self._enumerate()
        log.info(
            "NVML driver %s: %s",
            _text(pynvml.nvmlSystemGetDriverVersion()),
            ", ".join(f"{g.index}:{g.model}:{g.memory_mib}MiB:{g.uuid}" for g in self._gpus) or "no GPUs",
        )

    def _enumerate(self) -> list[Gpu]:
        nv = self._nvml
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                minor = int(nv.nvmlDeviceGetMinorNumber(h))
            except nv.NVMLError:
                minor = i
            out.append(
                Gpu(
                    index=i,
                    uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    model=_text(nv.nvmlDeviceGetName(h)),
                    memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
                    minor=minor,
                )
            )
        return out

    def gpus(self) -> list[Gpu]:
        with self._lock:
            return list(self._gpus)

    def _mark(self, uuid: str, healthy: bool) -> bool:
        with self._lock:
            for i, g in enumerate(self._gpus):
                if g.uuid == uuid and g.healthy != healthy:
                    self._gpus[i] = Gpu(g.index, g.uuid, g.model, g.memory_bytes, g.minor, healthy)
                    return True
        return False

    def watch_health(self, stop: threading.Event, on_change: HealthCallback) -> None:
        """Wait for XID events; a critical one marks its GPU unhealthy (until the plugin restarts)."""
        nv = self._nvml
        event_set = nv.nvmlEventSetCreate()
        try:
            for g in self.gpus():
                h = nv.nvmlDeviceGetHandleByUUID(g.uuid)
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set)
                except nv.NVMLError as exc:
                    # Without events we cannot see the GPU fail; NVIDIA's plugin marks it unhealthy.
                    log.warning("GPU %d %s: cannot watch XID events (%s): marking it unhealthy", g.index, g.uuid, exc)
                    if self._mark(g.uuid, False):
                        on_change(g.uuid, False, f"XID events unsupported: {exc}")
            while not stop.is_set():
                try:
                    event = nv.nvmlEventSetWait_v2(event_set, 1000)
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                        continue
                    log.error("NVML event wait failed (%s): marking every GPU unhealthy", exc)
                    for g in self.gpus():
                        if self._mark(g.uuid, False):
                            on_change(g.uuid, False, f"NVML event wait failed: {exc}")
                    stop.wait(5)
                    continue
                xid = int(event.eventData)
                uuid = _text(nv.nvmlDeviceGetUUID(event.device))
                if event.eventType != nv.nvmlEventTypeXidCriticalError:
                    continue
                if xid in self.ignored_xids:
                    log.info("GPU %s: XID %d is an application error: ignored", uuid, xid)
                    continue
                log.warning("GPU %s: critical XID %d: marking it unhealthy", uuid, xid)
                if self._mark(uuid, False):
                    on_change(uuid, False, f"XID {xid}")
        finally:
            nv.nvmlEventSetFree(event_set)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # shutting down: nothing to do but say so
            log.debug("nvmlShutdown: %s", exc)
