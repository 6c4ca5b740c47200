"""The victim choice (share_placement.preemption): the cheapest lower-priority pods whose removal frees room
on one GPU (N for gpu-count N), ranked as kube-scheduler ranks candidates; checked on hand-made nodes and,
by hypothesis, against a brute force over every subset on small nodes."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from collections.abc import Sequence

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from share_placement import Demand
from share_placement import GpuSlot
from share_placement.preemption import PRIORITY_OFFSET
from share_placement.preemption import Candidate
from share_placement.preemption import PodOnNode
from share_placement.preemption import PreemptionNode
from share_placement.preemption import choice_key
from share_placement.preemption import choose_victims
from share_placement.preemption import importance_order
from share_placement.preemption import node_candidate
from share_placement.preemption import pdb_violations
from share_placement.preemption import rank_key

LOW, MID, HIGH = 0, 100, 1000


def pod(uid: str, priority: int, gpus: Mapping[int, int] | None = None, **kw: object) -> PodOnNode:
    return PodOnNode(uid, priority, tuple(sorted((gpus or {}).items())), **kw)  # type: ignore[arg-type]


def node(
    name: str, totals: Sequence[int], pods: Sequence[PodOnNode], models: Sequence[str] = (), **kw: object
) -> PreemptionNode:
    used = [0] * len(totals)
    for p in pods:
        for index, units in p.gpus:
            used[index] += units
    gpus = tuple(GpuSlot(i, models[i] if models else "T4", total, total - used[i]) for i, total in enumerate(totals))
    return PreemptionNode(name, gpus, tuple(pods), **kw)  # type: ignore[arg-type]


def uids(c: Candidate | None) -> list[str]:
    assert c is not None
    return [v.uid for v in c.victims]


# -- the cases ---------------------------------------------------------------------------


def test_split_free_memory_evicts_on_one_gpu_only() -> None:
    # the report, in MiB: free 0:100, 1:400 and a 500 MiB preemptor; freeing the node's total
    # (kube-scheduler's proposal could be pod a) leaves it unplaced, evicting b from GPU 1 places it
    n = node("n1", [1000, 1000], [pod("a", LOW, {0: 900}), pod("b", LOW, {1: 600})])
    c = node_candidate(n, Demand(500), HIGH)
    assert c is not None and c.gpus == (1,) and uids(c) == ["b"]
    assert c.freed == {1: 600}


def test_priority_inversion_takes_the_gpu_whose_victim_ranks_lowest() -> None:
    # GPU 0 can be freed by one mid pod; GPU 1 only by two low pods: kube-scheduler prefers the lower
    # highest priority over fewer victims.
    n = node("n", [10, 10], [pod("m", MID, {0: 8}), pod("l1", LOW, {1: 4}), pod("l2", LOW, {1: 4})])
    c = node_candidate(n, Demand(7), HIGH)
    assert c is not None and c.gpus == (1,) and sorted(uids(c)) == ["l1", "l2"]
    # only the mid pod's GPU can ever fit: then it is the victim
    n2 = node("n", [10, 4], [pod("m", MID, {0: 8}), pod("l1", LOW, {1: 4})])
    c2 = node_candidate(n2, Demand(6), HIGH)
    assert c2 is not None and c2.gpus == (0,) and uids(c2) == ["m"]


def test_never_evicts_equal_or_higher_priority_or_terminating_pods() -> None:
    n = node("n", [10], [pod("eq", HIGH, {0: 5}), pod("hi", HIGH + 1, {0: 5})])
    assert node_candidate(n, Demand(3), HIGH) is None
    n2 = node("n", [10], [pod("t", LOW, {0: 10}, terminating=True)])
    assert node_candidate(n2, Demand(3), HIGH) is None


def test_gpu_count_two_frees_two_gpus() -> None:
    n = node(
        "n",
        [10, 10, 10],
        [pod("a", LOW, {0: 8}), pod("b", LOW, {1: 8}), pod("c", MID, {2: 8}), pod("ab", LOW, {0: 1, 1: 1})],
    )
    c = node_candidate(n, Demand(4, count=2), HIGH)
    assert c is not None and c.gpus == (0, 1) and sorted(uids(c)) == ["a", "b"]


def test_multi_gpu_victim_frees_both_of_its_gpus() -> None:
    n = node("n", [10, 10], [pod("wide", LOW, {0: 6, 1: 6}), pod("x", LOW, {0: 2}), pod("y", LOW, {1: 2})])
    c = node_candidate(n, Demand(7, count=2), HIGH)
    assert c is not None and uids(c) == ["wide"] and c.freed == {0: 6, 1: 6}


def test_choice_between_nodes_follows_kube_schedulers_order() -> None:
    a = node("a", [10], [pod("a1", MID, {0: 10})])
    b = node("b", [10], [pod("b1", LOW, {0: 5}), pod("b2", LOW, {0: 5})])
    c = node("c", [10], [pod("c1", HIGH + 5, {0: 10})])  # nothing can work: left out
    ranked = choose_victims([a, b, c], Demand(8), HIGH)
    assert [r.node for r in ranked] == ["b", "a"]


def test_fewer_victims_break_a_priority_tie_then_less_memory() -> None:
    a = node("a", [10], [pod("a1", LOW, {0: 5}), pod("a2", LOW, {0: 5})])
    b = node("b", [10], [pod("b1", LOW, {0: 10})])
    c = node("c", [20], [pod("c1", LOW, {0: 20})])
    # b and c: one LOW victim each; b frees less memory
    assert [r.node for r in choose_victims([a, b, c], Demand(10), HIGH)] == ["b", "c", "a"]


def test_priority_sum_is_offset_as_upstream() -> None:
    # two pods of priority -5 against one of -5: the sum with MaxInt32+1 offsets prefers one pod
    a = node("a", [10], [pod("a1", -5, {0: 5}), pod("a2", -5, {0: 5})])
    b = node("b", [10], [pod("b1", -5, {0: 10})])
    ranked = choose_victims([a, b], Demand(10), 0)
    assert ranked[0].node == "b"
    assert ranked[0].key[2] == -5 + PRIORITY_OFFSET


def test_latest_start_breaks_the_remaining_tie() -> None:
    a = node("a", [10], [pod("a1", LOW, {0: 10}, start=100.0)])
    b = node("b", [10], [pod("b1", LOW, {0: 10}, start=200.0)])
    assert choose_victims([a, b], Demand(10), HIGH)[0].node == "b"


def test_victims_sorted_by_descending_priority() -> None:
    n = node("n", [10], [pod("l", LOW, {0: 4}), pod("m", MID, {0: 4}), pod("x", LOW + 1, {0: 2})])
    c = node_candidate(n, Demand(10), HIGH)
    assert uids(c) == ["m", "x", "l"]
    assert c is not None and c.highest_priority == MID


def test_pdb_is_a_preference_and_counted_exactly() -> None:
    # GPU 0's pod is under a budget allowing no disruption; GPU 1 needs two pods: the PDB wins first.
    n = node("n", [10, 10], [pod("p", LOW, {0: 10}, pdbs=("ns/pdb",)), pod("q1", MID, {1: 5}), pod("q2", MID, {1: 5})])
    c = node_candidate(n, Demand(10), HIGH, {"ns/pdb": 0})
    assert c is not None and c.gpus == (1,) and c.pdb_violations == 0
    # no other way: the PDB is violated, and said so
    n2 = node("n", [10], [pod("p", LOW, {0: 10}, pdbs=("ns/pdb",))])
    c2 = node_candidate(n2, Demand(10), HIGH, {"ns/pdb": 0})
    assert c2 is not None and c2.pdb_violations == 1
    # a budget with room is no violation
    assert node_candidate(n2, Demand(10), HIGH, {"ns/pdb": 1}).pdb_violations == 0  # type: ignore[union-attr]


def test_pdb_violations_count_only_victims_beyond_the_budget() -> None:
    victims = [pod(f"v{i}", LOW, pdbs=("b",)) for i in range(3)]
    assert pdb_violations(victims, {"b": 1}) == 2
    assert pdb_violations(victims, {"b": 5}) == 0
    assert pdb_violations(victims, {"b": -1}) == 3
    assert pdb_violations(victims, {}) == 3  # a budget the pods name but whose status is unknown allows none
    assert pdb_violations([pod("x", LOW)], {"b": 0}) == 0


def test_host_cpu_memory_and_pod_slots_are_freed_too() -> None:
    n = node(
        "n",
        [10],
        [pod("g", LOW, {0: 10}, cpu=100), pod("cpu", LOW, cpu=900)],
        cpu_free=0,
        memory_free=10,
        pod_slots=5,
    )
    c = node_candidate(n, Demand(10, cpu=500), HIGH)
    assert c is not None and sorted(uids(c)) == ["cpu", "g"]
    full = node("n", [10], [pod("g", LOW, {0: 4}), pod("other", LOW)], pod_slots=0)
    c2 = node_candidate(full, Demand(4), HIGH)  # fits the GPU but no pod slot: one pod must go
    assert c2 is not None and len(c2.victims) == 1
    never = node("n", [10], [pod("g", LOW, {0: 10})], memory_free=0)
    assert node_candidate(never, Demand(1, memory=5), HIGH) is None


def test_models_health_and_size_limit_the_gpus() -> None:
    n = PreemptionNode(
        "n",
        (GpuSlot(0, "T4", 10, 0), GpuSlot(1, "A100", 40, 0), GpuSlot(2, "A100", 40, 0, healthy=False)),
        (pod("a", LOW, {0: 10}), pod("b", LOW, {1: 40}), pod("c", LOW, {2: 40})),
    )
    assert node_candidate(n, Demand(5, models=("a100",)), HIGH).gpus == (1,)  # type: ignore[union-attr]
    assert node_candidate(n, Demand(20), HIGH).gpus == (1,)  # type: ignore[union-attr]
    assert node_candidate(n, Demand(50), HIGH) is None


def test_a_demand_that_fits_already_needs_no_victim() -> None:
    n = node("n", [10], [pod("a", LOW, {0: 5})])
    c = node_candidate(n, Demand(5), HIGH)
    assert c is not None and c.victims == () and c.gpus == (0,)


# -- brute force ---------------------------------------------------------------------------------


def brute_force(n: PreemptionNode, demand: Demand, priority: int, budgets: Mapping[str, int]) -> tuple | None:
    """The minimum key over every subset of eligible pods and every GPU set it makes fit."""
    eligible = [p for p in n.pods if p.priority < priority and not p.terminating]
    usable = [g for g in n.gpus if g.healthy and g.total >= demand.per_gpu and demand.model_allowed(g.model)]
    best = None
    for r in range(len(eligible) + 1):
        for subset in itertools.combinations(eligible, r):
            freed: dict[int, int] = {}
            for p in subset:
                for index, units in p.gpus:
                    freed[index] = freed.get(index, 0) + units
            if demand.cpu > 0 and n.cpu_free is not None and n.cpu_free + sum(p.cpu for p in subset) < demand.cpu:
                continue
            if (
                demand.memory > 0
                and n.memory_free is not None
                and n.memory_free + sum(p.memory for p in subset) < demand.memory
            ):
                continue
            if n.pod_slots is not None and n.pod_slots + len(subset) < 1:
                continue
            fitting = [g for g in usable if g.free + freed.get(g.index, 0) >= demand.per_gpu]
            targets = itertools.combinations(fitting, demand.count) if demand.count else [()]
            for target in targets:
                key = choice_key(subset, pdb_violations(subset, budgets), [g.index for g in target])
                if best is None or key < best:
                    best = key
    return best


@st.composite
def small_nodes(draw: st.DrawFn) -> tuple[PreemptionNode, Demand, int, dict[str, int]]:
    gpu_count = draw(st.integers(1, 3))
    totals = [draw(st.sampled_from([4, 8])) for _ in range(gpu_count)]
    pods = []
    used = [0] * gpu_count
    for k in range(draw(st.integers(0, 7))):
        width = draw(st.integers(0, min(2, gpu_count)))
        indices = draw(st.permutations(range(gpu_count)))[:width]
        units = draw(st.integers(1, 4))
        gpus = {i: units for i in indices if used[i] + units <= totals[i]}
        for i in gpus:
            used[i] += units
        pods.append(
            PodOnNode(
                f"p{k}",
                draw(st.sampled_from([-3, 0, 0, 5, 5, 10, 20])),
                tuple(sorted(gpus.items())),
                cpu=draw(st.sampled_from([0, 100, 300])),
                memory=draw(st.sampled_from([0, 1, 2])),
                pdbs=tuple(draw(st.lists(st.sampled_from(["x", "y"]), max_size=2, unique=True))),
                start=float(draw(st.integers(0, 3))),
                terminating=draw(st.booleans()) and draw(st.booleans()),
            )
        )
    gpus = tuple(
        GpuSlot(i, draw(st.sampled_from(["T4", "A100"])), t, t - used[i], draw(st.booleans()) or draw(st.booleans()))
        for i, t in enumerate(totals)
    )
    n = PreemptionNode(
        "n",
        gpus,
        tuple(pods),
        cpu_free=draw(st.none() | st.integers(-100, 400)),
        memory_free=draw(st.none() | st.integers(-1, 3)),
        pod_slots=draw(st.none() | st.integers(-1, 2)),
    )
    demand = Demand(
        draw(st.integers(1, 8)),
        count=draw(st.integers(0, 3)),
        models=draw(st.sampled_from([(), ("a100",)])),
        cpu=draw(st.sampled_from([0, 200, 500])),
        memory=draw(st.sampled_from([0, 2])),
    )
    budgets = {k: draw(st.integers(0, 2)) for k in ("x", "y") if draw(st.booleans())}
    return n, demand, draw(st.sampled_from([0, 5, 10, 30])), budgets


@settings(max_examples=400, deadline=None)
@given(small_nodes())
def test_search_equals_brute_force(case: tuple[PreemptionNode, Demand, int, dict[str, int]]) -> None:
    n, demand, priority, budgets = case
    expected = brute_force(n, demand, priority, budgets)
    got = node_candidate(n, demand, priority, budgets)
    if expected is None:
        assert got is None
        return
    assert got is not None and choice_key(got.victims, got.pdb_violations, got.gpus) == expected
    assert got.key == rank_key(got.victims, got.pdb_violations, n.name)
    assert got.pdb_violations == pdb_violations(got.victims, budgets)
    assert list(got.victims) == importance_order(got.victims)
    assert all(v.priority < priority and not v.terminating for v in got.victims)
    freed = got.freed
    for index in got.gpus:
        slot = next(g for g in n.gpus if g.index == index)
        assert slot.free + freed[index] >= demand.per_gpu


@settings(max_examples=150, deadline=None)
@given(st.lists(small_nodes(), min_size=1, max_size=4))
def test_ranking_across_nodes_is_the_minimum_of_each_nodes_minimum(cases: list) -> None:
    demand, priority, budgets = cases[0][1], cases[0][2], cases[0][3]
    nodes = [
        PreemptionNode(f"n{i}", c[0].gpus, c[0].pods, c[0].cpu_free, c[0].memory_free, c[0].pod_slots)
        for i, c in enumerate(cases)
    ]
    ranked = choose_victims(nodes, demand, priority, budgets)
    assert [c.node for c in ranked] == sorted(
        (nd.name for nd in nodes if brute_force(nd, demand, priority, budgets) is not None),
        key=lambda name: next(c.key for c in ranked if c.node == name),
    )
    assert [c.key for c in ranked] == sorted(c.key for c in ranked)
    for c in ranked:
        nd = next(nd for nd in nodes if nd.name == c.node)
        assert choice_key(c.victims, c.pdb_violations, c.gpus) == brute_force(nd, demand, priority, budgets)


@st.composite
def crowded_gpus(draw: st.DrawFn) -> tuple[PreemptionNode, Demand, int, dict[str, int]]:
    """Two GPUs with many small pods: the search's fronts grow, the brute force still runs."""
    pods, used = [], [0, 0]
    for k in range(draw(st.integers(4, 11))):
        index = draw(st.integers(0, 1))
        units = draw(st.integers(1, 3))
        wide = draw(st.integers(0, 5)) == 0
        gpus = {0: units, 1: units} if wide else {index: units}
        if all(used[i] + u <= 16 for i, u in gpus.items()):
            for i, u in gpus.items():
                used[i] += u
            pods.append(
                PodOnNode(
                    f"p{k}",
                    draw(st.sampled_from([0, 1, 2])),
                    tuple(sorted(gpus.items())),
                    pdbs=("x",) if draw(st.integers(0, 4)) == 0 else (),
                    start=float(draw(st.integers(0, 2))),
                )
            )
    n = PreemptionNode("n", tuple(GpuSlot(i, "T4", 16, 16 - used[i]) for i in range(2)), tuple(pods))
    demand = Demand(draw(st.integers(4, 16)), count=draw(st.integers(1, 2)))
    return n, demand, 3, {"x": draw(st.integers(0, 1))}


@settings(max_examples=200, deadline=None)
@given(crowded_gpus())
def test_search_equals_brute_force_on_crowded_gpus(case: tuple[PreemptionNode, Demand, int, dict[str, int]]) -> None:
    n, demand, priority, budgets = case
    expected = brute_force(n, demand, priority, budgets)
    got = node_candidate(n, demand, priority, budgets)
    assert (got is None) == (expected is None)
    if got is not None:
        assert choice_key(got.victims, got.pdb_violations, got.gpus) == expected
