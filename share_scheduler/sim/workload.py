"""Simulator input: a cluster and a workload, from the openb CSVs or from our own small YAML.

Everything is reduced to plain integers in one unit per run: thousandths of a GPU for the openb trace
(every GPU has 1000 units, as in the paper), GiB for the YAML (GPUs of different sizes are normal).
CPU is in millicores, memory in MiB.

For the timeline (share_scheduler/sim/timeline.py) a pod also carries how long it ran (`duration`, seconds:
the trace's deletion_time - scheduled_time; None for a pod the trace shows Pending, which never ran), when
the trace created it (`created`, seconds) and a scheduling `priority` (from the trace's QoS class, see
QOS_PRIORITY). The ATC'23 protocol (engine.py) ignores all three.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from share_placement import Demand

MILLI = 1000  # units per GPU in the openb trace

# The openb trace's QoS class -> the pod's scheduling priority (higher is scheduled first), the one
# mapping. Alibaba's latency-sensitive (LS) pods outrank Burstable, which outrank best-effort (BE); the
# 7 Kubernetes "Guaranteed" pods of the default trace rank with LS, Kubernetes' highest QoS class. An
# empty class is BE. The values only order pods (kube-scheduler's PrioritySort); nothing is preempted.
QOS_PRIORITY: dict[str, int] = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0, "": 0}
# The trace's pod_phase of a pod that never ran (no scheduled_time, so no duration).
PENDING_PHASE = "Pending"


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    model: str
    gpus: tuple[int, ...]  # capacity of each GPU
    cpu: int | None = None  # millicores; None: not checked
    memory: int | None = None  # MiB; None: not checked

    @property
    def gpu_capacity(self) -> int:
        return sum(self.gpus)


@dataclass(frozen=True, slots=True)
class SimPod:
    name: str
    per_gpu: int  # units on each GPU (0: CPU-only)
    count: int  # GPUs (0: CPU-only)
    models: tuple[str, ...] = ()
    cpu: int = 0
    memory: int = 0
    priority: int = 0  # scheduling priority (QOS_PRIORITY for the trace); higher goes first
    duration: float | None = None  # seconds it ran; None: unknown (never ran), left out of the timeline
    created: float | None = None  # the trace's creation time, seconds; None: unknown

    @property
    def gpu_request(self) -> int:
        return self.per_gpu * self.count

    def demand(self) -> Demand:
        return Demand(self.per_gpu, self.count, self.models, self.cpu, self.memory)


@dataclass(frozen=True, slots=True)
class Workload:
    nodes: tuple[SimNode, ...]
    pods: tuple[SimPod, ...]  # the population pods are drawn from (with replacement)
    unit: str = "milli-GPU"

    @property
    def gpu_capacity(self) -> int:
        return sum(n.gpu_capacity for n in self.nodes)

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


class WorkloadError(ValueError):
    """Input the simulator cannot use; the message names the file and the problem."""


def _int(row: dict[str, str], key: str, where: str) -> int:
    try:
        value = int(float(row[key]))
    except (KeyError, TypeError, ValueError):
        raise WorkloadError(f"{where}: column {key!r} is missing or not a number: {row.get(key)!r}") from None
    if value < 0:
        raise WorkloadError(f"{where}: column {key!r} is negative: {value}")
    return value


def _openb_rows(path: str | Path, what: str) -> list[tuple[int, str, dict[str, str]]]:
    """An openb CSV file's rows: (index, `file:line` for errors, row); a file of none is an error."""
    with open(path, newline="") as fh:
        rows = [(i, f"{path}:{i + 2}", row) for i, row in enumerate(csv.DictReader(fh))]
    if not rows:
        raise WorkloadError(f"{path}: no {what}")
    return rows


def load_openb_nodes(path: str | Path) -> tuple[SimNode, ...]:
    """openb node list: sn, cpu_milli, memory_mib, gpu, model. Every GPU has 1000 units."""
    return tuple(
        SimNode(
            name=row.get("sn") or f"node-{i}",
            model=(row.get("model") or "").strip(),
            gpus=(MILLI,) * _int(row, "gpu", where),
            cpu=_int(row, "cpu_milli", where),
            memory=_int(row, "memory_mib", where),
        )
        for i, where, row in _openb_rows(path, "nodes")
    )


