"""The webhook's HTTPS server: stdlib threads, a TLS context that can be swapped while serving (rotation),
and the admission handlers called straight from the request line, as the extender's lean server does.

Why not Flask/gunicorn here: an admission call is a few hundred microseconds of work; the API server waits
on it for every matching pod create, and the p99 target is 5 ms on two shared cores. Routes:
POST /mutate (pods asking gpu-mem), /mutate-all (every pod of an opted-in namespace), /validate;
GET /healthz, /readyz (a certificate is loaded), /metrics.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024  # the API server caps a request at 3 MiB of object; an AdmissionReview carries it twice
Handler = Callable[[bytes], dict[str, Any]]  # raises review.BadReview for a body it cannot answer


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpushare_webhook_request_seconds",
            "admission latency at the webhook, by route",
            ["route"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
            registry=self.registry,
        )
        self.outcomes = Counter(
            "gpushare_webhook_outcomes",
            "admission answers: mutated, refused, warned, allowed, bad_request",
            ["route", "outcome"],
            registry=self.registry,
        )


def outcome(answer: dict[str, Any]) -> str:
    resp = answer.get("response") or {}
    if not resp.get("allowed", True):
        return "refused"
    if resp.get("patch"):
        return "mutated"
    return "warned" if resp.get("warnings") else "allowed"


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, routes: dict[str, Handler], metrics: WebhookMetrics) -> None:
        self.routes = routes
        self.metrics = metrics
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        super().__init__((host, port), _RequestHandler)

    def use_certificate(self, cert_file: str, key_file: str) -> None:
        """Load a certificate for the connections accepted from now on (those open keep theirs)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert_file, key_file)
        ctx.set_alpn_protocols(["http/1.1"])
        with self._lock:
            self._context = ctx

    @property
    def ready(self) -> bool:
        return self._context is not None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        with self._lock:
            ctx = self._context
        if ctx is None:
            sock.close()
            raise OSError("no certificate loaded yet")
        sock.settimeout(10.0)  # a stalled handshake or request must not hold a thread
        # One write per answer, sent at once: with Nagle on, a small answer waits out the client's delayed ACK
        # (40 ms on Linux) whenever the previous write is still unacknowledged.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: WebhookServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        # headers and body in one TLS record and one segment (end_headers would flush the headers alone)
        self._headers_buffer.append(b"\r\n" + body)
        self.wfile.write(b"".join(self._headers_buffer))
        self._headers_buffer = []

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b'{"status":"ok"}')
        elif self.path == "/readyz":
            ok = self.server.ready
            self._send(200 if ok else 503, b'{"status":"ready"}' if ok else b'{"status":"no certificate yet"}')
        elif self.path == "/metrics":
            self._send(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        else:
            self._send(404, b'{"error":"not found"}')

    def do_POST(self) -> None:
        from share_webhook.review import BadReview

        start = time.perf_counter()
        route = self.path.split("?", 1)[0]
        handler = self.server.routes.get(route)
        if handler is None:
            self._send(404, b'{"error":"not found"}')
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self.server.metrics.outcomes.labels(route, "bad_request").inc()
            self._send(HTTPStatus.BAD_REQUEST, orjson.dumps({"error": f"Content-Length must be 1..{MAX_BODY}"}))
            return
        raw = self.rfile.read(length)
        try:
            answer = handler(raw)
        except BadReview as exc:
            self.server.metrics.outcomes.labels(route, "bad_request").inc()
            log.warning("bad AdmissionReview on %s: %s", route, exc)
            self._send(HTTPStatus.BAD_REQUEST, orjson.dumps({"error": str(exc)}))
            return
        self._send(200, orjson.dumps(answer))
        self.server.metrics.outcomes.labels(route, outcome(answer)).inc()
        self.server.metrics.latency.labels(route).observe(time.perf_counter() - start)
