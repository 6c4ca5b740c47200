"""share_scheduler.server: kube-scheduler's verbs answered directly, everything else through the Flask
app; HTTP/1.1 keep-alive, chunked bodies, limits and malformed requests; concurrent binds."""

from __future__ import annotations

import http.client
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from share_core.contract import EXTENDER_PREFIX
from share_core.fake import FakeKube
from share_scheduler.app import create_app
from share_scheduler.server import ExtenderServer
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod


@pytest.fixture
def served():
    kube = FakeKube()
    app = create_app(kube, policy="binpack", start_sync=False)
    cache = app.extensions["gpushare"]["cache"]
    cache.replace_nodes([make_node(f"n{i}", [16, 16]) for i in range(4)])
    cache.replace_pods([])
    server = ExtenderServer(app, app.extensions["gpushare"]["verbs"], "127.0.0.1", 0, threads=8, max_body=1 << 20)
    server.start()
    yield server, kube, cache
    server.stop()


def bind_args(pod: dict, node: str) -> dict:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": node}


def post(conn: http.client.HTTPConnection, verb: str, body: object) -> tuple[int, object]:
    conn.request("POST", f"{EXTENDER_PREFIX}/{verb}", orjson.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, orjson.loads(resp.read())


def test_filter_and_bind_on_one_kept_alive_connection(served):
    server, kube, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    names = [f"n{i}" for i in range(4)]
    for i in range(6):
        pod = make_pod(f"p{i}", 6)
        kube.add_pod(pod)
        status, out = post(conn, "filter", {"Pod": pod, "NodeNames": names})
        assert status == 200 and out["Error"] == "" and len(out["NodeNames"]) == 1
        args = {
            "PodName": f"p{i}",
            "PodNamespace": "default",
            "PodUID": pod["metadata"]["uid"],
            "Node": out["NodeNames"][0],
        }
        assert post(conn, "bind", args) == (200, {"Error": ""})
    bound = sorted(p["spec"]["nodeName"] for p in kube.pods.values())
    assert bound == ["n0"] * 4 + ["n1"] * 2, "binpack: two 6 GiB pods per 16 GiB GPU, the first node first"
    # Not a scheduling verb: the Flask application answers (inspect, health, metrics).
    conn.request("GET", f"{EXTENDER_PREFIX}/inspect/n0")
    resp = conn.getresponse()
    assert resp.status == 200 and orjson.loads(resp.read())["nodes"][0]["name"] == "n0"
    conn.request("GET", "/no-such-route")
    resp = conn.getresponse()
    assert resp.status == 404 and resp.read()
    conn.request("GET", "/metrics")
    assert b"gpushare_binds_total 6.0" in conn.getresponse().read()


def test_bad_requests_get_clear_errors(served):
    server, _, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("POST", f"{EXTENDER_PREFIX}/filter", b"{not json", {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 400 and "not JSON" in orjson.loads(resp.read())["Error"]
    conn.request("POST", f"{EXTENDER_PREFIX}/bind", orjson.dumps({"PodName": "x"}))
    resp = conn.getresponse()
    assert resp.status == 400 and "PodNamespace" in orjson.loads(resp.read())["Error"]
    # Too large: refused before the body is read, and the connection closed.
    big = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    big.sendall(f"POST {EXTENDER_PREFIX}/filter HTTP/1.1\r\nHost: x\r\nContent-Length: {2 << 20}\r\n\r\n".encode())
    answer = big.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 ") and b"larger than" in answer
    # Not HTTP at all.
    junk = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    junk.sendall(b"HELLO\r\n\r\n")
    assert junk.recv(65536).startswith(b"HTTP/1.1 400 ")
    garbled = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    garbled.sendall(b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n")
    answer = garbled.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"malformed header line" in answer


def test_chunked_request_body(served):
    server, _, _ = served
    pod = make_pod("c", 4)
    body = orjson.dumps({"Pod": pod, "NodeNames": ["n1", "n2"]})
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    half = len(body) // 2
    chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:half], body[half:]))
    head = f"POST {EXTENDER_PREFIX}/filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
    head += "\r\n"
    sock.sendall(head.encode() + chunks + b"0\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in data
    assert orjson.loads(data.split(b"\r\n\r\n", 1)[1])["NodeNames"] == ["n1"]


def test_concurrent_binds_never_overcommit(served):
    """kube-scheduler binds in goroutines: many connections at once, more than there are threads."""
    server, kube, cache = served
    pods = []
    for i in range(40):
        pod = make_pod(f"b{i}", 2)
        kube.add_pod(pod)
        pods.append(pod)

    def bind(pod: dict) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        args = {
            "PodName": pod["metadata"]["name"],
            "PodNamespace": "default",
            "PodUID": pod["metadata"]["uid"],
            "Node": "n3",
        }
        return post(conn, "bind", args)[1]

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(bind, pods))
    ok = [r for r in results if r["Error"] == ""]
    assert len(ok) == 16, "two 16 GiB GPUs hold sixteen 2 GiB pods, no more"
    assert all("no longer fits" in r["Error"] for r in results if r["Error"])
    used = cache.usage()["n3"]
    assert all(v <= 16 for v in used.values()), used


def test_stop_closes_idle_connections_at_once_and_stops_listening(served):
    server, _, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/healthz")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read()
    start = time.monotonic()
    server.stop()  # the kept-alive connection above is idle: its worker must not hold the stop up
    assert time.monotonic() - start < 3
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)


def test_expect_continue_and_a_crashing_verb(served):
    server, _, _ = served
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    body = orjson.dumps({"PodName": "x", "PodNamespace": "default", "PodUID": "u", "Node": "n0"})
    head = f"POST {EXTENDER_PREFIX}/bind HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode())
    assert sock.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n", "curl waits for this before sending a body"
    sock.sendall(body)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")

    def broken(_: bytes) -> tuple[int, bytes]:
        raise RuntimeError("boom")

    server.verbs[f"{EXTENDER_PREFIX}/filter"] = broken
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    status, out = post(conn, "filter", {"Pod": {}, "NodeNames": []})
    assert status == 500 and "boom" in out["Error"]
    conn.request("GET", "/healthz")  # the connection and the server carry on
    assert conn.getresponse().status == 200


def test_stop_wakes_workers_blocked_in_accept_and_refuses_new_connections() -> None:
    """Workers wait in a blocking accept (one woken per connection); stop() must still end them all."""

    def app(environ: dict, start_response) -> list[bytes]:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such route"]

    server = ExtenderServer(app, {}, "127.0.0.1", 0, threads=8, grace=10.0)
    assert server.sock.gettimeout() is None  # a timed accept polls first: every idle worker woke per connection
    server.start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as c:  # accepted and served
        c.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert c.recv(64).startswith(b"HTTP/1.1 404 ")
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0  # not the 10 s grace: nothing was left blocked
    assert not any(w.is_alive() for w in server._workers)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)
