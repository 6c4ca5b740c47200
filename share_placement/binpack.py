"""Best fit and worst fit: the GPU left with the least (binpack) or the most (spread) free memory."""

from __future__ import annotations

from collections.abc import Sequence

from share_placement.model import NEG_INF
from share_placement.model import Demand
from share_placement.model import Evaluation
from share_placement.model import NodeView
from share_placement.model import ViewPolicy
from share_placement.model import eligible_positions


def best_fit(view: NodeView, elig: list[int], count: int) -> tuple[int, ...]:
    gpus = view[0]
    elig.sort(key=lambda i: (gpus[i][1], i))
    return tuple(sorted(elig[:count]))


class FitPolicy(ViewPolicy):
    """Best fit (`sign` 1) or worst fit (`sign` -1) by free memory, lowest index on ties."""

    sign = 1

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        gpus, sign = view[0], self.sign
        elig.sort(key=lambda i: (sign * gpus[i][1], i))
        chosen = tuple(sorted(elig[: demand.count]))
        left = sum(gpus[i][1] - demand.per_gpu for i in chosen)
        node_free = sum(f for _, f in gpus)
        # Best fit: least stranded memory first, among equals the fuller node; worst fit: the opposite.
        return -sign * float(left * 1_000_000 + node_free), chosen

    def scores(self, views: Sequence[NodeView], demand: Demand) -> list[float]:
        """evaluate's scores for a CPU-only or one-GPU pod without a model choice, without building
        each node's candidate list (the extender prices 5,000 states when a demand is new)."""
        count, per, cpu, memory = demand.count, demand.per_gpu, demand.cpu, demand.memory
        if count > 1 or demand.models:
            return super().scores(views, demand)
        sign = self.sign
        pick = min if sign > 0 else max
        out = []
        for gpus, cpu_free, mem_free in views:
            if (cpu_free is not None and cpu_free < cpu) or (mem_free is not None and mem_free < memory):
                out.append(NEG_INF)  # eligible_positions' host check
                continue
            frees = [f for _, f in gpus]
            left = 0
            if count:
                fit = [f for f in frees if f >= per]
                if not fit:
                    out.append(NEG_INF)
                    continue
                left = pick(fit) - per
            out.append(-sign * float(left * 1_000_000 + sum(frees)))
        return out


class BinpackPolicy(FitPolicy):
    """Best fit: the GPU(s) left with the least free memory, lowest index on ties."""

    name = "binpack"


class SpreadPolicy(FitPolicy):
    """Worst fit: the emptiest GPU(s) on the emptiest node, lowest index on ties."""

    name = "spread"
    sign = -1
