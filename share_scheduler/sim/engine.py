"""The trace simulator: the protocol of Weng et al. (ATC '23), scheduling with our own placement code.

Every pod of the workload arrives once in a seeded random order, then pods are drawn with replacement
until the GPU units asked for reach `tune` x the cluster's capacity (see DRAWS); each goes to the node
the policy scores highest (first node on ties, as `placement.best_node` and the paper's kube-scheduler
fork; uniformly at random among them for a policy with `random_ties`, as upstream kube-scheduler
does), on the GPUs the policy picks, or fails; pods never leave. After
each arrival: arrived% = units asked so far (failed pods included) / capacity, allocation% = units
placed / capacity. Unallocated% at arrived t = 100 - allocation% at the first arrival reaching t.

Speed: every node is reduced to a hashable `NodeView`; nodes in the same state share one interned id,
and for policies whose `evaluate` is pure (`cacheable`), the answer per (state, demand) is computed
once with the policy's own `evaluate` and reused until no node is in that state any more.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

import share_placement as placement
from share_placement import Demand
from share_placement import NodeView
from share_placement import Policy
from share_scheduler.sim.workload import Workload

THRESHOLDS = (90, 95, 100, 130)
# How arrivals are drawn. "trace-first" is the paper's simulator (kubernetes-scheduler-simulator,
# `Simulate`: the trace's pods shuffled, then `tuneUpPods` appends pods drawn with replacement until
# the demand reaches tune x capacity); "replacement" draws every arrival with replacement.
DRAWS = ("trace-first", "replacement")
CURVE_STEP = 0.5  # arrived-% resolution of the recorded curve


@dataclass(slots=True)
class SeedResult:
    policy: str
    seed: int
    unallocated_pct: dict[str, float | None]
    arrivals: int = 0
    placed: int = 0
    failed: int = 0
    seconds: float = 0.0
    # allocation % at arrived = 0, CURVE_STEP, 2*CURVE_STEP, ... (for plots)
    curve: list[float] = field(default_factory=list)
    # the final state of every node, in input order (for inspection and tests)
    final: list[NodeView] = field(default_factory=list)
    # GPU units of the pods that failed before arrived reached 100 %, by pod kind (why a policy loses)
    failed_units: dict[str, int] = field(default_factory=dict)


def pod_kind(demand: Demand) -> str:
    """share, 1-gpu, N-gpu or cpu, with '@models' when the pod is restricted to GPU models."""
    if demand.count == 0:
        return "cpu"
    kind = f"{demand.count}-gpu" if demand.count > 1 or demand.per_gpu >= 1000 else "share"
    return kind + ("@" + "|".join(demand.models) if demand.models else "")


def arrival_order(npods: int, seed: int, draw: str = "trace-first") -> Iterator[int]:
    """Pod indices in the order they arrive (see DRAWS), endless: the caller stops at its target.

    The one place the order is made, so anything else that needs the arrivals of a seed
    (`bench/share_packing_bound.py`) gets exactly the simulator's."""
    if draw not in DRAWS:  # checked here, at the call, not at the first next()
        raise ValueError(f"unknown draw {draw!r}: choose one of {', '.join(DRAWS)}")
    return _arrivals(npods, random.Random(seed), draw == "trace-first")


def _arrivals(npods: int, rng: random.Random, trace_first: bool) -> Iterator[int]:
    if trace_first:
        first = list(range(npods))
        rng.shuffle(first)
        yield from first
    while True:
        yield rng.randrange(npods)


def arrivals_until(workload: Workload, seed: int, pct: float = 100.0, draw: str = "trace-first") -> list[int]:
    """The arrivals of `seed` up to and including the first one that brings the GPU units asked for to
    `pct` % of the cluster's capacity (the arrival whose state the table reads at that mark)."""
    pods = workload.pods
    target = pct * workload.gpu_capacity
    out: list[int] = []
    requested = 0
    for k in arrival_order(len(pods), seed, draw):
        out.append(k)
        requested += pods[k].gpu_request
        if requested * 100 >= target:
            return out
    raise AssertionError("unreachable: the order is endless")  # pragma: no cover


