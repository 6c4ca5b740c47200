"""charts/gpushare against the real API server: every rendered object validated by a server-side dry
run (default values and every option on), the chart's RBAC enforced for its service accounts, and the
real kube-scheduler starting from the chart's configuration."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.controlplane import ControlPlane
from tests.controlplane.webhook import serves_policy
from tests.unit.chart.helm import ALL_OPTIONS
from tests.unit.chart.helm import CHART_DIR
from tests.unit.chart.helm import MONITORING_API
from tests.unit.chart.helm import Obj
from tests.unit.chart.helm import one
from tests.unit.chart.helm import render_chart
from tests.unit.chart.helm import run_helm
from tests.unit.chart.helm import scheduler_config

pytestmark = pytest.mark.integration

NAMESPACE = "gpushare-chart-test"


def _monitoring_crd(kind: str) -> dict[str, Any]:
    """A stand-in for one of the Prometheus operator's CRDs: enough for the API server to serve
    monitoring.coreos.com/v1 and accept the chart's ServiceMonitor and PodMonitor."""
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


MONITORING_CRDS = [_monitoring_crd("ServiceMonitor"), _monitoring_crd("PodMonitor")]


def _yaml(docs: list[Obj]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> ControlPlane:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(ns))
    return control_plane


@pytest.fixture(scope="module")
def kube_version(cluster: ControlPlane) -> str:
    return json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]


@pytest.fixture(scope="module")
def service_monitor_api(cluster: ControlPlane) -> Iterator[None]:
    for crd in MONITORING_CRDS:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(crd))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}")
    deadline = time.monotonic() + 30
    while MONITORING_API not in cluster.kubectl("api-versions").stdout.split():
        assert time.monotonic() < deadline, "monitoring.coreos.com/v1 never served"
        time.sleep(0.5)
    yield
    for crd in MONITORING_CRDS:
        cluster.kubectl("delete", "crd", crd["metadata"]["name"], "--wait=false", check=False)


def _dry_run(cluster: ControlPlane, docs: list[Obj]) -> None:
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=_yaml(docs), check=False)
    assert result.returncode == 0, f"the API server rejected the chart:\n{result.stdout}{result.stderr}"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(docs), result.stdout
    assert all("(server dry run)" in line for line in lines), result.stdout


def test_default_values_pass_server_side_dry_run(cluster: ControlPlane, kube_version: str) -> None:
    docs = render_chart(namespace=NAMESPACE, kube_version=kube_version)
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "ConfigMap", "Service", "ClusterRole", "Role", "RoleBinding"} <= kinds
    _dry_run(cluster, docs)


def test_all_options_pass_server_side_dry_run(
    cluster: ControlPlane, kube_version: str, service_monitor_api: None
) -> None:
    docs = render_chart([ALL_OPTIONS], namespace=NAMESPACE, kube_version=kube_version, api_versions=[MONITORING_API])
    assert one(docs, "ServiceMonitor") and one(docs, "PodMonitor")
    _dry_run(cluster, docs)


def test_kube_scheduler_image_matches_the_cluster(kube_version: str) -> None:
    docs = render_chart(namespace=NAMESPACE, kube_version=kube_version)
    dep = one(docs, "Deployment", "gpushare-scheduler")
    images = {c["name"]: c["image"] for c in dep["spec"]["template"]["spec"]["containers"]}
    assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{kube_version.split('+')[0]}"


def test_real_kube_scheduler_accepts_the_chart_config(cluster: ControlPlane, kube_version: str) -> None:
    """kube-scheduler decodes its configuration strictly: an unknown or misspelt field fails its start."""
    for values in ([], [ALL_OPTIONS]):
        config = scheduler_config(render_chart(values, namespace=NAMESPACE, kube_version=kube_version))
        # The test identity (system:kube-scheduler) may not take the chart's lease: that part is
        # covered by the RBAC test below. Everything else is exactly the chart's.
        config["leaderElection"] = {"leaderElect": False}
        cluster.start_scheduler(yaml.safe_dump(config))
        try:
            sched = cluster.scheduler  # start_scheduler waited for /healthz: the config was accepted
            assert sched is not None and sched.process.alive()
            assert "gpushare-scheduler" in sched.config_path.read_text()
        finally:
            cluster.stop_scheduler()


