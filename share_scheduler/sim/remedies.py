"""Issue 40's remedies in share-sim's timeline: room for what waits, reservations, consolidation.

The decisions are share_placement.starvation's (the extender calls the same functions); what the holds
take is share_core.holds' `held_units`, as filter counts them. This module only wires them into the
timeline (timeline.py):

- **Room for what waits** (`leave_room`): the policy is wrapped in `RoomForWaiting`, told after every
  event which multi-GPU shapes wait (and those that waited within `linger_s`: a shape that just got its
  room is likely to wait again); the memoised evaluations are forgotten whenever that set changes.
- **Reservations** (`reserve`): every `tick_s` (the extender's loop), `plan_reservations` over the
  waiting pods; holds are dropped when their pod is placed (anywhere) or they expire, and the held node
  is retried then, as its room reappears for the others. A reservation due to expire before the next
  tick while its pod waits, on a node that drained since it was made (`keeps_draining`), is planned
  again (renewed on its node while that is the soonest, else moved); one on a node that did not ends.
- **Consolidation** (`consolidate`): every tick, the first waiting pod in queue order past the threshold
  whose last try is `retry_s` old gets `plan_consolidation` (at most `max_moves` pods moved), within an
  eviction rate (`evictions_per_minute`, a token bucket). In the sim the plan happens at once (the
  extender holds the GPUs until the pods are bound): the waiting pod is placed on its GPUs, the moved
  pods where the plan says, each running its whole duration anew (an evicted pod restarts: its work so
  far is lost, as the timeline's `release` models it).
- **Movability**: which pods a controller would recreate is not in the trace; each arrival is drawn
  movable with probability `movable_fraction` (seeded per run, the same draw whatever the policy).

`evictions` counts the pods consolidation moved at or after the warm-up; the figures report them per
1,000 pods placed in the measured window (`evictions_per_1000_placed`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import held_units
from share_core.holds import reservations_yield
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import NodeView
from share_placement import Policy
from share_placement.room import Host
from share_placement.room import RoomForWaiting
from share_placement.room import hosted_shape
from share_placement.starvation import ConsolidationPlan
from share_placement.starvation import Overlay
from share_placement.starvation import ReservationLimits
from share_placement.starvation import Resident
from share_placement.starvation import Waiter
from share_placement.starvation import plan_consolidation
from share_placement.starvation import plan_reservations
from share_placement.starvation import queue_order
from share_placement.starvation import renewal_horizon
from share_placement.waiting_shapes import LINGER_S
from share_placement.waiting_shapes import WaitingShapes
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.timeline import Timeline
from share_scheduler.sim.timeline import TimelineHooks
from share_scheduler.sim.timeline import TimelineResult
from share_scheduler.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class RemedyOptions:
    """Which remedies run, and their knobs (the CLI's --reserve, --consolidate, --leave-room and friends)."""

    leave_room: bool = False
    reserve: bool = False
    consolidate: bool = False
    limits: ReservationLimits = field(default_factory=ReservationLimits)
    min_gpus: int = 2  # reservations and consolidation are for pods asking at least this many GPUs
    tick_s: float = 60.0
    linger_s: float = LINGER_S
    consolidate_after_s: float = 600.0
    retry_s: float = 600.0
    max_moves: int = 2
    evictions_per_minute: float = 2.0
    movable_fraction: float = 0.5
    # A reservation yields to a pod below `min_gpus` that has waited longer than this (s): it sees the held GPUs
    # as free, so a hold redirects small pods but makes none wait much longer than this (pods the
    # remedies serve keep seeing it: reservations order them). None: reservations never yield.
    yield_after_s: float | None = None

    def __post_init__(self) -> None:
        if self.min_gpus < 1 or not self.tick_s > 0 or self.linger_s < 0 or self.consolidate_after_s < 0:
            raise ValueError("remedies: min_gpus >= 1, tick_s > 0, linger_s >= 0 and consolidate_after_s >= 0")
        if self.retry_s < 0 or self.max_moves < 1 or self.evictions_per_minute < 0:
            raise ValueError("remedies: retry_s >= 0, max_moves >= 1 and evictions_per_minute >= 0")
        if not 0.0 <= self.movable_fraction <= 1.0:
            raise ValueError(f"remedies: movable_fraction must be in [0, 1], got {self.movable_fraction}")
        if self.yield_after_s is not None and self.yield_after_s < 0:
            raise ValueError(f"remedies: yield_after_s must be >= 0 (or None), got {self.yield_after_s}")

    @property
    def any(self) -> bool:
        return self.leave_room or self.reserve or self.consolidate


def _uid(seq: int) -> str:
    return f"a{seq}"


def _seq(uid: str) -> int:
    return int(uid[1:])


def held_view(view: NodeView, held: dict[int, int]) -> NodeView:
    """The view with `held` units (view position -> units; positions are GPU indices in the sim) taken."""
    gpus = tuple((m, max(0, f - held.get(i, 0))) for i, (m, f) in enumerate(view[0]))
    return (gpus, view[1], view[2])


class RemedyHooks(TimelineHooks):
    """The remedies' state over one run: the holds, the shapes that wait, the eviction budget."""

    def __init__(self, workload: Workload, arrivals: list[Arrival], options: RemedyOptions, seed: int) -> None:
        self.options = options
        self.holds: list[Hold] = []
        self.evictions = 0
        self.plans = 0
        self.names = [n.name for n in workload.nodes]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.totals = [n.gpus for n in workload.nodes]
        rng = random.Random(f"movable-{seed}")
        self.movable = [rng.random() < options.movable_fraction for _ in arrivals]
        self._next_tick = 0.0
        self._tokens = options.evictions_per_minute  # the bucket starts with one minute's worth
        self._tokens_at = 0.0
        self._last_try: dict[int, float] = {}
        self._shapes = WaitingShapes(options.linger_s)
        # Each node as `hosted_shape` weighs it, and each demand's shape narrowed to the models that could host it.
        self.hosts: tuple[Host, ...] = tuple({(n.model, len(n.gpus), n.cpu, n.memory) for n in workload.nodes})
        self._hosted: dict[int, Demand] = {}
        self._states: dict[int, tuple[int, NodeState]] = {}
        self._held_key: tuple = ()
        self._held_until = math.inf
        self._held_cache: dict[tuple[int, int | None, bool], dict[int, NodeView] | None] = {}
        self._yield_next = 0  # the first arrival not yet past `yield_after_s` (arrivals are in time order)

    def yielded(self, timeline: Timeline, seq: int) -> bool:
        """Whether reservations yield to arrival `seq`: a pod below `min_gpus` GPUs that has waited longer
        than `yield_after_s`. Strictly longer: at its arrival a pod always sees the holds (they redirect
        it), so S = 0 yields only to a pod that found no other room and is still waiting."""
        after = self.options.yield_after_s
        if after is None:
            return False
        a = timeline.arrivals[seq]
        count = timeline.workload.pods[a.pod].count
        return reservations_yield(count, self.options.min_gpus, timeline.now - a.time, after)

    # --- what a pod sees ---
    def held(self, timeline: Timeline, seq: int) -> dict[int, NodeView] | None:
        if not self.holds:
            return None
        pod = timeline.arrivals[seq].pod
        priority = timeline.pod_priority[pod]
        uid = _uid(seq)
        # Pods of one priority that hold nothing see the same holds: one answer for them all while the
        # holds, the held nodes' states and the holds' expiries stand (the queue asks it per pod).
        holds = tuple(self.holds)
        node_state = timeline.cluster.node_state
        key = (holds, tuple(node_state[self.index[h.node]] for h in holds))
        if key != self._held_key or timeline.now >= self._held_until:
            self._held_key = key
            self._held_until = min((h.expires for h in holds if not h.expired(timeline.now)), default=math.inf)
            self._held_cache.clear()
        holder = any(h.holder_uid == uid for h in holds)
        yielded = self.yielded(timeline, seq)
        sig = (priority, seq if holder else None, yielded)
        if sig in self._held_cache:
            return self._held_cache[sig]
        taken = held_units(holds, priority, uid, now=timeline.now, yielded=yielded)
        out = (
            {self.index[n]: held_view(timeline.cluster.view(self.index[n]), g) for n, g in taken.items()}
            if taken
            else None
        )
        self._held_cache[sig] = out
        return out

    # --- after every event ---
    def after_event(self, timeline: Timeline, now: float) -> None:
        o = self.options
        if o.leave_room:
            self._update_shapes(timeline, now)
        if self.holds:
            self._drop_holds(timeline, now)
        if o.yield_after_s is not None:
            self._yield_to_the_waiting(timeline, now)
        if now >= self._next_tick:
            self._next_tick = now + o.tick_s
            if o.consolidate:
                self._consolidate(timeline, now)
            if o.reserve:
                self._reserve(timeline, now)

    def _yield_to_the_waiting(self, timeline: Timeline, now: float) -> None:
        """Pods that have just waited `yield_after_s` see the reserved GPUs as free: retry the held nodes
        for them (kube-scheduler retries a waiting pod on every cluster event; here, its first event past
        the bound)."""
        assert self.options.yield_after_s is not None
        bound = now - self.options.yield_after_s
        arrivals, started, pods = timeline.arrivals, timeline.started, timeline.workload.pods
        small = self.options.min_gpus
        crossed = False
        k = self._yield_next
        while k < len(arrivals) and arrivals[k].time < bound:  # waited longer than S (`yielded`)
            crossed = crossed or (started[k] is None and pods[arrivals[k].pod].count < small)
            k += 1
        self._yield_next = k
        if crossed and self.holds:
            for node in sorted({self.index[h.node] for h in self.holds if h.kind is HoldKind.RESERVATION}):
                timeline.retry_on(node)

    def _update_shapes(self, timeline: Timeline, now: float) -> None:
        demands = timeline.cluster.demands
        hosted = self._hosted
        for dix in timeline.queues:
            if dix not in hosted:
                hosted[dix] = hosted_shape(demands[dix], self.hosts)
        seen = self._shapes.update((hosted[dix] for dix in timeline.queues), now)
        policy = timeline.policy
        if isinstance(policy, RoomForWaiting) and policy.set_waiting(seen):
            timeline.cluster.forget_evaluations()

    def _drop_holds(self, timeline: Timeline, now: float) -> None:
        keep: list[Hold] = []
        freed: set[int] = set()
        for h in self.holds:
            if h.expired(now) or timeline.started[_seq(h.holder_uid)] is not None:
                freed.add(self.index[h.node])
            else:
                keep.append(h)
        if freed:
            self.holds = keep
            for node in sorted(freed):  # the held room is there for the others now
                timeline.retry_on(node)

    # --- the cluster as the pure rules see it ---
    def node_states(self, timeline: Timeline) -> list[NodeState]:
        """Every node as a NodeState (rebuilt only for nodes whose state changed since last asked)."""
        out = []
        cluster = timeline.cluster
        for i, sid in enumerate(cluster.node_state):
            cached = self._states.get(i)
            if cached is None or cached[0] != sid:
                gpus, cpu, mem = cluster.state_views[sid]
                slots = tuple(GpuSlot(g, m, self.totals[i][g], f) for g, (m, f) in enumerate(gpus))
                cached = self._states[i] = (sid, NodeState(self.names[i], slots, cpu, mem))
            out.append(cached[1])
        return out

    def waiters(self, timeline: Timeline, now: float, after_s: float) -> list[Waiter]:
        """The waiting pods asking at least `min_gpus` GPUs that have waited `after_s`, in queue order."""
        demands, pod_demand = timeline.cluster.demands, timeline.cluster.pod_demand
        out = []
        for seq, pod, since in timeline.waiting():
            d = demands[pod_demand[pod]]
            if d.count >= self.options.min_gpus and now - since >= after_s:
                out.append(Waiter(_uid(seq), timeline.workload.pods[pod].name, timeline.pod_priority[pod], since, d))
        return out

    # --- reservations ---
    def _reserve(self, timeline: Timeline, now: float) -> None:
        limits = self.options.limits
        live = [h for h in self.holds if not h.expired(now)]
        # A reservation about to expire is planned again now (plan_reservations' renew_within: only where its
        # node kept draining), so the room drained under it stays its pod's while that node is the soonest.
        horizon = renewal_horizon(self.options.tick_s, limits)
        due = {h.holder_uid for h in live if h.kind is HoldKind.RESERVATION and h.expires - now <= horizon}
        if len(live) >= limits.max_holds and not due:
            return
        holders = {h.holder_uid for h in live}
        waiters = [w for w in self.waiters(timeline, now, limits.after_s) if w.uid not in holders or w.uid in due]
        if not waiters:
            return
        # As the extender does (`_node_refuses`): each pod over the nodes that could ever host it, the
        # node's whole CPU and memory against the pod's (a pod asking 120 cores never runs on a 96-core
        # node, however much of it drains); one pod at a time, in queue order, each seeing the holds made.
        nodes = self.node_states(timeline)
        hosts = [(n.cpu, n.memory) for n in timeline.workload.nodes]
        current = live
        left: set[int] = set()  # nodes a renewal moved away from: their room is for the queue again
        for w in queue_order(waiters):
            d = w.demand
            fit = [
                node
                for node, (cpu, mem) in zip(nodes, hosts, strict=True)
                if (cpu is None or cpu >= d.cpu) and (mem is None or mem >= d.memory)
            ]
            for hold in plan_reservations([w], fit, current, now, limits, timeline.capacity, renew_within=horizon):
                old = [h for h in current if h.kind is HoldKind.RESERVATION and h.holder_uid == hold.holder_uid]
                left.update(self.index[h.node] for h in old if h.node != hold.node)
                current = [h for h in current if not any(h is o for o in old)] + [hold]
        self.holds = [h for h in self.holds if h.expired(now)] + current
        for node in sorted(left):
            timeline.retry_on(node)

    # --- consolidation ---
    def _take_tokens(self, now: float) -> float:
        rate = self.options.evictions_per_minute / 60.0
        cap = max(self.options.evictions_per_minute, float(self.options.max_moves))
        self._tokens = min(cap, self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        return self._tokens

    def _consolidate(self, timeline: Timeline, now: float) -> None:
        o = self.options
        if self._take_tokens(now) < 1:
            return
        due = [
            w
            for w in queue_order(self.waiters(timeline, now, o.consolidate_after_s))
            if now - self._last_try.get(_seq(w.uid), -1e18) >= o.retry_s
        ]
        if not due:
            return
        waiter = due[0]
        self._last_try[_seq(waiter.uid)] = now
        nodes = self.node_states(timeline)
        residents = self.residents(timeline)
        held: dict[str, dict[int, int]] = {}
        if self.holds:
            held = held_units(self.holds, waiter.priority, waiter.uid, now=now)
        plan, _ = plan_consolidation(
            waiter,
            nodes,
            residents,
            max_moves=min(o.max_moves, int(self._tokens)),
            placer=self._placer(timeline),
            held=held,
        )
        if plan is not None:
            self._apply(timeline, plan, now)

    def residents(self, timeline: Timeline) -> _Residents:
        """The running GPU pods per node, each movable as drawn for its arrival (built per node on demand)."""
        by_node: dict[int, list[int]] = {}
        for seq, (node, _) in timeline.where.items():
            by_node.setdefault(node, []).append(seq)
        return _Residents(self, timeline, by_node)

    def _placer(self, timeline: Timeline):
        """The policy's own choice on the cluster as a plan's overlay changes it (the memo for the rest)."""
        cluster = timeline.cluster
        index, totals = self.index, self.totals

        def place(demand: Demand, overlay: Overlay) -> tuple[str, tuple[int, ...]] | None:
            dix = cluster.demand_ids[demand]
            changed: dict[int, NodeView] = {}
            for name in set(overlay.gpu) | set(overlay.cpu):
                i = index[name]
                gpus, cpu, mem = cluster.view(i)
                g = overlay.gpu.get(name, {})
                new_gpus = tuple((m, min(totals[i][k], max(0, f - g.get(k, 0)))) for k, (m, f) in enumerate(gpus))
                changed[i] = (
                    new_gpus,
                    None if cpu is None else cpu - overlay.cpu.get(name, 0),
                    None if mem is None else mem - overlay.memory.get(name, 0),
                )
            best_score = float("-inf")
            best: tuple[int, tuple[int, ...]] | None = None
            for node, sid in enumerate(cluster.node_state):
                view = changed.get(node)
                ev = cluster.evaluation(sid, dix) if view is None else cluster.evaluate(view, demand)
                if ev is not None and ev[0] > best_score:
                    best_score, best = ev[0], (node, ev[1])
            if best is None:
                return None
            return self.names[best[0]], tuple(best[1])

        return place

    def _apply(self, timeline: Timeline, plan: ConsolidationPlan, now: float) -> None:
        """Carry the plan out at once: the moved pods leave their GPUs, the waiting pod takes its GPUs,
        the moved pods take their new ones and run their whole duration anew (an evicted pod restarts)."""
        moved = [_seq(m.pod.uid) for m in plan.moves]
        for seq in moved:
            timeline.release(seq)
        waiter = _seq(plan.waiter.uid)
        timeline.unqueue(waiter)
        timeline.place(waiter, self.index[plan.node], plan.gpus)
        for m, seq in zip(plan.moves, moved, strict=True):
            timeline.place(seq, self.index[m.node], m.gpus)
        self._tokens -= len(plan.moves)
        self.plans += 1
        if now >= timeline.warmup_s:
            self.evictions += len(plan.moves)
        # Room the moves left on other GPUs of the plan's node (nothing else gained room).
        timeline.retry_on(self.index[plan.node])


class _Residents(Mapping[str, Sequence[Resident]]):
    """node name -> the GPU pods running there, as `Resident`s, made only for the nodes a plan looks at."""

    def __init__(self, hooks: RemedyHooks, timeline: Timeline, by_node: dict[int, list[int]]) -> None:
        self._hooks, self._tl, self._by_node = hooks, timeline, by_node
        self._made: dict[str, list[Resident]] = {}

    def __getitem__(self, name: str) -> list[Resident]:
        made = self._made.get(name)
        if made is not None:
            return made
        tl, hooks = self._tl, self._hooks
        node = hooks.index.get(name)
        if node is None:
            raise KeyError(name)
        demands, pod_demand, pods = tl.cluster.demands, tl.cluster.pod_demand, tl.workload.pods
        made = []
        for seq in self._by_node.get(node, ()):
            pod = tl.arrivals[seq].pod
            d = demands[pod_demand[pod]]
            if d.count:
                positions = tl.where[seq][1]
                made.append(
                    Resident(
                        _uid(seq),
                        pods[pod].name,
                        name,
                        tuple(positions),
                        d,
                        hooks.movable[seq],
                        priority=tl.pod_priority[pod],
                    )
                )
        self._made[name] = made
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._hooks.names[n] for n in self._by_node)

    def __len__(self) -> int:
        return len(self._by_node)


class RemedyTimeline(Timeline):
    """The timeline with the remedies' hooks, and two shortcuts that keep it as fast as without them:
    the grouped retry while no hold exists, and the indexed choice when its pick is not a held node."""

    hooks: RemedyHooks
    exact_retry = False  # True: the pod-by-pod retry on held nodes (the reference the fast one equals)

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        arrivals: list[Arrival],
        warmup_s: float,
        end_s: float,
        seed: int,
        hooks: RemedyHooks,
        sample_s: float | None = None,
    ) -> None:
        if hooks.options.leave_room and not isinstance(policy, RoomForWaiting):
            policy = RoomForWaiting(policy)
        super().__init__(workload, policy, arrivals, warmup_s, end_s, seed, hooks, "node", sample_s)

    def _choose(self, seq: int):
        held = self.hooks.held(self, seq)
        dix = self.cluster.pod_demand[self.arrivals[seq].pod]
        if not held:
            return self.cluster.best_indexed(dix, self._pick_rng)
        # The best node seen without holds; if it is not held, only the held nodes (seen as the pod sees
        # them) can beat it: scores are per node, so no other node changed.
        pick = self.cluster.best_indexed(dix, self._pick_rng)
        if pick is None or pick[0] in held:
            return self._choose_held(dix, held)
        demand = self.cluster.demands[dix]
        for node, view in held.items():
            ev = self.cluster.evaluate(view, demand)
            if ev is not None and ev[0] > pick[1][0]:
                pick = (node, ev)
        return pick

    def result(self, seconds: float = 0.0) -> TimelineResult:
        out = super().result(seconds)
        out.evictions = self.hooks.evictions
        return out

    def retry_on(self, node: int) -> None:
        if not self.queues:
            return
        name = self.hooks.names[node]
        here = [h for h in self.hooks.holds if h.node == name and not h.expired(self.now)]
        if here and (self.exact_retry or self.hooks.options.yield_after_s is not None):
            # Yielding reservations: a pod later in its demand's queue may have waited longer than the
            # head and see less held, so the head-and-holders shortcut below does not hold: pod by pod.
            super().retry_on(node)
            return
        if here:
            self._retry_held_node(node, here)
            return
        # No hold on this node: every waiting pod sees the same room there, and the retry places only
        # there, so the grouped retry (one check per demand) is the pod-by-pod one.
        hooks, self.hooks = self.hooks, None
        try:
            super().retry_on(node)
        finally:
            self.hooks = hooks

    def _retry_held_node(self, node: int, here: list[Hold]) -> None:
        """The pod-by-pod retry on a held node, checking only the pods that could be first to fit.

        A hold applies to pods of its priority or lower (`Hold.applies_to`), so within one demand a pod
        later in queue order (priority no higher) that holds nothing sees the holds its head sees, and
        more: if the head does not fit, it does not either. The candidates are each demand's head and
        every waiting holder of a hold here; the first in queue order that fits is the one the pod-by-pod
        retry would place, and after it room only shrank (`exact_retry` runs that reference)."""
        holders = {_seq(h.holder_uid) for h in here}
        cluster = self.cluster
        pods, prio = self.arrivals, self.pod_priority
        while self.queues:
            view = cluster.view(node)
            sid = cluster.node_state[node]
            seen: dict[tuple, NodeView] = {}
            candidates = {heap[0] for heap in self.queues.values()}
            for seq in holders:
                if self.started[seq] is None and seq < len(pods):
                    key = (-prio[pods[seq].pod], seq)
                    if key in self.queues.get(cluster.pod_demand[pods[seq].pod], ()):
                        candidates.add(key)
            placed = False
            for key in sorted(candidates):
                seq = key[1]
                p = prio[pods[seq].pod]
                taken = held_units(here, p, _uid(seq), now=self.now).get(self.hooks.names[node])
                dix = cluster.pod_demand[pods[seq].pod]
                if not taken:
                    ev = cluster.evaluation(sid, dix)
                else:
                    sig = (p, seq if seq in holders else None)
                    reduced = seen.get(sig)
                    if reduced is None:
                        reduced = seen[sig] = held_view(view, taken)
                    ev = cluster.evaluate(reduced, cluster.demands[dix])
                if ev is not None:
                    self.unqueue(seq)
                    self.place(seq, node, ev[1])
                    placed = True
                    break
            if not placed:
                return


def simulate_with_remedies(
    workload: Workload,
    policy: Policy,
    arrivals: list[Arrival],
    warmup_s: float,
    end_s: float,
    options: RemedyOptions,
    seed: int = 0,
    sample_s: float | None = None,
) -> TimelineResult:
    """`simulate_timeline` with the remedies `options` turns on (the policy wrapped to leave room when
    `leave_room`); the result carries the evictions consolidation made in the measured window."""
    started = time.perf_counter()
    hooks = RemedyHooks(workload, arrivals, options, seed)
    tl = RemedyTimeline(workload, policy, arrivals, warmup_s, end_s, seed, hooks, sample_s)
    tl.run()
    return tl.result(time.perf_counter() - started)
