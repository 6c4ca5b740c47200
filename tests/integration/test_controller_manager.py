"""The real kube-controller-manager in the test tier (ControlPlane.start_controller_manager): on a
control plane with the ServiceAccount admission plugin, Deployments become pods through the
Deployment and ReplicaSet controllers, pods get projected service account tokens, a namespace's
deletion is finished by the namespace controller. No pod is made by hand."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controlplane import ControlPlane
from tests.controlplane.gpucluster import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _poll(check, timeout: float, what: str):
    return wait_for(check, timeout, what, interval=0.3)


@pytest.fixture(scope="module")
def cm_plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("cm-plane"), k8s_bin_dir, service_accounts=True) as cp:
        cp.start_controller_manager()
        yield cp


def test_controllers_make_pods_tokens_and_clean_up(cm_plane: ControlPlane):
    cp = cm_plane
    assert cp.controller_manager is not None and cp.controller_manager.alive()
    cp.kubectl("create", "namespace", "cm")
    _poll(lambda: cp.kubectl("-n", "cm", "get", "serviceaccount", "default", check=False).returncode == 0, 30, "sa")
    _poll(lambda: cp.kubectl("-n", "cm", "get", "configmap", "kube-root-ca.crt", check=False).returncode == 0, 30, "ca")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "cm"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "gpushare.local/none:0"}]},
            },
        },
    }
    cp.kubectl("apply", "-f", "-", input=json.dumps(deployment))

    def pods():
        items = json.loads(cp.kubectl("-n", "cm", "get", "pods", "-o", "json").stdout)["items"]
        return items if len(items) == 2 else None

    made = _poll(pods, 60, "two pods from the Deployment")
    for pod in made:
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ReplicaSet" and owner["name"].startswith("web-")
        assert pod["spec"]["serviceAccountName"] == "default"
        volumes = [v["name"] for v in pod["spec"]["volumes"]]
        assert any(v.startswith("kube-api-access-") for v in volumes), volumes
    # each controller acts as its own service account (--use-service-account-credentials)
    log = cp.controller_manager.log_path.read_text()
    assert "Started controller" in log or "deployment-controller" in log
    cp.kubectl("delete", "deployment", "-n", "cm", "web")
    _poll(lambda: not json.loads(cp.kubectl("-n", "cm", "get", "pods", "-o", "json").stdout)["items"], 60, "pods gone")
    cp.kubectl("delete", "namespace", "cm", "--wait=false")
    _poll(lambda: cp.kubectl("get", "namespace", "cm", check=False).returncode != 0, 60, "namespace gone")
