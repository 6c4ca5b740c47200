"""The real backend: GPUs, their health and their memory use from the NVIDIA driver through NVML (nvidia-ml-py).

`pynvml` is imported lazily, inside `NvmlBackend`, so the sim backend and the tests run on machines
without a driver. Health follows NVIDIA's k8s-device-plugin: critical XID events mark a GPU unhealthy;
application XIDs (a crashing CUDA program, not a sick GPU) are ignored.

MIG: a GPU in MIG mode (nvmlDeviceGetMigMode current = enabled) is offered as its MIG instances, each a
GPU of its own (its `MIG-…` UUID, its name such as "NVIDIA A100-SXM4-40GB MIG 3g.20gb", its own memory),
found with nvmlDeviceGetMaxMigDeviceCount and nvmlDeviceGetMigDeviceHandleByIndex (NVML reference,
"Multi Instance GPU Management"). A whole-GPU UUID gives a container nothing usable on such a GPU. GPUs not
in MIG mode on the same node are offered whole. `refresh` enumerates again, so a changed MIG layout is
republished. XID events are registered on the physical GPU and mark all of its instances.

Memory use: nvmlDeviceGetMemoryInfo(handle).used and nvmlDeviceGetComputeRunningProcesses(handle) per
offered GPU (on a MIG handle, that instance's processes). PIDs are in the host's PID namespace.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from share_node.backend import BackendError
from share_node.backend import Gpu
from share_node.backend import GpuProcess
from share_node.backend import GpuReading
from share_node.backend import HealthCallback
from share_node.hardlimit import LimitError
from share_node.hardlimit import LimitErrorCode
from share_node.hardlimit import Limits

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
        self._gpus, self._handles = self._enumerate()
        # The DRA driver publishes it as a device attribute (driverVersion).
        self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        log.info("NVML driver %s: %s", self.driver_version, _describe(self._gpus))

    def _enumerate(self) -> tuple[list[Gpu], dict[str, Any]]:
        """Offered GPUs in order (whole GPUs, or the MIG instances of a GPU in MIG mode) and their handles."""
        nv = self._nvml
        out: list[Gpu] = []
        handles: dict[str, Any] = {}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                minor = int(nv.nvmlDeviceGetMinorNumber(h))
            except nv.NVMLError:
                minor = i
            uuid = _text(nv.nvmlDeviceGetUUID(h))
            handles[uuid] = h
            if not self._mig_enabled(h):
                out.append(self._gpu(h, len(out), uuid, minor, str(i)))
                continue
            for j in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(h))):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                except nv.NVMLError:
                    continue  # NVML_ERROR_NOT_FOUND: no MIG device in this slot
                mig_uuid = _text(nv.nvmlDeviceGetUUID(mh))
                handles[mig_uuid] = mh
                out.append(self._gpu(mh, len(out), mig_uuid, minor, f"{i}:{j}", parent_uuid=uuid))
        return out, handles

    def _gpu(self, handle: Any, index: int, uuid: str, minor: int, device: str, parent_uuid: str = "") -> Gpu:
        """One offered GPU (a whole GPU, or a MIG instance of `parent_uuid`) as NVML describes its handle."""
        nv = self._nvml
        return Gpu(
            index=index,
            uuid=uuid,
            model=_text(nv.nvmlDeviceGetName(handle)),
            memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
            minor=minor,
            device=device,
            parent_uuid=parent_uuid,
        )

    def _mig_enabled(self, handle: Any) -> bool:
        nv = self._nvml
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError:
            return False  # NVML_ERROR_NOT_SUPPORTED: a GPU without MIG
        return int(current) == int(getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))

    def gpus(self) -> list[Gpu]:
        with self._lock:
            return list(self._gpus)

    def refresh(self) -> bool:
        """Enumerate again; keep each GPU's health by UUID. True when the offered GPUs changed."""
        try:
            gpus, handles = self._enumerate()
        except self._nvml.NVMLError as exc:
            log.warning("NVML: cannot enumerate the GPUs again (%s): keeping the known list", exc)
            return False
        with self._lock:
            health = {g.uuid: g.healthy for g in self._gpus}
            gpus = [dataclasses.replace(g, healthy=health.get(g.uuid, True)) for g in gpus]
            changed = gpus != self._gpus
            if changed:
                log.warning(
                    "NVML: the GPUs changed (a MIG layout?): was %s, now %s",
                    _describe(self._gpus),
                    _describe(gpus),
                )
            self._gpus, self._handles = gpus, handles
        return changed

    def readings(self) -> list[GpuReading]:
        """Used memory and compute processes of every offered GPU; a GPU NVML cannot read is left out."""
        nv = self._nvml
        out = []
        for g in self.gpus():
            h = self._handles.get(g.uuid)
            if h is None:
                continue
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except nv.NVMLError as exc:
                log.warning("GPU %d %s: NVML cannot read its memory use: %s", g.index, g.uuid, exc)
                continue
            out.append(
                GpuReading(
                    g.index,
                    g.uuid,
                    int(mem.total),
                    int(mem.used),
                    # usedGpuMemory is None where NVML cannot tell (NVML_VALUE_NOT_AVAILABLE, e.g. Windows WDDM)
                    tuple(GpuProcess(g.uuid, int(p.pid), int(p.usedGpuMemory or 0)) for p in procs),
                )
            )
        return out

    def _mark(self, uuid: str, healthy: bool) -> list[str]:
        """Set the health of the offered GPU `uuid`, or of every MIG instance of the physical GPU `uuid`."""
        changed = []
        with self._lock:
            for i, g in enumerate(self._gpus):
                if uuid in (g.uuid, g.parent_uuid) and g.healthy != healthy:
                    self._gpus[i] = dataclasses.replace(g, healthy=healthy)
                    changed.append(g.uuid)
        return changed

    def watch_health(self, stop: threading.Event, on_change: HealthCallback) -> None:
        """Wait for XID events; a critical one marks its GPU unhealthy (until the plugin restarts)."""
        nv = self._nvml
        event_set = nv.nvmlEventSetCreate()
        try:
            for physical in dict.fromkeys(g.physical_uuid for g in self.gpus()):
                h = nv.nvmlDeviceGetHandleByUUID(physical)
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set)
                except nv.NVMLError as exc:
                    # Without events we cannot see the GPU fail; NVIDIA's plugin marks it unhealthy.
                    log.warning("GPU %s: cannot watch XID events (%s): marking it unhealthy", physical, exc)
                    for u in self._mark(physical, False):
                        on_change(u, False, f"XID events unsupported: {exc}")
            while not stop.is_set():
                try:
                    event = nv.nvmlEventSetWait_v2(event_set, 1000)
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                        continue
                    log.error("NVML event wait failed (%s): marking every GPU unhealthy", exc)
                    for g in self.gpus():
                        for u in self._mark(g.uuid, False):
                            on_change(u, False, f"NVML event wait failed: {exc}")
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
                for u in self._mark(uuid, False):
                    on_change(u, False, f"XID {xid}")
        finally:
            nv.nvmlEventSetFree(event_set)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # shutting down: nothing to do but say so
            log.debug("nvmlShutdown: %s", exc)


