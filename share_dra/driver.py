"""Prepare and unprepare claims: the DRA driver's node-side work, behind the gRPC service.

What Prepare made is checkpointed (a small JSON file in the plugin's dir) before it answers kubelet, so:
Prepare of a claim already prepared answers the same devices again (kubelet retries, and calls it again
after its own restart); Unprepare after a plugin restart removes exactly the CDI spec Prepare wrote; and
Unprepare of a claim we never prepared succeeds with nothing to do (kubelet may ask twice).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
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

import yaml

from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import MemoryUnit
from share_core.contract import dra_cdi_spec_file
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_dra.claims import ClaimError
from share_dra.claims import PreparedDevice
from share_dra.claims import allocated_devices
from share_dra.claims import claim_memory
from share_dra.claims import claim_pods
from share_dra.claims import nvidia_cdi_names
from share_dra.claims import prepare
from share_dra.claims import spec_text
from share_node.backend import Gpu
from share_node.hardlimit import HardLimiter
from share_node.hardlimit import HardLimitError

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
CHECKPOINT_NAME = "checkpoint.json"


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A checkpointed claim: where its CDI spec is and what kubelet was told."""

    namespace: str
    name: str
    spec_path: str
    devices: tuple[PreparedDevice, ...]
    # --hard-limit: the pods the claim is reserved for (uid -> namespace/name) and its memory per GPU UUID
    pods: Mapping[str, str] = field(default_factory=dict)
    memory: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "specPath": self.spec_path,
            "devices": [d.to_json() for d in self.devices],
            "pods": dict(self.pods),
            "memoryBytes": dict(self.memory),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Prepared:
        return cls(
            raw["namespace"],
            raw["name"],
            raw["specPath"],
            tuple(PreparedDevice.from_json(d) for d in raw["devices"]),
            dict(raw.get("pods") or {}),
            {k: int(v) for k, v in (raw.get("memoryBytes") or {}).items()},
        )


def write_atomic(path: Path, text: str) -> None:
    """Write a file whole or not at all (a reader never sees half a spec or checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Checkpoint:
    """The claims this plugin prepared, by UID, in one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Prepared]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"checkpoint {self.path} is unreadable ({exc}); move it away to start afresh") from exc
        if raw.get("version") != CHECKPOINT_VERSION:
            raise RuntimeError(f"checkpoint {self.path} has version {raw.get('version')!r}, want {CHECKPOINT_VERSION}")
        return {uid: Prepared.from_json(p) for uid, p in (raw.get("claims") or {}).items()}

    def save(self, claims: Mapping[str, Prepared]) -> None:
        body = {"version": CHECKPOINT_VERSION, "claims": {uid: p.to_json() for uid, p in sorted(claims.items())}}
        write_atomic(self.path, json.dumps(body, indent=2) + "\n")


def read_cdi_specs(dirs: Iterable[str]) -> list[dict[str, Any]]:
    """Every CDI spec (JSON or YAML) in `dirs`, ours aside; unreadable files are logged and skipped."""
    out = []
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("CDI dir %s unreadable: %s", d, exc)
            continue
        for n in names:
            if not n.endswith((".json", ".yaml", ".yml")) or n.startswith(f"{DRA_DRIVER_NAME}-"):
                continue
            try:
                doc = yaml.safe_load(Path(d, n).read_text())
            except (OSError, yaml.YAMLError) as exc:
                log.warning("CDI spec %s/%s unreadable: %s", d, n, exc)
                continue
            if isinstance(doc, dict):
                out.append(doc)
    return out