def build_policy(name: str, seed: int, workload: Workload) -> Policy:
    """The same policy object the extender builds (placement.make_policy), taught the trace's pods.

    The extender sees what share-sim sees (issue 31): every node's free CPU and memory beside its GPUs,
    every pod's CPU and memory in its demand, CPU-only pods placed by the policy and learned from; so
    there is one view, this one (tests/integration/test_live_vs_sim.py holds the two equal)."""
    cls = placement.POLICIES.get(name)
    params = inspect.signature(cls).parameters if cls is not None else {}
    options: dict[str, int] = {"seed": seed} if "seed" in params else {}
    # Normalisers (bestfit): the largest node's CPU and GPU capacity, as the paper's constants are for
    # the openb cluster (128 cores, 8 x 1000 units); also right for a YAML cluster counted in GiB.
    cpus = [n.cpu for n in workload.nodes if n.cpu]
    if "cpu_spec" in params and cpus:
        options["cpu_spec"] = max(cpus)
    if "gpu_spec" in params and workload.gpu_capacity > 0:
        options["gpu_spec"] = max(n.gpu_capacity for n in workload.nodes)
    if "gpu_unit" in params and workload.gpu_capacity > 0:
        # fgd's sigmoid counts the change in whole GPUs: 1000 units in the openb trace, GiB in a YAML.
        options["gpu_unit"] = max(max(n.gpus) for n in workload.nodes if n.gpus)
    policy = placement.make_policy(name, **options)
    for pod in workload.pods:
        policy.observe(pod.demand())
    return policy


