"""The wire contract with kube-scheduler (k8s.io/kube-scheduler/extender/v1): exact JSON in and out."""

from __future__ import annotations

import json

import orjson
import pytest

from share_core.contract import ANN_ASSIGNED
from share_core.contract import ANN_GPU_INDEX
from share_core.contract import ANN_GPU_MEM
from share_core.contract import ANN_GPU_UUID
from share_core.contract import RESOURCE_MEM
from tests.unit.scheduler.conftest import PREFIX
from tests.unit.scheduler.conftest import assigned_pod
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod

# What kube-scheduler's HTTPExtender marshals for filter with nodeCacheCapable: a full v1.Pod under
# the Go field name "Pod", "Nodes": null, "NodeNames": [...].
KUBE_SCHEDULER_FILTER = """{
 "Pod": {"metadata": {"name": "train-0", "namespace": "ml", "uid": "6f1c9c1e-1f0b-4c7e-9d55-1",
                      "resourceVersion": "812", "creationTimestamp": "2024-05-01T10:00:00Z",
                      "annotations": {"gpushare.io/gpu-model": "a100"}},
         "spec": {"containers": [{"name": "main", "image": "cuda:12",
                   "resources": {"limits": {"nvidia.com/gpu-mem": "8", "cpu": "1"},
                                 "requests": {"nvidia.com/gpu-mem": "8", "cpu": "1"}}}],
                  "schedulerName": "gpushare-scheduler", "restartPolicy": "Always"},
         "status": {"phase": "Pending", "qosClass": "Burstable"}},
 "Nodes": null,
 "NodeNames": ["node-a", "node-b", "node-c", "node-d"]
}"""


@pytest.fixture
def cluster(kube, extender_factory):
    kube.add_node(make_node("node-a", [16, 16]))
    kube.add_node(make_node("node-b", [(16, True), (16, False)]))
    kube.add_node(make_node("node-c", [4, 4]))
    kube.add_node(make_node("node-d", [32], model="Tesla T4"))
    kube.add_pod(assigned_pod("holder", "node-b", 0, 10))
    return extender_factory().wait_ready()


def test_filter_node_names_exact(cluster):
    resp = cluster.client.post(f"{PREFIX}/filter", data=KUBE_SCHEDULER_FILTER, content_type="application/json")
    assert resp.status_code == 200
    body = json.loads(resp.data)
    assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert body["Error"] == ""
    assert body["Nodes"] is None
    assert body["NodeNames"] == ["node-a"]
    # A pod that has a node gets the short answer: kube-scheduler reads the failed maps only to
    # explain an unschedulable pod and to pick preemption candidates.
    assert body["FailedNodes"] == body["FailedAndUnresolvableNodes"] == {}
    without_a = KUBE_SCHEDULER_FILTER.replace('"node-a", ', "")
    resp = cluster.client.post(f"{PREFIX}/filter", data=without_a, content_type="application/json")
    body = json.loads(resp.data)
    assert body["Error"] == "" and body["NodeNames"] == []
    assert body["FailedNodes"] == {
        "node-b": "GPUs free: 0:6 GiB, 1:16 GiB (unhealthy); pod needs 8 GiB on one GPU of model a100"
    }
    assert body["FailedAndUnresolvableNodes"] == {
        "node-c": "GPUs free: 0:4 GiB, 1:4 GiB; pod needs 8 GiB on one GPU of model a100; "
        "no GPU here is that large even when empty",
        "node-d": "GPUs free: 0:32 GiB; pod needs 8 GiB on one GPU of model a100; "
        "no healthy GPU of an allowed model here (node has: Tesla T4)",
    }


