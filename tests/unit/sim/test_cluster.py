"""ClusterState's shared evaluations: a policy listed in SCORE_INPUTS must answer alike wherever it says it does."""

from __future__ import annotations

import random

import pytest

from share_placement import Demand
from share_placement.room import RoomForWaiting
from share_scheduler.sim.cluster import SCORE_INPUTS
from share_scheduler.sim.cluster import ClusterState
from share_scheduler.sim.cluster import FitIndex
from share_scheduler.sim.cluster import policy_memo_off
from share_scheduler.sim.cluster import score_inputs
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.timeline import Timeline
from share_scheduler.sim.timeline import poisson_arrivals
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


def _may_fit(view, d: Demand) -> bool:
    """The host and GPU-count test, written out: CPU and memory reach the asks, and `count` GPUs have room."""
    gpus, cpu, mem = view
    if (cpu is not None and cpu < d.cpu) or (mem is not None and mem < d.memory):
        return False
    frees = sorted((f for _, f in gpus), reverse=True)
    return d.count == 0 or (len(frees) >= d.count and frees[d.count - 1] >= d.per_gpu)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_the_fit_index_names_exactly_the_demands_a_state_may_fit(seed):
    _, views, demands = _views_and_demands(seed)
    demands += [Demand(0, 0, (), 0, 0), Demand(500, 1, ("t4",), 0, 0), Demand(1000, 8, (), 96000, 10**6)]
    index = FitIndex(demands)
    views += [(((("t4", 1000),) * 2), None, None), ((), 4000, None)]  # no CPU/memory known; no GPU at all
    fitted = 0
    for view in views:
        mask = index.mask(view)
        want = [i for i, d in enumerate(demands) if _may_fit(view, d)]
        assert [i for i in range(len(demands)) if mask >> i & 1] == want, view
        fitted += len(want)
    assert 0 < fitted < len(views) * len(demands)  # some fit, some do not


def test_a_demand_that_stopped_asking_keeps_no_unbounded_backlog():
    w = churn(2)
    cluster = ClusterState(w, build_policy("bestfit", 0, w))
    rng = random.Random(1)
    asked = cluster.pod_demand[0]
    for _ in range(9000):  # place and release at random: thousands of states born and gone
        node = rng.randrange(len(cluster.node_state))
        dix = rng.randrange(len(cluster.demands))
        got = cluster.evaluation(cluster.node_state[node], dix)
        if got is not None:
            cluster.place(node, dix, got[1])
            cluster.release(node, dix, got[1])
        if rng.random() < 0.1:
            assert cluster.best_indexed(asked) == cluster.best(asked)
    assert cluster._births > 4096  # the backlog was trimmed on the way at least once
    assert max(len(p) for p in cluster._pending) <= len(cluster.members) + 1024
    cluster._trim_pending()
    assert max(len(p) for p in cluster._pending) <= len(cluster.members)
    assert cluster.best_indexed(asked) == cluster.best(asked)
    for dix in range(len(cluster.demands)):  # a demand asking after a long silence rebuilds, exactly
        assert cluster.best_indexed(dix) == cluster.best(dix)
    assert set(cluster.fitmask) == set(cluster.members) == set(cluster.memo)


@pytest.mark.parametrize("name", ["frag", "fgd"])
def test_the_timeline_turns_the_policys_own_memo_off_and_it_answers_alike(name):
    """The timeline keeps every answer per live state, so the policy's own (view, demand) memo is turned
    off (wrapped or not); without it the policy answers exactly as with it. A policy that is not
    cacheable keeps its own."""
    w, views, demands = _views_and_demands(3)
    kept, off = build_policy(name, 0, w), build_policy(name, 0, w)
    policy_memo_off(RoomForWaiting(off, [Demand(1000, 4)]))
    assert kept.memo_evaluations and not off.memo_evaluations
    rng = random.Random(5)
    for _ in range(400):
        view, demand = rng.choice(views), rng.choice(demands)
        assert off.evaluate(view, demand) == kept.evaluate(view, demand) == kept.evaluate(view, demand)
    assert kept._eval_memo and not off._eval_memo
    timed = build_policy(name, 0, w)
    Timeline(w, timed, poisson_arrivals(w, 0.9, 0.01, 1.0, 0), 0.0, 60.0)
    assert not timed.memo_evaluations
    uncacheable = build_policy("random", 0, w)
    policy_memo_off(uncacheable)
    assert not hasattr(uncacheable, "memo_evaluations")


