"""bind under contention, restarts and API faults: no GPU is ever promised more than it has, and the
cache always converges to what the API server's annotations say."""

from __future__ import annotations

import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from share_core.contract import ANN_GPU_INDEX
from share_core.fake import FakeKube
from share_core.kube import Gone
from share_core.kube import KubeError
from share_core.kube import Unavailable
from tests.unit.scheduler.conftest import HOST
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import capacity
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import schedule
from tests.unit.scheduler.conftest import truth
from tests.unit.scheduler.conftest import wait_until


def over_committed(kube: FakeKube) -> list[str]:
    cap = capacity(kube)
    return [
        f"{node} GPU {i}: {used} > {cap[node][i]}"
        for node, gpus in truth(kube).items()
        for i, used in gpus.items()
        if used > cap[node][i]
    ]


def one_pod(kube, extender_factory):
    """node-a with one 16 GiB GPU, pod p asking 4 GiB of it, and an extender ready to place it."""
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    return pod, extender_factory().wait_ready()


def pods_on_node_a(kube, extender_factory, gpus, sizes, **options):
    """node-a with GPUs of `gpus` GiB, pods p0, p1, ... asking `sizes` GiB, and an extender ready to place them."""
    kube.add_node(make_node("node-a", gpus))
    pods = [kube.add_pod(make_pod(f"p{i}", gib)) for i, gib in enumerate(sizes)]
    return pods, extender_factory(**options).wait_ready()


def failed_bind(kube, extender_factory, error):
    """Pod p scheduled to node-a, its Binding failing with `error`: none of it is left on the pod."""
    pod, ext = one_pod(kube, extender_factory)
    kube.fail("bind_pod", error)
    said = schedule(ext, pod, "node-a")["Error"]
    assert ANN_GPU_INDEX not in kube.pods[("default", "p")]["metadata"]["annotations"]
    return pod, ext, said


def test_200_concurrent_binds_on_one_node(kube, extender_factory):
    rng = random.Random(5)
    sizes = [rng.choice([1, 2, 3, 4, 8]) for _ in range(200)]
    pods, ext = pods_on_node_a(kube, extender_factory, [16, 16], sizes, bind_events="all")
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
    assert ext.parts["events"].flush()
    events = [e for e in kube.events if e["reason"] == "GPUShareAssigned"]
    assert len(events) == len(winners)


def test_restart_mid_burst(kube, extender_factory):
    for n in ("node-a", "node-b"):
        kube.add_node(make_node(n, [16, 16]))
    pods = [kube.add_pod(make_pod(f"p{i}", 3)) for i in range(40)]
    first = extender_factory().wait_ready()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: schedule(first, p, "node-a"), pods[:8]))
    # Killed inside the Binding call: one call records the GPU and binds, so nothing is half-done.
    kube.fail("bind_pod", RuntimeError("process killed"))
    body = schedule(first, pods[8], "node-a")
    assert "unexpected error" in body["Error"]
    assert ANN_GPU_INDEX not in kube.pods[("default", "p8")]["metadata"]["annotations"]
    assert "nodeName" not in kube.pods[("default", "p8")]["spec"]
    first.stop()
    kube.close_watches()

    second = extender_factory().wait_ready()
    assert second.cache.usage() == truth(kube)  # rebuilt exactly from annotations
    assert second.cache.usage()["node-a"] == {0: 15, 1: 9}  # binpack
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: schedule(second, p, "node-b"), pods[8:]))
    assert sum(1 for b in results if b["Error"] == "") == 10  # 5 x 3 GiB per 16 GiB GPU
    assert over_committed(kube) == []
    second.settle()
    third = extender_factory().wait_ready()
    assert third.cache.usage() == truth(kube) == second.cache.usage()


