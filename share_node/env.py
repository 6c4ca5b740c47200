"""The env a container given a share of GPU(s) sees: DESIGN.md's table, one implementation for both node agents.

The device plugin answers Allocate with it and the DRA driver writes it into a claim's CDI spec, so a workload
cannot tell which path started it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from share_core.contract import DEFAULT_MPS_PIPE_DIR
from share_core.contract import ENV_ALIYUN_CONTAINER
from share_core.contract import ENV_ALIYUN_DEV
from share_core.contract import ENV_ALIYUN_IDX
from share_core.contract import ENV_ALIYUN_POD
from share_core.contract import ENV_GPU_INDEX
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_MEM_TOTAL_MIB
from share_core.contract import ENV_MPS_PINNED_LIMIT
from share_core.contract import ENV_MPS_PIPE_DIRECTORY
from share_core.contract import ENV_VISIBLE_DEVICES
from share_core.contract import VISIBLE_DEVICES_MOUNT_ROOT
from share_core.contract import DeviceListStrategy
from share_core.contract import MemoryUnit
from share_node.backend import Gpu


def gpu_units(gpu: Gpu, unit: MemoryUnit) -> int:
    """Whole resource units of a GPU (rounded down: never advertise memory it lacks)."""
    return unit.from_bytes(gpu.memory_bytes)


class EnvOptions(TypedDict, total=False):
    """How a node agent was told to shape the env (its flags): gpu_env's keywords after the figures."""

    device_id_strategy: str
    mps: bool
    device_list_strategy: str
    mps_pipe_dir: str


def gpu_env(
    gpus: Sequence[Gpu],
    limit_mib: int | str,
    container_units: int,
    pod_units: int,
    unit: MemoryUnit,
    device_id_strategy: str = "uuid",
    mps: bool = False,
    device_list_strategy: str = DeviceListStrategy.ENVVAR,
    mps_pipe_dir: str = DEFAULT_MPS_PIPE_DIR,
) -> dict[str, str]:
    """The env of a container given `gpus` with `limit_mib` MiB of each (the device plugin's Allocate and
    the DRA driver's CDI spec both answer with it); `container_units` per GPU and `pod_units` in all are the
    Aliyun compatibility figures, in `unit`s.

    `NVIDIA_VISIBLE_DEVICES` carries the device list only with the envvar strategy; with volume-mounts it
    points at the mount directory (as NVIDIA's plugin does), and with cdi-cri it is left out: the CDI device
    names are the list. Our limit env is there in every mode.
    """
    env = {
        ENV_MEM_LIMIT_MIB: str(limit_mib),
        ENV_MEM_TOTAL_MIB: ",".join(str(g.memory_mib) for g in gpus),
        ENV_GPU_INDEX: ",".join(str(g.index) for g in gpus),
        ENV_ALIYUN_CONTAINER: str(container_units),
        ENV_ALIYUN_DEV: ",".join(str(gpu_units(g, unit)) for g in gpus),
        ENV_ALIYUN_IDX: ",".join(str(g.index) for g in gpus),
        ENV_ALIYUN_POD: str(pod_units),
    }
    if device_list_strategy == DeviceListStrategy.ENVVAR:
        env[ENV_VISIBLE_DEVICES] = ",".join(visible_ids(gpus, device_id_strategy))
    elif device_list_strategy == DeviceListStrategy.VOLUME_MOUNTS:
        env[ENV_VISIBLE_DEVICES] = VISIBLE_DEVICES_MOUNT_ROOT
    if mps:
        # Device ordinals as CUDA numbers them inside the container, which sees only its GPUs, in this order
        # (NVIDIA MPS documentation, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: "0=1G,1=512MB").
        env[ENV_MPS_PINNED_LIMIT] = ",".join(f"{n}={limit_mib}M" for n in range(len(gpus)))
        env[ENV_MPS_PIPE_DIRECTORY] = mps_pipe_dir
    return env


def visible_ids(gpus: Sequence[Gpu], device_id_strategy: str) -> list[str]:
    """How the NVIDIA toolkit names each GPU: its UUID (a MIG instance's `MIG-…`), or its index (`<gpu>:<mig>`)."""
    return [g.uuid if device_id_strategy == "uuid" else g.device_index for g in gpus]
