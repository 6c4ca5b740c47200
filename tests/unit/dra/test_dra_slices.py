"""The ResourceSlice built from a GPU inventory (share_dra/slices.py): pure functions."""

from __future__ import annotations

import pytest

from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import MemoryUnit
from share_dra import slices
from share_node.backend import Gpu

GIB = 1024**3


def gpu(index: int, gib: int, healthy: bool = True, model: str = "Tesla T4") -> Gpu:
    return Gpu(index, f"GPU-{index:04d}", model, gib * GIB, minor=index, healthy=healthy)


def test_one_device_per_gpu_with_shared_memory_capacity() -> None:
    spec = slices.slice_spec(
        "n1", [gpu(0, 16), gpu(1, 80, model="NVIDIA A100-SXM4-80GB")], MemoryUnit.GiB, 3, "550.54.15"
    )
    assert spec["driver"] == DRA_DRIVER_NAME and spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    d0, d1 = spec["devices"]
    assert d0 == {
        "name": "gpu-0",
        "attributes": {
            "model": {"string": "Tesla T4"},
            "uuid": {"string": "GPU-0000"},
            "index": {"int": 0},
            "driverVersion": {"version": "550.54.15"},
        },
        "capacity": {
            "memory": {
                "value": "16Gi",
                "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
            }
        },
        "allowMultipleAllocations": True,
    }
    assert d1["name"] == "gpu-1" and d1["capacity"]["memory"]["value"] == "80Gi"


def test_mib_unit_steps_in_mib_and_odd_sizes_round_down() -> None:
    odd = Gpu(0, "GPU-x", "T4", 15360 * 1024**2 + 5 * 1024**2 + 17, minor=0)  # 15365 MiB and change
    (d,) = slices.slice_spec("n", [odd], MemoryUnit.MiB, 1)["devices"]
    assert d["capacity"]["memory"]["value"] == "15365Mi"
    assert d["capacity"]["memory"]["requestPolicy"] == {"default": "1Mi", "validRange": {"min": "1Mi", "step": "1Mi"}}
    (g,) = slices.slice_spec("n", [odd], MemoryUnit.GiB, 1)["devices"]
    assert g["capacity"]["memory"]["value"] == "15Gi"  # whole GiB only: never more than the GPU has


def test_unhealthy_gpus_are_withdrawn() -> None:
    spec = slices.slice_spec("n", [gpu(0, 16), gpu(1, 16, healthy=False), gpu(2, 24)], MemoryUnit.GiB, 1)
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-2"]
    assert slices.slice_spec("n", [gpu(0, 16, healthy=False)], MemoryUnit.GiB, 1)["devices"] == []


@pytest.mark.parametrize(
    ("raw", "want"),
    [("550.54.15", "550.54.15"), ("535.104.05", "535.104.5"), ("550.54", "550.54.0"), ("470", "470.0.0"),
     ("", None), ("r550", None), ("1.2.3.4", None)],
)  # fmt: skip
def test_driver_version_as_semver(raw: str, want: str | None) -> None:
    assert slices.semver(raw) == want


def test_no_driver_version_attribute_when_unknown_or_malformed() -> None:
    for version in ("", "weird"):
        (d,) = slices.slice_spec("n", [gpu(0, 16)], MemoryUnit.GiB, 1, version)["devices"]
        assert "driverVersion" not in d["attributes"]


def test_same_devices_ignores_generation_and_server_additions() -> None:
    a = slices.resource_slice(slices.slice_spec("n", [gpu(0, 16)], MemoryUnit.GiB, 1))
    b = slices.resource_slice(slices.slice_spec("n", [gpu(0, 16)], MemoryUnit.GiB, 7))
    b["spec"]["devices"][0]["somethingTheServerAdds"] = True
    assert slices.same_devices(a["spec"], b["spec"])
    c = slices.resource_slice(slices.slice_spec("n", [gpu(0, 16, healthy=False)], MemoryUnit.GiB, 1))
    assert not slices.same_devices(a["spec"], c["spec"])


def test_names_are_stable_and_dns_safe() -> None:
    obj = slices.resource_slice(slices.slice_spec("node-a", [gpu(0, 16)], MemoryUnit.GiB, 1))
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
    assert obj["metadata"]["name"] == "node-a-gpushare.io"


def test_quantity() -> None:
    assert [slices.quantity(m) for m in (1024, 81920, 1, 1536)] == ["1Gi", "80Gi", "1Mi", "1536Mi"]


def test_sharing_dropped_names_what_the_api_server_removed() -> None:
    spec = slices.slice_spec("n", [gpu(0, 16)], MemoryUnit.GiB, 1)
    assert slices.sharing_dropped(spec) == ""
    del spec["devices"][0]["allowMultipleAllocations"]
    assert slices.sharing_dropped(spec) == "allowMultipleAllocations"


def test_taint_mode_keeps_an_unhealthy_gpu_listed_with_a_noschedule_taint() -> None:
    spec = slices.slice_spec("n", [gpu(0, 16), gpu(1, 16, healthy=False)], MemoryUnit.GiB, 1, unhealthy="taint")
    d0, d1 = spec["devices"]
    assert "taints" not in d0
    assert d1["name"] == "gpu-1" and d1["taints"] == [{"key": "gpushare.io/unhealthy", "effect": "NoSchedule"}]
    healthy_again = slices.slice_spec("n", [gpu(0, 16), gpu(1, 16)], MemoryUnit.GiB, 1, unhealthy="taint")
    assert not slices.same_devices(spec, healthy_again)
    # The API server adds timeAdded: not a change.
    served = slices.slice_spec("n", [gpu(0, 16), gpu(1, 16, healthy=False)], MemoryUnit.GiB, 2, unhealthy="taint")
    served["devices"][1]["taints"][0]["timeAdded"] = "2026-11-22T23:00:00Z"
    assert slices.same_devices(spec, served)
    with pytest.raises(ValueError, match="neither withdraw nor taint"):
        slices.slice_spec("n", [gpu(0, 16)], MemoryUnit.GiB, 1, unhealthy="ignore")


def test_dropped_taints_are_named() -> None:
    wanted = slices.slice_spec("n", [gpu(0, 16, healthy=False)], MemoryUnit.GiB, 1, unhealthy="taint")
    served = slices.slice_spec("n", [gpu(0, 16)], MemoryUnit.GiB, 1)
    assert slices.sharing_dropped(served, wanted) == "taints (DRADeviceTaints)"
    assert slices.sharing_dropped(wanted, wanted) == ""
