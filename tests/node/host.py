"""What a real node touches on the host, and how it is given back exactly: mountpoint directories,
cgroups, and processes found by their mount namespace, cgroup or command line (never by name alone)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Iterable
from collections.abc import Iterator
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


# ------------------------------------------------------------------------------ mountpoints


def _lock_dir() -> Path:
    return Path("/run/lock") if Path("/run/lock").is_dir() else Path("/tmp")


class HostMountpoints:
    """Directories a node's mount namespace mounts over; absent ones are created on the host.

    Two lock files in /run/lock: `gpushare-realnode.lock` (held exclusively for a moment while
    directories are created or removed; it lists those a RealNode created) and
    `gpushare-realnode.users` (every running RealNode holds it shared). The last node to stop gets
    the users lock exclusively and removes the listed directories that are empty, so the host is
    left as it was found; a directory that already existed is never removed.
    """

    def __init__(self, paths: Iterable[str | Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._users: int | None = None

    @staticmethod
    def _open(name: str) -> int:
        return os.open(_lock_dir() / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def acquire(self) -> None:
        if self._users is not None:
            return
        mutex = self._open("gpushare-realnode.lock")
        try:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            created = self._read(mutex)
            for path in self.paths:
                for p in [*reversed(path.parents), path]:
                    if not p.exists():
                        p.mkdir(mode=0o755)
                        created.append(str(p))
            self._write(mutex, created)
            users = self._open("gpushare-realnode.users")
            fcntl.flock(users, fcntl.LOCK_SH)  # never blocks: only a holder of `mutex` locks it exclusively
            self._users = users
        finally:
            os.close(mutex)

    def release(self) -> None:
        """Drop our hold; the last holder removes the directories RealNodes created (if empty)."""
        users, self._users = self._users, None
        if users is None:
            return
        mutex = self._open("gpushare-realnode.lock")
        try:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another RealNode still runs on this host
            kept = []
            for p in sorted(self._read(mutex), key=lambda s: s.count("/"), reverse=True):
                try:
                    os.rmdir(p)
                except FileNotFoundError:
                    pass
                except OSError:
                    kept.append(p)  # not empty: something else uses it now
            self._write(mutex, kept)
        finally:
            os.close(users)
            os.close(mutex)

    @staticmethod
    def _read(fd: int) -> list[str]:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 1 << 16).decode() or "[]"
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return []
        return [str(v) for v in value] if isinstance(value, list) else []

    @staticmethod
    def _write(fd: int, created: list[str]) -> None:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(sorted(set(created))).encode())


# ------------------------------------------------------------------------------ cgroups


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, the hybrid unified one, or the v2 root)."""
    mounts: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        if fstype in ("cgroup", "cgroup2"):
            mounts.append(Path(left.split()[4]))
    return sorted(set(mounts))


def is_cgroup_v2() -> bool:
    return (CGROUP_FS / "cgroup.controllers").exists()


def hard_limit_cgroup_tree(name: str) -> tuple[str, list[str]]:
    """Where a node agent with --hard-limit finds the pod cgroups of the RealNode whose cgroupRoot is `/<name>`,
    and the NVML stand-in's flags for it: the hybrid cgroup v2 hierarchy (/sys/fs/cgroup/unified) when kubelet's
    pods land there (runc creates them there in hybrid mode), a real cgroup2 mount; else the v1 memory
    hierarchy, with the stand-in told to accept cgroup v1 paths; on a cgroup v2 host, the v2 tree itself."""
    if is_cgroup_v2():
        return str(CGROUP_FS / name), []
    v2 = CGROUP_FS / "unified" / name
    if (v2 / "kubepods").is_dir():
        return str(v2), []
    return str(CGROUP_FS / "memory" / name), ["--sim-accept-cgroup-v1"]


def create_cgroup_root(name: str) -> None:
    """`/<name>` in every hierarchy (kubelet requires its cgroupRoot to exist); cpuset gets its parent's
    cpus and mems, without which no task may join it."""
    for mount in cgroup_hierarchies():
        path = mount / name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent_knob = mount / knob
            if parent_knob.exists() and (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text(parent_knob.read_text())


def cgroup_pids(name: str) -> set[int]:
    """PIDs in `/<name>` or below, in any hierarchy."""
    pids: set[int] = set()
    for mount in cgroup_hierarchies():
        for dirpath, _dirs, _files in os.walk(mount / name):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (Path(dirpath) / "cgroup.procs").read_text().split())
    return pids


def remove_cgroup_root(name: str, timeout: float = 10.0) -> list[str]:
    """rmdir `/<name>` and everything below it, bottom up, in every hierarchy; returns what is left."""
    deadline = time.monotonic() + timeout
    while True:
        left: list[str] = []
        for mount in cgroup_hierarchies():
            root = mount / name
            if not root.exists():
                continue
            for dirpath, _dirs, _files in os.walk(root, topdown=False):
                try:
                    os.rmdir(dirpath)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    left.append(f"{dirpath}: {exc.strerror}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)  # a killed task leaves its cgroup a moment later


# ------------------------------------------------------------------------------ processes


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pids_in_mount_ns(ns: str) -> set[int]:
    """Every process whose mount namespace is `ns` (as /proc/<pid>/ns/mnt reads, e.g. 'mnt:[4026532]')."""
    return {pid for pid in _pids() if pid != os.getpid() and mount_ns(pid) == ns}


def pids_with_args(*needles: str) -> set[int]:
    """Processes whose command line contains every one of `needles` as an argument."""
    found = set()
    for pid in _pids():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = {a.decode(errors="replace") for a in args}
        if all(n in words for n in needles):
            found.add(pid)
    return found


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until none of `pids` exists (or is a zombie); returns those still there."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if _alive(p)}
        if pending:
            time.sleep(0.05)
    return pending


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
