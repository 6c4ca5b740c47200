"""frag's batch scores (`FragPolicy.scores`, `share_placement.frag_scores`) equal `evaluate`'s, score for
score: on random nodes and demands (CPU-only, single-GPU, model-restricted; CPU classes and hostable
sets that move with the pod; nodes without CPU), with the per-state facts and fronts reused across
demands and nodes that change, and after the learned table is rebuilt."""

from __future__ import annotations

import random

import pytest

from share_placement import Demand
from share_placement import FragPolicy
from share_placement import frag_scores as frag_scores_module
from share_placement.model import NEG_INF
from share_placement.model import NodeView
from tests.unit.placement.test_frag_host import single_gpu_table
from tests.unit.placement.test_frag_pricing import MODELS
from tests.unit.placement.test_frag_pricing import random_gpus
from tests.unit.placement.test_frag_pricing import random_table
from tests.unit.placement.test_frag_pricing import taught


def one_by_one(policy: FragPolicy, views: list[NodeView], demand: Demand) -> list[float]:
    """The reference: evaluate per state, from a policy with the same table and no batch caches."""
    out = []
    for view in views:
        ev = policy.evaluate(view, demand)
        out.append(NEG_INF if ev is None else ev[0])
    return out


def random_view(rng: random.Random, unit: int) -> NodeView:
    return (
        random_gpus(rng, unit),
        rng.choice((None, 0, 1500, 2000, 7999, 8000, 30000, 64000, 96000)),
        rng.choice((None, 0, 1000, 4000, 8000, 64000, 10**12)),
    )


def random_demand(rng: random.Random, unit: int) -> Demand:
    count = rng.choice((0, 1, 1, 1))
    per = rng.choice((unit // 20, unit // 10, unit // 4, unit // 2, unit)) if count else 0
    models = (rng.choice(MODELS).lower(),) if rng.random() < 0.2 else ()
    return Demand(per, count, models, rng.choice((0, 250, 500, 1000, 2000, 4000, 9000)), rng.choice((0, 1000, 9000)))


def twin_policies(rng: random.Random, unit: int, table: dict, seed: int) -> tuple[FragPolicy, FragPolicy]:
    quantile = rng.choice((0.5, 0.5, None))
    batch, single = FragPolicy(host_quantile=quantile), FragPolicy(host_quantile=quantile)
    taught(batch, table, random.Random(seed), cpu=True)
    taught(single, table, random.Random(seed), cpu=True)
    return batch, single


@pytest.mark.parametrize("seed", range(5))
def test_batch_scores_equal_evaluate(seed):
    """Random single-GPU workloads (the host fast path's case), random nodes and demands: equal lists."""
    rng = random.Random(300 + seed)
    fits = long_way = 0
    for _ in range(25):
        unit = rng.choice((80, 1000))
        batch, single = twin_policies(rng, unit, single_gpu_table(rng, unit), seed)
        evaluate = batch.evaluate

        def counted(view, demand, evaluate=evaluate):
            nonlocal long_way
            long_way += 1
            return evaluate(view, demand)

        batch.evaluate = counted  # type: ignore[method-assign]
        views = [random_view(rng, unit) for _ in range(60)]
        for _ in range(12):
            d = random_demand(rng, unit)
            got = batch.scores(views, d)
            assert got == one_by_one(single, views, d), d
            fits += sum(s != NEG_INF for s in got)
    assert fits > 3000
    assert 0 < long_way < fits / 2  # both ways taken: most states by the batch's own pricing


@pytest.mark.parametrize(("seed", "facts_limit"), [(0, 20_000), (1, 20_000), (2, 50)])
def test_batch_scores_keep_up_with_changing_nodes_and_tables(seed, facts_limit, monkeypatch):
    """A cluster whose nodes change between demands (new views, some views kept), demands repeated
    (the fronts reused) and the table rebuilt as pods are learned: equal to evaluate throughout, also
    when the kept facts are dropped again and again (a small FACTS_LIMIT)."""
    monkeypatch.setattr(frag_scores_module, "FACTS_LIMIT", facts_limit)
    rng = random.Random(400 + seed)
    unit = 80
    table = single_gpu_table(rng, unit)
    batch, single = twin_policies(rng, unit, table, seed)
    nodes = [random_view(rng, unit) for _ in range(120)]
    demands = [random_demand(rng, unit) for _ in range(6)]
    for step in range(150):
        d = rng.choice(demands) if rng.random() < 0.7 else random_demand(rng, unit)
        assert batch.scores(nodes, d) == one_by_one(single, nodes, d), (step, d)
        for _ in range(rng.randint(0, 4)):  # a few nodes change (a pod binds or leaves)
            nodes[rng.randrange(len(nodes))] = random_view(rng, unit)
        if rng.random() < 0.1:  # a pod of the workload is learned: now and then the table is rebuilt
            learned = Demand(rng.choice((unit // 10, unit // 4, unit)), 1, (), rng.choice((500, 1000, 3000)), 1000)
            batch.observe(learned)
            single.observe(learned)


def test_batch_scores_fall_back_where_the_fast_path_does_not_apply():
    """Multi-GPU classes learned, or a multi-GPU demand: every state goes through evaluate."""
    rng = random.Random(7)
    unit = 80
    table = random_table(rng, unit, cpu=True)
    assert any(k[1] > 1 for k in table)
    batch, single = twin_policies(rng, unit, table, 7)
    views = [random_view(rng, unit) for _ in range(80)]
    for d in (Demand(unit // 4, 2, (), 1000, 1000), Demand(unit // 4, 1, (), 1000, 1000), Demand(0, 0, (), 500, 0)):
        assert batch.scores(views, d) == one_by_one(single, views, d)


def test_a_new_cpu_ask_in_a_known_group_waits_for_the_refresh_a_new_group_does_not():
    """A new CPU ask of a known share size is one more count (the table refreshes when the learned
    count has grown by TABLE_REFRESH); a share size the table has no group for rebuilds it at once."""
    policy = FragPolicy()
    for _ in range(1000):
        policy.observe(Demand(8, 1, (), 1000, 0))
    table = policy.table
    policy.observe(Demand(8, 1, (), 1234, 0))
    assert policy.table is table
    policy.observe(Demand(16, 1, (), 1000, 0))
    assert policy.table is not table
    assert {g.per_gpu for g in policy.table.groups} == {8, 16}
    assert 1234 in next(g for g in policy.table.groups if g.per_gpu == 8).cpus  # learned meanwhile
