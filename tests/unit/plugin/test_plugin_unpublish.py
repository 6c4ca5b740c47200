"""`share-plugin --unpublish` (the chart's uninstall hook): nothing of gpushare stays on the nodes."""

from __future__ import annotations

from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.fake import FakeKube
from share_plugin.publisher import unpublish


def node(name: str, published: bool, labelled: bool = False) -> dict:
    annotations = {"other": "kept"}
    capacity = {"cpu": "4", RESOURCE_MEM: "16"}
    if published:
        annotations[ANN_NODE_GPUS] = "[]"
        capacity[RESOURCE_COUNT] = "1"
    labels = {"gpushare": "true"} if labelled else {}
    return {
        "metadata": {"name": name, "annotations": annotations, "labels": labels},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def test_unpublish_cleans_every_published_node_and_nothing_else():
    kube = FakeKube()
    for n in (
        node("gpu-a", True),
        node("gpu-b", True, labelled=True),
        node("labelled", False, True),
        node("cpu", False),
    ):
        kube.add_node(n)
    assert sorted(unpublish(kube)) == ["gpu-a", "gpu-b", "labelled"]
    for name in ("gpu-a", "gpu-b", "labelled", "cpu"):
        n = kube.nodes[name]
        assert ANN_NODE_GPUS not in n["metadata"]["annotations"] and n["metadata"]["annotations"]["other"] == "kept"
        for field in ("capacity", "allocatable"):
            assert RESOURCE_COUNT not in n["status"][field] and n["status"][field]["cpu"] == "4"
    assert kube.nodes["gpu-a"]["status"]["capacity"][RESOURCE_MEM] == "16"  # kubelet's, not ours to remove


def test_unpublish_one_node():
    kube = FakeKube()
    kube.add_node(node("gpu-a", True))
    kube.add_node(node("gpu-b", True))
    assert unpublish(kube, "gpu-a") == ["gpu-a"]
    assert ANN_NODE_GPUS in kube.nodes["gpu-b"]["metadata"]["annotations"]