# ---------------------------------------------------------------------------- RBAC, really enforced

RBAC_RELEASE = "rbaccheck"


@pytest.fixture(scope="module")
def rbac_installed(cluster: ControlPlane, kube_version: str) -> Iterator[list[Obj]]:
    """The chart's service accounts and RBAC objects, created for real under a release of their own."""
    docs = render_chart(release=RBAC_RELEASE, namespace=NAMESPACE, kube_version=kube_version)
    rbac = [
        d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    cluster.kubectl("apply", "-f", "-", input=_yaml(rbac))
    yield docs
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=_yaml(rbac), check=False)


def _can(cluster: ControlPlane, sa: str, *args: str) -> bool:
    result = cluster.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:{NAMESPACE}:{sa}", check=False)
    answer = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert answer in ("yes", "no"), f"kubectl auth can-i {' '.join(args)}: {result.stdout}{result.stderr}"
    return answer == "yes"


def _sa(docs: list[Obj], kind: str, name: str | None = None) -> str:
    return one(docs, kind, name)["spec"]["template"]["spec"]["serviceAccountName"]


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (("get", "nodes"), True),
        (("patch", "nodes"), True),
        (("patch", "nodes", "--subresource=status"), True),
        (("list", "pods", "-A"), True),
        (("watch", "pods", "-A"), True),
        (("patch", "pods", "-n", "default"), True),
        (("create", "events", "-n", "default"), True),
        (("list", "nodes"), True),  # the uninstall hook (share-plugin --unpublish) finds published nodes
        (("update", "nodes"), False),
        (("delete", "nodes"), False),
        (("delete", "pods", "-n", "default"), False),
        (("create", "pods", "--subresource=binding", "-n", "default"), False),
        (("list", "secrets", "-A"), False),
        (("get", "configmaps", "-n", "kube-system"), False),
    ],
)
def test_device_plugin_rbac_enforced(
    cluster: ControlPlane, rbac_installed: list[Obj], args: tuple[str, ...], allowed: bool
) -> None:
    assert _can(cluster, _sa(rbac_installed, "DaemonSet"), *args) is allowed


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        # the extender
        (("list", "nodes"), True),
        (("watch", "pods", "-A"), True),
        (("patch", "pods", "-n", "default"), True),  # the holds annotation (assignments travel on the Binding)
        (("create", "pods", "--subresource=eviction", "-n", "default"), False),  # consolidation is off by default
        (("create", "pods", "--subresource=binding", "-n", "default"), True),
        (("create", "events", "-n", "default"), True),
        (("create", "events.events.k8s.io", "-n", "default"), True),
        # kube-scheduler: built-in roles, its own lease, the authentication ConfigMap
        (("list", "persistentvolumeclaims", "-A"), True),
        (("create", "leases.coordination.k8s.io", "-n", NAMESPACE), True),
        (("get", "leases.coordination.k8s.io/LEASE", "-n", NAMESPACE), True),
        (("update", "leases.coordination.k8s.io/LEASE", "-n", NAMESPACE), True),
        (("get", "configmaps/extension-apiserver-authentication", "-n", "kube-system"), True),
        # and nothing more
        (("update", "leases.coordination.k8s.io/someone-elses-lock", "-n", NAMESPACE), False),
        (("get", "configmaps/other", "-n", "kube-system"), False),
        (("list", "secrets", "-A"), False),
        (("delete", "nodes"), False),
        (("patch", "nodes"), False),
        (("create", "pods", "-n", "default"), False),
    ],
)
def test_scheduler_rbac_enforced(
    cluster: ControlPlane, rbac_installed: list[Obj], args: tuple[str, ...], allowed: bool
) -> None:
    lease = scheduler_config(rbac_installed)["leaderElection"]["resourceName"]
    args = tuple(a.replace("LEASE", lease) for a in args)
    assert _can(cluster, _sa(rbac_installed, "Deployment", f"{RBAC_RELEASE}-gpushare-scheduler"), *args) is allowed


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (("list", "nodes"), True),
        (("get", f"mutatingwebhookconfigurations/{RBAC_RELEASE}-gpushare-webhook"), True),
        (("patch", f"mutatingwebhookconfigurations/{RBAC_RELEASE}-gpushare-webhook"), True),
        (("patch", f"validatingwebhookconfigurations/{RBAC_RELEASE}-gpushare-webhook"), True),
        (("get", f"secrets/{RBAC_RELEASE}-gpushare-webhook-tls", "-n", NAMESPACE), True),
        (("update", f"secrets/{RBAC_RELEASE}-gpushare-webhook-tls", "-n", NAMESPACE), True),
        (("create", "secrets", "-n", NAMESPACE), True),
        # and nothing more: no other configuration, no other Secret, nothing in other namespaces
        (("patch", "mutatingwebhookconfigurations/someone-elses"), False),
        (("list", "mutatingwebhookconfigurations"), False),
        (("delete", f"secrets/{RBAC_RELEASE}-gpushare-webhook-tls", "-n", NAMESPACE), False),
        (("get", "secrets/other", "-n", NAMESPACE), False),
        (("list", "secrets", "-n", NAMESPACE), False),
        (("create", "secrets", "-n", "default"), False),
        (("get", "pods", "-A"), False),
        (("patch", "nodes"), False),
    ],
)
def test_webhook_rbac_enforced(
    cluster: ControlPlane, rbac_installed: list[Obj], args: tuple[str, ...], allowed: bool
) -> None:
    assert _can(cluster, _sa(rbac_installed, "Deployment", f"{RBAC_RELEASE}-gpushare-webhook"), *args) is allowed


