"""share-webhook called by the real kube-apiserver over TLS, through the chart's own webhook configurations.

The configurations are the chart's (rendered by the real helm, matchConditions and all), with the Service
reference replaced by the webhook's loopback URL; the webhook makes its certificate, stores it in its
Secret and writes the caBundle itself, as in a cluster without cert-manager (tests/controlplane/webhook.py).
Pods are created with the built kubectl, so the refusals and warnings are what a user reads at `kubectl
apply`. The real controller manager turns a Deployment into pods. No kubelet: admission is the whole subject.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import NODE_LABEL
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from tests.controlplane import ControlPlane
from tests.controlplane.gpucluster import wait_for
from tests.controlplane.webhook import NAME
from tests.controlplane.webhook import NAMESPACE
from tests.controlplane.webhook import ROOT
from tests.controlplane.webhook import SECRET
from tests.controlplane.webhook import Webhook

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MUTATE_HOOK, VALIDATE_HOOK = "scheduler.gpushare.io", "request.gpushare.io"
OPTED_IN = "everything"
PLAIN = "apps"
# What kubectl prints, collected for the closing note and the docs (tests/integration/webhook-outputs.txt).
PRINTED: dict[str, str] = {}


@pytest.fixture(scope="module")
def plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Webhook]]:
    work = tmp_path_factory.mktemp("webhook-plane")
    cp = ControlPlane(work, k8s_bin_dir, service_accounts=True)
    cp.start()
    hook = Webhook(cp, work / "share-webhook.log")
    try:
        cp.start_controller_manager()
        for ns in (OPTED_IN, PLAIN):
            cp.kubectl("create", "namespace", ns)
        cp.kubectl("label", "namespace", OPTED_IN, "gpushare.io/schedule=all")
        for ns in (OPTED_IN, PLAIN):
            wait_for(lambda ns=ns: cp.kubectl("-n", ns, "get", "sa", "default", check=False).returncode == 0, 60, "sa")
        gpus = [{"index": i, "uuid": f"GPU-{i}", "model": "NVIDIA A100-SXM4-80GB", "memory": 80} for i in range(2)]
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "gpu-node",
                "labels": {NODE_LABEL: "true"},
                "annotations": {ANN_NODE_GPUS: json.dumps(gpus)},
            },
        }
        cp.kubectl("apply", "-f", "-", input=json.dumps(node))
        hook.install()
        hook.start()
        hook.wait_trusted()
        time.sleep(2)  # the first node list (warnings)
        yield cp, hook
    except BaseException:
        print(hook.log.read_text() if hook.log.exists() else "no webhook log", file=sys.stderr)
        raise
    finally:
        hook.stop()
        cp.stop()
        # what kubectl printed in the tests that ran, written at the module's end, not by whichever test is last
        (ROOT / "build").mkdir(exist_ok=True)
        (ROOT / "build" / "webhook-kubectl-outputs.json").write_text(json.dumps(PRINTED, indent=1))


def _failure_policy(cp: ControlPlane, value: str) -> None:
    """The failurePolicy of our pods' webhooks (the mutating one where the scheduler is not set by policy)."""
    ours = (("mutatingwebhookconfiguration", MUTATE_HOOK), ("validatingwebhookconfiguration", VALIDATE_HOOK))
    for kind, hook in ours:
        hooks = json.loads(cp.kubectl("get", kind, NAME, "-o", "json").stdout).get("webhooks") or []
        for i in (i for i, w in enumerate(hooks) if w["name"] == hook):
            patch = json.dumps([{"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": value}])
            cp.kubectl("patch", kind, NAME, "--type=json", "-p", patch)


def _pod(name: str, mem: Any = 4, scheduler: str | None = None, **annotations: str) -> dict[str, Any]:
    limits = {RESOURCE_MEM: mem} if mem is not None else {}
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox", "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations}, "spec": spec}


def _apply(cp: ControlPlane, ns: str, obj: dict[str, Any], key: str) -> subprocess.CompletedProcess[str]:
    result = cp.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(obj), check=False)
    PRINTED[key] = (result.stdout + result.stderr).strip()
    return result


def _scheduler(cp: ControlPlane, ns: str, name: str) -> str:
    return json.loads(cp.kubectl("-n", ns, "get", "pod", name, "-o", "json").stdout)["spec"]["schedulerName"]


