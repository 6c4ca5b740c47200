"""Device list strategies, MIG instances published and republished, and MPS mode's Allocate, through the plugin's
gRPC Allocate as kubelet calls it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from share_core.contract import ANN_NODE_GPUS
from share_core.contract import DeviceListStrategy
from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_core.gpus import parse_node_gpus
from share_core.retry import Backoff
from share_node.backend.nvml import NvmlBackend
from share_plugin.allocator import AllocateOptions
from share_plugin.allocator import Allocator
from share_plugin.devices import gpu_infos
from share_plugin.node import PluginNode
from share_plugin.publisher import Publisher
from share_plugin.server import DevicePlugin
from share_plugin.server import PluginConfig
from tests.kubelet.standin import AdmissionError
from tests.unit.plugin.simnode import make_pod
from tests.unit.plugin.simnode import start_node
from tests.unit.plugin.simnode import stop_node
from tests.unit.plugin.test_plugin_nvml import FakeDevice
from tests.unit.plugin.test_plugin_nvml import fake_pynvml
from tests.unit.plugin.test_plugin_nvml import mig_a100

GIB = 1024**3


def admit(node, name: str, units: int, gpu: int):  # type: ignore[no-untyped-def]
    p = node.add(make_pod(name, [("m", units)]), [gpu], units, 1)
    env = node.kubelet.admit(p)["m"]
    return env, node.kubelet.dm.responses[(p["metadata"]["uid"], "m")]


def test_envvar_is_the_default() -> None:
    node = start_node("2xT4:16GiB")
    try:
        env, resp = admit(node, "e", 4, 1)
        assert env["NVIDIA_VISIBLE_DEVICES"] == node.uuid(1)
        assert list(resp.mounts) == [] and list(resp.cdi_devices) == []
    finally:
        stop_node(node)


def test_volume_mounts_list_the_gpu_as_mounts_from_dev_null() -> None:
    node = start_node("2xT4:16GiB", device_list_strategy="volume-mounts")
    try:
        env, resp = admit(node, "v", 4, 1)
        # the toolkit reads the mounts, not the env a pod could set (NVIDIA k8s-device-plugin does the same)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
        assert [(m.container_path, m.host_path, m.read_only) for m in resp.mounts] == [
            (f"/var/run/nvidia-container-devices/{node.uuid(1)}", "/dev/null", True)
        ]
        assert env["GPUSHARE_MEM_LIMIT_MIB"] == "4096" and env["GPUSHARE_GPU_INDEX"] == "1"  # our env stays
        assert list(resp.cdi_devices) == []
    finally:
        stop_node(node)


def test_cdi_cri_names_the_devices_and_sets_no_device_env() -> None:
    node = start_node("2xT4:16GiB", device_list_strategy="cdi-cri", strategy="index")
    try:
        env, resp = admit(node, "c", 2, 1)
        assert [d.name for d in resp.cdi_devices] == ["nvidia.com/gpu=1"]
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        assert env["GPUSHARE_MEM_LIMIT_MIB"] == "2048"
        assert list(resp.mounts) == []
    finally:
        stop_node(node)


def test_mps_mounts_the_pipe_dir_and_sets_the_pinned_limit() -> None:
    node = start_node("2xT4:16GiB", mps=True)
    try:
        env, resp = admit(node, "m", 3, 0)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{node.dir}/mps"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
        assert [(m.container_path, m.host_path, m.read_only) for m in resp.mounts] == [
            (f"{node.dir}/mps", f"{node.dir}/mps", False)
        ]
    finally:
        stop_node(node)


def test_mps_daemon_down_refuses_allocate_with_the_reason() -> None:
    node = start_node("2xT4:16GiB", mps=True, mps_daemon=False)
    try:
        p = node.add(make_pod("down", [("m", 2)]), [0], 2, 1)
        with pytest.raises(AdmissionError, match="MPS control daemon is not running"):
            node.kubelet.admit(p)
        assert node.kube.pods[("default", "down")]["metadata"]["annotations"]["gpushare.io/assigned"] == "false"
    finally:
        stop_node(node)


def test_mps_daemon_that_exited_is_not_trusted_for_its_socket() -> None:
    """The daemon's socket outlives it; a client would run without MPS and without the hard limit."""
    node = start_node("2xT4:16GiB", mps=True)
    try:
        assert node.mps_daemon is not None
        node.mps_daemon.close()  # the daemon exits: its socket file stays
        p = node.add(make_pod("stale", [("m", 2)]), [0], 2, 1)
        with pytest.raises(AdmissionError, match=r"MPS control daemon is not running .*no daemon listens"):
            node.kubelet.admit(p)
        assert node.kube.pods[("default", "stale")]["metadata"]["annotations"]["gpushare.io/assigned"] == "false"
    finally:
        stop_node(node)


