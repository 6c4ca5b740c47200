"""Keeps the webhook's certificate current and the cluster's GPU summary fresh: the imperative shell around
share_webhook.certs and share_core.admission.

Every replica runs both loops. The certificate loop makes or renews the Secret (certs.next_bundle),
hands the bundle to the server (which swaps its TLS context) and writes the CA into the webhook
configurations; the node loop lists the gpushare nodes for validation's warnings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from share_core.admission import ClusterGpus
from share_core.gpus import node_gpus
from share_core.kube import Conflict
from share_core.kube import KubeError
from share_core.request import InvalidRequest
from share_webhook import certs
from share_webhook.kubeapi import WebhookApi

log = logging.getLogger(__name__)


class CertKeeper:
    def __init__(
        self,
        api: WebhookApi,
        namespace: str,
        secret: str,
        names: Sequence[str],
        webhook_configs: Sequence[tuple[str, str]],
        on_bundle: Callable[[certs.Bundle], None],
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.secret = secret
        self.names = list(names)
        self.webhook_configs = list(webhook_configs)  # (kind "mutating"|"validating", name)
        self.on_bundle = on_bundle
        self.bundle: certs.Bundle | None = None

    def owner(self) -> dict[str, Any] | None:
        """An ownerReference to our MutatingWebhookConfiguration, when it exists: the garbage collector
        deletes the Secret with it, so `helm uninstall` leaves no key behind though helm never made it."""
        for kind, name in self.webhook_configs:
            uid = self.api.config_uid(kind, name) if kind == "mutating" else None
            if uid:
                return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                        "name": name, "uid": uid}  # fmt: skip
        return None

    def sync(self) -> certs.Bundle:
        """One pass: the Secret's bundle (made or renewed if needed), owned by the mutating configuration,
        served, and trusted by the configs."""
        owner = self.owner()
        for _ in range(5):  # a lost race re-reads the winner's Secret
            obj = self.api.get_secret(self.namespace, self.secret)
            current = certs.from_secret_data((obj or {}).get("data"))
            wanted = certs.next_bundle(current, self.names)
            owners = list(((obj or {}).get("metadata") or {}).get("ownerReferences") or [])
            owned = owner is None or any(o.get("uid") == owner["uid"] for o in owners)
            if wanted is None and current is not None and owned:
                bundle = current
                break
            bundle = wanted or current
            assert bundle is not None
            if owner is not None and not owned:  # a configuration made again has a new UID
                owners = [o for o in owners if o.get("kind") != owner["kind"]] + [owner]
            data = certs.to_secret_data(bundle)
            try:
                if obj is None:
                    self.api.create_secret(self.namespace, self.secret, data, owners)
                    log.info("created the serving certificate in Secret %s/%s", self.namespace, self.secret)
                else:
                    version = obj["metadata"]["resourceVersion"]
                    self.api.replace_secret(self.namespace, self.secret, data, owners, version)
                    what = "renewed the serving certificate" if wanted else "owned by its webhook configuration"
                    log.info("Secret %s/%s: %s", self.namespace, self.secret, what)
            except Conflict:
                log.info("Secret %s/%s was written by another replica; reading it again", self.namespace, self.secret)
                continue
            break
        else:
            raise KubeError(f"Secret {self.namespace}/{self.secret} kept changing under us; will retry")
        if bundle != self.bundle:
            self.on_bundle(bundle)
            self.bundle = bundle
        for kind, name in self.webhook_configs:
            try:
                if not self.api.set_ca_bundle(kind, name, bundle.ca_bundle()):
                    log.warning("%s webhook configuration %s not found: its caBundle is not set", kind, name)
            except Conflict:
                log.info("%s webhook configuration %s changed while patching; next pass retries", kind, name)
        return bundle


class ClusterView:
    """The gpushare nodes' GPUs, listed every `interval` seconds; None until the first list succeeds (no
    warnings then: better none than wrong ones)."""

    def __init__(self, api: WebhookApi) -> None:
        self.api = api
        self.gpus: ClusterGpus | None = None

    def refresh(self) -> None:
        nodes = []
        for node in self.api.gpu_nodes():
            try:
                nodes.append(node_gpus(node))
            except InvalidRequest as exc:
                log.warning("node %s: ignoring its GPU annotation: %s", node.get("metadata", {}).get("name"), exc)
        self.gpus = ClusterGpus.of(nodes)


def run_every(interval: float, fn: Callable[[], object], stop: threading.Event, what: str) -> threading.Thread:
    """`fn` now and every `interval` seconds on a daemon thread; failures are logged and retried."""

    def loop() -> None:
        while not stop.is_set():
            try:
                fn()
            except Exception as exc:
                log.warning("%s failed: %s; retrying in %.0f s", what, exc, min(interval, 10.0))
                if stop.wait(min(interval, 10.0)):
                    return
                continue
            if stop.wait(interval):
                return

    t = threading.Thread(target=loop, name=what, daemon=True)
    t.start()
    return t