def test_a_pod_without_a_scheduler_gets_ours(plane: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = plane
    assert _apply(cp, PLAIN, _pod("plain"), "no schedulerName").returncode == 0
    assert _scheduler(cp, PLAIN, "plain") == SCHEDULER_NAME
    init_only = _pod("init-only", mem=None)
    init_only["spec"]["initContainers"] = [
        {"name": "warm", "image": "busybox", "resources": {"limits": {RESOURCE_MEM: 2}}, "restartPolicy": "Always"}
    ]
    assert _apply(cp, PLAIN, init_only, "sidecar asks gpu-mem").returncode == 0
    assert _scheduler(cp, PLAIN, "init-only") == SCHEDULER_NAME


def _reviews(hook: Webhook, route: str) -> float:
    """How many AdmissionReviews share-webhook answered on `route` (its /metrics; loopback, its own CA)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{hook.port}/metrics", context=ctx, timeout=10) as resp:
        text = resp.read().decode()
    prefix = 'gpushare_webhook_outcomes_total{outcome="'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and f'route="{route}"' in line
    )


def test_the_scheduler_is_set_by_policy_where_the_cluster_serves_it(plane: tuple[ControlPlane, Webhook]) -> None:
    """1.36+: the chart's MutatingAdmissionPolicy sets it in kube-apiserver, /mutate is never called for our
    pods; earlier minors: share-webhook's /mutate. Either way the pod is validated by share-webhook."""
    cp, hook = plane
    minor = int(json.loads(cp.kubectl("get", "--raw", "/version").stdout)["minor"].rstrip("+"))
    assert hook.by_policy == (minor >= 36)
    mutated, validated = _reviews(hook, "/mutate"), _reviews(hook, "/validate")
    assert _apply(cp, PLAIN, _pod("counted"), "counted").returncode == 0
    assert _scheduler(cp, PLAIN, "counted") == SCHEDULER_NAME
    assert _reviews(hook, "/validate") == validated + 1
    assert _reviews(hook, "/mutate") == mutated + (0 if hook.by_policy else 1)
    # a pod naming our scheduler itself is not sent to /mutate at all (matchConditions), nor changed
    assert _apply(cp, PLAIN, _pod("named", scheduler=SCHEDULER_NAME), "names gpushare-scheduler").returncode == 0
    assert _reviews(hook, "/mutate") == mutated + (0 if hook.by_policy else 1)
    assert _scheduler(cp, PLAIN, "named") == SCHEDULER_NAME


def test_a_deployments_pods_get_ours(plane: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = plane
    template = _pod("x")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "infer"}},
            "template": {"metadata": {"labels": {"app": "infer"}}, "spec": template["spec"]},
        },
    }
    assert _apply(cp, PLAIN, deployment, "Deployment").returncode == 0

    def pods() -> list[dict[str, Any]] | None:
        items = json.loads(cp.kubectl("-n", PLAIN, "get", "pods", "-l", "app=infer", "-o", "json").stdout)["items"]
        return items if len(items) == 2 else None

    for p in wait_for(pods, 60, "the Deployment's two pods"):
        assert p["spec"]["schedulerName"] == SCHEDULER_NAME


# What the API server's own validation refuses before any validating webhook runs (extended resources must be
# whole and requests must equal limits: ValidateResourceRequirements); kubectl prints its message, not ours.
APISERVER = "The Pod"
WEBHOOK = 'admission webhook "request.gpushare.io" denied the request: gpushare: pod'


@pytest.mark.parametrize(
    ("key", "pod", "source", "reason"),
    [
        ("fractional", _pod("frac", "1.5"), APISERVER, "must be an integer"),
        ("negative", _pod("neg", "-2"), APISERVER, "must be greater than or equal to 0"),
        ("uneven gpu-count", _pod("uneven", 6, **{ANN_GPU_COUNT: "4"}), WEBHOOK, "must divide evenly by the GPU count"),
        ("garbage gpu-count", _pod("garbage", 4, **{ANN_GPU_COUNT: "two"}), WEBHOOK, "is not a whole number"),
        ("zero gpu-count", _pod("zero", 4, **{ANN_GPU_COUNT: "0"}), WEBHOOK, "must be at least 1"),
    ],
)
def test_never_schedulable_is_refused_at_apply(
    plane: tuple[ControlPlane, Webhook], key: str, pod: dict[str, Any], source: str, reason: str
) -> None:
    cp, _ = plane
    result = _apply(cp, PLAIN, pod, key)
    assert result.returncode != 0
    name = pod["metadata"]["name"]
    assert source in result.stderr and reason in result.stderr, result.stderr
    if source == WEBHOOK:
        assert f"pod {PLAIN}/{name}: " in result.stderr
    else:  # the value as 1.37 prints it ("1500m") or as 1.33 does (the Go struct of the quantity, s:"1500m")
        assert result.stderr.startswith(f'The Pod "{name}" is invalid: \n'), result.stderr
        assert "spec.containers[0].resources.limits[nvidia.com/gpu-mem]: Invalid value: " in result.stderr
        assert result.stderr.rstrip().endswith(reason), result.stderr
    assert cp.kubectl("-n", PLAIN, "get", "pod", name, check=False).returncode != 0, "nothing was created"