def test_bind_is_one_api_call_after_filter(kube, extender_factory):
    pod, ext = one_pod(kube, extender_factory)
    filtered = ext.call("filter", filter_args(pod, ["node-a"]))
    assert filtered["NodeNames"] == ["node-a"]
    before = dict(kube.calls)
    assert ext.call("bind", bind_args(pod, "node-a")) == {"Error": ""}
    made = {m: n - before.get(m, 0) for m, n in kube.calls.items() if n != before.get(m, 0)}
    assert made == {"bind_pod": 1}, made  # no GET, no PATCH: the Binding carries the annotations
    stored = kube.pods[("default", "p")]
    assert stored["spec"]["nodeName"] == "node-a"
    assert stored["metadata"]["annotations"][ANN_GPU_INDEX] == "0"
    assert ext.parts["events"].flush()
    assert kube.events == []  # by default Events are for failed binds only
    ext.settle()


def test_bind_events_failures_only_by_default(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    ok, big = kube.add_pod(make_pod("ok", 4)), kube.add_pod(make_pod("big", 32))
    ext = extender_factory().wait_ready()
    assert schedule(ext, ok, "node-a") == {"Error": ""}
    assert "no longer fits" in ext.call("bind", bind_args(big, "node-a"))["Error"]
    assert ext.parts["events"].flush()
    assert [e["reason"] for e in kube.events] == ["FailedGPUShareBinding"]


def test_bind_reads_the_pod_when_filter_did_not_see_it(kube, extender_factory):
    pod, ext = one_pod(kube, extender_factory)  # e.g. restarted between kube-scheduler's filter and bind
    assert ext.call("bind", bind_args(pod, "node-a")) == {"Error": ""}
    assert kube.calls["get_pod"] == 1 and kube.calls["bind_pod"] == 1
    metrics = ext.client.get("/metrics").get_data(as_text=True)
    assert "gpushare_bind_pod_reads_total 1.0" in metrics
    ext.settle()


def test_a_concurrent_writer_does_not_disturb_bind(kube, extender_factory):
    pod, ext = one_pod(kube, extender_factory)
    ext.call("filter", filter_args(pod, ["node-a"]))
    kube.update_pod("default", "p", lambda p: p["metadata"].setdefault("labels", {}).update(x="y"))
    assert ext.call("bind", bind_args(pod, "node-a")) == {"Error": ""}  # UID precondition only
    assert kube.pods[("default", "p")]["metadata"]["labels"] == {"x": "y"}
    assert kube.pods[("default", "p")]["metadata"]["annotations"][ANN_GPU_INDEX] == "0"


def test_recreated_pod_is_refused_by_the_uid_precondition(kube, extender_factory):
    pod, ext = one_pod(kube, extender_factory)
    ext.call("filter", filter_args(pod, ["node-a"]))
    kube.delete_pod("default", "p")
    twin = make_pod("p", 4)
    twin["metadata"]["uid"] = "uid-new"
    kube.add_pod(twin)
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "deleted and re-created" in body["Error"]
    assert "nodeName" not in kube.pods[("default", "p")]["spec"]
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 0}


def test_binding_already_bound_by_our_lost_answer_is_success(kube, extender_factory):
    pod, ext = one_pod(kube, extender_factory)
    assert schedule(ext, pod, "node-a") == {"Error": ""}
    # kube-scheduler timed out on that answer and binds again: 409 "already assigned", ours.
    assert schedule(ext, pod, "node-a") == {"Error": ""}
    assert len(kube.bindings) == 1
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 4}


def test_binding_refused_because_bound_elsewhere(kube, extender_factory):
    for n in ("node-a", "node-b"):
        kube.add_node(make_node(n, [16]))
    pod = kube.add_pod(make_pod("p", 4))
    ext = extender_factory().wait_ready()
    ext.call("filter", filter_args(pod, ["node-a"]))
    kube.bind_pod("default", "p", pod["metadata"]["uid"], "node-b")  # someone else bound it
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "already bound to node node-b" in body["Error"]
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 0}
    metrics = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_bind_failures_total{reason="already_bound"} 1.0' in metrics


