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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from share_core.accounting import holds_gpu_memory, node_usage
from share_core.assignment import parse_assignment, pod_annotations, pod_key, pod_node
from share_core.contract import ANN_ASSIGNED, ANN_NODE_GPU_USAGE, ANN_NODE_GPUS, RESOURCE_MEM, MemoryUnit
from share_core.gpus import GpuInfo, node_gpus
from share_core.gpuusage import UsageSummary, parse_gpu_usage
from share_core.request import InvalidRequest, pod_request

Obj = Mapping[str, Any]

SCHEMA_VERSION = "gpushare.io/inspect/v1"

# No GPU has 1 TiB of memory, and none has less than 1 GiB: a per-GPU size this large is MiB.
MIB_THRESHOLD = 1024

STATE_ASSIGNED = "assigned"
STATE_ALLOCATING = "allocating"
STATE_PENDING = "pending"


@dataclass(slots=True)
class PodRow:
    """One pod on one node; `gpus` maps GPU index to units there, `pending` is memory on no GPU."""

    namespace: str
    name: str
    state: str
    gpus: dict[int, int] = field(default_factory=dict)
    pending: int = 0
    used_mib: dict[int, int] | None = None  # measured by the node's plugin, per GPU index (None: not reported)

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
class NodeRow:
    name: str
    address: str
    gpus: list[GpuRow]
    pods: list[PodRow]
    pending: int = 0
    problems: list[str] = field(default_factory=list)
    usage_time: str | None = None  # when the plugin measured the `used` figures; None: it reports none

    @property
    def allocated(self) -> int:
        return sum(g.allocated for g in self.gpus) + self.pending

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
        return [f"node {n.name}: {p}" for n in self.nodes for p in n.problems]

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
    meta = node.get("metadata") or {}
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
    measured = _measured(node, problems)
    node_row = NodeRow(
        name=str(meta.get("name", "")),
        address=node_address(node),
        gpus=[
            GpuRow(
                g.index,
                g.uuid,
                g.model,
                g.healthy,
                g.used,
                g.total,
                None if measured is None else measured.gpus.get(g.index, 0),
            )
            for g in usage.gpus
        ],
        pods=sorted(rows.values(), key=lambda r: (r.namespace, r.name)),
        pending=pending,
        problems=problems,
        usage_time=None if measured is None else (measured.time or "unknown"),
    )
    if measured is not None:
        for key, row in rows.items():
            row.used_mib = dict(measured.pods.get(key, {}))
    return node_row, node_unit(gpus, forced)


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


def build_report(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    *,
    node_names: Sequence[str] = (),
    unit: MemoryUnit | None = None,
) -> Report:
    """The report over GPU-share nodes (only `node_names` when given) and the live pods bound to them.

    `unit` forces the resource unit; None detects it per node (see `node_unit`). A cluster whose nodes
    disagree is shown in MiB, the finer unit, so nothing is rounded away.
    """
    wanted = set(node_names)
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
    display = unit or (MemoryUnit.MiB if any(u is MemoryUnit.MiB for _, u in built) else MemoryUnit.GiB)
    for row, u in built:
        _scale(row, u.mib // display.mib)
    return Report(display, sorted((row for row, _ in built), key=lambda r: r.name))


def _with_used(item: dict[str, Any], used_mib: int | None) -> dict[str, Any]:
    """`usedMiB` only where the node's plugin measures it: reports of unmeasured nodes are unchanged."""
    if used_mib is not None:
        item["usedMiB"] = used_mib
    return item


def report_to_dict(report: Report) -> dict[str, Any]:
    """The stable, documented `-o json|yaml` schema (README.md); additive changes only within v1.

    `usedMiB` (per node, GPU, pod and pod GPU) and `usageTime` (per node) appear when the node's plugin
    measures GPU memory (the `gpushare.io/gpu-usage` annotation).
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
                )
                for p in n.pods
            ],
            "problems": list(n.problems),
        }
        if n.usage_time is not None:
            node["usedMiB"] = n.used_mib
            node["usageTime"] = n.usage_time
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
        },
    }
