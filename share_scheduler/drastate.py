"""The DRA side of the extender's view: the GPUs our ResourceSlices publish and what allocated
ResourceClaims consume of them, as plain data the cache folds into its per-node vectors.

kube-scheduler counts a device's consumed capacity over every allocated claim, whoever allocated it and
whether or not a pod runs yet (`GatherAllocatedState`, k8s.io/dynamic-resource-allocation/structured);
so do we: each device result of an allocated claim is one "part" (a Contribution of no pod slot, CPU or
memory) on the GPU its pool and device name. A result whose device is in no slice we know yet (the slice
watch lags the claim watch) waits, by pool, until the slice comes. Other drivers' slices and results are
not ours: left out (share_core.dra).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from share_core.contract import MemoryUnit
from share_core.dra import ClaimAsk
from share_core.dra import ClaimResult
from share_core.dra import DraGpu
from share_core.dra import claim_ask
from share_core.dra import claim_name
from share_core.dra import claim_results
from share_core.dra import slice_devices
from share_core.gpus import GpuInfo
from share_scheduler.nodes import Contribution

log = logging.getLogger(__name__)

CLAIM_PART = "claim:"  # part keys start so; no pod key can (a pod key has no colon)


def part_key(claim: str, pool: str, device: str) -> str:
    return f"{CLAIM_PART}{claim}#{pool}/{device}"


@dataclass(slots=True)
class SliceEntry:
    pool: str
    node: str
    gpus: list[DraGpu]


@dataclass(slots=True)
class ClaimEntry:
    results: list[ClaimResult]
    ask: ClaimAsk | None
    parts: dict[str, Contribution] = field(default_factory=dict)


class DraIndex:
    """Slices and claims by name, and what each claim counts where. Not thread-safe: the cache calls
    it under its own lock. Methods that change anything return the part keys and nodes to refresh."""

    def __init__(self, unit: MemoryUnit) -> None:
        self.unit = unit
        self.slices: dict[str, SliceEntry] = {}
        self.claims: dict[str, ClaimEntry] = {}
        self._by_pool: dict[str, set[str]] = {}  # pool -> claims with results in it
        # Indexes over `slices`, so a claim or a node is looked up, never found by a scan of every slice.
        self._node_slices: dict[str, set[str]] = {}  # node -> names of its slices
        self._devices: dict[tuple[str, str], tuple[str, DraGpu]] = {}  # (pool, device) -> (node, GPU)

    # -- slices ----------------------------------------------------------------------------------

    def node_gpus(self, node: str) -> tuple[tuple[GpuInfo, ...], tuple[int, ...]]:
        """The node's GPUs in the resource unit (rounded down), and their indices in slice order (the
        order the allocator walks: slices by name, devices in array order)."""
        gpus: list[GpuInfo] = []
        for name in sorted(self._node_slices.get(node, ())):
            s = self.slices[name]
            gpus += [GpuInfo(g.index, g.uuid, g.model, g.memory_mib // self.unit.mib, g.healthy) for g in s.gpus]
        order = tuple(g.index for g in gpus)
        return tuple(sorted(gpus, key=lambda g: g.index)), order

    def set_slice(self, name: str, obj: Mapping[str, Any] | None) -> tuple[set[str], set[str]]:
        """Apply one slice (None: deleted); returns (nodes whose GPUs changed, claims to recount)."""
        old = self.slices.pop(name, None)
        nodes, pools = set(), set()
        if old is not None:
            nodes.add(old.node)
            pools.add(old.pool)
            self._node_slices[old.node].discard(name)
            if not self._node_slices[old.node]:
                del self._node_slices[old.node]
            for g in old.gpus:
                if self._devices.get((old.pool, g.device), (None, None))[1] is g:
                    del self._devices[(old.pool, g.device)]
        if obj is not None:
            node, gpus, problems = slice_devices(obj)
            for text in problems:
                log.warning("%s", text)
            if node:
                pool = str(((obj.get("spec") or {}).get("pool") or {}).get("name") or node)
                self.slices[name] = SliceEntry(pool, node, gpus)
                self._node_slices.setdefault(node, set()).add(name)
                for g in gpus:
                    self._devices[(pool, g.device)] = (node, g)
                nodes.add(node)
                pools.add(pool)
        claims = set().union(*(self._by_pool.get(p, set()) for p in pools)) if pools else set()
        return nodes, claims

    # -- claims ----------------------------------------------------------------------------------

    def set_claim(self, key: str, obj: Mapping[str, Any] | None) -> tuple[set[str], ClaimAsk | None]:
        """Apply one claim (None: deleted); returns (part keys to refresh, what it asks)."""
        old = self.claims.pop(key, None)
        touched = set(old.parts) if old is not None else set()
        if old is not None:
            for r in old.results:
                self._by_pool.get(r.pool, set()).discard(key)
        if obj is None:
            return touched, None
        results, problems = claim_results(obj)
        for text in problems:
            log.warning("%s", text)
        ask = None if results else claim_ask(obj)
        entry = ClaimEntry(results, ask)
        self.claims[key] = entry
        for r in results:
            self._by_pool.setdefault(r.pool, set()).add(key)
        self.resolve(key)
        return touched | set(entry.parts), ask

    def resolve(self, key: str) -> set[str]:
        """Recompute a claim's parts from its results and the slices known now; the keys that moved."""
        entry = self.claims.get(key)
        if entry is None:
            return set()
        before = entry.parts
        parts: dict[str, Contribution] = {}
        for r in entry.results:
            found = self._devices.get((r.pool, r.device))
            if found is None:
                continue  # the slice is not here yet: counted when it comes (set_slice -> resolve)
            node, gpu = found
            units = gpu.memory_mib // self.unit.mib if r.mib is None else -(-r.mib // self.unit.mib)
            pk = part_key(key, r.pool, r.device)
            have = parts.get(pk)
            per = units + (have.per_gpu if have is not None else 0)
            parts[pk] = Contribution(node, (gpu.index,), per, pods=0)
        entry.parts = parts
        return {k for k in set(before) | set(parts) if before.get(k) != parts.get(k)}

    def part(self, key: str) -> Contribution | None:
        claim = key[len(CLAIM_PART) :].rpartition("#")[0]
        entry = self.claims.get(claim)
        return entry.parts.get(key) if entry is not None else None

    def allocated(self, key: str) -> bool:
        entry = self.claims.get(key)
        return entry is not None and bool(entry.results)

    def replace_claims(self, objs: Iterable[Mapping[str, Any]]) -> tuple[set[str], list[str]]:
        """A full list; returns (part keys to refresh, keys of claims allocated in it)."""
        touched: set[str] = set()
        seen = set()
        for obj in objs:
            ns, name = claim_name(obj)
            key = f"{ns}/{name}"
            seen.add(key)
            touched |= self.set_claim(key, obj)[0]
        for key in set(self.claims) - seen:
            touched |= self.set_claim(key, None)[0]
        return touched, [k for k in seen if self.allocated(k)]
