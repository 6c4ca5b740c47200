"""A simulated GPU node for tests and the demo: `--sim-gpus 2xA100:80GiB,1xT4:16GiB`.

UUIDs derive from the node name and GPU index, so a restarted plugin advertises the same devices.
Health can be changed at run time in-process (`set_health`) or from another process through a
health file the backend polls: one line per unhealthy GPU, each an index or a UUID (`#` comments).

Memory use is simulated the same two ways (`set_processes`, or `--sim-processes-file`, read at each poll):
a JSON list of `{"pid": <host PID>, "gpu": <index or UUID>, "usedMiB": <n>}`, the compute processes NVML
would list. The PIDs are real: the monitor maps them through `/proc/<pid>/cgroup` exactly as with NVML, so a
test names a real container's process and sees its pod and container come out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import uuid as uuidlib
from pathlib import Path

from share_node.backend import BackendError
from share_node.backend import Gpu
from share_node.backend import GpuProcess
from share_node.backend import GpuReading
from share_node.backend import HealthCallback

log = logging.getLogger(__name__)

_MODELS = {
    "A100": "NVIDIA A100-SXM4-80GB",
    "A10": "NVIDIA A10",
    "T4": "Tesla T4",
    "V100": "Tesla V100-SXM2-32GB",
    "H100": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
    "L4": "NVIDIA L4",
}
_SPEC = re.compile(r"^(\d+)x([A-Za-z0-9_.-]+):(\d+)(GiB|MiB)$")


def parse_sim_gpus(spec: str) -> list[tuple[str, int]]:
    """`2xA100:80GiB,1xT4:16GiB` -> [(model, bytes), ...] one entry per GPU, in order."""
    out: list[tuple[str, int]] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        m = _SPEC.match(part)
        if not m:
            raise BackendError(f"--sim-gpus: {part!r} is not COUNTxMODEL:SIZE(GiB|MiB), e.g. 2xA100:80GiB")
        count, model, size, unit = int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)
        if count < 1 or size < 1:
            raise BackendError(f"--sim-gpus: {part!r} needs a positive count and size")
        n_bytes = size * (1024**3 if unit == "GiB" else 1024**2)
        out.extend([(_MODELS.get(model.upper(), model), n_bytes)] * count)
    if not out:
        raise BackendError("--sim-gpus lists no GPUs")
    return out


def sim_uuid(node: str, index: int) -> str:
    """A stable, NVIDIA-shaped UUID for GPU `index` of `node`."""
    digest = hashlib.sha256(f"gpushare-sim/{node}/{index}".encode()).digest()[:16]
    return f"GPU-{uuidlib.UUID(bytes=digest)}"


class SimBackend:
    name = "sim"

    def __init__(
        self,
        spec: str,
        node: str,
        health_file: str | None = None,
        poll_interval: float = 0.2,
        processes_file: str | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._gpus = [
            Gpu(i, sim_uuid(node, i), model, n_bytes, minor=i)
            for i, (model, n_bytes) in enumerate(parse_sim_gpus(spec))
        ]
        self.processes_file = processes_file
        self._processes: list[GpuProcess] | None = None  # set in-process; else the file
        self._forced: dict[str, bool] = {}  # uuid -> healthy, set in-process
        self._changed = threading.Event()
        self.health_file = health_file
        self.poll_interval = poll_interval

    def gpus(self) -> list[Gpu]:
        with self._lock:
            return list(self._gpus)

    def set_health(self, index_or_uuid: int | str, healthy: bool) -> None:
        """Mark a GPU healthy or not (tests, in-process)."""
        gpu = self._find(str(index_or_uuid))
        if gpu is None:
            raise KeyError(f"no simulated GPU {index_or_uuid!r}")
        with self._lock:
            self._forced[gpu.uuid] = healthy
        self._changed.set()

    def _find(self, key: str) -> Gpu | None:
        for g in self._gpus:
            if key in (str(g.index), g.uuid):
                return g
        return None

    def _file_unhealthy(self) -> set[str]:
        if not self.health_file:
            return set()
        try:
            text = Path(self.health_file).read_text()
        except FileNotFoundError:
            return set()
        except OSError as exc:
            log.warning("sim health file %s unreadable: %s", self.health_file, exc)
            return set()
        out = set()
        for line in text.splitlines():
            key = line.split("#", 1)[0].strip()
            gpu = self._find(key) if key else None
            if gpu is not None:
                out.add(gpu.uuid)
        return out

    def _refresh(self, on_change: HealthCallback) -> None:
        unhealthy_file = self._file_unhealthy()
        changes: list[tuple[str, bool, str]] = []
        with self._lock:
            for i, g in enumerate(self._gpus):
                if g.uuid in self._forced:
                    healthy, why = self._forced[g.uuid], "set by test"
                else:
                    healthy, why = g.uuid not in unhealthy_file, f"health file {self.health_file}"
                if healthy != g.healthy:
                    self._gpus[i] = Gpu(g.index, g.uuid, g.model, g.memory_bytes, g.minor, healthy)
                    changes.append((g.uuid, healthy, why))
        for uuid, healthy, why in changes:
            on_change(uuid, healthy, why)

    def watch_health(self, stop: threading.Event, on_change: HealthCallback) -> None:
        while not stop.is_set():
            self._refresh(on_change)
            self._changed.wait(self.poll_interval)
            self._changed.clear()

    def set_processes(self, processes: list[tuple[int, int | str, int]]) -> None:
        """Simulate compute processes: (pid, GPU index or UUID, MiB used) each (tests, in-process)."""
        out = []
        for pid, gpu_key, mib in processes:
            gpu = self._find(str(gpu_key))
            if gpu is None:
                raise KeyError(f"no simulated GPU {gpu_key!r}")
            out.append(GpuProcess(gpu.uuid, pid, mib * 1024 * 1024))
        with self._lock:
            self._processes = out

    def _file_processes(self) -> list[GpuProcess]:
        if not self.processes_file:
            return []
        try:
            data = json.loads(Path(self.processes_file).read_text() or "[]")
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("sim processes file %s unreadable: %s", self.processes_file, exc)
            return []
        out = []
        for item in data if isinstance(data, list) else []:
            try:
                gpu = self._find(str(item["gpu"]))
                if gpu is not None:
                    out.append(GpuProcess(gpu.uuid, int(item["pid"]), int(item["usedMiB"]) * 1024 * 1024))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("sim processes file %s: bad entry %r: %s", self.processes_file, item, exc)
        return out

    def readings(self) -> list[GpuReading]:
        with self._lock:
            processes = self._processes
        if processes is None:
            processes = self._file_processes()
        out = []
        for g in self.gpus():
            mine = tuple(p for p in processes if p.gpu_uuid == g.uuid)
            out.append(GpuReading(g.index, g.uuid, g.memory_bytes, sum(p.used_bytes for p in mine), mine))
        return out

    def refresh(self) -> bool:
        return False  # simulated GPUs never change their layout

    def close(self) -> None:
        self._changed.set()


def health_file_from_env() -> str | None:
    return os.environ.get("GPUSHARE_SIM_HEALTH_FILE") or None
