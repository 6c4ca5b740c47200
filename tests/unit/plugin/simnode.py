"""A simulated GPU node for the plugin tests: FakeKube API server, sim backend, the plugin, the kubelet stand-in.

A uniquely named module (not conftest) so `from simnode import ...` never picks up another directory's conftest.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from share_core.assignment import Assignment
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_core.retry import Backoff
from share_node.backend import GpuBackend
from share_node.backend.sim import SimBackend
from share_plugin.allocator import AllocateOptions
from share_plugin.allocator import Allocator
from share_plugin.node import PluginNode
from share_plugin.podresources import PodResourcesClient
from share_plugin.publisher import Publisher
from share_plugin.server import DevicePlugin
from share_plugin.server import PluginConfig
from tests.kubelet import KubeletStandIn

NODE = "n1"


def make_pod(
    name: str,
    containers: list[tuple[str, int]] | None = None,
    init: list[tuple[str, int]] | None = None,
    sidecars: list[tuple[str, int]] | None = None,
    gpu_count: int | None = None,
    node: str = NODE,
    namespace: str = "default",
) -> dict[str, Any]:
    """A pod asking `nvidia.com/gpu-mem` per container, bound to `node` (no assignment yet)."""

    def ctr(n: str, units: int, **extra: Any) -> dict[str, Any]:
        res = {"limits": {RESOURCE_MEM: str(units)}} if units else {}
        return {"name": n, "image": "x", "resources": res, **extra}

    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "nodeName": node,
        "containers": [ctr(n, u) for n, u in (containers or [("main", 4)])],
    }
    inits = [ctr(n, u) for n, u in (init or [])] + [ctr(n, u, restartPolicy="Always") for n, u in (sidecars or [])]
    if inits:
        spec["initContainers"] = inits
    annotations = {ANN_GPU_COUNT: str(gpu_count)} if gpu_count else {}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": annotations},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def assign(pod: dict[str, Any], indices: list[int], uuids: list[str], total: int, t: int) -> dict[str, Any]:
    pod["metadata"]["annotations"].update(Assignment(tuple(indices), tuple(uuids), total, t).to_annotations())
    return pod


@dataclass
class SimNode:
    kube: FakeKube
    backend: GpuBackend
    plugin: DevicePlugin
    kubelet: KubeletStandIn
    allocator: Allocator
    dir: str
    mps_daemon: socket.socket | None = None  # the control daemon's listening socket, in MPS mode

    def uuid(self, index: int) -> str:
        return self.backend.gpus()[index].uuid

    def add(self, pod: dict[str, Any], indices: list[int], total: int, t: int) -> dict[str, Any]:
        """Record an extender's choice on the pod and store it, as bind would."""
        return self.kube.add_pod(assign(pod, indices, [self.uuid(i) for i in indices], total, t))


def _short_dir() -> str:
    return tempfile.mkdtemp(prefix="gs", dir="/tmp")  # unix socket paths must stay under ~107 bytes


def start_node(
    gpus: str = "4xT4:16GiB",
    unit: MemoryUnit = MemoryUnit.GiB,
    pod_resources: bool = True,
    strategy: str = "uuid",
    mps: bool = False,
    health_check: bool = True,
    kube: FakeKube | None = None,
    device_list_strategy: str = "envvar",
    mps_daemon: bool = True,
    backend: GpuBackend | None = None,
    **kubelet_kw: Any,
) -> SimNode:
    """A node of `gpus` (the sim backend), or of `backend`'s GPUs (the GPU tier passes NVML's)."""
    d = _short_dir()
    daemon = None
    if mps and mps_daemon:  # the MPS control daemon's endpoint, as nvidia-cuda-mps-control (CUDA 13) listens
        daemon = listen_like_mps_control(f"{d}/mps")
    kube = kube or FakeKube()
    if NODE not in kube.nodes:
        # The version a kubelet with these PodResources semantics reports (before 1.34: every pod listed).
        version = "v1.33.13" if kubelet_kw.get("list_all_pods") else "v1.36.3"
        status = {"capacity": {}, "nodeInfo": {"kubeletVersion": version}}
        kube.add_node({"metadata": {"name": NODE, "labels": {"gpushare": "true"}}, "status": status})
    backend = backend or SimBackend(gpus, NODE, poll_interval=0.05)
    kubelet = KubeletStandIn(f"{d}/dp", f"{d}/pr/kubelet.sock", **kubelet_kw)
    kubelet.start()
    pr = PodResourcesClient(kubelet.pod_resources_socket, RESOURCE_MEM) if pod_resources else None
    options = AllocateOptions(strategy, device_list_strategy, mps, mps_pipe_dir=f"{d}/mps")
    node = PluginNode(NODE, kube, backend, unit)
    allocator = Allocator(node, pr, options)
    config = PluginConfig(device_plugin_dir=f"{d}/dp", health_check=health_check, watch_interval=0.05)
    publisher = Publisher(NODE, kube, Backoff(initial=0.05, maximum=0.2))
    plugin = DevicePlugin(node, config, allocator, publisher)
    plugin.start()
    kubelet.wait_for(lambda: bool(kubelet.devices), 10, "device list")
    return SimNode(kube, backend, plugin, kubelet, allocator, d, daemon)


def listen_like_mps_control(pipe_dir: str) -> socket.socket:
    """A SOCK_SEQPACKET listener at <pipe_dir>/control, the endpoint CUDA 13's control daemon opens (seen on
    an H100, driver 580); closing it leaves the file behind, as the daemon does when it exits."""
    os.makedirs(pipe_dir, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(f"{pipe_dir}/control")
    sock.listen(8)
    return sock


def stop_node(node: SimNode) -> None:
    if node.mps_daemon is not None:
        node.mps_daemon.close()
    node.plugin.stop()
    node.kubelet.stop()
    shutil.rmtree(node.dir, ignore_errors=True)
