"""The NVML stand-in's per-cgroup memory limit: `nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1`
as NVIDIA documents them (share_node/hardlimit.py), for the sim backend and the tests.

Behaviour, each from NVIDIA's text:
* limits are kept per (GPU, cgroup path) and outlive the process that set them (the driver holds them): here
  in a JSON state file, so a restarted agent finds them and a test can read them;
* a driver older than R615 (`--sim-driver-version`) answers NOT_SUPPORTED, and so does a MIG instance;
* Set without root answers NO_PERMISSION (Get does not need root);
* the path must name an existing cgroup v2 directory (NOT_FOUND if it does not exist, INVALID_ARGUMENT if it is
  not cgroup v2), unless the stand-in is told to accept this node's cgroup v1 paths (`--sim-accept-cgroup-v1`:
  the test machines run cgroup v1);
* soft 0 and hard NVML_DEVICE_MEMORY_LIMIT_MAX clears a limit; removing the cgroup clears its limits too;
* Get's `currentUsed` is what the simulated processes (`--sim-processes-file`) in that cgroup or below hold.

Every change is appended to the state's `journal` with the cgroup's child cgroups and process count at that
moment, so a test can tell a limit set before a container existed from one set after.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from share_core.contract import HARD_LIMIT_MIN_DRIVER
from share_node.backend import GpuReading
from share_node.hardlimit import LIMIT_MAX
from share_node.hardlimit import LimitError
from share_node.hardlimit import LimitErrorCode
from share_node.hardlimit import Limits
from share_node.hardlimit import cgroup_fstype
from share_node.hardlimit import parse_driver_version

DEFAULT_SIM_DRIVER_VERSION = "615.0"


def _proc_count(path: Path) -> int:
    n = 0
    for dirpath, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError):
            n += len((Path(dirpath) / "cgroup.procs").read_text().split())
    return n


def _children(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


class SimMemoryLimits:
    """The stand-in (see the module docstring); `state_file` is shared by every process that opens it."""

    def __init__(
        self,
        state_file: str,
        driver_version: str = DEFAULT_SIM_DRIVER_VERSION,
        mig_uuids: Sequence[str] = (),
        readings: Callable[[], list[GpuReading]] | None = None,
        accept_cgroup_v1: bool = False,
        euid: Callable[[], int] = os.geteuid,
        proc_root: str = "/proc",
        fstype: Callable[[str], str] = cgroup_fstype,
    ) -> None:
        self.state_file = Path(state_file)
        self.version = driver_version
        self.mig = frozenset(mig_uuids)
        self.readings = readings
        self.accept_cgroup_v1 = accept_cgroup_v1
        self.euid = euid
        self.proc_root = Path(proc_root)
        self.fstype = fstype

    def available(self) -> bool:
        return True  # the library has the symbols; an old driver answers NOT_SUPPORTED (below)

    def driver_version(self) -> str:
        return self.version

    # -- state ------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.state_file, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read()
            state: dict[str, Any] = json.loads(text) if text.strip() else {}
            state.setdefault("limits", {})
            state.setdefault("journal", [])
            self._prune(state)
            yield state
            f.seek(0)
            f.truncate()
            f.write(json.dumps(state, indent=1, sort_keys=True))
            f.flush()

    def _prune(self, state: dict[str, Any]) -> None:
        """A removed cgroup takes its limits with it."""
        for gpu, per_path in state["limits"].items():
            for path in [p for p in per_path if not os.path.isdir(p)]:
                del per_path[path]
                state["journal"].append({"op": "removed-with-cgroup", "gpu": gpu, "path": path, "time": time.time()})

    # -- the checks NVIDIA documents ------------------------------------------------------------------------

    def _check(self, gpu_uuid: str, cgroup: str) -> None:
        version = parse_driver_version(self.version)
        if not version or version[: len(HARD_LIMIT_MIN_DRIVER)] < HARD_LIMIT_MIN_DRIVER:
            raise LimitError(LimitErrorCode.NOT_SUPPORTED, f"driver {self.version} does not support memory limits")
        if gpu_uuid in self.mig or gpu_uuid.startswith("MIG-"):
            raise LimitError(LimitErrorCode.NOT_SUPPORTED, f"{gpu_uuid} is a MIG handle: not supported")
        if not os.path.isabs(cgroup):
            raise LimitError(LimitErrorCode.INVALID_ARGUMENT, f"{cgroup!r} is not a full sysfs cgroup path")
        if not os.path.isdir(cgroup):
            with self._state():
                pass  # the removed cgroup's limits go now
            raise LimitError(LimitErrorCode.NOT_FOUND, f"no cgroup {cgroup}")
        fstype = self.fstype(cgroup)
        if fstype != "cgroup2" and not (self.accept_cgroup_v1 and fstype == "cgroup"):
            raise LimitError(LimitErrorCode.INVALID_ARGUMENT, f"{cgroup} is on {fstype or 'no cgroup'}, not cgroup v2")

    def set(self, gpu_uuid: str, cgroup: str, soft: int, hard: int) -> None:
        self._check(gpu_uuid, cgroup)
        if self.euid() != 0:
            raise LimitError(LimitErrorCode.NO_PERMISSION, "setting memory limits requires root")
        if soft < 0 or hard < 0 or soft > hard:
            raise LimitError(LimitErrorCode.INVALID_ARGUMENT, f"soft {soft} above hard {hard}")
        path = Path(cgroup)
        with self._state() as state:
            per_path = state["limits"].setdefault(gpu_uuid, {})
            clear = soft == 0 and hard == LIMIT_MAX
            if clear:
                per_path.pop(cgroup, None)
            else:
                per_path[cgroup] = {"soft": soft, "hard": hard}
            state["journal"].append(
                {
                    "op": "clear" if clear else "set",
                    "gpu": gpu_uuid,
                    "path": cgroup,
                    "soft": soft,
                    "hard": hard,
                    "time": time.time(),
                    "children": _children(path),
                    "procs": _proc_count(path),
                }
            )

    def get(self, gpu_uuid: str, cgroup: str) -> Limits:
        self._check(gpu_uuid, cgroup)
        with self._state() as state:
            entry = state["limits"].get(gpu_uuid, {}).get(cgroup)
        soft, hard = (entry["soft"], entry["hard"]) if entry else (0, LIMIT_MAX)
        return Limits(soft, hard, self._used(gpu_uuid, cgroup))

    def _used(self, gpu_uuid: str, cgroup: str) -> int:
        """What the simulated processes in `cgroup` (or below) hold on the GPU."""
        if self.readings is None:
            return 0
        root = _mount_relative(cgroup) if self.fstype is cgroup_fstype else cgroup
        total = 0
        for r in self.readings():
            if r.uuid != gpu_uuid:
                continue
            for p in r.processes:
                try:
                    text = (self.proc_root / str(p.pid) / "cgroup").read_text()
                except OSError:
                    continue
                paths = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
                if any(q == root or q.startswith(root.rstrip("/") + "/") for q in paths):
                    total += p.used_bytes
        return total


def _mount_relative(cgroup: str) -> str:
    """`/sys/fs/cgroup/unified/a/b` -> `/a/b`: the path as /proc/<pid>/cgroup names it."""
    real = os.path.realpath(cgroup)
    best = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) >= 5 and right.split()[0] in ("cgroup", "cgroup2"):
                mnt = fields[4]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best = mnt
    rel = real[len(best) :] if best else real
    return rel or "/"


def read_state(state_file: str) -> dict[str, Any]:
    """The stand-in's state as a test reads it: {"limits": {gpu: {path: {soft, hard}}}, "journal": [...]}."""
    try:
        text = Path(state_file).read_text()
    except FileNotFoundError:
        return {"limits": {}, "journal": []}
    return json.loads(text) if text.strip() else {"limits": {}, "journal": []}
