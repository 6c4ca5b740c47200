"""Device plugin figures: Allocate latency with 200 pods on the node, and ListAndWatch message sizes.

Allocate goes through the real gRPC path (kubelet stand-in -> unix socket -> plugin -> PodResources ->
FakeKube), so the figure covers the plugin's own work, not an API server's latency.
Run: python bench/bench_plugin.py
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from share_core.assignment import Assignment
from share_core.contract import RESOURCE_MEM
from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_node.backend import Gpu
from share_node.backend.sim import SimBackend
from share_node.backend.sim import sim_uuid
from share_plugin.allocator import Allocator
from share_plugin.devices import KUBELET_MAX_RECV_BYTES
from share_plugin.devices import device_list
from share_plugin.node import PluginNode
from share_plugin.podresources import PodResourcesClient
from share_plugin.server import DevicePlugin
from share_plugin.server import PluginConfig
from tests.kubelet import KubeletStandIn

NODE = "bench"


def message_sizes() -> None:
    print(f"ListAndWatch message size (kubelet accepts {KUBELET_MAX_RECV_BYTES / 2**20:.0f} MiB):")
    for label, count, gib in (("8 x 80 GiB (A100/H100)", 8, 80), ("8 x 141 GiB (H200)", 8, 141)):
        gpus = [Gpu(i, sim_uuid(NODE, i), "x", gib * 2**30, i) for i in range(count)]
        for unit in (MemoryUnit.GiB, MemoryUnit.MiB):
            resp = device_list(gpus, unit)
            size = resp.ByteSize()
            verdict = "fits" if size <= KUBELET_MAX_RECV_BYTES else "TOO LARGE: plugin refuses to start"
            print(
                f"  {label:24s} {unit.value}: {len(resp.devices):>8d} devices  {size:>11,d} bytes "
                f"({size / 2**20:6.2f} MiB, {size / len(resp.devices):.0f} B/device)  {verdict}"
            )


def allocate_latency(n_pods: int = 200) -> None:
    d = tempfile.mkdtemp(prefix="gsb", dir="/tmp")
    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE}})
    backend = SimBackend("8xA100:80GiB", NODE)  # 640 GiB: 200 pods of 1-5 GiB fit
    kubelet = KubeletStandIn(f"{d}/dp", f"{d}/pr.sock")
    kubelet.start()
    unit = MemoryUnit.GiB
    node = PluginNode(NODE, kube, backend, unit)
    alloc = Allocator(node, PodResourcesClient(f"{d}/pr.sock", RESOURCE_MEM))
    plugin = DevicePlugin(node, PluginConfig(f"{d}/dp", health_check=False), alloc)
    plugin.start()
    kubelet.wait_for(lambda: bool(kubelet.devices), 10, "devices")
    try:
        pods = []
        free = [80] * 8
        for i in range(n_pods):
            size = 1 + i % 3
            gpu = max(range(8), key=lambda g: free[g])
            free[gpu] -= size
            a = Assignment((gpu,), (backend.gpus()[gpu].uuid,), size, 1_000 + i)
            pods.append(
                kube.add_pod(
                    {
                        "metadata": {"name": f"p{i:03d}", "namespace": "default", "annotations": a.to_annotations()},
                        "spec": {
                            "nodeName": NODE,
                            "containers": [{"name": "m", "resources": {"limits": {RESOURCE_MEM: str(size)}}}],
                        },
                    }
                )
            )
        times = []
        for pod in pods:
            t0 = time.perf_counter()
            kubelet.admit(pod)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        print(f"Allocate latency, {n_pods} pods bound to the node (admitted one by one; the last sees {n_pods} pods):")
        print(
            f"  median {statistics.median(times):.2f} ms  p90 {times[int(len(times) * 0.9)]:.2f} ms  "
            f"max {times[-1]:.2f} ms  first10 {statistics.mean(times[:10]):.2f} ms"
        )
        print("  (per Allocate: one pod list from the API server, one PodResources List over the unix socket)")
    finally:
        plugin.stop()
        kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    message_sizes()
    allocate_latency()
