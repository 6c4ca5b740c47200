"""Keeping the node's ResourceSlice in step with its GPUs (share_dra/publisher.py), against an in-memory API."""

from __future__ import annotations

import threading

from share_core.contract import MemoryUnit
from share_dra.publisher import SlicePublisher
from share_node.backend import Gpu
from tests.unit.dra.fakeapi import FakeDraApi

GIB = 1024**3


class Gpus:
    def __init__(self) -> None:
        self.gpus = [Gpu(0, "GPU-a", "T4", 16 * GIB, 0), Gpu(1, "GPU-b", "T4", 16 * GIB, 1)]

    def __call__(self) -> list[Gpu]:
        return list(self.gpus)

    def set_healthy(self, index: int, healthy: bool) -> None:
        g = self.gpus[index]
        self.gpus[index] = Gpu(g.index, g.uuid, g.model, g.memory_bytes, g.minor, healthy)


def test_publishes_once_then_writes_only_on_a_change() -> None:
    api, gpus = FakeDraApi(), Gpus()
    pub = SlicePublisher(api, "n1", gpus, MemoryUnit.GiB)
    assert pub.sync() is True
    assert pub.sync() is False
    assert api.writes == ["create n1-gpushare.io"]
    gpus.set_healthy(1, False)
    assert pub.sync() is True
    s = api.slices["n1-gpushare.io"]
    assert [d["name"] for d in s["spec"]["devices"]] == ["gpu-0"]
    assert s["spec"]["pool"]["generation"] == 2
    gpus.set_healthy(1, True)
    pub.sync()
    assert len(api.slices["n1-gpushare.io"]["spec"]["devices"]) == 2
    assert api.slices["n1-gpushare.io"]["spec"]["pool"]["generation"] == 3


def test_a_restart_keeps_the_generation_climbing() -> None:
    api, gpus = FakeDraApi(), Gpus()
    SlicePublisher(api, "n1", gpus).sync()
    gpus.set_healthy(0, False)
    SlicePublisher(api, "n1", gpus).sync()
    gpus.set_healthy(0, True)
    SlicePublisher(api, "n1", gpus).sync()
    assert api.slices["n1-gpushare.io"]["spec"]["pool"]["generation"] == 3


def test_stray_slices_of_this_node_are_deleted_others_kept() -> None:
    api, gpus = FakeDraApi(), Gpus()
    api.create_slice({"metadata": {"name": "n1-gpushare.io-old"}, "spec": {"nodeName": "n1", "pool": {"name": "n1"}}})
    api.create_slice({"metadata": {"name": "n2-gpushare.io"}, "spec": {"nodeName": "n2", "pool": {"name": "n2"}}})
    SlicePublisher(api, "n1", gpus).sync()
    assert sorted(api.slices) == ["n1-gpushare.io", "n2-gpushare.io"]


def test_a_conflict_is_read_again_and_retried() -> None:
    api, gpus = FakeDraApi(), Gpus()
    pub = SlicePublisher(api, "n1", gpus)
    pub.sync()
    gpus.set_healthy(0, False)
    api.conflicts_to_inject = 2
    assert pub.sync() is True
    assert [d["name"] for d in api.slices["n1-gpushare.io"]["spec"]["devices"]] == ["gpu-1"]


def test_run_syncs_on_a_kick_and_stops() -> None:
    api, gpus = FakeDraApi(), Gpus()
    pub = SlicePublisher(api, "n1", gpus)
    stop = threading.Event()
    t = threading.Thread(target=pub.run, args=(stop, 3600.0), daemon=True)
    t.start()
    deadline = threading.Event()
    while "n1-gpushare.io" not in api.slices and not deadline.wait(0.01):
        pass
    gpus.set_healthy(1, False)
    pub.kick.set()
    while len(api.slices["n1-gpushare.io"]["spec"]["devices"]) != 1 and not deadline.wait(0.01):
        pass
    assert len(api.slices["n1-gpushare.io"]["spec"]["devices"]) == 1
    stop.set()
    pub.kick.set()
    t.join(5)
    assert not t.is_alive()


def test_an_api_server_without_consumable_capacity_is_named(caplog) -> None:  # type: ignore[no-untyped-def]
    class GateOff(FakeDraApi):
        def create_slice(self, obj):  # type: ignore[no-untyped-def]
            stored = super().create_slice(obj)
            for d in stored["spec"]["devices"]:
                d.pop("allowMultipleAllocations")
                d["capacity"]["memory"].pop("requestPolicy")
            return stored

    SlicePublisher(GateOff(), "n1", Gpus()).sync()
    (msg,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "allowMultipleAllocations, capacity.requestPolicy" in msg and "DRAConsumableCapacity" in msg


def test_taint_mode_taints_and_untaints() -> None:
    api, gpus = FakeDraApi(), Gpus()
    pub = SlicePublisher(api, "n1", gpus, unhealthy="taint")
    pub.sync()
    gpus.set_healthy(0, False)
    assert pub.sync() is True
    d0, d1 = api.slices["n1-gpushare.io"]["spec"]["devices"]
    assert d0["taints"][0]["key"] == "gpushare.io/unhealthy" and "taints" not in d1
    gpus.set_healthy(0, True)
    pub.sync()
    assert all("taints" not in d for d in api.slices["n1-gpushare.io"]["spec"]["devices"])


def test_registration_kicks_a_sync_now_and_again_soon() -> None:
    pub = SlicePublisher(FakeDraApi(), "n1", Gpus())
    pub.kick_after_registration((0.0, 0.2))
    assert pub.kick.wait(1)
    pub.kick.clear()
    assert pub.kick.wait(1)  # the later one: a wipe after our first sync is repaired
