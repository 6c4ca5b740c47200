"""The inspect model: a pure function from the API's node and pod lists to plain data.

Everything the renderers print comes from `build_report`, which uses `share_core.accounting.node_usage`
for the per-GPU numbers so that `kubectl inspect gpushare` and the extender never disagree.

Pod states (see README.md):
- `assigned`: the extender chose the GPU(s) and the device plugin has served Allocate.
- `allocating`: the extender chose the GPU(s) at bind; kubelet has not yet called Allocate. The memory
  is already promised on those GPUs, so it counts there.
- `pending`: bound to the node and asking for `nvidia.com/gpu-mem`, but no GPU is recorded on it (for
  example scheduled by another scheduler). kubelet still charges it against the node's capacity, so it
  counts in the node's total under PENDING, but on no GPU.

Nodes in DRA mode (`mode: dra`, see share_inspect/dra.py) have one row per allocated ResourceClaim, named
after the pods it is reserved for: `assigned` once one of them runs, `allocating` before, `unused` when
the claim is allocated but no live pod holds it (its memory stays taken until the claim is deallocated).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from share_core.accounting import holds_gpu_memory
from share_core.accounting import node_usage
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_key
from share_core.assignment import pod_node
from share_core.contract import ANN_ASSIGNED
from share_core.contract import ANN_NODE_GPU_USAGE
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import ANN_NODE_HARD_LIMIT
from share_core.contract import RESOURCE_MEM
from share_core.contract import MemoryUnit
from share_core.gpus import GpuInfo
from share_core.gpus import node_gpus
from share_core.gpuusage import UsageSummary
from share_core.gpuusage import parse_gpu_usage
from share_core.hardlimit import HardLimitStatus
from share_core.holds import Hold
from share_core.holds import InvalidHolds
from share_core.holds import pod_holds
from share_core.request import InvalidRequest
from share_core.request import pod_request
from share_inspect.dra import DraClaim
from share_inspect.dra import DraGpu
from share_inspect.dra import DraState
from share_inspect.dra import to_units

Obj = Mapping[str, Any]

SCHEMA_VERSION = "gpushare.io/inspect/v1"

# No GPU has 1 TiB of memory, and none has less than 1 GiB: a per-GPU size this large is MiB.
MIB_THRESHOLD = 1024

STATE_ASSIGNED = "assigned"
STATE_ALLOCATING = "allocating"
STATE_PENDING = "pending"
STATE_UNUSED = "unused"

MODE_DEVICE_PLUGIN = "deviceplugin"
MODE_DRA = "dra"


@dataclass(slots=True)
class PodRow:
    """One pod on one node; `gpus` maps GPU index to units there, `pending` is memory on no GPU."""

    namespace: str
    name: str
    state: str
    gpus: dict[int, int] = field(default_factory=dict)
    pending: int = 0
    used_mib: dict[int, int] | None = None  # measured by the node's plugin, per GPU index (None: not reported)
    claim: str | None = None  # DRA mode: the ResourceClaim this row is

    @property
    def used_total_mib(self) -> int | None:
        return None if self.used_mib is None else sum(self.used_mib.values())

    @property
    def allocated(self) -> int:
        return sum(self.gpus.values()) + self.pending


@dataclass(slots=True)
class GpuRow:
    index: int
    uuid: str
    model: str
    healthy: bool
    allocated: int
    total: int
    used_mib: int | None = None  # measured by the node's plugin (None: not reported)

    @property
    def free(self) -> int:
        return max(self.total - self.allocated, 0)


@dataclass(slots=True)
class HeldRow:
    """GPU memory the extender holds on a node for a pod not bound yet (share_core.holds): what kind,
    for whom, `per_gpu` on each of `gpus`, for `expires_in` more seconds."""

    kind: str
    holder: str
    gpus: tuple[int, ...]
    per_gpu: int
    expires_in: int
    anchor: str  # the pod whose gpushare.io/holds annotation records it

    @property
    def held(self) -> int:
        return self.per_gpu * len(self.gpus)


@dataclass(slots=True)
class NodeRow:
    name: str
    address: str
    gpus: list[GpuRow]
    pods: list[PodRow]
    pending: int = 0
    problems: list[str] = field(default_factory=list)
    usage_time: str | None = None  # when the plugin measured the `used` figures; None: it reports none
    mode: str = MODE_DEVICE_PLUGIN
    hard_limit: HardLimitStatus | None = None  # the node agent's `gpushare.io/hard-limit`; None: not said
    held: list[HeldRow] = field(default_factory=list)  # memory held here for pods not bound yet

    @property
    def allocated(self) -> int:
        return sum(g.allocated for g in self.gpus) + self.pending

    @property
    def held_total(self) -> int:
        return sum(h.held for h in self.held)

    @property
    def used_mib(self) -> int | None:
        if self.usage_time is None:
            return None
        return sum(g.used_mib or 0 for g in self.gpus)

    @property
    def total(self) -> int:
        return sum(g.total for g in self.gpus)


@dataclass(slots=True)
class Report:
    """The whole picture, every amount in `unit`."""

    unit: MemoryUnit
    nodes: list[NodeRow]
    other_problems: list[str] = field(default_factory=list)  # of no node shown (e.g. a slice without a node)

    @property
    def allocated(self) -> int:
        return sum(n.allocated for n in self.nodes)

    @property
    def total(self) -> int:
        return sum(n.total for n in self.nodes)

    @property
    def pending(self) -> int:
        return sum(n.pending for n in self.nodes)

    @property
    def gpu_indices(self) -> list[int]:
        """Every GPU index any node has: one summary column each."""
        return sorted({g.index for n in self.nodes for g in n.gpus})

    @property
    def problems(self) -> list[str]:
        return [f"node {n.name}: {p}" for n in self.nodes for p in n.problems] + self.other_problems

    @property
    def has_dra(self) -> bool:
        """Some node is in DRA mode: the renderers add a MODE column."""
        return any(n.mode == MODE_DRA for n in self.nodes)

    @property
    def measured(self) -> bool:
        """Some node's plugin reports the GPU memory its containers use."""
        return any(n.usage_time is not None for n in self.nodes)