def test_mig_instances_are_published_and_a_new_layout_republished(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    whole = FakeDevice("GPU-aaaaaaaa-0000-0000-0000-000000000000", "Tesla T4", 16 * GIB, 0)
    a100, (m1, m2) = mig_a100("cccccccc", 40, 1, [True, True])
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([whole, a100]))
    backend = NvmlBackend()
    kube = FakeKube()
    kube.add_node({"metadata": {"name": "n1"}, "status": {"capacity": {}}})
    publisher = Publisher("n1", kube, Backoff(initial=0.01, maximum=0.05))
    node = PluginNode("n1", kube, backend, MemoryUnit.GiB)
    allocator = Allocator(node, None)
    plugin = DevicePlugin(node, PluginConfig(str(tmp_path), health_check=False), allocator, publisher)
    publisher.start()
    try:
        assert len(plugin.devices().devices) == 16 + 20 + 20
        assert {d.ID.rpartition("-_-")[0] for d in plugin.devices().devices} == {whole.uuid, m1.uuid, m2.uuid}
        publisher.publish_once(gpu_infos(backend.gpus(), MemoryUnit.GiB))
        gpus = parse_node_gpus(kube.nodes["n1"]["metadata"]["annotations"][ANN_NODE_GPUS])
        assert [(g.index, g.uuid, g.model, g.memory, g.parent) for g in gpus] == [
            (0, whole.uuid, "Tesla T4", 16, ""),
            (1, m1.uuid, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20, a100.uuid),
            (2, m2.uuid, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20, a100.uuid),
        ]
        assert plugin.refresh_inventory() is False  # nothing changed: nothing sent
        # the operator turns MIG off on the A100: it is offered whole again and republished
        a100.mig_enabled = False
        assert plugin.refresh_inventory() is True
        assert len(plugin.devices().devices) == 16 + 40
        done = threading.Event()
        for _ in range(100):
            raw = kube.nodes["n1"]["metadata"]["annotations"][ANN_NODE_GPUS]
            if a100.uuid in raw and m1.uuid not in raw:
                done.set()
                break
            threading.Event().wait(0.05)
        assert done.is_set()
        gpus = parse_node_gpus(kube.nodes["n1"]["metadata"]["annotations"][ANN_NODE_GPUS])
        assert [(g.index, g.uuid, g.memory, g.parent) for g in gpus] == [
            (0, whole.uuid, 16, ""),
            (1, a100.uuid, 40, ""),
        ]
    finally:
        publisher.stop()


def test_mig_instance_by_index_uses_the_toolkit_gpu_colon_mig_form() -> None:
    from share_node.backend import Gpu
    from share_node.env import visible_ids

    g = Gpu(1, "MIG-x", "A100 MIG 1g.10gb", 10 * GIB, 1, device="1:0", parent_uuid="GPU-y")
    assert visible_ids([g], "index") == ["1:0"] and visible_ids([g], "uuid") == ["MIG-x"]


def test_allocate_options_refuse_an_unknown_device_list_strategy() -> None:
    with pytest.raises(ValueError, match=r"'annotations': expected one of envvar, volume-mounts, cdi-cri"):
        AllocateOptions(device_list_strategy="annotations")
    assert AllocateOptions(device_list_strategy="cdi-cri").device_list_strategy == DeviceListStrategy.CDI_CRI
