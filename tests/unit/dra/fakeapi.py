"""An in-memory resource.k8s.io/v1 for the DRA driver's unit tests: claims to GET, slices with resource
versions and optimistic concurrency (a stale PUT is a Conflict, as the API server answers)."""

from __future__ import annotations

import copy
from typing import Any

from share_core.kube import Conflict
from share_core.kube import NotFound

Obj = dict[str, Any]


class FakeDraApi:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Obj] = {}
        self.slices: dict[str, Obj] = {}
        self.writes: list[str] = []
        self._rv = 0
        self.conflicts_to_inject = 0

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def add_claim(self, claim: Obj) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim

    def get_claim(self, namespace: str, name: str) -> Obj:
        try:
            return copy.deepcopy(self.claims[(namespace, name)])
        except KeyError:
            raise NotFound(f"resourceclaims {namespace}/{name} not found", 404, "NotFound") from None

    def list_slices(self, node: str) -> list[Obj]:
        return [copy.deepcopy(s) for s in self.slices.values() if s["spec"].get("nodeName") == node]

    def create_slice(self, obj: Obj) -> Obj:
        name = obj["metadata"]["name"]
        if name in self.slices:
            raise Conflict(f"resourceslices {name} already exists", 409, "AlreadyExists")
        return self._store(obj, "create")

    def _store(self, obj: Obj, verb: str) -> Obj:
        """Keep a copy of the slice at a new resource version, as the API server does; the caller gets another."""
        name = obj["metadata"]["name"]
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self.slices[name] = stored
        self.writes.append(f"{verb} {name}")
        return copy.deepcopy(stored)

    def replace_slice(self, obj: Obj) -> Obj:
        name = obj["metadata"]["name"]
        if name not in self.slices:
            raise NotFound(f"resourceslices {name} not found", 404, "NotFound")
        if self.conflicts_to_inject:
            self.conflicts_to_inject -= 1
            self.slices[name]["metadata"]["resourceVersion"] = self._next_rv()  # someone else wrote
        if obj["metadata"].get("resourceVersion") != self.slices[name]["metadata"]["resourceVersion"]:
            raise Conflict(f"resourceslices {name}: the object has been modified", 409, "Conflict")
        return self._store(obj, "update")

    def delete_slice(self, name: str) -> None:
        if self.slices.pop(name, None) is None:
            raise NotFound(f"resourceslices {name} not found", 404, "NotFound")
        self.writes.append(f"delete {name}")


def allocated_claim(
    namespace: str,
    name: str,
    uid: str,
    results: list[tuple[str, str, str | None]],
    driver: str = "gpushare.io",
    request: str = "gpu",
) -> Obj:
    """A claim as kube-scheduler leaves it: (pool, device, consumed memory or None) per result."""
    out = []
    for i, (pool, device, mem) in enumerate(results):
        r: Obj = {"request": request, "driver": driver, "pool": pool, "device": device, "shareID": f"share-{i}"}
        if mem is not None:
            r["consumedCapacity"] = {"memory": mem}
        out.append(r)
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": out}}},
    }