def test_filter_full_nodes_list(cluster):
    nodes = {
        "kind": "NodeList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "9"},
        "items": [make_node("node-a", [16, 16]), make_node("node-c", [4, 4])],
    }
    status, body = cluster.post("filter", {"Pod": make_pod("p", 8), "Nodes": nodes, "NodeNames": None})
    assert status == 200 and body["Error"] == ""
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["node-a"]
    assert body["Nodes"]["kind"] == "NodeList"
    nodes["items"] = nodes["items"][1:]
    status, body = cluster.post("filter", {"Pod": make_pod("p", 8), "Nodes": nodes, "NodeNames": None})
    assert body["Nodes"]["items"] == [] and "node-c" in body["FailedAndUnresolvableNodes"]


def test_filter_multi_gpu(cluster):
    status, body = cluster.post("filter", filter_args(make_pod("p", 16, count=2), ["node-a", "node-b", "node-c"]))
    assert status == 200
    assert body["NodeNames"] == ["node-a"]
    status, body = cluster.post("filter", filter_args(make_pod("p", 16, count=2), ["node-b", "node-c"]))
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"]["node-b"].endswith(
        "pod needs 8 GiB on each of 2 GPUs; no GPU here is that large even when empty"
    )
    assert "node-c" in body["FailedAndUnresolvableNodes"]


def test_filter_pod_without_gpu_mem_gets_the_policys_node(cluster):
    """A CPU-only pod of the profile is placed by the policy too: binpack packs it where the GPUs are
    taken (node-c has 8 GiB free, node-a 32), and a node the cache does not know is never chosen."""
    names = ["node-a", "node-c", "no-such-node"]
    status, body = cluster.post("filter", filter_args(make_pod("web", None), names))
    assert status == 200
    assert body["NodeNames"] == ["node-c"] and body["FailedNodes"] == {} and body["Error"] == ""
    status, body = cluster.post("filter", filter_args(make_pod("web", None), ["node-a", "node-b", "node-d"]))
    assert body["NodeNames"] == ["node-b"]  # 6 GiB free on its one healthy GPU


def test_filter_unknown_node_is_failed_not_error(cluster):
    status, body = cluster.post("filter", filter_args(make_pod("p", 2), ["node-a", "ghost"]))
    assert status == 200 and body["NodeNames"] == ["node-a"]
    status, body = cluster.post("filter", filter_args(make_pod("p", 2), ["ghost"]))
    assert status == 200 and body["NodeNames"] == [] and body["Error"] == ""
    assert "not known to the gpushare extender" in body["FailedNodes"]["ghost"]


def test_pod_larger_than_any_gpu_is_unresolvable_everywhere(cluster):
    status, body = cluster.post("filter", filter_args(make_pod("huge", 64), ["node-a", "node-b", "node-c", "node-d"]))
    assert status == 200
    assert body["NodeNames"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == {"node-a", "node-b", "node-c", "node-d"}
    assert all("pod needs 64 GiB" in r for r in body["FailedAndUnresolvableNodes"].values())


@pytest.mark.parametrize(
    ("mem", "needle"),
    [
        ("-4", "is negative"),
        ("1.5", "is fractional"),
        ("500m", "is fractional"),
        ("eight", "not a valid quantity"),
        ([8], "is not a quantity"),
    ],
)
def test_bad_pod_request_gets_clear_error(cluster, mem, needle):
    for verb in ("filter", "prioritize"):
        status, body = cluster.post(verb, filter_args(make_pod("bad", mem), ["node-a"]))
        assert needle in body["Error"], (verb, body)
        assert "default/bad" in body["Error"] or verb == "prioritize"
        assert status == (200 if verb == "filter" else 400)
    kube = cluster.kube
    kube.add_pod(make_pod("bad", mem))
    status, body = cluster.post("bind", bind_args(make_pod("bad", mem), "node-a"))
    assert status == 200 and needle in body["Error"]
    assert kube.bindings == []


def test_bad_gpu_count_annotation(cluster):
    status, body = cluster.post("filter", filter_args(make_pod("p", 8, annotations={"gpushare.io/gpu-count": "x"}), []))
    assert status == 200 and "gpushare.io/gpu-count" in body["Error"]
    status, body = cluster.post("filter", filter_args(make_pod("p", 9, count=2), ["node-a"]))
    assert "divide evenly" in body["Error"]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"null",
        b"[]",
        b'"Pod"',
        b'{"NodeNames": ["a"]}',
        b'{"Pod": 3, "NodeNames": ["a"]}',
        b'{"Pod": {}, "NodeNames": "node-a"}',
        b'{"Pod": {}, "NodeNames": [1, 2]}',
        b'{"Pod": {}}',
        b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}',
        b'{"Pod": {}, "Nodes": []}',
        b'{"Pod": {"metadata": []}, "NodeNames": []}',
        b'{"Pod": {"metadata": {"annotations": "x"}}, "NodeNames": []}',
    ],
)
def test_malformed_filter_and_prioritize(cluster, raw):
    for verb in ("filter", "prioritize"):
        resp = cluster.client.post(f"{PREFIX}/{verb}", data=raw, content_type="application/json")
        assert resp.status_code == 400, (verb, raw, resp.data)
        assert resp.get_json()["Error"]


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {},
        {"PodName": "p", "PodNamespace": "default", "PodUID": "u"},
        {"PodName": 1, "PodNamespace": "default", "PodUID": "u", "Node": "node-a"},
        {"PodName": "p", "PodNamespace": "", "PodUID": "u", "Node": "node-a"},
        {"PodName": "p", "PodNamespace": "default", "PodUID": 7, "Node": "node-a"},
    ],
)
def test_malformed_bind(cluster, body):
    status, out = cluster.post("bind", body)
    assert status == 400 and out["Error"].startswith(("ExtenderBindingArgs", "request body"))
    assert cluster.kube.bindings == []


