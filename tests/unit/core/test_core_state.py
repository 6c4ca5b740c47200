"""share_core: assignment annotations, node GPUs, node usage and the FakeKube API stand-in."""

from __future__ import annotations

import threading

import pytest

from share_core.accounting import node_usage
from share_core.assignment import Assignment
from share_core.assignment import parse_assignment
from share_core.assignment import pod_is_finished
from share_core.assignment import pod_key
from share_core.assignment import pod_node
from share_core.contract import MemoryUnit
from share_core.contract import device_id
from share_core.contract import gpu_uuid_of_device
from share_core.fake import FakeKube
from share_core.gpus import GpuInfo
from share_core.gpus import format_node_gpus
from share_core.gpus import node_gpus
from share_core.gpus import parse_node_gpus
from share_core.kube import Conflict
from share_core.kube import NotFound
from share_core.kube import Unavailable
from share_core.request import InvalidRequest


def test_assignment_round_trip():
    a = Assignment((1, 3), ("GPU-a", "GPU-b"), 8, 123, False)
    ann = a.to_annotations()
    assert ann == {
        "gpushare.io/gpu-index": "1,3",
        "gpushare.io/gpu-uuid": "GPU-a,GPU-b",
        "gpushare.io/gpu-mem": "8",
        "gpushare.io/assume-time": "123",
        "gpushare.io/assigned": "false",
    }
    assert parse_assignment(ann) == a and a.per_gpu == 4
    assert parse_assignment({**ann, "gpushare.io/assigned": "True"}).assigned
    assert parse_assignment({}) is None and parse_assignment(None) is None
    assert parse_assignment({"gpushare.io/gpu-index": "0", "gpushare.io/gpu-mem": "2"}).gpu_uuids == ()


@pytest.mark.parametrize(
    ("patch", "names"),
    [
        ({"gpushare.io/gpu-index": "a"}, "gpu-index"),
        ({"gpushare.io/gpu-index": "1,1"}, "gpu-index"),
        ({"gpushare.io/gpu-index": "-1"}, "gpu-index"),
        ({"gpushare.io/gpu-uuid": "GPU-a"}, "gpu-uuid"),
        ({"gpushare.io/gpu-mem": "x"}, "gpu-mem"),
        ({"gpushare.io/gpu-mem": "7"}, "gpu-mem"),
        ({"gpushare.io/gpu-mem": "-2"}, "gpu-mem"),
        ({"gpushare.io/assume-time": "yesterday"}, "assume-time"),
    ],
)
def test_assignment_garbage_names_the_annotation(patch, names):
    ann = {**Assignment((1, 3), ("GPU-a", "GPU-b"), 8, 1).to_annotations(), **patch}
    with pytest.raises(InvalidRequest, match=names):
        parse_assignment(ann)


def test_pod_helpers():
    p = {"metadata": {"name": "x"}, "spec": {"nodeName": "n"}, "status": {"phase": "Failed"}}
    assert pod_key(p) == "default/x" and pod_node(p) == "n" and pod_is_finished(p)
    assert not pod_is_finished({"status": {"phase": "Running"}})


def test_device_ids():
    assert device_id("GPU-x", 3) == "GPU-x-_-3" and gpu_uuid_of_device("GPU-x-_-3") == "GPU-x"
    with pytest.raises(ValueError):
        gpu_uuid_of_device("plain")
    assert MemoryUnit.parse("mib") is MemoryUnit.MiB and MemoryUnit.GiB.from_bytes(16 * 1024**3 - 1) == 15
    with pytest.raises(ValueError, match="GiB or MiB"):
        MemoryUnit.parse("TB")


