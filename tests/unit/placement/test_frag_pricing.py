"""frag's exact pricing: the incremental paths equal a recount, and decide as the float formula does.

`fragmentation_units` is the definition (integers: pods observed instead of probabilities). Every
faster path (`Pricer.delta`, `delta_one`, `prefix_of`, the policy's single- and multi-GPU fast paths
without CPU) must give exactly the same integer, so the same decisions. The integer definition must
agree with the probability-weighted float formula (`float_fragmentation` below) up to rounding, and
choose the same node on random clusters. Without CPU information (the extender's case) that float
formula is the one frag used before this pricing, unchanged; with CPU it shares the node's CPU among
the pods that fill it instead of letting each class fill the node alone (`per_class_cpu=True` keeps
the earlier rule, to show the two differ only there).
"""

from __future__ import annotations

import random
from bisect import bisect_right
from fractions import Fraction

import pytest

from share_placement import Demand
from share_placement import FragPolicy
from share_placement import GpuView
from share_placement import WorkloadTable
from share_placement import eligible_positions
from share_placement import fill_ratio
from share_placement import fragmentation
from share_placement import fragmentation_units
from share_placement import group_aggregates
from share_placement.binpack import best_fit
from share_placement.frag_pricing import Pricer
from share_placement.patterns import GapPrices

MODELS = ("T4", "V100", "A100")


