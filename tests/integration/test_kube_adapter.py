"""share_core.kube.ApiServerClient against the real API server: the calls every part relies on."""

from __future__ import annotations

import copy
import threading

import pytest

from share_core.assignment import pod_is_finished
from share_core.contract import RESOURCE_MEM
from share_core.kube import ApiServerClient
from share_core.kube import Conflict
from share_core.kube import Forbidden
from share_core.kube import NotFound
from share_core.kube import Unavailable
from share_core.request import pod_request
from share_scheduler.nodes import pod_record
from tests.controlplane import ControlPlane
from tests.controlplane.gpucluster import EXTENDER_SA
from tests.controlplane.gpucluster import NAMESPACE as CHART_NAMESPACE
from tests.controlplane.gpucluster import install_chart_rbac

pytestmark = pytest.mark.integration

NS = "default"


def _pod(name: str, node: str = "") -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}], "schedulerName": "nobody-schedules-this"}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> ApiServerClient:
    return ApiServerClient.from_kubeconfig(str(control_plane.admin_kubeconfig), component="adapter-test", page_size=3)


def _create(client: ApiServerClient, pod: dict) -> dict:
    return client.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod)


def test_list_is_paginated_and_complete(admin: ApiServerClient) -> None:
    for i in range(8):
        _create(admin, _pod(f"page-{i}"))
    # Field selectors as the plugin and inspect use them must page correctly too.
    for selector in (None, "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"):
        listed = admin.list_pods(field_selector=selector)
        names = [p["metadata"]["name"] for p in listed.items]
        assert {f"page-{i}" for i in range(8)} <= set(names), selector
        assert len(names) == len(set(names))
        assert listed.resource_version


def test_pod_pages_read_every_pod_page_by_page(admin: ApiServerClient) -> None:
    for i in range(7):
        _create(admin, _pod(f"paged-{i}"))
    pages = admin.pod_pages(page_size=2)
    sizes, names = [], []
    for page in pages:
        sizes.append(len(page))
        names += [p["metadata"]["name"] for p in page]
    assert {f"paged-{i}" for i in range(7)} <= set(names) and len(names) == len(set(names))
    assert all(size <= 2 for size in sizes) and len(sizes) >= 4  # the server paged it
    assert pages.count == len(names) and pages.resource_version


def test_binding_carries_annotations_atomically(admin: ApiServerClient) -> None:
    pod = _create(admin, _pod("bind-ann"))
    uid = pod["metadata"]["uid"]
    admin.bind_pod(NS, "bind-ann", uid, "some-node", {"gpushare.io/gpu-index": "1", "x": "y"})
    stored = admin.get_pod(NS, "bind-ann")
    assert stored["spec"]["nodeName"] == "some-node"
    assert stored["metadata"]["annotations"] == {"gpushare.io/gpu-index": "1", "x": "y"}
    assert admin.protobuf_binding  # the server took the protobuf Binding: no fallback to JSON happened
    # The API server refuses a second Binding (409) and the UID precondition, as FakeKube mirrors.
    with pytest.raises(Conflict, match="already assigned"):
        admin.bind_pod(NS, "bind-ann", uid, "other-node", {"x": "z"})
    other = _create(admin, _pod("bind-uid"))
    with pytest.raises(Conflict):
        admin.bind_pod(NS, "bind-uid", "not-" + other["metadata"]["uid"], "some-node")
    assert "nodeName" not in admin.get_pod(NS, "bind-uid")["spec"]
    # The same refusals for the JSON Binding (the fallback for a server that takes no protobuf).
    json_client = ApiServerClient(admin._cfg, component="adapter-test", protobuf_binding=False)
    json_client.bind_pod(NS, "bind-uid", other["metadata"]["uid"], "some-node", {"gpushare.io/gpu-index": "0"})
    stored = admin.get_pod(NS, "bind-uid")
    assert stored["spec"]["nodeName"] == "some-node"
    assert stored["metadata"]["annotations"] == {"gpushare.io/gpu-index": "0"}
    with pytest.raises(Conflict, match="already assigned"):
        json_client.bind_pod(NS, "bind-uid", other["metadata"]["uid"], "other-node")
    third = _create(admin, _pod("bind-uid-json"))
    with pytest.raises(Conflict):
        json_client.bind_pod(NS, "bind-uid-json", "not-" + third["metadata"]["uid"], "some-node")
    assert admin.protobuf_binding and not json_client.protobuf_binding


