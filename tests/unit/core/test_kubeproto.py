"""share_core.kubeproto against messages protoc compiles from the upstream .proto files (k8s.io/api and
k8s.io/apimachinery in the Go module cache, put there by hack/build-k8s.sh, which `make test` runs
first): our Binding read back, every field where the API server's decoder looks for it; full pods
written by the upstream messages into protobuf watch frames, read back as slim pods that give the
cache the same facts as the JSON form. And the client against loopback servers: its fallback to JSON
when a server answers 415 to a protobuf Binding, and the protobuf watch stream cut at any byte."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from grpc_tools import protoc
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kubernetes import client

from share_core import kubeproto
from share_core.assignment import Assignment
from share_core.assignment import pod_is_finished
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.kube import ApiServerClient
from share_core.kube import Conflict
from share_core.kube import Gone
from share_core.kube import binding_json
from share_core.podresources import pod_host_request
from share_core.request import InvalidRequest
from share_core.request import pod_request
from share_scheduler.nodes import pod_record
from share_scheduler.waiting import found_unschedulable
from share_scheduler.waiting import waiting_pod
from tests.unit.core.streamserver import StreamServer
from tests.unit.core.streamserver import serving
from tests.unit.core.streamserver import watcher
from tests.unit.core.test_httpconn import Server

ROOT = Path(__file__).resolve().parents[3]
PROTOS = (
    "k8s.io/api/core/v1/generated.proto",
    "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
    "k8s.io/apimachinery/pkg/runtime/generated.proto",
)


def module_cache() -> Path:
    """GOMODCACHE as Go resolves it: the variable, else `go env`, else ~/go/pkg/mod."""
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    for go in ("go", "/usr/local/go/bin/go"):
        try:
            out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            continue
        if out:
            return Path(out)
    return Path.home() / "go" / "pkg" / "mod"


@pytest.fixture(scope="module")
def messages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, type]:
    """Unknown, Binding (core/v1) compiled by protoc from the release hack/build-k8s.sh builds."""
    release = subprocess.run(
        [str(ROOT / "hack" / "build-k8s.sh"), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()  # v1.37.2: its staging modules are k8s.io/api@v0.37.2 and k8s.io/apimachinery@v0.37.2
    staging = "v0." + release.removeprefix("v1.")
    cache = module_cache() / "k8s.io"
    tree = tmp_path_factory.mktemp("protos")
    (tree / "k8s.io").mkdir()
    for module in ("api", "apimachinery"):
        source = cache / f"{module}@{staging}"
        if not (source / "go.mod").is_file():
            pytest.fail(
                f"k8s.io/{module}@{staging} is not in the Go module cache ({source}): run hack/build-k8s.sh "
                "(make test does) to fetch the upstream .proto files this test compiles"
            )
        (tree / "k8s.io" / module).symlink_to(source)
    out = tree / "set.pb"
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(
        ["protoc", f"-I{tree}", f"-I{include}", "--include_imports", f"--descriptor_set_out={out}", *PROTOS]
    )
    assert rc == 0, "protoc could not compile the upstream generated.proto files"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    names = {
        "Unknown": "k8s.io.apimachinery.pkg.runtime.Unknown",
        "Binding": "k8s.io.api.core.v1.Binding",
        "Pod": "k8s.io.api.core.v1.Pod",
        "WatchEvent": "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent",
        "Status": "k8s.io.apimachinery.pkg.apis.meta.v1.Status",
    }
    return {k: message_factory.GetMessageClass(pool.FindMessageTypeByName(v)) for k, v in names.items()}


def decode(messages: dict[str, type], body: bytes) -> tuple[object, object]:
    assert body[:4] == b"k8s\x00", "the protobuf serializer's magic prefix"
    unknown = messages["Unknown"].FromString(body[4:])
    return unknown, messages["Binding"].FromString(unknown.raw)


def test_every_field_of_a_binding(messages):
    ann = {"gpushare.io/gpu-index": "1", "gpushare.io/gpu-mem": "8192", "a": "", "é-ключ": "värde ✓"}
    body = kubeproto.binding_body("team-a", "train-7", "0b5c2a1e-uid", "gpu-node-12", ann)
    unknown, binding = decode(messages, body)
    assert (unknown.typeMeta.apiVersion, unknown.typeMeta.kind) == ("v1", "Binding")
    assert unknown.contentEncoding == "" and unknown.contentType == ""  # raw is protobuf, unencoded
    meta = binding.metadata
    assert (meta.name, meta.namespace, meta.uid) == ("train-7", "team-a", "0b5c2a1e-uid")
    assert dict(meta.annotations) == ann
    assert not meta.labels and not meta.generateName and not meta.resourceVersion
    target = binding.target
    assert (target.apiVersion, target.kind, target.name) == ("v1", "Node", "gpu-node-12")
    assert not target.namespace and not target.uid and not target.fieldPath
    # Nothing we did not mean to send: re-encoding the decoded message gives our bytes back.
    assert binding.SerializeToString(deterministic=True) == unknown.raw
    assert unknown.SerializeToString(deterministic=True) == body[4:]


def test_no_uid_and_no_annotations_leave_the_fields_out(messages):
    _, binding = decode(messages, kubeproto.binding_body("default", "p", "", "n"))
    assert not binding.metadata.HasField("uid") and not binding.metadata.annotations
    assert binding.metadata.name == "p" and binding.target.name == "n"


@settings(max_examples=150, deadline=None)
@given(
    name=st.text(min_size=1, max_size=300),
    uid=st.text(max_size=40),
    node=st.text(min_size=1, max_size=200),
    ann=st.dictionaries(st.text(min_size=1, max_size=70), st.text(max_size=3000), max_size=8),
)
def test_any_strings_and_lengths_round_trip(messages, name, uid, node, ann):
    """Multi-byte varint lengths (values over 127 and 16,383 bytes) and any Unicode text."""
    unknown, binding = decode(messages, kubeproto.binding_body("ns", name, uid, node, ann))
    assert unknown.typeMeta.kind == "Binding"
    assert (binding.metadata.name, binding.metadata.uid, binding.target.name) == (name, uid, node)
    assert dict(binding.metadata.annotations) == ann


def test_varint_boundaries():
    assert [kubeproto.varint(n) for n in (0, 1, 127, 128, 300, 16383, 16384)] == [
        b"\x00",
        b"\x01",
        b"\x7f",
        b"\x80\x01",
        b"\xac\x02",
        b"\xff\x7f",
        b"\x80\x80\x01",
    ]


# -- the client: protobuf first, JSON when the server refuses it -------------------------------------


class BindServer:
    """Answers POST .../binding: 415 to protobuf when `refuse_protobuf`, else 201 (or 409 for uid "taken")."""

    def __init__(self, refuse_protobuf: bool) -> None:
        self.refuse_protobuf = refuse_protobuf
        self.requests: list[tuple[str, str, bytes]] = []  # (path, content type, body)
        self.http = Server(self._answer)

    def _answer(self, conn: socket.socket, request: bytes) -> bool:
        head, _, body = request.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        ctype = headers.get("content-type", "")
        self.requests.append((lines[0].split()[1], ctype, body))
        if ctype == kubeproto.CONTENT_TYPE and self.refuse_protobuf:
            status, answer = 415, {"kind": "Status", "reason": "UnsupportedMediaType", "code": 415}
        elif b"taken" in body:
            status, answer = 409, {"kind": "Status", "reason": "Conflict", "message": "uid", "code": 409}
        else:
            status, answer = 201, {"kind": "Status", "status": "Success", "code": 201}
        out = json.dumps(answer).encode()
        conn.sendall(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(out), out)
        )
        return True

    def client(self) -> ApiServerClient:
        cfg = client.Configuration()
        cfg.host = self.http.url()
        return ApiServerClient(cfg)

    def close(self) -> None:
        self.http.sock.close()


@pytest.fixture(params=[False, True], ids=["accepts-protobuf", "refuses-protobuf"])
def server(request) -> Iterator[BindServer]:
    s = BindServer(refuse_protobuf=request.param)
    yield s
    s.close()


def test_binds_in_protobuf_and_falls_back_to_json_once_refused(server):
    kube = server.client()
    ann = {"gpushare.io/gpu-index": "2"}
    kube.bind_pod("ns", "p1", "u1", "n1", ann)
    kube.bind_pod("ns", "p2", "u2", "n2")
    path = "/api/v1/namespaces/ns/pods/{}/binding"
    if not server.refuse_protobuf:
        assert server.requests == [
            (path.format("p1"), kubeproto.CONTENT_TYPE, kubeproto.binding_body("ns", "p1", "u1", "n1", ann)),
            (path.format("p2"), kubeproto.CONTENT_TYPE, kubeproto.binding_body("ns", "p2", "u2", "n2")),
        ]
        assert kube.protobuf_binding
        return
    # Refused once: that bind is resent in JSON, and every later one goes in JSON straight away.
    assert [(p, c) for p, c, _ in server.requests] == [
        (path.format("p1"), kubeproto.CONTENT_TYPE),
        (path.format("p1"), "application/json"),
        (path.format("p2"), "application/json"),
    ]
    assert orjson.loads(server.requests[1][2]) == binding_json("ns", "p1", "u1", "n1", ann)
    assert orjson.loads(server.requests[2][2])["metadata"] == {"name": "p2", "namespace": "ns", "uid": "u2"}
    assert not kube.protobuf_binding


def test_other_refusals_are_not_retried_in_json(server):
    kube = server.client()
    if server.refuse_protobuf:
        kube.bind_pod("ns", "warm", "u", "n")  # learns JSON first
    before = len(server.requests)
    with pytest.raises(Conflict):
        kube.bind_pod("ns", "p", "taken", "n")
    assert len(server.requests) == before + 1  # a 409 is the answer, whatever the encoding


# -- the pod watch in protobuf: slim pods ---------------------------------------------------------------


def json_pod(i: int, node: str = "", phase: str = "Pending", init: bool = False) -> dict:
    """A pod in the API's JSON form, with much more than the cache reads (all of it must be skipped)."""
    containers = [
        {
            "name": "main",
            "image": "registry.example/train:1",
            "env": [{"name": "A", "value": "x" * 300}],
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "resources": {
                "limits": {"cpu": "2", "memory": "4Gi", RESOURCE_MEM: str(1 + i % 8)},
                "requests": {"cpu": "500m", "memory": "4Gi", RESOURCE_MEM: str(1 + i % 8)},
            },
        },
        {"name": "side", "image": "busybox", "resources": {}},
    ]
    spec: dict = {"containers": containers, "schedulerName": "gpushare-scheduler", "priority": 7}
    spec["tolerations"] = [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
    if init:
        spec["initContainers"] = [
            {
                "name": "fetch",
                "image": "x",
                "resources": {"limits": {RESOURCE_MEM: "3"}, "requests": {RESOURCE_MEM: "3"}},
            },
            {"name": "proxy", "image": "x", "restartPolicy": "Always", "resources": {"limits": {RESOURCE_MEM: "1"}}},
        ]
    if node:
        spec["nodeName"] = node
    meta: dict = {
        "name": f"pod-{i}",
        "namespace": "team-ä",
        "uid": f"uid-{i:04d}",
        "resourceVersion": str(1000 + i),
        "generateName": "pod-",
        "labels": {"app": "train", "ünïcode": "ok"},
        "finalizers": ["example.com/keep"],
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}],
    }
    if node:
        meta["annotations"] = Assignment(
            (i % 8,), (f"GPU-{node}-{i % 8}",), 1 + i % 8, 1795431670913379925 + i
        ).to_annotations()
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "qosClass": "Burstable"}}


