"""The real `share-plugin` entry point as a process: unreachable API server, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.kubelet import KubeletStandIn
from tests.unit.plugin.simnode import _short_dir

REPO = Path(__file__).resolve().parents[3]


def unreachable_kubeconfig(d: str) -> str:
    path = os.path.join(d, "kubeconfig")
    Path(path).write_text(
        """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
    )
    return path


def test_unreachable_api_server_still_registers_64_devices_then_sigterm_cleans_up():
    d = _short_dir()
    kubelet = KubeletStandIn(f"{d}/dp", f"{d}/pr.sock")
    kubelet.start()
    cmd = [
        sys.executable, "-m", "share_plugin",
        "--backend", "sim", "--sim-gpus", "4xT4:16GiB", "--node-name", "n1",
        "--device-plugin-dir", f"{d}/dp", "--kubeconfig", unreachable_kubeconfig(d),
        "--pod-resources-socket", f"{d}/pr.sock",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        kubelet.wait_for(lambda: len(kubelet.devices) == 64, 15, "64 devices from the plugin process")
        took = time.monotonic() - t0
        assert took < 10, f"registration took {took:.1f}s"
        assert set(kubelet.devices.values()) == {"Healthy"}
        assert os.path.exists(f"{d}/dp/gpushare.sock")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
        kubelet.stop()
    assert proc.returncode == 0, out
    assert not os.path.exists(f"{d}/dp/gpushare.sock")
    assert "registered nvidia.com/gpu-mem with kubelet" in out
    assert "publishing 4 GPUs to the API server failed, will retry" in out  # kept trying in the background
    assert "socket" in out and "removed" in out


def test_too_many_mib_devices_is_a_clear_startup_error():
    d = _short_dir()
    cmd = [
        sys.executable, "-m", "share_plugin", "--backend", "sim", "--sim-gpus", "8xH200:141GiB",
        "--memory-unit", "MiB", "--node-name", "n1", "--device-plugin-dir", f"{d}/dp",
        "--kubeconfig", unreachable_kubeconfig(d),
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "over kubelet's gRPC receive limit of 4 MiB" in out.stderr
    assert "use --memory-unit GiB" in out.stderr


def test_missing_node_name_is_refused():
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    out = subprocess.run(
        [sys.executable, "-m", "share_plugin", "--backend", "sim"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert out.returncode == 2 and "--node-name" in out.stderr
