"""Priority preemption in share-sim's timeline (`share-sim timeline --preempt on`): the extender's rule, in time.

When a pod fits nowhere, kube-scheduler runs its PostFilter (DefaultPreemption) in the same cycle; with
gpushare the victims are chosen per GPU by `share_placement.preemption.choose_victims`, the function the
extender's preempt verb and its own preemption call. Here the same function runs on the simulated node
states, and what follows is what kube-scheduler and the pods' controllers do:

- **Who preempts.** A pod that fits nowhere, at its arrival and, while it waits, again every
  `retry_s` (default 300 s: kube-scheduler moves every unschedulable pod back to its active queue after
  `podMaxInUnschedulablePodsDuration`, 5 min, and runs PostFilter on each failed try; retries on other
  events are not modelled for preemption, only for placement). Never a pod whose earlier preemption is
  still under way (its hold is live), as `PodEligibleToPreemptOthers` refuses a pod whose nominated node
  still has terminating victims. Only pods of lower priority are victims.
- **Which nodes.** As `DryRunPreemption` (pkg/scheduler/framework/preemption/preemption.go): the nodes
  from a random offset, until `max(10 % of them, 100)` candidates are found (`calculateNumCandidates`,
  defaultpreemption's minCandidateNodesPercentage 10 / minCandidateNodesAbsolute 100); the best of those
  by kube-scheduler's candidate order (`choose_victims` sorts by it). A node is looked at only if evicting
  every lower-priority pod could make room there (a quick bound before the exact search).
- **Victims.** Deleted with a grace period (`grace_s`, default 30 s: Kubernetes' default
  terminationGracePeriodSeconds): they keep their room until then (terminating pods are never chosen
  again and still count as used, as on the cluster). Each victim then leaves, and, as its controller (a
  Job, a ReplicaSet) recreates it, comes back as a NEW pod, at the back of the queue of its priority,
  needing the rest of its time (its trace duration ended at a time its owner chose; the replacement runs
  until then). Recreated pods are not in the per-class wait figures (they are not arrivals of the stream);
  their own waits are reported under `preemption`. The time the victims had run is reported as lost work.
  (The queue orders a priority's pods by arrival number: a recreated pod, numbered after the whole stream,
  queues behind every pod of its priority, a little later than kube-scheduler's timestamp order would.)
- **The freed GPUs are held** (`share_core.holds`, `HoldKind.PREEMPTION`) for the preemptor from the
  eviction until it is placed or `grace_s + hold_s` has passed: pods of the same or lower priority see the
  held memory as taken, pods of higher priority do not (what filter does on the cluster).
- **Counted** (in the measured window): preemptions, victims, victims per preemption, and wasted ones:
  the preemptor was not placed on the held node's GPUs within the hold (it went elsewhere, a pod of higher
  priority took the room first, or the hold expired).
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass
from dataclasses import field

import share_placement as placement
from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import held_units
from share_placement import NodeView
from share_placement import Policy
from share_placement.model import Demand
from share_placement.model import GpuSlot
from share_placement.preemption import Candidate
from share_placement.preemption import PodOnNode
from share_placement.preemption import PreemptionNode
from share_placement.preemption import choose_victims
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.timeline import Timeline
from share_scheduler.sim.timeline import TimelineHooks
from share_scheduler.sim.timeline import TimelineResult
from share_scheduler.sim.timeline import percentile
from share_scheduler.sim.workload import Workload

GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
HOLD_S = 60.0  # how long after the victims are gone the freed room stays held for the preemptor
TIMER = -1  # what release() answers for a timer: a departure entry with a negative seq that is no pod, which
# wakes the engine up (after_event) at a hold's expiry or a retry's time
RETRY_S = 300.0  # kube-scheduler's podMaxInUnschedulablePodsDuration: a waiting pod tries again at least this often
MIN_CANDIDATES = 100  # defaultpreemption's minCandidateNodesAbsolute
CANDIDATE_PCT = 10  # defaultpreemption's minCandidateNodesPercentage
ANSWER_CACHE_LIMIT = 200_000  # per-node answers kept between dry runs (memory bound)


def num_candidates(potential: int) -> int:
    """How many candidate nodes kube-scheduler's dry run looks for (calculateNumCandidates)."""
    n = potential * CANDIDATE_PCT // 100
    return min(max(n, MIN_CANDIDATES), potential)


