"""A real node (containerd + runc + upstream kubelet, tests/node) works as the other tests need it to:
it goes Ready, runs a pod from our own image, its log reads through the API server, and our device
plugin registers with kubelet exactly as in production, again after kubelet restarts."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from share_core.contract import NODE_LABEL
from share_core.contract import NODE_LABEL_VALUE
from share_core.contract import RESOURCE_MEM
from share_core.kube import NotFound
from tests.controlplane import ControlPlane
from tests.controlplane import ManagedProcess
from tests.controlplane.gpucluster import plugin_argv
from tests.node import RealNode

pytestmark = [pytest.mark.integration, pytest.mark.realkubelet]

NAMESPACE = "realnode-smoke"


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"not {what} within {timeout:.0f}s (last: {last!r})")


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> str:
    control_plane.kubectl("create", "namespace", NAMESPACE, check=False)
    return NAMESPACE


def test_node_is_ready_labelled_and_reachable_on_loopback(real_node: RealNode) -> None:
    node = real_node.wait_ready(30)
    assert node["metadata"]["labels"].get(NODE_LABEL) == NODE_LABEL_VALUE
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    assert not [t for t in node["spec"].get("taints") or [] if t["effect"] in ("NoSchedule", "NoExecute")]
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"].startswith("v1.")
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == real_node.kubelet_port


@pytest.mark.parametrize("host_network", [True, False], ids=["hostNetwork", "podNetwork"])
def test_busybox_pod_runs_and_its_log_reads_through_the_api(
    real_node: RealNode, namespace: str, host_network: bool
) -> None:
    token = secrets.token_hex(8)
    name = f"env-{'host' if host_network else 'pod'}-{token[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": real_node.name,
            "restartPolicy": "Never",
            "hostNetwork": host_network,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": real_node.images.busybox.ref,
                    "imagePullPolicy": "Never",
                    "command": ["env"],
                    "env": [{"name": "GPUSHARE_SMOKE", "value": token}],
                }
            ],
        },
    }
    api = real_node.admin
    api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
    try:

        def finished() -> dict[str, Any] | None:
            p = api.get_pod(namespace, name)
            return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

        done = wait_for(finished, 60, f"pod {name} finished")
        assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
        log = real_node.pod_log(namespace, name, container="main")
        assert f"GPUSHARE_SMOKE={token}" in log.splitlines(), log
    finally:
        api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", query={"gracePeriodSeconds": 0})


@pytest.fixture
def plugin(real_node: RealNode, control_plane: ControlPlane, tmp_path: Path) -> Iterator[ManagedProcess]:
    proc = ManagedProcess(
        "share-plugin",
        plugin_argv(
            real_node.name,
            "2xA100:80GiB",
            real_node.device_plugin_dir,
            real_node.pod_resources_socket,
            control_plane.admin_kubeconfig,
        ),
        tmp_path / "share-plugin.log",
    )
    try:
        yield proc
    finally:
        proc.stop()
        # Leave the shared node as we found it: a kubelet that never saw our resource (later tests
        # start their own plugin, with other GPUs).
        real_node.restart_kubelet(drop_device_checkpoint=True)


def _gpu_mem(real_node: RealNode) -> tuple[str | None, str | None]:
    try:
        status = real_node.node()["status"]
    except NotFound:
        return None, None
    return status.get("capacity", {}).get(RESOURCE_MEM), status.get("allocatable", {}).get(RESOURCE_MEM)


def test_device_plugin_registers_with_kubelet_and_again_after_kubelet_restarts(
    real_node: RealNode, plugin: ManagedProcess
) -> None:
    socket = real_node.device_plugin_dir / "gpushare.sock"
    registered = "Got registration request from device plugin with resource"

    def advertised() -> bool:
        if not plugin.alive():
            raise plugin.fail("exited")
        return _gpu_mem(real_node) == ("160", "160")

    wait_for(advertised, 20, "nvidia.com/gpu-mem 160 on the node")
    assert registered in real_node.kubelet_log()
    first_socket = socket.stat().st_ctime_ns  # (the inode number is often reused)

    real_node.restart_kubelet()

    # kubelet removed the plugin's socket at start; the plugin served a new one and registered again.
    wait_for(lambda: registered in real_node.kubelet_log(), 30, "the plugin registered with the new kubelet")
    assert socket.exists() and socket.stat().st_ctime_ns != first_socket
    wait_for(advertised, 20, "nvidia.com/gpu-mem 160 again after the kubelet restart")
