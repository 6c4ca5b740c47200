"""The decisions behind reservations and consolidation, as pure functions over plain data.

Which waiting pods get room (`starving`, `reservation_order`), where a pod will fit soonest
(`soonest_spot`), how much of the cluster holds may take (`within_budget`), and which pods to move so
that a pod whose room is split over GPUs fits (`plan_consolidation`, the policy's own choices on a copy
of the cluster). The reservations loop (share_scheduler.starvation) is their imperative shell: it feeds
them the cache and acts on the answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import Policy
from share_placement.model import model_allowed
from share_scheduler.waiting import WaitingPod


def starving(pods: Iterable[WaitingPod], now: float, threshold: float, scheduler: str) -> list[WaitingPod]:
    """The pods of `scheduler`'s profile that have waited at least `threshold` seconds."""
    return [p for p in pods if p.scheduler == scheduler and p.created and p.waited(now) >= threshold]


def reservation_order(pods: Iterable[WaitingPod]) -> list[WaitingPod]:
    """Who is served first: higher priority, then the longest wait (then the name, for a stable order)."""
    return sorted(pods, key=lambda p: (-p.priority, p.created, p.key))


def within_budget(held: int, more: int, cluster: int, max_share: float) -> bool:
    """Whether holding `more` units on top of `held` stays within `max_share` of the cluster's GPU memory."""
    return held + more <= math.floor(max_share * cluster)


def _usable(node: NodeState, demand: Demand) -> list[GpuSlot]:
    """The GPUs of `node` the demand could ever use: healthy, of an allowed model, large enough."""
    return [
        g
        for g in node.gpus
        if g.healthy and g.total >= demand.per_gpu and (not demand.models or model_allowed(demand.models, g.model))
    ]


@dataclass(frozen=True, slots=True)
class Spot:
    """Where a waiting pod fits soonest: `gpus` on `node`, `short_gpus` of them lacking `short_units` in all."""

    node: str
    gpus: tuple[int, ...]
    short_gpus: int
    short_units: int

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.short_gpus, self.short_units, self.node)


def spot_on(node: NodeState, demand: Demand) -> Spot | None:
    """The pod's soonest spot on one node (its freest usable GPUs), or None if the node can never take it."""
    usable = _usable(node, demand)
    if len(usable) < demand.count:
        return None
    picked = sorted(usable, key=lambda g: (-g.free, g.index))[: demand.count]
    shorts = [max(demand.per_gpu - g.free, 0) for g in picked]
    return Spot(node.name, tuple(sorted(g.index for g in picked)), sum(1 for s in shorts if s), sum(shorts))


def soonest_spots(demand: Demand, nodes: Iterable[NodeState]) -> list[Spot]:
    """Every node's spot, soonest first: fewest GPUs short, then the least memory still to drain (running
    pods' departure times are not known to the extender), then the node's name."""
    spots = [s for s in (spot_on(n, demand) for n in nodes) if s is not None]
    spots.sort(key=lambda s: s.key)
    return spots


# -- consolidation ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Movable:
    """A bound pod that may move: its controller recreates it elsewhere (share_scheduler.starvation
    decides who may move)."""

    key: str
    uid: str
    owner_uid: str
    node: str
    gpus: tuple[int, ...]
    per_gpu: int
    priority: int
    demand: Demand  # what its replacement will ask (the same spec)


@dataclass(frozen=True, slots=True)
class Move:
    pod: Movable
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConsolidationPlan:
    """Evict `moves` (each placed again on its node and GPUs) so that the waiting pod fits `gpus` on `node`."""

    node: str
    gpus: tuple[int, ...]
    moves: tuple[Move, ...]

    @property
    def moved_units(self) -> int:
        return sum(m.pod.per_gpu * len(m.pod.gpus) for m in self.moves)


def _adjust(node: NodeState, free: Mapping[int, int], cpu: int = 0, memory: int = 0) -> NodeState:
    """`node` with `free[index]` more units free on those GPUs and `cpu`/`memory` more host room."""
    gpus = tuple(replace(g, free=g.free + free[g.index]) if g.index in free else g for g in node.gpus)
    return NodeState(
        node.name,
        gpus,
        None if node.cpu_free is None else node.cpu_free + cpu,
        None if node.memory_free is None else node.memory_free + memory,
    )


def _freeing(gpu: GpuSlot, per_gpu: int, candidates: Sequence[Movable]) -> tuple[Movable, ...] | None:
    """The fewest pods on `gpu` (largest first) whose moving leaves `per_gpu` free on it; () when it already
    has room, None when even moving every candidate would not."""
    deficit = per_gpu - gpu.free
    if deficit <= 0:
        return ()
    chosen: list[Movable] = []
    for pod in sorted(candidates, key=lambda p: (-p.per_gpu, p.key)):
        chosen.append(pod)
        deficit -= pod.per_gpu
        if deficit <= 0:
            return tuple(chosen)
    return None


def _node_moves(node: NodeState, demand: Demand, priority: int, pods: Sequence[Movable]) -> tuple[Movable, ...] | None:
    """The pods to move off `node` for the demand to fit there (fewest first), or None."""
    usable = _usable(node, demand)
    if len(usable) < demand.count:
        return None
    movable = [p for p in pods if p.priority <= priority]  # never move a pod that outranks the waiting one
    options = []
    for gpu in usable:
        freeing = _freeing(gpu, demand.per_gpu, [p for p in movable if gpu.index in p.gpus])
        if freeing is not None:
            options.append((len(freeing), sum(p.per_gpu for p in freeing), gpu.index, freeing))
    if len(options) < demand.count:
        return None
    options.sort(key=lambda o: o[:3])
    chosen: dict[str, Movable] = {}
    for *_, freeing in options[: demand.count]:
        for pod in freeing:
            chosen[pod.key] = pod
    return tuple(chosen.values())


