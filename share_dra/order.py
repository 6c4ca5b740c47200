"""The order share-dra lists its node's GPUs in: the policy's, so kube-scheduler's first fit is the policy's pick.

kube-scheduler's allocator takes the first device in slice order that fits (share_placement.draorder);
the order the policy wants moves as claims are allocated on the node. `ClaimUsage` keeps what the
allocated ResourceClaims consume of this node's GPUs (list + watch of ResourceClaims: the API offers no
selector for "allocated on node X", so every node reads every claim and keeps its own pool's), and
teaches the policy the sizes claims ask cluster-wide (what `frag` prices against). Each change that
moves this node's order kicks the publisher, which writes the slice only when the order differs: one
write per change of order, none for a claim elsewhere.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from share_core.contract import MemoryUnit
from share_core.dra import ClaimResult
from share_core.dra import ask_units
from share_core.dra import claim_ask
from share_core.dra import claim_name
from share_core.dra import claim_results
from share_core.kube import Gone
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.retry import Backoff
from share_dra.slices import capacity_mib
from share_node.backend import Gpu
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement.draorder import DeviceOrderer

log = logging.getLogger(__name__)

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"


def node_state(node: str, gpus: Sequence[Gpu], used_mib: Mapping[int, int], unit: MemoryUnit) -> NodeState:
    """The node as placement sees it, in whole units of the slice's step (free rounded down)."""
    slots = []
    for g in gpus:
        total = capacity_mib(g, unit) // unit.mib
        free = max(capacity_mib(g, unit) - used_mib.get(g.index, 0), 0) // unit.mib
        slots.append(GpuSlot(g.index, g.model, total, free, g.healthy))
    return NodeState(node, tuple(slots))


def device_index(device: str) -> int | None:
    """`gpu-<index>` (share_core.contract.dra_device_name) back to the index; None for another name."""
    head, _, tail = device.partition("-")
    return int(tail) if head == "gpu" and tail.isdigit() else None


class ClaimUsage:
    """What allocated claims consume of this node's GPUs (MiB per GPU index), kept from a claim watch."""

    def __init__(self, node: str, unit: MemoryUnit, orderer: DeviceOrderer, on_change: Callable[[], None]) -> None:
        self.node = node
        self.unit = unit
        self.orderer = orderer
        self.on_change = on_change
        self._lock = threading.Lock()
        self._claims: dict[str, list[ClaimResult]] = {}  # claims with results in this node's pool
        self._seen: set[str] = set()  # claims whose ask the policy has learned (by uid)
        self.synced = threading.Event()

    def used(self, gpus: Sequence[Gpu]) -> dict[int, int]:
        """MiB consumed of each GPU (a result without consumed capacity holds its GPU whole)."""
        whole = {g.index: capacity_mib(g, self.unit) for g in gpus}
        out: dict[int, int] = {}
        with self._lock:
            for results in self._claims.values():
                for r in results:
                    index = device_index(r.device)
                    if index is not None and index in whole:
                        out[index] = out.get(index, 0) + (whole[index] if r.mib is None else r.mib)
        return out

    def learn(self, obj: Mapping[str, Any]) -> None:
        """Teach the policy the size a claim asks (once per claim), whichever node it lands on."""
        with self._lock:
            self._learn(obj)

    def _learn(self, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if not uid or uid in self._seen:
            return
        ask = claim_ask(obj)
        if ask is None or ask.reason:
            return
        self._seen.add(uid)
        self.orderer.observe(Demand(per_gpu=ask_units(ask, self.unit.mib), count=ask.count))

    def apply(self, obj: Mapping[str, Any], deleted: bool = False, learn: bool = True) -> bool:
        """One claim as the watch brings it; True when this node's usage changed."""
        ns, name = claim_name(obj)
        key = f"{ns}/{name}"
        mine: list[ClaimResult] = []
        if not deleted:
            results, _ = claim_results(obj)
            mine = [r for r in results if r.pool == self.node]
            if learn:
                self.learn(obj)
        with self._lock:
            before = self._claims.get(key, [])
            if mine:
                self._claims[key] = mine
            else:
                self._claims.pop(key, None)
            return before != mine

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            self._claims.clear()
        for obj in objs:
            self.apply(obj)

    def run(self, kube: KubeClient, stop: threading.Event, watch_timeout: int = 300) -> None:
        """List, then watch, again after any failure; kick the publisher on each change of this node."""
        backoff = Backoff()
        while not stop.is_set():
            try:
                listed = kube.list_path(CLAIMS_PATH)
                self.replace(listed.items)
                self.synced.set()
                self.on_change()
                for ev in kube.watch_path(CLAIMS_PATH, listed.resource_version, timeout_seconds=watch_timeout):
                    if stop.is_set():
                        return
                    if ev.type != "BOOKMARK" and self.apply(ev.object, deleted=ev.type == "DELETED"):
                        self.on_change()
                backoff.reset()
            except Gone:
                continue
            except KubeError as exc:
                log.warning("node %s: ResourceClaims list/watch failed (%s); the device order waits", self.node, exc)
                if backoff.wait(stop):
                    return
            except Exception:  # the order is an optimisation: never let a bug end the driver
                log.exception("node %s: ResourceClaims watch crashed; retrying", self.node)
                if backoff.wait(stop):
                    return


def policy_order(node: str, usage: ClaimUsage, unit: MemoryUnit) -> Callable[[Sequence[Gpu]], tuple[int, ...]]:
    """The publisher's order function: the policy's order over the node's GPUs and their usage now."""

    def order(gpus: Sequence[Gpu]) -> tuple[int, ...]:
        return usage.orderer.order(node_state(node, gpus, usage.used(gpus), unit))

    return order