def upstream_pod(messages: dict[str, type], pod: dict) -> bytes:
    """The pod as the API server writes it: the upstream Pod message (plus managedFields and a
    creationTimestamp, which JSON dicts above leave out), serialized by the protobuf runtime."""
    msg = messages["Pod"]()
    meta, spec = pod["metadata"], pod["spec"]
    m = msg.metadata
    for key in ("name", "namespace", "uid", "resourceVersion", "generateName"):
        setattr(m, key, meta[key])
    m.labels.update(meta["labels"])
    m.annotations.update(meta.get("annotations", {}))
    m.finalizers.extend(meta["finalizers"])
    ref = m.ownerReferences.add()
    ref.apiVersion, ref.kind, ref.name, ref.uid, ref.controller = "batch/v1", "Job", "j", "u", True
    m.creationTimestamp.seconds = 1795431670
    mf = m.managedFields.add()
    mf.manager, mf.operation, mf.fieldsType = "kube-controller-manager", "Update", "FieldsV1"
    mf.fieldsV1.Raw = b'{"f:spec":{"f:containers":{}}}' * 20
    for key, target in (("containers", msg.spec.containers), ("initContainers", msg.spec.initContainers)):
        for c in spec.get(key, []):
            mc = target.add()
            mc.name, mc.image = c["name"], c["image"]
            if "restartPolicy" in c:
                mc.restartPolicy = c["restartPolicy"]
            for env in c.get("env", []):
                e = mc.env.add()
                e.name, e.value = env["name"], env["value"]
            for port in c.get("ports", []):
                mc.ports.add(containerPort=port["containerPort"], protocol=port["protocol"])
            for kind in ("limits", "requests"):
                for name, value in c["resources"].get(kind, {}).items():
                    getattr(mc.resources, kind)[name].string = value
    msg.spec.schedulerName = spec["schedulerName"]
    msg.spec.priority = spec["priority"]
    msg.spec.tolerations.add(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=300)
    if "nodeName" in spec:
        msg.spec.nodeName = spec["nodeName"]
    msg.status.phase = pod["status"]["phase"]
    msg.status.qosClass = "Burstable"
    msg.status.conditions.add(type="PodScheduled", status="True")
    return msg.SerializeToString()