@pytest.mark.parametrize("name", ["frag", "bestfit"])
def test_a_demand_that_asks_often_keeps_no_dead_states_past_twice_the_live_ones(name):
    """Only a demand's best bucket is cleaned of states that died; the states it was shown are counted
    and past twice the live ones (plus a slack) its buckets are rebuilt from the live states: bounded,
    and the choice stays the scan's."""
    w = churn(2)
    cluster = ClusterState(w, build_policy(name, 0, w))
    cluster.REBUILD_SLACK = 8
    rng = random.Random(3)
    asked = cluster.pod_demand[0]
    first = cluster.best_indexed(asked)
    assert first is not None
    rebuilds = cluster.rebuilds
    for _ in range(3000):  # a state born and one gone per move, the demand asking after each
        node = rng.randrange(len(cluster.node_state))
        dix = rng.randrange(len(cluster.demands))
        got = cluster.evaluation(cluster.node_state[node], dix)
        if got is not None:
            cluster.place(node, dix, got[1])
            indexed = cluster.best_indexed(asked)
            scan = cluster.best(asked)
            assert (indexed is None) == (scan is None)
            assert indexed is None or indexed[1][0] == scan[1][0]
            assert cluster._filled[asked] <= 2 * len(cluster.members) + cluster.REBUILD_SLACK + 2
            cluster.release(node, dix, got[1])
    assert cluster.rebuilds > rebuilds + 5


def test_the_uniform_pick_keeps_the_states_it_fits_as_a_walk_of_every_state_finds_them():
    """random (`uniform_scores`): once its draws miss, the pick is among the nodes of the live states the
    demand fits, kept per demand as the buckets are (births topped up, the dead dropped); every time it
    is the set a walk of every live state finds, through a churning cluster, after a long silence too."""
    w = churn(5)
    cluster = ClusterState(w, build_policy("random", 0, w))
    rng = random.Random(4)
    asked = 0
    for step in range(6000):
        node = rng.randrange(len(cluster.node_state))
        dix = rng.randrange(len(cluster.demands))
        if cluster.fits(cluster.node_state[node], dix):
            ev = cluster.evaluate(cluster.view(node), cluster.demands[dix])
            cluster.place(node, dix, ev[1])
            if rng.random() < 0.4:  # the cluster fills up, with some churn
                cluster.release(node, dix, ev[1])
        if step % 3 == 0 or step > 5900:  # one demand asks often; every demand now and then
            for d in [step % len(cluster.demands)] if step % 30 else range(len(cluster.demands)):
                walked = [sid for sid in cluster.members if cluster.fits(sid, d)]
                kept = cluster._fitting_states(d)
                assert sorted(kept) == walked, (step, d)
                asked += 1
    assert asked > 2000
    assert cluster.rebuilds > 0 and any(cluster._fit_states)


def test_a_timeline_runs_with_rare_collections_and_gives_the_collector_back():
    """A run makes no reference cycles, so it runs with `RUN_GC_THRESHOLDS` (full collections walked every
    memo the policy keeps); the caller's thresholds are back after it, and after a run that failed."""
    import gc

    from share_scheduler.sim.cluster import RUN_GC_THRESHOLDS
    from share_scheduler.sim.timeline import TimelineHooks

    seen = []

    class Watch(TimelineHooks):
        def after_event(self, timeline, now):
            seen.append(gc.get_threshold())
            if fail and len(seen) > 5:
                raise RuntimeError("a hook failed")

    w = churn(3)
    arrivals = poisson_arrivals(w, 0.9, 0.05, 1.0, 0)
    before = gc.get_threshold()
    for fail in (False, True):
        seen.clear()
        timeline = Timeline(w, build_policy("bestfit", 0, w), arrivals, 0.0, 0.05 * 86400, hooks=Watch())
        if fail:
            with pytest.raises(RuntimeError, match="a hook failed"):
                timeline.run()
        else:
            timeline.run()
        assert seen and set(seen) == {RUN_GC_THRESHOLDS} != {before}
        assert gc.get_threshold() == before
