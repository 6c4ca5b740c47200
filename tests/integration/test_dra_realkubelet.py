"""share-dra registering with the upstream kubelet on a real node (tests/node): kubelet's plugin watcher finds
our registration socket under `<root-dir>/plugins_registry`, asks GetInfo, validates the services we offer
against its own (`v1.DRAPlugin`, pkg/kubelet/cm/dra/plugin) and tells us the outcome.

NodePrepareResources through the real kubelet and containerd v2 (CDI), the container's env and
NodeUnprepareResources: tests/integration/test_realkubelet_dra.py, which runs this plugin the same way.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pytest

from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_DEVICE_CLASS
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import DRA_REGISTRATION_SOCKET_NAME
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import SCHEDULER_NAME
from share_core.contract import dra_cdi_spec_file
from share_core.kube import ApiServerClient
from share_core.kube import NotFound
from tests.controlplane import ControlPlane
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.draworkload import device_class
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import wait_for
from tests.node import RealNode

RES = "/apis/resource.k8s.io/v1"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.realkubelet,
    pytest.mark.k8s_min("1.34", "no resource.k8s.io/v1 and no v1.DRAPlugin in kubelet before 1.34 (DRA GA)"),
]


def registered(plugin: ManagedProcess) -> int:
    """How often kubelet told this plugin process (not an earlier one writing the same log) it registered it."""
    text = plugin.log_path.read_text()
    return text[text.rfind("### ") :].count(f"kubelet registered driver {DRA_DRIVER_NAME}")


class DraPlugin:
    """share-dra on the real node, in kubelet's dirs under the node's work dir; restartable."""

    def __init__(self, cp: ControlPlane, node: RealNode) -> None:
        root = node.kubelet_root
        self.argv = [
            sys.executable,
            "-m",
            "share_dra",
            f"--node-name={node.name}",
            f"--kubeconfig={cp.admin_kubeconfig}",
            "--backend=sim",
            "--sim-gpus=1xT4:16GiB",
            f"--plugins-registry-dir={root / 'plugins_registry'}",
            f"--plugin-dir={root / 'plugins' / DRA_DRIVER_NAME}",
            f"--cdi-dir={node.cdi_dir}",  # the one dir the node's containerd reads CDI specs from
            f"--cdi-spec-dirs={node.cdi_dir}",
        ]
        self.log = cp.log_dir / "share-dra-realnode.log"
        self.proc: ManagedProcess | None = None

    def start(self) -> None:
        self.proc = ManagedProcess("share-dra-realnode", self.argv, self.log)
        proc = self.proc
        wait_for(lambda: registered(proc), 60, "kubelet's NotifyRegistrationStatus(registered) in share-dra's log")

    def stop(self) -> None:
        if self.proc is not None:
            rc = self.proc.stop()
            assert rc == 0, self.proc.log_tail()
            self.proc = None

    def text(self) -> str:
        """This process's log."""
        text = self.log.read_text()
        return text[text.rfind("### ") :]


@pytest.fixture(scope="module")
def dra_plugin(control_plane: ControlPlane, real_node: RealNode) -> Iterator[DraPlugin]:
    """One share-dra for the module, registered with the node's kubelet before any test uses it (a pod kubelet
    admits before the driver registers waits for kubelet's next sync of it, about a minute)."""
    plugin = DraPlugin(control_plane, real_node)
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()


def node_slice(node: RealNode) -> list:
    return (
        node.admin.request("GET", f"{RES}/resourceslices", query={"fieldSelector": f"spec.nodeName={node.name}"}).get(
            "items"
        )
        or []
    )


def test_kubelet_registers_the_dra_plugin(real_node: RealNode, dra_plugin: DraPlugin) -> None:
    real_node.wait_ready()
    assert (real_node.kubelet_root / "plugins_registry" / DRA_REGISTRATION_SOCKET_NAME).is_socket()
    assert "refused driver" not in dra_plugin.text()
    wait_for(lambda: node_slice(real_node), 60, f"the ResourceSlice of {real_node.name}")


