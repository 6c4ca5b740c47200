"""The webhook's HTTPS server: the admission handlers on share_core.httpserver, the lean server the extender
serves kube-scheduler through too, with a TLS context that can be swapped while serving (rotation).

Why not Flask/gunicorn or http.server: an admission call is 0.1 ms of work, the API server waits on it
for every matching pod create, and on two shared cores the webhook's CPU is CPU kube-scheduler and the
API server do not get. http.server's request handler (the email parser for the headers, a Date header,
its own logging) cost about as much CPU per review as the review itself (docs/operations.md, "Speed").
Each connection gets a thread of its own (one API server kept 25 open through a burst of creates;
kubelet's probes open new ones). Routes: POST /mutate (pods asking gpu-mem), /mutate-all (every pod of an
opted-in namespace), /validate; GET /healthz, /readyz (a certificate is loaded), /metrics.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Histogram
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from share_core.httpserver import Answer
from share_core.httpserver import HttpServer
from share_core.httpserver import Request
from share_core.httpserver import Route
from share_webhook.review import BadReview

log = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024  # the API server caps a request at 3 MiB of object; an AdmissionReview carries it twice
READ_TIMEOUT = 10.0  # seconds for a handshake or a request once started: a stalled client must not hold a thread
Handler = Callable[[bytes], dict[str, Any]]  # raises review.BadReview for a body it cannot answer
OUTCOMES = ("mutated", "refused", "warned", "allowed", "bad_request")
JSON = [("Content-Type", "application/json")]


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


class WebhookServer:
    def __init__(self, host: str, port: int, routes: dict[str, Handler], metrics: WebhookMetrics) -> None:
        self.metrics = metrics
        self.http = HttpServer(
            {path: self._route(path, handler) for path, handler in routes.items()},
            host,
            port,
            fallback=self._get,
            per_connection=True,
            max_body=MAX_BODY,
            read_timeout=READ_TIMEOUT,
            https=True,
        )
        self.server_address = (self.http.host, self.http.port)
        self._done = threading.Event()

    def _route(self, path: str, handler: Handler) -> Route:
        """The handler with its metrics, their label children looked up once (not per review)."""
        latency = self.metrics.latency.labels(path)
        counts = {name: self.metrics.outcomes.labels(path, name) for name in OUTCOMES}

        def serve(raw: bytes) -> tuple[int, bytes]:
            start = time.perf_counter()
            try:
                answer = handler(raw)
            except BadReview as exc:
                counts["bad_request"].inc()
                log.warning("bad AdmissionReview on %s: %s", path, exc)
                return 400, orjson.dumps({"error": str(exc)})
            payload = orjson.dumps(answer)
            counts[outcome(answer)].inc()
            latency.observe(time.perf_counter() - start)
            return 200, payload

        return serve

    def _get(self, req: Request) -> Answer:
        if req.method == "GET" and req.path == "/healthz":
            return "200 OK", JSON, b'{"status":"ok"}'
        if req.method == "GET" and req.path == "/readyz":
            if self.ready:
                return "200 OK", JSON, b'{"status":"ready"}'
            return "503 Service Unavailable", JSON, b'{"status":"no certificate yet"}'
        if req.method == "GET" and req.path == "/metrics":
            return "200 OK", [("Content-Type", CONTENT_TYPE_LATEST)], generate_latest(self.metrics.registry)
        return "404 Not Found", JSON, b'{"error":"not found"}'

    def use_certificate(self, cert_file: str, key_file: str) -> None:
        """Load a certificate for the connections accepted from now on (those open keep theirs)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert_file, key_file)
        ctx.set_alpn_protocols(["http/1.1"])
        self.http.use_tls(ctx)

    @property
    def ready(self) -> bool:
        return self.http.tls_ready

    def serve_forever(self) -> None:
        """Serve until shutdown() (the caller handles signals)."""
        self.http.start()
        self._done.wait()
        self.http.stop()

    def shutdown(self) -> None:
        self._done.set()

    def server_close(self) -> None:
        """Nothing left to close: serve_forever stopped the server (kept for the http.server callers)."""