def test_binding_failure_leaves_nothing_and_frees_the_reservation(kube, extender_factory):
    pod, ext, said = failed_bind(kube, extender_factory, KubeError("HTTP 403: forbidden", 403))
    assert "could not bind pod default/p to node node-a" in said
    assert ext.cache.usage()["node-a"] == {0: 0}
    assert ext.parts["events"].flush()
    assert kube.events[-1]["reason"] == "FailedGPUShareBinding"
    metrics = ext.client.get("/metrics").get_data(as_text=True)
    assert 'gpushare_bind_failures_total{reason="api_error"} 1.0' in metrics
    # kube-scheduler retries: now it works.
    assert schedule(ext, pod, "node-a") == {"Error": ""}
    ext.settle()


def test_binding_500_but_pod_not_bound_frees_the_reservation(kube, extender_factory):
    _, ext, said = failed_bind(kube, extender_factory, Unavailable("HTTP 500", 500))
    assert "HTTP 500" in said
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 0}


def test_a_failed_bind_behind_a_later_reservation_on_the_same_gpu(kube, extender_factory):
    """Binds to one node pipeline: A reserves, B reserves behind it on the same GPU, A's Binding fails.

    Only A's reservation goes; B keeps its GPU, and the space A held is free for the next pod."""
    kube.add_node(make_node("node-a", [16]))
    a, b, c = (kube.add_pod(make_pod(n, 6)) for n in ("a", "b", "c"))
    ext = extender_factory().wait_ready()
    for p in (a, b):
        ext.call("filter", filter_args(p, ["node-a"]))  # a lone node: filter holds GPU 0 for each
    assert ext.cache.usage()["node-a"] == {0: 12}
    assert ext.call("filter", filter_args(c, ["node-a"]))["NodeNames"] == []  # held memory is taken
    a_reserved, release_a = threading.Event(), threading.Event()
    real_bind = kube.bind_pod

    def slow_failing_bind(namespace, name, uid, node, annotations=None):
        if name == "a":
            a_reserved.set()
            release_a.wait(5)
            raise Unavailable("HTTP 503: etcd leader changed", 503)
        return real_bind(namespace, name, uid, node, annotations)

    kube.bind_pod = slow_failing_bind
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ext.call, "bind", bind_args(a, "node-a"))
        assert a_reserved.wait(5)
        assert ext.cache.usage()["node-a"] == {0: 12}  # A's reservation counts while its call waits
        assert ext.call("bind", bind_args(b, "node-a")) == {"Error": ""}  # not held up by A's call
        assert ext.cache.usage()["node-a"] == {0: 12}
        release_a.set()
        assert "HTTP 503" in first.result(5)["Error"]
    assert ext.cache.usage()["node-a"] == {0: 6}  # only A's reservation went
    assert kube.pods[("default", "b")]["metadata"]["annotations"][ANN_GPU_INDEX] == "0"
    assert schedule(ext, c, "node-a") == {"Error": ""}  # A's space is C's now
    assert over_committed(kube) == []
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 12}


def test_binds_to_one_node_pipeline(kube, extender_factory):
    pods, ext = pods_on_node_a(kube, extender_factory, [80], [4] * 10)
    for p in pods:
        ext.call("filter", filter_args(p, ["node-a"]))
    kube.delay("bind_pod", 0.5, times=10)
    start = time.monotonic()
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda p: ext.call("bind", bind_args(p, "node-a")), pods))
    took = time.monotonic() - start
    assert all(r == {"Error": ""} for r in results)
    assert took < 2.5, f"10 binds to one node with 0.5 s API calls took {took:.2f} s: they queued (5 s in a row)"
    assert over_committed(kube) == []
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 40}