def held_view(view: NodeView, held: dict[int, int]) -> NodeView:
    """`view` with `held` units (GPU index -> units) taken: what a pod the holds apply to sees."""
    gpus = tuple((m, max(0, f - held.get(i, 0))) for i, (m, f) in enumerate(view[0]))
    return gpus, view[1], view[2]


@dataclass(slots=True)
class Preemption:
    """One preemption: who, where, which victims, and how it ended."""

    preemptor: int  # seq
    time: float
    hold: Hold
    victims: tuple[int, ...]  # seqs
    outcome: str = ""  # "placed" (on the held GPUs), "elsewhere", "expired"


@dataclass(slots=True)
class PreemptionStats:
    attempts: int = 0  # preemption dry runs (pods that fit nowhere and might preempt)
    preemptions: list[Preemption] = field(default_factory=list)
    lost_gpu_s: float = 0.0  # GPU (whole-GPU units) x seconds the victims had run, in the window
    requeued_waits: list[float] = field(default_factory=list)  # waits of recreated victims, placed or not


class PreemptionHooks(TimelineHooks):
    """Holds for preemptors (what pods see) and the timed steps (hold expiry, retried preemption)."""

    def __init__(self, engine: PreemptionTimeline) -> None:
        self.engine = engine

    def held(self, timeline: Timeline, seq: int) -> dict[int, NodeView] | None:
        return self.engine.held_for(seq)

    def after_event(self, timeline: Timeline, now: float) -> None:
        self.engine.step(now)


