"""The hot path's caches: per-node snapshots and memoised policy scores never answer for a stale state."""

from __future__ import annotations

import random

import pytest

from share_core.gpus import GpuInfo
from share_placement import Demand
from share_placement import make_policy
from share_scheduler.cache import ClusterCache
from share_scheduler.extender import ScoreMemo
from share_scheduler.extender import filter_nodes
from share_scheduler.extender import host_priorities
from share_scheduler.extender import policy_scores
from share_scheduler.nodes import Contribution
from tests.unit.scheduler.conftest import assigned_pod
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod


def holder(name: str, node: str, gpu: int, mem: int) -> dict:
    pod = assigned_pod(name, node, gpu, mem)
    pod["status"]["phase"] = "Running"
    return pod


def cache_with(nodes: dict[str, list[int]]) -> ClusterCache:
    cache = ClusterCache()
    cache.replace_nodes([make_node(n, g) for n, g in nodes.items()])
    cache.replace_pods([])
    return cache


def scores(policy, memo, demand, cache, names):
    raw = policy_scores(policy, demand, cache.entries(names), memo)
    return {h["Host"]: h["Score"] for h in host_priorities(names, raw)}


def test_snapshot_is_shared_until_the_node_changes():
    cache = cache_with({"a": [16, 16], "b": [16, 16]})
    first = dict(cache.entries(["a", "b"]))
    again = dict(cache.entries(["a", "b"]))
    assert first["a"] is again["a"]  # nothing changed: nothing rebuilt
    assert first["a"].view_id == first["b"].view_id  # equal states share one view id
    cache.upsert_pod(holder("p", "a", 1, 6))
    after = dict(cache.entries(["a", "b"]))
    assert after["a"] is not first["a"] and after["b"] is first["b"]
    assert after["a"].view_id != first["a"].view_id
    assert after["a"].used == (0, 6) and after["a"].free_desc == (16, 10)
    assert [g.free for g in after["a"].state.gpus] == [16, 10]
    # Back to the old state: the old view's id may be reused (same view), never a stale score.
    cache.delete_pod(holder("p", "a", 1, 6))
    back = dict(cache.entries(["a"]))["a"]
    assert back.used == (0, 0) and back.view == first["a"].view


def test_a_node_change_invalidates_its_memoised_score():
    policy = make_policy("binpack")
    memo = ScoreMemo(policy)
    cache = cache_with({"a": [16], "b": [16]})
    demand = Demand(per_gpu=4)
    assert scores(policy, memo, demand, cache, ["a", "b"]) == {"a": 10, "b": 10}
    assert len(memo) == 1  # one view, one entry, shared by both nodes
    cache.upsert_pod(holder("p", "b", 0, 8))  # b is now the better fit
    assert scores(policy, memo, demand, cache, ["a", "b"]) == {"a": 9, "b": 10}
    cache.upsert_pod(holder("q", "a", 0, 10))  # a now the best fit; b second
    assert scores(policy, memo, demand, cache, ["a", "b"]) == {"a": 10, "b": 9}
    cache.upsert_pod(holder("r", "b", 0, 6))  # b full: the demand no longer fits there
    assert scores(policy, memo, demand, cache, ["a", "b"]) == {"a": 10, "b": 0}
    # An assumed pod (our own bind, before the API server shows it) changes the score too.
    cache.assume("default/s", "uid-s", Contribution("a", (0,), 4))
    assert scores(policy, memo, demand, cache, ["a", "b"]) == {"a": 0, "b": 0}
    cache.forget("default/s")
    assert scores(policy, memo, demand, cache, ["a", "b"]) == {"a": 10, "b": 0}
    assert memo.hits > 0


def test_memoised_scores_equal_fresh_ones_over_random_changes():
    rng = random.Random(7)
    names = [f"n{i}" for i in range(12)]
    for name in ("binpack", "spread", "frag"):
        policy = make_policy(name)
        memo = ScoreMemo(policy)
        cache = cache_with({n: [16, 16, 8] for n in names})
        for step in range(60):
            node, gpu = rng.choice(names), rng.randrange(3)
            key = f"p{step}"
            pod = holder(key, node, gpu, rng.choice([1, 2, 4]))
            cache.upsert_pod(pod)
            policy.observe(Demand(per_gpu=rng.choice([1, 2, 4, 8])))
            memo.invalidate()  # as the app does after every observe
            demand = Demand(per_gpu=rng.choice([1, 2, 4, 8]), count=rng.choice([1, 1, 2]))
            got = scores(policy, memo, demand, cache, names)
            fresh = scores(policy, None, demand, cache, names)
            reference = {}
            for n, snap in cache.entries(names):
                reference[n] = policy.score(snap.state, demand)
            assert got == fresh, (name, step)
            best = max(reference.values())
            if best != float("-inf"):
                assert {n for n, s in got.items() if s == 10} == {n for n, s in reference.items() if s == best}


