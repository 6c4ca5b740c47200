"""share-dra registering with the upstream kubelet on a real node (tests/node): kubelet's plugin watcher finds
our registration socket under `<root-dir>/plugins_registry`, asks GetInfo, validates the services we offer
against its own (`v1.DRAPlugin`, pkg/kubelet/cm/dra/plugin) and tells us the outcome.

NodePrepareResources through the real kubelet and a CDI-capable containerd is issue 14's CDI work
(branch issue-14-cdi), which runs this plugin the same way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from share_core.contract import (
    DRA_CAPACITY_MEMORY,
    DRA_DEVICE_CLASS,
    DRA_DRIVER_NAME,
    DRA_REGISTRATION_SOCKET_NAME,
    ENV_MEM_LIMIT_MIB,
    SCHEDULER_NAME,
    dra_cdi_spec_file,
)
from share_core.kube import ApiServerClient, NotFound
from tests.controlplane import ControlPlane
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.gpucluster import GpuCluster, wait_for
from tests.node import RealNode

RES = "/apis/resource.k8s.io/v1"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.realkubelet,
    pytest.mark.k8s_min("1.34", "no resource.k8s.io/v1 and no v1.DRAPlugin in kubelet before 1.34 (DRA GA)"),
]


def registered(plugin: ManagedProcess) -> bool:
    """This plugin process (not an earlier one writing the same log) was told kubelet registered it."""
    text = plugin.log_path.read_text()
    return f"kubelet registered driver {DRA_DRIVER_NAME}" in text[text.rfind("### ") :]


@pytest.fixture(scope="module")
def dra_plugin(control_plane: ControlPlane, real_node: RealNode) -> Iterator[ManagedProcess]:
    """One share-dra for the module, registered with the node's kubelet before any test uses it (a pod kubelet
    admits before the driver registers waits for kubelet's next sync of it, about a minute)."""
    root = real_node.kubelet_root
    proc = ManagedProcess(
        "share-dra-realnode",
        [
            sys.executable,
            "-m",
            "share_dra",
            f"--node-name={real_node.name}",
            f"--kubeconfig={control_plane.admin_kubeconfig}",
            "--backend=sim",
            "--sim-gpus=1xT4:16GiB",
            f"--plugins-registry-dir={root / 'plugins_registry'}",
            f"--plugin-dir={root / 'plugins' / DRA_DRIVER_NAME}",
            f"--cdi-dir={real_node.workdir / 'dra-cdi'}",
            f"--cdi-spec-dirs={real_node.workdir / 'dra-cdi'}",
        ],
        control_plane.log_dir / "share-dra-realnode.log",
    )
    try:
        wait_for(lambda: registered(proc), 60, "kubelet's NotifyRegistrationStatus(registered) in share-dra's log")
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def test_kubelet_registers_the_dra_plugin(real_node: RealNode, dra_plugin: ManagedProcess) -> None:
    real_node.wait_ready()
    assert registered(dra_plugin)
    assert (real_node.kubelet_root / "plugins_registry" / DRA_REGISTRATION_SOCKET_NAME).is_socket()
    assert "refused driver" not in dra_plugin.log_path.read_text()
    # kubelet wipes its node's slices when it starts; the plugin publishes its own again after registering.
    wait_for(
        lambda: real_node.admin.request(
            "GET", "/apis/resource.k8s.io/v1/resourceslices", query={"fieldSelector": f"spec.nodeName={real_node.name}"}
        ).get("items"),
        60,
        f"the ResourceSlice of {real_node.name}",
    )


def test_kubelet_prepares_and_unprepares_a_claim(
    real_node: RealNode, dra_plugin: ManagedProcess, ns: str, gpu_cluster: GpuCluster
) -> None:
    """kubelet's DRA manager calls NodePrepareResources for a pod's allocated claim before its containers
    start (the claim's CDI spec appears, with the claim's 3 GiB as the limit), starts the pod once we answered,
    and calls NodeUnprepareResources once the pod is gone (the spec is removed). The container getting the
    spec's env through a CDI-capable containerd is issue-14-cdi's test."""
    admin = real_node.admin
    cdi_dir = real_node.workdir / "dra-cdi"
    wait_for(
        lambda: f"kubelet registered driver {DRA_DRIVER_NAME}" in dra_plugin.log_path.read_text(), 60, "registered"
    )
    wait_for(
        lambda: admin.request(
            "GET", f"{RES}/resourceslices", query={"fieldSelector": f"spec.nodeName={real_node.name}"}
        ).get("items"),
        60,
        "the real node's slice",
    )
    if not _exists(admin, f"{RES}/deviceclasses/{DRA_DEVICE_CLASS}"):
        admin.request(
            "POST",
            f"{RES}/deviceclasses",
            body={
                "metadata": {"name": DRA_DEVICE_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER_NAME}"'}}]},
            },
        )
    request = {"deviceClassName": DRA_DEVICE_CLASS, "capacity": {"requests": {DRA_CAPACITY_MEMORY: "3Gi"}}}
    claim = admin.request(
        "POST",
        f"{RES}/namespaces/{ns}/resourceclaims",
        body={"metadata": {"name": "c1"}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    )
    uid = claim["metadata"]["uid"]
    admin.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body={
            "metadata": {"name": "dra-pod"},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
                "containers": [
                    {
                        "name": "main",
                        "image": real_node.images.busybox.ref,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "env; sleep 3600"],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 1,
            },
        },
    )
    pod = wait_for(
        lambda: (p := admin.request("GET", f"/api/v1/namespaces/{ns}/pods/dra-pod"))["spec"].get("nodeName") and p,
        60,
        "the DRA pod bound",
    )
    assert pod["spec"]["nodeName"] == real_node.name
    spec_path = cdi_dir / dra_cdi_spec_file(uid)
    wait_for(spec_path.exists, 60, "kubelet's NodePrepareResources (the claim's CDI spec written)")
    env = dict(e.split("=", 1) for e in json.loads(spec_path.read_text())["devices"][0]["containerEdits"]["env"])
    assert env[ENV_MEM_LIMIT_MIB] == "3072"
    # kubelet starts the containers only once NodePrepareResources answered without error.
    wait_for(
        lambda: (
            (admin.request("GET", f"/api/v1/namespaces/{ns}/pods/dra-pod").get("status") or {}).get("phase")
            == "Running"
        ),
        90,
        "the DRA pod running",
    )
    ours = sorted(line for line in real_node.pod_log(ns, "dra-pod").splitlines() if line.startswith("GPUSHARE_"))
    # With CDI off in this node's containerd the runtime ignores the CDI device IDs kubelet passes; issue-14-cdi
    # turns it on and checks the container's env is the spec's.
    print(f"\nDRA pod running; gpushare env in the container: {ours or 'none (containerd CDI off)'}")
    admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/dra-pod")
    wait_for(lambda: not spec_path.exists(), 90, "kubelet's NodeUnprepareResources (the claim's CDI spec removed)")
    assert "NodeUnprepareResources" in dra_plugin.log_path.read_text()


def _exists(admin: ApiServerClient, path: str) -> bool:
    try:
        admin.request("GET", path)
    except NotFound:
        return False
    return True
