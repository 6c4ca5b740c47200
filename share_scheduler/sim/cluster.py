"""The simulated cluster both simulators share: node-state interning, memoised evaluations, the choice of node.

Every node is reduced to a hashable `NodeView`; nodes in the same state share one interned id, and for
policies whose `evaluate` is pure (`cacheable`), the answer per (state, demand) is computed once with the
policy's own `evaluate` and reused until no node is in that state any more. The ATC'23 protocol
(engine.py: pods only arrive) places through `ClusterState.best`, a scan of every state; the timeline
(timeline.py: pods arrive, wait and leave, hundreds of thousands of times) through `best_indexed`, the
same choice from per-demand buckets of states by score (under a heap of the scores) that only look at the
states born since that demand last asked and that it may fit: each state, when born, is handed to the
demands its free CPU, memory and GPUs allow (`FitIndex`, one bit per demand), so a demand never walks the
states it could not use.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import random
from bisect import bisect_right
from collections.abc import Iterable
from collections.abc import Iterator

import share_placement as placement
from share_placement import Demand
from share_placement import NodeView
from share_placement import Policy
from share_placement.room import RoomForWaiting
from share_scheduler.sim.workload import Workload

_MISSING = object()

# Policies whose answer for a node that has the CPU and memory a demand asks depends on less than the whole
# (view, demand), so one evaluation serves many: "gpus" (binpack, spread: the node's GPUs and the demand's
# GPU shape alone), "gpus+cpu" (bestfit, fgd: also the node's free CPU and the demand's CPU; memory only
# gates). Exact types only: a subclass may score otherwise. `RoomForWaiting` adds a price on the GPUs alone,
# so it inherits its base's. tests/unit/sim/test_cluster.py holds each policy to it on random views.
SCORE_INPUTS: dict[type, str] = {
    placement.BinpackPolicy: "gpus",
    placement.SpreadPolicy: "gpus",
    placement.BestFitPolicy: "gpus+cpu",
    placement.FgdPolicy: "gpus+cpu",
}


def score_inputs(policy: Policy) -> str | None:
    """What the policy's evaluation depends on beyond the CPU and memory check (SCORE_INPUTS), or None: all."""
    if type(policy) is RoomForWaiting:
        return score_inputs(policy.base)
    return SCORE_INPUTS.get(type(policy))


def policy_memo_off(policy: Policy) -> None:
    """Turn off the policy's own memo of (view, demand) answers (`memo_evaluations`), and its base's where
    it wraps one: `ClusterState` keeps every answer per live state itself, a churning cluster's states
    rarely come back, and the policy's memo then costs the run more in memory (and the caches it misses)
    than its hits save (the timeline, 0.6 days at rho 1.0: fgd 0.84 x, frag 0.95 x the time). Only for a
    `cacheable` policy: one that is not is asked afresh every time, its own memo the only one."""
    if not getattr(policy, "cacheable", True):
        return
    while policy is not None:
        if hasattr(policy, "memo_evaluations"):
            policy.memo_evaluations = False  # type: ignore[attr-defined]
        policy = getattr(policy, "base", None)  # type: ignore[assignment]


# The garbage collector's thresholds while a simulation runs (the timeline's `run`). A run makes no
# reference cycles (at CPython's defaults a 1-day frag run's young and full collections reclaimed nothing
# the setup had not left), yet at those defaults it ran ~30 full collections, each walking every memo and
# cache the policy and the cluster keep (frag's pricer holds millions of containers): about a sixth of
# frag's run. These make collections rare (a young one per million net new containers, a full one
# practically never); what a cycle might leave is still reclaimed, later. Restored when the run ends.
RUN_GC_THRESHOLDS = (1_000_000, 10, 10)