def float_fragmentation(
    gpus: GpuView, cpu_free: int | None, table: WorkloadTable, fill_weight: float = 0.6, per_class_cpu: bool = False
) -> float:
    """frag's fragmentation in probabilities and floats, written out term by term."""
    total = sum(f for _, f in gpus)
    if total == 0:
        return 0.0
    next_pod = fill = 0.0
    fill_units = cpu_need = 0.0  # shared CPU: GPU units the hostable groups fill, CPU they ask for it
    for g, (room, usable, slots) in zip(table.groups, group_aggregates(gpus, table), strict=True):
        per, count = g.per_gpu, g.count
        if room < count:
            next_pod += g.prob * total
            fill += g.prob * total
            continue
        if count != 1:
            slots = room // count
        stranded = total - usable
        take = per * count
        if cpu_free is None:
            next_pod += g.prob * stranded
            fill += g.prob * (total - slots * take)
            continue
        j = bisect_right(g.cpus, cpu_free)
        ok = g.cum[j]
        next_pod += ok * stranded + (g.prob - ok) * total
        fill += g.prob * total
        for i in range(j):
            cpu, p = g.cpus[i], g.cum[i + 1] - g.cum[i]
            if per_class_cpu:
                fill -= p * take * (slots if cpu == 0 else min(slots, cpu_free // cpu))
            else:
                fill_units += p * take * slots
                cpu_need += p * slots * cpu
    if cpu_free is not None and not per_class_cpu:
        fill -= fill_units * (1.0 if cpu_need <= cpu_free else cpu_free / cpu_need)
    return (1.0 - fill_weight) * next_pod + fill_weight * fill


def random_table(rng: random.Random, unit: int, cpu: bool) -> dict:
    sizes = (unit // 20, unit // 10, unit // 4, unit // 2, unit * 3 // 5, unit)
    counts: dict = {}
    for _ in range(rng.randint(1, 14)):
        count = rng.choice((1, 1, 1, 2, 4, 8))
        per = unit if count > 1 and rng.random() < 0.5 else rng.choice(sizes)
        models = (rng.choice(MODELS).lower(),) if rng.random() < 0.25 else ()
        key = (per, count, models, rng.choice((0, 2000, 8000, 32000)) if cpu else 0)
        counts[key] = counts.get(key, 0.0) + float(rng.randint(1, 9))
    return counts


def random_gpus(rng: random.Random, unit: int) -> GpuView:
    model = rng.choice(MODELS)
    out = []
    for _ in range(rng.choice((1, 2, 4, 8, 8, 16))):
        m = model if rng.random() < 0.85 else rng.choice(MODELS)
        out.append((m, max(0, rng.choice((0, unit, unit, unit - rng.randint(1, unit))))))
    return tuple(out)


def test_exact_fragmentation_is_the_float_definition():
    rng = random.Random(1)
    differs = 0
    for _ in range(3000):
        unit = rng.choice((80, 1000))
        t = WorkloadTable.from_counts(random_table(rng, unit, cpu=True))
        gpus = random_gpus(rng, unit)
        cpu = rng.choice((None, 0, 3000, 16000, 64000))
        for w in (0.0, 0.6, 1.0):
            # Integers, rounded down to 1 / (pods x 5) of a unit where the CPU runs out.
            want = float_fragmentation(gpus, cpu, t, w)
            assert fragmentation(gpus, cpu, t, w) == pytest.approx(want, rel=1e-9, abs=1.0 / t.weight)
            earlier = float_fragmentation(gpus, cpu, t, w, per_class_cpu=True)
            if cpu is None:
                assert earlier == pytest.approx(want, rel=1e-9)  # the extender's case did not change
            differs += abs(earlier - want) > 1e-6
    assert differs  # with CPU, the shared budget is a different measure


def test_incremental_prices_equal_the_recount_exactly():
    rng = random.Random(2)
    wa, wb = fill_ratio(0.6)
    assert (wa, wb) == (3, 5)
    for _ in range(3000):
        unit = rng.choice((80, 1000))
        t = WorkloadTable.from_counts(random_table(rng, unit, cpu=False))
        pricer = Pricer(t, wa, wb)
        gpus = random_gpus(rng, unit)
        total = sum(f for _, f in gpus)
        before = fragmentation_units(total, group_aggregates(gpus, t), None, t, wa, wb)
        sums = pricer.key_sums(tuple(sorted(gpus)))
        for m in MODELS:
            assert pricer.prefix_of(gpus, m) == pricer.prefix(m, sums)
        per = rng.choice((unit // 20, unit // 4, unit // 2, unit))
        for i, (m, f) in enumerate(gpus):  # one GPU
            if f < per:
                continue
            after = list(gpus)
            after[i] = (m, f - per)
            want = fragmentation_units(total - per, group_aggregates(tuple(after), t), None, t, wa, wb) - before
            assert pricer.delta_one(sums, m, f, f - per) == want
            assert pricer.delta(sums, [(m, f, f - per)]) == want
        room = [i for i, (_, f) in enumerate(gpus) if f >= per]  # several GPUs
        if len(room) >= 2:
            chosen = rng.sample(room, rng.randint(2, len(room)))
            after = list(gpus)
            for i in chosen:
                after[i] = (gpus[i][0], gpus[i][1] - per)
            want = fragmentation_units(total - per * len(chosen), group_aggregates(tuple(after), t), None, t, wa, wb)
            changes = [(gpus[i][0], gpus[i][1], gpus[i][1] - per) for i in chosen]
            assert pricer.delta(sums, changes) == want - before


_GAPS: dict = {}


def reference_prices(policy: FragPolicy) -> GapPrices | None:
    """The LP solved here from the table's counts: the single-GPU classes below a GPU (the policy's
    `gpu_unit`, else the largest request learned); None when nothing is priced."""
    t = policy.table
    unit = policy.gpu_unit or max((g.per_gpu for g in t.groups), default=0)
    counts: dict[int, int] = {}
    for g in t.groups:
        if g.count == 1 and 0 < g.per_gpu < unit:
            counts[g.per_gpu] = counts.get(g.per_gpu, 0) + g.weight
    if not counts or not policy.gap_weight:
        return None
    key = (tuple(sorted(counts.items())), unit)
    gp = _GAPS.get(key)
    if gp is None:
        gp = _GAPS[key] = GapPrices(counts, unit)
    return gp


def reference_loss(policy: FragPolicy, free: int, per: int) -> Fraction:
    """The LP gap loss of a share of `per` where `free` is free (`reference_prices`)."""
    gp = reference_prices(policy)
    return Fraction(0) if gp is None else gp.loss(free, per)


def reference_gap(policy: FragPolicy, free: int, per: int) -> int:
    """`reference_loss` x the gap weight, in the exact units `fragmentation_units` counts in."""
    return to_units(policy, reference_loss(policy, free, per))


def to_units(policy: FragPolicy, loss: Fraction) -> int:
    wb = fill_ratio(policy.fill_weight)[1]
    w = Fraction(policy.gap_weight).limit_denominator(1000)
    return round(w * policy.table.weight * wb * loss)


def reference_needs(observed: list[Demand], q: float) -> dict[int, tuple[int, int]]:
    """Per single-GPU size: the q-quantile (position min(n - 1, int(q x n)) sorted) of its pods' CPU and
    of their memory asks."""
    out = {}
    for per in {d.per_gpu for d in observed if d.count == 1}:
        cpus = sorted(d.cpu for d in observed if d.count == 1 and d.per_gpu == per)
        mems = sorted(d.memory for d in observed if d.count == 1 and d.per_gpu == per)
        at = min(len(cpus) - 1, int(q * len(cpus)))
        out[per] = (cpus[at], mems[at])
    return out


def reference_knapsack(prices: dict[int, Fraction], sizes: set[int], r: int) -> Fraction:
    """The most pods of `sizes` (any number of each) fitting r units earn at `prices`, by brute force."""
    best = [Fraction(0)] * (r + 1)
    for x in range(1, r + 1):
        best[x] = max([best[x - 1]] + [best[x - s] + prices[s] for s in sizes if s <= x])
    return best[r]


def reference_host_loss(
    policy: FragPolicy, observed: list[Demand], view, demand: Demand, chosen: tuple[int, ...]
) -> Fraction:
    """frag's host-aware gap price written out: a gap is worth the knapsack over the priced sizes whose
    typical pod (`reference_needs`) the node can host; a priced share loses V(before) - V(after) - pi,
    anything else what the node's other partly used GPUs lose."""
    gpus, cpu, mem = view
    gp = reference_prices(policy)
    if gp is None:
        return Fraction(0)
    prices, unit = gp.price, gp.capacity
    needs = reference_needs(observed, policy.host_quantile)
    after_mem = None if mem is None else mem - demand.memory

    def hostable(c: int, m: int | None) -> set[int]:
        return {s for s, p in prices.items() if p > 0 and needs[s][0] <= c and (m is None or needs[s][1] <= m)}

    before, after = hostable(cpu, mem), hostable(cpu - demand.cpu, after_mem)
    share = demand.count == 1 and demand.per_gpu in prices
    loss = Fraction(0)
    for j, (_, f) in enumerate(gpus):
        if share and j == chosen[0]:
            loss += reference_knapsack(prices, before, f) - reference_knapsack(prices, after, f - demand.per_gpu)
            loss -= prices[demand.per_gpu]
        elif 0 < f < unit and j not in chosen:
            loss += reference_knapsack(prices, before, f) - reference_knapsack(prices, after, f)
    return loss


def reference_price(policy: FragPolicy, observed: list[Demand], view, demand: Demand, chosen) -> Fraction:
    """The gap price (before its weight) of `chosen`: the plain LP loss without CPU, host-aware with it."""
    if view[1] is not None and policy.host_quantile is not None:
        return reference_host_loss(policy, observed, view, demand, chosen)
    if demand.count == 1:
        return reference_loss(policy, view[0][chosen[0]][1], demand.per_gpu)
    return Fraction(0)


def reference_evaluate(policy: FragPolicy, view, demand: Demand, observed: list[Demand] | None = None):
    """frag's decision by recounting the node for every candidate (the general path, no shortcuts),
    plus the LP gap price (`reference_price`; `observed`: the demands taught, when CPU is known)."""
    elig = eligible_positions(view, demand)
    if elig is None:
        return None
    gpus, cpu_free, _ = view
    t = policy.table
    wa, wb = fill_ratio(policy.fill_weight)
    cpu_after = None if cpu_free is None else cpu_free - demand.cpu
    total = sum(f for _, f in gpus)
    before = fragmentation_units(total, group_aggregates(gpus, t), cpu_free, t, wa, wb)
    if demand.count == 1:
        candidates = []
        for i in elig:
            if all(gpus[c[0]] != gpus[i] for c in candidates):
                candidates.append((i,))
    else:
        candidates = [best_fit(view, elig, demand.count)]
    best = None
    for chosen in candidates:
        after = list(gpus)
        for i in chosen:
            after[i] = (after[i][0], after[i][1] - demand.per_gpu)
        taken = demand.per_gpu * len(chosen)
        delta = fragmentation_units(total - taken, group_aggregates(tuple(after), t), cpu_after, t, wa, wb) - before
        delta += to_units(policy, reference_price(policy, observed or [], view, demand, chosen))
        left = sum(gpus[i][1] for i in chosen) - taken
        if best is None or (delta, left) < best[:2]:
            best = (delta, left, chosen)
    return policy._finish(best[0], best[1], best[2], gpus, demand.per_gpu, cpu_after)


@pytest.mark.parametrize("seed", range(3))
def test_a_nodes_units_kept_per_cpu_class_are_the_recount_at_every_free_cpu(seed):
    """FragPolicy keeps `fragmentation_sums` per (aggregates, CPU class): one GPU state priced at many free
    CPUs, those of one class sharing the pass over the groups and those the fill runs out of CPU at
    shrinking it by their own, must each equal `fragmentation_units` counted afresh."""
    rng = random.Random(40 + seed)
    shared = 0
    for _ in range(30):
        unit = rng.choice((80, 1000))
        p = FragPolicy()
        taught(p, random_table(rng, unit, cpu=True), rng, cpu=True)
        t = p.table
        wa, wb = fill_ratio(p.fill_weight)
        breaks = sorted({c for g in t.groups for c in g.cpus})
        for _ in range(10):
            gpus = random_gpus(rng, unit)
            total = sum(f for _, f in gpus)
            cpus = {0, 1, 7, 999, 64000, *breaks, *(b - 1 for b in breaks), *(b + rng.randint(1, 500) for b in breaks)}
            cpus = sorted(c for c in cpus if c >= 0)
            kept = len(p._pricer.class_sums)
            for cpu in cpus:
                want = fragmentation_units(total, group_aggregates(tuple(sorted(gpus)), t), cpu, t, wa, wb)
                assert p.node_units(gpus, cpu) == want, (gpus, cpu)
            if total:  # a node with nothing free is 0 without a pass
                shared += len(cpus) - (len(p._pricer.class_sums) - kept)
    assert shared > 0  # some free CPUs were answered from a class's sums


@pytest.mark.parametrize("cpu", [False, True])
def test_fast_paths_decide_exactly_as_a_recount(cpu):
    rng = random.Random(3 + cpu)
    priced = 0
    for _ in range(60):
        unit = rng.choice((80, 1000))
        p = FragPolicy()
        observed = taught(p, random_table(rng, unit, cpu), rng, cpu)
        for _ in range(40):
            view = (
                random_gpus(rng, unit),
                rng.choice((0, 2000, 8000, 64000)) if cpu else None,
                rng.choice((None, 0, 4000, 64000)) if cpu else None,
            )
            count = rng.choice((0, 1, 1, 1, 2, 4))
            per = rng.choice((unit // 20, unit // 4, unit // 2, unit)) if count else 0
            models = (rng.choice(MODELS).lower(),) if rng.random() < 0.2 else ()
            d = Demand(per, count, models, rng.choice((0, 4000)) if cpu else 0, rng.choice((0, 2000)) if cpu else 0)
            ev = p.evaluate(view, d)
            assert ev == reference_evaluate(p, view, d, observed)
            if ev is not None:  # was any candidate priced?
                options = [(i,) for i in eligible_positions(view, d) or ()] if count == 1 else [ev[1]]
                priced += any(reference_price(p, observed, view, d, c) for c in options)
    assert priced > 30  # the gap price took part, not only frag's own


def taught(policy: FragPolicy, table: dict, rng: random.Random, cpu: bool) -> list[Demand]:
    """Teach `policy` the table's classes (memory asks drawn when CPU is known); the demands taught."""
    observed = []
    for (per, count, models, c), n in table.items():
        for _ in range(int(n)):
            d = Demand(per, count, models, c, rng.choice((0, 1000, 8000)) if cpu else 0)
            policy.observe(d)
            observed.append(d)
    return observed


def test_the_exact_scores_choose_the_nodes_the_float_scores_chose():
    """Random clusters: the node frag picks is the node the float formula's scores pick."""
    rng = random.Random(5)
    for _ in range(40):
        unit = rng.choice((80, 1000))
        cpu = rng.random() < 0.5
        p = FragPolicy()
        observed = taught(p, random_table(rng, unit, cpu), rng, cpu)
        views = [(random_gpus(rng, unit), rng.choice((0, 8000, 64000)) if cpu else None, None) for _ in range(40)]
        for _ in range(10):
            d = Demand(rng.choice((unit // 10, unit // 2, unit)), rng.choice((1, 1, 2)), (), 2000 if cpu else 0)
            exact = [None if (e := p.evaluate(v, d)) is None else e[0] for v in views]
            assert first_best(exact) == first_best([float_score(p, v, d, observed) for v in views])


def first_best(scores: list[float | None]) -> int | None:
    """The index of the highest score, the first on ties (as share-sim and the extender pick)."""
    best = None
    for i, s in enumerate(scores):
        if s is not None and (best is None or s > scores[best]):
            best = i
    return best


def float_score(policy: FragPolicy, view, demand: Demand, observed: list[Demand]) -> float | None:
    """The node's score from the float formula, for the GPUs the exact path chose."""
    ev = policy.evaluate(view, demand)
    if ev is None:
        return None
    gpus, cpu_free, _ = view
    chosen = ev[1]
    after = list(gpus)
    for i in chosen:
        after[i] = (after[i][0], after[i][1] - demand.per_gpu)
    cpu_after = None if cpu_free is None else cpu_free - demand.cpu
    t = policy.table
    delta = float_fragmentation(tuple(after), cpu_after, t) - float_fragmentation(gpus, cpu_free, t)
    left = sum(gpus[i][1] for i in chosen) - demand.per_gpu * len(chosen)
    node_left = sum(f for _, f in gpus) - demand.per_gpu * len(chosen)
    cpu_term = 0.0 if cpu_after is None else cpu_after / (cpu_after + 1e6)
    if chosen:
        delta += policy.pressure * policy.model_pressure(gpus[chosen[0]][0]) * demand.per_gpu * len(chosen)
    delta += policy.gap_weight * float(reference_price(policy, observed, view, demand, chosen))
    return -(delta + 1e-7 * left + 1e-10 * (node_left + cpu_term))


def test_whole_counts_only():
    with pytest.raises(ValueError, match="whole numbers"):
        WorkloadTable.from_counts({(500, 1, (), 0): 1.5})


def test_the_pods_that_fill_a_node_share_its_cpu():
    # Three 1-GPU pods ask 4 cores for every one that asks 18: on average 7.5 cores a pod.
    t = WorkloadTable.from_counts({(1000, 1, (), 4000): 3.0, (1000, 1, (), 18000): 1.0})
    g2 = tuple(("G2", 1000) for _ in range(8))
    # 96 cores: the mix fills all 8 GPUs (60 cores). Class by class, the 18-core pods would fill only 5
    # and strand 3 GPUs a quarter of the time (750 units): the rule that sent such pods to 128-core nodes.
    assert fragmentation(g2, 96000, t, fill_weight=1.0) == 0.0
    assert float_fragmentation(g2, 96000, t, fill_weight=1.0, per_class_cpu=True) == pytest.approx(750)
    # 36 cores: the mix fills 36 / 7.5 = 4.8 GPUs, so 3.2 stay unused.
    assert fragmentation(g2, 36000, t, fill_weight=1.0) == pytest.approx(3200)


@pytest.mark.parametrize("seed", range(4))
def test_shared_state_tables_decide_exactly_as_a_recount(seed):
    """The extender's case at scale: many nodes priced through the tables shared by nodes with the same
    room counts (`Pricer.node_sig`, `room_prefix`, `gpu_info`), sizes new and seen, single- and
    multi-GPU, nodes of one model and of several, then a table rebuilt with the same keys (the nodes'
    signatures carried over) and with new keys: every answer is the recount's."""
    rng = random.Random(100 + seed)
    unit = rng.choice((80, 1000))
    sizes = (unit // 20, unit // 10, unit // 8, unit // 4, unit // 2, unit)
    p = FragPolicy()
    models_of = ((), (), ("a100",)) if seed % 2 else ((),)

    def learn(n: int, counts: tuple[int, ...]) -> None:
        for _ in range(n):
            # Multi-GPU classes unrestricted (the keys' fast path); single-GPU ones sometimes restricted.
            count = rng.choice(counts)
            models = () if count > 1 else rng.choice(models_of)
            p.observe(Demand(rng.choice(sizes), count, models))

    def view():
        model = rng.choice(MODELS)
        gpus = []
        for _ in range(rng.choice((1, 2, 4, 8, 8, 8))):
            m = model if rng.random() < 0.9 else rng.choice(MODELS)
            f = rng.choice((0, unit, unit, unit - sum(rng.choice(sizes) for _ in range(rng.randint(1, 3)))))
            gpus.append((m, max(0, f)))
        return (tuple(gpus), None, None)

    learn(300, (1, 1, 1, 2, 4))
    views = [view() for _ in range(300)]
    demands = [
        Demand(per, count, models)
        for per in (*sizes, unit * 3 // 10)  # the last: a size the workload never asked for
        for count in (1, 2, 3)
        for models in ((), ("a100",))
    ]
    priced = 0
    for rebuild in range(3):
        for d in demands:
            for v in views:
                assert p.evaluate(v, d) == reference_evaluate(p, v, d), (rebuild, d, v)
                if d.count == 1:
                    priced += any(reference_gap(p, f, d.per_gpu) for _, f in v[0] if f >= d.per_gpu)
        if rebuild == 0:
            before = p._pricer
            learn(100, (1, 1, 1, 2, 4))  # > 2 % more pods, same keys: a new table, signatures kept
            _ = p.table
            assert p._pricer is not before and p._pricer.node_sigs is before.node_sigs
        else:
            keys = p._pricer.keys
            for _ in range(50):  # 8-GPU pods of a new size: a new key, signatures start afresh
                p.observe(Demand(unit * 3 // 10 + rebuild, 8))
            _ = p.table
            assert p._pricer.keys != keys
        assert p._pricer.all_qs is not None  # the shared tables' path, not the general one
        assert p._pricer.node_sigs or rebuild
    assert priced > 100


def test_the_gap_price_follows_the_learned_table():
    """The LP is solved per table: new sizes learned, new prices; the GPU's capacity is the largest
    request learned unless the caller gives it (share-sim gives the largest GPU)."""
    p = FragPolicy()
    for per, n in ((1000, 10), (810, 30), (470, 40), (320, 30)):
        for _ in range(n):
            p.observe(Demand(per))
    gp = p._pricer.gap_prices() if p.table else None
    assert gp is not None and gp.price == {810: 1000, 470: 500, 320: Fraction(1000, 3)}
    assert p._pricer.gap(530, 320) == round(1000 * p.table.weight * 5 * Fraction(500, 3))  # wb = 5 at 0.6
    for _ in range(60):  # many 190s: 810 + 190 now fills a GPU, so a 190 is worth something
        p.observe(Demand(190))
    gp2 = p._pricer.gap_prices() if p.table else None
    assert gp2 is not None and gp2 is not gp and gp2.price[190] > 0
    # Given a GPU of 2000 units, a 1000-unit pod is a share too.
    q = FragPolicy(gpu_unit=2000)
    for per in (1000, 810, 470):
        q.observe(Demand(per))
    _ = q.table
    assert set(q._pricer.gap_prices().price) == {1000, 810, 470}  # type: ignore[union-attr]


def test_without_the_gap_weight_frag_is_frag_alone():
    rng = random.Random(11)
    with_gap, alone = FragPolicy(), FragPolicy(gap_weight=0)
    for per, n in ((1000, 10), (810, 30), (470, 40), (320, 30), (160, 5)):
        for _ in range(n):
            with_gap.observe(Demand(per))
            alone.observe(Demand(per))
    differ = 0
    for _ in range(300):
        view = (tuple(("A100", rng.choice((1000, 530, 680, 190, 370, 210))) for _ in range(4)), None, None)
        d = Demand(rng.choice((810, 470, 320, 160)))
        assert alone.evaluate(view, d) == reference_evaluate(alone, view, d)
        assert alone._pricer.gap_prices() is None
        a, b = alone.evaluate(view, d), with_gap.evaluate(view, d)
        differ += a is not None and b is not None and a[1] != b[1]
    assert differ  # the price moves shares to other GPUs


def test_before_any_pod_is_seen_frag_places_as_binpack():
    """docs/policies.md: with nothing learned, frag is best fit (GPU, then node), as binpack is."""
    from share_placement import GpuSlot
    from share_placement import NodeState
    from share_placement import best_node
    from share_placement import make_policy

    rng = random.Random(9)
    nodes = [
        NodeState(f"n{i}", tuple(GpuSlot(g, "A100", 80, rng.choice((0, 10, 30, 50, 80))) for g in range(4)))
        for i in range(300)
    ]
    for d in (Demand(10), Demand(30), Demand(20, 2), Demand(50, 3)):
        frag, binpack = make_policy("frag"), make_policy("binpack")
        chosen = best_node(nodes, d, frag)
        assert chosen is not None and chosen == best_node(nodes, d, binpack), d
        assert frag.choose(chosen, d) == binpack.choose(chosen, d), d


def host_taught() -> FragPolicy:
    """Shares of 810, 470 and 320 units asking 8 or 16 cores (median 8) and 4-12 GiB, whole GPUs."""
    p = FragPolicy()
    for per, n in ((1000, 10), (810, 30), (470, 40), (320, 30)):
        for i in range(n):
            p.observe(Demand(per, 1, (), 16000 if i % 3 == 0 else 8000, 4096 * (1 + i % 3)))
    return p


def test_the_typical_pod_of_a_size_is_its_median_ask():
    p = host_taught()
    assert p.host_needs() == {1000: (8000, 8192), 810: (8000, 8192), 470: (8000, 8192), 320: (8000, 8192)}
    p.host_quantile = 0.0
    assert p.host_needs()[470] == (8000, 4096)
    p.host_quantile = 1.0
    assert p.host_needs()[470] == (16000, 12288)
    with pytest.raises(ValueError, match="host_quantile"):
        FragPolicy(host_quantile=1.5)


def test_with_room_for_every_size_the_host_aware_price_is_the_plain_one():
    p = host_taught()
    pricer = p._pricer if p.table else None
    assert pricer is not None and pricer.gap_prices() is not None
    pricer.host_needs = p.host_needs()
    gpus = (("A100", 530), ("A100", 1000), ("A100", 190))
    roomy = (10**6, 10**6)
    for pos, per in ((0, 470), (0, 320), (1, 810), (1, 320), (2, 160)):
        assert pricer.host_gap(gpus, pos, per, roomy, roomy) == pricer.gap(gpus[pos][1], per)


def test_a_gap_no_pod_can_reach_is_worth_nothing():
    p = host_taught()
    pricer = p._pricer if p.table else None
    assert pricer is not None
    gp = pricer.gap_prices()
    assert gp is not None
    pricer.host_needs = p.host_needs()
    gpus = (("A100", 530), ("A100", 1000), ("A100", 0))
    scale = p.gap_weight * p.table.weight * fill_ratio(p.fill_weight)[1]
    # A CPU-only pod that takes the node's last 8 cores strands the 530 gap: it costs what a 470 earns.
    assert pricer.host_strand(gpus, (), (8000, 10**6), (0, 10**6)) == round(scale * gp.price[470])
    # Memory counts too: too little left for the typical share of any size.
    assert pricer.host_strand(gpus, (), (10**6, 8192), (10**6, 4096)) == round(scale * gp.price[470])
    # Leaving enough for the typical share costs nothing, nor does a node with no partly used GPU.
    assert pricer.host_strand(gpus, (), (16000, 10**6), (8000, 10**6)) == 0
    assert pricer.host_strand((("A100", 1000),), (), (8000, 10**6), (0, 10**6)) == 0
    # The node's last share: a 470 in the 530 gap loses nothing, a 320 what it always did (K(530) - pi).
    assert pricer.host_gap(gpus, 0, 470, (8000, 10**6), (0, 10**6)) == 0
    assert pricer.host_gap(gpus, 0, 320, (8000, 10**6), (0, 10**6)) == pricer.gap(530, 320) > 0
    # A gap no typical pod can reach (4 cores left) is worth nothing: a small pod that fills it earns its
    # price there instead of losing K(530) - K(210) - pi(320).
    assert pricer.host_gap(gpus, 0, 320, (4000, 10**6), (0, 10**6)) == round(scale * -gp.price[320])


def test_the_extender_view_keeps_the_plain_price():
    """No CPU known (the extender): the host-aware price never enters, whatever was learned."""
    p = host_taught()
    view = ((("A100", 530), ("A100", 1000)), None, None)
    d = Demand(320, 1, (), 8000)
    assert p.evaluate(view, d) == reference_evaluate(p, view, d)
    assert p._pricer.host_needs is None
