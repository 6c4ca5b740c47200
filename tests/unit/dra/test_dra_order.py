"""share-dra lists its GPUs in the policy's order (share_dra/order.py): kept from the claims allocated on
its node, rewritten only when the order moves."""

from __future__ import annotations

import threading

from share_core.contract import MemoryUnit
from share_core.fake import FakeKube
from share_dra.order import CLAIMS_PATH
from share_dra.order import ClaimUsage
from share_dra.order import device_index
from share_dra.order import policy_order
from share_dra.publisher import SlicePublisher
from share_node.backend import Gpu
from share_placement import make_policy
from share_placement.draorder import DeviceOrderer
from tests.controlplane.draworkload import memory_claim
from tests.unit.dra.fakeapi import FakeDraApi
from tests.unit.scheduler.conftest import wait_until

GIB = 1024**3


def gpus() -> list[Gpu]:
    return [Gpu(i, f"GPU-{i}", "T4", 16 * GIB, i) for i in range(3)]


def allocated(name: str, pool: str, device: str, gib: int, uid: str = "") -> dict:
    claim = memory_claim("default", name, gib)
    claim["metadata"]["uid"] = uid or f"uid-{name}"
    result = {"request": "gpu", "driver": "gpushare.io", "pool": pool, "device": device}
    result["consumedCapacity"] = {"memory": f"{gib}Gi"}
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return claim


def order_of(api: FakeDraApi) -> list[str]:
    return [d["name"] for d in api.slices["n1-gpushare.io"]["spec"]["devices"]]


def test_binpack_lists_the_fullest_gpu_first_and_writes_only_when_the_order_moves() -> None:
    kicks = []
    usage = ClaimUsage("n1", MemoryUnit.GiB, DeviceOrderer(make_policy("binpack")), lambda: kicks.append(1))
    api = FakeDraApi()
    pub = SlicePublisher(api, "n1", gpus, MemoryUnit.GiB, order=policy_order("n1", usage, MemoryUnit.GiB))
    pub.sync()
    assert order_of(api) == ["gpu-0", "gpu-1", "gpu-2"]
    assert usage.apply(allocated("a", "n1", "gpu-2", 4)) is True
    assert usage.apply(allocated("elsewhere", "n2", "gpu-0", 8)) is False  # another node's claim
    assert pub.sync() is True
    assert order_of(api) == ["gpu-2", "gpu-0", "gpu-1"]  # first fit now takes the fuller GPU
    assert usage.apply(allocated("b", "n1", "gpu-2", 2)) is True
    assert pub.sync() is False  # gpu-2 is still the fullest: the order stands, nothing is written
    usage.apply(allocated("c", "n1", "gpu-1", 10))
    pub.sync()
    assert order_of(api) == ["gpu-1", "gpu-2", "gpu-0"]
    usage.apply(allocated("c", "n1", "gpu-1", 10), deleted=True)
    pub.sync()
    assert order_of(api) == ["gpu-2", "gpu-0", "gpu-1"]
    assert len(api.writes) == 4


def test_the_watch_keeps_usage_and_learns_the_sizes_asked() -> None:
    kube = FakeKube()
    kube.put_object(CLAIMS_PATH, allocated("a", "n1", "gpu-0", 4))
    kube.put_object(CLAIMS_PATH, memory_claim("default", "pending", 6) | {"metadata": {"name": "pending", "uid": "u"}})
    changed = threading.Event()
    usage = ClaimUsage("n1", MemoryUnit.GiB, DeviceOrderer(make_policy("frag")), changed.set)
    stop = threading.Event()
    t = threading.Thread(target=usage.run, args=(kube, stop), daemon=True)
    t.start()
    try:
        wait_until(usage.synced.is_set, what="the first list")
        assert usage.used(gpus()) == {0: 4 << 10}
        assert usage.orderer.sizes == {4: 1, 6: 1}
        wait_until(lambda: kube._watchers, what="the watch")
        changed.clear()
        kube.put_object(CLAIMS_PATH, allocated("b", "n1", "gpu-1", 6))
        wait_until(changed.is_set, what="a kick")
        assert usage.used(gpus()) == {0: 4 << 10, 1: 6 << 10}
    finally:
        stop.set()
        kube.close_watches()
        t.join(5)


def test_device_names_back_to_indices() -> None:
    assert (device_index("gpu-3"), device_index("gpu-x"), device_index("other-1")) == (3, None, None)