def frame(messages: dict[str, type], kind: str, raw: bytes, object_kind: str = "Pod") -> bytes:
    """One frame of a `;stream=watch` protobuf stream: length, WatchEvent{type, object.raw: envelope}."""
    unknown = messages["Unknown"]()
    unknown.typeMeta.apiVersion, unknown.typeMeta.kind = "v1", object_kind
    unknown.raw, unknown.contentEncoding, unknown.contentType = raw, "", ""
    event = messages["WatchEvent"]()
    event.type = kind
    event.object.raw = kubeproto.MAGIC + unknown.SerializeToString()
    data = event.SerializeToString()
    return len(data).to_bytes(4, "big") + data


def facts(pod: dict) -> tuple:
    """What the extender's cache takes of a pod (share_scheduler/cache.py)."""
    try:
        request = pod_request(pod)
    except InvalidRequest as exc:
        request = str(exc)
    return pod_record(pod), pod_is_finished(pod), request, pod.get("metadata", {}).get("resourceVersion")


def invalid_pod() -> dict:
    """Asks our resource in requests only: pod_request refuses it, with the same words either way."""
    pod = json_pod(6)
    pod["spec"]["containers"][1]["resources"] = {"requests": {RESOURCE_MEM: "2"}}
    return pod


CASES = [
    json_pod(1),
    json_pod(2, node="node-7"),
    json_pod(3, node="node-7", phase="Succeeded"),
    json_pod(4, node="node-9", init=True),
    json_pod(5, init=True),
    invalid_pod(),
]


