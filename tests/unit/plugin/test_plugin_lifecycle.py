"""Registration, the device list, health changes, kubelet restarts: through the real v1beta1 protocol."""

from __future__ import annotations

import os
import time

from share_core.contract import ANN_NODE_GPUS
from share_core.contract import DEVICE_PLUGIN_API_VERSION
from share_core.contract import RESOURCE_COUNT
from share_core.contract import device_id
from share_core.gpus import parse_node_gpus
from tests.unit.plugin.simnode import NODE
from tests.unit.plugin.simnode import start_node
from tests.unit.plugin.simnode import stop_node


def test_registers_and_lists_64_devices_for_4_t4(sim_node):
    k = sim_node.kubelet
    assert k.registrations == 1 and k.endpoint == "gpushare.sock"
    assert DEVICE_PLUGIN_API_VERSION == "v1beta1"
    assert len(k.devices) == 64
    assert set(k.devices.values()) == {"Healthy"}
    expected = {device_id(sim_node.uuid(i), n) for i in range(4) for n in range(16)}
    assert set(k.devices) == expected
    assert all(len(i) <= 63 for i in k.devices)


def test_publishes_node_annotation_and_gpu_count(sim_node):
    kube = sim_node.kube
    deadline = time.monotonic() + 5
    while ANN_NODE_GPUS not in kube.nodes[NODE]["metadata"].get("annotations", {}) and time.monotonic() < deadline:
        time.sleep(0.02)
    gpus = parse_node_gpus(kube.nodes[NODE]["metadata"]["annotations"][ANN_NODE_GPUS])
    assert [(g.index, g.memory, g.healthy, g.model) for g in gpus] == [(i, 16, True, "Tesla T4") for i in range(4)]
    assert [g.uuid for g in gpus] == [sim_node.uuid(i) for i in range(4)]
    deadline = time.monotonic() + 5
    while RESOURCE_COUNT not in kube.nodes[NODE]["status"]["capacity"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube.nodes[NODE]["status"]["capacity"][RESOURCE_COUNT] == "4"


def test_health_change_resends_list_and_marks_node_annotation(sim_node):
    k, kube = sim_node.kubelet, sim_node.kube
    updates = k.updates
    sim_node.backend.set_health(2, False)
    k.wait_for(lambda: k.updates > updates, 5, "ListAndWatch resend")
    bad = {i for i, h in k.devices.items() if h == "Unhealthy"}
    assert bad == {device_id(sim_node.uuid(2), n) for n in range(16)}
    assert len(k.healthy_devices()) == 48

    def annotated_unhealthy() -> bool:
        raw = kube.nodes[NODE]["metadata"].get("annotations", {}).get(ANN_NODE_GPUS)
        return bool(raw) and not parse_node_gpus(raw)[2].healthy

    deadline = time.monotonic() + 5
    while not annotated_unhealthy() and time.monotonic() < deadline:
        time.sleep(0.02)
    gpus = parse_node_gpus(kube.nodes[NODE]["metadata"]["annotations"][ANN_NODE_GPUS])
    assert [g.healthy for g in gpus] == [True, True, False, True]

    sim_node.backend.set_health(sim_node.uuid(2), True)
    k.wait_for(lambda: len(k.healthy_devices()) == 64, 5, "GPU 2 healthy again")


def test_health_file_marks_gpu_unhealthy_across_processes(tmp_path):
    node = start_node()
    try:
        hf = tmp_path / "unhealthy"
        node.backend.health_file = str(hf)
        hf.write_text(f"# written by another process\n{node.uuid(1)}\n")
        node.kubelet.wait_for(lambda: len(node.kubelet.healthy_devices()) == 48, 5, "health file read")
        hf.write_text("")
        node.kubelet.wait_for(lambda: len(node.kubelet.healthy_devices()) == 64, 5, "health file cleared")
    finally:
        stop_node(node)


def test_kubelet_restart_reregisters_within_seconds(sim_node):
    k = sim_node.kubelet
    took = k.restart(timeout=10)
    assert took < 5, f"re-registration took {took:.1f}s"
    assert k.registrations == 2 and len(k.healthy_devices()) == 64
    assert os.path.exists(os.path.join(k.plugin_dir, "gpushare.sock"))
    took = k.restart(timeout=10)  # and again
    assert took < 5 and k.registrations == 3


def test_socket_removed_alone_is_served_again(sim_node):
    k = sim_node.kubelet
    os.unlink(os.path.join(k.plugin_dir, "gpushare.sock"))
    k.wait_for(lambda: k.registrations == 2, 5, "re-registration after socket removal")
    assert os.path.exists(os.path.join(k.plugin_dir, "gpushare.sock"))


def test_stop_removes_socket(sim_node):
    path = sim_node.plugin.config.socket_path
    assert os.path.exists(path)
    sim_node.plugin.stop()
    assert not os.path.exists(path)