def test_annotation_patch_is_conflict_safe(admin: ApiServerClient) -> None:
    pod = _create(admin, _pod("conflict"))
    rv = pod["metadata"]["resourceVersion"]
    patched = admin.patch_pod_annotations(NS, "conflict", {"gpushare.io/gpu-index": "1"}, resource_version=rv)
    assert patched["metadata"]["annotations"]["gpushare.io/gpu-index"] == "1"
    with pytest.raises(Conflict):
        admin.patch_pod_annotations(NS, "conflict", {"gpushare.io/gpu-index": "0"}, resource_version=rv)
    assert admin.get_pod(NS, "conflict")["metadata"]["annotations"]["gpushare.io/gpu-index"] == "1"
    removed = admin.patch_pod_annotations(NS, "conflict", {"gpushare.io/gpu-index": None})
    assert "gpushare.io/gpu-index" not in (removed["metadata"].get("annotations") or {})


def test_bind_creates_binding_without_deserialising_it(admin: ApiServerClient, control_plane: ControlPlane) -> None:
    control_plane.kubectl("create", "-f", "-", input='{"apiVersion":"v1","kind":"Node","metadata":{"name":"bind-n"}}')
    pod = _create(admin, _pod("bind-me"))
    admin.bind_pod(NS, "bind-me", pod["metadata"]["uid"], "bind-n")
    assert admin.get_pod(NS, "bind-me")["spec"]["nodeName"] == "bind-n"
    with pytest.raises(Conflict):
        admin.bind_pod(NS, "bind-me", pod["metadata"]["uid"], "bind-n")


def test_event_and_node_patches(admin: ApiServerClient, control_plane: ControlPlane) -> None:
    control_plane.kubectl("create", "-f", "-", input='{"apiVersion":"v1","kind":"Node","metadata":{"name":"ev-n"}}')
    node = admin.patch_node_annotations("ev-n", {"gpushare.io/gpus": "[]"})
    assert node["metadata"]["annotations"]["gpushare.io/gpus"] == "[]"
    node = admin.patch_node_capacity("ev-n", {"nvidia.com/gpu-count": "2"})
    assert node["status"]["capacity"]["nvidia.com/gpu-count"] == "2"
    pod = _create(admin, _pod("event-pod"))
    admin.create_event(pod, "GpuShareTest", "assigned GPU 1 (8 of 16 GiB) on ev-n")
    events = admin.request("GET", f"/api/v1/namespaces/{NS}/events")["items"]
    assert any(e["reason"] == "GpuShareTest" and e["involvedObject"]["name"] == "event-pod" for e in events)


def test_watch_sees_changes(admin: ApiServerClient) -> None:
    start = admin.list_pods().resource_version
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def consume() -> None:
        for ev in admin.watch_pods(start, field_selector="metadata.name=watched", timeout_seconds=10):
            seen.append((ev.type, ev.object["metadata"]["name"]))
            if ev.type == "DELETED":
                done.set()
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    _create(admin, _pod("watched"))
    admin.patch_pod_annotations(NS, "watched", {"a": "b"})
    admin.request("DELETE", f"/api/v1/namespaces/{NS}/pods/watched")
    assert done.wait(15), seen
    assert [s[0] for s in seen][:2] == ["ADDED", "MODIFIED"]