@contextlib.contextmanager
def rare_collections() -> Iterator[None]:
    """`RUN_GC_THRESHOLDS` for the duration of the block, the caller's thresholds after it."""
    before = gc.get_threshold()
    gc.set_threshold(*RUN_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


class FitIndex:
    """Which demands a node state may fit, as one int with a bit per demand id: `cannot_fit`'s test for
    every demand at once.

    A demand may fit when the state's free CPU and memory reach its asks and, for a GPU demand of count c,
    the state's c-th largest GPU free reaches its per-GPU ask (whatever the model: the policy decides
    that). Each test is a prefix of the demands sorted by that ask, so a state's answer is a few
    bisections and three ANDs, however many demands there are."""

    def __init__(self, demands: list[Demand]) -> None:
        self.everyone = (1 << len(demands)) - 1
        self.cpu = self._prefixes([(d.cpu, i) for i, d in enumerate(demands)])
        self.memory = self._prefixes([(d.memory, i) for i, d in enumerate(demands)])
        self.gpu_free = 0  # CPU-only demands: no GPU test
        by_count: dict[int, list[tuple[int, int]]] = {}
        for i, d in enumerate(demands):
            if d.count == 0:
                self.gpu_free |= 1 << i
            else:
                by_count.setdefault(d.count, []).append((d.per_gpu, i))
        self.gpus = [(count, *self._prefixes(asks)) for count, asks in sorted(by_count.items())]

    @staticmethod
    def _prefixes(asks: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        """(sorted asks, masks): masks[k] has the bits of the demands with the k smallest asks."""
        asks = sorted(asks)
        masks = [0]
        for _, i in asks:
            masks.append(masks[-1] | 1 << i)
        return [a for a, _ in asks], masks

    def mask(self, view: NodeView) -> int:
        """The demands `view` may fit."""
        gpu_view, cpu_free, mem_free = view
        host = self.everyone
        if cpu_free is not None:
            asks, masks = self.cpu
            host &= masks[bisect_right(asks, cpu_free)]
        if mem_free is not None:
            asks, masks = self.memory
            host &= masks[bisect_right(asks, mem_free)]
        gpus = self.gpu_free
        desc = sorted((f for _, f in gpu_view), reverse=True)
        n = len(desc)
        for count, asks, masks in self.gpus:
            if count > n:
                break
            gpus |= masks[bisect_right(asks, desc[count - 1])]
        return host & gpus


class ClusterState:
    """Where every node stands, interned by state, and the policy's best node for a demand.

    Demands are numbered once (`pod_demand[k]`: pod k's demand id), so the memo is a small dict per state
    (demand id -> evaluation): a state lives for a few events and few demands ask about it, and a full row
    per state and per node key was most of what a run allocated (and what its caches missed on).
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
        # Evaluations shared between demands and states (see SCORE_INPUTS): per demand its class (the same
        # GPU shape, and CPU for "gpus+cpu"), evaluated once per node key (the GPUs, and free CPU) with a
        # representative demand that asks no memory (and no CPU for "gpus"), for a node the demand fits on
        # CPU and memory (`cannot_fit`'s host test, which is `eligible_positions`').
        self.inputs = score_inputs(policy) if self.cacheable else None
        self._cls: list[int] = []
        self._reps: list[Demand] = []
        if self.inputs is not None:
            classes: dict[tuple, int] = {}
            for d in self.demands:
                cpu = d.cpu if self.inputs == "gpus+cpu" else 0
                key = (d.per_gpu, d.count, d.models, cpu)
                c = classes.get(key)
                if c is None:
                    c = classes[key] = len(self._reps)
                    self._reps.append(Demand(d.per_gpu, d.count, d.models, cpu, 0))
                self._cls.append(c)
        self._shared: dict[tuple, dict] = {}  # node key -> evaluation per class (class id -> evaluation)
        self._srow: dict[int, dict] = {}  # state id -> its node key's row of `_shared`
        # Node state interning: view -> state id; state id -> sorted node indices in that state.
        self.state_ids: dict[NodeView, int] = {}
        self.state_views: dict[int, NodeView] = {}
        self.members: dict[int, list[int]] = {}
        self.memo: dict[int, dict[int, placement.Evaluation]] = {}  # state id -> demand id -> evaluation
        self.node_state: list[int] = []
        self._next_id = 0
        # Per live state the demands it may fit (`FitIndex`; state ids are never reused). The indexed
        # chooser keeps buckets by score per demand, and per demand the states born since it last asked
        # that it may fit (`_pending`), handed only to the demands whose buckets are current (`_listening`,
        # a bit each); a demand out of it (never asked yet, or its pending list outgrew the live states)
        # rebuilds its buckets from the live states when it asks.
        self.fit = FitIndex(self.demands)
        self.fitmask: dict[int, int] = {}
        self._heaps: list[list[float]] = [[] for _ in self.demands]  # per demand: -score of its buckets
        self._buckets: list[dict[float, list[int]]] = [{} for _ in self.demands]  # score -> state ids
        self._pending: list[list[int]] = [[] for _ in self.demands]
        # Per demand, the states put in its buckets since they were last rebuilt: only the best bucket is
        # cleaned of states that died, so the rest grow with every state the demand was shown (for frag,
        # whose scores rarely repeat, a bucket per state); past twice the live states they are rebuilt.
        self._filled: list[int] = [0] * len(self.demands)
        self._fit_states: list[list[int]] = [[] for _ in self.demands]  # `_fitting_states`' per demand
        self.rebuilds = 0  # buckets built from the live states (a demand's first ask, a backlog, dead states)
        self._listening = 0
        self._births = 0
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
            self.memo[sid] = {}
            mask = self.fitmask[sid] = self.fit.mask(view)
            mask &= self._listening
            pending = self._pending
            while mask:  # hand the new state to every demand it may fit that keeps its buckets up to date
                low = mask & -mask
                pending[low.bit_length() - 1].append(sid)
                mask ^= low
            self._births += 1
            if not self._births & 1023:
                self._trim_pending()
            if self.inputs is not None:
                self._srow[sid] = self._shared_row(view)
        return sid

    def _trim_pending(self) -> None:
        """Bound the memory of demands that stopped asking: a pending list longer than the live states is
        dropped, its demand rebuilds from the live states when it next asks (as it would anyway)."""
        live = len(self.members)
        for dix, pending in enumerate(self._pending):
            if len(pending) > live:
                pending.clear()
                self._listening &= ~(1 << dix)

    SHARED_LIMIT = 200_000  # node keys kept; past it the table starts afresh (live states keep their rows)

    def _shared_row(self, view: NodeView) -> dict:
        key = view[0] if self.inputs == "gpus" else (view[0], view[1])
        row = self._shared.get(key)
        if row is None:
            if len(self._shared) >= self.SHARED_LIMIT:
                self._shared = {}
            row = self._shared[key] = {}
        return row

    def _evaluate_fitting(self, sid: int, dix: int) -> placement.Evaluation:
        """The policy's answer for state `sid` and demand `dix`, which passed the host test of `cannot_fit`:
        shared within the demand's class where SCORE_INPUTS allows."""
        if self.inputs is None:
            return self.evaluate(self.state_views[sid], self.demands[dix])
        row = self._srow[sid]
        c = self._cls[dix]
        ev = row.get(c, _MISSING)
        if ev is _MISSING:
            ev = row[c] = self.evaluate(self.state_views[sid], self._reps[c])
        return ev

    def forget_evaluations(self) -> None:
        """Drop every memoised evaluation and the indexed chooser's buckets: the policy's answers changed
        (issue 40's `RoomForWaiting` when the waiting shapes change). They are rebuilt as demands ask."""
        for sid in self.memo:
            self.memo[sid] = {}
        for heap in self._heaps:
            heap.clear()
        for buckets in self._buckets:
            buckets.clear()
        for pending in self._pending:
            pending.clear()
        self._listening = 0
        if self.inputs is not None:
            self._shared = {}
            for sid in self.memo:
                self._srow[sid] = self._shared_row(self.state_views[sid])

    def view(self, node: int) -> NodeView:
        return self.state_views[self.node_state[node]]

    def evaluation(self, sid: int, dix: int) -> placement.Evaluation:
        """The policy's answer for a node in state `sid` and demand `dix` (memoised if cacheable)."""
        if not self.cacheable:
            return self.evaluate(self.state_views[sid], self.demands[dix])
        row = self.memo[sid]
        ev = row.get(dix, _MISSING)
        if ev is _MISSING:
            ev = row[dix] = None if self.cannot_fit(sid, dix) else self._evaluate_fitting(sid, dix)
        return ev

    def _fitting(self, dix: int) -> Iterator[tuple[int, placement.Evaluation]]:
        """Each node state the demand fits, with its evaluation (worked out once per state and demand)."""
        memo, views, evaluate, demand = self.memo, self.state_views, self.evaluate, self.demands[dix]
        for sid in self.members:
            row = memo[sid]
            ev = row.get(dix, _MISSING)
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

    def cannot_fit(self, sid: int, dix: int) -> bool:
        """True when the demand surely does not fit state `sid` (too little CPU, memory, or too few GPUs
        with room, whatever their model): `eligible_positions` would say None. False: maybe it fits."""
        return not self.fitmask[sid] >> dix & 1

    def fits(self, sid: int, dix: int) -> bool:
        """Whether demand `dix` fits a node in state `sid` (the policy's own answer where it is cacheable)."""
        if self.cacheable:
            return self.evaluation(sid, dix) is not None
        row = self.memo[sid]
        ok = row.get(dix, _MISSING)
        if ok is _MISSING:
            ok = row[dix] = not self.cannot_fit(sid, dix) and (
                placement.eligible_positions(self.state_views[sid], self.demands[dix]) is not None
            )
        return ok

    def best_indexed(self, dix: int, rng: random.Random | None = None) -> tuple[int, placement.Evaluation] | None:
        """`best`'s choice, found without scanning every state (the timeline's hot path).

        Cacheable policies: per demand, the states it fits in buckets by score (state ids in birth order)
        under a heap of the scores, over the states alive when the demand last asked, topped up from the
        states born since that it may fit (`FitIndex`), and cleaned lazily of states no node is in any
        more: only the best bucket is read, however many states tie in it (fgd ties dozens). Ties: the
        first node, or for `random_ties` a uniform pick among the tied nodes (states in id order), no draw
        when one node is best. A policy that is not cacheable is asked node by node (`best`), unless it
        says `uniform_scores` (random): it scores every node independently and uniformly, so its best
        node is a uniform pick among the nodes that fit: drawn with `rng` (rejection sampling, then a
        scan), and placed on the GPUs its own `evaluate` picks there."""
        if not self.cacheable:
            if not getattr(self.policy, "uniform_scores", False):
                return self.best(dix)
            return self._uniform_fit(dix, rng if rng is not None else random.Random(0))
        heap = self._heaps[dix]
        buckets = self._buckets[dix]
        members = self.members
        pending = self._pending[dix]
        bit = 1 << dix
        if (
            not self._listening & bit
            or len(pending) > len(members)  # more news than states: from the live states
            or self._filled[dix] > 2 * len(members) + self.REBUILD_SLACK  # mostly dead states: afresh
        ):
            self._listening |= bit
            pending.clear()
            heap.clear()
            buckets.clear()
            self._filled[dix] = 0
            self.rebuilds += 1
            fitmask = self.fitmask
            self._top_up(heap, buckets, dix, [sid for sid in members if fitmask[sid] & bit])
        elif pending:
            self._top_up(heap, buckets, dix, pending)
            pending.clear()
        while True:
            if not heap:
                return None
            top = heap[0]
            bucket = buckets[top]
            tied = [sid for sid in bucket if sid in members]
            if tied:
                break
            del buckets[top]
            heapq.heappop(heap)
        if len(tied) < len(bucket):
            buckets[top] = tied
        if self.tie_rng is not None:
            total = sum(len(members[sid]) for sid in tied)
            pick = self.tie_rng.randrange(total) if total > 1 or self.draw_single_tie else 0
            for sid in tied:
                if pick < len(members[sid]):
                    return members[sid][pick], self.memo[sid][dix]
                pick -= len(members[sid])
            raise AssertionError("unreachable: pick < total")  # pragma: no cover
        sid = tied[0] if len(tied) == 1 else min((members[sid][0], sid) for sid in tied)[1]
        return members[sid][0], self.memo[sid][dix]

    REBUILD_SLACK = 1024  # states a demand's buckets may hold beyond twice the live ones before a rebuild

    def _top_up(self, heap: list[float], buckets: dict[float, list[int]], dix: int, sids: Iterable[int]) -> None:
        """Add every live state of `sids` (in id order) the demand fits to its score's bucket, evaluating
        where needed. `sids` passed the demand's `FitIndex` test (the host test of `cannot_fit`): the
        policy decides."""
        memo, views = self.memo, self.state_views
        demand = self.demands[dix]
        evaluate = self.evaluate
        push = heapq.heappush
        shared = self.inputs
        if shared is not None:
            srows, c = self._srow, self._cls[dix]
            rep = self._reps[c]
        filled = 0
        for sid in sids:
            row = memo.get(sid)
            if row is None:  # born and gone since this demand last asked
                continue
            ev = row.get(dix, _MISSING)
            if ev is _MISSING:
                if shared is None:
                    ev = row[dix] = evaluate(views[sid], demand)
                else:
                    srow = srows[sid]
                    ev = srow.get(c, _MISSING)
                    if ev is _MISSING:
                        ev = srow[c] = evaluate(views[sid], rep)
                    row[dix] = ev
            if ev is not None:
                filled += 1
                key = -ev[0]
                bucket = buckets.get(key)
                if bucket is None:
                    buckets[key] = [sid]
                    push(heap, key)
                else:
                    bucket.append(sid)
        self._filled[dix] += filled

    UNIFORM_TRIES = 16  # `_uniform_fit`'s draws before it scans

    def refuse(self, rng: random.Random | None) -> None:
        """What `best_indexed` would spend on a demand the caller knows fits nowhere: nothing, but a
        `uniform_scores` policy's rejection draws, so that the pick stream stays the one a search leaves."""
        if rng is not None and not self.cacheable and getattr(self.policy, "uniform_scores", False):
            n = len(self.node_state)
            for _ in range(self.UNIFORM_TRIES):
                rng.randrange(n)

    def _uniform_fit(self, dix: int, rng: random.Random) -> tuple[int, placement.Evaluation] | None:
        """A node drawn uniformly among those the demand fits, with the policy's evaluation there."""
        node_state, fitmask, fits = self.node_state, self.fitmask, self.fits
        n = len(node_state)
        bit = 1 << dix
        for _ in range(self.UNIFORM_TRIES):  # rejection sampling: exact, and quick while many nodes fit
            node = rng.randrange(n)
            sid = node_state[node]
            if fitmask[sid] & bit and fits(sid, dix):  # `FitIndex` first: in a full cluster few pass
                break
        else:
            states = self._fitting_states(dix)
            if not states:
                return None
            members = self.members
            fitting = sorted([i for sid in states for i in members[sid]])
            node = fitting[rng.randrange(len(fitting))]
        ev = self.evaluate(self.state_views[node_state[node]], self.demands[dix])
        if ev is None:  # pragma: no cover - fits() and evaluate() disagree: a policy bug
            raise AssertionError(f"{self.policy!r} refused node {node} that fits")
        return node, ev

    def _fitting_states(self, dix: int) -> list[int]:
        """The live states demand `dix` fits (`fits`), for `_uniform_fit`'s scan once its draws missed: kept
        per demand as the buckets are (the states born since it last asked that `FitIndex` lets through,
        checked then; the dead dropped), as a full cluster makes the scan the common case (random at rho
        1.2: half its run went to walking every state at every arrival). In birth order, as a walk of the
        live states gives them (the caller sorts their nodes anyway)."""
        members = self.members
        pending = self._pending[dix]
        bit = 1 << dix
        fits = self.fits
        if not self._listening & bit or len(pending) > len(members):
            self._listening |= bit
            self.rebuilds += 1
            fitmask = self.fitmask
            states = [sid for sid in members if fitmask[sid] & bit and fits(sid, dix)]
        else:
            states = [sid for sid in self._fit_states[dix] if sid in members]
            states += [sid for sid in pending if sid in members and fits(sid, dix)]
        pending.clear()
        self._fit_states[dix] = states
        return states

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
        if new == old:  # nothing moved (a demand of nothing): the state and its members stand
            return
        self.node_state[node] = new
        old_members = self.members[old]
        old_members.remove(node)
        if not old_members:
            del self.members[old]  # no node is in the old state any more: forget it (a churning cluster makes many)
            del self.memo[old]
            del self.fitmask[old]
            self._srow.pop(old, None)
            del self.state_ids[self.state_views.pop(old)]
        new_members = self.members.setdefault(new, [])
        new_members.append(node)
        if len(new_members) > 1:
            new_members.sort()