@pytest.mark.parametrize("pod", CASES, ids=["pending", "bound", "finished", "bound-init", "pending-init", "invalid"])
def test_slim_pod_gives_the_cache_the_same_facts(messages, pod):
    data = frame(messages, "MODIFIED", upstream_pod(messages, pod))
    frames, rest = kubeproto.split_frames(data)
    assert rest == b"" and len(frames) == 1
    kind, slim = kubeproto.decode_watch_event(frames[0])
    assert kind == "MODIFIED"
    assert facts(slim) == facts(pod)
    meta = pod["metadata"]
    keys = ("name", "namespace", "uid", "resourceVersion", "annotations", "labels")  # labels: which PDBs select it
    owner = [{"kind": "Job", "name": "j", "uid": "u", "controller": True}]  # as upstream_pod writes it
    created = "2026-11-23T11:01:10Z"  # upstream_pod's creationTimestamp (how long a pending pod has waited)
    want = {**{k: meta[k] for k in keys if k in meta}, "creationTimestamp": created, "ownerReferences": owner}
    assert slim["metadata"] == want
    spec = slim["spec"]
    assert spec.get("priority") == pod["spec"]["priority"] and "preemptionPolicy" not in spec
    assert spec.get("nodeName") == pod["spec"].get("nodeName", "")
    assert spec["containers"][0]["resources"] == pod["spec"]["containers"][0]["resources"]
    assert [c["name"] for c in spec["initContainers"]] == [c["name"] for c in pod["spec"].get("initContainers", [])]


