"""share-webhook as a process beside a ControlPlane, called by the real kube-apiserver over TLS through the
chart's own webhook configurations (tests/integration/test_webhook.py, bench/bench_throughput.py --webhook).

The configurations are the chart's (rendered by the real helm, matchConditions and all), with the Service
reference replaced by the webhook's loopback URL; the webhook makes its certificate (for 127.0.0.1 too),
stores it in its Secret and writes the caBundle itself, as in a cluster without cert-manager. The chart is
rendered for the API server at hand, as `helm install` discovers it: where kube-apiserver serves v1
MutatingAdmissionPolicy (1.36+), its policy sets the scheduler and the webhook only validates.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.cluster import free_port
from tests.controlplane.gpucluster import wait_for
from tests.unit.chart import helm as h

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpushare-system"
NAME = "gpushare-webhook"  # the chart's names for release "gpushare"
SECRET = "gpushare-webhook-tls"
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
POLICY_KINDS = ("mutatingadmissionpolicybinding", "mutatingadmissionpolicy")
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def serves_policy(cp: ControlPlane) -> bool:
    """Whether kube-apiserver serves v1 MutatingAdmissionPolicy (1.36+): what `helm install` would discover."""
    found = json.loads(cp.kubectl("get", "--raw", "/apis/admissionregistration.k8s.io/v1").stdout)
    return any(r["name"] == "mutatingadmissionpolicies" for r in found["resources"])


def configurations(url: str, mutation: str = "auto", policy_served: bool = False) -> list[dict[str, Any]]:
    """The chart's webhook configurations (opt-in namespaces on), calling `url`, and, where the chart sets the
    scheduler by policy (`mutation`, with the cluster serving it or not), its MutatingAdmissionPolicy and binding."""
    docs = h.render_chart(
        set_values={"webhook.enabled": True, "webhook.scheduleNamespaces.enabled": True, "webhook.mutation": mutation},
        kube_version="v1.37.2",
        api_versions=(MAP_API,) if policy_served else (),
    )
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = copy.deepcopy(h.one(docs, kind, NAME))
        for hook in cfg.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}"}
        out.append(cfg)
    return out + [d for d in docs if d["kind"] in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")]


class Webhook:
    """share-webhook as a process of a test or bench, restartable; 127.0.0.1 only."""

    def __init__(
        self,
        cp: ControlPlane,
        log: Path,
        log_level: str = "DEBUG",
        node_refresh: float = 1.0,
        src: Path = ROOT,
        mutation: str = "auto",
    ) -> None:
        """`src`: the checkout whose share_webhook runs (an older one, for a bench's before and after);
        `mutation`: the chart's webhook.mutation (auto: policy where kube-apiserver serves it)."""
        self.cp, self.log, self.port = cp, log, free_port()
        self.log_level, self.node_refresh, self.src, self.mutation = log_level, node_refresh, src, mutation
        self.proc: subprocess.Popen[bytes] | None = None
        self.by_policy = False  # after install: the scheduler is set by the chart's MutatingAdmissionPolicy

    def install(self) -> None:
        """Its namespace (for the Secret) and the chart's configurations, pointed at this process."""
        if self.cp.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
            self.cp.kubectl("create", "namespace", NAMESPACE)
        # the policy probe's pod needs one where ServiceAccount admission runs (a controller manager may be late)
        meta = {"name": "default", "namespace": NAMESPACE}
        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(account))
        docs = configurations(f"https://127.0.0.1:{self.port}", self.mutation, serves_policy(self.cp))
        self.by_policy = any(d["kind"] == "MutatingAdmissionPolicy" for d in docs)
        for cfg in docs:
            self.cp.kubectl("apply", "-f", "-", input=json.dumps(cfg))

    def uninstall(self) -> None:
        for kind in KINDS:
            self.cp.kubectl("delete", kind, NAME, "--ignore-not-found", check=False)
        if self.by_policy:
            for kind in POLICY_KINDS:
                self.cp.kubectl("delete", kind, f"{NAME}-scheduler", "--ignore-not-found", check=False)

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
        if self.by_policy:  # kube-apiserver compiles a new policy from its informer, a moment after it is stored
            wait_for(self._policy_applied, timeout, "kube-apiserver applies the MutatingAdmissionPolicy")

    def _policy_applied(self) -> bool:
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "policy-probe", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "c", "image": "none", "resources": {"limits": {RESOURCE_MEM: 1}}}]},
        }
        args = ("create", "--dry-run=server", "-o", "json", "-f", "-")
        out = self.cp.kubectl(*args, input=json.dumps(probe), check=False)
        return out.returncode == 0 and json.loads(out.stdout)["spec"]["schedulerName"] == SCHEDULER_NAME

    def ca_bundles(self) -> list[str]:
        out = []
        for kind in KINDS:
            cfg = json.loads(self.cp.kubectl("get", kind, NAME, "-o", "json").stdout)
            out += [w["clientConfig"].get("caBundle", "") for w in cfg.get("webhooks") or []]
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
