"""Admission latency at share-webhook: N AdmissionReviews of gpu-mem pods over HTTPS, as the API server sends them.

Starts the webhook's own server (share_webhook.server, the routes of share_webhook.cli) on loopback with a
certificate from share_webhook.certs, then POSTs N reviews to /mutate and N to /validate over one kept-alive
TLS connection each (the API server keeps its connections too), and prints per route the latency the client
saw (request written to answer read) and the time the server spent in the handler, p50/p99/max in ms, and
the server's CPU per review (the process's CPU time less the client's thread: TLS, HTTP and the handler).
A cluster of 100 gpushare nodes backs the validation's warnings.

    python bench/bench_webhook.py --pods 1000
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from share_core.admission import ClusterGpus
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.gpus import GpuInfo
from share_webhook import certs
from share_webhook import review
from share_webhook.server import WebhookMetrics
from share_webhook.server import WebhookServer


def pod_review(i: int) -> bytes:
    """A realistic pod: two containers, probes, env, volumes; every tenth asks two GPUs."""
    containers = [
        {
            "name": "app",
            "image": "registry.example.com/inference:1.2.3",
            "args": ["--model", "/models/m", "--port", "8080"],
            "env": [{"name": f"E{j}", "value": "x" * 20} for j in range(10)],
            "resources": {"limits": {RESOURCE_MEM: str(4 + i % 8), "cpu": "2", "memory": "8Gi"}},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
            "volumeMounts": [{"name": "models", "mountPath": "/models"}],
        },
        {"name": "sidecar", "image": "registry.example.com/log:1", "resources": {"limits": {"cpu": "100m"}}},
    ]
    annotations = {ANN_GPU_COUNT: "2"} if i % 10 == 0 else {}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"infer-{i}", "namespace": "ml", "annotations": annotations, "labels": {"app": "x"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": containers,
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
        },
    }
    body = {
        "apiVersion": review.API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": f"uid-{i}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
        },
    }
    return orjson.dumps(body)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=1000)
    a = p.parse_args()
    cluster = ClusterGpus.of(
        [[GpuInfo(g, f"GPU-{n}-{g}", "NVIDIA A100-SXM4-80GB", 80) for g in range(8)] for n in range(100)]
    )
    handled: dict[str, list[float]] = {"/mutate": [], "/validate": []}

    def timed(route: str, fn):
        def run(raw: bytes) -> dict:
            t0 = time.perf_counter()
            try:
                return fn(raw)
            finally:
                handled[route].append((time.perf_counter() - t0) * 1000)

        return run

    routes = {
        "/mutate": timed("/mutate", lambda raw: review.mutate(review.parse_review(raw), opted_in=False)),
        "/validate": timed("/validate", lambda raw: review.validate(review.parse_review(raw), cluster)),
    }
    metrics = WebhookMetrics()
    server = WebhookServer("127.0.0.1", 0, routes, metrics)
    bundle = certs.next_bundle(None, ["localhost", "127.0.0.1"])
    assert bundle is not None
    work = Path(tempfile.mkdtemp(prefix="bench-webhook-"))
    (work / "tls.crt").write_text(bundle.cert)
    (work / "tls.key").write_text(bundle.key)
    (work / "ca.crt").write_text(bundle.ca)
    server.use_certificate(str(work / "tls.crt"), str(work / "tls.key"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    ctx = ssl.create_default_context(cafile=str(work / "ca.crt"))
    bodies = [pod_review(i) for i in range(a.pods)]
    results = {}
    cpu: dict[str, float] = {}
    for route in routes:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go's net/http client does
        for body in bodies[:20]:  # warm-up: handshake, imports, first allocations
            conn.request("POST", route, body, {"Content-Type": "application/json"})
            conn.getresponse().read()
        seen: list[float] = []
        process, client = time.process_time(), time.thread_time()
        for body in bodies:
            t0 = time.perf_counter()
            conn.request("POST", route, body, {"Content-Type": "application/json"})
            answer = conn.getresponse().read()
            seen.append((time.perf_counter() - t0) * 1000)
            assert json.loads(answer)["response"]["allowed"] is True
        cpu[route] = ((time.process_time() - process) - (time.thread_time() - client)) * 1000 / len(bodies)
        conn.close()
        results[route] = seen
    server.shutdown()
    print(f"share-webhook admission latency, {a.pods} pods per route, loopback HTTPS, one kept-alive connection")
    print(f"{'route':<10} {'measured':<22} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'mean ms':>8}")
    for route, seen in results.items():
        at_server = handled[route][-len(seen) :]
        for what, values in (("client round trip", seen), ("in the handler", at_server)):
            print(
                f"{route:<10} {what:<22} {percentile(values, 0.5):8.3f} {percentile(values, 0.99):8.3f} "
                f"{max(values):8.3f} {statistics.fmean(values):8.3f}"
            )
        print(f"{route:<10} {'server CPU per review':<22} {cpu[route]:8.3f} ms")
    out = {route: round(percentile(seen, 0.99), 3) for route, seen in results.items()}
    inside = {route: round(percentile(handled[route][-a.pods :], 0.99), 3) for route in results}
    server_cpu = {route: round(v, 3) for route, v in cpu.items()}
    print(
        json.dumps({"p99_ms_round_trip": out, "p99_ms_in_handler": inside, "server_cpu_ms": server_cpu, "pods": a.pods})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
