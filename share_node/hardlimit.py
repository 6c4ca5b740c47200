"""A hard GPU memory limit per pod, enforced by the NVIDIA driver per cgroup (R615+), for both node agents.

What NVIDIA documents, and what this module relies on:

* `nvmlDeviceSetMemoryLimits_v1(device, nvmlSetMemoryLimits_v1_t*)` and `nvmlDeviceGetMemoryLimits_v1(device,
  nvmlGetMemoryLimits_v1_t*)` (NVML reference; nvidia-ml-py 13.615.71 `c_nvmlSetMemoryLimits_v1_t` /
  `c_nvmlGetMemoryLimits_v1_t`): `nameSpace` is the full sysfs path of a cgroup, `softLimit` and `hardLimit`
  are bytes; the getter adds `currentUsed`, what the cgroup's processes hold on that GPU now. Set needs root;
  "MIG handles are not supported". An allocation past the hard limit fails with out-of-memory, in that cgroup
  only. No limit is soft 0 and hard `NVML_DEVICE_MEMORY_LIMIT_MAX`; setting that clears a limit, and "removing
  the cgroup will also clear any limits".
* MPS "v3 Memory Partitioning": cgroup v2 mounted at /sys/fs/cgroup, CUDA 13.4 / driver R615 or newer, a
  non-MIG device. Two back ends, picked when the driver loads: the kernel's dmem controller (Linux 6.14+: the
  hard limit is `dmem.max`, the soft `dmem.min`) or, on older kernels, the driver's own on the misc
  controller. cgroup v2 limits are hierarchical: a limit on a parent bounds the sum of its children, so a
  limit on the pod's cgroup is one budget for all of its containers. Memory reporting inside the cgroup
  (`nvmlDeviceGetMemoryInfo_v2`, and CUDA's `cudaMemGetInfo`) is the limit's view, not the whole GPU's.

Where the limit goes (docs/operations.md, "Hard GPU memory limit"): the pod's cgroup, at the hook where it
exists and nothing of the pod's runs on the GPU yet, so a pod's containers share its total on each GPU:
kubelet's device plugin `PreStartContainer` (share-plugin) and DRA `NodePrepareResources` (share-dra).

The functional core (`static_problem`, `decide_support`, `pod_gpu_limits`, the cgroup name matching) is pure;
`probe` and `HardLimiter` are the shell, over a `MemoryLimits` adapter: NVML (share_node/backend/nvml.py) or
the stand-in that behaves as NVIDIA documents (share_node/backend/sim.py).
"""

from __future__ import annotations

import enum
import logging
import os
import re
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Protocol

from share_core.assignment import placed_request
from share_core.assignment import pod_is_finished
from share_core.contract import HARD_LIMIT_MIN_DRIVER
from share_core.contract import HARD_LIMIT_MODES
from share_core.contract import HardLimitMode
from share_core.contract import MemoryUnit
from share_core.hardlimit import HardLimitStatus

log = logging.getLogger(__name__)

LIMIT_MAX = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX: "no hard limit"
MIB = 1024 * 1024
PROBE_BYTES = 1024 * MIB  # what the probe sets on its scratch cgroup and reads back


class LimitErrorCode(enum.Enum):
    """The NVML return codes the limit calls give, as far as they matter here."""

    NOT_SUPPORTED = "not supported"  # a driver without the feature, a MIG handle
    NO_PERMISSION = "no permission"  # Set without root
    NOT_FOUND = "not found"  # no such cgroup (it was removed)
    INVALID_ARGUMENT = "invalid argument"  # not a cgroup v2 path, a bad limit
    FUNCTION_NOT_FOUND = "function not found"  # libnvidia-ml has no such symbol (a driver before R615)
    OTHER = "error"