def _seconds(row: dict[str, str], key: str, where: str) -> float | None:
    """An optional time column, seconds: None when the column is absent or empty; garbage is an error."""
    raw = (row.get(key) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise WorkloadError(f"{where}: column {key!r} is not a number: {raw!r}") from None
    if not value >= 0 or value == float("inf"):
        raise WorkloadError(f"{where}: column {key!r} must be a finite non-negative number of seconds: {raw!r}")
    return value


def _openb_timing(row: dict[str, str], where: str) -> tuple[int, float | None, float | None]:
    """(priority, duration, created) of one openb pod row; see SimPod and QOS_PRIORITY."""
    qos = (row.get("qos") or "").strip()
    if qos not in QOS_PRIORITY:
        known = ", ".join(k for k in QOS_PRIORITY if k)
        raise WorkloadError(f"{where}: unknown qos {qos!r}: expected one of {known}")
    created = _seconds(row, "creation_time", where)
    scheduled = _seconds(row, "scheduled_time", where)
    deleted = _seconds(row, "deletion_time", where)
    if (row.get("pod_phase") or "").strip() == PENDING_PHASE or scheduled is None or deleted is None:
        return QOS_PRIORITY[qos], None, created
    if deleted < scheduled:
        raise WorkloadError(f"{where}: deletion_time {deleted:g} is before scheduled_time {scheduled:g}")
    return QOS_PRIORITY[qos], deleted - scheduled, created


def load_openb_pods(path: str | Path) -> tuple[SimPod, ...]:
    """openb pod list. `gpu_milli` is the share of one GPU; pods with num_gpu > 1 take whole GPUs.

    The timing columns (qos, pod_phase, creation_time, deletion_time, scheduled_time) are optional: a
    file without them loads with priority 0 and no durations (fine for the ATC'23 protocol)."""
    pods = []
    for i, where, row in _openb_rows(path, "pods"):
        num_gpu = _int(row, "num_gpu", where)
        milli = _int(row, "gpu_milli", where)
        if num_gpu == 0 or milli == 0:
            per, count = 0, 0
        elif num_gpu > 1:
            per, count = MILLI, num_gpu
        else:
            per, count = min(milli, MILLI), 1
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(sorted(m.strip().lower() for m in spec.split("|") if m.strip()))
        priority, duration, created = _openb_timing(row, where)
        pods.append(
            SimPod(
                name=row.get("name") or f"pod-{i}",
                per_gpu=per,
                count=count,
                models=models,
                cpu=_int(row, "cpu_milli", where),
                memory=_int(row, "memory_mib", where),
                priority=priority,
                duration=duration,
                created=created,
            )
        )
    return tuple(pods)


def load_openb(nodes_csv: str | Path, pods_csv: str | Path) -> Workload:
    return Workload(load_openb_nodes(nodes_csv), load_openb_pods(pods_csv), unit="milli-GPU")


def _num(spec: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = spec.get(key, default)
    if value is None:
        raise WorkloadError(f"{where}: {key!r} is required")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise WorkloadError(f"{where}: {key!r} must be a non-negative number, got {value!r}")
    return float(value)


def _whole(spec: dict[str, Any], key: str, where: str, default: float | None = None) -> int:
    value = _num(spec, key, where, default)
    if value != int(value):
        raise WorkloadError(f"{where}: {key!r} must be a whole number, got {value!r}")
    return int(value)


def load_yaml(path: str | Path) -> Workload:
    """Our own format: GPU memory and requests in GiB, CPU in cores, memory in GiB. See examples/."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not isinstance(doc.get("pods"), list):
        raise WorkloadError(f"{path}: expected a mapping with lists 'nodes' and 'pods'")
    nodes: list[SimNode] = []
    for i, spec in enumerate(doc["nodes"]):
        where = f"{path}: nodes[{i}]"
        if not isinstance(spec, dict):
            raise WorkloadError(f"{where}: expected a mapping")
        gpus = spec.get("gpus")
        if isinstance(gpus, list):
            sizes = tuple(_whole({"gpus": g}, "gpus", where) for g in gpus)
        else:
            sizes = (_whole(spec, "gpu_memory", where),) * _whole(spec, "gpus", where)
        if not sizes or min(sizes) <= 0:
            raise WorkloadError(f"{where}: needs at least one GPU with memory > 0")
        cpu = spec.get("cpu")
        mem = spec.get("memory")
        name = str(spec.get("name", f"node{i}"))
        for k in range(_whole(spec, "count", where, 1)):
            nodes.append(
                SimNode(
                    name=f"{name}-{k}",
                    model=str(spec.get("model", "")),
                    gpus=sizes,
                    cpu=None if cpu is None else int(_num(spec, "cpu", where) * 1000),
                    memory=None if mem is None else int(_num(spec, "memory", where) * 1024),
                )
            )
    pods: list[SimPod] = []
    for i, spec in enumerate(doc["pods"]):
        where = f"{path}: pods[{i}]"
        if not isinstance(spec, dict):
            raise WorkloadError(f"{where}: expected a mapping")
        count = _whole(spec, "gpu_count", where, 1)
        per = _whole(spec, "gpu_memory", where, 0)
        if per == 0 or count == 0:
            per, count = 0, 0
        models = spec.get("models", [])
        if isinstance(models, str):
            models = [models]
        priority = spec.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise WorkloadError(f"{where}: 'priority' must be an integer, got {priority!r}")
        pod = SimPod(
            name=str(spec.get("name", f"pod{i}")),
            per_gpu=per,
            count=count,
            models=tuple(sorted(str(m).lower() for m in models)),
            cpu=int(_num(spec, "cpu", where, 0) * 1000),
            memory=int(_num(spec, "memory", where, 0) * 1024),
            priority=priority,
            duration=_num(spec, "duration", where) if "duration" in spec else None,
        )
        pods.extend([pod] * _whole(spec, "weight", where, 1))
    if not nodes or not pods:
        raise WorkloadError(f"{path}: needs at least one node and one pod")
    return Workload(tuple(nodes), tuple(pods), unit="GiB")
