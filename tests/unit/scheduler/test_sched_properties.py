"""Property tests over the HTTP API (Flask test client): thousands of random requests, no 5xx, every
answer well-formed, and random bind sequences never over-commit a GPU nor let the cache drift."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import EXTENDER_PREFIX
from share_core.contract import RESOURCE_MEM
from share_core.fake import FakeKube
from share_scheduler.app import create_app
from tests.unit.scheduler.conftest import capacity
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import truth

NODES = ["a", "b", "c", "d"]


def _cluster() -> tuple[FakeKube, object]:
    kube = FakeKube()
    kube.add_node(make_node("a", [16, 16]))
    kube.add_node(make_node("b", [(8, True), (24, False), (40, True, "H100")]))
    kube.add_node(make_node("c", [80], model="NVIDIA A100-SXM4-80GB"))
    kube.add_node({"metadata": {"name": "d"}, "status": {}})
    app = create_app(kube, start_sync=False)
    syncer = app.extensions["gpushare"]["syncer"]
    syncer.sync_once("nodes")
    syncer.sync_once("pods")
    return kube, app


KUBE, APP = _cluster()
CLIENT = APP.test_client()


def settings_for(n: int) -> settings:  # derandomized: the suite must be reproducible on CI
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
quantities = st.one_of(
    st.integers(-4, 100),
    st.sampled_from(["8", "1.5", "-1", "2Gi", "1k", "abc", "", "0", "500m", "1e1", "+3", "16"]),
    st.floats(-2, 50, allow_nan=False),
    st.none(),
    st.booleans(),
    st.lists(st.integers(-1000, 1000), max_size=2),
    st.sampled_from(["1e5000", "9" * 30, "1e18", "1Ei", "7e-3", "1e999999"]),
)
annotations = st.fixed_dictionaries(
    {},
    optional={
        ANN_GPU_COUNT: st.sampled_from(["", "0", "1", "2", "3", "x", "-1", " 2 "]),
        ANN_GPU_MODEL: st.sampled_from(["a100", "h100,a100", "t4", "", ",,", "A100-SXM4"]),
    },
)


@st.composite
def pods(draw):
    containers = []
    for i in range(draw(st.integers(0, 3))):
        limits = {} if draw(st.booleans()) is False else {RESOURCE_MEM: draw(quantities)}
        resources = draw(st.sampled_from(["ok", "limits-not-dict", "requests-too"]))
        res: object = {"limits": limits}
        if resources == "limits-not-dict":
            res = {"limits": draw(json_values)}
        elif resources == "requests-too":
            res = {"limits": limits, "requests": {RESOURCE_MEM: draw(quantities)}}
        containers.append({"name": f"c{i}", "resources": res})
    spec: dict = {"containers": containers}
    if draw(st.booleans()):
        spec["initContainers"] = [{"name": "init", "resources": {"limits": {RESOURCE_MEM: draw(quantities)}}}]
    return {"metadata": {"name": "p", "namespace": "default", "annotations": draw(annotations)}, "spec": spec}


@st.composite
def extender_args(draw):
    names = draw(st.lists(st.sampled_from([*NODES, "ghost", ""]), max_size=6))
    pod = draw(pods())
    if draw(st.booleans()):
        return names, {"Pod": pod, "Nodes": None, "NodeNames": names}
    items = [{"metadata": {"name": n}} for n in names]
    return names, {"Pod": pod, "Nodes": {"kind": "NodeList", "items": items}, "NodeNames": None}


def post(verb: str, body: bytes):
    resp = CLIENT.post(f"{EXTENDER_PREFIX}/{verb}", data=body, content_type="application/json")
    assert resp.status_code in (200, 400), (verb, resp.status_code, resp.data)
    return resp.status_code, orjson.loads(resp.data)


@settings_for(400)
@given(verb=st.sampled_from(["filter", "prioritize", "bind"]), body=json_values)
def test_random_json_is_answered(verb, body):
    status, out = post(verb, orjson.dumps(body))
    if status == 400 or verb != "prioritize":
        assert isinstance(out, dict) and "Error" in out
    if verb == "bind":
        assert out["Error"]  # no such pod or malformed


@settings_for(100)
@given(raw=st.binary(max_size=64))
def test_random_bytes_are_answered(raw):
    for verb in ("filter", "prioritize", "bind"):
        status, out = post(verb, raw)
        assert status in (200, 400) and "Error" in out


@settings_for(800)
@given(args=extender_args())
def test_random_pods_filter_and_prioritize(args):
    names, body = args
    raw = orjson.dumps(body)
    status, out = post("filter", raw)
    if status == 200 and not out["Error"]:
        passed = (
            out["NodeNames"]
            if body["NodeNames"] is not None
            else [n["metadata"]["name"] for n in out["Nodes"]["items"]]
        )
        failed = set(out["FailedNodes"]) | set(out["FailedAndUnresolvableNodes"])
        assert not set(passed) & failed
        assert set(passed) | failed <= set(names)
        if not passed:  # only then does kube-scheduler read the reasons: every node has one
            assert failed == set(names)
        assert all(isinstance(r, str) and r for r in [*out["FailedNodes"].values()])
    status, scores = post("prioritize", raw)
    if status == 200:
        assert [s["Host"] for s in scores] == names
        assert all(0 <= s["Score"] <= 10 for s in scores)


@settings_for(120)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["bind", "bind", "bind", "finish", "delete"]),
            st.integers(0, 11),  # pod
            st.sampled_from([1, 2, 4, 7, 8, 16, 33]),  # GiB
            st.sampled_from([1, 1, 1, 2]),  # GPUs
            st.sampled_from(["a", "b", "c", "d", "ghost"]),
        ),
        max_size=25,
    )
)
def test_random_bind_sequences_never_overcommit(ops):
    kube = FakeKube()
    kube.add_node(make_node("a", [16, 16]))
    kube.add_node(make_node("b", [(8, True), (24, False), (40, True)]))
    kube.add_node(make_node("c", [32]))
    kube.add_node({"metadata": {"name": "d"}, "status": {}})
    app = create_app(kube, start_sync=False)
    parts = app.extensions["gpushare"]
    syncer, cache = parts["syncer"], parts["cache"]
    syncer.sync_once("nodes")
    syncer.sync_once("pods")
    client = app.test_client()
    cap = capacity(kube)
    for op, i, mem, count, node in ops:
        name = f"p{i}"
        if op == "bind":
            if ("default", name) not in kube.pods:
                kube.add_pod(make_pod(name, mem * count, count=count))
            pod = kube.pods[("default", name)]
            args = {"PodName": name, "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": node}
            resp = client.post(f"{EXTENDER_PREFIX}/bind", json=args)
            assert resp.status_code == 200
        elif ("default", name) in kube.pods:
            if op == "finish":
                kube.set_pod_phase("default", name, "Succeeded")
            else:
                kube.delete_pod("default", name)
        # Before the watch catches up the cache may hold more (assumed or released pods), never less.
        now = truth(kube)
        for n, gpus in cache.usage().items():
            for idx, used in gpus.items():
                assert now[n][idx] <= used, (n, idx)
        for n, gpus in truth(kube).items():
            for idx, used in gpus.items():
                assert used <= cap[n][idx], (n, idx, used)
        syncer.sync_once("pods")
        assert cache.usage() == truth(kube)
