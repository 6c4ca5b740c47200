"""`share-scheduler --policy frag`: the learned workload is rebuilt from the cluster at start."""

from __future__ import annotations

from share_core.contract import ANN_GPU_INDEX
from share_core.contract import ANN_GPU_MEM
from share_placement import make_policy
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until


def _distribution(policy) -> dict[tuple[int, int], float]:
    return {(g.per_gpu, g.count): round(g.prob, 6) for g in policy.table.groups}


def test_frag_learns_the_running_workload_at_start_and_again_after_a_restart(kube, extender_factory):
    kube.add_node(make_node("node-a", [16, 16]))
    for i in range(3):
        kube.add_pod(make_pod(f"small-{i}", 4, node="node-a", annotations={ANN_GPU_INDEX: "0", ANN_GPU_MEM: "4"}))
    kube.add_pod(make_pod("big", 8, node="node-a", annotations={ANN_GPU_INDEX: "1", ANN_GPU_MEM: "8"}))
    kube.add_pod(make_pod("cpu-only", None))

    first = make_policy("frag")
    extender_factory(policy=first).wait_ready()
    assert first.table.observed == 4
    assert _distribution(first) == {(4, 1): 0.75, (8, 1): 0.25}

    restarted = make_policy("frag")
    ext = extender_factory(policy=restarted).wait_ready()
    assert _distribution(restarted) == _distribution(first)

    # It keeps learning online, and places through the same HTTP verbs as any policy.
    pod = kube.add_pod(make_pod("new", 2))
    wait_until(lambda: restarted.table.observed == 5, what="frag to observe the new pod")
    result = ext.call("filter", filter_args(pod, ["node-a"]))
    assert result["NodeNames"] == ["node-a"]
    assert ext.call("bind", bind_args(pod, "node-a"))["Error"] == ""


def test_frag_packs_shares_into_the_clusters_largest_gpu_as_nodes_come_and_go(kube, extender_factory):
    """The gap price's bins are GPUs: the extender tells frag the largest GPU's memory, not the largest pod."""
    kube.add_node(make_node("t4", [16, 16]))
    kube.add_pod(make_pod("small", 4, node="t4", annotations={ANN_GPU_INDEX: "0", ANN_GPU_MEM: "4"}))
    policy = make_policy("frag")
    ext = extender_factory(policy=policy).wait_ready()
    assert policy.gpu_unit == 16
    before = policy.table
    assert policy._pricer.gap_prices().capacity == 16

    kube.add_node(make_node("a100", [80] * 8))
    wait_until(lambda: policy.gpu_unit == 80, what="frag to learn of the 80 GiB GPUs")
    assert policy.table is not before  # a new snapshot: what was priced for 16 GiB GPUs is priced again
    assert policy._pricer.gap_prices().capacity == 80
    pod = kube.add_pod(make_pod("new", 4))
    assert ext.call("filter", filter_args(pod, ["t4", "a100"]))["NodeNames"]

    kube.delete_node("a100")
    wait_until(lambda: policy.gpu_unit == 16, what="frag to forget the 80 GiB GPUs")
