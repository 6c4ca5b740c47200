"""`kubectl inspect gpushare` against pods the real kube-scheduler and our extender placed."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_inspect.cli import main as inspect_main
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import pod_spec

pytestmark = pytest.mark.integration


def _inspect(cluster: GpuCluster, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = inspect_main(["--kubeconfig", str(cluster.cp.admin_kubeconfig), *args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_inspect_shows_what_the_scheduler_placed(gpu_cluster: GpuCluster, ns: str) -> None:
    gpu_cluster.add_node(f"{ns}-a", "2xA100:80GiB")
    gpu_cluster.add_node(f"{ns}-b", "4xT4:16GiB")
    specs = [
        pod_spec("i-big", 40, ns),
        pod_spec("i-two", 16, ns, gpu_count=2),
        pod_spec("i-t4", 6, ns, model="t4"),
        pod_spec("i-multi", [1, 2], ns),
    ]
    for spec in specs:
        gpu_cluster.create_pod(spec)
    gpu_cluster.wait_all_running(ns, len(specs))
    gpu_cluster.create_pod(pod_spec("i-done", 4, ns))
    gpu_cluster.wait_phase(ns, "i-done", ["Running"])
    gpu_cluster.finish_pod(ns, "i-done")  # finished pods must not count

    code, out, err = _inspect(gpu_cluster, "-o", "json")
    assert code == 0, err
    report = json.loads(out)
    nodes = {n["name"]: n for n in report["nodes"] if n["name"].startswith(ns)}
    assert set(nodes) == {f"{ns}-a", f"{ns}-b"}

    expected: dict[tuple[str, int], int] = {}
    for pod in gpu_cluster.pods(ns):
        if pod["status"]["phase"] != "Running":
            continue
        a = parse_assignment(pod_annotations(pod))
        listed = {p["name"]: p for p in nodes[pod["spec"]["nodeName"]]["pods"]}
        assert pod["metadata"]["name"] in listed, pod["metadata"]["name"]
        assert sorted(g["index"] for g in listed[pod["metadata"]["name"]]["gpus"]) == sorted(a.gpu_indices)
        for i in a.gpu_indices:
            key = (pod["spec"]["nodeName"], i)
            expected[key] = expected.get(key, 0) + a.per_gpu
    assert all("i-done" not in {p["name"] for p in n["pods"]} for n in nodes.values())
    for name, node in nodes.items():
        for gpu in node["gpus"]:
            assert gpu["allocated"] == expected.get((name, gpu["index"]), 0), (name, gpu)
        assert node["allocated"] == sum(g["allocated"] for g in node["gpus"])
    assert sum(n["allocated"] for n in nodes.values()) == 40 + 16 + 6 + 3

    code, out, _ = _inspect(gpu_cluster, f"{ns}-a", f"{ns}-b")
    assert code == 0
    assert "Allocated/Total GPU Memory In Cluster:" in out
    assert "65/224" in out  # 2x80 + 4x16 GiB, 65 GiB placed

    code, out, _ = _inspect(gpu_cluster, "-d", f"{ns}-b")
    assert code == 0 and "i-t4" in out and ns in out


def test_console_script_runs_as_a_kubectl_plugin(gpu_cluster: GpuCluster, ns: str) -> None:
    """kubectl finds `kubectl-inspect-gpushare` on PATH: `kubectl inspect gpushare` works."""
    gpu_cluster.add_node(f"{ns}-k", "1xT4:16GiB")
    bin_dir = gpu_cluster.workdir / "plugin-bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "kubectl-inspect-gpushare"
    installed = shutil.which("kubectl-inspect-gpushare")
    # The installed console script when the package is installed, else a shim to the same entry point.
    script.write_text(f'#!/bin/sh\nexec {installed or sys.executable + " -m share_inspect"} "$@"\n')
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KUBECONFIG": str(gpu_cluster.cp.admin_kubeconfig)}
    kubectl = str(gpu_cluster.cp.binary("kubectl"))
    result = subprocess.run(
        [kubectl, "inspect", "gpushare", f"{ns}-k"], capture_output=True, text=True, env=env, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert f"{ns}-k" in result.stdout and "0/16" in result.stdout


def test_inspect_without_permission_names_the_verb(gpu_cluster: GpuCluster) -> None:
    nobody = gpu_cluster.cp.kubeconfig_for("nobody")
    out, err = io.StringIO(), io.StringIO()
    code = inspect_main(["--kubeconfig", str(nobody)], stdout=out, stderr=err)
    assert code == 4
    assert "list" in err.getvalue() and ("nodes" in err.getvalue() or "pods" in err.getvalue())
