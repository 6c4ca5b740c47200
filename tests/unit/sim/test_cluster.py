"""ClusterState's shared evaluations: a policy listed in SCORE_INPUTS must answer alike wherever it says it does."""

from __future__ import annotations

import random

import pytest

from share_placement import Demand
from share_placement.starvation import RoomForWaiting
from share_scheduler.sim.cluster import SCORE_INPUTS
from share_scheduler.sim.cluster import ClusterState
from share_scheduler.sim.cluster import score_inputs
from share_scheduler.sim.engine import build_policy
from tests.unit.sim.test_timeline import churn


def _views_and_demands(seed: int):
    rng = random.Random(seed)
    w = churn(seed)
    demands = [p.demand() for p in w.pods]
    views = []
    for _ in range(300):
        n = rng.choice(w.nodes)
        gpus = tuple((n.model, rng.choice([0, 250, 300, 500, 700, 1000, 1000])) for _ in n.gpus)
        views.append((gpus, rng.choice([0, 1000, 4000, 16000, 32000, 96000]), rng.choice([0, 10**5, 10**6])))
    return w, views, demands


@pytest.mark.parametrize("name", ["binpack", "spread", "bestfit", "fgd"])
@pytest.mark.parametrize("room", [False, True])
def test_a_shared_evaluation_is_the_policys_own_for_every_demand_and_node_of_its_class(name, room):
    w, views, demands = _views_and_demands(4)
    policy = build_policy(name, 0, w)
    if room:
        policy = RoomForWaiting(policy, [Demand(1000, 4), Demand(1000, 2, ("v100",))])
    inputs = score_inputs(policy)
    assert inputs in ("gpus", "gpus+cpu")
    rng = random.Random(9)
    checked = 0
    for view in views:
        for d in demands:
            gpus, cpu, mem = view
            if cpu < d.cpu or mem < d.memory:
                continue  # the host test rejects it before any evaluation
            rep = Demand(d.per_gpu, d.count, d.models, d.cpu if inputs == "gpus+cpu" else 0, 0)
            other_cpu = cpu if inputs == "gpus+cpu" else rng.choice([0, 5000, 10**6])
            other = (gpus, other_cpu, rng.choice([0, 7, 10**7]))
            assert policy.evaluate(view, d) == policy.evaluate(other, rep), (view, d)
            checked += 1
    assert checked > 1000


def test_only_the_listed_policies_share_and_frag_is_not_one_of_them():
    w = churn(1)
    assert score_inputs(build_policy("frag", 0, w)) is None
    assert score_inputs(RoomForWaiting(build_policy("frag", 0, w))) is None
    assert {cls.name for cls in SCORE_INPUTS} == {"binpack", "spread", "bestfit", "fgd"}
    shared = ClusterState(w, build_policy("binpack", 0, w))
    assert len(shared._reps) < len(shared.demands)  # demands that differ in CPU only share