def test_kubelet_restart_wipes_the_slice_and_the_plugin_publishes_it_again(
    real_node: RealNode, dra_plugin: DraPlugin
) -> None:
    """kubelet deletes its node's ResourceSlices when it starts (pkg/kubelet/cm/dra/plugin, in the background);
    it registers the plugin again, and the plugin, told so, looks again and publishes its slice again."""
    assert dra_plugin.proc is not None
    before = registered(dra_plugin.proc)
    real_node.restart_kubelet()
    proc = dra_plugin.proc
    wait_for(lambda: registered(proc) > before, 60, "kubelet registering the plugin again after its restart")
    # The wipe runs in the background: whenever it lands, the slice is back within the plugin's later looks.
    time.sleep(35)
    items = node_slice(real_node)
    assert len(items) == 1 and [d["name"] for d in items[0]["spec"]["devices"]] == ["gpu-0"], items


def test_kubelet_prepares_and_unprepares_a_claim_across_restarts(
    real_node: RealNode, dra_plugin: DraPlugin, ns: str, gpu_cluster: GpuCluster
) -> None:
    """kubelet's DRA manager calls NodePrepareResources for a pod's allocated claim before its containers
    start (the claim's CDI spec appears, with the claim's 3 GiB as the limit), starts the pod once we answered,
    keeps it through a kubelet restart, and calls NodeUnprepareResources once the pod is gone: a restarted plugin
    removes the spec its predecessor wrote (the checkpoint). What the container prints from the spec's env is
    test_realkubelet_dra.py's."""
    admin = real_node.admin
    cdi_dir = real_node.cdi_dir
    wait_for(lambda: node_slice(real_node), 60, "the real node's slice")
    if not _exists(admin, f"{RES}/deviceclasses/{DRA_DEVICE_CLASS}"):
        admin.request("POST", f"{RES}/deviceclasses", body=device_class())
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

    def pod() -> dict:
        return admin.request("GET", f"/api/v1/namespaces/{ns}/pods/dra-pod")

    wait_for(lambda: pod()["spec"].get("nodeName"), 60, "the DRA pod bound")
    assert pod()["spec"]["nodeName"] == real_node.name
    spec_path = cdi_dir / dra_cdi_spec_file(uid)
    wait_for(spec_path.exists, 60, "kubelet's NodePrepareResources (the claim's CDI spec written)")
    env = dict(e.split("=", 1) for e in json.loads(spec_path.read_text())["devices"][0]["containerEdits"]["env"])
    if real_node.cp.version() >= (1, 36):
        assert env[ENV_MEM_LIMIT_MIB] == "3072"
    else:
        # The session's control plane runs without DRAConsumableCapacity (off before 1.36): the API server dropped
        # the slice's sharing fields, the claim got the GPU whole, and the plugin said what to enable.
        assert env[ENV_MEM_LIMIT_MIB] == "16384"
        assert "DRAConsumableCapacity" in dra_plugin.text()
    # kubelet starts the containers only once NodePrepareResources answered without error.
    wait_for(lambda: (pod().get("status") or {}).get("phase") == "Running", 90, "the DRA pod running")
    ours = sorted(line for line in real_node.pod_log(ns, "dra-pod").splitlines() if line.startswith("GPUSHARE_"))
    # The node's containerd applies the claim's CDI spec: the container's gpushare env is the spec's.
    assert ours == sorted(f"{k}={v}" for k, v in env.items() if k.startswith("GPUSHARE_")), (ours, env)

    # A kubelet restart: the running pod keeps its claim prepared (a repeated Prepare answers the same devices).
    real_node.restart_kubelet()
    wait_for(lambda: (pod().get("status") or {}).get("phase") == "Running", 60, "the DRA pod still running")
    assert spec_path.exists() and "cannot prepare" not in dra_plugin.text()
    # A plugin restart, then the pod goes: the new plugin removes the spec its predecessor wrote.
    dra_plugin.stop()
    dra_plugin.start()
    admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/dra-pod")
    wait_for(lambda: not spec_path.exists(), 90, "kubelet's NodeUnprepareResources (the claim's CDI spec removed)")
    # the plugin logs once Unprepare is done (the CDI spec goes first, then the hard limit is cleared)
    wait_for(
        lambda: "NodeUnprepareResources" in dra_plugin.text() and "removed" in dra_plugin.text(),
        30,
        "the plugin's NodeUnprepareResources log line",
    )


def _exists(admin: ApiServerClient, path: str) -> bool:
    try:
        admin.request("GET", path)
    except NotFound:
        return False
    return True
