"""Fixtures and builders for the extender's unit tests: a FakeKube cluster and an app over it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import pytest

from share_core.accounting import node_usage
from share_core.assignment import pod_node
from share_core.contract import ANN_ASSIGNED
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_INDEX
from share_core.contract import ANN_GPU_MEM
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import ANN_GPU_UUID
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import EXTENDER_PREFIX
from share_core.contract import RESOURCE_MEM
from share_core.fake import FakeKube
from share_core.gpus import node_gpus
from share_core.retry import Backoff
from share_scheduler.app import create_app

PREFIX = EXTENDER_PREFIX


# What a kubelet reports beside the GPUs (the extender counts CPU, memory and pods as kube-scheduler does):
# room enough that only the GPUs decide, unless a test says otherwise.
HOST = {"cpu": "128", "memory": "1Ti", "pods": "1000"}


def make_node(
    name: str, gpus: list[Any], model: str = "NVIDIA A100", host: dict[str, str] | None = None
) -> dict[str, Any]:
    """gpus: memory per GPU, or (memory, healthy[, model]) tuples; `host`: allocatable cpu, memory, pods."""
    items = []
    for i, g in enumerate(gpus):
        mem, healthy, m = (g, True, model) if isinstance(g, int) else (g[0], g[1], g[2] if len(g) > 2 else model)
        items.append({"index": i, "uuid": f"GPU-{name}-{i}", "model": m, "memory": mem, "healthy": healthy})
    total = sum(i["memory"] for i in items)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpushare": "true"}, "annotations": {ANN_NODE_GPUS: json.dumps(items)}},
        "status": {
            "capacity": {RESOURCE_MEM: str(total), **HOST, **(host or {})},
            "allocatable": {RESOURCE_MEM: str(total), **HOST, **(host or {})},
        },
    }


def make_pod(
    name: str,
    mem: Any = 4,
    namespace: str = "default",
    count: int | None = None,
    models: str | None = None,
    node: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    ann = dict(annotations or {})
    if count is not None:
        ann[ANN_GPU_COUNT] = str(count)
    if models is not None:
        ann[ANN_GPU_MODEL] = models
    limits = {} if mem is None else {RESOURCE_MEM: mem}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "annotations": ann},
        "spec": {
            "schedulerName": "gpushare-scheduler",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def truth(kube: FakeKube) -> dict[str, dict[int, int]]:
    """What the API server's annotations say is promised, per node and GPU (share_core's accounting)."""
    with kube._lock:
        nodes = list(kube.nodes.values())
        pods = list(kube.pods.values())
    out = {}
    for node in nodes:
        name = node["metadata"]["name"]
        usage = node_usage(node_gpus(node), [p for p in pods if pod_node(p) == name])
        out[name] = {g.index: g.used for g in usage.gpus}
    return out


def capacity(kube: FakeKube) -> dict[str, dict[int, int]]:
    return {n["metadata"]["name"]: {g.index: g.memory for g in node_gpus(n)} for n in kube.nodes.values()}


def wait_until(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll until `pred()`. Generous: these tests also run at nice 19 beside benchmarks, where a sync
    thread can wait seconds for the CPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def fast_backoff() -> Backoff:
    return Backoff(initial=0.01, maximum=0.05)


def assigned_pod(name: str, node: str, gpu: int, mem: int) -> dict[str, Any]:
    """A pod bound to `node` with `mem` units on its GPU `gpu` (UUID GPU-<node>-<gpu>), its Allocate served."""
    ann = {ANN_GPU_INDEX: str(gpu), ANN_GPU_UUID: f"GPU-{node}-{gpu}", ANN_GPU_MEM: str(mem), ANN_ASSIGNED: "true"}
    return make_pod(name, mem, node=node, annotations=ann)


def filter_args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Exactly what kube-scheduler POSTs with nodeCacheCapable: Go field names, Nodes null."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def bind_args(pod: dict[str, Any], node: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def schedule(ext: Extender, pod: dict[str, Any], node: str) -> Any:
    """One kube-scheduler cycle for `pod` onto `node`: filter, then bind (kube-scheduler's order)."""
    ext.call("filter", filter_args(pod, [node]))
    return ext.call("bind", bind_args(pod, node))


class Extender:
    """An app over a FakeKube with its sync threads running; stopped at teardown."""

    def __init__(self, kube: FakeKube, **kw: Any) -> None:
        kw.setdefault("sync_backoff", fast_backoff)
        self.kube = kube
        self.app = create_app(kube, **kw)
        self.parts = self.app.extensions["gpushare"]
        self.cache = self.parts["cache"]
        self.client = self.app.test_client()

    def wait_ready(self) -> Extender:
        wait_until(lambda: self.cache.synced, what="first sync")
        return self

    def settle(self) -> None:
        """Wait until the cache equals the API server's truth."""
        wait_until(lambda: self.cache.usage() == truth(self.kube), what="cache == annotations")

    def post(self, verb: str, body: Any) -> tuple[int, Any]:
        resp = self.client.post(f"{PREFIX}/{verb}", json=body)
        return resp.status_code, resp.get_json()

    def call(self, verb: str, body: Any) -> Any:
        """POST a well-formed request: kube-scheduler needs a 200 for it, whatever the outcome."""
        status, out = self.post(verb, body)
        assert status == 200, (verb, status, out)
        return out

    def stop(self) -> None:
        self.parts["syncer"].stop(timeout=0)  # the threads end when their watch closes


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def extender_factory(kube: FakeKube) -> Iterator[Callable[..., Extender]]:
    made: list[Extender] = []

    def make(**kw: Any) -> Extender:
        ext = Extender(kube, **kw)
        made.append(ext)
        return ext

    yield make
    for ext in made:
        ext.stop()
    kube.close_watches()
