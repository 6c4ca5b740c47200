"""The nvml backend against a stand-in `pynvml` module: enumeration and XID health, without a GPU.

The stand-in implements only the calls NvmlBackend makes, with NVML's semantics (bytes or str
strings, NVMLError with a value, a timeout from nvmlEventSetWait_v2 when no event is pending).
"""

from __future__ import annotations

import queue
import sys
import threading
import types
from dataclasses import dataclass
from dataclasses import field

import pytest

from share_node.backend import BackendError
from share_node.backend.nvml import NvmlBackend

GIB = 1024**3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeDevice:
    uuid: str
    name: str
    total: int
    minor: int
    used: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    mig_capable: bool = False
    mig_enabled: bool = False
    # MIG device slots (nvmlDeviceGetMigDeviceHandleByIndex); None: no MIG device in that slot
    migs: list[FakeDevice | None] = field(default_factory=list)


def mig_a100(hex_id: str, gib: int, minor: int, slots: list[bool]) -> tuple[FakeDevice, list[FakeDevice]]:
    """An A100 of `gib` GiB in MIG mode, a 3g instance (half its memory) in each slot marked True; the
    instances' UUIDs are numbered 1, 2, ... in slot order. Returns the GPU and its instances."""
    instances: list[FakeDevice] = []
    migs: list[FakeDevice | None] = []
    for used in slots:
        mig = None
        if used:
            uuid = f"MIG-{hex_id}-0000-0000-0000-{len(instances) + 1:012d}"
            mig = FakeDevice(uuid, f"NVIDIA A100-SXM4-{gib}GB MIG 3g.{gib // 2}gb", gib // 2 * GIB, minor)
            instances.append(mig)
        migs.append(mig)
    gpu = FakeDevice(
        f"GPU-{hex_id}-0000-0000-0000-000000000000",
        f"NVIDIA A100-SXM4-{gib}GB",
        gib * GIB,
        minor,
        mig_capable=True,
        mig_enabled=True,
        migs=migs,
    )
    return gpu, instances


def fake_pynvml(devices: list[FakeDevice], fail_init: bool = False) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_ERROR_TIMEOUT = 10
    nv.NVML_ERROR_NOT_SUPPORTED = 3
    nv.NVML_ERROR_NOT_FOUND = 6
    nv.NVML_DEVICE_MIG_ENABLE = 1
    nv.nvmlEventTypeXidCriticalError = 8
    events: queue.Queue = queue.Queue()
    nv.events = events
    nv.registered = []

    def init() -> None:
        if fail_init:
            raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: None
    nv.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    nv.nvmlDeviceGetCount = lambda: len(devices)
    nv.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    nv.nvmlDeviceGetHandleByUUID = lambda u: next(d for d in devices if d.uuid == u)
    nv.nvmlDeviceGetMinorNumber = lambda h: h.minor
    nv.nvmlDeviceGetUUID = lambda h: h.uuid.encode()  # older bindings return bytes
    nv.nvmlDeviceGetName = lambda h: h.name
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def mig_mode(h: FakeDevice) -> list[int]:
        if not h.mig_capable:
            raise NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return [int(h.mig_enabled), int(h.mig_enabled)]

    def mig_handle(h: FakeDevice, i: int) -> FakeDevice:
        if i >= len(h.migs) or h.migs[i] is None:
            raise NVMLError(nv.NVML_ERROR_NOT_FOUND)
        return h.migs[i]

    nv.nvmlDeviceGetMigMode = mig_mode
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7 if h.mig_capable else 0
    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.processes
    ]
    nv.nvmlEventSetCreate = lambda: "event-set"
    nv.nvmlEventSetFree = lambda s: None
    nv.nvmlDeviceRegisterEvents = lambda h, types_, s: nv.registered.append(h.uuid)

    def wait(s: str, timeout_ms: int):
        try:
            return events.get(timeout=timeout_ms / 1000 / 20)
        except queue.Empty:
            raise NVMLError(nv.NVML_ERROR_TIMEOUT) from None

    nv.nvmlEventSetWait_v2 = wait
    return nv


H200 = [
    FakeDevice("GPU-11111111-2222-3333-4444-555555555555", "NVIDIA H200", 141 * GIB, 0),
    FakeDevice("GPU-66666666-7777-8888-9999-000000000000", "NVIDIA H200", 141 * GIB, 3),
]


@pytest.fixture
def nv(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = fake_pynvml(H200)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def test_enumerates_index_uuid_model_memory_and_minor(nv: types.ModuleType) -> None:
    gpus = NvmlBackend().gpus()
    assert [(g.index, g.uuid, g.model, g.memory_mib, g.minor, g.healthy) for g in gpus] == [
        (0, H200[0].uuid, "NVIDIA H200", 141 * 1024, 0, True),
        (1, H200[1].uuid, "NVIDIA H200", 141 * 1024, 3, True),
    ]


def test_critical_xid_marks_the_gpu_unhealthy_and_application_xids_are_ignored(nv: types.ModuleType) -> None:
    backend = NvmlBackend()
    changes: list[tuple[str, bool, str]] = []
    stop = threading.Event()
    t = threading.Thread(target=backend.watch_health, args=(stop, lambda *c: changes.append(c)), daemon=True)
    t.start()
    event = types.SimpleNamespace
    nv.events.put(event(eventType=nv.nvmlEventTypeXidCriticalError, eventData=43, device=H200[0]))  # app error
    nv.events.put(event(eventType=nv.nvmlEventTypeXidCriticalError, eventData=79, device=H200[1]))  # fell off bus
    deadline = threading.Event()
    for _ in range(100):
        if changes:
            break
        deadline.wait(0.05)
    stop.set()
    t.join(5)
    assert sorted(nv.registered) == sorted(d.uuid for d in H200)
    assert changes == [(H200[1].uuid, False, "XID 79")]
    assert [g.healthy for g in backend.gpus()] == [True, False]


def test_configured_ignored_xids_replace_the_default(nv: types.ModuleType) -> None:
    backend = NvmlBackend(ignored_xids=frozenset({79}))
    changes: list = []
    stop = threading.Event()
    t = threading.Thread(target=backend.watch_health, args=(stop, lambda *c: changes.append(c)), daemon=True)
    t.start()
    nv.events.put(types.SimpleNamespace(eventType=nv.nvmlEventTypeXidCriticalError, eventData=79, device=H200[0]))
    nv.events.put(types.SimpleNamespace(eventType=nv.nvmlEventTypeXidCriticalError, eventData=13, device=H200[0]))
    for _ in range(100):
        if changes:
            break
        threading.Event().wait(0.05)
    stop.set()
    t.join(5)
    assert changes == [(H200[0].uuid, False, "XID 13")]


def test_no_driver_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(H200, fail_init=True))
    with pytest.raises(BackendError, match="--backend sim"):
        NvmlBackend()