def test_containers_are_decoded_only_when_read(messages):
    _, slim = kubeproto.decode_watch_event(frame(messages, "ADDED", upstream_pod(messages, CASES[4]))[4:])
    spec = slim["spec"]
    pod_record(slim)  # what a pending pod's event costs: name, uid, node, phase, annotations
    assert spec._message is not None  # nothing else decoded yet
    assert dict.get(spec, "containers") is None
    assert pod_request(slim) == pod_request(CASES[4])
    assert spec._message is None and len(dict.get(spec, "containers")) == 2
    # A bound pod's CPU and memory count on its node (share_core.podresources): its containers are read.
    _, slim = kubeproto.decode_watch_event(frame(messages, "ADDED", upstream_pod(messages, CASES[3]))[4:])
    spec = slim["spec"]
    assert pod_record(slim) == pod_record(CASES[3]) and spec._message is None
    assert len(dict.get(spec, "containers")) == 2
    # Every other way in sees the whole spec, and a copy is a plain dict.
    _, other = kubeproto.decode_watch_event(frame(messages, "ADDED", upstream_pod(messages, CASES[3]))[4:])
    assert dict(other["spec"].items())["initContainers"][1]["restartPolicy"] == "Always"
    assert copy.deepcopy(other["spec"]) == spec and type(copy.copy(other["spec"])) is dict
    assert orjson.loads(orjson.dumps(copy.copy(other["spec"])))["containers"][0]["name"] == "main"


def test_error_event_is_a_status_and_garbage_is_refused(messages):
    status = messages["Status"](code=410, reason="Expired", message="too old resource version: 1 (42)")
    kind, obj = kubeproto.decode_watch_event(frame(messages, "ERROR", status.SerializeToString(), "Status")[4:])
    assert (kind, obj) == ("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": status.message})
    with pytest.raises(ValueError):
        kubeproto.decode_watch_event(b"\x0a\x05ADDED\x12\x04\x0a\x02{}")  # object not in the envelope
    with pytest.raises(ValueError):
        kubeproto.decode_watch_event(b"\xff\xff\xff")


@pytest.fixture
def frame_server() -> Iterator[StreamServer]:
    with serving(kubeproto.WATCH_CONTENT_TYPE.split(";")[0]) as server:
        yield server


@pytest.mark.parametrize("cut", [1, 5, 64, 1000, 1 << 20])
def test_protobuf_stream_whatever_the_reads(messages, frame_server, cut):
    pods = [json_pod(i, node="n" if i % 2 else "", init=i % 3 == 0) for i in range(40)]
    kinds = ["ADDED" if i % 3 else "MODIFIED" for i in range(40)]
    stream = b"".join(frame(messages, k, upstream_pod(messages, p)) for k, p in zip(kinds, pods, strict=True))
    gone = messages["Status"](code=410, reason="Expired", message="too old").SerializeToString()
    stream += frame(messages, "ERROR", gone, "Status")
    frame_server.pieces = [stream[i : i + cut] for i in range(0, len(stream), cut)]
    seen = []
    with pytest.raises(Gone, match="too old"):
        for ev in watcher(frame_server).watch_pods("1", timeout_seconds=5, slim=True):
            seen.append((ev.type, facts(ev.object)))
    assert seen == [(k, facts(p)) for k, p in zip(kinds, pods, strict=True)]
    assert frame_server.accepts == [kubeproto.WATCH_CONTENT_TYPE]


def test_a_server_answering_json_is_read_as_json(frame_server):
    frame_server.content_type = "application/json"
    pod = json_pod(1, node="n")
    frame_server.pieces = [orjson.dumps({"type": "ADDED", "object": pod}) + b"\n"]
    events = list(watcher(frame_server).watch_pods("1", timeout_seconds=5, slim=True))
    assert [(e.type, e.object) for e in events] == [("ADDED", pod)]


def test_slim_pod_carries_what_kube_scheduler_counts(messages):
    """Overhead, pod-level requests and in-place resize status survive the slim decoding, so the cache
    counts a watched pod's CPU and memory as it counts the listed JSON one (PodRequests' inputs)."""
    pod = json_pod(6, node="node-9")
    pod["spec"]["containers"][0]["resources"]["requests"].update({"cpu": "2", "memory": "1Gi"})
    pod["spec"]["overhead"] = {"cpu": "250m", "memory": "64Mi"}
    pod["spec"]["resources"] = {"requests": {"memory": "3Gi"}}
    pod["status"]["conditions"] = [{"type": "PodResizePending", "reason": "Deferred"}]
    pod["status"]["containerStatuses"] = [
        {"name": "main", "allocatedResources": {"cpu": "3"}, "resources": {"requests": {"cpu": "4"}}}
    ]
    msg = messages["Pod"].FromString(upstream_pod(messages, pod))
    for name, value in pod["spec"]["overhead"].items():
        msg.spec.overhead[name].string = value
    msg.spec.resources.requests["memory"].string = "3Gi"
    del msg.status.conditions[:]
    msg.status.conditions.add(type="PodResizePending", status="True", reason="Deferred")
    cs = msg.status.containerStatuses.add(name="main")
    cs.allocatedResources["cpu"].string = "3"
    cs.resources.requests["cpu"].string = "4"
    _, slim = kubeproto.decode_watch_event(frame(messages, "MODIFIED", msg.SerializeToString())[4:])
    want = pod_host_request(pod)
    assert want == (4250, 3 * 2**30 + 64 * 2**20, "")
    assert pod_host_request(slim) == want
    assert pod_record(slim) == pod_record(pod)