def test_frag_memo_follows_the_learned_workload():
    policy = make_policy("frag")
    memo = ScoreMemo(policy)
    assert memo.enabled and not memo.learns  # valid while frag's WorkloadTable snapshot is unchanged
    policy.observe(Demand(per_gpu=4))
    demand = Demand(per_gpu=4)
    table = memo.table(demand)
    table[123] = 1.0
    assert memo.table(demand) is table  # same workload: same memo
    policy.observe(Demand(per_gpu=16))  # a new pod class: frag's table is rebuilt
    assert memo.table(demand) == {}


def test_unknown_learning_policy_is_invalidated_by_every_observe_and_random_is_never_memoised():
    class Learner:
        name = "learner"
        cacheable = True

        def __init__(self):
            self.bias = 0.0

        def evaluate(self, view, demand):
            return (self.bias, (0,)) if view[0] and view[0][0][1] >= demand.per_gpu else None

        def observe(self, demand):
            self.bias += 1

    learner = Learner()
    memo = ScoreMemo(learner)
    assert memo.learns
    memo.table(Demand(per_gpu=1))[5] = 0.0
    learner.observe(Demand(per_gpu=1))
    memo.invalidate()
    assert memo.table(Demand(per_gpu=1)) == {}
    assert ScoreMemo(make_policy("random", seed=1)).table(Demand(per_gpu=1)) is None
    binpack_memo = ScoreMemo(make_policy("binpack"))
    binpack_memo.table(Demand(per_gpu=1))[5] = 0.0
    binpack_memo.invalidate()  # binpack learns nothing: observe must not throw its memo away
    assert binpack_memo.table(Demand(per_gpu=1)) == {5: 0.0}


def test_filter_reasons_follow_the_node():
    cache = cache_with({"a": [16, 16]})
    demand = Demand(per_gpu=15)
    assert filter_nodes(demand, cache.entries(["a"]), cache.unit)[0] == ["a"]
    cache.upsert_pod(holder("p", "a", 0, 8))
    cache.upsert_pod(holder("q", "a", 1, 8))
    passed, failed, _ = filter_nodes(demand, cache.entries(["a"]), cache.unit)
    assert passed == [] and failed["a"].startswith("GPUs free: 0:8 GiB, 1:8 GiB;")
    cache.delete_pod(holder("q", "a", 1, 8))
    cache.upsert_pod(holder("q2", "a", 1, 2))
    passed, failed, _ = filter_nodes(demand, cache.entries(["a"]), cache.unit)
    assert passed == [] and failed["a"].startswith("GPUs free: 0:8 GiB, 1:14 GiB;")


def test_view_ids_stay_unique_when_the_intern_table_starts_afresh(monkeypatch):
    import share_scheduler.cache as cache_mod

    monkeypatch.setattr(cache_mod, "VIEW_INTERN_LIMIT", 1)
    cache = cache_with({"a": [16]})
    cache._nodes["a"] = cache_mod.NodeEntry.build("a", [GpuInfo(0, "GPU-a-0", "NVIDIA A100", 16)])
    seen: dict[int, tuple] = {}
    for i, mem in enumerate([1, 2, 3, 2, 1, 4]):
        cache.upsert_pod(holder(f"p{i}", "a", 0, mem))
        snap = cache.node_snapshot("a")
        assert seen.setdefault(snap.view_id, snap.view) == snap.view  # an id never names two views
        cache.delete_pod(holder(f"p{i}", "a", 0, mem))


