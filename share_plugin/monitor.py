"""The monitor's imperative shell: poll NVML, read `/proc/<pid>/cgroup`, know the pods, then tell and enforce.

Every few seconds (`--monitor-interval`): the backend lists each GPU's used memory and compute processes;
each PID's cgroup names its pod UID and container ID (share_plugin/cgroups.py); the pods bound to this node
(listed again only when an unknown pod or container shows up, or once a minute) name the container and its
limit; share_plugin/usage.py sums and decides. With a hard limit (`--hard-limit`), the driver's `currentUsed` of
each limited pod's cgroup (nvmlDeviceGetMemoryLimits_v1) is its exact figure per GPU, contexts included.
Then: Prometheus metrics (share_plugin/metrics.py), an Event
and a log line per crossing of a limit, `--over-limit kill` ends the container's processes after the grace
period, and the node annotation `gpushare.io/gpu-usage` for kubectl inspect is rewritten when a figure moved
by `--usage-annotation-threshold` MiB, at most once per `--usage-annotation-interval`.

Host access (the chart gives exactly this): NVML reports host PIDs, so the plugin runs in the host PID
namespace (`hostPID: true`) and reads `/proc/<pid>/cgroup` (world-readable) through its own /proc; ending a
process of another user needs CAP_KILL, added only with `--over-limit kill`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Protocol

from share_core.contract import ANN_NODE_GPU_USAGE
from share_core.contract import EVENT_OVER_LIMIT
from share_core.contract import EVENT_OVER_LIMIT_KILLED
from share_core.gpuusage import UsageSummary
from share_core.gpuusage import changed_enough
from share_core.kube import KubeError
from share_core.kube import now_rfc3339
from share_node.hardlimit import Limits
from share_plugin.cgroups import CgroupRef
from share_plugin.cgroups import parse_cgroup
from share_plugin.node import PluginNode
from share_plugin.usage import Cleared
from share_plugin.usage import ContainerUsage
from share_plugin.usage import Crossed
from share_plugin.usage import Kill
from share_plugin.usage import OverLimitMode
from share_plugin.usage import OverState
from share_plugin.usage import PodEntry
from share_plugin.usage import StateKey
from share_plugin.usage import Usage
from share_plugin.usage import attribute
from share_plugin.usage import decide
from share_plugin.usage import driver_usage
from share_plugin.usage import index_pods
from share_plugin.usage import summarize

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 5.0


class HardLimitReadings(Protocol):
    """--hard-limit: each limited pod's limits and use per GPU, from the driver (share_plugin/hardlimit.py)."""

    def readings(self) -> dict[str, dict[str, Limits]]: ...


class ProcFs:
    """`/proc` (or a stand-in directory in tests): a process's cgroup file."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = Path(root)

    def cgroup(self, pid: int) -> str | None:
        """The text of /proc/<pid>/cgroup; None when the process is gone."""
        try:
            return (self.root / str(pid) / "cgroup").read_text()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None

    def cgroups(self, pids: list[int]) -> dict[int, CgroupRef | None]:
        """Each live PID's pod and container (None: in no pod); exited PIDs are left out."""
        out: dict[int, CgroupRef | None] = {}
        for pid in pids:
            text = self.cgroup(pid)
            if text is not None:
                out[pid] = parse_cgroup(text)
        return out


@dataclass(frozen=True, slots=True)
class KillResult:
    pid: int
    killed: bool
    why: str


class Killer:
    """End one process, only if it still is the container's: a pidfd pins the process, its cgroup is read
    again through /proc, then the signal goes through the pidfd (pidfd_send_signal(2)), so a PID that exited
    and was reused by another process in between is never signalled."""

    def __init__(
        self,
        proc: ProcFs,
        open_pidfd: Callable[[int], int] = os.pidfd_open,
        send: Callable[[int, int], None] = signal.pidfd_send_signal,
        close: Callable[[int], None] = os.close,
        sig: int = signal.SIGKILL,
    ) -> None:
        self.proc, self._open, self._send, self._close, self.sig = proc, open_pidfd, send, close, sig

    def kill(self, pid: int, expected: CgroupRef) -> KillResult:
        try:
            fd = self._open(pid)
        except ProcessLookupError:
            return KillResult(pid, False, "already exited")
        except OSError as exc:
            return KillResult(pid, False, f"cannot open it: {exc.strerror or exc}")
        try:
            text = self.proc.cgroup(pid)
            if text is None:
                return KillResult(pid, False, "already exited")
            now = parse_cgroup(text)
            if now != expected:
                return KillResult(pid, False, "no longer in the container (exited, PID reused): skipped")
            self._send(fd, self.sig)
            return KillResult(pid, True, "ended")
        except ProcessLookupError:
            return KillResult(pid, False, "already exited")
        except PermissionError:
            return KillResult(pid, False, "not permitted (the plugin needs CAP_KILL: chart devicePlugin.overLimit)")
        except OSError as exc:
            return KillResult(pid, False, f"failed: {exc.strerror or exc}")
        finally:
            self._close(fd)