def test_requests_unlike_limits_is_refused(plane: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = plane
    pod = _pod("unequal", 4)
    pod["spec"]["containers"][0]["resources"]["requests"] = {RESOURCE_MEM: 2}
    result = _apply(cp, PLAIN, pod, "requests != limits")
    assert result.returncode != 0
    assert result.stderr.strip() == (
        'The Pod "unequal" is invalid: spec.containers[0].resources.requests: Invalid value: "2": '
        "must be equal to nvidia.com/gpu-mem limit of 4"
    ), result.stderr


def test_not_yet_schedulable_is_a_warning(plane: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = plane
    big = _apply(cp, PLAIN, _pod("huge", 120), "larger than every GPU")
    assert big.returncode == 0
    assert "Warning: pod needs 120 GiB of nvidia.com/gpu-mem on one GPU; the largest healthy GPU" in big.stderr
    model = _apply(cp, PLAIN, _pod("h100", 4, **{ANN_GPU_MODEL: "H100"}), "model not in the cluster")
    assert model.returncode == 0 and "Warning: no node has 1 healthy GPU(s) of model h100 today" in model.stderr
    assert _scheduler(cp, PLAIN, "huge") == SCHEDULER_NAME


def test_another_scheduler_is_left_alone_with_a_warning(plane: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = plane
    result = _apply(cp, PLAIN, _pod("volcano", 4, scheduler="volcano"), "another scheduler")
    assert result.returncode == 0 and "Warning: schedulerName 'volcano'" in result.stderr
    assert _scheduler(cp, PLAIN, "volcano") == "volcano"


def test_opted_in_namespaces_give_every_pod_the_policy(plane: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = plane
    assert _apply(cp, OPTED_IN, _pod("cpu", None), "CPU-only, opted-in namespace").returncode == 0
    assert _scheduler(cp, OPTED_IN, "cpu") == SCHEDULER_NAME
    assert _apply(cp, PLAIN, _pod("cpu", None), "CPU-only elsewhere").returncode == 0
    assert _scheduler(cp, PLAIN, "cpu") == "default-scheduler"


def test_webhook_down_refuses_our_pods_admits_the_rest_and_restarts_on_its_secret(
    plane: tuple[ControlPlane, Webhook],
) -> None:
    cp, hook = plane
    secret_before = json.loads(cp.kubectl("-n", NAMESPACE, "get", "secret", SECRET, "-o", "json").stdout)
    hook.stop()
    try:
        refused = _apply(cp, PLAIN, _pod("while-down", 4), "webhook down, failurePolicy Fail")
        assert refused.returncode != 0
        # by policy (1.36+) the scheduler is set without the webhook: validation is what fails closed
        assert f'failed calling webhook "{VALIDATE_HOOK if hook.by_policy else MUTATE_HOOK}"' in refused.stderr
        admitted = _apply(cp, PLAIN, _pod("cpu-while-down", None), "webhook down, a pod without gpu-mem")
        assert admitted.returncode == 0, "matchConditions keep every other pod away from the webhook"
        admitted = _apply(cp, OPTED_IN, _pod("cpu-while-down", None), "webhook down, opted-in CPU-only pod")
        assert admitted.returncode == 0 and _scheduler(cp, OPTED_IN, "cpu-while-down") == "default-scheduler"
        # failurePolicy Ignore: our pod is admitted unchanged
        _failure_policy(cp, "Ignore")
        ignored = _apply(cp, PLAIN, _pod("ignored", 4), "webhook down, failurePolicy Ignore")
        expected = SCHEDULER_NAME if hook.by_policy else "default-scheduler"
        assert ignored.returncode == 0 and _scheduler(cp, PLAIN, "ignored") == expected
    finally:
        _failure_policy(cp, "Fail")
        hook.start()
    wait_for(lambda: _apply(cp, PLAIN, _pod("after-restart", 4), "after restart").returncode == 0, 60, "answering")
    assert _scheduler(cp, PLAIN, "after-restart") == SCHEDULER_NAME
    secret_after = json.loads(cp.kubectl("-n", NAMESPACE, "get", "secret", SECRET, "-o", "json").stdout)
    assert secret_after["metadata"]["resourceVersion"] == secret_before["metadata"]["resourceVersion"]
    mutating = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", NAME, "-o", "json").stdout)
    owners = [(o["kind"], o["name"], o["uid"]) for o in secret_after["metadata"]["ownerReferences"]]
    assert owners == [("MutatingWebhookConfiguration", NAME, mutating["metadata"]["uid"])], "deleted with it"
    ca = base64.b64decode(secret_after["data"]["ca.crt"]).decode()
    assert all(base64.b64decode(b).decode() == ca for b in hook.ca_bundles())
