"""A DRA pod's demand on our GPUs, read from its ResourceClaims, and filter's hold on what they will take.

kube-scheduler calls the extender after its own filters (`findNodesThatPassExtenders` runs after
`findNodesThatPassFilters`), so every node we are offered already has room for the pod's claims by the
DynamicResources plugin's reckoning; our part is to choose among them as the policy would. The allocator
then takes the first device that fits in the node's slice order (share_placement.draorder.first_fit):
filter holds that device's memory for the pod until the claim's allocation shows in the watch, so the
next pod is not offered the same memory meanwhile, as the device-plugin path holds a GPU from filter to
bind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from share_core.assignment import pod_key
from share_core.contract import MemoryUnit
from share_core.dra import ClaimAsk
from share_core.dra import ask_units
from share_core.dra import merge_asks
from share_core.dra import pod_claim_names
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_placement import Demand
from share_placement.draorder import first_fit
from share_scheduler.cache import ClusterCache
from share_scheduler.nodes import Contribution

log = logging.getLogger(__name__)

CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


@dataclass(frozen=True, slots=True)
class PodClaims:
    """The pod's demand with its claims' GPUs in it (None: a shape left to kube-scheduler), and the
    claims still to be allocated (what filter's hold waits for)."""

    demand: Demand | None
    pending: tuple[str, ...]


class ClaimDemands:
    def __init__(self, kube: KubeClient, cache: ClusterCache, unit: MemoryUnit) -> None:
        self.kube = kube
        self.cache = cache
        self.unit = unit
        self._told: TTLCache[str, bool] = TTLCache(maxsize=10_000, ttl=600)  # pods already logged about

    def _tell(self, pod: str, message: str) -> None:
        if pod not in self._told:
            self._told[pod] = True
            log.info("pod %s: %s", pod, message)

    def _ask(self, namespace: str, name: str) -> tuple[bool, ClaimAsk | None] | str:
        """(allocated, ask) of a claim, read from the API server when the watch has not brought it."""
        known, allocated, ask = self.cache.claim(namespace, name)
        if not known:
            try:
                self.cache.learn_claim(self.kube.get_path(CLAIMS_PATH.format(namespace=namespace, name=name)))
            except NotFound:
                return f"ResourceClaim {namespace}/{name} does not exist"
            except KubeError as exc:
                return f"ResourceClaim {namespace}/{name} could not be read: {exc}"
            known, allocated, ask = self.cache.claim(namespace, name)
        return allocated, ask

    def demand(self, pod: Mapping[str, Any], host: Demand) -> PodClaims | None:
        """None: the pod asks nothing of our GPUs through claims (device-plugin and CPU-only pods)."""
        names, missing = pod_claim_names(pod)
        if not names and not missing:
            return None
        key = pod_key(pod)
        asks, pending = [], []
        for ns, name in names:
            got = self._ask(ns, name)
            if isinstance(got, str):
                self._tell(key, f"{got}; kube-scheduler places it")
                return PodClaims(None, ())
            allocated, ask = got
            if ask is not None and not allocated:
                asks.append(ask)
                pending.append(f"{ns}/{name}")
        if missing:
            self._tell(key, f"{missing}; kube-scheduler places it")
            return PodClaims(None, ())
        merged = merge_asks(asks)
        if merged is None:
            return None  # other drivers' claims, or ours already allocated (a shared claim): nothing new here
        if merged.reason:
            self._tell(key, f"{merged.reason}; kube-scheduler's allocator places it, not the policy")
            return PodClaims(None, ())
        demand = Demand(ask_units(merged, self.unit.mib), merged.count, merged.models, host.cpu, host.memory)
        return PodClaims(demand, tuple(pending))

    def hold(self, pod: Mapping[str, Any], node: str, claims: PodClaims) -> None:
        """Hold on `node` the device(s) the allocator will give the claims: first fit in slice order."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if claims.demand is None or not claims.pending or not uid:
            return
        snap = self.cache.node_snapshot(node)
        if snap is None:
            return
        order = snap.order or tuple(g.index for g in snap.gpus)
        chosen = first_fit(order, snap.state, claims.demand)
        if chosen is None:
            return  # our view lags kube-scheduler's: nothing to hold that would be right
        held = Contribution(node, chosen, claims.demand.per_gpu, pods=0)
        self.cache.hold_claims(pod_key(pod), uid, held, claims.pending)