def test_slow_events_never_hold_a_bind(kube, extender_factory):
    pods, ext = pods_on_node_a(kube, extender_factory, [80], [1] * 6, bind_events="all")
    events = ext.parts["events"]
    events._queue.maxsize = 2  # a tiny queue, to see drops
    kube.delay("create_event", 3.0, times=10)
    start = time.monotonic()
    for p in pods:
        assert schedule(ext, p, "node-a") == {"Error": ""}
    assert time.monotonic() - start < 2.5  # no bind waited on an Event (3 s each)
    metrics = ext.client.get("/metrics").get_data(as_text=True)
    dropped = float(re.search(r"^gpushare_events_dropped_total (\S+)$", metrics, re.M).group(1))
    assert dropped >= 3  # one being posted, two queued, the rest dropped and counted
    assert events.dropped == dropped


class _BindThenTimeout(FakeKube):
    """The Binding is created but the response is lost (a timeout)."""

    def bind_pod(self, namespace, name, uid, node, annotations=None):
        super().bind_pod(namespace, name, uid, node, annotations)
        raise Unavailable("POST binding: API server unreachable or timed out: read timeout")


def test_binding_timeout_but_bound_is_success(extender_factory):
    kube = _BindThenTimeout()
    kube.add_node(make_node("node-a", [16]))
    pod = kube.add_pod(make_pod("p", 4))
    from tests.unit.scheduler.conftest import Extender

    ext = Extender(kube).wait_ready()
    try:
        body = schedule(ext, pod, "node-a")
        assert body == {"Error": ""}
        assert kube.pods[("default", "p")]["metadata"]["annotations"][ANN_GPU_INDEX] == "0"
        ext.settle()
        assert ext.cache.usage()["node-a"] == {0: 4}
    finally:
        ext.stop()
        kube.close_watches()


def test_binding_timeout_unknown_outcome_keeps_assumption(kube, extender_factory):
    pod, ext = one_pod(kube, extender_factory)
    ext.call("filter", filter_args(pod, ["node-a"]))
    kube.fail("bind_pod", Unavailable("timed out"))
    kube.fail("get_pod", Unavailable("timed out"))
    body = ext.call("bind", bind_args(pod, "node-a"))
    assert "unknown outcome" in body["Error"]
    # Still counted (the Binding may exist); it expires unless the watch shows the pod bound.
    assert ext.cache.usage()["node-a"] == {0: 4}
    # kube-scheduler retries the pod: the new reservation replaces the old one, never adds to it.
    assert schedule(ext, pod, "node-a") == {"Error": ""}
    ext.settle()
    assert ext.cache.usage()["node-a"] == {0: 4}


def test_assumed_pod_expires_after_ttl(kube, extender_factory):
    kube.add_node(make_node("node-a", [16]))
    ext = extender_factory(assume_ttl=0.2).wait_ready()
    from share_scheduler.nodes import Contribution

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
        "status": {"capacity": {"nvidia.com/gpu-mem": "32", "nvidia.com/gpu-count": "2"}, "allocatable": dict(HOST)},
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
            from share_placement import BinpackPolicy

            return BinpackPolicy().choose(node, demand)

        def score(self, node, demand):
            return 0.0

        def observe(self, demand):
            seen.append(demand.per_gpu)

    kube.add_node(make_node("node-a", [16]))
    kube.add_pod(make_pod("old", 2, node="node-a", annotations={ANN_GPU_INDEX: "0", "gpushare.io/gpu-mem": "2"}))
    kube.add_pod(make_pod("web", None))
    ext = extender_factory(policy=Recorder()).wait_ready()
    assert seen == [2, 0]  # the CPU-only pod too: frag learns the whole workload, as share-sim does
    kube.add_pod(make_pod("new", 5))
    wait_until(lambda: seen == [2, 0, 5], what="observe of a new pod")
    kube.set_pod_phase("default", "new", "Running")
    ext.settle()
    assert seen == [2, 0, 5]  # once per pod
