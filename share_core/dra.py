"""Reading DRA objects of driver gpushare.io: pure functions over ResourceSlices and ResourceClaims.

What a node's GPUs are in DRA mode (the devices of our slices, in array order: the order kube-scheduler's
allocator tries them), what an allocated claim holds (`status.allocation.devices.results[]`, each with the
memory it consumed, KEP-5075; none recorded: the device whole), and what a pending claim asks of our
DeviceClass (its requests, sizes, counts, model selectors, `distinctAttribute`). The extender, inspect and
share-dra read the API through these, so they count alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from share_core.contract import DRA_ATTR_INDEX
from share_core.contract import DRA_ATTR_MODEL
from share_core.contract import DRA_ATTR_UUID
from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_DEVICE_CLASS
from share_core.contract import DRA_DRIVER_NAME
from share_core.request import InvalidRequest
from share_core.request import parse_quantity

Obj = Mapping[str, Any]
MIB = 1024 * 1024
UUID_CONSTRAINT = f"{DRA_DRIVER_NAME}/{DRA_ATTR_UUID}"


@dataclass(frozen=True, slots=True)
class DraGpu:
    """One device of driver gpushare.io: a GPU of `node`, `memory_mib` of it shareable."""

    node: str
    device: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One device result of an allocated claim: `mib` consumed of it (None: allocated whole)."""

    request: str
    pool: str
    device: str
    mib: int | None
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """What an unallocated claim asks of gpushare.io GPUs, when it has one shape placement can price:
    `count` distinct GPUs with `mib` each (of any of `models`, empty: any). `reason` says why not
    otherwise (then the other fields mean nothing)."""

    mib: int = 0
    count: int = 0
    models: tuple[str, ...] = ()
    reason: str = ""


