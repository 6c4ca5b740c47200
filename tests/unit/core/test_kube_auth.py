"""ApiServerClient sends the bearer token the kubernetes client loaded, wherever it keeps it: in-cluster
(a pod's service account token) the client stores it under "BearerToken". It asks the client's refresh
hook for it once per AUTH_REFRESH_S, and again at once after a 401."""

from __future__ import annotations

import http.server
import threading

import pytest
from kubernetes import client
from kubernetes.config import incluster_config

from share_core.httpconn import ConnectionPool
from share_core.kube import AUTH_REFRESH_S
from share_core.kube import ApiServerClient
from share_core.kube import KubeError


def test_incluster_token_is_sent(tmp_path):
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("tok-123")
    ca.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    cfg = client.Configuration()
    loader = incluster_config.InClusterConfigLoader(
        token_filename=str(token),
        cert_filename=str(ca),
        environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    )
    loader.load_and_set(cfg)
    headers = ApiServerClient(cfg)._headers()
    assert headers["Authorization"].lower() == "bearer tok-123"


def test_authorization_key_still_works():
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:6443"
    cfg.api_key = {"authorization": "Bearer abc"}
    assert ApiServerClient(cfg)._headers()["Authorization"] == "Bearer abc"


def test_no_token_no_header():
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:6443"
    assert "Authorization" not in ApiServerClient(cfg)._headers()


class _Rotating:
    """A refresh hook as the kubernetes client's loaders install one: it sets the current token."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, cfg: client.Configuration) -> None:
        self.calls += 1
        cfg.api_key = {"BearerToken": f"Bearer tok-{self.calls}"}
        cfg.refresh_api_key_hook = self  # get_api_key_with_prefix calls it too; keep it installed


def _rotating_client() -> tuple[ApiServerClient, _Rotating, list[float]]:
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:1"
    hook = _Rotating()
    cfg.refresh_api_key_hook = hook
    api = ApiServerClient(cfg)
    now = [100.0]
    api._clock = lambda: now[0]
    return api, hook, now


def test_token_is_reused_until_it_is_due_for_a_refresh():
    # The client's hook reloads its whole configuration (80-85 us): once per AUTH_REFRESH_S, not per request.
    api, hook, now = _rotating_client()
    first = api._headers()["Authorization"]
    for _ in range(50):
        assert api._headers()["Authorization"] == first
    asked = hook.calls
    now[0] += AUTH_REFRESH_S + 0.1
    assert api._headers()["Authorization"] != first  # a rotated token is picked up after the interval
    assert hook.calls > asked


def test_a_401_asks_for_the_token_again_at_once():
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            status = 401 if len(seen) == 1 else 200
            body = b'{"kind":"Status","message":"Unauthorized"}' if status == 401 else b"{}"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api, _, _ = _rotating_client()  # its clock never moves
        api.host = f"http://127.0.0.1:{server.server_address[1]}"
        api._conns = ConnectionPool(api.host)
        with pytest.raises(KubeError) as refused:
            api.request("GET", "/api/v1/nodes")
        assert refused.value.status == 401
        api.request("GET", "/api/v1/nodes")  # the clock has not moved: only the 401 made it ask again
        assert seen[0] != seen[1] and seen[1].startswith("Bearer tok-")
    finally:
        server.shutdown()
        server.server_close()