class PreemptionTimeline(Timeline):
    """The timeline with priority preemption (module docstring). `preempt` False runs the same engine with
    no preemption (for per-priority figures beside a run with it)."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        arrivals: list[Arrival],
        warmup_s: float,
        end_s: float,
        seed: int = 0,
        preempt: bool = True,
        grace_s: float = GRACE_S,
        hold_s: float = HOLD_S,
        retry_s: float = RETRY_S,
        sample_s: float | None = None,
    ) -> None:
        if grace_s < 0 or hold_s < 0 or not retry_s > 0:
            raise ValueError(f"need grace_s >= 0, hold_s >= 0, retry_s > 0; got {grace_s}, {hold_s}, {retry_s}")
        self.preempt = preempt
        hooks = PreemptionHooks(self) if preempt else None
        super().__init__(workload, policy, list(arrivals), warmup_s, end_s, seed, hooks, "node", sample_s)
        self.grace_s, self.hold_s, self.retry_s = grace_s, hold_s, retry_s
        self.node_names = [n.name for n in workload.nodes]
        self.node_index = {name: i for i, name in enumerate(self.node_names)}
        self.gpu_total = [n.gpus for n in workload.nodes]
        self.unit = max(g for n in workload.nodes for g in n.gpus)
        self.stream = len(self.arrivals)  # seqs below this are the stream's; above, recreated victims
        self.on_node: list[set[int]] = [set() for _ in workload.nodes]
        self.terminating: set[int] = set()
        self.holds: dict[int, Hold] = {}  # preemptor seq -> its hold
        self.open: dict[int, Preemption] = {}  # preemptor seq -> its preemption, until placed or expired
        self.retries: list[tuple[float, int]] = []  # heap of (next try, seq) for waiting pods that may preempt
        self.requeue: list[int] = []  # victims gone, to come back after this event's retries
        self.stats = PreemptionStats()
        self._timers = 0  # the last timer's seq (timers count down from -1)
        # Every change on a node (a pod placed, gone, or terminating) bumps its version; the victim choice's
        # answer per (node, demand, priority) is kept until then: a full cluster changes a few nodes per event.
        self.node_version = [0] * len(workload.nodes)
        self._node_answers: dict[tuple[int, int, int], tuple[int, Candidate | None]] = {}
        self._rng = random.Random(f"preempt-{seed}")
        self._min_priority = min((p.priority for p in workload.pods), default=0)

    # --- holds ---
    def held_for(self, seq: int) -> dict[int, NodeView] | None:
        """The nodes whose room arrival `seq` sees reduced by holds (not its own, not expired)."""
        if not self.holds:
            return None
        pod = self.arrivals[seq].pod
        taken = held_units(self.holds.values(), self.pod_priority[pod], str(seq), now=self.now)
        if not taken:
            return None
        return {self.node_index[n]: held_view(self.cluster.view(self.node_index[n]), g) for n, g in taken.items()}

    # --- the timeline's moves, with the bookkeeping preemption needs ---
    def place(self, seq: int, node: int, positions: tuple[int, ...]) -> None:
        super().place(seq, node, positions)
        self.on_node[node].add(seq)
        self.node_version[node] += 1
        done = self.open.pop(seq, None)
        if done is not None:
            hold = self.holds.pop(seq)
            on_hold = self.node_names[node] == hold.node and set(positions) == set(hold.gpus)
            done.outcome = "placed" if on_hold else "elsewhere"
            if not on_hold:
                self._free_hold(hold)

    def release(self, seq: int) -> int:
        if seq < 0:
            del self.ends[seq]
            return TIMER  # a timer, not a pod: run() calls after_event next, which does what is due
        node = super().release(seq)
        self.on_node[node].discard(seq)
        self.node_version[node] += 1
        if seq in self.terminating:
            self.terminating.discard(seq)
            self.requeue.append(seq)
        return node

    def arrive(self, seq: int) -> bool:
        if super().arrive(seq):
            return True
        may = self.preempt and self.pod_priority[self.arrivals[seq].pod] > self._min_priority
        if may and not self.try_preempt(seq):
            self._retry_later(seq)
        return False

    def retry_on(self, node: int) -> None:
        if node < 0:
            return
        name = self.node_names[node]
        if any(h.node == name for h in self.holds.values()):
            super().retry_on(node)  # a hold on this node: pod by pod, each seeing the node as its holds say
            return
        # No hold on this node (holds elsewhere do not change its room): the grouped retry.
        hooks, self.hooks = self.hooks, None
        try:
            super().retry_on(node)
        finally:
            self.hooks = hooks

    def _choose(self, seq: int) -> tuple[int, placement.Evaluation] | None:
        """The policy's best node for arrival `seq`, held nodes seen as the holds say. The indexed best over
        the unheld view answers when it is not a held node, once the held nodes' own (reduced) answers are
        weighed against it; a held pick falls back to the exact scan."""
        dix = self.cluster.pod_demand[self.arrivals[seq].pod]
        pick = self.cluster.best_indexed(dix, self._pick_rng)
        if pick is None or not self.holds:
            return pick  # fits nowhere with no hold: less room fits nowhere either
        held = self.held_for(seq)
        if not held:
            return pick
        if pick[0] in held:
            return self._choose_held(dix, held)
        demand = self.cluster.demands[dix]
        for node, view in sorted(held.items()):
            ev = self.cluster.evaluate(view, demand)
            if ev is not None and ev[0] > pick[1][0]:
                pick = (node, ev)
        return pick

    # --- preemption ---
    def preemption_node(self, node: int, held: dict[int, int]) -> PreemptionNode:
        """`node` as the victim choice sees it: each GPU's free units (less holds that apply), its pods."""
        view = self.cluster.view(node)
        totals = self.gpu_total[node]
        gpus = tuple(
            GpuSlot(index=p, model=m, total=totals[p], free=f - held.get(p, 0)) for p, (m, f) in enumerate(view[0])
        )
        pods = []
        demands, pod_demand = self.cluster.demands, self.cluster.pod_demand
        for s in self.on_node[node]:
            pod = self.arrivals[s].pod
            d = demands[pod_demand[pod]]
            where = self.where[s][1]
            pods.append(
                PodOnNode(
                    uid=str(s),
                    priority=self.pod_priority[pod],
                    gpus=tuple((p, d.per_gpu) for p in where) if d.count else (),
                    cpu=d.cpu,
                    memory=d.memory,
                    start=self.started[s] or 0.0,
                    terminating=s in self.terminating,
                    name=self.workload.pods[pod].name,
                )
            )
        return PreemptionNode(self.node_names[node], gpus, tuple(pods), view[1], view[2], None)

    def _might_help(self, node: int, demand: Demand, priority: int, held: dict[int, int]) -> bool:
        """A quick bound: could evicting every lower-priority pod of `node` make room for `demand`?"""
        view = self.cluster.view(node)
        gpus, cpu_free, mem_free = view
        reclaim = [0] * len(gpus)
        cpu = mem = 0
        any_lower = False
        demands, pod_demand = self.cluster.demands, self.cluster.pod_demand
        for s in self.on_node[node]:
            pod = self.arrivals[s].pod
            if self.pod_priority[pod] >= priority or s in self.terminating:
                continue
            any_lower = True
            d = demands[pod_demand[pod]]
            for p in self.where[s][1]:
                reclaim[p] += d.per_gpu
            cpu += d.cpu
            mem += d.memory
        if not any_lower:
            return False
        if cpu_free is not None and cpu_free + cpu < demand.cpu:
            return False
        if mem_free is not None and mem_free + mem < demand.memory:
            return False
        if demand.count == 0:
            return True
        totals = self.gpu_total[node]
        room = 0
        for p, (m, f) in enumerate(gpus):
            if (
                totals[p] >= demand.per_gpu
                and demand.model_allowed(m)
                and f - held.get(p, 0) + reclaim[p] >= demand.per_gpu
            ):
                room += 1
        return room >= demand.count

    def candidates(self, seq: int) -> list[Candidate]:
        """kube-scheduler's dry run with gpushare's victim choice: the nodes from a random offset until enough
        candidates are found, each node's cheapest victims, best first."""
        pod = self.arrivals[seq].pod
        priority = self.pod_priority[pod]
        demand = self.cluster.demands[self.cluster.pod_demand[pod]]
        taken = held_units(self.holds.values(), priority, str(seq), now=self.now) if self.holds else {}
        n = len(self.node_names)
        want = num_candidates(n)
        offset = self._rng.randrange(n)
        found: list[Candidate] = []
        dix = self.cluster.pod_demand[pod]
        cache, version, names = self._node_answers, self.node_version, self.node_names
        for k in range(n):
            node = (offset + k) % n
            held = taken.get(names[node]) if taken else None
            key = (node, dix, priority)
            got = None if held else cache.get(key)
            if got is not None and got[0] == version[node]:
                cand = got[1]
            else:
                cand = self._node_answer(node, demand, priority, held or {})
                if not held:  # a node's answer holds until something on it changes (its version)
                    if len(cache) >= ANSWER_CACHE_LIMIT:
                        cache.clear()
                    cache[key] = (version[node], cand)
            if cand is not None:
                found.append(cand)
                if len(found) >= want:
                    break
        found.sort(key=lambda c: c.key)
        return found

    def _node_answer(self, node: int, demand: Demand, priority: int, held: dict[int, int]) -> Candidate | None:
        """The node's cheapest victims for the demand, or None (nothing to evict, or evicting cannot help)."""
        if not self._might_help(node, demand, priority, held):
            return None
        best = choose_victims([self.preemption_node(node, held)], demand, priority)
        return best[0] if best and best[0].victims else None

    def try_preempt(self, seq: int) -> bool:
        """Preempt for waiting arrival `seq` if some node's lower-priority pods can make room: evict the best
        candidate's victims and hold their GPUs for it. True when it did."""
        if seq in self.holds:
            return False
        self.stats.attempts += 1
        found = self.candidates(seq)
        if not found:
            return False
        best = found[0]
        pod = self.arrivals[seq].pod
        demand = self.cluster.demands[self.cluster.pod_demand[pod]]
        victims = tuple(int(v.uid) for v in best.victims)
        now = self.now
        hold = Hold(
            kind=HoldKind.PREEMPTION,
            node=best.node,
            gpus=best.gpus,
            per_gpu=demand.per_gpu,
            priority=self.pod_priority[pod],
            expires=now + self.grace_s + self.hold_s,
            holder_uid=str(seq),
            holder=self.workload.pods[pod].name,
        )
        self.holds[seq] = hold
        self._wake_at(hold.expires)
        self.open[seq] = record = Preemption(seq, now, hold, victims)
        self.stats.preemptions.append(record)
        for v in victims:
            self.terminating.add(v)
            self.node_version[self.where[v][0]] += 1
            # gone at the end of its grace period, or sooner if it finishes by itself first; its old
            # departure entry is void once `ends` names another time (Timeline.run skips it)
            self.ends[v] = end = min(self.ends[v], now + self.grace_s)
            heapq.heappush(self.departures, (end, v))
        return True

    def _retry_later(self, seq: int) -> None:
        at = self.now + self.retry_s
        heapq.heappush(self.retries, (at, seq))
        self._wake_at(at)

    def _wake_at(self, at: float) -> None:
        """A timer: a departure entry of a seq of its own below 0, live in `ends` as run() requires."""
        self._timers -= 1
        self.ends[self._timers] = at
        heapq.heappush(self.departures, (at, self._timers))

    def _free_hold(self, hold: Hold) -> None:
        """The held room is anyone's again: the waiting pods try that node."""
        self.retry_on(self.node_index[hold.node])

    def step(self, now: float) -> None:
        """After every event: recreated victims come back, holds expire, waiting pods retry preemption."""
        while self.requeue:
            self._recreate(self.requeue.pop(0))
        for seq in [s for s, h in self.holds.items() if h.expired(now)]:
            hold = self.holds.pop(seq)
            self.open.pop(seq).outcome = "expired"
            heapq.heappush(self.retries, (now, seq))
            self._free_hold(hold)
        while self.retries and self.retries[0][0] <= now:
            _, seq = heapq.heappop(self.retries)
            if self.started[seq] is not None or seq in self.holds:
                continue  # placed meanwhile, or its preemption is under way
            if not self.try_preempt(seq):
                self._retry_later(seq)

    def _recreate(self, victim: int) -> None:
        """The victim's controller makes a new pod for the rest of its time; it arrives now."""
        a = self.arrivals[victim]
        left = (self.started[victim] or 0.0) + a.duration - self.now
        if left <= 0:
            return  # it finished by itself within its grace period: nothing lost, nothing to recreate
        if self.now >= self.warmup_s:  # what it had run is lost: the replacement starts its process afresh
            self.stats.lost_gpu_s += (self.now - (self.started[victim] or self.now)) * self.pod_gpu[a.pod] / self.unit
        seq = len(self.arrivals)
        self.arrivals.append(Arrival(self.now, a.pod, left))
        self.started.append(None)
        self.arrive(seq)

    # --- figures ---
    def result(self, seconds: float = 0.0) -> PreemptionResult:
        base = super().result(seconds)
        return PreemptionResult(
            **{f: getattr(base, f) for f in TimelineResult.__dataclass_fields__}, preemption=self.preemption_figures()
        )

    def preemption_figures(self) -> dict:
        """Preemptions in [warmup, end] and their outcome; waits per priority over the stream's pods."""
        window = [p for p in self.stats.preemptions if p.time >= self.warmup_s]
        victims = sum(len(p.victims) for p in window)
        wasted = [p for p in window if p.outcome in ("elsewhere", "expired")]
        requeued = sorted(
            (self.end_s if self.started[s] is None else self.started[s]) - self.arrivals[s].time
            for s in range(self.stream, len(self.arrivals))
            if self.arrivals[s].time >= self.warmup_s
        )
        by_priority: dict[str, dict] = {}
        waits: dict[int, list[float]] = {}
        for seq in range(min(self.arrived, self.stream)):
            a = self.arrivals[seq]
            if a.time < self.warmup_s:
                continue
            started = self.started[seq]
            waits.setdefault(self.pod_priority[a.pod], []).append((self.end_s if started is None else started) - a.time)
        for prio in sorted(waits, reverse=True):
            w = sorted(waits[prio])
            by_priority[str(prio)] = {
                "pods": len(w),
                "waited_pct": round(100.0 * sum(1 for x in w if x > 0) / len(w), 3),
                "p50_s": round(percentile(w, 50), 1),
                "p99_s": round(percentile(w, 99), 1),
                "max_s": round(w[-1], 1),
            }
        return {
            "enabled": self.preempt,
            "attempts": self.stats.attempts,
            "preemptions": len(window),
            "victims": victims,
            "victims_per_preemption": round(victims / len(window), 3) if window else None,
            "preemptions_placed_on_hold": sum(1 for p in window if p.outcome == "placed"),
            "wasted_preemptions": len(wasted),
            "wasted_victims": sum(len(p.victims) for p in wasted),
            "still_open": sum(1 for p in window if not p.outcome),
            "lost_gpu_hours": round(self.stats.lost_gpu_s / 3600.0, 3),
            "recreated": len(requeued),
            "recreated_wait_p50_s": round(percentile(requeued, 50), 1) if requeued else None,
            "recreated_wait_p99_s": round(percentile(requeued, 99), 1) if requeued else None,
            "by_priority": by_priority,
        }