def test_prioritize_exact(cluster):
    kube = cluster.kube
    kube.add_node(make_node("node-e", [16, 16]))
    kube.add_pod(assigned_pod("e-holder", "node-e", 1, 12))
    cluster.settle()
    pod = make_pod("p", 4)
    body = {"Pod": pod, "Nodes": None, "NodeNames": ["node-a", "node-b", "node-c", "node-e", "ghost"]}
    resp = cluster.client.post(f"{PREFIX}/prioritize", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 200
    scores = json.loads(resp.data)
    # binpack: node-c (a 4 GiB GPU: 0 stranded, 8 free on the node) > node-e (GPU 1 has exactly 4
    # free: 0 stranded, but 20 free on the node) > node-b (6 free: 2 stranded) > node-a (12 stranded).
    assert scores == [
        {"Host": "node-a", "Score": 7},
        {"Host": "node-b", "Score": 8},
        {"Host": "node-c", "Score": 10},
        {"Host": "node-e", "Score": 9},
        {"Host": "ghost", "Score": 0},
    ]


def test_prioritize_spread(kube, extender_factory):
    kube.add_node(make_node("full", [16]))
    kube.add_node(make_node("empty", [16]))
    ann = {ANN_GPU_INDEX: "0", ANN_GPU_UUID: "u", ANN_GPU_MEM: "8", ANN_ASSIGNED: "true"}
    kube.add_pod(make_pod("x", 8, node="full", annotations=ann))
    ext = extender_factory(policy="spread").wait_ready()
    status, scores = ext.post("prioritize", filter_args(make_pod("p", 4), ["full", "empty"]))
    assert status == 200 and scores == [{"Host": "full", "Score": 9}, {"Host": "empty", "Score": 10}]


def test_prioritize_without_gpu_mem_ranks_by_the_policy(cluster):
    status, scores = cluster.post("prioritize", filter_args(make_pod("web", None), ["node-a", "node-b"]))
    assert status == 200 and scores == [{"Host": "node-a", "Score": 9}, {"Host": "node-b", "Score": 10}]


def test_bind_exact(cluster):
    kube = cluster.kube
    pod = kube.add_pod(make_pod("train-0", 8, namespace="ml"))
    # ExtenderBindingArgs as kube-scheduler marshals it (PodUID is a types.UID string).
    raw = json.dumps({"PodName": "train-0", "PodNamespace": "ml", "PodUID": pod["metadata"]["uid"], "Node": "node-a"})
    resp = cluster.client.post(f"{PREFIX}/bind", data=raw, content_type="application/json")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "application/json"
    assert json.loads(resp.data) == {"Error": ""}
    assert kube.pods[("ml", "train-0")]["spec"]["nodeName"] == "node-a"


def test_bind_assigns_and_records(cluster):
    kube = cluster.kube
    pod = kube.add_pod(make_pod("train-1", 8, namespace="ml"))
    status, body = cluster.post("bind", bind_args(pod, "node-a"))
    assert (status, body) == (200, {"Error": ""})
    stored = kube.pods[("ml", "train-1")]
    ann = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "node-a"
    assert ann[ANN_GPU_INDEX] == "0" and ann[ANN_GPU_UUID] == "GPU-node-a-0"
    assert ann[ANN_GPU_MEM] == "8" and ann[ANN_ASSIGNED] == "false"
    assert int(ann["gpushare.io/assume-time"]) > 0
    assert kube.bindings == [("ml", "train-1", "node-a")]
    assert cluster.parts["events"].flush()
    assert kube.events == []  # --bind-events failures (the default): no Event for a bind that worked
    binder = cluster.parts["binder"]
    binder.assigned_events = True  # --bind-events all
    other = kube.add_pod(make_pod("train-2", 8, namespace="ml"))
    assert cluster.post("bind", bind_args(other, "node-a")) == (200, {"Error": ""})
    assert cluster.parts["events"].flush()
    assert kube.events[-1]["reason"] == "GPUShareAssigned"
    assert kube.events[-1]["message"] == "assigned GPU 0 (8 of 16 GiB) on node-a"
    cluster.settle()
    view = cluster.client.get(f"{PREFIX}/inspect/node-a").get_json()
    gpu0 = view["nodes"][0]["gpus"][0]
    assert gpu0["allocated"] == 16 and [p["pod"] for p in gpu0["pods"]] == ["ml/train-1", "ml/train-2"]


def test_bind_that_does_not_fit_fails_with_event(cluster):
    kube = cluster.kube
    pod = kube.add_pod(make_pod("big", 8))
    status, body = cluster.post("bind", bind_args(pod, "node-b"))
    assert status == 200
    assert body["Error"] == (
        "pod default/big no longer fits on node node-b: GPUs free: 0:6 GiB, 1:16 GiB (unhealthy); "
        "pod needs 8 GiB on one GPU"
    )
    assert kube.bindings == []
    assert cluster.parts["events"].flush()
    assert kube.events[-1]["reason"] == "FailedGPUShareBinding" and kube.events[-1]["type"] == "Warning"
    assert ANN_GPU_INDEX not in kube.pods[("default", "big")]["metadata"]["annotations"]


def test_bind_unknown_and_already_bound_pods(cluster):
    kube = cluster.kube
    status, body = cluster.post("bind", bind_args(make_pod("ghost", 4), "node-a"))
    assert status == 200 and body["Error"] == "pod default/ghost not found: it was deleted before it could be bound"
    other = kube.add_pod(make_pod("elsewhere", 4, node="node-c"))
    status, body = cluster.post("bind", bind_args(other, "node-a"))
    assert body["Error"] == "pod default/elsewhere is already bound to node node-c"
    fresh = kube.add_pod(make_pod("recreated", 4))
    args = bind_args(fresh, "node-a") | {"PodUID": "old-uid"}
    status, body = cluster.post("bind", args)
    assert "deleted and re-created" in body["Error"]
    assert kube.bindings == []


def test_bind_pod_without_gpu_mem_just_binds(cluster):
    pod = cluster.kube.add_pod(make_pod("web", None))
    status, body = cluster.post("bind", bind_args(pod, "node-c"))
    assert (status, body) == (200, {"Error": ""})
    assert cluster.kube.bindings == [("default", "web", "node-c")]
    assert ANN_GPU_INDEX not in cluster.kube.pods[("default", "web")]["metadata"]["annotations"]


def test_go_field_names_case_insensitive(cluster):
    # Go's encoding/json matches keys case-insensitively; so do we.
    status, body = cluster.post("filter", {"pod": make_pod("p", 2), "nodenames": ["node-a"]})
    assert status == 200 and body["NodeNames"] == ["node-a"]


def test_resource_name_in_messages(cluster):
    status, body = cluster.post("filter", filter_args(make_pod("p", 2), ["node-a"]))
    assert status == 200
    pod = make_pod("p", None)
    pod["spec"]["containers"][0]["resources"] = {"requests": {RESOURCE_MEM: "2"}}
    status, body = cluster.post("filter", filter_args(pod, ["node-a"]))
    assert "set in requests but not in limits" in body["Error"]


# kube-scheduler's bytes exactly: Go's encoding/json writes no spaces, and NodeNames last.
GO_FILTER = orjson.dumps(json.loads(KUBE_SCHEDULER_FILTER))


def test_go_layout_takes_the_short_path_and_answers_the_same(cluster):
    from share_scheduler.extender import NodeNameList
    from share_scheduler.extender import parse_extender_request

    assert isinstance(parse_extender_request(GO_FILTER).node_names, NodeNameList)
    assert not isinstance(parse_extender_request(KUBE_SCHEDULER_FILTER.encode()).node_names, NodeNameList)
    for spaced in (KUBE_SCHEDULER_FILTER, KUBE_SCHEDULER_FILTER.replace('"node-a", ', "")):
        compact = orjson.dumps(json.loads(spaced))
        for verb in ("filter", "prioritize"):
            a = cluster.client.post(f"{PREFIX}/{verb}", data=spaced, content_type="application/json")
            b = cluster.client.post(f"{PREFIX}/{verb}", data=compact, content_type="application/json")
            assert (a.status_code, a.get_json()) == (b.status_code, b.get_json()), verb


@pytest.mark.parametrize(
    "raw",
    [
        b'{"Pod":3,"Nodes":null,"NodeNames":["node-a"]}',
        b'{"Nodes":null,"NodeNames":["node-a"]}',
        b'{"Pod":{"metadata":[]},"Nodes":null,"NodeNames":[]}',
        b'{"Pod":{},"Nodes":null,"NodeNames":["node-a""node-b"]}',
        b'{"Pod":{},"Nodes":null,"NodeNames":["node-a",1]}',
        b'{"Pod":{},"Nodes":null,"NodeNames":[node-a]}',
        b'{"Pod":{"metadata":,"Nodes":null,"NodeNames":["node-a"]}',
    ],
)
def test_malformed_go_layout_is_still_refused(cluster, raw):
    resp = cluster.client.post(f"{PREFIX}/filter", data=raw, content_type="application/json")
    assert resp.status_code == 400, (raw, resp.data)
    assert resp.get_json()["Error"]


def test_node_name_list_answers_as_the_decoded_list():
    """The short path's names, searched as bytes, answer as the decoded list does: prefixes of other
    names, names that are not node names, and a pod whose annotation spells the NodeNames key."""
    import random

    from share_scheduler.extender import NodeNameList
    from share_scheduler.extender import parse_extender_request

    rng = random.Random(3)
    tricky = ["", "node-1", "node-10", "Node-1", 'node-1","node-2', "node-", "ノード", "node-1 ", ".", "-"]
    for _ in range(200):
        names = rng.sample([f"node-{i}" for i in range(40)] + ["a.b-c", "x", "gpu-0.zone-a"], rng.randrange(0, 12))
        pod = {"metadata": {"name": "p", "annotations": {"note": '","NodeNames":["node-39"]}'}}}
        raw = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        args = parse_extender_request(raw)
        assert isinstance(args.node_names, NodeNameList)
        assert args.pod == pod
        assert len(args.names) == len(names) and list(args.names) == names
        for query in tricky + [f"node-{i}" for i in range(45)]:
            assert (query in args.names) == (query in names), (query, names)