def test_extender_prioritize_and_inspect_after_binds(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    kube.add_node(make_node("node-b", [16]))
    ext = extender_factory().wait_ready()
    pod = make_pod("first", 4)
    kube.add_pod(pod)
    assert {h["Host"]: h["Score"] for h in ext.call("prioritize", filter_args(pod, ["node-a", "node-b"]))} == {
        "node-a": 10,
        "node-b": 10,
    }
    assert ext.call("bind", {"PodName": "first", "PodNamespace": "default", "PodUID": "uid-default-first",
                             "Node": "node-b"})["Error"] == ""  # fmt: skip
    second = make_pod("second", 4)
    kube.add_pod(second)
    # node-b holds 4 of 16 now: binpack must prefer it, whatever the memo saw before the bind.
    got = {h["Host"]: h["Score"] for h in ext.call("prioritize", filter_args(second, ["node-a", "node-b"]))}
    assert got == {"node-a": 9, "node-b": 10}
    view = ext.client.get("/gpushare-scheduler/inspect/node-b").get_json()
    assert view["nodes"][0]["gpus"][0]["allocated"] == 4 and view["nodes"][0]["gpus"][0]["free"] == 12
    text = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_gpu_memory_allocated{gpu="0",node="node-b",uuid="GPU-node-b-0"} 4.0' in text


@pytest.mark.parametrize("short_logs", [False, True], ids=["logs", "short-logs"])
def test_best_node_index_answers_as_scoring_every_node_does(short_logs, monkeypatch):
    """BestNodeIndex (filter's answer from nodes grouped by state and per-demand heaps of states, kept
    current from the cache's change log) chooses exactly what best_nodes(policy_scores(...)) chooses,
    over random pods, holds, assumptions, node arrivals and departures, demands, and subsets of nodes
    kube-scheduler passes (which may leave out the best). With short logs, the cache's change log
    and the index's own log overflow often, so the catch-up paths that start afresh run too."""
    import threading

    from share_scheduler import cache as cache_module
    from share_scheduler.bestnodes import BestNodeIndex
    from share_scheduler.bestnodes import _StateGroups
    from share_scheduler.extender import best_nodes
    from share_scheduler.extender import policy_scores

    if short_logs:
        monkeypatch.setattr(cache_module, "CHANGE_LOG_LIMIT", 12)
        monkeypatch.setattr(_StateGroups, "LOG_LIMIT", 6)

    rng = random.Random(11)
    names = [f"n{i:02d}" for i in range(24)]
    demands = [Demand(per_gpu=m, count=c) for m in (1, 2, 4, 8, 12) for c in (1, 2)] + [
        Demand(per_gpu=4, models=("NVIDIA T4",))
    ]
    for policy_name in ("binpack", "spread", "frag"):
        policy = make_policy(policy_name)
        memo, lock = ScoreMemo(policy), threading.Lock()
        cache = cache_with({n: [16, 16, 8] for n in names})
        index = BestNodeIndex(policy, cache, memo, lock)
        live = set(names)
        pods: list[dict] = []
        checked = 0
        for step in range(400):
            action = rng.random()
            if action < 0.35:
                node, gpu = rng.choice(sorted(live)), rng.randrange(3)
                pod = holder(f"p{step}", node, gpu, rng.choice([1, 2, 4, 6]))
                cache.upsert_pod(pod)
                pods.append(pod)
            elif action < 0.5 and pods:
                cache.delete_pod(pods.pop(rng.randrange(len(pods))))
            elif action < 0.6:
                cache.hold(f"default/h{step}", f"uid-h{step}", Contribution(rng.choice(sorted(live)), (0,), 2))
            elif action < 0.65:
                gone = rng.choice(sorted(live))
                cache.delete_node(gone)
                live.discard(gone)
            elif action < 0.7:
                back = rng.choice(names)
                cache.upsert_node(make_node(back, rng.choice([[16, 16, 8], [24], [16, 16]])))
                live.add(back)
            if short_logs and step % 37 == 0:  # more changes than the cache's log keeps: read afresh
                for k in range(15):
                    node = rng.choice(sorted(live))
                    cache.hold(f"default/b{step}-{k}", f"uid-b{step}-{k}", Contribution(node, (1,), 1))
            if policy_name == "frag" and step % 50 == 0:
                policy.observe(rng.choice(demands))  # the learned workload moves: scores may all change
                memo.invalidate()
            demand = rng.choice(demands)
            asked = names if rng.random() < 0.7 else rng.sample(names, rng.randrange(4, len(names)))
            expected = best_nodes(policy_scores(policy, demand, cache.entries(asked), memo, lock))
            assert index.best(demand, asked) == expected, (policy_name, step, demand)
            checked += 1
        assert checked == 400
        if not short_logs:
            assert index.rebuilds < 200, "the index is updated in place, not rebuilt per request"