def test_slim_watch_gives_the_cache_what_the_json_watch_gives(admin: ApiServerClient) -> None:
    """The protobuf pod watch (slim pods) against the JSON one, event by event, through the real server."""
    start = admin.list_pods().resource_version
    streams: dict[bool, list[tuple[str, tuple]]] = {False: [], True: []}

    def consume(slim: bool) -> None:
        for ev in admin.watch_pods(start, field_selector="metadata.name=slim-w", timeout_seconds=10, slim=slim):
            streams[slim].append((ev.type, cache_facts(ev.object)))
            if ev.type == "DELETED":
                return

    threads = [threading.Thread(target=consume, args=(slim,), daemon=True) for slim in (False, True)]
    for t in threads:
        t.start()
    pod = _pod("slim-w")
    pod["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE_MEM: "3"}}
    pod["spec"]["initContainers"] = [{"name": "side", "image": "busybox", "restartPolicy": "Always"}]
    uid = _create(admin, pod)["metadata"]["uid"]
    admin.bind_pod(NS, "slim-w", uid, "slim-node", {"gpushare.io/gpu-index": "1", "gpushare.io/gpu-mem": "3"})
    admin.request("DELETE", f"/api/v1/namespaces/{NS}/pods/slim-w", query={"gracePeriodSeconds": "0"})
    for t in threads:
        t.join(15)
    assert [k for k, _ in streams[False]][:2] == ["ADDED", "MODIFIED"] and streams[False][-1][0] == "DELETED"
    assert streams[True] == streams[False]
    assert streams[True][1][1][0].node == "slim-node" and streams[True][0][1][2].total == 3


def cache_facts(pod: dict) -> tuple:
    """What share_scheduler's cache takes of a pod event."""
    return pod_record(pod), pod_is_finished(pod), pod_request(pod), pod["metadata"]["resourceVersion"]


def test_errors_are_typed(admin: ApiServerClient, control_plane: ControlPlane) -> None:
    with pytest.raises(NotFound):
        admin.get_pod(NS, "does-not-exist")
    nobody = ApiServerClient.from_kubeconfig(str(control_plane.kubeconfig_for("nobody")))
    with pytest.raises(Forbidden, match="cannot list resource"):
        nobody.list_pods()
    cfg = copy.copy(admin._cfg)
    cfg.host = "https://127.0.0.1:1"
    unreachable = ApiServerClient(cfg, timeout=1.0)
    with pytest.raises(Unavailable, match="unreachable"):
        unreachable.get_node("x")
    with pytest.raises(Unavailable):
        next(iter(unreachable.watch_nodes("0", timeout_seconds=1)))


def test_the_extender_runs_on_a_service_account_token(admin: ApiServerClient, control_plane: ControlPlane) -> None:
    """As installed: the chart's ServiceAccount and RBAC, a token and no client certificate (what a
    pod's in-cluster config gives it), is enough for every call the extender makes, and no more."""
    install_chart_rbac(control_plane)
    kubeconfig = control_plane.token_kubeconfig(CHART_NAMESPACE, EXTENDER_SA)
    client = ApiServerClient.from_kubeconfig(str(kubeconfig), component="adapter-test")
    assert client._headers()["Authorization"].startswith("Bearer ")
    assert not client._cfg.cert_file  # authenticated by the token alone
    review = client.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{CHART_NAMESPACE}:{EXTENDER_SA}"
    pod = _create(admin, _pod("token-bind"))
    assert any(p["metadata"]["name"] == "token-bind" for p in client.list_pods().items)
    client.list_nodes()
    events = client.watch_pods(pod["metadata"]["resourceVersion"], timeout_seconds=1, slim=True)
    client.bind_pod(NS, "token-bind", pod["metadata"]["uid"], "some-node", {"gpushare.io/gpu-index": "0"})
    bound = [e.object for e in events if e.object["metadata"]["name"] == "token-bind"]
    assert bound and bound[-1]["spec"]["nodeName"] == "some-node"
    assert admin.get_pod(NS, "token-bind")["metadata"]["annotations"] == {"gpushare.io/gpu-index": "0"}
    # pods patch is granted for the gpushare.io/holds annotation (preemption, reservations); the GPU choice
    # itself still travels in the Binding. Nodes are the device plugin's to write: no node patch.
    client.patch_pod_annotations(NS, "token-bind", {"gpushare.io/holds": None})
    with pytest.raises(Forbidden):
        client.patch_node_annotations("some-node", {"gpushare.io/gpus": "[]"})
