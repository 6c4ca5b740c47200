"""The monitor's cost: one poll of a node with 8 GPUs and 100 GPU processes in 100 pods, as CPU time.

Everything but NVML and the API server is real: the nvml backend against an NVML stand-in (on a real GPU,
bench/bench_nvml_readings.py: 14 us per poll of an idle H200, 99 us with 8 CUDA processes, 782 us with 32,
driver 580), 100 `/proc/<pid>/cgroup` files read
from disk and parsed, 100 pods indexed, attribution, decisions, the metrics scrape text. The pod list is
cached between polls (as in the plugin); the figure divides the CPU time of one poll plus one Prometheus
scrape by the default interval. The issue's budget: under 2% of one core.
Run: python bench/bench_monitor.py
"""

from __future__ import annotations

import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import generate_latest

from share_core.assignment import Assignment
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_plugin.metrics import registry_for
from share_plugin.monitor import DEFAULT_INTERVAL
from share_plugin.monitor import Monitor
from share_plugin.monitor import ProcFs
from share_plugin.node import PluginNode

GPUS, PROCESSES, POLLS = 8, 100, 200
GIB = 1024**3
NODE = "bench"


class NVMLError(Exception):
    pass


def stand_in(devices: list[types.SimpleNamespace]) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nv.nvmlDeviceGetCount = lambda: len(devices)
    nv.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    nv.nvmlDeviceGetMinorNumber = lambda h: h.minor
    nv.nvmlDeviceGetUUID = lambda h: h.uuid
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * GIB, used=h.used)

    def no_mig(h: object) -> None:
        raise NVMLError("not supported")

    nv.nvmlDeviceGetMigMode = no_mig
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: h.processes
    return nv


def main() -> None:
    devices = [
        types.SimpleNamespace(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", minor=i, used=0, processes=[])
        for i in range(GPUS)
    ]
    sys.modules["pynvml"] = stand_in(devices)
    from share_node.backend.nvml import NvmlBackend

    backend = NvmlBackend()
    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE}, "status": {}})
    with tempfile.TemporaryDirectory() as proc_root:
        for n in range(PROCESSES):
            gpu = n % GPUS
            uid = f"{n:08d}-1111-2222-3333-444455556666"
            cid = f"{n:064x}"
            pid = 10000 + n
            kube.add_pod(
                {
                    "metadata": {
                        "name": f"p{n}",
                        "namespace": "bench",
                        "uid": uid,
                        "annotations": Assignment((gpu,), (devices[gpu].uuid,), 4, n, True).to_annotations(),
                    },
                    "spec": {
                        "schedulerName": SCHEDULER_NAME,
                        "nodeName": NODE,
                        "containers": [{"name": "main", "resources": {"limits": {RESOURCE_MEM: "4"}}}],
                    },
                    "status": {
                        "phase": "Running",
                        "containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}],
                    },
                }
            )
            d = Path(proc_root) / str(pid)
            d.mkdir()
            u = uid.replace("-", "_")
            (d / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope\n"
            )
            devices[gpu].processes.append(types.SimpleNamespace(pid=pid, usedGpuMemory=(2 + n % 3) * GIB))
            devices[gpu].used += (2 + n % 3) * GIB
        monitor = Monitor(PluginNode(NODE, kube, backend, MemoryUnit.GiB), proc=ProcFs(proc_root))
        registry = registry_for(monitor)
        monitor.poll_once()  # first poll lists the pods; later ones use the cache, as in the plugin
        assert len(monitor.snapshot.usage.containers) == PROCESSES  # type: ignore[union-attr]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(POLLS):
            monitor.poll_once()
            generate_latest(registry)
        cpu = (time.process_time() - cpu0) / POLLS
        wall = (time.perf_counter() - wall0) / POLLS
    share = cpu / DEFAULT_INTERVAL * 100
    print(f"monitor poll, {GPUS} GPUs, {PROCESSES} processes in {PROCESSES} pods, plus one /metrics scrape:")
    print(f"  {cpu * 1000:.2f} ms CPU ({wall * 1000:.2f} ms wall) per poll")
    print(f"  at the default interval of {DEFAULT_INTERVAL:.0f} s: {share:.3f}% of one core (budget: 2%)")
    if share >= 2.0:
        raise SystemExit("over budget")


if __name__ == "__main__":
    main()
