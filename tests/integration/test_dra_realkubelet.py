"""share-dra registering with the upstream kubelet on a real node (tests/node): kubelet's plugin watcher finds
our registration socket under `<root-dir>/plugins_registry`, asks GetInfo, validates the services we offer
against its own (`v1.DRAPlugin`, pkg/kubelet/cm/dra/plugin) and tells us the outcome.

NodePrepareResources through the real kubelet and containerd v2 (CDI), the container's env and
NodeUnprepareResources: tests/integration/test_realkubelet_dra.py, which runs this plugin the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from share_core.contract import DRA_DRIVER_NAME, DRA_REGISTRATION_SOCKET_NAME
from tests.controlplane import ControlPlane
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.gpucluster import wait_for
from tests.node import RealNode

pytestmark = [
    pytest.mark.integration,
    pytest.mark.realkubelet,
    pytest.mark.k8s_min("1.34", "no resource.k8s.io/v1 and no v1.DRAPlugin in kubelet before 1.34 (DRA GA)"),
]


@pytest.fixture
def dra_plugin(control_plane: ControlPlane, real_node: RealNode) -> Iterator[ManagedProcess]:
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
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def test_kubelet_registers_the_dra_plugin(real_node: RealNode, dra_plugin: ManagedProcess) -> None:
    real_node.wait_ready()
    wait_for(
        lambda: f"kubelet registered driver {DRA_DRIVER_NAME}" in dra_plugin.log_path.read_text(),
        60,
        "kubelet's NotifyRegistrationStatus(registered) in share-dra's log",
    )
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
