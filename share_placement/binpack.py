"""Best fit and worst fit: the GPU left with the least (binpack) or the most (spread) free memory."""

from __future__ import annotations

from share_placement.model import (
    Demand,
    Evaluation,
    NodeView,
    ViewPolicy,
    eligible_positions,
)


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


class BinpackPolicy(FitPolicy):
    """Best fit: the GPU(s) left with the least free memory, lowest index on ties."""

    name = "binpack"


class SpreadPolicy(FitPolicy):
    """Worst fit: the emptiest GPU(s) on the emptiest node, lowest index on ties."""

    name = "spread"
    sign = -1
