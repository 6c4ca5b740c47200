"""share_core.kubeproto's Binding, read back with messages protoc compiles from the upstream .proto files
(k8s.io/api and k8s.io/apimachinery in the Go module cache, put there by hack/build-k8s.sh, which
`make test` runs first): every field where the API server's decoder looks for it. And the client's
fallback to JSON when a server answers 415 to protobuf, against a loopback server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from share_core import kubeproto
from share_core.kube import ApiServerClient, Conflict, binding_json

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
    names = {"Unknown": "k8s.io.apimachinery.pkg.runtime.Unknown", "Binding": "k8s.io.api.core.v1.Binding"}
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
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(rest) < length:
                    rest += conn.recv(65536)
                body, data = rest[:length], rest[length:]
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
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, len(out), out)
                )

    def client(self) -> ApiServerClient:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{self.port}"
        return ApiServerClient(cfg)

    def close(self) -> None:
        self.sock.close()


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