@dataclass(slots=True)
class MonitorStats:
    """Counters the metrics expose."""

    polls: int = 0
    poll_errors: int = 0
    over_limit_events: int = 0
    kills: int = 0
    last_poll_seconds: float = 0.0
    annotation_writes: int = 0


@dataclass(slots=True)
class Snapshot:
    usage: Usage
    at: float
    stats: MonitorStats = field(default_factory=MonitorStats)


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 1024**3:.2f} GiB"


class Monitor:
    def __init__(
        self,
        node: PluginNode,
        mode: OverLimitMode = OverLimitMode.WARN,
        grace: float = 30.0,
        interval: float = DEFAULT_INTERVAL,
        proc: ProcFs | None = None,
        killer: Killer | None = None,
        annotation_interval: float = 30.0,
        annotation_threshold_mib: int = 256,
        pod_refresh: float = 60.0,
        min_relist: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        hard_limit: HardLimitReadings | None = None,
    ) -> None:
        self.node, self.kube, self.backend, self.unit = node.name, node.kube, node.backend, node.unit
        self.hard_limit = hard_limit
        self.mode, self.grace, self.interval = mode, grace, interval
        self.proc = proc or ProcFs()
        self.killer = killer or Killer(self.proc)
        self.annotation_interval = annotation_interval
        self.annotation_threshold_mib = annotation_threshold_mib
        self.pod_refresh, self.min_relist = pod_refresh, min_relist
        self.clock = clock
        self.stats = MonitorStats()
        self._pods: dict[str, PodEntry] = {}
        self._pods_at: float | None = None
        self._state: dict[StateKey, OverState] = {}
        self._published: UsageSummary | None = None
        self._published_at: float | None = None
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._cgroups: dict[int, CgroupRef | None] = {}
        self._unresolved: set[CgroupRef] = set()  # still unknown after the last list

    @property
    def snapshot(self) -> Snapshot | None:
        with self._lock:
            return self._snapshot

    # -- one poll ------------------------------------------------------------------------------------

    def _unknown(self, ref: CgroupRef | None) -> bool:
        return ref is not None and (
            ref.pod_uid not in self._pods
            or bool(ref.container_id and ref.container_id not in self._pods[ref.pod_uid].containers)
        )

    def _refresh_pods(self, now: float, cgroups: dict[int, CgroupRef | None]) -> None:
        """List the node's pods when the cache is old, or when a process names a pod or container it lacks.

        What a fresh list still does not name (a static pod's cgroup carries its config hash, not its
        mirror pod's UID) waits for the periodic refresh instead of listing again at every poll.
        """
        unknown = {ref for ref in cgroups.values() if self._unknown(ref)} - self._unresolved
        age = None if self._pods_at is None else now - self._pods_at
        if age is not None and age < self.pod_refresh and not (unknown and age >= self.min_relist):
            return
        try:
            pods = self.kube.list_pods(field_selector=f"spec.nodeName={self.node}").items
        except KubeError as exc:
            log.warning("node %s: cannot list the pods on this node (%s): using what was known", self.node, exc)
            return
        gpus = [(g.index, g.uuid) for g in self.backend.gpus()]
        self._pods = index_pods(pods, gpus, self.unit)
        self._pods_at = now
        self._unresolved = {ref for ref in cgroups.values() if ref is not None and self._unknown(ref)}

    def poll_once(self) -> Usage:
        started = self.clock()
        readings = self.backend.readings()
        pids = sorted({p.pid for r in readings for p in r.processes})
        cgroups = self._cgroups = self.proc.cgroups(pids)
        self._refresh_pods(started, cgroups)
        usage = attribute(readings, cgroups, self._pods)
        if self.hard_limit is not None:
            usage.driver_pods = driver_usage(self.hard_limit.readings(), self._pods, readings)
        for pid in usage.exited:
            log.debug("node %s: PID %d on a GPU exited before its cgroup was read", self.node, pid)
        self._state, actions = decide(usage, self._state, started, self.mode, self.grace)
        for action in actions:
            if isinstance(action, Crossed):
                self._crossed(action.usage)
            elif isinstance(action, Kill):
                self._kill(action.usage, action.over_for)
            elif isinstance(action, Cleared):
                self._cleared(action.key, action.usage)
        self._maybe_publish(usage, started)
        self.stats.polls += 1
        self.stats.last_poll_seconds = self.clock() - started
        with self._lock:
            self._snapshot = Snapshot(usage, started, self.stats)
        return usage

    def run(self, stop: threading.Event) -> None:
        """Poll every `interval` seconds until `stop`; a failed poll is logged and the next one tried."""
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:
                self.stats.poll_errors += 1
                log.exception("node %s: GPU memory poll failed", self.node)
            stop.wait(self.interval)

    # -- telling and enforcing ---------------------------------------------------------------------------

    def _where(self, c: ContainerUsage) -> str:
        return f"container {c.key.container!r} of pod {c.key.namespace}/{c.key.pod} on node {self.node}"

    def _event(self, c: ContainerUsage, reason: str, message: str) -> None:
        entry = self._pods.get(c.key.pod_uid)
        if entry is None:
            return
        try:
            self.kube.create_event(entry.pod, reason, message, "Warning")
        except KubeError as exc:
            log.warning(
                "node %s: cannot record event %s on pod %s/%s: %s", self.node, reason, entry.namespace, entry.name, exc
            )

    def _crossed(self, c: ContainerUsage) -> None:
        self.stats.over_limit_events += 1
        limit = c.limit_bytes or 0
        what = (
            f"GPU {c.gpu_index} ({c.gpu_uuid}) was not assigned to it" if limit == 0 else f"its limit is {_gib(limit)}"
        )
        then = (
            f"--over-limit kill: its processes on that GPU are ended if it is still over in {self.grace:.0f}s"
            if self.mode is OverLimitMode.KILL
            else "--over-limit warn: nothing is done; neighbours on this GPU may run out of memory"
        )
        msg = (
            f"{self._where(c)} uses {_gib(c.used_bytes)} of GPU memory on GPU {c.gpu_index} ({c.gpu_uuid}), "
            f"over its limit: {what} (processes {', '.join(map(str, sorted(c.pids)))}). {then}"
        )
        log.warning("%s: %s", EVENT_OVER_LIMIT, msg)
        self._event(c, EVENT_OVER_LIMIT, msg)

    def _cleared(self, key: StateKey, c: ContainerUsage | None) -> None:
        uid, container, uuid = key
        if c is None:
            log.info(
                "node %s: pod UID %s container %r no longer uses GPU %s: over-limit cleared",
                self.node,
                uid,
                container,
                uuid,
            )
        else:
            log.info(
                "node %s: %s is back under its limit (%s of %s)",
                self.node,
                self._where(c),
                _gib(c.used_bytes),
                _gib(c.limit_bytes or 0),
            )

    def _kill(self, c: ContainerUsage, over_for: float) -> None:
        # Each PID must still be in the cgroup this poll read for it: the container's, no other.
        results = [
            self.killer.kill(pid, ref)
            for pid in sorted(c.pids)
            if (ref := self._cgroups.get(pid)) is not None and ref.pod_uid == c.key.pod_uid
        ]
        ended = [r.pid for r in results if r.killed]
        self.stats.kills += len(ended)
        skipped = "; ".join(f"PID {r.pid} {r.why}" for r in results if not r.killed)
        msg = (
            f"{self._where(c)} used {_gib(c.used_bytes)} of GPU memory on GPU {c.gpu_index} ({c.gpu_uuid}) over its "
            f"limit of {_gib(c.limit_bytes or 0)} for {over_for:.0f}s: ended its process(es) "
            f"{', '.join(map(str, ended)) or 'none'} on that GPU (--over-limit kill); no other container or pod "
            f"was touched" + (f". Not ended: {skipped}" if skipped else "")
        )
        log.warning("%s: %s", EVENT_OVER_LIMIT_KILLED, msg)
        self._event(c, EVENT_OVER_LIMIT_KILLED, msg)

    # -- the node annotation ----------------------------------------------------------------------------

    def _maybe_publish(self, usage: Usage, now: float) -> None:
        summary = summarize(usage)
        if self._published_at is not None and now - self._published_at < self.annotation_interval:
            return
        if not changed_enough(self._published, summary, self.annotation_threshold_mib):
            return
        try:
            self.kube.patch_node_annotations(self.node, {ANN_NODE_GPU_USAGE: summary.to_json(now_rfc3339())})
        except KubeError as exc:
            log.warning("node %s: cannot publish %s (will retry): %s", self.node, ANN_NODE_GPU_USAGE, exc)
            return
        self.stats.annotation_writes += 1
        self._published, self._published_at = summary, now
