"""Which pods to preempt so that a pod fits on ONE GPU (N GPUs for gpu-count N): plain data in, plain data out.

kube-scheduler's DefaultPreemption counts only a node's total `nvidia.com/gpu-mem`, so the memory it frees
can be spread over several GPUs and the preemptor still fits none. Here, per candidate node, the victims are
the cheapest set of lower-priority pods whose removal leaves `count` GPUs each with `per_gpu` free (and the
node's CPU, memory and a pod slot), "cheapest" in exactly the order kube-scheduler ranks candidate nodes
(pkg/scheduler/framework/preemption/preemption.go, pickOneNodeForPreemption), so the extender's preempt verb,
its own preemption where kube-scheduler never calls the verb, share-sim and the bench make one decision:

1. fewest PodDisruptionBudget violations (`NumPDBViolations`);
2. the lowest highest-victim priority (kube-scheduler reads `Victims.Pods[0]`: victims come out sorted by
   descending priority);
3. the smallest sum of victim priorities, each offset by MaxInt32+1 as upstream does (so fewer pods of a
   negative priority are not beaten by more of them);
4. the fewest victims;
5. the least GPU memory freed (ours: of two equal sets, the one that wastes less);
6. the latest start time of the earliest-started highest-priority victim (upstream's last rule);
7. then deterministic ties: lower GPU indices, victim UIDs, node name.

The same key orders the sets on one node and the candidates across nodes, so the best candidate is the
minimum over nodes of each node's minimum.

PDB violations are counted as upstream's filterPodsWithPDBViolation does (victims taken in order of
importance, each matching budget decremented; a pod whose eviction takes a budget below zero violates it),
over the chosen victims only (not over every lower-priority pod of the node, which is where upstream's
count can overstate). One deliberate difference: a pod matched by several budgets decrements all of them
(upstream stops at the first one that goes negative). The count is then monotone in the victim set, which
the exact search below needs, and equals upstream's whenever a pod is matched by at most one budget; a pod
under several budgets cannot be evicted at all (the Eviction API refuses it).

Terminating pods (deletion under way) are never victims, and their memory still counts as used: it is not
free while their containers run (the caller leaves their usage in `GpuSlot.free`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

from share_placement.model import Demand
from share_placement.model import GpuSlot

PRIORITY_OFFSET = 2**31  # upstream adds math.MaxInt32+1 to each priority before summing (minSumPrioritiesScoreFunc)


@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod bound to a candidate node, as preemption needs it.

    `gpus`: (GPU index, units) it holds on each of its GPUs (empty for a pod without GPU memory).
    `pdbs`: the keys of the PodDisruptionBudgets that select it and do not list it in `disruptedPods`
    (the caller matches selectors; see `pdb_violations`). `start`: its start time (epoch seconds; upstream
    takes a pod without one as started now). `terminating`: its deletion is under way (never a victim)."""

    uid: str
    priority: int
    gpus: tuple[tuple[int, int], ...] = ()
    cpu: int = 0
    memory: int = 0
    pdbs: tuple[str, ...] = ()
    start: float = 0.0
    terminating: bool = False
    name: str = ""  # namespace/name, for messages only

    @property
    def gpu_units(self) -> int:
        return sum(units for _, units in self.gpus)