@dataclass(slots=True)
class PreemptionResult(TimelineResult):
    preemption: dict = field(default_factory=dict)

    def figures(self) -> dict:
        out = TimelineResult.figures(self)
        out["preemption"] = self.preemption
        return out


def simulate_preemption_timeline(
    workload: Workload,
    policy: Policy,
    arrivals: list[Arrival],
    warmup_s: float,
    end_s: float,
    seed: int = 0,
    preempt: bool = True,
    grace_s: float = GRACE_S,
    hold_s: float = HOLD_S,
    retry_s: float = RETRY_S,
    sample_s: float | None = None,
) -> PreemptionResult:
    """`simulate_timeline` with priority preemption (or, `preempt` False, the same engine without it)."""
    started = time.perf_counter()
    tl = PreemptionTimeline(
        workload, policy, arrivals, warmup_s, end_s, seed, preempt, grace_s, hold_s, retry_s, sample_s
    )
    tl.run()
    return tl.result(time.perf_counter() - started)


def format_preemption(rows: list[dict]) -> str:
    """The preemption figures of `share-sim timeline --preempt` rows, one line per policy and load, then
    the waits per priority (higher first)."""
    lines = [
        f"{'policy':<9}{'rho':>6}  {'preempt':<8}{'dry runs':>9}{'preemptions':>12}{'victims':>8}{'per':>6}"
        f"{'wasted':>7}{'lost GPU-h':>11}  waits per priority: waited % / p50 / p99",
    ]
    for row in rows:
        m = row["mean"].get("preemption")
        if not m:
            continue
        rho = "replay" if row["rho"] is None else f"{row['rho']:g}"
        per = "-" if m["victims_per_preemption"] is None else f"{m['victims_per_preemption']:.2f}"
        waits = "  ".join(
            f"{p}: {w['waited_pct']:.1f}/{w['p50_s']:.0f}s/{w['p99_s']:.0f}s" for p, w in m["by_priority"].items()
        )
        lines.append(
            f"{row['policy']:<9}{rho:>6}  {'on' if m['enabled'] else 'off':<8}{m['attempts']:>9.0f}"
            f"{m['preemptions']:>12.0f}{m['victims']:>8.0f}{per:>6}{m['wasted_preemptions']:>7.0f}"
            f"{m['lost_gpu_hours']:>11.1f}  {waits}"
        )
    lines.append("wasted: preemptions whose preemptor was not placed on the GPUs freed for it within the hold")
    return "\n".join(lines)