def test_node_gpus_from_annotation_and_capacity():
    gpus = [GpuInfo(1, "GPU-b", "T4", 16, False), GpuInfo(0, "GPU-a", "A100", 80)]
    raw = format_node_gpus(gpus)
    node = {"metadata": {"name": "n", "annotations": {"gpushare.io/gpus": raw}}}
    assert node_gpus(node) == sorted(gpus, key=lambda g: g.index)
    cap = {"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu-mem": "32", "nvidia.com/gpu-count": "2"}}}
    assert [(g.index, g.memory) for g in node_gpus(cap)] == [(0, 16), (1, 16)]
    assert node_gpus({"metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "4"}}}) == []


@pytest.mark.parametrize(
    "raw",
    ["not json", "{}", "[1]", '[{"index": 0}]', '[{"index": -1, "memory": 1}]', '[{"index": 0, "memory": true}]',
     '[{"index": 0, "memory": 1}, {"index": 0, "memory": 2}]'],
)  # fmt: skip
def test_node_gpus_garbage(raw):
    with pytest.raises(InvalidRequest, match=r"gpushare\.io/gpus"):
        parse_node_gpus(raw)


def _pod(name, indices, total, phase="Running", **ann):
    a = Assignment(tuple(indices), tuple(f"GPU-{i}" for i in indices), total, 1).to_annotations()
    return {"metadata": {"name": name, "annotations": {**a, **ann}}, "status": {"phase": phase}}


def test_node_usage():
    gpus = [GpuInfo(0, "GPU-0", "T4", 16), GpuInfo(1, "GPU-1", "T4", 16)]
    pods = [
        _pod("a", [0], 4),
        _pod("b", [0, 1], 8),
        _pod("done", [0], 10, phase="Succeeded"),
        _pod("bad", [0], 2, **{"gpushare.io/gpu-mem": "x"}),
        _pod("ghost", [5], 2),
        {"metadata": {"name": "plain"}},
    ]
    usage = node_usage(gpus, pods)
    g = usage.by_index()
    assert (g[0].used, g[0].free, g[1].used) == (8, 8, 4)
    assert g[0].pods == [("default/a", 4), ("default/b", 4)]
    assert len(usage.problems) == 2 and "default/bad" in usage.problems[0] and "GPU 5" in usage.problems[1]


def test_fake_kube_versions_conflicts_faults_and_watches():
    kube = FakeKube()
    kube.add_node({"metadata": {"name": "n", "labels": {"gpushare": "true"}}})
    p = kube.add_pod({"metadata": {"name": "p"}, "spec": {"nodeName": "n"}})
    rv = p["metadata"]["resourceVersion"]
    assert p["status"]["phase"] == "Pending" and p["metadata"]["uid"]
    kube.patch_pod_annotations("default", "p", {"k": "v"}, resource_version=rv)
    with pytest.raises(Conflict):
        kube.patch_pod_annotations("default", "p", {"k": "w"}, resource_version=rv)
    assert kube.get_pod("default", "p")["metadata"]["annotations"] == {"k": "v"}
    kube.patch_pod_annotations("default", "p", {"k": None})
    assert kube.get_pod("default", "p")["metadata"]["annotations"] == {}
    with pytest.raises(NotFound):
        kube.get_pod("default", "nope")
    assert [x["metadata"]["name"] for x in kube.list_pods(field_selector="spec.nodeName=n").items] == ["p"]
    assert kube.list_pods(field_selector="spec.nodeName=m").items == []
    assert len(kube.list_nodes(label_selector="gpushare=true").items) == 1

    kube.fail("list_pods", Unavailable("down"))
    with pytest.raises(Unavailable):
        kube.list_pods()
    assert kube.list_pods().items  # only once

    events = []
    watch = kube.watch_pods("0", field_selector="spec.nodeName=n", timeout_seconds=5)
    t = threading.Thread(target=lambda: events.extend(e.type for e in watch))
    t.start()
    threading.Event().wait(0.1)
    kube.set_pod_phase("default", "p", "Running")
    kube.delete_pod("default", "p")
    threading.Event().wait(0.1)
    kube.close_watches()
    t.join(5)
    assert events == ["MODIFIED", "DELETED"]

    kube.patch_node_capacity("n", {"nvidia.com/gpu-count": "2"})
    n = kube.get_node("n")
    assert n["status"]["capacity"]["nvidia.com/gpu-count"] == n["status"]["allocatable"]["nvidia.com/gpu-count"] == "2"