def ask_units(ask: ClaimAsk, unit_mib: int) -> int:
    """What one share of an ask consumes, in whole steps of our devices' requestPolicy (`unit_mib`):
    rounded up to a step; a request naming no memory takes the default, one step."""
    return -(-ask.mib // unit_mib) if ask.mib else 1


def quantity_mib(value: Any, what: str, *, up: bool = False) -> int:
    """A memory quantity ("80Gi", "4096Mi", bytes) in whole MiB: rounded down (what a device offers) or,
    with `up`, up (what a claim takes)."""
    if isinstance(value, str) and len(value) > 2 and value[:-2].isdigit():  # what slices and claims carry
        if value.endswith("Gi"):
            return int(value[:-2]) * 1024
        if value.endswith("Mi"):
            return int(value[:-2])
    q = parse_quantity(value, what)
    if q < 0:
        raise InvalidRequest(f"{what}: {value!r} is negative")
    return int(-(-q // MIB)) if up else int(q // MIB)


def _attr(attrs: Mapping[str, Any], name: str) -> Any:
    """A device attribute by its plain or driver-qualified name; the value of its one typed field."""
    raw = attrs.get(name, attrs.get(f"{DRA_DRIVER_NAME}/{name}"))
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "version", "bool"):
        if kind in raw:
            return raw[kind]
    return None


def _capacity(caps: Mapping[str, Any], name: str) -> Any:
    cap = caps.get(name, caps.get(f"{DRA_DRIVER_NAME}/{name}"))
    return cap.get("value") if isinstance(cap, Mapping) else cap


def _healthy(device: Obj) -> bool:
    """A device tainted NoSchedule or NoExecute takes no new claims: counted like an unhealthy GPU."""
    return not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in device.get("taints") or [])


def slice_node(s: Obj) -> str:
    spec = s.get("spec") or {}
    return str(spec.get("nodeName") or (spec.get("pool") or {}).get("name") or "")


def slice_devices(s: Obj) -> tuple[str, list[DraGpu], list[str]]:
    """(node, its GPUs in the slice's array order, problems) of one slice; ("", [], []) for another
    driver's slice (not ours to count). A device we cannot read is left out, with a problem naming it."""
    spec = s.get("spec") or {}
    if spec.get("driver") != DRA_DRIVER_NAME:
        return "", [], []
    what = f"ResourceSlice {(s.get('metadata') or {}).get('name')}"
    node = slice_node(s)
    if not node:
        return "", [], [f"{what}: no node"]
    gpus, problems = [], []
    for d in spec.get("devices") or []:
        name = str(d.get("name", ""))
        attrs = d.get("attributes") or {}
        try:
            memory = quantity_mib(_capacity(d.get("capacity") or {}, DRA_CAPACITY_MEMORY), f"device {name} memory")
            index = _attr(attrs, DRA_ATTR_INDEX)
            if not isinstance(index, int) or isinstance(index, bool):
                raise InvalidRequest(f"device {name}: attribute index is {index!r}, not an int")
        except InvalidRequest as exc:
            problems.append(f"{what}: {exc}")
            continue
        uuid, model = str(_attr(attrs, DRA_ATTR_UUID) or ""), str(_attr(attrs, DRA_ATTR_MODEL) or "")
        gpus.append(DraGpu(node, name, index, uuid, model, memory, _healthy(d)))
    return node, gpus, problems


def claim_name(claim: Obj) -> tuple[str, str]:
    meta = claim.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def claim_results(claim: Obj) -> tuple[list[ClaimResult], list[str]]:
    """Our driver's device results of an allocated claim ([] when unallocated), and problems (a
    quantity we cannot read: that result is left out). Other drivers' results are not ours to count."""
    ns, name = claim_name(claim)
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out, problems = [], []
    for r in (allocation.get("devices") or {}).get("results") or []:
        if r.get("driver") != DRA_DRIVER_NAME:
            continue
        consumed = r.get("consumedCapacity") or {}
        raw = consumed.get(DRA_CAPACITY_MEMORY, consumed.get(f"{DRA_DRIVER_NAME}/{DRA_CAPACITY_MEMORY}"))
        try:
            mib = None if raw is None else quantity_mib(raw, f"claim {ns}/{name} memory", up=True)
        except InvalidRequest as exc:
            problems.append(str(exc))
            continue
        where = (str(r.get("request", "")), str(r.get("pool", "")), str(r.get("device", "")))
        out.append(ClaimResult(*where, mib, r.get("shareID")))
    return out, problems


def claim_allocated(claim: Obj) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def claim_pods(claim: Obj) -> list[tuple[str, str, str]]:
    """(namespace, name, uid) of each pod the claim is reserved for (status.reservedFor)."""
    ns, _ = claim_name(claim)
    return [
        (ns, str(r.get("name", "")), str(r.get("uid", "")))
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods" and not r.get("apiGroup")
    ]


# The model selectors our tools write: share_core.dra_convert's `...model.lowerAscii().contains("t4")`
# (ORed), and `...model in ["T4", "A10"]`. Any other CEL is left to kube-scheduler (it evaluates it;
# placement then ranks nodes as if any model would do).
_CONTAINS = re.compile(r'\.model\.lowerAscii\(\)\.contains\("((?:[^"\\]|\\.)*)"\)')
_IN_LIST = re.compile(r"\.model\s+in\s+\[([^\]]*)\]")


def selector_models(expression: str) -> tuple[str, ...] | None:
    """The models a selector of ours allows (case-insensitive substrings), None for any other CEL."""
    if f'device.attributes["{DRA_DRIVER_NAME}"]' not in expression:
        return None
    found = _CONTAINS.findall(expression)
    if found and len(found) == expression.count("||") + 1:
        return tuple(found)
    m = _IN_LIST.search(expression)
    if m and "||" not in expression and "&&" not in expression:
        return tuple(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
    return None


def _request_ask(request: Obj, what: str) -> tuple[int, int, tuple[str, ...] | None] | str:
    """(MiB, count, models) one request asks of our class, or the reason it cannot be priced."""
    exactly = request.get("exactly")
    if not isinstance(exactly, Mapping):
        return f"{what}: firstAvailable requests are left to kube-scheduler"
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        return f"{what}: allocationMode {exactly.get('allocationMode')} is left to kube-scheduler"
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return f"{what}: count {count!r}"
    raw = ((exactly.get("capacity") or {}).get("requests") or {}).get(DRA_CAPACITY_MEMORY)
    try:
        mib = 0 if raw is None else quantity_mib(raw, f"{what} memory", up=True)
    except InvalidRequest as exc:
        return str(exc)
    models: tuple[str, ...] | None = ()
    for sel in exactly.get("selectors") or []:
        expr = ((sel or {}).get("cel") or {}).get("expression")
        found = selector_models(str(expr or ""))
        if found is None:
            models = None
            break
        models = found if not models else tuple(m for m in models if m in found)
    return mib, count, models


def _classes(request: Any) -> list[Any]:
    exactly = request.get("exactly") if isinstance(request, Mapping) else None
    if isinstance(exactly, Mapping):
        return [exactly.get("deviceClassName")]
    subs = request.get("firstAvailable") if isinstance(request, Mapping) else None
    return [s.get("deviceClassName") for s in subs or [] if isinstance(s, Mapping)]


def uses_device_class(claim_spec: Obj, device_class: str = DRA_DEVICE_CLASS) -> bool:
    """Whether a claim's spec (or a template's `spec.spec`) asks anything of `device_class`."""
    requests = ((claim_spec or {}).get("devices") or {}).get("requests") or []
    return any(device_class in _classes(r) for r in requests)


def claim_ask(claim: Obj, device_class: str = DRA_DEVICE_CLASS) -> ClaimAsk | None:
    """What a claim asks of `device_class`: None when it asks nothing of it (another driver's claim);
    a ClaimAsk with `reason` set when it asks in a shape placement cannot price (then kube-scheduler's
    allocator alone decides, correctly, and the policy only ranks nodes for the pod's CPU and memory).

    Priced: one request of `count` GPUs, or several requests of one size kept on distinct GPUs by a
    `distinctAttribute: gpushare.io/uuid` constraint naming them all (share_core.dra_convert's shape). A
    request that names no memory takes the device's default, one step (`default_mib`: 0 here, filled by
    the caller, who knows the unit)."""
    ns, name = claim_name(claim)
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    ours = [r for r in requests if device_class in _classes(r)]
    if not ours:
        return None
    asks = []
    for r in ours:
        got = _request_ask(r, f"claim {ns}/{name} request {r.get('name')!r}")
        if isinstance(got, str):
            return ClaimAsk(reason=got)
        asks.append((str(r.get("name", "")), *got))
    sizes = {mib for _, mib, _, _ in asks}
    models_seen = {m for _, _, _, m in asks}
    if len(sizes) != 1 or len(models_seen) != 1:
        return ClaimAsk(reason=f"claim {ns}/{name}: requests of different sizes or models")
    (models,) = models_seen
    total = sum(count for _, _, count, _ in asks)
    if len(asks) > 1:
        names = {n for n, _, _, _ in asks}
        kept_apart = any(
            c.get("distinctAttribute") == UUID_CONSTRAINT and names <= set(c.get("requests") or names)
            for c in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
        )
        if not kept_apart:
            return ClaimAsk(reason=f"claim {ns}/{name}: several requests not kept on distinct GPUs")
    return ClaimAsk(mib=sizes.pop(), count=total, models=models or ())


def pod_claim_names(pod: Obj) -> tuple[list[tuple[str, str]], str]:
    """The (namespace, name) of each ResourceClaim a pod uses, and "" — or, when a template's claim is
    not made yet (the resourceclaim controller writes it in `status.resourceClaimStatuses`), the reason."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ns = str(meta.get("namespace", ""))
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    out = []
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, Mapping):
            continue
        if entry.get("resourceClaimName"):
            out.append((ns, str(entry["resourceClaimName"])))
        elif entry.get("resourceClaimTemplateName"):
            claim = made.get(entry.get("name"))
            if not claim:
                return out, f"the claim of pod entry {entry.get('name')!r} is not made yet"
            out.append((ns, str(claim)))
    return out, ""


def merge_asks(asks: Sequence[ClaimAsk]) -> ClaimAsk | None:
    """A pod's asks over its unallocated claims as one (None: it asks nothing of ours); placement prices
    one claim; several claims (each may land on any GPU) are left to kube-scheduler."""
    if not asks:
        return None
    for a in asks:
        if a.reason:
            return a
    if len(asks) > 1:
        return ClaimAsk(reason=f"{len(asks)} claims of {DRA_DEVICE_CLASS} in one pod")
    return asks[0]
