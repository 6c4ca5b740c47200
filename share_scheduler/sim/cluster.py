"""The simulated cluster both simulators share: node-state interning, memoised evaluations, the choice of node.

Every node is reduced to a hashable `NodeView`; nodes in the same state share one interned id, and for
policies whose `evaluate` is pure (`cacheable`), the answer per (state, demand) is computed once with the
policy's own `evaluate` and reused until no node is in that state any more. The ATC'23 protocol
(engine.py: pods only arrive) and the timeline (timeline.py: pods arrive, wait and leave) both place
through `ClusterState.best`, so what one measures the other measures too.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import share_placement as placement
from share_placement import Demand
from share_placement import NodeView
from share_placement import Policy
from share_scheduler.sim.workload import Workload

_MISSING = object()


class ClusterState:
    """Where every node stands, interned by state, and the policy's best node for a demand.

    Demands are numbered once (`pod_demand[k]`: pod k's demand id), so the memo is a list per state.
    `tie_rng`: for a policy with `random_ties` (bestfit), equal best scores are broken uniformly at random
    among the tied nodes, as kube-scheduler's selectHost does; `draw_single_tie` False skips the draw when
    only one node is best (the timeline does, so that retrying on one node draws as a full retry would).
    """

    def __init__(
        self, workload: Workload, policy: Policy, tie_rng: random.Random | None = None, draw_single_tie: bool = True
    ) -> None:
        self.policy = policy
        self.evaluate = policy.evaluate
        self.cacheable = bool(getattr(policy, "cacheable", True))
        self.tie_rng = tie_rng if getattr(policy, "random_ties", False) else None
        self.draw_single_tie = draw_single_tie
        # Distinct demands, each with its index for the per-state memo.
        self.demand_ids: dict[Demand, int] = {}
        self.demands: list[Demand] = []
        self.pod_demand: list[int] = []
        for pod in workload.pods:
            d = pod.demand()
            dix = self.demand_ids.get(d)
            if dix is None:
                dix = self.demand_ids[d] = len(self.demands)
                self.demands.append(d)
            self.pod_demand.append(dix)
        # Node state interning: view -> state id; state id -> sorted node indices in that state.
        self.state_ids: dict[NodeView, int] = {}
        self.state_views: dict[int, NodeView] = {}
        self.members: dict[int, list[int]] = {}
        self.memo: dict[int, list] = {}  # state id -> evaluation per demand id (_MISSING: not yet)
        self.node_state: list[int] = []
        self._next_id = 0
        for i, n in enumerate(workload.nodes):
            sid = self.intern((tuple((n.model, g) for g in n.gpus), n.cpu, n.memory))
            self.node_state.append(sid)
            self.members.setdefault(sid, []).append(i)

    def intern(self, view: NodeView) -> int:
        sid = self.state_ids.get(view)
        if sid is None:
            sid = self.state_ids[view] = self._next_id
            self._next_id += 1
            self.state_views[sid] = view
            self.memo[sid] = [_MISSING] * len(self.demands)
        return sid

    def view(self, node: int) -> NodeView:
        return self.state_views[self.node_state[node]]

    def evaluation(self, sid: int, dix: int) -> placement.Evaluation:
        """The policy's answer for a node in state `sid` and demand `dix` (memoised if cacheable)."""
        if not self.cacheable:
            return self.evaluate(self.state_views[sid], self.demands[dix])
        row = self.memo[sid]
        ev = row[dix]
        if ev is _MISSING:
            ev = row[dix] = self.evaluate(self.state_views[sid], self.demands[dix])
        return ev

    def _fitting(self, dix: int) -> Iterator[tuple[int, placement.Evaluation]]:
        """Each node state the demand fits, with its evaluation (worked out once per state and demand)."""
        memo, views, evaluate, demand = self.memo, self.state_views, self.evaluate, self.demands[dix]
        for sid in self.members:
            row = memo[sid]
            ev = row[dix]
            if ev is _MISSING:
                ev = row[dix] = evaluate(views[sid], demand)
            if ev is not None:
                yield sid, ev

    def best(self, dix: int) -> tuple[int, placement.Evaluation] | None:
        """(node, evaluation) the policy picks for demand `dix` over the whole cluster, or None: fits nowhere.

        The highest score wins; ties go to the first node (as `placement.best_node` and the paper's
        kube-scheduler fork), or uniformly at random among the tied nodes for a `random_ties` policy."""
        best_node = -1
        best_score = placement.NEG_INF
        best_ev: placement.Evaluation = None
        if self.cacheable and self.tie_rng is not None:
            tied: list[int] = []
            for sid, ev in self._fitting(dix):
                s = ev[0]
                if s > best_score:
                    best_score, tied = s, [sid]
                elif s == best_score:
                    tied.append(sid)
            if not tied:
                return None
            members = self.members
            total = sum(len(members[sid]) for sid in tied)
            pick = self.tie_rng.randrange(total) if total > 1 or self.draw_single_tie else 0
            for sid in tied:
                if pick < len(members[sid]):
                    return members[sid][pick], self.memo[sid][dix]
                pick -= len(members[sid])
            raise AssertionError("unreachable: pick < total")  # pragma: no cover
        if self.cacheable:
            members = self.members
            for sid, ev in self._fitting(dix):
                s, first = ev[0], members[sid][0]
                if s > best_score or (s == best_score and first < best_node):
                    best_score, best_node, best_ev = s, first, ev
        else:
            evaluate, views, demand = self.evaluate, self.state_views, self.demands[dix]
            for i, sid in enumerate(self.node_state):
                ev = evaluate(views[sid], demand)
                if ev is not None and ev[0] > best_score:
                    best_score, best_node, best_ev = ev[0], i, ev
        return None if best_ev is None else (best_node, best_ev)

    def place(self, node: int, dix: int, positions: tuple[int, ...]) -> None:
        """Take demand `dix` on `node`'s GPUs at view `positions` (and its CPU and memory)."""
        self._shift(node, self.demands[dix], positions, -1)

    def release(self, node: int, dix: int, positions: tuple[int, ...]) -> None:
        """Give back what `place` took."""
        self._shift(node, self.demands[dix], positions, 1)

    def _shift(self, node: int, demand: Demand, positions: tuple[int, ...], sign: int) -> None:
        old = self.node_state[node]
        gpus, cpu_free, mem_free = self.state_views[old]
        new_gpus = list(gpus)
        step = sign * demand.per_gpu
        for p in positions:
            model, free = new_gpus[p]
            new_gpus[p] = (model, free + step)
        new = self.intern(
            (
                tuple(new_gpus),
                None if cpu_free is None else cpu_free + sign * demand.cpu,
                None if mem_free is None else mem_free + sign * demand.memory,
            )
        )
        self.node_state[node] = new
        old_members = self.members[old]
        old_members.remove(node)
        if not old_members:
            del self.members[old]
            if old != new:  # no node is in the old state any more: forget it (a churning cluster makes many)
                del self.memo[old]
                del self.state_ids[self.state_views.pop(old)]
        new_members = self.members.setdefault(new, [])
        new_members.append(node)
        if len(new_members) > 1:
            new_members.sort()
