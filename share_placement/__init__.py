"""Where does a pod go? Placement policies: pure functions over plain data.

The extender (filter, prioritize, bind), the trace simulator and the DRA driver call exactly this code, so
what the simulator measures is what the cluster does. Units are whatever the caller counts in (GiB in the
extender, thousandths of a GPU in the simulator). This package imports only the standard library (and
`share_core`, the contract): a program's package may import it, never the other way round.

| module | what |
|---|---|
| `model` | a node's GPUs (`NodeState`, `NodeView`), a pod's `Demand`, the `Policy` protocol |
| `binpack` | `binpack` (best fit) and `spread` (worst fit) |
| `randomfit`, `bestfit` | baselines: random, and the FGD paper's Best-fit |
| `workload` | the learned pod-class tables and the fragmentation they imply |
| `frag_pricing`, `patterns` | `frag`'s exact incremental prices, the packing LP and its gap prices |
| `frag` | `frag`'s decisions (the chart's default policy) |
| `fgd` | FGD as published |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from share_placement.bestfit import BestFitPolicy
from share_placement.binpack import BinpackPolicy
from share_placement.binpack import SpreadPolicy
from share_placement.fgd import FgdPolicy
from share_placement.fgd import TypicalPods
from share_placement.fgd import fgd_fragmentation
from share_placement.frag import FragPolicy
from share_placement.model import NEG_INF
from share_placement.model import Demand
from share_placement.model import Evaluation
from share_placement.model import GpuSlot
from share_placement.model import GpuView
from share_placement.model import NodeState
from share_placement.model import NodeView
from share_placement.model import Policy
from share_placement.model import eligible_positions
from share_placement.model import fits
from share_placement.model import learns
from share_placement.model import node_view
from share_placement.randomfit import RandomPolicy
from share_placement.workload import WorkloadTable
from share_placement.workload import fill_ratio
from share_placement.workload import fragmentation
from share_placement.workload import fragmentation_from
from share_placement.workload import fragmentation_units
from share_placement.workload import group_aggregates
from share_placement.workload import shift_aggregates

__all__ = [
    "NEG_INF",
    "POLICIES",
    "BestFitPolicy",
    "BinpackPolicy",
    "Demand",
    "Evaluation",
    "FgdPolicy",
    "FragPolicy",
    "GpuSlot",
    "GpuView",
    "NodeState",
    "NodeView",
    "Policy",
    "RandomPolicy",
    "SpreadPolicy",
    "TypicalPods",
    "WorkloadTable",
    "best_node",
    "eligible_positions",
    "fgd_fragmentation",
    "fill_ratio",
    "fits",
    "fragmentation",
    "fragmentation_from",
    "fragmentation_units",
    "group_aggregates",
    "learns",
    "make_policy",
    "node_view",
    "shift_aggregates",
]

POLICIES: dict[str, type] = {
    "binpack": BinpackPolicy,
    "bestfit": BestFitPolicy,
    "spread": SpreadPolicy,
    "random": RandomPolicy,
    "frag": FragPolicy,
    "fgd": FgdPolicy,
}


def make_policy(name: str, **options: Any) -> Policy:
    """A fresh policy by name; `options` go to its constructor (e.g. `seed` for random)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}: choose one of {', '.join(sorted(POLICIES))}") from None
    return cls(**options)


def best_node(nodes: Sequence[NodeState], demand: Demand, policy: Policy) -> NodeState | None:
    """The node the policy scores highest among those that fit (first on ties)."""
    best, best_score = None, NEG_INF
    for node in nodes:
        s = policy.score(node, demand)
        if s > best_score:
            best, best_score = node, s
    return best
