"""share-webhook as a process beside a ControlPlane, called by the real kube-apiserver over TLS through the
chart's own webhook configurations (tests/integration/test_webhook.py, bench/bench_throughput.py --webhook).

The configurations are the chart's (rendered by the real helm, matchConditions and all), with the Service
reference replaced by the webhook's loopback URL; the webhook makes its certificate (for 127.0.0.1 too),
stores it in its Secret and writes the caBundle itself, as in a cluster without cert-manager.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.controlplane.cluster import ControlPlane, free_port
from tests.controlplane.gpucluster import wait_for
from tests.unit.chart import helm as h

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpushare-system"
NAME = "gpushare-webhook"  # the chart's names for release "gpushare"
SECRET = "gpushare-webhook-tls"
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")


def configurations(url: str) -> list[dict[str, Any]]:
    """The chart's Mutating- and ValidatingWebhookConfiguration (opt-in namespaces on), calling `url`."""
    docs = h.render_chart(
        set_values={"webhook.enabled": True, "webhook.scheduleNamespaces.enabled": True}, kube_version="v1.37.2"
    )
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = copy.deepcopy(h.one(docs, kind, NAME))
        for hook in cfg["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}"}
        out.append(cfg)
    return out


class Webhook:
    """share-webhook as a process of a test or bench, restartable; 127.0.0.1 only."""

    def __init__(
        self, cp: ControlPlane, log: Path, log_level: str = "DEBUG", node_refresh: float = 1.0, src: Path = ROOT
    ) -> None:
        """`src`: the checkout whose share_webhook runs (an older one, for a bench's before and after)."""
        self.cp, self.log, self.port = cp, log, free_port()
        self.log_level, self.node_refresh, self.src = log_level, node_refresh, src
        self.proc: subprocess.Popen[bytes] | None = None

    def install(self) -> None:
        """Its namespace (for the Secret) and the chart's configurations, pointed at this process."""
        if self.cp.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
            self.cp.kubectl("create", "namespace", NAMESPACE)
        for cfg in configurations(f"https://127.0.0.1:{self.port}"):
            self.cp.kubectl("apply", "-f", "-", input=json.dumps(cfg))

    def uninstall(self) -> None:
        for kind in KINDS:
            self.cp.kubectl("delete", kind, NAME, "--ignore-not-found", check=False)

    def start(self) -> None:
        argv = [
            sys.executable, "-m", "share_webhook", f"--kubeconfig={self.cp.admin_kubeconfig}",
            "--bind-address=127.0.0.1", f"--port={self.port}", f"--namespace={NAMESPACE}",
            f"--cert-secret={SECRET}", f"--service={NAME}", "--extra-cert-names=127.0.0.1",
            f"--mutating-config={NAME}", f"--validating-config={NAME}",
            f"--node-refresh-interval={self.node_refresh}", f"--log-level={self.log_level}",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(self.src)}
        self.proc = subprocess.Popen(argv, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=self.src)

    def wait_trusted(self, timeout: float = 60.0) -> None:
        """Until the webhook has written its CA into every webhook of both configurations."""
        wait_for(lambda: (b := self.ca_bundles()) and all(b), timeout, "the webhook wrote its caBundle")

    def ca_bundles(self) -> list[str]:
        out = []
        for kind in KINDS:
            cfg = json.loads(self.cp.kubectl("get", kind, NAME, "-o", "json").stdout)
            out += [w["clientConfig"].get("caBundle", "") for w in cfg["webhooks"]]
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None
