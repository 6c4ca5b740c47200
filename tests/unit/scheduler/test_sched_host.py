"""The extender sees the whole node (issue 31): allocatable CPU, memory and pods; every pod bound there
counted as kube-scheduler counts it; CPU-only pods placed by the policy and bound plainly."""

from __future__ import annotations

import random
from typing import Any

from share_core.assignment import pod_is_finished
from share_core.assignment import pod_node
from share_core.contract import ANN_GPU_INDEX
from share_core.podresources import pod_host_request
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until

GI = 2**30


def with_host(pod: dict[str, Any], cpu: str | None = None, mem: str | None = None, **spec: Any) -> dict[str, Any]:
    req = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    pod["spec"]["containers"][0]["resources"]["requests"] = req
    pod["spec"].update(spec)
    return pod


def ready(ext: Any, kube: Any) -> Any:
    """Synced, and the pod watch open: FakeKube delivers no event from before a watch starts."""
    ext.wait_ready()
    wait_until(lambda: any(kind == "pods" for kind, _, _ in kube._watchers), what="the pod watch")
    return ext


def host_truth(kube: Any) -> dict[str, tuple[int, int, int]]:
    """A fresh list counted as kube-scheduler counts it: every bound pod that has not finished."""
    with kube._lock:
        nodes = [n["metadata"]["name"] for n in kube.nodes.values()]
        pods = list(kube.pods.values())
    out = {name: (0, 0, 0) for name in nodes}
    for p in pods:
        node = pod_node(p)
        if node in out and not pod_is_finished(p):
            r = pod_host_request(p)
            cpu, mem, n = out[node]
            out[node] = (cpu + r.cpu, mem + r.memory, n + 1)
    return out


