"""The trace simulator: the protocol of Weng et al. (ATC '23), scheduling with our own placement code.

Every pod of the workload arrives once in a seeded random order, then pods are drawn with replacement
until the GPU units asked for reach `tune` x the cluster's capacity (see DRAWS); each goes to the node
the policy scores highest (first node on ties, as `placement.best_node` and the paper's kube-scheduler
fork; uniformly at random among them for a policy with `random_ties`, as upstream kube-scheduler
does), on the GPUs the policy picks, or fails; pods never leave. After
each arrival: arrived% = units asked so far (failed pods included) / capacity, allocation% = units
placed / capacity. Unallocated% at arrived t = 100 - allocation% at the first arrival reaching t.

Speed: nodes are interned by state and the policy's answers memoised per (state, demand), in
`cluster.ClusterState`, the piece the timeline (timeline.py) shares.
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
from share_scheduler.sim.cluster import ClusterState
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
    pod_gpu = [p.gpu_request for p in pods]
    # Policies with coarse scores (bestfit) leave ties to the caller, as kube-scheduler's selectHost
    # does: uniformly at random among the best nodes, from a stream apart from the arrival order's.
    cluster = ClusterState(workload, policy, random.Random(f"ties-{seed}"))
    pod_demand, demands = cluster.pod_demand, cluster.demands

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

        chosen = cluster.best(dix)
        best_node, best_ev = chosen if chosen is not None else (-1, None)

        if placements is not None:
            placements.append((k, None if best_ev is None else (best_node, best_ev[1])))

        if best_ev is None:
            failed += 1
            if requested <= capacity:
                kind = pod_kind(demand)
                failed_units[kind] = failed_units.get(kind, 0) + pod_gpu[k]
        else:
            placed += pod_gpu[k]
            cluster.place(best_node, dix, best_ev[1])

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
        final=[cluster.view(i) for i in range(len(workload.nodes))],
        failed_units=failed_units,
    )


def run_policy(workload: Workload, name: str, seed: int, tune: float = 1.3, draw: str = "trace-first") -> SeedResult:
    """One seed of one policy, the policy built exactly as the extender builds it."""
    result = simulate(workload, build_policy(name, seed, workload), seed, tune, draw=draw)
    result.policy = name
    return result