def test_rbac_objects_really_created(cluster: ControlPlane, rbac_installed: list[Obj]) -> None:
    got: dict[str, Any] = json.loads(
        cluster.kubectl("get", "clusterroles", "-l", f"app.kubernetes.io/instance={RBAC_RELEASE}", "-o", "json").stdout
    )
    assert sorted(i["metadata"]["name"] for i in got["items"]) == [
        f"{RBAC_RELEASE}-gpushare-device-plugin",
        f"{RBAC_RELEASE}-gpushare-extender",
        f"{RBAC_RELEASE}-gpushare-webhook",
    ]


@pytest.mark.parametrize(
    ("values", "webhook"),
    [([], True), (["--values", str(ALL_OPTIONS)], True), (["--set", "webhook.enabled=false"], False)],
    ids=["default", "all-options", "no-webhook"],
)
def test_helm_install_dry_run_and_notes(
    cluster: ControlPlane, service_monitor_api: None, values: list[str], webhook: bool
) -> None:
    """helm itself installs the chart against the API server (server dry run) and prints NOTES.txt: the pod
    spec without schedulerName when the webhook gives it, with it otherwise."""
    args = ["install", "notes-check", str(CHART_DIR), "--namespace", NAMESPACE, "--dry-run=server"]
    args += ["--kubeconfig", str(cluster.admin_kubeconfig), *values]
    out = run_helm(*args).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "kubectl label node <gpu-node> gpushare=true" in notes
    assert ("schedulerName: gpushare-scheduler" in notes) is not webhook and "nvidia.com/gpu-mem:" in notes
    assert ("Admission gives the pod its scheduler" in notes) is webhook
    if webhook:  # all-options sets webhook.mutation=webhook; the default is the policy where it is served
        by_policy = "--values" not in values and serves_policy(cluster)
        said = (
            "the MutatingAdmissionPolicy notes-check-gpushare-webhook-scheduler"
            if by_policy
            else "the admission webhook"
        )
        assert f"(gpushare-scheduler: {said})" in notes, notes
    assert "kubectl inspect gpushare" in notes
    assert "WARNING" not in notes, "the ServiceMonitor API is served here"
