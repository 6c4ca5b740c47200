"""ApiServerClient sends the bearer token the kubernetes client loaded, wherever it keeps it: in-cluster
(a pod's service account token) the client stores it under "BearerToken"."""

from __future__ import annotations

from kubernetes import client
from kubernetes.config import incluster_config

from share_core.kube import ApiServerClient


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