def percent(used: int, total: int) -> float:
    return used * 100.0 / total if total else 0.0


def is_share_node(node: Obj) -> bool:
    """A GPU-share node publishes its GPUs (annotation) or `nvidia.com/gpu-mem` capacity."""
    meta = node.get("metadata") or {}
    if (meta.get("annotations") or {}).get(ANN_NODE_GPUS):
        return True
    return RESOURCE_MEM in (((node.get("status") or {}).get("capacity")) or {})


def node_address(node: Obj) -> str:
    """The InternalIP, as the Aliyun tool shows; else any address the node reports."""
    addresses = ((node.get("status") or {}).get("addresses")) or []
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        for a in addresses:
            if isinstance(a, Mapping) and a.get("type") == kind and a.get("address"):
                return str(a["address"])
    return ""


def _gpus_of(node: Obj, problems: list[str]) -> list[GpuInfo]:
    """The node's GPUs; a garbage annotation is reported and capacity is used instead."""
    try:
        return node_gpus(node)
    except InvalidRequest as exc:
        problems.append(str(exc))
    meta = dict(node.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k != ANN_NODE_GPUS}
    try:
        return node_gpus({**node, "metadata": meta})
    except InvalidRequest as exc:
        problems.append(str(exc))
        return []


def node_unit(gpus: Sequence[GpuInfo], forced: MemoryUnit | None) -> MemoryUnit:
    """The node's resource unit: the one asked for, else MiB when a GPU is too big to be counted in GiB."""
    if forced is not None:
        return forced
    return MemoryUnit.MiB if any(g.memory >= MIB_THRESHOLD for g in gpus) else MemoryUnit.GiB


def _pod_row(pod: Obj) -> PodRow:
    meta = pod.get("metadata") or {}
    assigned = str(pod_annotations(pod).get(ANN_ASSIGNED, "")).strip().lower() == "true"
    return PodRow(
        str(meta.get("namespace", "default")),
        str(meta.get("name", "")),
        STATE_ASSIGNED if assigned else STATE_ALLOCATING,
    )


