"""What placement works on: a node's GPUs, a pod's demand, and the protocol every policy keeps.

Every policy has one decision function, ``evaluate(view, demand)``, over a compact ``NodeView``
(plain tuples, cheap to hash and memoise). ``score`` and ``choose`` are thin wrappers that turn a
``NodeState`` into a view and map GPU positions back to GPU indices; the simulator calls ``evaluate``
directly so it need not build ``NodeState`` objects ten million times.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Protocol

NEG_INF = float("-inf")
MISSING = object()


@dataclass(frozen=True, slots=True)
class GpuSlot:
    index: int
    model: str
    total: int
    free: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as placement sees it; `cpu_free`/`memory_free` of None mean "not checked here"."""

    name: str
    gpus: tuple[GpuSlot, ...]
    cpu_free: int | None = None
    memory_free: int | None = None


@dataclass(frozen=True, slots=True)
class Demand:
    """`count` GPUs with `per_gpu` free each, of a model matching one of `models` (empty: any).

    `cpu` and `memory` are only checked against nodes that report `cpu_free`/`memory_free` (the
    simulator does; the extender leaves CPU and memory to kube-scheduler). `count` 0 is a CPU-only pod.
    """

    per_gpu: int
    count: int = 1
    models: tuple[str, ...] = ()
    cpu: int = 0
    memory: int = 0

    def model_allowed(self, model: str) -> bool:
        if not self.models:
            return True
        return model_allowed(self.models, model)


def room_at_least(
    frees: dict[tuple[str, ...], tuple[list[int], list[int]]], gpus: GpuView, models: tuple[str, ...], need: int
) -> tuple[int, int]:
    """(how many of the node's GPUs allowed to `models` have `need` free, their free capacity summed).

    `frees` memoises, per model set, the allowed GPUs' free units sorted with their running sums, so
    one node's keys sharing a model set sort once."""
    fs = frees.get(models)
    if fs is None:
        vals = sorted([f for m, f in gpus if not models or model_allowed(models, m)])
        fs = frees[models] = (vals, [0, *accumulate(vals)])
    vals, running = fs
    i = bisect_left(vals, need)
    return len(vals) - i, running[-1] - running[i]


@lru_cache(maxsize=4096)
def model_allowed(models: tuple[str, ...], model: str) -> bool:
    lowered = model.lower()
    return any(m.lower() in lowered for m in models)


# A node reduced to what placement needs: ((model, free) per healthy GPU, cpu_free, memory_free).
GpuView = tuple[tuple[str, int], ...]
NodeView = tuple[GpuView, int | None, int | None]
# What `evaluate` answers: (score, GPU positions in the view), or None when the demand does not fit.
Evaluation = tuple[float, tuple[int, ...]] | None


def node_view(node: NodeState) -> tuple[NodeView, tuple[int, ...]]:
    """The compact view of a node's healthy GPUs, and the GPU index behind each view position."""
    gpus = [g for g in node.gpus if g.healthy]
    view = (tuple([(g.model, g.free) for g in gpus]), node.cpu_free, node.memory_free)
    return view, tuple([g.index for g in gpus])


def _host_fits(view: NodeView, demand: Demand) -> bool:
    _, cpu_free, mem_free = view
    if cpu_free is not None and cpu_free < demand.cpu:
        return False
    return mem_free is None or mem_free >= demand.memory


def eligible_positions(view: NodeView, demand: Demand) -> list[int] | None:
    """View positions of GPUs that can take one share, or None if the node cannot take the demand."""
    if not _host_fits(view, demand):
        return None
    per, models = demand.per_gpu, demand.models
    if models:
        out = [i for i, (m, f) in enumerate(view[0]) if f >= per and model_allowed(models, m)]
    else:
        out = [i for i, (_, f) in enumerate(view[0]) if f >= per]
    return out if len(out) >= demand.count else None


def fits(node: NodeState, demand: Demand) -> bool:
    return eligible_positions(node_view(node)[0], demand) is not None


class Policy(Protocol):
    name: str
    # True when evaluate() is a pure function of (view, demand) for a fixed learned workload, so a
    # caller may memoise it; the random policy is not.
    cacheable: bool

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        """(score, GPU positions) for this node view, or None if the demand does not fit."""
        ...

    def choose(self, node: NodeState, demand: Demand) -> tuple[int, ...] | None:
        """The GPU indices to use on this node, or None if the demand does not fit."""
        ...

    def score(self, node: NodeState, demand: Demand) -> float:
        """How much this policy likes the node for the demand (higher is better; only order matters)."""
        ...

    def observe(self, demand: Demand) -> None:
        """Learn from a pod the cluster has seen (used by workload-aware policies; others ignore it)."""
        ...


class ViewPolicy:
    """score/choose over NodeState, both answered by the subclass's evaluate()."""

    name = "base"
    cacheable = True

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:  # pragma: no cover - abstract
        raise NotImplementedError

    def scores(self, views: Sequence[NodeView], demand: Demand) -> list[float]:
        """evaluate's score for each view (-inf: does not fit): a policy may price many states at once
        faster than one by one (frag, when a demand is new to a 5,000-node cluster)."""
        out = []
        for view in views:
            ev = self.evaluate(view, demand)
            out.append(NEG_INF if ev is None else ev[0])
        return out

    def choose(self, node: NodeState, demand: Demand) -> tuple[int, ...] | None:
        view, indices = node_view(node)
        ev = self.evaluate(view, demand)
        if ev is None:
            return None
        return tuple(sorted(indices[p] for p in ev[1]))

    def score(self, node: NodeState, demand: Demand) -> float:
        # node_view's view, built in one pass (no GPU indices needed): this runs for every node.
        view = (tuple([(g.model, g.free) for g in node.gpus if g.healthy]), node.cpu_free, node.memory_free)
        ev = self.evaluate(view, demand)
        return NEG_INF if ev is None else ev[0]

    def observe(self, demand: Demand) -> None:
        pass


def learns(policy: Policy) -> bool:
    """Whether the policy's observe() does anything (binpack, spread, random learn nothing)."""
    return getattr(type(policy), "observe", None) is not ViewPolicy.observe
