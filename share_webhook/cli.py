"""`share-webhook`: gpushare's admission webhook (see share_webhook/__init__.py and docs/operations.md)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
from pathlib import Path

from share_core.config import add_config_arg
from share_core.config import parse_args
from share_core.config import start_logging
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit

log = logging.getLogger("share_webhook")

DEFAULT_PORT = 9443


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="share-webhook", description="gpushare admission webhook")
    add_config_arg(p)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTPS port (default 9443)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address to listen on")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="kubeconfig file; in-cluster config if unset")
    p.add_argument("--scheduler-name", default=SCHEDULER_NAME, help="the schedulerName pods are given")
    p.add_argument("--memory-unit", default="GiB", choices=[u.value for u in MemoryUnit])
    p.add_argument(
        "--tls-cert-file",
        default="",
        help="serve this certificate (cert-manager's Secret, mounted), reloaded when it changes; unset: the "
        "webhook keeps its own certificate in --cert-secret",
    )
    p.add_argument("--tls-key-file", default="", help="the key of --tls-cert-file")
    p.add_argument("--namespace", default=env("POD_NAMESPACE", "default"), help="where --cert-secret lives")
    p.add_argument("--cert-secret", default="gpushare-webhook-tls", help="the Secret holding the CA and certificate")
    p.add_argument("--service", default="gpushare-webhook", help="the Service the API server calls (certificate names)")
    p.add_argument("--extra-cert-names", default="", help="comma-separated extra DNS names or IPs for the certificate")
    p.add_argument("--mutating-config", default="", help="MutatingWebhookConfiguration whose caBundle to keep")
    p.add_argument("--validating-config", default="", help="ValidatingWebhookConfiguration whose caBundle to keep")
    p.add_argument("--cert-check-interval", type=float, default=600.0, help="seconds between certificate checks")
    p.add_argument("--node-refresh-interval", type=float, default=30.0, help="seconds between GPU node lists")
    p.add_argument(
        "--dra",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="DRA placement by the policy: a pod whose ResourceClaims (or templates) ask DeviceClass gpushare.io "
        "gets the scheduler too (reads them: get on resourceclaims and resourceclaimtemplates)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(argv: list[str] | None = None) -> int:
    a = parse_args(build_parser(), argv)
    start_logging(a.log_level)
    if bool(a.tls_cert_file) != bool(a.tls_key_file):
        log.error("--tls-cert-file and --tls-key-file go together")
        return 2

    from share_core.kube import ApiServerClient
    from share_webhook import certs
    from share_webhook import review
    from share_webhook.claims import ClaimClasses
    from share_webhook.keeper import CertKeeper
    from share_webhook.keeper import ClusterView
    from share_webhook.keeper import run_every
    from share_webhook.kubeapi import ApiServerWebhookApi
    from share_webhook.server import WebhookMetrics
    from share_webhook.server import WebhookServer

    client = ApiServerClient.from_kubeconfig(a.kubeconfig, None, component="gpushare-webhook")
    api = ApiServerWebhookApi(client)
    view = ClusterView(api)
    unit = a.memory_unit
    claims = ClaimClasses(client.get_path) if a.dra else None

    def mutate_with(raw: bytes, opted_in: bool) -> dict:
        req = review.parse_review(raw)
        ours = claims is not None and bool((req.pod.get("spec") or {}).get("resourceClaims")) and claims.ours(req.pod)
        return review.mutate(req, opted_in=opted_in, scheduler_name=a.scheduler_name, claims_ours=ours)

    def mutate(raw: bytes) -> dict:
        return mutate_with(raw, opted_in=False)

    def mutate_all(raw: bytes) -> dict:
        return mutate_with(raw, opted_in=True)

    def validate(raw: bytes) -> dict:
        return review.validate(review.parse_review(raw), view.gpus, unit, a.scheduler_name)

    routes = {"/mutate": mutate, "/mutate-all": mutate_all, "/validate": validate}
    try:
        server = WebhookServer(a.bind_address, a.port, routes, WebhookMetrics())
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", a.bind_address, a.port, exc)
        return 1
    stop = threading.Event()
    workdir = Path(tempfile.mkdtemp(prefix="share-webhook-"))
    names = certs.service_names(a.service, a.namespace) + [n for n in a.extra_cert_names.split(",") if n]

    def serve_bundle(bundle: certs.Bundle) -> None:
        cert, key = workdir / "tls.crt", workdir / "tls.key"
        key.touch(mode=0o600)
        key.write_text(bundle.key)
        cert.write_text(bundle.cert)
        server.use_certificate(str(cert), str(key))
        log.info("serving a certificate for %s", ", ".join(names))

    if a.tls_cert_file:
        mtimes: dict[str, float] = {}

        def reload_files() -> None:
            now = {f: os.stat(f).st_mtime for f in (a.tls_cert_file, a.tls_key_file)}
            if now != mtimes:
                server.use_certificate(a.tls_cert_file, a.tls_key_file)
                mtimes.update(now)
                log.info("loaded the certificate %s", a.tls_cert_file)

        run_every(30.0, reload_files, stop, "certificate file reload")
    else:
        configs = [("mutating", a.mutating_config)] if a.mutating_config else []
        configs += [("validating", a.validating_config)] if a.validating_config else []
        keeper = CertKeeper(api, a.namespace, a.cert_secret, names, configs, serve_bundle)
        run_every(a.cert_check_interval, keeper.sync, stop, "certificate check")
    run_every(a.node_refresh_interval, view.refresh, stop, "GPU node list")

    def shutdown(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    log.info("gpushare webhook on %s:%d (scheduler %s)", a.bind_address, a.port, a.scheduler_name)
    server.serve_forever()
    server.server_close()
    return 0
