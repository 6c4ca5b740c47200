"""The nvml backend on a real GPU: the inventory NVML gives us against nvidia-smi's, what the device plugin
offers kubelet from it, the processes NVML names while CUDA programs run, and XID health watching."""

from __future__ import annotations

import subprocess
import threading

from share_core.contract import ANN_NODE_GPUS
from share_core.contract import DEVICE_ID_MAX_LEN
from share_core.contract import MemoryUnit
from share_core.gpus import parse_node_gpus
from share_node.backend import Gpu
from share_node.backend.nvml import NvmlBackend
from share_plugin.devices import check_device_ids
from share_plugin.devices import device_list
from tests.gpu.conftest import GIB
from tests.gpu.conftest import MIB
from tests.gpu.conftest import SAMPLES
from tests.gpu.conftest import holding
from tests.gpu.conftest import run_python
from tests.gpu.conftest import share_env
from tests.gpu.conftest import wait_for
from tests.unit.plugin.simnode import make_pod
from tests.unit.plugin.simnode import start_node
from tests.unit.plugin.simnode import stop_node


def nvidia_smi_gpus() -> list[dict[str, str]]:
    fields = ["index", "uuid", "name", "memory.total", "mig.mode.current"]
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [dict(zip(fields, (v.strip() for v in line.split(",")), strict=True)) for line in out.splitlines() if line]


def test_inventory_is_what_nvidia_smi_reports(nvml: NvmlBackend) -> None:
    offered = {g.uuid: g for g in nvml.gpus()}
    rows = nvidia_smi_gpus()
    print("\nnvidia-smi:", rows, "\nNVML backend:", nvml.gpus(), "driver", nvml.driver_version)
    whole = [r for r in rows if r["mig.mode.current"] != "Enabled"]
    assert whole, "no GPU outside MIG mode"
    for row in whole:
        g = offered[row["uuid"]]
        assert (g.model, g.memory_mib, g.device, g.healthy) == (
            row["name"],
            int(row["memory.total"]),
            row["index"],
            True,
        )
    assert [g.index for g in nvml.gpus()] == list(range(len(offered)))  # positions on the node, in NVML order


def test_device_list_and_node_annotation_from_the_gpu(gpu: Gpu) -> None:
    """What kubelet and the extender learn of this GPU: one device per whole GiB, IDs kubelet accepts."""
    check_device_ids([gpu], MemoryUnit.GiB)
    devices = device_list([gpu], MemoryUnit.GiB).devices
    assert len(devices) == gpu.memory_bytes // GIB
    assert all(len(d.ID) <= DEVICE_ID_MAX_LEN and d.health == "Healthy" for d in devices)
    assert len(device_list([gpu], MemoryUnit.MiB).devices) == gpu.memory_mib


def test_plugin_offers_the_gpu_to_kubelet_and_allocates_a_share_a_program_holds() -> None:
    """The device plugin's gRPC server on NVML, registered with the kubelet stand-in: ListAndWatch carries the
    GPU's devices, the node annotation names it, Allocate answers with its UUID and our limit, and the PyTorch
    sample, run with exactly that env, stops at the limit."""
    node = start_node(backend=NvmlBackend())  # a handle of its own: the plugin closes it when it stops
    try:
        gpu = node.backend.gpus()[0]
        assert len(node.kubelet.devices) == gpu.memory_bytes // GIB
        assert set(node.kubelet.devices.values()) == {"Healthy"}
        published = parse_node_gpus(node.kube.nodes["n1"]["metadata"]["annotations"][ANN_NODE_GPUS])
        assert [(i.index, i.uuid, i.model, i.memory, i.healthy) for i in published] == [
            (gpu.index, gpu.uuid, gpu.model, gpu.memory_bytes // GIB, True)
        ]
        pod = node.add(make_pod("train", [("main", 4)]), [gpu.index], 4, 1)
        env = node.kubelet.admit(pod)["main"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
        assert (env["GPUSHARE_MEM_LIMIT_MIB"], env["GPUSHARE_MEM_TOTAL_MIB"]) == ("4096", str(gpu.memory_mib))
        # the NVIDIA runtime would show the container this GPU alone: CUDA_VISIBLE_DEVICES does it here
        result = run_python([str(SAMPLES / "pytorch_limit.py")], {**env, "CUDA_VISIBLE_DEVICES": gpu.uuid})
        print(result.stdout, result.stderr[-2000:])
        assert result.returncode == 0, result.stderr[-2000:]
        assert "the share holds" in result.stdout
    finally:
        stop_node(node)


def test_readings_name_each_cuda_process_and_its_memory(nvml: NvmlBackend, gpu: Gpu) -> None:
    def reading():
        return next(r for r in nvml.readings() if r.uuid == gpu.uuid)

    before = reading().used_bytes
    with holding(1024, share_env(gpu, 4096)) as small, holding(2048, share_env(gpu, 4096)) as big:
        now = reading()
        by_pid = {p.pid: p.used_bytes for p in now.processes}
        print(
            f"\nused {before // MIB} -> {now.used_bytes // MIB} MiB; processes (MiB):",
            {pid: b // MIB for pid, b in by_pid.items()},
        )
        assert by_pid[small.pid] >= 1024 * MIB and by_pid[big.pid] >= 2048 * MIB
        # what a process holds beyond its tensors is its CUDA context, the same for both
        assert abs((by_pid[big.pid] - by_pid[small.pid]) - 1024 * MIB) <= 64 * MIB
        assert now.used_bytes - before >= by_pid[small.pid] + by_pid[big.pid] - 64 * MIB
        gone = small.pid
    wait_for("NVML to drop an exited process", lambda: gone not in {p.pid for p in reading().processes})


def test_xid_events_are_watched_without_marking_a_healthy_gpu(nvml: NvmlBackend) -> None:
    changes: list[tuple[str, bool, str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=nvml.watch_health, args=(stop, lambda *c: changes.append(c)))
    watcher.start()
    stop.wait(3)
    stop.set()
    watcher.join(5)
    assert not watcher.is_alive()
    assert changes == []  # registering for XID events worked: nothing was marked unhealthy
    assert all(g.healthy for g in nvml.gpus())
    assert nvml.refresh() is False  # enumerating again finds the same GPUs
