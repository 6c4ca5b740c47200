"""The DRA driver's view of a real GPU: the ResourceSlice it publishes from NVML, and the CDI env it prepares
for a claim, which the PyTorch sample, run with exactly that env, holds."""

from __future__ import annotations

import subprocess

from share_core.contract import DRA_ATTR_DRIVER_VERSION
from share_core.contract import DRA_ATTR_MODEL
from share_core.contract import DRA_ATTR_UUID
from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import MemoryUnit
from share_core.contract import dra_device_name
from share_dra.claims import AllocatedDevice
from share_dra.claims import prepare
from share_dra.slices import slice_spec
from share_node.backend import Gpu
from share_node.backend.nvml import NvmlBackend
from tests.gpu.conftest import NODE
from tests.gpu.conftest import SAMPLES
from tests.gpu.conftest import run_python


def test_slice_lists_the_gpu_as_nvml_reports_it(nvml: NvmlBackend, gpu: Gpu) -> None:
    driver = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.splitlines()[0]
        .strip()
    )
    spec = slice_spec(NODE, nvml.gpus(), MemoryUnit.GiB, 1, nvml.driver_version)
    entry = next(d for d in spec["devices"] if d["name"] == dra_device_name(gpu.index))
    print("\nslice entry:", entry)
    assert spec["driver"] == DRA_DRIVER_NAME and nvml.driver_version == driver
    assert entry["attributes"][DRA_ATTR_MODEL] == {"string": gpu.model}
    assert entry["attributes"][DRA_ATTR_UUID] == {"string": gpu.uuid}
    major, minor, patch = (int(p) for p in driver.split("."))
    assert entry["attributes"][DRA_ATTR_DRIVER_VERSION] == {"version": f"{major}.{minor}.{patch}"}
    assert entry["capacity"][DRA_CAPACITY_MEMORY]["value"] == f"{gpu.memory_mib // 1024}Gi"


def test_a_claims_cdi_env_is_a_share_the_sample_holds(nvml: NvmlBackend, gpu: Gpu) -> None:
    claimed = AllocatedDevice("gpu", NODE, dra_device_name(gpu.index), 4096)
    prep = prepare("claim-uid-1", [claimed], nvml.gpus(), MemoryUnit.GiB)
    (device,) = prep.spec["devices"]
    env = dict(item.split("=", 1) for item in device["containerEdits"]["env"])
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["GPUSHARE_MEM_LIMIT_MIB"]) == (gpu.uuid, "4096")
    # what containerd applies from the CDI spec, plus what the NVIDIA runtime would do with the device
    result = run_python([str(SAMPLES / "pytorch_limit.py")], {**env, "CUDA_VISIBLE_DEVICES": gpu.uuid})
    print(result.stdout, result.stderr[-1500:])
    assert result.returncode == 0 and "the share holds" in result.stdout, result.stderr[-2000:]
