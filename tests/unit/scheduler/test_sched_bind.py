"""bind under contention, restarts and API faults: no GPU is ever promised more than it has, and the
cache always converges to what the API server's annotations say."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

from share_core.contract import ANN_GPU_INDEX
from share_core.fake import FakeKube
from share_core.kube import Conflict, Gone, KubeError, Unavailable
from tests.unit.scheduler.conftest import bind_args, capacity, make_node, make_pod, truth, wait_until


def over_committed(kube: FakeKube) -> list[str]:
    cap = capacity(kube)
    return [
        f"{node} GPU {i}: {used} > {cap[node][i]}"
        for node, gpus in truth(kube).items()
        for i, used in gpus.items()
        if used > cap[node][i]
    ]


def test_200_concurrent_binds_on_one_node(kube, extender_factory):
    kube.add_node(make_node("node-a", [16, 16]))
    rng = random.Random(5)
    pods = [kube.add_pod(make_pod(f"p{i}", rng.choice([1, 2, 3, 4, 8]))) for i in range(200)]
    ext = extender_factory().wait_ready()
    barrier = threading.Barrier(50)

    def fire(pod):
        try:
            barrier.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        client = ext.app.test_client()
        resp = client.post("/gpushare-scheduler/bind", json=bind_args(pod, "node-a"))
        return resp.status_code, resp.get_json()

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(fire, pods))
    assert all(status == 200 for status, _ in results)
    winners = [p for p, (_, body) in zip(pods, results, strict=True) if body["Error"] == ""]
    losers = [(p, body["Error"]) for p, (_, body) in zip(pods, results, strict=True) if body["Error"]]
    assert losers and winners
    assert all("no longer fits on node node-a" in err for _, err in losers)
    assert over_committed(kube) == []
    assert len(kube.bindings) == len(winners)
    bound = {(ns, name) for ns, name, _ in kube.bindings}
    for pod, _ in losers:
        stored = kube.pods[("default", pod["metadata"]["name"])]
        assert ("default", pod["metadata"]["name"]) not in bound
        assert ANN_GPU_INDEX not in stored["metadata"]["annotations"]
    used = sum(truth(kube)["node-a"].values())
    smallest_loser = min(
        int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu-mem"]) for p, _ in losers
    )
    assert 32 - used < smallest_loser or max(16 - u for u in truth(kube)["node-a"].values()) < smallest_loser
    ext.settle()
    assert ext.cache.usage() == truth(kube)
    events = [e for e in kube.events if e["reason"] == "GPUShareAssigned"]
    assert len(events) == len(winners)


def test_restart_mid_burst(kube, extender_factory):
    for n in ("node-a", "node-b"):
        kube.add_node(make_node(n, [16, 16]))
    pods = [kube.add_pod(make_pod(f"p{i}", 3)) for i in range(40)]
    first = extender_factory().wait_ready()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: first.post("bind", bind_args(p, "node-a")), pods[:8]))
    # Crash between the annotation patch and the Binding: annotations on an unbound pod.
    kube.fail("bind_pod", RuntimeError("process killed"))
    body = first.call("bind", bind_args(pods[8], "node-a"))
    assert "unexpected error" in body["Error"]
    assert kube.pods[("default", "p8")]["metadata"]["annotations"].get(ANN_GPU_INDEX) is not None
    first.stop()
    kube.close_watches()

    second = extender_factory().wait_ready()
    assert second.cache.usage() == truth(kube)  # rebuilt exactly from annotations
    assert second.cache.usage()["node-a"] == {0: 15, 1: 9}  # binpack; p8's stale annotations count nowhere
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: second.post("bind", bind_args(p, "node-b")), pods[8:]))
    assert sum(1 for _, b in results if b["Error"] == "") == 10  # 5 x 3 GiB per 16 GiB GPU
    assert over_committed(kube) == []
    second.settle()
    third = extender_factory().wait_ready()
    assert third.cache.usage() == truth(kube) == second.cache.usage()


def test_patch_conflict_is_retried(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    kube.fail("patch_pod_annotations", Conflict("changed", 409), times=2)
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert body == {"Error": ""}
    assert kube.calls["patch_pod_annotations"] == 3
    assert kube.pods[("default", "p")]["spec"]["nodeName"] == "node-a"
    ext.settle()


def test_patch_conflict_from_a_real_concurrent_writer(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    stale = kube.get_pod("default", "p")
    kube.update_pod("default", "p", lambda p: p["metadata"].setdefault("labels", {}).update(x="y"))
    ext.parts["binder"].kube = _StaleFirstRead(kube, stale)
    body = ext.call("bind", bind_args(stale, "node-a"))
    assert body == {"Error": ""}
    assert kube.pods[("default", "p")]["metadata"]["labels"] == {"x": "y"}
    assert kube.pods[("default", "p")]["metadata"]["annotations"][ANN_GPU_INDEX] == "0"


class _StaleFirstRead:
    """A client whose first get_pod returns an old version: the patch must then Conflict."""

    def __init__(self, kube, stale):
        self._kube, self._stale = kube, stale

    def get_pod(self, ns, name):
        stale, self._stale = self._stale, None
        return stale if stale is not None else self._kube.get_pod(ns, name)

    def __getattr__(self, name):
        return getattr(self._kube, name)


def test_conflicts_forever_give_up(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    kube.fail("patch_pod_annotations", Conflict("changed", 409), times=10)
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "kept changing" in body["Error"]
    assert ext.cache.usage()["node-a"] == {0: 0}
    assert kube.bindings == []


def test_patch_500_rolls_back(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    kube.fail("patch_pod_annotations", Unavailable("HTTP 500", 500))
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "could not record the GPU assignment" in body["Error"]
    assert ext.cache.usage()["node-a"] == {0: 0}
    assert kube.events[-1]["reason"] == "FailedGPUShareBinding"
    metrics = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_bind_failures_total{reason="api_error"} 1.0' in metrics
    # kube-scheduler retries: now it works.
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert body == {"Error": ""}


def test_binding_failure_removes_annotations(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    kube.fail("bind_pod", KubeError("HTTP 403: forbidden", 403))
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "could not bind pod default/p to node node-a" in body["Error"]
    assert ANN_GPU_INDEX not in kube.pods[("default", "p")]["metadata"]["annotations"]
    assert ext.cache.usage()["node-a"] == {0: 0}
    ext.settle()


def test_binding_500_but_pod_not_bound_rolls_back(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    kube.fail("bind_pod", Unavailable("HTTP 500", 500))
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "HTTP 500" in body["Error"]
    assert ANN_GPU_INDEX not in kube.pods[("default", "p")]["metadata"]["annotations"]
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 0}


class _BindThenTimeout(FakeKube):
    """The Binding is created but the response is lost (a timeout)."""

    def bind_pod(self, namespace, name, uid, node):
        super().bind_pod(namespace, name, uid, node)
        raise Unavailable("POST binding: API server unreachable or timed out: read timeout")


def test_binding_timeout_but_bound_is_success(extender_factory):
    kube = _BindThenTimeout()
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    from tests.unit.scheduler.conftest import Extender

    ext = Extender(kube).wait_ready()
    try:
        body = ext.call("bind", bind_args(pod, "node-a"))
        assert body == {"Error": ""}
        assert kube.pods[("default", "p")]["metadata"]["annotations"][ANN_GPU_INDEX] == "0"
        ext.settle()
        assert ext.cache.usage()["node-a"] == {0: 4}
    finally:
        ext.stop()
        kube.close_watches()


def test_binding_timeout_unknown_outcome_keeps_assumption(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    kube.fail("bind_pod", Unavailable("timed out"))
    kube.fail("get_pod", Unavailable("timed out"))
    ext.parts["binder"]._read_pod = lambda args: kube.pods[("default", "p")]  # first read succeeds
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "unknown outcome" in body["Error"]
    # Still counted (the Binding may exist); it expires unless the watch shows the pod bound.
    assert ext.cache.usage()["node-a"] == {0: 4}


def test_assumed_pod_expires_after_ttl(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    ext = extender_factory(assume_ttl=0.2).wait_ready()
    from share_scheduler.cache import Contribution

    ext.cache.assume("default/ghost", "uid-x", Contribution("node-a", (0,), 8))
    assert ext.cache.usage()["node-a"] == {0: 8}
    assert ext.client.get("/gpushare-scheduler/inspect").get_json()["pending"][0]["pod"] == "default/ghost"
    wait_until(lambda: ext.cache.usage()["node-a"] == {0: 0}, timeout=3, what="TTL expiry")


def test_finished_and_deleted_pods_release_memory(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pods = [kube.add_pod(make_pod(f"p{i}", 8)) for i in range(3)]
    ext = extender_factory().wait_ready()
    assert [ext.post("bind", bind_args(p, "node-a"))[1]["Error"] == "" for p in pods] == [True, True, False]
    ext.settle()
    kube.set_pod_phase("default", "p0", "Succeeded")
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 8}
    assert ext.post("bind", bind_args(pods[2], "node-a"))[1] == {"Error": ""}
    kube.delete_pod("default", "p1")
    kube.set_pod_phase("default", "p2", "Failed")
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 0}


def test_watch_closed_and_gone_resync(kube, extender_factory):
    kube.add_node(make_node("node-a", [16, 16]))
    ext = extender_factory().wait_ready()
    lists = dict(ext.parts["syncer"].lists)
    kube.close_watches()
    # Changes while no watch is open are caught by the re-list.
    kube.add_node(make_node("node-b", [8]))
    kube.add_pod(make_pod("x", 8, node="node-b", annotations={ANN_GPU_INDEX: "0", "gpushare.io/gpu-mem": "8"}))
    ext.settle()
    assert ext.cache.usage()["node-b"] == {0: 8}
    kube.fail("watch_pods", Gone("too old resourceVersion", 410))
    kube.fail("list_pods", Unavailable("HTTP 503", 503), times=2)
    kube.close_watches()
    kube.set_pod_phase("default", "x", "Succeeded")
    ext.settle()
    wait_until(lambda: ext.parts["syncer"].lists["pods"] >= lists["pods"] + 2, what="re-lists")
    assert ext.parts["syncer"].errors["pods"] >= 2
    assert ext.cache.usage()["node-b"] == {0: 0}
    assert ext.client.get("/readyz").status_code == 200


def test_not_ready_until_first_sync(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    kube.fail("list_pods", Unavailable("HTTP 500", 500), times=3)
    ext = extender_factory()
    resp = ext.client.get("/readyz")
    if resp.status_code == 503:  # the first list may not have happened yet; it fails three times
        body = ext.call("filter", {"Pod": pod, "NodeNames": ["node-a"]})
        assert "still syncing" in body["Error"] or body["NodeNames"] == ["node-a"]
    ext.wait_ready()
    assert ext.client.get("/readyz").status_code == 200
    assert ext.post("filter", {"Pod": pod, "NodeNames": ["node-a"]})[1]["NodeNames"] == ["node-a"]


def test_not_synced_answers(kube):
    from share_scheduler.app import create_app

    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    app = create_app(kube, start_sync=False)
    client = app.test_client()
    assert client.get("/readyz").status_code == 503
    body = client.post("/gpushare-scheduler/filter", json={"Pod": pod, "NodeNames": ["node-a"]}).get_json()
    assert body["Error"] == "gpushare extender is still syncing its cache; retry"
    body = client.post("/gpushare-scheduler/bind", json=bind_args(pod, "node-a")).get_json()
    assert "still syncing" in body["Error"]
    assert kube.bindings == []


def test_node_changes_health_and_fallback_capacity(kube, extender_factory):
    kube.add_node(make_node("node-a", [16, 16]))
    plain = {
        "metadata": {"name": "plain"},
        "status": {"capacity": {"nvidia.com/gpu-mem": "32", "nvidia.com/gpu-count": "2"}},
    }
    kube.add_node(plain)
    ext = extender_factory().wait_ready()
    assert ext.cache.usage()["plain"] == {0: 0, 1: 0}
    pod = kube.add_pod(make_pod("p", 16))
    assert ext.post("filter", {"Pod": pod, "NodeNames": ["plain"]})[1]["NodeNames"] == ["plain"]
    sick = make_node("node-a", [(16, False), 16])["metadata"]["annotations"]
    kube.patch_node_annotations("node-a", sick)
    wait_until(lambda: not ext.cache.node_state("node-a").gpus[0].healthy, what="GPU 0 unhealthy")
    body = ext.call("filter", {"Pod": make_pod("two", 32, count=2), "NodeNames": ["node-a"]})
    assert (
        "0:16 GiB (unhealthy), 1:16 GiB; pod needs 16 GiB on each of 2 GPUs"
        in body["FailedAndUnresolvableNodes"]["node-a"]
    )
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert body == {"Error": ""}
    assert kube.pods[("default", "p")]["metadata"]["annotations"][ANN_GPU_INDEX] == "1"  # GPU 0 is unhealthy


def test_inspect_metrics_version(kube, extender_factory):
    kube.add_node(make_node("node-a", [16, 16]))
    pod = kube.add_pod(make_pod("p", 6))
    ext = extender_factory().wait_ready()
    ext.post("filter", {"Pod": pod, "NodeNames": ["node-a"]})
    ext.post("bind", bind_args(pod, "node-a"))
    ext.settle()
    wait_until(lambda: ext.client.get("/gpushare-scheduler/inspect").get_json()["pending"] == [], what="bound")
    view = ext.client.get("/gpushare-scheduler/inspect").get_json()
    assert view["unit"] == "GiB"
    node = view["nodes"][0]
    assert (node["name"], node["total"], node["allocated"]) == ("node-a", 32, 6)
    assert node["gpus"][0]["pods"] == [{"pod": "default/p", "memory": 6, "bound": True, "assigned": False}]
    assert ext.client.get("/gpushare-scheduler/inspect/nope").status_code == 404
    text = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_gpu_memory_allocated{gpu="0",node="node-a",uuid="GPU-node-a-0"} 6.0' in text
    assert 'gpushare_gpu_memory_total{gpu="1",node="node-a",uuid="GPU-node-a-1"} 16.0' in text
    assert 'gpushare_extender_request_seconds_count{verb="filter"} 1.0' in text
    assert 'gpushare_extender_request_seconds_count{verb="bind"} 1.0' in text
    assert ext.client.get("/version").get_json()["policy"] == "binpack"
    assert ext.client.get("/healthz").status_code == 200


def test_policy_observes_every_pod(kube, extender_factory):
    seen = []

    class Recorder:
        name = "recorder"

        def choose(self, node, demand):
            from share_scheduler.placement import BinpackPolicy

            return BinpackPolicy().choose(node, demand)

        def score(self, node, demand):
            return 0.0

        def observe(self, demand):
            seen.append(demand.per_gpu)

    kube.add_node(make_node("node-a", [16]))
    kube.add_pod(make_pod("old", 2, node="node-a", annotations={ANN_GPU_INDEX: "0", "gpushare.io/gpu-mem": "2"}))
    kube.add_pod(make_pod("web", None))
    ext = extender_factory(policy=Recorder()).wait_ready()
    assert seen == [2]
    kube.add_pod(make_pod("new", 5))
    wait_until(lambda: seen == [2, 5], what="observe of a new pod")
    kube.set_pod_phase("default", "new", "Running")
    ext.settle()
    assert seen == [2, 5]  # once per pod