def test_slim_pod_keeps_what_preemption_reads(messages):
    """A terminating pod's deletionTimestamp and its preemptionPolicy survive the trimmed schema."""
    pod = json_pod(8, node="node-7")
    msg = messages["Pod"].FromString(upstream_pod(messages, pod))
    msg.metadata.deletionTimestamp.seconds = 1795431700
    msg.spec.preemptionPolicy = "Never"
    _kind, slim = kubeproto.decode_watch_event(frame(messages, "MODIFIED", msg.SerializeToString())[4:])
    assert slim["metadata"]["deletionTimestamp"] == "2026-11-23T11:01:40Z"
    assert slim["spec"]["preemptionPolicy"] == "Never"
    assert "schedulingGates" not in slim["spec"]
    record = pod_record(slim)
    assert (record.priority, record.owner_uid, record.terminating) == (7, "u", True)


def test_slim_pod_keeps_labels_and_start_time_for_preemption(messages):
    """Which PDBs select a bound pod (its labels) and its start time (preemption's last tie-break)."""
    msg = messages["Pod"].FromString(upstream_pod(messages, CASES[1]))
    msg.status.startTime.seconds = 1795431700
    _, slim = kubeproto.decode_watch_event(frame(messages, "MODIFIED", msg.SerializeToString())[4:])
    record = pod_record(slim)
    assert dict(record.labels) == {"app": "train", "ünïcode": "ok"}
    assert record.started == 1795431700.0
    assert pod_record(CASES[1]).started == 0.0  # the JSON case has no start time


def test_slim_pod_keeps_its_scheduling_gates(messages):
    """A gated pod is not waiting for room: the reservations loop must see its gates."""
    pod = json_pod(9)
    msg = messages["Pod"].FromString(upstream_pod(messages, pod))
    msg.spec.schedulingGates.add(name="example.com/quota")
    _kind, slim = kubeproto.decode_watch_event(frame(messages, "ADDED", msg.SerializeToString())[4:])
    assert slim["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    assert slim["metadata"]["creationTimestamp"] == "2026-11-23T11:01:10Z"


def test_slim_pod_says_what_kube_scheduler_found_for_a_waiting_pod(messages):
    """A pod kube-scheduler found no room for (PodScheduled False, reason Unschedulable) waits in the sense
    room for what waits follows (share_scheduler.leaveroom); the condition's status must survive the trimmed
    schema, or no watched pod would ever count as unschedulable (the JSON list and the watch must agree)."""
    pod = json_pod(1)  # 2 units: one on each of its 2 GPUs
    pod["metadata"]["annotations"] = {ANN_GPU_COUNT: "2"}
    msg = messages["Pod"].FromString(upstream_pod(messages, pod))
    msg.metadata.annotations[ANN_GPU_COUNT] = "2"
    pod["metadata"]["creationTimestamp"] = "2026-11-23T11:01:10Z"  # upstream_pod's
    for status, reason in (("False", "Unschedulable"), ("False", "SchedulerError"), ("True", "")):
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": status, "reason": reason}]
        del msg.status.conditions[:]
        msg.status.conditions.add(type="PodScheduled", status=status, reason=reason)
        _, slim = kubeproto.decode_watch_event(frame(messages, "MODIFIED", msg.SerializeToString())[4:])
        assert found_unschedulable(slim) is found_unschedulable(pod) is (reason == "Unschedulable")
        watched, listed = waiting_pod(slim), waiting_pod(pod)
        assert watched is not None and watched == listed and watched.demand.count == 2