@dataclass(frozen=True, slots=True)
class PreemptionNode:
    """A candidate node: its GPUs (`free` counts everything placed or held there, victims included), its
    host room (`cpu_free`/`memory_free`: allocatable minus requested, may be negative; None: not checked;
    `pod_slots`: pods it may still take) and the pods bound to it."""

    name: str
    gpus: tuple[GpuSlot, ...]
    pods: tuple[PodOnNode, ...]
    cpu_free: int | None = None
    memory_free: int | None = None
    pod_slots: int | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One node's cheapest preemption: the victims (most important first, as kube-scheduler expects), the
    GPUs the preemptor takes once they are gone, and what each victim frees on those GPUs."""

    node: str
    gpus: tuple[int, ...]
    victims: tuple[PodOnNode, ...]
    pdb_violations: int
    key: tuple[object, ...] = field(repr=False, compare=False)

    @property
    def freed(self) -> dict[int, int]:
        """GPU index -> units the victims free on the GPUs the preemptor takes."""
        taken = set(self.gpus)
        out = dict.fromkeys(self.gpus, 0)
        for victim in self.victims:
            for index, units in victim.gpus:
                if index in taken:
                    out[index] += units
        return out

    @property
    def highest_priority(self) -> int | None:
        return self.victims[0].priority if self.victims else None


def importance_order(pods: Iterable[PodOnNode]) -> list[PodOnNode]:
    """Most important first: higher priority, then earlier start (upstream's MoreImportantPod), then UID."""
    return sorted(pods, key=lambda p: (-p.priority, p.start, p.uid))


def pdb_violations(victims: Iterable[PodOnNode], budgets: Mapping[str, int]) -> int:
    """How many evictions of `victims` go beyond what their budgets allow: per budget, the victims it
    selects beyond its `status.disruptionsAllowed` (a key a pod names but `budgets` lacks allows none: a
    budget that selects the pod but has no status yet protects it)."""
    selected: dict[str, int] = {}
    for pod in victims:
        for key in pod.pdbs:
            selected[key] = selected.get(key, 0) + 1
    return sum(max(0, n - max(budgets.get(key, 0), 0)) for key, n in selected.items())


def rank_key(victims: Sequence[PodOnNode], violations: int, node: str = "") -> tuple[object, ...]:
    """kube-scheduler's order of candidate nodes (pickOneNodeForPreemption, module docstring) for one
    node's victims; smaller is better. No victims (nothing to evict) ranks first."""
    if not victims:
        return (violations, -PRIORITY_OFFSET - 1, 0, 0, 0, 0.0, node)
    top = max(p.priority for p in victims)
    return (
        violations,
        top,
        sum(p.priority + PRIORITY_OFFSET for p in victims),
        len(victims),
        sum(p.gpu_units for p in victims),
        -min(p.start for p in victims if p.priority == top),
        node,
    )


def choice_key(victims: Sequence[PodOnNode], violations: int, gpus: Sequence[int]) -> tuple[object, ...]:
    """The order of victim sets on ONE node: kube-scheduler's first five rules (rank_key), then the most
    recently started victims (the least work lost), lower GPU indices, the smallest UIDs. Every rule
    after the highest priority is additive or, for the UIDs, kept by adding the same pods to two sets,
    which the search below relies on."""
    top = max((p.priority for p in victims), default=-PRIORITY_OFFSET - 1)
    return (
        violations,
        top,
        sum(p.priority + PRIORITY_OFFSET for p in victims),
        len(victims),
        sum(p.gpu_units for p in victims),
        -sum(p.start for p in victims),
        tuple(gpus),
        tuple(sorted(p.uid for p in victims)),
    )


def eligible_victims(node: PreemptionNode, priority: int) -> list[PodOnNode]:
    """The pods preemption may evict for a pod of `priority`: lower priority, not already terminating."""
    return [p for p in node.pods if p.priority < priority and not p.terminating]


def _usable_gpus(node: PreemptionNode, demand: Demand) -> list[GpuSlot]:
    return [g for g in node.gpus if g.healthy and g.total >= demand.per_gpu and demand.model_allowed(g.model)]


# A partial victim set in the search: (cost, freed per deficit (capped), budget use per PDB (capped), pods).
# cost = (violations, priority sum, count, memory, -sum of starts, sorted UIDs): choice_key less the top
# priority (equal for every set the search extends) and the GPUs (fixed per search).
_State = tuple[tuple[object, ...], tuple[int, ...], tuple[int, ...], tuple[PodOnNode, ...]]


def _dominated(state: _State, by: _State) -> bool:
    """`by` costs no more (cost sorted before), frees at least as much, uses no more of any budget: whatever
    pods are added to both, `by` plus them ranks no worse than `state` plus them."""
    return all(a >= b for a, b in zip(by[1], state[1], strict=True)) and all(
        a <= b for a, b in zip(by[2], state[2], strict=True)
    )


def _pareto(states: list[_State]) -> list[_State]:
    states.sort(key=lambda s: s[0])
    kept: list[_State] = []
    if len(states[0][1]) == 1 and not states[0][2]:
        # one deficit, no budgets (the common case: one GPU): a staircase, each kept set frees more
        most = -1
        for state in states:
            if state[1][0] > most:
                kept.append(state)
                most = state[1][0]
        return kept
    if len(states[0][1]) == 2 and not states[0][2]:
        # two deficits (a 2-GPU pod): the kept sets' frees as a staircase, first free ascending and the
        # second descending; a set is dominated iff the first kept point reaching its first free reaches
        # its second too
        firsts: list[int] = []
        seconds: list[int] = []
        for state in states:
            a, b = state[1]
            at = bisect.bisect_left(firsts, a)
            if at < len(firsts) and seconds[at] >= b:
                continue
            kept.append(state)
            lo = at  # points with a smaller first free and no larger second one are now dominated
            while lo > 0 and seconds[lo - 1] <= b:
                lo -= 1
            hi = at + 1 if at < len(firsts) and firsts[at] == a else at
            firsts[lo:hi] = [a]
            seconds[lo:hi] = [b]
        return kept
    for state in states:
        if not any(_dominated(state, k) for k in kept):
            kept.append(state)
    return kept


def _cheapest(
    pods: list[PodOnNode],
    adds: list[tuple[int, ...]],
    deficits: tuple[int, ...],
    budgets: Mapping[str, int],
    gpus: tuple[int, ...],
    bound: tuple[object, ...] | None,
) -> tuple[tuple[object, ...], tuple[PodOnNode, ...], int] | None:
    """The set of `pods` (sorted by ascending priority) freeing `deficits`, smallest by choice_key and
    better than `bound`; (key, pods, violations) or None.

    Pods are added in ascending priority, so every pod still to come has a priority no lower than any
    already in a set: the sets completed while adding pods of priority p all have top priority p, and
    sets of the same top compare by the additive rest of the key. A set that frees enough is never grown
    (a superset costs more); a set another frees at least as much as, at no more cost and budget use, is
    dropped (Pareto front): exact, and small in practice."""
    keys = sorted({k for p in pods for k in p.pdbs})
    allowed = tuple(max(budgets.get(k, 0), 0) for k in keys)
    where = {k: i for i, k in enumerate(keys)}
    dims = range(len(deficits))
    empty: _State = ((0, 0, 0, 0, 0.0, ()), tuple(0 for _ in dims), tuple(0 for _ in keys), ())
    if all(d <= 0 for d in deficits):
        return choice_key((), 0, gpus), (), 0
    best: tuple[tuple[object, ...], tuple[PodOnNode, ...], int] | None = None
    best_key = bound
    seed = _greedy(pods, adds, deficits)
    if seed is not None:
        violations = pdb_violations(seed, budgets)
        key = choice_key(seed, violations, gpus)
        if best_key is None or key < best_key:
            best_key, best = key, (key, seed, violations)
    # fewest pods that could still cover what a set leaves short, per deficit (the sizes, largest first)
    largest = [list(itertools.accumulate(sorted((a[d] for a in adds), reverse=True))) for d in dims]
    active: list[_State] = [empty]
    i = 0
    while i < len(pods) and active:
        top = pods[i].priority
        if best_key is not None:
            # every set completed from here on has this top priority (or a higher one later), and at least
            # the violations of the set it grows from: keep only those that could still rank first
            active = [s for s in active if (s[0][0], top) <= best_key[:2]]
            if not active:
                break
        while i < len(pods) and pods[i].priority == top:
            pod, add = pods[i], adds[i]
            grown: list[_State] = []
            for cost, freed, used, chosen in active:
                violations = cost[0]
                use = list(used)
                for k in pod.pdbs:
                    j = where[k]
                    if use[j] < allowed[j]:
                        use[j] += 1
                    else:
                        violations += 1  # type: ignore[operator]
                uids = tuple(sorted((*cost[5], pod.uid)))  # type: ignore[misc]
                new_cost = (
                    violations,
                    cost[1] + pod.priority + PRIORITY_OFFSET,  # type: ignore[operator]
                    cost[2] + 1,  # type: ignore[operator]
                    cost[3] + pod.gpu_units,  # type: ignore[operator]
                    cost[4] - pod.start,  # type: ignore[operator]
                    uids,
                )
                new_freed = tuple(min(f + a, d) for f, a, d in zip(freed, add, deficits, strict=True))
                if new_freed == deficits:
                    key = (violations, top, *new_cost[1:5], gpus, uids)
                    if best_key is None or key < best_key:
                        best_key, best = key, (key, (*chosen, pod), violations)  # type: ignore[assignment]
                    continue
                if best_key is not None:
                    # its completions add at least this many pods, each of priority `top` or higher
                    more = max(
                        bisect.bisect_left(largest[d], need - f) + 1
                        for d, (f, need) in enumerate(zip(new_freed, deficits, strict=True))
                        if f < need
                    )
                    if (violations, top, new_cost[1] + more * (top + PRIORITY_OFFSET)) > best_key[:3]:  # type: ignore[operator]
                        continue
                grown.append((new_cost, new_freed, tuple(use), (*chosen, pod)))
            active = _pareto(active + grown)
            i += 1
    return best


def _greedy(
    pods: list[PodOnNode], adds: list[tuple[int, ...]], deficits: tuple[int, ...]
) -> tuple[PodOnNode, ...] | None:
    """A quick feasible set (the search's first bound): the lowest-priority pods that still help, larger
    first within a priority, then those not needed dropped, the most important first."""
    order = sorted(range(len(pods)), key=lambda k: (pods[k].priority, -sum(adds[k]), pods[k].uid))
    left = list(deficits)
    chosen: list[int] = []
    for k in order:
        if all(r <= 0 for r in left):
            break
        if any(a > 0 and r > 0 for a, r in zip(adds[k], left, strict=True)):
            chosen.append(k)
            left = [r - a for r, a in zip(left, adds[k], strict=True)]
    if any(r > 0 for r in left):
        return None
    for k in sorted(chosen, key=lambda k: (-pods[k].priority, pods[k].uid)):
        if all(r + a <= 0 for r, a in zip(left, adds[k], strict=True)):
            chosen.remove(k)
            left = [r + a for r, a in zip(left, adds[k], strict=True)]
    return tuple(pods[k] for k in chosen)


def node_candidate(
    node: PreemptionNode, demand: Demand, priority: int, budgets: Mapping[str, int] | None = None
) -> Candidate | None:
    """The cheapest victims on `node` that make `demand` fit there, or None if evicting every pod of lower
    priority would not (a GPU too small or unhealthy, higher-priority pods in the way, the host short).

    A demand that already fits gives a candidate without victims (the caller decides what that means:
    kube-scheduler 1.33-1.37 refuses an empty victim list, 1.38 sends such nodes as placeholders)."""
    budgets = budgets or {}
    eligible = sorted(eligible_victims(node, priority), key=lambda p: (p.priority, p.uid))
    host: list[tuple[int, str]] = []  # (deficit, resource) for CPU, memory, a pod slot
    if demand.cpu > 0 and node.cpu_free is not None and node.cpu_free < demand.cpu:
        host.append((demand.cpu - node.cpu_free, "cpu"))
    if demand.memory > 0 and node.memory_free is not None and node.memory_free < demand.memory:
        host.append((demand.memory - node.memory_free, "memory"))
    if node.pod_slots is not None and node.pod_slots < 1:
        host.append((1 - node.pod_slots, "pods"))
    if demand.count > 0:
        usable = _usable_gpus(node, demand)
        if len(usable) < demand.count:
            return None
        targets: Iterable[tuple[GpuSlot, ...]] = itertools.combinations(usable, demand.count)
    else:
        targets = [()]
    on_gpu = {p.uid: dict(p.gpus) for p in eligible}
    by_gpu: dict[int, list[PodOnNode]] = {}
    for pod in eligible:  # ascending priority, so each GPU's list is too
        for index, _ in pod.gpus:
            by_gpu.setdefault(index, []).append(pod)
    searches = []
    for target in targets:
        short = [(g.index, demand.per_gpu - g.free) for g in target if g.free < demand.per_gpu]
        deficits = tuple([need for _, need in short] + [need for need, _ in host])
        if host:
            helping = eligible
        else:
            seen = {p.uid for index, _ in short for p in by_gpu.get(index, ())}
            helping = [p for p in eligible if p.uid in seen]
        pods, adds = [], []
        for pod in helping:
            held = on_gpu[pod.uid]
            add = [held.get(index, 0) for index, _ in short]
            add += [pod.cpu if what == "cpu" else pod.memory if what == "memory" else 1 for _, what in host]
            pods.append(pod)
            adds.append(tuple(add))
        # the lowest top priority any set could have: every deficit covered by the pods up to it
        floor = -PRIORITY_OFFSET - 1
        for d, need in enumerate(deficits):
            got = 0
            for pod, add in zip(pods, adds, strict=True):
                if got >= need:
                    break
                got += add[d]
                floor = max(floor, pod.priority)
            if got < need:
                break  # even every lower-priority pod of these GPUs would not do
        else:
            searches.append((floor, tuple(g.index for g in target), pods, adds, deficits))
    searches.sort(key=lambda t: (t[0], t[1]))
    best: tuple[tuple[object, ...], tuple[PodOnNode, ...], int] | None = None
    best_gpus: tuple[int, ...] = ()
    for floor, gpus, pods, adds, deficits in searches:
        if best is not None and (0, floor) > best[0][:2]:
            break  # sorted by floor: no later GPU set can rank first either
        found = _cheapest(pods, adds, deficits, budgets, gpus, best[0] if best is not None else None)
        if found is not None and (best is None or found[0] < best[0]):
            best, best_gpus = found, gpus
    if best is None:
        return None
    _, chosen, violations = best
    victims = tuple(importance_order(chosen))
    return Candidate(node.name, best_gpus, victims, violations, rank_key(victims, violations, node.name))


def choose_victims(
    nodes: Iterable[PreemptionNode], demand: Demand, priority: int, budgets: Mapping[str, int] | None = None
) -> list[Candidate]:
    """Every node where preemption can place `demand` (of a pod of `priority`), each with its cheapest
    victims, best candidate first (kube-scheduler's order); nodes where nothing can work are left out."""
    found = [c for node in nodes if (c := node_candidate(node, demand, priority, budgets)) is not None]
    found.sort(key=lambda c: c.key)
    return found