class LimitError(RuntimeError):
    """An NVML limit call failed; `code` says how (the message is NVML's, with what was asked)."""

    def __init__(self, code: LimitErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Limits:
    """One cgroup's limits on one GPU, and what its processes hold there (None: the driver did not say)."""

    soft: int
    hard: int
    current_used: int | None = None

    @property
    def limited(self) -> bool:
        return not (self.soft == 0 and self.hard == LIMIT_MAX)


class MemoryLimits(Protocol):
    """The driver's per-cgroup memory limit, one GPU (by UUID) and one cgroup (full sysfs path) at a time."""

    def available(self) -> bool:
        """Whether the NVML library has the limit functions at all."""
        ...

    def driver_version(self) -> str: ...

    def set(self, gpu_uuid: str, cgroup: str, soft: int, hard: int) -> None:
        """Raises LimitError."""
        ...

    def get(self, gpu_uuid: str, cgroup: str) -> Limits:
        """Raises LimitError."""
        ...


# -- the functional core ------------------------------------------------------------------------------------


def parse_driver_version(text: str) -> tuple[int, ...]:
    """`580.159.04` -> (580, 159, 4); () when it is not a version."""
    parts = []
    for p in text.strip().split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    uuid: str
    mig: bool  # a MIG instance: NVIDIA does not support limits on MIG handles


def gpu_facts(gpus: Iterable[Any]) -> tuple[GpuFacts, ...]:
    """The probe's view of the backend's GPUs (share_node.backend.Gpu: a MIG instance has a parent)."""
    return tuple(GpuFacts(g.uuid, bool(g.parent_uuid)) for g in gpus)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the probe learned of the node before it tries a limit for real."""

    mode: str
    symbol: bool  # libnvidia-ml exports nvmlDeviceSetMemoryLimits_v1
    driver: str
    cgroup_root: str
    cgroup_v2: bool
    gpus: tuple[GpuFacts, ...]


@dataclass(frozen=True, slots=True)
class Support(HardLimitStatus):
    """Whether this node enforces hard limits (what it publishes), and on which GPUs."""

    gpus: tuple[str, ...] = ()  # the GPU UUIDs limits are set on


def unsupported_driver(driver: str) -> str:
    """The sentence every surface (log, annotation, GPU tier) uses for a driver older than R615."""
    need = ".".join(map(str, HARD_LIMIT_MIN_DRIVER))
    return f"unsupported driver {driver or 'unknown'}: the per-cgroup GPU memory limit needs R{need} or newer"


def static_problem(f: Facts) -> str | None:
    """Why the node cannot enforce hard limits, from what is known without trying one; None if worth a try."""
    if f.mode == HardLimitMode.OFF:
        return "turned off (--hard-limit off)"
    version = parse_driver_version(f.driver)
    if not version or version[: len(HARD_LIMIT_MIN_DRIVER)] < HARD_LIMIT_MIN_DRIVER:
        return unsupported_driver(f.driver)
    if not f.symbol:
        return f"driver {f.driver}: libnvidia-ml has no nvmlDeviceSetMemoryLimits_v1"
    if not f.cgroup_v2:
        return f"{f.cgroup_root} is not cgroup v2: the driver's per-cgroup limit needs cgroup v2"
    if f.gpus and all(g.mig for g in f.gpus):
        return "every GPU is a MIG instance: NVIDIA does not support memory limits on MIG handles"
    if not f.gpus:
        return "no GPUs"
    return None


def decide_support(f: Facts, scratch_problem: str | None) -> Support:
    """The verdict from the facts and the scratch cgroup's set-then-read-back ("" when it held)."""
    problem = static_problem(f) or scratch_problem
    if problem:
        if f.mode == HardLimitMode.OFF:
            return Support(f.mode, False, problem, f.driver)
        return Support(f.mode, False, f"{problem}; falling back to the env limit", f.driver)
    gpus = tuple(g.uuid for g in f.gpus if not g.mig)
    mig = [g.uuid for g in f.gpus if g.mig]
    reason = f"driver {f.driver}, on the pod cgroups under {f.cgroup_root}"
    if mig:
        reason += f"; not on the MIG instances {', '.join(mig)} (NVIDIA does not support them)"
    return Support(f.mode, True, reason, f.driver, gpus)


def pod_gpu_limits(pod: Mapping[str, Any], gpus: Sequence[tuple[int, str]], unit: MemoryUnit) -> dict[str, int] | None:
    """{GPU UUID: bytes} a gpushare pod may use on each GPU it was assigned: its Kubernetes request (the max of
    any init container and the sum of its app containers and sidecars) over its GPU count. None for a pod
    gpushare did not place, or one that finished."""
    if pod_is_finished(pod):
        return None
    placed = placed_request(pod)
    if placed is None:
        return None
    request, assignment = placed
    per_gpu = request.total * unit.mib // len(assignment.gpu_indices) * MIB
    out: dict[str, int] = {}
    for uuid in assignment.uuids_on(dict(gpus)):
        out[uuid] = out.get(uuid, 0) + per_gpu
    return out


# `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid with _>.slice` (systemd): k8s.io/kubernetes
# pkg/kubelet/cm/pod_container_manager_linux.go GetPodContainerName, cgroup_manager_linux.go (systemd names).
_POD_DIR = re.compile(r"^(?:.*-)?pod([0-9a-fA-F][0-9a-fA-F_-]{30,35}[0-9a-fA-F])(?:\.slice)?$")


def pod_uid_of_dir(name: str) -> str | None:
    """The pod UID a cgroup directory name carries, or None."""
    m = _POD_DIR.match(name)
    return m.group(1).replace("_", "-").lower() if m else None


# -- the shell: cgroup file system ---------------------------------------------------------------------------


def cgroup_fstype(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The file system type of the mount holding `path` (`cgroup2`, `cgroup`, `tmpfs`, ...); "" if unknown."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mnt = fields[4]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, right.split()[0]
    return fstype


def find_pod_cgroups(root: Path, max_depth: int = 6) -> dict[str, Path]:
    """Every pod cgroup under `root`: pod UID -> its directory (a walk that stops at each pod's directory)."""
    out: dict[str, Path] = {}
    root_depth = len(root.parts)
    for dirpath, dirnames, _files in os.walk(root):
        here = Path(dirpath)
        keep = []
        for d in dirnames:
            uid = pod_uid_of_dir(d)
            if uid is not None:
                out.setdefault(uid, here / d)
            elif len(here.parts) - root_depth < max_depth:
                keep.append(d)
        dirnames[:] = keep
    return out


def cgroup_populated(path: Path) -> bool:
    """Whether any process is in the cgroup or below it: cgroup v2's `cgroup.events` (`populated 1`), else the
    `cgroup.procs` of every cgroup below (v1 and the hybrid hierarchy)."""
    events = path / "cgroup.events"
    try:
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() == "1"
    except OSError:
        pass
    for dirpath, _dirs, _files in os.walk(path):
        try:
            if (Path(dirpath) / "cgroup.procs").read_text().split():
                return True
        except OSError:
            continue
    return False


# -- the probe ----------------------------------------------------------------------------------------------


def probe(
    limits: MemoryLimits,
    mode: str,
    cgroup_root: str,
    gpus: Iterable[GpuFacts],
    agent: str = "gpushare",
    fstype: Callable[[str], str] = cgroup_fstype,
) -> Support:
    """Find out whether this node enforces hard limits: the NVML symbol, the driver version, cgroup v2, not
    MIG, then a limit set on a scratch cgroup, read back and cleared before the cgroup is removed."""
    if mode not in HARD_LIMIT_MODES:
        raise ValueError(f"--hard-limit {mode!r}: expected one of {', '.join(HARD_LIMIT_MODES)}")
    driver = ""
    try:
        driver = limits.driver_version()
    except Exception as exc:  # an adapter that cannot even say its version: report it as the reason
        driver = f"unknown ({exc})"
    facts = Facts(
        mode=mode,
        symbol=mode != HardLimitMode.OFF and limits.available(),
        driver=driver,
        cgroup_root=cgroup_root,
        # the NVML stand-in may be told to take cgroup v1 paths (test machines run v1); NVIDIA's driver never does
        cgroup_v2=fstype(cgroup_root) == "cgroup2"
        or (bool(getattr(limits, "accept_cgroup_v1", False)) and fstype(cgroup_root) == "cgroup"),
        gpus=tuple(gpus),
    )
    if static_problem(facts) is not None:
        return decide_support(facts, None)
    target = next(g.uuid for g in facts.gpus if not g.mig)
    return decide_support(facts, scratch_check(limits, Path(cgroup_root), target, agent))


def scratch_check(limits: MemoryLimits, root: Path, gpu_uuid: str, agent: str) -> str | None:
    """Set a limit on a scratch cgroup, read it back, clear it, remove the cgroup; None when all of it held."""
    scratch = root / f"gpushare-hard-limit-probe-{agent}-{os.getpid()}"
    try:
        scratch.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot create a scratch cgroup {scratch}: {exc.strerror or exc}"
    try:
        try:
            limits.set(gpu_uuid, str(scratch), PROBE_BYTES, PROBE_BYTES)
            got = limits.get(gpu_uuid, str(scratch))
        except LimitError as exc:
            return f"a limit on the scratch cgroup {scratch} failed ({exc.code.value}): {exc}"
        if got.hard != PROBE_BYTES:
            return f"the scratch cgroup {scratch} read back a hard limit of {got.hard} bytes, not {PROBE_BYTES}"
        return None
    finally:
        try:
            limits.set(gpu_uuid, str(scratch), 0, LIMIT_MAX)  # clear first: the cgroup goes next
        except LimitError as exc:
            log.debug("clearing the scratch cgroup's limit: %s", exc)
        try:
            scratch.rmdir()
        except OSError as exc:
            log.warning("cannot remove the scratch cgroup %s: %s", scratch, exc)


def check_required(support: Support) -> None:
    """`--hard-limit cgroup` promises the limit: a node that cannot keep it must not run the agent."""
    if support.mode == HardLimitMode.CGROUP and not support.enforced:
        raise HardLimitError(f"--hard-limit cgroup: this node cannot enforce it: {support.reason}")


# -- the shell: limits on pods ------------------------------------------------------------------------------


class HardLimitError(RuntimeError):
    """A pod could not be given its hard limit: the message says which pod, which GPU and why."""


@dataclass(slots=True)
class PodLimit:
    """A pod cgroup this agent limited (or found limited), per GPU."""

    uid: str
    who: str
    cgroup: Path
    per_gpu: dict[str, int]
    populated_seen: bool = False


@dataclass(slots=True)
class AdoptReport:
    kept: list[str] = field(default_factory=list)  # pod cgroups already holding the right limits
    set_late: list[str] = field(default_factory=list)  # active pods without their limit: set now
    cleared: list[str] = field(default_factory=list)  # limits of pods that are not active any more


class HardLimiter:
    """Sets, finds and clears the limits on pod cgroups; remembers which it holds (rebuilt by `adopt`)."""

    def __init__(
        self, limits: MemoryLimits, support: Support, cgroup_root: str, node: str, clear_when_empty: bool = True
    ) -> None:
        self.limits = limits
        # the device plugin has no hook at pod removal: it clears a limit when the pod's cgroup empties (a new
        # sandbox's containers get theirs again at PreStartContainer). share-dra clears at
        # NodeUnprepareResources only: its hook (NodePrepareResources) does not come again for a new sandbox.
        self.clear_when_empty = clear_when_empty
        self.support = support
        self.root = Path(cgroup_root)
        self.node = node
        self.gpus = frozenset(support.gpus)
        self._lock = threading.Lock()
        self._pods: dict[str, PodLimit] = {}

    def pods(self) -> dict[str, PodLimit]:
        with self._lock:
            return dict(self._pods)

    def _cgroup(self, uid: str) -> Path | None:
        with self._lock:
            known = self._pods.get(uid)
        if known is not None and known.cgroup.is_dir():
            return known.cgroup
        return find_pod_cgroups(self.root).get(uid)

    def limit_pod(self, uid: str, who: str, per_gpu: Mapping[str, int]) -> PodLimit | None:
        """Give the pod's cgroup its hard limit on each of its GPUs (soft = hard: the scheduler never promised
        the memory twice) and read it back. None when none of its GPUs takes a limit (MIG instances)."""
        wanted = {u: n for u, n in per_gpu.items() if u in self.gpus}
        if not wanted:
            log.info("node %s: pod %s: no hard limit (its GPUs %s take none)", self.node, who, ", ".join(per_gpu))
            return None
        path = self._cgroup(uid)
        if path is None:
            raise HardLimitError(
                f"node {self.node}: pod {who}: its cgroup (pod{uid}) is not under {self.root}, so its hard GPU "
                f"memory limit cannot be set; kubelet retries the container"
            )
        with self._lock:
            known = self._pods.get(uid)
            if known is not None and known.cgroup == path and known.per_gpu == wanted:
                return known  # the pod's next container: the pod's limit is already there
        for uuid, n in sorted(wanted.items()):
            try:
                self.limits.set(uuid, str(path), n, n)
                got = self.limits.get(uuid, str(path))
            except LimitError as exc:
                raise HardLimitError(
                    f"node {self.node}: pod {who}: setting its hard limit of {n // MIB} MiB on GPU {uuid} "
                    f"(cgroup {path}) failed ({exc.code.value}): {exc}"
                ) from exc
            if got.hard != n:
                raise HardLimitError(
                    f"node {self.node}: pod {who}: GPU {uuid} read back a hard limit of {got.hard} bytes for "
                    f"{path}, not the {n} set"
                )
        entry = PodLimit(uid, who, path, dict(wanted), populated_seen=cgroup_populated(path))
        with self._lock:
            self._pods[uid] = entry
        log.info(
            "node %s: pod %s: hard GPU memory limit set on its cgroup %s: %s",
            self.node,
            who,
            path,
            ", ".join(f"GPU {u} {n // MIB} MiB" for u, n in sorted(wanted.items())),
        )
        return entry

    def release_pod(self, uid: str, why: str) -> bool:
        """Clear the pod's limits (soft 0, hard max) while its cgroup still exists, then forget it. A cgroup
        already removed took its limits with it (NVIDIA: removing the cgroup clears them)."""
        with self._lock:
            entry = self._pods.get(uid)
        if entry is None:
            return False
        for uuid in sorted(entry.per_gpu):
            if not entry.cgroup.is_dir():
                break
            try:
                self.limits.set(uuid, str(entry.cgroup), 0, LIMIT_MAX)
            except LimitError as exc:
                if exc.code is not LimitErrorCode.NOT_FOUND:
                    log.warning(
                        "node %s: pod %s: clearing its limit on GPU %s failed: %s", self.node, entry.who, uuid, exc
                    )
                    return False
        with self._lock:
            self._pods.pop(uid, None)
        log.info("node %s: pod %s: hard GPU memory limit cleared (%s)", self.node, entry.who, why)
        return True

    def sweep(self) -> list[str]:
        """Local and cheap (no API call): forget pods whose cgroup is gone, and (`clear_when_empty`) clear the
        limits of pods whose cgroup emptied after it held processes (every container and the sandbox exited: the
        pod is being removed, and kubelet removes its cgroup next, in cleanupOrphanedPodCgroups)."""
        released = []
        for uid, entry in self.pods().items():
            if not entry.cgroup.is_dir():
                with self._lock:
                    self._pods.pop(uid, None)
                log.info(
                    "node %s: pod %s: its cgroup is gone, and the driver cleared its limits with it",
                    self.node,
                    entry.who,
                )
                released.append(uid)
                continue
            populated = cgroup_populated(entry.cgroup)
            if populated:
                entry.populated_seen = True
            elif (
                self.clear_when_empty
                and entry.populated_seen
                and self.release_pod(uid, "every process of the pod exited")
            ):
                released.append(uid)
        return released

    def adopt(self, active: Mapping[str, tuple[str, Mapping[str, int]]]) -> AdoptReport:
        """After a start: find the limits already on pod cgroups (the driver keeps them across our restarts),
        keep those of active pods, set those missing, clear those of pods no longer active."""
        report = AdoptReport()
        for uid, path in sorted(find_pod_cgroups(self.root).items()):
            if uid in active:
                who, per_gpu = active[uid]
                wanted = {u: n for u, n in per_gpu.items() if u in self.gpus}
                if not wanted:
                    continue
                have = {}
                for uuid in wanted:
                    try:
                        have[uuid] = self.limits.get(uuid, str(path)).hard
                    except LimitError as exc:
                        log.warning(
                            "node %s: pod %s: reading its limit on GPU %s failed: %s", self.node, who, uuid, exc
                        )
                if have == wanted:
                    with self._lock:
                        self._pods[uid] = PodLimit(uid, who, path, dict(wanted), cgroup_populated(path))
                    report.kept.append(who)
                    continue
                try:
                    self.limit_pod(uid, who, wanted)
                    report.set_late.append(who)
                except HardLimitError as exc:
                    log.error("%s", exc)
                continue
            stale = []
            for uuid in sorted(self.gpus):
                try:
                    if self.limits.get(uuid, str(path)).limited:
                        stale.append(uuid)
                except LimitError:
                    continue
            if stale:
                with self._lock:
                    self._pods[uid] = PodLimit(uid, f"uid {uid}", path, dict.fromkeys(stale, 0))
                if self.release_pod(uid, "found after a restart; the pod is no longer active"):
                    report.cleared.append(uid)
        log.info(
            "node %s: hard limits found at start: %d kept (%s), %d set late (%s), %d cleared",
            self.node,
            len(report.kept),
            ", ".join(report.kept) or "none",
            len(report.set_late),
            ", ".join(report.set_late) or "none",
            len(report.cleared),
        )
        return report

    def readings(self) -> dict[str, dict[str, Limits]]:
        """Each limited pod's limits and current use per GPU, from the driver (the monitor's exact figure)."""
        out: dict[str, dict[str, Limits]] = {}
        for uid, entry in self.pods().items():
            for uuid in entry.per_gpu:
                try:
                    out.setdefault(uid, {})[uuid] = self.limits.get(uuid, str(entry.cgroup))
                except LimitError as exc:
                    if exc.code is not LimitErrorCode.NOT_FOUND:
                        log.debug("node %s: pod %s GPU %s: %s", self.node, entry.who, uuid, exc)
        return out