def test_every_bound_pod_counts_and_terminal_pods_free(kube, extender_factory):
    kube.add_node(make_node("gpu", [16], host={"cpu": "8", "memory": "32Gi", "pods": "4"}))
    kube.add_node(make_node("cpu", [], host={"cpu": "4", "memory": "8Gi", "pods": "110"}))
    other = with_host(make_pod("other", None, node="gpu"), "3", "4Gi", schedulerName="default-scheduler")
    kube.add_pod(other)  # another scheduler's pod, no GPU: still takes CPU
    ds = with_host(make_pod("ds", None, node="gpu"), "500m", "1Gi")
    ds["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "6"}}}]
    kube.add_pod(ds)  # the init container's 6 CPU is the pod's floor
    kube.add_pod(with_host(make_pod("pending", None), "1", "1Gi"))  # unbound: counts nowhere
    ext = ready(extender_factory(), kube)
    assert ext.cache.host_usage()["gpu"] == (3000 + 6000, 5 * GI, 2)
    assert ext.cache.host_usage() == host_truth(kube)
    state = ext.cache.node_state("gpu")
    assert (state.cpu_free, state.memory_free) == (0, 27 * GI)
    # A GPU pod asking 1 CPU no longer fits the GPU node: kube-scheduler's NodeResourcesFit agrees.
    body = ext.call("filter", filter_args(with_host(make_pod("g", 4), "1"), ["gpu", "cpu"]))
    assert body["NodeNames"] == []
    assert "Insufficient cpu" in body["FailedNodes"]["gpu"]
    assert "offers no nvidia.com/gpu-mem" in body["FailedAndUnresolvableNodes"]["cpu"]
    # One asking no CPU still fits (request 0 always fits, even on a node whose CPU is all requested).
    assert ext.call("filter", filter_args(make_pod("g0", 4), ["gpu", "cpu"]))["NodeNames"] == ["gpu"]
    kube.set_pod_phase("default", "ds", "Succeeded")
    # ds freed; g0's hold (filter left it one node) counts its pod slot until its bind or the hold lapses.
    wait_until(lambda: ext.cache.host_usage()["gpu"] == (3000, 4 * GI, 2), what="terminal pod freed")
    assert ext.call("filter", filter_args(with_host(make_pod("g", 4), "1"), ["gpu", "cpu"]))["NodeNames"] == ["gpu"]


def test_cpu_only_pod_is_placed_by_the_policy_and_bound_plainly(kube, extender_factory):
    kube.add_node(make_node("gpu", [16, 16], host={"cpu": "8", "memory": "32Gi", "pods": "110"}))
    kube.add_node(make_node("plain", [], host={"cpu": "2", "memory": "4Gi", "pods": "110"}))
    ext = ready(extender_factory(), kube)
    small = kube.add_pod(with_host(make_pod("small", None), "1", "1Gi"))
    # binpack: the node with no GPU free (a node without GPUs) first.
    assert ext.call("filter", filter_args(small, ["gpu", "plain"]))["NodeNames"] == ["plain"]
    assert ext.call("bind", bind_args(small, "plain")) == {"Error": ""}
    bound = kube.pods[("default", "small")]
    assert pod_node(bound) == "plain" and ANN_GPU_INDEX not in (bound["metadata"].get("annotations") or {})
    assert kube.bindings[-1] == ("default", "small", "plain")
    wait_until(lambda: ext.cache.host_usage()["plain"] == (1000, GI, 1), what="bound pod counted")
    big = kube.add_pod(with_host(make_pod("big", None), "3", "1Gi"))
    assert ext.call("filter", filter_args(big, ["gpu", "plain"]))["NodeNames"] == ["gpu"]  # plain is short of CPU
    body = ext.call("filter", filter_args(big, ["plain"]))
    assert body["NodeNames"] == [] and "Insufficient cpu" in body["FailedAndUnresolvableNodes"]["plain"]
    huge = kube.add_pod(with_host(make_pod("huge", None), "1", "1Gi"))
    kube.add_pod(with_host(make_pod("filler", None, node="plain"), "1"))
    wait_until(lambda: ext.cache.host_usage()["plain"][0] == 2000, what="filler counted")
    assert ext.call("filter", filter_args(huge, ["plain"]))["NodeNames"] == []
    # A pod that fits nowhere in the bind (the cache moved on) gets no Binding.
    assert "no longer fits" in ext.call("bind", bind_args(huge, "plain"))["Error"]


def test_node_without_allocatable_takes_no_pod(kube, extender_factory):
    bare = make_node("bare", [16])
    del bare["status"]["allocatable"]
    kube.add_node(bare)
    full = make_node("full", [16], host={"pods": "1"})
    kube.add_node(full)
    kube.add_pod(make_pod("sitting", None, node="full"))
    ext = ready(extender_factory(), kube)
    body = ext.call("filter", filter_args(make_pod("p", 4), ["bare", "full"]))
    assert body["NodeNames"] == []
    assert all("Too many pods" in r for r in body["FailedNodes"].values())


def test_cache_never_drifts_from_a_fresh_list(kube, extender_factory):
    """Random pod churn (other schedulers, garbage quantities, resizes, phases, deletes) through the
    watch, then the cache's counts against a fresh list counted by share_core.podresources."""
    rng = random.Random(31)
    nodes = [f"n{i}" for i in range(4)]
    for name in nodes:
        kube.add_node(make_node(name, [16], host={"cpu": "64", "memory": "256Gi", "pods": "110"}))
    ext = ready(extender_factory(), kube)
    quantities = ["100m", "1", "2.5", "garbage", "-1", "1e3m", "0.0001"]
    live: list[str] = []
    for step in range(300):
        op = rng.random()
        if op < 0.45 or not live:
            name = f"p{step}"
            pod = with_host(make_pod(name, None, node=rng.choice([*nodes, None])), rng.choice(quantities), "1Gi")
            if rng.random() < 0.3:
                pod["spec"]["overhead"] = {"cpu": rng.choice(quantities)}
            kube.add_pod(pod)
            live.append(name)
        elif op < 0.65:
            name = rng.choice(live)
            cpu = rng.choice(quantities)

            def resize(p: dict[str, Any], cpu: str = cpu) -> None:
                cs = {"name": "main", "allocatedResources": {"cpu": cpu}, "resources": {"requests": {"cpu": cpu}}}
                p.setdefault("status", {})["containerStatuses"] = [cs]

            kube.update_pod("default", name, resize)
        elif op < 0.8:
            kube.set_pod_phase("default", rng.choice(live), rng.choice(["Running", "Succeeded", "Failed"]))
        else:
            name = live.pop(rng.randrange(len(live)))
            kube.delete_pod("default", name)
    wait_until(lambda: ext.cache.host_usage() == host_truth(kube), what="cache == a fresh list")
    assert any(u[2] for u in ext.cache.host_usage().values())
    view = ext.client.get("/gpushare-scheduler/inspect").get_json()
    assert any("CPU/memory request" in p for p in view["problems"])  # garbage is named, not fatal
