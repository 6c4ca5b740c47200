"""Integration fixtures: a real control plane (hack/build-k8s.sh), one per session."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
from collections.abc import Generator
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controlplane import ControlPlane
from tests.controlplane.binaries import BUILD_SCRIPT
from tests.controlplane.binaries import k8s_bin_dir as find_k8s_bin_dir
from tests.controlplane.gpucluster import GpuCluster
from tests.node import RealNode

_deselected_notes: list[str] = []


def release_under_test() -> str:
    """The Kubernetes release the integration tier runs against, without building it: the built
    kube-apiserver's version when GPUSHARE_K8S_BIN_DIR names one, else hack/build-k8s.sh --version."""
    preset = os.environ.get("GPUSHARE_K8S_BIN_DIR")
    argv = [str(Path(preset) / "kube-apiserver"), "--version"] if preset else [str(BUILD_SCRIPT), "--version"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    m = re.search(r"v\d+\.\d+\.\d+\S*", out)
    if not m:
        raise RuntimeError(f"{' '.join(argv)} printed no version: {out!r}")
    return m.group(0)


def _minor(text: str) -> tuple[int, int]:
    major, minor = text.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect tests marked `k8s_min("1.N", "why")` on an older release (1.33 under `hack/test-matrix.sh --oldest`
    for the DRA tests), loudly: the run's header and summary name them and why. A deselect, not a skip: the
    matrix counts a skip as a failure, and these tests cannot pass there."""
    marked = [(i, list(i.iter_markers("k8s_min"))) for i in items]
    marked = [(i, ms) for i, ms in marked if ms]
    if not marked:
        return
    version = release_under_test()
    have = _minor(version)
    out: dict[str, list[pytest.Item]] = {}
    for item, marks in marked:
        unmet = sorted((_minor(m.args[0]), m.args[0], m.args[1] if len(m.args) > 1 else "") for m in marks)
        unmet = [u for u in unmet if have < u[0]]
        if unmet:  # the most basic requirement it lacks is the reason
            _, want, why = unmet[0]
            out.setdefault(f"Kubernetes {version} < {want}: {why}", []).append(item)
    if not out:
        return
    dropped = {id(i) for group in out.values() for i in group}
    items[:] = [i for i in items if id(i) not in dropped]
    for reason, group in out.items():
        config.hook.pytest_deselected(items=group)
        names = ", ".join(i.name for i in group)
        _deselected_notes.append(f"deselected {len(group)} tests ({reason}): {names}")


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    return list(_deselected_notes)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for note in _deselected_notes:
        terminalreporter.write_line(note, yellow=True, bold=True)


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """Bin dir of the upstream binaries; builds them on first use (slow, cached).

    GPUSHARE_K8S_BIN_DIR points at an already built dir and skips the script.
    """
    return find_k8s_bin_dir()


@pytest.fixture(scope="session")
def control_plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on loopback for the whole session; stopped at the end."""
    with ControlPlane(tmp_path_factory.mktemp("controlplane"), k8s_bin_dir) as cp:
        yield cp


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
    funcargs = getattr(item, "funcargs", {})
    # tests/integration/test_dra.py, test_realkubelet_dra.py
    dra = funcargs.get("dra_cluster") or funcargs.get("dra_real")
    if report.failed and dra is not None:
        report.sections.append(("control plane, node and share-dra logs", dra.logs()))
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
    gpu_cluster.ensure_extender()  # one that a test stopped, or that died, fails no later test
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
