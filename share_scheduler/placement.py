"""Where does a pod go? Placement policies: pure functions over plain data.

The extender (filter, prioritize, bind) and the trace simulator call exactly this code, so what the
simulator measures is what the cluster does. Units are whatever the caller counts in (GiB in the
extender, thousandths of a GPU in the simulator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuSlot:
    index: int
    model: str
    total: int
    free: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: tuple[GpuSlot, ...]


@dataclass(frozen=True, slots=True)
class Demand:
    """`count` GPUs with `per_gpu` free each, of a model matching one of `models` (empty: any)."""

    per_gpu: int
    count: int = 1
    models: tuple[str, ...] = ()

    def model_allowed(self, model: str) -> bool:
        if not self.models:
            return True
        lowered = model.lower()
        return any(m in lowered for m in self.models)


def eligible_gpus(node: NodeState, demand: Demand) -> list[GpuSlot]:
    """Healthy GPUs of an allowed model with room for one share of the demand."""
    return [g for g in node.gpus if g.healthy and g.free >= demand.per_gpu and demand.model_allowed(g.model)]


def fits(node: NodeState, demand: Demand) -> bool:
    return len(eligible_gpus(node, demand)) >= demand.count


class Policy(Protocol):
    name: str

    def choose(self, node: NodeState, demand: Demand) -> tuple[int, ...] | None:
        """The GPU indices to use on this node, or None if the demand does not fit."""
        ...

    def score(self, node: NodeState, demand: Demand) -> float:
        """How much this policy likes the node for the demand (higher is better; only order matters)."""
        ...

    def observe(self, demand: Demand) -> None:
        """Learn from a pod the cluster has seen (used by workload-aware policies; others ignore it)."""
        ...


class BinpackPolicy:
    """Best fit: the GPU(s) left with the least free memory, lowest index on ties."""

    name = "binpack"

    def choose(self, node: NodeState, demand: Demand) -> tuple[int, ...] | None:
        gpus = eligible_gpus(node, demand)
        if len(gpus) < demand.count:
            return None
        gpus.sort(key=lambda g: (g.free, g.index))
        return tuple(sorted(g.index for g in gpus[: demand.count]))

    def score(self, node: NodeState, demand: Demand) -> float:
        chosen = self.choose(node, demand)
        if chosen is None:
            return float("-inf")
        by_index = {g.index: g for g in node.gpus}
        stranded = sum(by_index[i].free - demand.per_gpu for i in chosen)
        node_free = sum(g.free for g in node.gpus if g.healthy)
        # Least stranded memory first; among equals, the fuller node.
        return -(stranded * 1_000_000 + node_free)

    def observe(self, demand: Demand) -> None:
        pass


class SpreadPolicy:
    """Worst fit: the emptiest GPU(s) on the emptiest node, lowest index on ties."""

    name = "spread"

    def choose(self, node: NodeState, demand: Demand) -> tuple[int, ...] | None:
        gpus = eligible_gpus(node, demand)
        if len(gpus) < demand.count:
            return None
        gpus.sort(key=lambda g: (-g.free, g.index))
        return tuple(sorted(g.index for g in gpus[: demand.count]))

    def score(self, node: NodeState, demand: Demand) -> float:
        chosen = self.choose(node, demand)
        if chosen is None:
            return float("-inf")
        by_index = {g.index: g for g in node.gpus}
        left = sum(by_index[i].free - demand.per_gpu for i in chosen)
        node_free = sum(g.free for g in node.gpus if g.healthy)
        return left * 1_000_000 + node_free

    def observe(self, demand: Demand) -> None:
        pass


POLICIES: dict[str, type] = {"binpack": BinpackPolicy, "spread": SpreadPolicy}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}: choose one of {', '.join(sorted(POLICIES))}") from None


def best_node(nodes: Sequence[NodeState], demand: Demand, policy: Policy) -> NodeState | None:
    """The node the policy scores highest among those that fit (first on ties)."""
    best, best_score = None, float("-inf")
    for node in nodes:
        s = policy.score(node, demand)
        if s > best_score:
            best, best_score = node, s
    return best
