"""Room for what waits (issue 40): a policy wrapper that steers small pods off the GPUs waiting pods need.

Fed the shapes of the multi-GPU pods that wait, it makes a placement that breaks GPUs those shapes need
cost more: a node's *closeness* to a shape is 1 / (1 + GPUs short); a placement's cost is how much
closeness it takes away, summed over the waiting shapes. Cost orders nodes first (any node that breaks
nothing wins), the wrapped policy's own score second, so a small pod still goes wherever it fits: it is
steered, never kept waiting.

The reservations and consolidation beside it are share_placement.starvation's.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence

from share_placement.model import Demand
from share_placement.model import Evaluation
from share_placement.model import NodeView
from share_placement.model import Policy
from share_placement.model import ViewPolicy
from share_placement.model import model_allowed


def shape_of(demand: Demand) -> Demand:
    """What matters of a waiting pod for the room it needs: its GPUs (count, units each, models)."""
    return Demand(demand.per_gpu, demand.count, demand.models)


# A node as `hosted_shape` weighs it: its GPU model, how many GPUs, its whole CPU and memory (None: not known).
Host = tuple[str, int, int | None, int | None]


def hosted_shape(demand: Demand, hosts: Iterable[Host]) -> Demand:
    """The demand with its models narrowed to those of the nodes that could ever host it (enough GPUs of an
    allowed model and enough CPU and memory in all), when that leaves out some model of the nodes with
    enough GPUs; else the demand as it is. The room it needs is then counted only where it could ever run:
    in openb an 8-GPU pod asking 120 cores runs only on the 128-core G3 nodes, not on the 96-core G2 ones,
    and a share that breaks a G3 node breaks room no G2 node can give it."""
    if demand.count < 2:
        return demand
    gpu_models: set[str] = set()
    could: set[str] = set()
    for model, gpus, cpu, memory in hosts:
        if gpus < demand.count or (demand.models and not model_allowed(demand.models, model)):
            continue
        gpu_models.add(model)
        if (cpu is None or cpu >= demand.cpu) and (memory is None or memory >= demand.memory):
            could.add(model)
    if not could or could == gpu_models:
        return demand
    return Demand(demand.per_gpu, demand.count, tuple(sorted(could)), demand.cpu, demand.memory)


def closeness(view: NodeView, shape: Demand) -> float:
    """1 / (1 + GPUs short) for a node that has enough usable GPUs for the shape, else 0: how near the
    node is to taking a pod of that shape (1: it has the room now)."""
    gpus = view[0]
    per, count, models = shape.per_gpu, shape.count, shape.models
    allowed = [f for m, f in gpus if model_allowed(models, m)] if models else [f for _, f in gpus]
    if len(allowed) < count:
        return 0.0
    room = sum(1 for f in allowed if f >= per)
    return 1.0 / (1 + max(0, count - room))


def room_cost(view: NodeView, positions: Sequence[int], demand: Demand, shapes: Iterable[Demand]) -> float:
    """How much nearness to the waiting `shapes` a placement of `demand` on `positions` takes from the
    node, summed over the shapes (the demand's own shape not counted: it is the one being placed)."""
    own = shape_of(demand)
    gpus = view[0]
    after = list(gpus)
    for p in positions:
        model, free = after[p]
        after[p] = (model, free - demand.per_gpu)
    after_view = (tuple(after), view[1], view[2])
    cost = 0.0
    for s in shapes:
        if s == own:
            continue
        cost += closeness(view, s) - closeness(after_view, s)
    return max(0.0, cost)


class RoomForWaiting(ViewPolicy):
    """Any policy, told the shapes of the multi-GPU pods that wait, leaving room for them.

    Score: the wrapped policy's, less `PENALTY` x the room cost (`room_cost`, quantised to 1/1000), so a
    node where the pod breaks no waiting shape's room always wins, and among equal costs the wrapped
    policy decides (its GPUs, its ties). With no shape waiting it is the wrapped policy exactly.
    `set_waiting` returns whether the shapes changed: a caller memoising evaluations must forget them."""

    # Larger than any wrapped policy's score range (binpack's reaches ~1e10 in milli-GPU), so the cost
    # orders first; small enough that a double keeps the wrapped score's unit steps (ulp ~0.002 at 1e13).
    PENALTY = 1e13
    STEPS = 1000

    def __init__(self, base: Policy, shapes: Iterable[Demand] = ()) -> None:
        self.base = base
        self.name = getattr(base, "name", type(base).__name__)
        self.cacheable = bool(getattr(base, "cacheable", True))
        self.random_ties = bool(getattr(base, "random_ties", False))
        self.uniform_scores = bool(getattr(base, "uniform_scores", False))
        self.shapes: tuple[Demand, ...] = ()
        self.set_waiting(shapes)

    def set_waiting(self, shapes: Iterable[Demand]) -> bool:
        """Take the waiting pods' demands (multi-GPU ones count); True when the set of shapes changed."""
        new = tuple(sorted({shape_of(d) for d in shapes if d.count >= 2}, key=lambda s: (s.count, s.per_gpu, s.models)))
        changed = new != self.shapes
        self.shapes = new
        return changed

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        ev = self.base.evaluate(view, demand)
        if ev is None or not self.shapes or demand.count == 0:
            return ev
        cost = round(room_cost(view, ev[1], demand, self.shapes) * self.STEPS)
        if cost == 0:
            return ev
        return ev[0] - self.PENALTY * cost / self.STEPS, ev[1]

    def scores(self, views: Sequence[NodeView], demand: Demand) -> list[float]:
        """The wrapped policy's batch pricing while nothing waits (frag's is much faster than one by
        one); evaluate's scores view by view while shapes wait."""
        if not self.shapes or demand.count == 0:
            base_scores = getattr(self.base, "scores", None)
            if base_scores is not None:
                return base_scores(views, demand)
        return super().scores(views, demand)

    def observe(self, demand: Demand) -> None:
        self.base.observe(demand)