def _place(policy: Policy, states: dict[str, NodeState], demand: Demand) -> tuple[str, tuple[int, ...]] | None:
    """The policy's choice for `demand` over `states`: the best-scoring node, its GPUs (ties to the name)."""
    best: tuple[float, str, tuple[int, ...]] | None = None
    for name in sorted(states):
        state = states[name]
        gpus = policy.choose(state, demand)
        if gpus is None:
            continue
        score = policy.score(state, demand)
        if best is None or score > best[0]:
            best = (score, name, gpus)
    return None if best is None else (best[1], best[2])


def _try_node(
    policy: Policy,
    states: Mapping[str, NodeState],
    node: str,
    demand: Demand,
    moving: Sequence[Movable],
) -> ConsolidationPlan | None:
    """Simulate the plan on a copy of the cluster: the moved pods leave `node`, the waiting pod takes its
    freest GPUs there, then each moved pod (largest first) goes where the policy would place it."""
    work = dict(states)
    freed: dict[int, int] = {}
    cpu = memory = 0
    for pod in moving:
        for g in pod.gpus:
            freed[g] = freed.get(g, 0) + pod.per_gpu
        cpu += pod.demand.cpu
        memory += pod.demand.memory
    after = _adjust(work[node], freed, cpu, memory)
    gpus = policy.choose(after, demand)
    if gpus is None:
        return None
    work[node] = _adjust(after, {g: -demand.per_gpu for g in gpus}, -demand.cpu, -demand.memory)
    moves = []
    for pod in sorted(moving, key=lambda p: (-p.per_gpu * len(p.gpus), p.key)):
        placed = _place(policy, work, pod.demand)
        if placed is None:
            return None
        target, target_gpus = placed
        work[target] = _adjust(work[target], {g: -pod.demand.per_gpu for g in target_gpus}, -pod.demand.cpu,
                               -pod.demand.memory)  # fmt: skip
        moves.append(Move(pod, target, target_gpus))
    return ConsolidationPlan(node, tuple(gpus), tuple(moves))


def plan_consolidation(
    policy: Policy,
    demand: Demand,
    priority: int,
    states: Mapping[str, NodeState],
    movable: Mapping[str, Sequence[Movable]],
    max_moves: int,
) -> tuple[ConsolidationPlan | None, str]:
    """The cheapest plan (fewest moves, then the least memory moved, then the node's name) that makes
    `demand` fit by moving at most `max_moves` pods of `movable` (node -> its pods that may move), every
    moved pod placed again by the policy on `states` (the cluster as the waiting pod sees it); or None
    and why not, for a person."""
    if any(policy.choose(s, demand) is not None for s in states.values()):
        return None, "it fits somewhere already: nothing needs to move"
    options = []
    for name, pods in movable.items():
        state = states.get(name)
        if state is None or not pods:
            continue
        moving = _node_moves(state, demand, priority, pods)
        if moving is None or not moving:
            continue
        if len(moving) > max_moves:
            continue
        options.append((len(moving), sum(p.per_gpu * len(p.gpus) for p in moving), name, moving))
    if not options:
        return None, f"no node can make room by moving at most {max_moves} pod(s) that may move"
    options.sort(key=lambda o: o[:3])
    for *_, name, moving in options:
        plan = _try_node(policy, states, name, demand, moving)
        if plan is not None:
            return plan, ""
    return None, "the policy would not place every moved pod again"


# -- whether a node could ever take the pod (kube-scheduler's static filters, for the few nodes weighed) --

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  # corev1.TaintNodeUnschedulable


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """corev1 Toleration.ToleratesTaint: same effect (or none), same key (or none with Exists), and
    Exists, or Equal (the default) with the same value."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        operator = t.get("operator") or "Equal"
        if t.get("key"):
            if t.get("key") != taint.get("key"):
                continue
        elif operator != "Exists":
            continue
        if operator == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement, as nodeaffinity's NodeSelector reads it."""
    key, op = str(expr.get("key") or ""), expr.get("operator")
    values = [str(v) for v in expr.get("values") or ()]
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_holds(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False  # nodeaffinity: an empty term matches no node
    if not all(_expression_holds(e, labels) for e in exprs):
        return False
    return all(_expression_holds(f, {"metadata.name": name}) for f in fields)


def node_refuses(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """Why kube-scheduler's static filters would refuse `pod` on `node` whatever runs there ("" if not):
    NodeUnschedulable, NodeAffinity (nodeSelector and required affinity) and TaintToleration, as
    pkg/scheduler/framework/plugins/{nodeunschedulable,nodeaffinity,tainttoleration} judge them."""
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    node_spec = node.get("spec") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    name = str(meta.get("name") or "")
    tolerations = list(spec.get("tolerations") or ())
    cordon = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    if node_spec.get("unschedulable") and not _tolerates(tolerations, cordon):
        return "node is unschedulable (cordoned)"
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"node lacks the label {key}={value} of the pod's nodeSelector"
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if terms is not None and not any(_term_holds(t, labels, name) for t in terms):
        return "node does not match the pod's required node affinity"
    for taint in node_spec.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
            what = f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}"
            return f"node has the taint {what}, which the pod does not tolerate"
    return ""