class Driver:
    """Prepares claims into CDI specs under `cdi_dir`, remembering them in `checkpoint`."""

    def __init__(
        self,
        node: str,
        gpus: Callable[[], Sequence[Gpu]],
        claims: ClaimSource,
        cdi_dir: str,
        checkpoint: Checkpoint,
        unit: MemoryUnit = MemoryUnit.GiB,
        cdi_spec_dirs: Sequence[str] = (),
        device_id_strategy: str = "uuid",
        limiter: HardLimiter | None = None,
    ) -> None:
        self.node = node
        self.limiter = limiter
        self.gpus = gpus
        self.claims = claims
        self.cdi_dir = Path(cdi_dir)
        self.checkpoint = checkpoint
        self.unit = unit
        self.cdi_spec_dirs = tuple(cdi_spec_dirs) or (str(self.cdi_dir),)
        self.device_id_strategy = device_id_strategy
        self._lock = threading.Lock()
        self._prepared = checkpoint.load()
        if self._prepared:
            log.info("checkpoint %s: %d claims prepared before this start", checkpoint.path, len(self._prepared))

    def prepared(self) -> dict[str, Prepared]:
        with self._lock:
            return dict(self._prepared)

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, tuple[PreparedDevice, ...] | str]:
        """Each claim's devices, or an error message kubelet shows on the pod (it retries)."""
        out: dict[str, tuple[PreparedDevice, ...] | str] = {}
        with self._lock:
            for ref in refs:
                try:
                    out[ref.uid] = self._prepare_one(ref)
                except (ClaimError, KubeError, OSError) as exc:
                    log.warning("NodePrepareResources %s: %s", ref.key, exc)
                    out[ref.uid] = f"gpushare.io cannot prepare ResourceClaim {ref.namespace}/{ref.name}: {exc}"
            if self.limiter is not None:
                self._limit([r for r in refs if not isinstance(out.get(r.uid), str)], out)
        return out

    def pod_limits(self) -> dict[str, tuple[str, dict[str, int]]]:
        """Pod UID -> (namespace/name, {GPU UUID: bytes}): the sum of its prepared claims on each GPU."""
        out: dict[str, tuple[str, dict[str, int]]] = {}
        for p in self._prepared.values():
            for uid, who in p.pods.items():
                _, per_gpu = out.setdefault(uid, (who, {}))
                for gpu, n in p.memory.items():
                    per_gpu[gpu] = per_gpu.get(gpu, 0) + n
        return out

    def _limit(self, refs: Sequence[ClaimRef], out: dict[str, tuple[PreparedDevice, ...] | str]) -> None:
        """--hard-limit: each pod of these claims gets the sum of its claims on each GPU, on its cgroup.

        kubelet calls NodePrepareResources from kuberuntime SyncPod "Step 4" before createPodSandbox, after
        Kubelet.SyncPod made the pod cgroup (pcm.EnsureExists): the cgroup exists and nothing of the pod runs.
        A failure fails the claims (kubelet shows it on the pod and retries)."""
        assert self.limiter is not None
        limits = self.pod_limits()
        for uid in sorted({u for r in refs for u in self._prepared[r.uid].pods}):
            who, per_gpu = limits[uid]
            if not per_gpu:
                continue
            try:
                self.limiter.limit_pod(uid, who, per_gpu)
            except HardLimitError as exc:
                log.error("NodePrepareResources: %s", exc)
                for r in refs:
                    if uid in self._prepared[r.uid].pods:
                        out[r.uid] = f"gpushare.io cannot prepare ResourceClaim {r.namespace}/{r.name}: {exc}"

    def _prepare_one(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        done = self._prepared.get(ref.uid)
        if done is not None and Path(done.spec_path).exists():
            log.info("NodePrepareResources %s: already prepared (%s)", ref.key, done.spec_path)
            return done.devices
        try:
            claim = self.claims.get_claim(ref.namespace, ref.name)
        except NotFound as exc:
            raise ClaimError(f"the ResourceClaim is gone: {exc}") from exc
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise ClaimError(f"the ResourceClaim now has UID {uid}, kubelet asked for {ref.uid} (recreated?)")
        allocated = allocated_devices(claim, self.node)
        nvidia = nvidia_cdi_names(read_cdi_specs(self.cdi_spec_dirs))
        spec_path = self.cdi_dir / dra_cdi_spec_file(ref.uid)
        prep = prepare(ref.uid, allocated, self.gpus(), self.unit, nvidia, self.device_id_strategy, str(spec_path))
        # Checkpoint first: a crash between the two leaves an entry whose Unprepare removes a file that may
        # not exist (harmless), never a spec file no entry names.
        self._prepared[ref.uid] = Prepared(
            ref.namespace,
            ref.name,
            str(spec_path),
            prep.devices,
            claim_pods(claim),
            claim_memory(allocated, self.gpus()),
        )
        self.checkpoint.save(self._prepared)
        write_atomic(spec_path, spec_text(prep.spec))
        log.info(
            "NodePrepareResources %s: %s -> %s",
            ref.key,
            ", ".join(f"{a.device} {a.memory_mib if a.memory_mib is not None else 'whole'} MiB" for a in allocated),
            ", ".join(i for d in prep.devices for i in d.cdi_device_ids),
        )
        return prep.devices

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Each claim's error ("" when done): removes its CDI spec and forgets it."""
        out: dict[str, str] = {}
        with self._lock:
            for ref in refs:
                done = self._prepared.get(ref.uid)
                if done is None:
                    log.info("NodeUnprepareResources %s: not prepared here, nothing to undo", ref.key)
                    out[ref.uid] = ""
                    continue
                try:
                    Path(done.spec_path).unlink(missing_ok=True)
                    del self._prepared[ref.uid]
                    self.checkpoint.save(self._prepared)
                except OSError as exc:
                    log.warning("NodeUnprepareResources %s: %s", ref.key, exc)
                    out[ref.uid] = f"gpushare.io cannot unprepare ResourceClaim {ref.namespace}/{ref.name}: {exc}"
                    continue
                log.info("NodeUnprepareResources %s: removed %s", ref.key, done.spec_path)
                out[ref.uid] = ""
                if self.limiter is not None:
                    self._unlimit(done)
        return out

    def _unlimit(self, done: Prepared) -> None:
        """--hard-limit: a pod none of whose claims stays prepared loses its limit now. kubelet calls
        NodeUnprepareResources from SyncTerminatingPod after every container stopped, before it removes the
        pod cgroup (HandlePodCleanups -> cleanupOrphanedPodCgroups): the order the driver wants."""
        assert self.limiter is not None
        still = {u for p in self._prepared.values() for u in p.pods}
        for uid in done.pods:
            if uid not in still:
                self.limiter.release_pod(uid, "its claims were unprepared")