def simulate(
    workload: Workload,
    policy: Policy,
    seed: int,
    tune: float = 1.3,
    thresholds: tuple[int, ...] = THRESHOLDS,
    draw: str = "trace-first",
    placements: list[tuple[int, tuple[int, ...]] | None] | None = None,
    order: Sequence[int] | None = None,
) -> SeedResult:
    """Run one seed of the protocol with one policy object; see the module docstring.

    `order`, when given, is the arrival order itself (pod indices), replayed to its end instead of the
    seeded draws: a run elsewhere (the real kube-scheduler in bench/bench_dra.py) and the policies see
    exactly the same arrivals.

    `placements`, when given, gets one entry per arrival: (pod index, (node index, GPU positions) or
    None when it failed). The arrivals depend on the seed alone, not on the policy, so the
    live-versus-simulated test replays them through the cluster and compares the placements."""
    started = time.perf_counter()
    capacity = workload.gpu_capacity
    if capacity <= 0:
        raise ValueError("the cluster has no GPU capacity")
    pods = workload.pods
    npods = len(pods)

    # Distinct demands, each with its index for the per-demand caches.
    demand_ids: dict[Demand, int] = {}
    pod_demand: list[int] = []
    demands: list[Demand] = []
    for pod in pods:
        d = pod.demand()
        if d not in demand_ids:
            demand_ids[d] = len(demands)
            demands.append(d)
        pod_demand.append(demand_ids[d])
    pod_gpu = [p.gpu_request for p in pods]

    # Node state interning: view -> state id; state id -> sorted node indices in that state.
    nodes = workload.nodes
    state_ids: dict[NodeView, int] = {}
    state_views: dict[int, NodeView] = {}
    members: dict[int, list[int]] = {}
    node_state: list[int] = []

    def intern(view: NodeView) -> int:
        sid = state_ids.get(view)
        if sid is None:
            sid = state_ids[view] = len(state_ids)
            state_views[sid] = view
        return sid

    for i, n in enumerate(nodes):
        view: NodeView = (tuple((n.model, g) for g in n.gpus), n.cpu, n.memory)
        sid = intern(view)
        node_state.append(sid)
        members.setdefault(sid, []).append(i)

    cacheable = bool(getattr(policy, "cacheable", True))
    # Policies with coarse scores (bestfit) leave ties to the caller, as kube-scheduler's selectHost
    # does: uniformly at random among the best nodes, from a stream apart from the arrival order's.
    tie_rng = random.Random(f"ties-{seed}") if getattr(policy, "random_ties", False) else None
    caches: list[dict[int, placement.Evaluation]] = [{} for _ in demands]
    evaluate = policy.evaluate
    missing = object()

    def fitting(cache: dict[int, placement.Evaluation], demand: Demand) -> Iterator[tuple[int, placement.Evaluation]]:
        """Each node state the demand fits, with its evaluation (worked out once per state and demand)."""
        for sid in members:
            ev = cache.get(sid, missing)
            if ev is missing:
                ev = cache[sid] = evaluate(state_views[sid], demand)
            if ev is not None:
                yield sid, ev

    requested = placed = failed = arrivals = 0
    failed_units: dict[str, int] = {}
    # The arrival order (see DRAWS and `arrival_order`), or the caller's `order` replayed to its end.
    arriving = arrival_order(npods, seed, draw)
    pending: list[int] = list(reversed(order)) if order is not None else []  # popped from the end
    target = tune * capacity
    marks = sorted(thresholds)
    next_mark = 0
    result: dict[str, float | None] = {str(t): None for t in thresholds}
    curve: list[float] = []
    next_curve = 0.0

    while pending if order is not None else requested < target:
        k = pending.pop() if order is not None else next(arriving)
        arrivals += 1
        requested += pod_gpu[k]
        dix = pod_demand[k]
        demand = demands[dix]

        best_node = -1
        best_score = placement.NEG_INF
        best_ev: placement.Evaluation = None
        if cacheable and tie_rng is not None:
            cache = caches[dix]
            tied: list[int] = []
            for sid, ev in fitting(cache, demand):
                s = ev[0]
                if s > best_score:
                    best_score, tied = s, [sid]
                elif s == best_score:
                    tied.append(sid)
            if tied:
                pick = tie_rng.randrange(sum(len(members[sid]) for sid in tied))
                for sid in tied:
                    if pick < len(members[sid]):
                        best_node, best_ev = members[sid][pick], cache[sid]
                        break
                    pick -= len(members[sid])
        elif cacheable:
            for sid, ev in fitting(caches[dix], demand):
                s, first = ev[0], members[sid][0]
                if s > best_score or (s == best_score and first < best_node):
                    best_score, best_node, best_ev = s, first, ev
        else:
            for i, sid in enumerate(node_state):
                ev = evaluate(state_views[sid], demand)
                if ev is not None and ev[0] > best_score:
                    best_score, best_node, best_ev = ev[0], i, ev

        if placements is not None:
            placements.append((k, None if best_ev is None else (best_node, best_ev[1])))

        if best_ev is None:
            failed += 1
            if requested <= capacity:
                kind = pod_kind(demand)
                failed_units[kind] = failed_units.get(kind, 0) + pod_gpu[k]
        else:
            placed += pod_gpu[k]
            old = node_state[best_node]
            gpus, cpu_free, mem_free = state_views[old]
            new_gpus = list(gpus)
            for p in best_ev[1]:
                model, free = new_gpus[p]
                new_gpus[p] = (model, free - demand.per_gpu)
            new_view: NodeView = (
                tuple(new_gpus),
                None if cpu_free is None else cpu_free - demand.cpu,
                None if mem_free is None else mem_free - demand.memory,
            )
            new = intern(new_view)
            node_state[best_node] = new
            old_members = members[old]
            old_members.remove(best_node)
            if not old_members:
                del members[old]
                for cache in caches:
                    cache.pop(old, None)
            new_members = members.setdefault(new, [])
            new_members.append(best_node)
            if len(new_members) > 1:
                new_members.sort()

        while next_mark < len(marks) and requested * 100 >= marks[next_mark] * capacity:
            result[str(marks[next_mark])] = 100.0 - 100.0 * placed / capacity
            next_mark += 1
        arrived_pct = 100.0 * requested / capacity
        while next_curve <= arrived_pct:
            curve.append(100.0 * placed / capacity)
            next_curve += CURVE_STEP

    return SeedResult(
        policy=getattr(policy, "name", type(policy).__name__),
        seed=seed,
        unallocated_pct=result,
        arrivals=arrivals,
        placed=arrivals - failed,
        failed=failed,
        seconds=time.perf_counter() - started,
        curve=curve,
        final=[state_views[sid] for sid in node_state],
        failed_units=failed_units,
    )


def run_policy(workload: Workload, name: str, seed: int, tune: float = 1.3, draw: str = "trace-first") -> SeedResult:
    """One seed of one policy, the policy built exactly as the extender builds it."""
    result = simulate(workload, build_policy(name, seed, workload), seed, tune, draw=draw)
    result.policy = name
    return result
