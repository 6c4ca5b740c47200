"""A claim's allocation and the CDI spec made of it (share_dra/claims.py): pure functions."""

from __future__ import annotations

import pytest

from share_core.contract import ENV_ALIYUN_POD
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_VISIBLE_DEVICES
from share_core.contract import MemoryUnit
from share_dra.claims import AllocatedDevice
from share_dra.claims import ClaimError
from share_dra.claims import allocated_devices
from share_dra.claims import nvidia_cdi_names
from share_dra.claims import prepare
from share_dra.claims import quantity_bytes
from share_node.env import gpu_env
from tests.unit.dra.fakeapi import allocated_claim
from tests.unit.dra.node import GIB
from tests.unit.dra.node import GPUS


def env_of(device: dict) -> dict[str, str]:
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


@pytest.mark.parametrize(
    ("text", "n"),
    [("8Gi", 8 * GIB), ("8589934592", 8 * GIB), ("1536Mi", 1536 * 1024**2), ("1G", 10**9), ("0.5Gi", GIB // 2),
     ("1500m", 2), ("1e3", 1000)],
)  # fmt: skip
def test_quantity_bytes(text: str, n: int) -> None:
    assert quantity_bytes(text) == n


@pytest.mark.parametrize("bad", ["", "Gi", "8 Gi", "8GB", "abc"])
def test_quantity_bytes_refuses_nonsense(bad: str) -> None:
    with pytest.raises(ClaimError, match="not a Kubernetes quantity"):
        quantity_bytes(bad)


def test_allocated_devices_reads_our_results_on_this_node() -> None:
    claim = allocated_claim("ns", "c", "u1", [("n1", "gpu-1", "8Gi"), ("n1", "gpu-0", None)])
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "other.example.com", "pool": "elsewhere", "device": "x"}
    )
    assert allocated_devices(claim, "n1") == [
        AllocatedDevice("gpu", "n1", "gpu-1", 8192, "share-0"),
        AllocatedDevice("gpu", "n1", "gpu-0", None, "share-1"),
    ]


def test_allocated_devices_errors_say_what_is_wrong() -> None:
    with pytest.raises(ClaimError, match="not allocated"):
        allocated_devices({"metadata": {"namespace": "ns", "name": "c"}, "status": {}}, "n1")
    with pytest.raises(ClaimError, match="pool 'n2', not this node's"):
        allocated_devices(allocated_claim("ns", "c", "u", [("n2", "gpu-0", "1Gi")]), "n1")
    with pytest.raises(ClaimError, match=r"no device of driver gpushare\.io"):
        allocated_devices(allocated_claim("ns", "c", "u", [("n1", "x", "1Gi")], driver="other.io"), "n1")


def test_prepare_one_share_gives_the_device_plugins_env() -> None:
    prep = prepare("u1", [AllocatedDevice("gpu", "n1", "gpu-1", 8192, "s")], GPUS, MemoryUnit.GiB, spec_file="/x")
    assert prep.spec["kind"] == "gpushare.io/gpu" and prep.spec["cdiVersion"]
    (dev,) = prep.spec["devices"]
    assert dev["name"] == "u1-gpu-1"
    # The one env both node agents write (share_node.env, its figures tested with the device plugin's):
    # GPU 1 with 8 GiB of it, 8 units for the container and 8 for the pod.
    assert env_of(dev) == gpu_env([GPUS[1]], 8192, container_units=8, pod_units=8, unit=MemoryUnit.GiB)
    assert env_of(dev)[ENV_VISIBLE_DEVICES] == "GPU-bbbb" and env_of(dev)[ENV_MEM_LIMIT_MIB] == "8192"
    (p,) = prep.devices
    assert (p.request, p.pool, p.device, p.cdi_device_ids, p.share_id) == (
        "gpu", "n1", "gpu-1", ("gpushare.io/gpu=u1-gpu-1",), "s"
    )  # fmt: skip


def test_prepare_whole_device_when_no_capacity_was_consumed() -> None:
    prep = prepare("u", [AllocatedDevice("gpu", "n1", "gpu-0", None)], GPUS, MemoryUnit.GiB)
    assert env_of(prep.spec["devices"][0])[ENV_MEM_LIMIT_MIB] == "16384"


def test_prepare_references_nvidias_cdi_device_and_leaves_the_env_list_out() -> None:
    nvidia = nvidia_cdi_names(
        [
            {"kind": "nvidia.com/gpu", "devices": [{"name": "0"}, {"name": "GPU-bbbb"}, {"name": "all"}]},
            {"kind": "example.com/net", "devices": [{"name": "GPU-aaaa"}]},
        ]
    )
    assert nvidia == {"0", "GPU-bbbb", "all"}
    prep = prepare("u", [AllocatedDevice("gpu", "n1", "gpu-1", 4096)], GPUS, MemoryUnit.GiB, nvidia)
    assert prep.devices[0].cdi_device_ids == ("gpushare.io/gpu=u-gpu-1", "nvidia.com/gpu=GPU-bbbb")
    env = env_of(prep.spec["devices"][0])
    assert ENV_VISIBLE_DEVICES not in env and env[ENV_MEM_LIMIT_MIB] == "4096"
    # By index when NVIDIA's spec names GPUs by index only.
    by_index = prepare("u", [AllocatedDevice("gpu", "n1", "gpu-0", 4096)], GPUS, MemoryUnit.GiB, frozenset({"0"}))
    assert by_index.devices[0].cdi_device_ids[1] == "nvidia.com/gpu=0"


def test_prepare_two_gpus_in_one_claim_shares_one_env() -> None:
    allocated = [AllocatedDevice("gpu", "n1", "gpu-0", 4096), AllocatedDevice("gpu", "n1", "gpu-1", 4096)]
    prep = prepare("u", allocated, GPUS, MemoryUnit.GiB)
    envs = [env_of(d) for d in prep.spec["devices"]]
    assert envs[0] == envs[1]
    assert envs[0][ENV_VISIBLE_DEVICES] == "GPU-aaaa,GPU-bbbb"
    assert envs[0][ENV_MEM_LIMIT_MIB] == "4096" and envs[0][ENV_ALIYUN_POD] == "8"
    uneven = prepare("u", [allocated[0], AllocatedDevice("gpu", "n1", "gpu-1", 8192)], GPUS, MemoryUnit.GiB)
    assert env_of(uneven.spec["devices"][0])[ENV_MEM_LIMIT_MIB] == "4096,8192"


def test_two_requests_on_one_gpu_get_distinct_cdi_names_and_add_up() -> None:
    allocated = [AllocatedDevice("a", "n1", "gpu-0", 2048), AllocatedDevice("b/sub", "n1", "gpu-0", 1024)]
    prep = prepare("u", allocated, GPUS, MemoryUnit.GiB)
    assert [d["name"] for d in prep.spec["devices"]] == ["u-a-gpu-0", "u-b_sub-gpu-0"]
    assert env_of(prep.spec["devices"][0])[ENV_MEM_LIMIT_MIB] == "3072"


def test_prepare_refuses_a_device_this_node_lacks() -> None:
    with pytest.raises(ClaimError, match="gpu-7 of claim u is not a GPU of this node"):
        prepare("u", [AllocatedDevice("gpu", "n1", "gpu-7", 1024)], GPUS, MemoryUnit.GiB)
