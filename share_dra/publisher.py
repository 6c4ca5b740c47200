"""Keeps this node's ResourceSlice equal to its healthy GPUs: at start, on every health change, and now and then;
with a policy, listed in the policy's order (share_dra.order), rewritten when that order moves.

The slice is the node's one pool (named after the node); every change bumps the pool's generation, which
is how kube-scheduler knows the newer slice replaces the older. Slices of our driver for this node under
other names (a former version's) are deleted, so the pool never has two.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence

from share_core.contract import DRA_UNHEALTHY_WITHDRAW
from share_core.contract import MemoryUnit
from share_core.kube import Conflict
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_dra import slices
from share_dra.kubeapi import DraApi
from share_node.backend import Gpu

log = logging.getLogger(__name__)


class SlicePublisher:
    def __init__(
        self,
        api: DraApi,
        node: str,
        gpus: Callable[[], Sequence[Gpu]],
        unit: MemoryUnit = MemoryUnit.GiB,
        driver_version: str = "",
        unhealthy: str = DRA_UNHEALTHY_WITHDRAW,
        order: Callable[[Sequence[Gpu]], Sequence[int]] | None = None,
    ) -> None:
        self.api = api
        self.order = order  # the policy's device order (share_dra.order); None: index order
        self.unhealthy = unhealthy
        self.node = node
        self.gpus = gpus
        self.unit = unit
        self.driver_version = driver_version
        self._lock = threading.Lock()
        self.kick = threading.Event()
        self._warned: set[str] = set()

    def sync(self) -> bool:
        """Make the API server's slice match the GPUs now; True when it had to write. Raises KubeError."""
        with self._lock:
            for _ in range(5):  # a conflict means someone else wrote: read again
                try:
                    return self._sync_once()
                except Conflict as exc:
                    log.info(
                        "ResourceSlice %s changed under us (%s); reading it again", slices.slice_name(self.node), exc
                    )
            raise KubeError(f"ResourceSlice {slices.slice_name(self.node)}: five conflicts in a row")

    def _sync_once(self) -> bool:
        gpus = self.gpus()
        name = slices.slice_name(self.node)
        current = None
        for s in self.api.list_slices(self.node):
            if s["metadata"]["name"] == name:
                current = s
            else:
                log.info("deleting stray ResourceSlice %s of this node", s["metadata"]["name"])
                try:
                    self.api.delete_slice(s["metadata"]["name"])
                except NotFound:
                    pass
        order = tuple(self.order(gpus)) if self.order is not None else ()
        if current is None:
            obj = slices.resource_slice(
                slices.slice_spec(self.node, gpus, self.unit, 1, self.driver_version, self.unhealthy, order)
            )
            self._check_served(self.api.create_slice(obj), obj)
            self._report("published", obj, gpus)
            return True
        generation = int(((current.get("spec") or {}).get("pool") or {}).get("generation") or 0)
        wanted = slices.resource_slice(
            slices.slice_spec(self.node, gpus, self.unit, generation, self.driver_version, self.unhealthy, order)
        )
        if slices.same_devices(current["spec"], wanted["spec"]):
            return False
        wanted["spec"]["pool"]["generation"] = generation + 1
        wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self._check_served(self.api.replace_slice(wanted), wanted)
        self._report("updated", wanted, gpus)
        return True

    def _check_served(self, served: dict, wanted: dict) -> None:
        """Say so, once each, when the API server dropped fields we set: a feature gate of it is off."""
        problem = slices.sharing_dropped(served.get("spec") or {}, wanted["spec"])
        if problem and problem not in self._warned:
            self._warned.add(problem)
            log.error(
                "the API server dropped %s from ResourceSlice %s. allowMultipleAllocations/requestPolicy: every GPU "
                "would go whole to one claim; enable the DRAConsumableCapacity feature gate on kube-apiserver and "
                "kube-scheduler (off by default before Kubernetes 1.36). taints: an unhealthy GPU would still get "
                "claims; enable DRADeviceTaints (off before 1.36) or run with --unhealthy=withdraw",
                problem,
                slices.slice_name(self.node),
            )

    def _report(self, what: str, obj: dict, gpus: Sequence[Gpu]) -> None:
        listed = {d["name"] for d in obj["spec"]["devices"]}
        withdrawn = [f"gpu-{g.index} ({g.uuid})" for g in gpus if f"gpu-{g.index}" not in listed]
        tainted = [d["name"] for d in obj["spec"]["devices"] if d.get("taints")]
        log.info(
            "ResourceSlice %s %s (pool generation %d): %s%s",
            obj["metadata"]["name"],
            what,
            obj["spec"]["pool"]["generation"],
            ", ".join(f"{d['name']} {d['capacity']['memory']['value']}" for d in obj["spec"]["devices"])
            or "no devices",
            (f"; withdrawn (unhealthy): {', '.join(withdrawn)}" if withdrawn else "")
            + (f"; tainted NoSchedule (unhealthy): {', '.join(tainted)}" if tainted else ""),
        )

    def kick_after_registration(self, delays: tuple[float, ...] = (0.0, 5.0, 15.0, 30.0)) -> None:
        """Look again now and a few times soon: kubelet wipes its node's ResourceSlices in the background when it
        starts (pkg/kubelet/cm/dra/plugin, NewDRAPluginManager), possibly after it registered us."""
        for delay in delays:
            timer = threading.Timer(delay, self.kick.set)
            timer.daemon = True
            timer.start()

    def run(self, stop: threading.Event, resync: float = 60.0, retry: float = 2.0) -> None:
        """Sync at start, whenever `kick` is set (a health change) and every `resync` seconds; retry failures."""
        wait = 0.0
        while not stop.is_set():
            self.kick.wait(wait)
            if stop.is_set():
                return
            self.kick.clear()
            try:
                self.sync()
                wait = resync
            except KubeError as exc:
                log.warning(
                    "cannot publish ResourceSlice %s, retrying in %.0fs: %s", slices.slice_name(self.node), retry, exc
                )
                wait = retry
