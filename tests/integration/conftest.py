"""Integration fixtures: a real control plane (hack/build-k8s.sh), one per session."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.controlplane import ControlPlane
from tests.controlplane.binaries import k8s_bin_dir as find_k8s_bin_dir
from tests.controlplane.gpucluster import GpuCluster
from tests.node import RealNode


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """Bin dir of the upstream binaries; builds them on first use (slow, cached).

    GPUSHARE_K8S_BIN_DIR points at an already built dir and skips the script.
    """
    return find_k8s_bin_dir()


@pytest.fixture(scope="session")
def control_plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on loopback for the whole session; stopped at the end."""
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane"), k8s_bin_dir)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """Attach control-plane log tails to a failed test that used the control plane."""
    outcome = yield
    report = outcome.get_result()
    cp = getattr(item, "funcargs", {}).get("control_plane")
    if report.failed and isinstance(cp, ControlPlane):
        report.sections.append(("control plane logs", cp.logs()))
    cluster = getattr(item, "funcargs", {}).get("gpu_cluster")
    if report.failed and isinstance(cluster, GpuCluster):
        report.sections.append(("gpushare process logs", cluster.logs(80)))
    node = getattr(item, "funcargs", {}).get("real_node")
    if report.failed and isinstance(node, RealNode):
        report.sections.append(("real node logs (kubelet, containerd)", node.logs(80)))


_names = itertools.count()


@pytest.fixture(scope="session")
def gpu_cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuCluster]:
    cluster = GpuCluster(control_plane, tmp_path_factory.mktemp("gpucluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ns(gpu_cluster: GpuCluster) -> Iterator[str]:
    """A namespace of its own per test; its nodes and pods are removed afterwards."""
    name = f"e2e-{next(_names)}"
    if gpu_cluster.cp.scheduler is None:  # a test of the bare control plane stopped ours
        gpu_cluster.start_scheduler()
    gpu_cluster.create_namespace(name)
    yield name
    for node in list(gpu_cluster.nodes):
        gpu_cluster.remove_node(node)
    for pod in gpu_cluster.pods(name):
        gpu_cluster.admin.request(
            "DELETE", f"/api/v1/namespaces/{name}/pods/{pod['metadata']['name']}", query={"gracePeriodSeconds": 0}
        )


@pytest.fixture(scope="session")
def real_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """One real node (containerd + runc + upstream kubelet, tests/node) for the session, Ready.

    Needs root and hack/node-deps.sh; images come from hack/build-node-images.sh (never pulled).
    """
    node = RealNode(control_plane, "realnode-0", tmp_path_factory.mktemp("realnode"))
    node.start()
    try:
        yield node
    finally:
        node.stop()
