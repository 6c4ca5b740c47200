"""The control plane integration tests rely on works: RBAC on, the scheduler binds."""

from __future__ import annotations

import json
import time

import pytest

from tests.controlplane import ControlPlane

pytestmark = pytest.mark.integration

MINIMAL_SCHEDULER_CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: default-scheduler
"""


def _node(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def _pod(name: str, gib: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "schedulerName": "default-scheduler",
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpu-mem": str(gib)}},
                    }
                ],
            },
        }
    )


def test_version_reports_pinned_release(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("version", "-o", "json").stdout
    server = json.loads(out)["serverVersion"]
    assert server["gitVersion"].startswith("v1.")
    assert server["major"] == "1"


def test_scheduler_binds_pod_to_node_with_gpu_mem(control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.kubectl("create", "-f", "-", input=_node("smoke-node"))
    resources = {
        "cpu": "8",
        "memory": "32Gi",
        "pods": "110",
        "nvidia.com/gpu-mem": "32",
    }
    status = {"status": {"capacity": resources, "allocatable": resources}}
    cp.kubectl(
        "patch",
        "node",
        "smoke-node",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    capacity = cp.kubectl("get", "node", "smoke-node", "-o", "jsonpath={.status.capacity}").stdout
    assert json.loads(capacity)["nvidia.com/gpu-mem"] == "32"

    cp.stop_scheduler()  # another test's scheduler; theirs is started again when they need it
    cp.start_scheduler(MINIMAL_SCHEDULER_CONFIG)
    try:
        cp.kubectl("create", "-f", "-", input=_pod("smoke-pod", 8))
        deadline = time.monotonic() + 30
        node = ""
        while time.monotonic() < deadline and not node:
            node = cp.kubectl("get", "pod", "smoke-pod", "-o", "jsonpath={.spec.nodeName}").stdout
            time.sleep(0.5)
        assert node == "smoke-node", cp.logs()
    finally:
        cp.stop_scheduler()
        cp.kubectl("delete", "pod", "smoke-pod", "--grace-period=0", "--force", check=False)
        cp.kubectl("delete", "node", "smoke-node", check=False)  # no GPU node for other tests to pick


def test_rbac_forbids_unknown_identity(control_plane: ControlPlane) -> None:
    nobody = control_plane.kubeconfig_for("nobody")
    result = control_plane.kubectl("get", "pods", "-A", kubeconfig=nobody, check=False)
    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower(), result.stderr


def test_python_client_reads_generated_kubeconfig(control_plane: ControlPlane) -> None:
    import kubernetes

    api = kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig))
    )
    names = [ns.metadata.name for ns in api.list_namespace().items]
    assert "default" in names