def _describe(gpus: list[Gpu]) -> str:
    return ", ".join(f"{g.index}:{g.model}:{g.memory_mib}MiB:{g.uuid}" for g in gpus) or "no GPUs"


class NvmlMemoryLimits:
    """The driver's per-cgroup memory limit through NVML (share_node/hardlimit.py says what NVIDIA documents).

    nvidia-ml-py 13.615.71: `c_nvmlSetMemoryLimits_v1_t(nameSpace, softLimit, hardLimit)`,
    `c_nvmlGetMemoryLimits_v1_t(nameSpace, softLimit, hardLimit, currentUsed)`,
    `nvmlDeviceSetMemoryLimits_v1(handle, struct)`, `nvmlDeviceGetMemoryLimits_v1(handle, struct)`; a
    libnvidia-ml without the symbol raises NVML_ERROR_FUNCTION_NOT_FOUND.
    """

    def __init__(self, backend: NvmlBackend) -> None:
        self._backend = backend
        self._nvml = backend._nvml

    def available(self) -> bool:
        nv = self._nvml
        if not all(hasattr(nv, n) for n in ("nvmlDeviceSetMemoryLimits_v1", "c_nvmlSetMemoryLimits_v1_t")):
            return False  # nvidia-ml-py older than 13.615
        try:
            nv._nvmlGetFunctionPointer("nvmlDeviceSetMemoryLimits_v1")
            nv._nvmlGetFunctionPointer("nvmlDeviceGetMemoryLimits_v1")
        except nv.NVMLError:
            return False
        return True

    def driver_version(self) -> str:
        return self._backend.driver_version

    def _handle(self, gpu_uuid: str) -> Any:
        h = self._backend._handles.get(gpu_uuid)
        if h is None:
            raise LimitError(LimitErrorCode.NOT_FOUND, f"no GPU {gpu_uuid} on this node")
        return h

    def _error(self, exc: Exception, what: str) -> LimitError:
        nv = self._nvml
        codes = {
            nv.NVML_ERROR_NOT_SUPPORTED: LimitErrorCode.NOT_SUPPORTED,
            nv.NVML_ERROR_NO_PERMISSION: LimitErrorCode.NO_PERMISSION,
            nv.NVML_ERROR_NOT_FOUND: LimitErrorCode.NOT_FOUND,
            nv.NVML_ERROR_INVALID_ARGUMENT: LimitErrorCode.INVALID_ARGUMENT,
            nv.NVML_ERROR_FUNCTION_NOT_FOUND: LimitErrorCode.FUNCTION_NOT_FOUND,
        }
        return LimitError(codes.get(getattr(exc, "value", None), LimitErrorCode.OTHER), f"{what}: {exc}")

    def set(self, gpu_uuid: str, cgroup: str, soft: int, hard: int) -> None:
        nv = self._nvml
        limits = nv.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace = cgroup.encode()
        limits.softLimit = soft
        limits.hardLimit = hard
        try:
            nv.nvmlDeviceSetMemoryLimits_v1(self._handle(gpu_uuid), limits)
        except nv.NVMLError as exc:
            raise self._error(exc, f"nvmlDeviceSetMemoryLimits_v1({gpu_uuid}, {cgroup})") from exc

    def get(self, gpu_uuid: str, cgroup: str) -> Limits:
        nv = self._nvml
        limits = nv.c_nvmlGetMemoryLimits_v1_t()
        limits.nameSpace = cgroup.encode()
        try:
            nv.nvmlDeviceGetMemoryLimits_v1(self._handle(gpu_uuid), limits)
        except nv.NVMLError as exc:
            raise self._error(exc, f"nvmlDeviceGetMemoryLimits_v1({gpu_uuid}, {cgroup})") from exc
        return Limits(int(limits.softLimit), int(limits.hardLimit), int(limits.currentUsed))