def _build_node(node: Obj, pods: list[Obj], forced: MemoryUnit | None) -> tuple[NodeRow, MemoryUnit]:
    problems: list[str] = []
    gpus = _gpus_of(node, problems)
    usage = node_usage(gpus, pods)
    problems.extend(usage.problems)
    by_key = {pod_key(p): p for p in pods}
    rows: dict[str, PodRow] = {}
    for g in usage.gpus:
        for key, units in g.pods:
            row = rows.get(key)
            if row is None:
                row = rows[key] = _pod_row(by_key[key])
            row.gpus[g.index] = row.gpus.get(g.index, 0) + units
    pending = 0
    for pod in pods:
        key = pod_key(pod)
        if key in rows:
            continue
        try:
            if parse_assignment(pod_annotations(pod)) is not None:
                continue  # on a GPU the node lacks: node_usage reported it
            request = pod_request(pod)
        except InvalidRequest:
            continue  # node_usage reported garbage assignments; garbage requests never got a GPU
        if request is None:
            continue
        row = _pod_row(pod)
        row.state, row.pending = STATE_PENDING, request.total
        rows[key] = row
        pending += request.total
    node_row, measured = _node_row(
        node,
        problems,
        [(g.index, g.uuid, g.model, g.healthy, g.used, g.total) for g in usage.gpus],
        sorted(rows.values(), key=lambda r: (r.namespace, r.name)),
        pending=pending,
    )
    if measured is not None:
        for key, row in rows.items():
            row.used_mib = dict(measured.pods.get(key, {}))
    return node_row, node_unit(gpus, forced)


def _node_row(
    node: Obj,
    problems: list[str],
    gpus: list[tuple[int, str, str, bool, int, int]],
    pods: list[PodRow],
    **extra: Any,
) -> tuple[NodeRow, UsageSummary | None]:
    """A node's row, either mode: its GPUs as (index, uuid, model, healthy, allocated, total) with what the
    plugin measured on each, its pods, and its hard limit; also the measurement, for the pods' figures."""
    measured = _measured(node, problems)
    row = NodeRow(
        name=str((node.get("metadata") or {}).get("name", "")),
        address=node_address(node),
        gpus=[GpuRow(*g, None if measured is None else measured.gpus.get(g[0], 0)) for g in gpus],
        pods=pods,
        problems=problems,
        usage_time=None if measured is None else (measured.time or "unknown"),
        hard_limit=_hard_limit(node, problems),
        **extra,
    )
    return row, measured


def _hard_limit(node: Obj, problems: list[str]) -> HardLimitStatus | None:
    """The node agent's `gpushare.io/hard-limit`; a garbage one is reported."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_NODE_HARD_LIMIT)
    if not raw:
        return None
    try:
        return HardLimitStatus.parse(raw)
    except (ValueError, TypeError, KeyError) as exc:
        problems.append(f"annotation {ANN_NODE_HARD_LIMIT} is not what the node agent writes ({exc}): {raw[:80]!r}")
        return None


def _measured(node: Obj, problems: list[str]) -> UsageSummary | None:
    """The plugin's `gpushare.io/gpu-usage` (MiB used per GPU and pod); a garbage one is reported."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_NODE_GPU_USAGE)
    if not raw:
        return None
    try:
        return parse_gpu_usage(raw)
    except InvalidRequest as exc:
        problems.append(str(exc))
        return None


def _scale(node: NodeRow, factor: int) -> None:
    """Convert a node counted in GiB to MiB (exact) so a mixed cluster adds up in one unit."""
    if factor == 1:
        return
    for g in node.gpus:
        g.allocated *= factor
        g.total *= factor
    for p in node.pods:
        p.gpus = {i: u * factor for i, u in p.gpus.items()}
        p.pending *= factor
    node.pending *= factor
    for h in node.held:
        h.per_gpu *= factor


