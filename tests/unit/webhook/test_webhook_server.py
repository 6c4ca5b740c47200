"""share_webhook.server over real TLS on loopback: the admission routes on share_core.httpserver, kept-alive
connections, health and metrics, bad bodies, a certificate swapped while serving, many connections at once
(a thread each), and a stop that does not wait on idle connections."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from share_core.contract import RESOURCE_MEM
from share_webhook import certs
from share_webhook import review
from share_webhook.server import WebhookMetrics
from share_webhook.server import WebhookServer


def admission_review(uid: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> bytes:
    pod = {
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations or {}},
        "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    request = {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE", "object": pod}
    return orjson.dumps({"apiVersion": review.API_VERSION, "kind": "AdmissionReview", "request": request})


def write_bundle(directory: Path, bundle: certs.Bundle) -> tuple[str, str, str]:
    directory.mkdir(exist_ok=True)
    for name, text in (("tls.crt", bundle.cert), ("tls.key", bundle.key), ("ca.crt", bundle.ca)):
        (directory / name).write_text(text)
    return str(directory / "tls.crt"), str(directory / "tls.key"), str(directory / "ca.crt")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[WebhookServer, ssl.SSLContext, Path]]:
    routes = {
        "/mutate": lambda raw: review.mutate(review.parse_review(raw), opted_in=False),
        "/validate": lambda raw: review.validate(review.parse_review(raw), None),
    }
    server = WebhookServer("127.0.0.1", 0, routes, WebhookMetrics())
    bundle = certs.next_bundle(None, ["localhost", "127.0.0.1"])
    assert bundle is not None
    cert, key, ca = write_bundle(tmp_path / "first", bundle)
    server.use_certificate(cert, key)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, ssl.create_default_context(cafile=ca), tmp_path
    server.shutdown()
    thread.join(15)


def connect(server: WebhookServer, context: ssl.SSLContext) -> http.client.HTTPSConnection:
    conn = http.client.HTTPSConnection("127.0.0.1", server.server_address[1], context=context, timeout=5)
    conn.connect()
    return conn


def call(conn: http.client.HTTPSConnection, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_reviews_health_and_metrics_on_one_kept_alive_connection(served) -> None:
    server, context, _ = served
    conn = connect(server, context)
    status, body = call(conn, "POST", "/mutate", admission_review("u1", {RESOURCE_MEM: "4"}))
    resp = orjson.loads(body)["response"]
    assert status == 200 and resp["uid"] == "u1" and resp["allowed"] is True
    patch = orjson.loads(base64.b64decode(resp["patch"]))
    assert patch == [{"op": "replace", "path": "/spec/schedulerName", "value": "gpushare-scheduler"}]
    status, body = call(
        conn, "POST", "/validate", admission_review("u2", {RESOURCE_MEM: "6"}, {"gpushare.io/gpu-count": "4"})
    )
    resp = orjson.loads(body)["response"]
    assert status == 200 and resp["allowed"] is False and resp["status"]["code"] == 403
    assert "must divide evenly" in resp["status"]["message"]
    assert call(conn, "GET", "/healthz") == (200, b'{"status":"ok"}')
    assert call(conn, "GET", "/readyz") == (200, b'{"status":"ready"}')
    status, metrics = call(conn, "GET", "/metrics")
    assert status == 200
    assert b'gpushare_webhook_outcomes_total{outcome="mutated",route="/mutate"} 1.0' in metrics
    assert b'gpushare_webhook_outcomes_total{outcome="refused",route="/validate"} 1.0' in metrics
    assert b'gpushare_webhook_request_seconds_count{route="/mutate"} 1.0' in metrics
    assert call(conn, "GET", "/mutate")[0] == 404, "admission is POST only"
    assert call(conn, "GET", "/nowhere")[0] == 404


def test_a_body_that_is_no_admission_review_is_a_400_and_counted(served) -> None:
    server, context, _ = served
    conn = connect(server, context)
    status, body = call(conn, "POST", "/validate", b"{not json")
    assert status == 400 and "not JSON" in orjson.loads(body)["error"]
    status, body = call(conn, "POST", "/mutate", b'{"kind": "Pod"}')
    assert status == 400 and "not an AdmissionReview" in orjson.loads(body)["error"]
    status, metrics = call(conn, "GET", "/metrics")  # the connection carries on after a 400
    assert b'gpushare_webhook_outcomes_total{outcome="bad_request",route="/validate"} 1.0' in metrics


def test_no_certificate_yet_closes_connections_and_readyz_waits_for_one() -> None:
    server = WebhookServer("127.0.0.1", 0, {}, WebhookMetrics())
    assert not server.ready
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        context = ssl._create_unverified_context()
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            connect(server, context)
    finally:
        server.shutdown()
        thread.join(15)


def test_a_renewed_certificate_serves_new_connections_and_open_ones_keep_theirs(served) -> None:
    server, context, tmp_path = served
    old = connect(server, context)
    first = old.sock.getpeercert(binary_form=True)
    renewed = certs.next_bundle(None, ["localhost", "127.0.0.1"])
    assert renewed is not None
    cert, key, ca = write_bundle(tmp_path / "renewed", renewed)
    server.use_certificate(cert, key)
    new = connect(server, ssl.create_default_context(cafile=ca))
    assert new.sock.getpeercert(binary_form=True) != first
    assert call(new, "GET", "/healthz")[0] == 200
    assert call(old, "GET", "/healthz")[0] == 200, "an open connection keeps the certificate it began with"
    with pytest.raises(ssl.SSLCertVerificationError):
        connect(server, context)  # the old CA does not sign the new certificate


def test_more_kept_alive_connections_than_a_pool_would_hold_are_all_served(served) -> None:
    """One API server kept 25 connections open through a burst of creates, several keep more, and kubelet's
    probes open new ones: each connection has a thread of its own, so an idle one never blocks another."""
    server, context, _ = served
    conns = [connect(server, context) for _ in range(60)]
    for i, conn in enumerate(conns):
        status, body = call(conn, "POST", "/mutate", admission_review(f"u{i}", {RESOURCE_MEM: "1"}))
        assert status == 200 and orjson.loads(body)["response"]["uid"] == f"u{i}"
    for conn in conns:
        conn.close()


def test_a_stalled_handshake_holds_no_other_connection(served) -> None:
    server, context, _ = served
    stalled = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)  # says nothing
    conn = connect(server, context)
    assert call(conn, "GET", "/healthz")[0] == 200
    stalled.close()


def test_shutdown_does_not_wait_on_idle_connections(tmp_path: Path) -> None:
    server = WebhookServer("127.0.0.1", 0, {}, WebhookMetrics())
    bundle = certs.next_bundle(None, ["127.0.0.1"])
    assert bundle is not None
    cert, key, ca = write_bundle(tmp_path, bundle)
    server.use_certificate(cert, key)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conn = connect(server, ssl.create_default_context(cafile=ca))
    assert call(conn, "GET", "/healthz")[0] == 200  # now idle, kept alive
    start = time.monotonic()
    server.shutdown()
    thread.join(15)
    assert not thread.is_alive() and time.monotonic() - start < 3
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=1)