def build_report(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    *,
    node_names: Sequence[str] = (),
    unit: MemoryUnit | None = None,
    dra: DraState | None = None,
    now: float | None = None,
) -> Report:
    """The report over GPU-share nodes (only `node_names` when given) and the live pods bound to them.

    `unit` forces the resource unit; None detects it per node (see `node_unit`). A cluster whose nodes
    disagree is shown in MiB, the finer unit, so nothing is rounded away. `dra` (see share_inspect.dra)
    adds the nodes whose GPUs are published as ResourceSlices, with their allocated claims, in the same table.
    With `now` (seconds since the epoch), the holds recorded on pods (gpushare.io/holds) that are still
    live are shown on their nodes.
    """
    wanted = set(node_names)
    nodes = list(nodes)
    pods = list(pods)
    share_nodes = [
        n for n in nodes if is_share_node(n) and (not wanted or (n.get("metadata") or {}).get("name") in wanted)
    ]
    names = {(n.get("metadata") or {}).get("name") for n in share_nodes}
    by_node: dict[str, list[Obj]] = {}
    for pod in pods:
        name = pod_node(pod)
        if name in names and holds_gpu_memory(pod):
            by_node.setdefault(name, []).append(pod)
    built = [_build_node(n, by_node.get((n.get("metadata") or {}).get("name"), []), unit) for n in share_nodes]
    if dra is not None:
        for row, _ in built:
            if row.name in dra.gpus:
                row.problems.append(
                    "also publishes gpushare.io ResourceSlices (DRA): both plugins run here, and only the device "
                    "plugin's GPUs are shown; run one per node (chart mode both, label gpushare.io/mode=dra)"
                )
        built.extend(_dra_nodes(dra, nodes, pods, names, wanted, unit))
    hold_problems: list[str] = []
    if now is not None:
        rows_by_name = {row.name: row for row, _ in built}
        for key, hold in live_holds(pods, now, hold_problems):
            row = rows_by_name.get(hold.node)
            if row is not None:
                row.held.append(
                    HeldRow(str(hold.kind), hold.holder or hold.holder_uid, hold.gpus, hold.per_gpu,
                            max(round(hold.expires - now), 0), key)
                )  # fmt: skip
    display = unit or (MemoryUnit.MiB if any(u is MemoryUnit.MiB for _, u in built) else MemoryUnit.GiB)
    for row, u in built:
        _scale(row, u.mib // display.mib)
    shown = {row.name for row, _ in built}
    other = [] if dra is None else [
        (f"node {n}: {p}" if n else p)
        for n, texts in sorted(dra.problems.items())
        if n not in shown and (not wanted or n in wanted or not n)
        for p in texts
    ]  # fmt: skip
    return Report(display, sorted((row for row, _ in built), key=lambda r: r.name), other + hold_problems)


def live_holds(pods: Iterable[Obj], now: float, problems: list[str]) -> list[tuple[str, Hold]]:
    """(anchor pod, hold) for every unexpired hold the pods' gpushare.io/holds annotations record, as the
    extender counts them: a bound pod's own holds are spent (it has its GPUs); a garbled annotation is a
    problem, never half-read."""
    out = []
    for pod in pods:
        try:
            holds = pod_holds(pod)
        except InvalidHolds as exc:
            problems.append(str(exc))
            continue
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        bound = bool(pod_node(pod))
        for h in holds:
            if h.expired(now) or (bound and h.holder_uid == uid):
                continue
            out.append((pod_key(pod), h))
    return out


def _dra_nodes(
    dra: DraState,
    nodes: list[Obj],
    pods: list[Obj],
    device_plugin_nodes: set[Any],
    wanted: set[str],
    unit: MemoryUnit | None,
) -> list[tuple[NodeRow, MemoryUnit]]:
    """A row per node with gpushare.io devices; a node that is also a device-plugin node stays one (problem)."""
    node_objs = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
    live = {
        (str((p.get("metadata") or {}).get("namespace", "")), str((p.get("metadata") or {}).get("name", ""))): p
        for p in pods
    }
    claims_by_node: dict[str, list[DraClaim]] = {}
    for c in dra.claims:
        claims_by_node.setdefault(c.node, []).append(c)
    shown = unit or MemoryUnit.GiB
    out: list[tuple[NodeRow, MemoryUnit]] = []
    for name, gpus in dra.gpus.items():
        if wanted and name not in wanted:
            continue
        if name in device_plugin_nodes:
            continue  # build_report reports it on the device-plugin row
        node = node_objs.get(name, {"metadata": {"name": name}})
        row = _dra_node(node, gpus, claims_by_node.get(name, []), live, shown)
        row.problems.extend(dra.problems.get(name, []))
        out.append((row, shown))
    return out


def _dra_node(
    node: Obj, gpus: list[DraGpu], claims: list[DraClaim], live: Mapping[tuple[str, str], Obj], unit: MemoryUnit
) -> NodeRow:
    by_device = {g.device: g for g in gpus}
    allocated: dict[str, int] = {}
    rows: list[PodRow] = []
    for c in claims:
        held = [live[p] for p in c.pods if p in live]
        names = [str(p["metadata"]["name"]) for p in held]
        if not held:
            state = STATE_UNUSED
        elif any((p.get("status") or {}).get("phase") == "Running" for p in held):
            state = STATE_ASSIGNED
        else:
            state = STATE_ALLOCATING
        row = PodRow(c.namespace, ",".join(names) or c.name, state, claim=c.name)
        for device, mib in c.devices.items():
            units = to_units(mib, unit, up=True)
            index = by_device[device].index
            row.gpus[index] = row.gpus.get(index, 0) + units
            allocated[device] = allocated.get(device, 0) + units
        rows.append(row)
    node_row, _ = _node_row(
        node,
        [],
        [
            (g.index, g.uuid, g.model, g.healthy, allocated.get(g.device, 0), to_units(g.memory_mib, unit, up=False))
            for g in gpus
        ],
        sorted(rows, key=lambda r: (r.namespace, r.name, r.claim or "")),
        mode=MODE_DRA,
    )
    return node_row


def _with_used(item: dict[str, Any], used_mib: int | None) -> dict[str, Any]:
    """`usedMiB` only where the node's plugin measures it: reports of unmeasured nodes are unchanged."""
    if used_mib is not None:
        item["usedMiB"] = used_mib
    return item


def _with_claim(item: dict[str, Any], claim: str | None) -> dict[str, Any]:
    """`claim` on the rows of DRA nodes: the ResourceClaim (in the row's namespace) the memory belongs to."""
    if claim is not None:
        item["claim"] = claim
    return item


def report_to_dict(report: Report) -> dict[str, Any]:
    """The stable, documented `-o json|yaml` schema (README.md); additive changes only within v1.

    `usedMiB` (per node, GPU, pod and pod GPU) and `usageTime` (per node) appear when the node's plugin
    measures GPU memory (the `gpushare.io/gpu-usage` annotation); `held` (per node) when the extender
    holds memory there for pods not bound yet.
    """
    nodes = []
    for n in report.nodes:
        node: dict[str, Any] = {
            "name": n.name,
            "ipAddress": n.address,
            "allocated": n.allocated,
            "total": n.total,
            "pending": n.pending,
            "gpus": [
                _with_used(
                    {
                        "index": g.index,
                        "uuid": g.uuid,
                        "model": g.model,
                        "healthy": g.healthy,
                        "allocated": g.allocated,
                        "total": g.total,
                        "free": g.free,
                    },
                    g.used_mib,
                )
                for g in n.gpus
            ],
            "pods": [
                _with_claim(
                    _with_used(
                        {
                            "namespace": p.namespace,
                            "name": p.name,
                            "state": p.state,
                            "allocated": p.allocated,
                            "gpus": [
                                _with_used(
                                    {"index": i, "allocated": u}, None if p.used_mib is None else p.used_mib.get(i, 0)
                                )
                                for i, u in sorted(p.gpus.items())
                            ],
                        },
                        p.used_total_mib,
                    ),
                    p.claim,
                )
                for p in n.pods
            ],
            "problems": list(n.problems),
            "mode": n.mode,
        }
        if n.usage_time is not None:
            node["usedMiB"] = n.used_mib
            node["usageTime"] = n.usage_time
        if n.hard_limit is not None:
            h = n.hard_limit
            node["hardLimit"] = {"enforced": h.enforced, "mode": h.mode, "reason": h.reason, "driver": h.driver}
        if n.held:
            node["held"] = [
                {"kind": h.kind, "for": h.holder, "gpus": list(h.gpus), "perGpu": h.per_gpu, "held": h.held,
                 "expiresIn": h.expires_in, "anchor": h.anchor}
                for h in n.held
            ]  # fmt: skip
        nodes.append(node)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "unit": report.unit.value,
        "nodes": nodes,
        "cluster": {
            "nodes": len(report.nodes),
            "gpus": sum(len(n.gpus) for n in report.nodes),
            "unhealthyGpus": sum(1 for n in report.nodes for g in n.gpus if not g.healthy),
            "allocated": report.allocated,
            "total": report.total,
            "pending": report.pending,
            "percent": round(percent(report.allocated, report.total), 1),
            **({"held": held} if (held := sum(n.held_total for n in report.nodes)) else {}),
        },
    }
