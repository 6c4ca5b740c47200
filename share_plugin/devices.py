"""The device list kubelet sees: one fake device per memory unit per GPU, and whether it fits the wire.

kubelet dials the plugin with grpc-go's default client options (pkg/kubelet/cm/devicemanager/plugin/
v1beta1/client.go sets no MaxCallRecvMsgSize), so every ListAndWatch message must stay under grpc-go's
default 4 MiB receive limit. One device costs about 60 bytes on the wire (a 40-character GPU UUID, the
`-_-<n>` suffix, "Healthy", framing), so GiB units are tiny (8 x 80 GiB: ~40 KB) while MiB units only
fit about 65 GiB of GPU memory per node in total: 8 x 80 GiB in MiB is ~40 MB.

When the list does not fit we refuse to start (`DeviceListTooLarge`) with advice, rather than silently
advertising fewer units or switching to a coarser unit: `nvidia.com/gpu-mem` is a cluster-wide contract
(pod requests, the extender and the node annotation all count in the same unit), so any quiet change here
would hand pods the wrong amount of memory. An operator sees the error in the plugin log and the DaemonSet
status, and chooses GiB for large GPUs.
"""

from __future__ import annotations

from share_core.contract import DEVICE_ID_MAX_LEN
from share_core.contract import MemoryUnit
from share_core.contract import device_id
from share_core.gpus import GpuInfo
from share_node.backend import Gpu
from share_node.env import gpu_units
from share_plugin.api import deviceplugin_v1beta1_pb2 as pb

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# grpc-go's defaultClientMaxReceiveMessageSize, what kubelet accepts from a device plugin.
KUBELET_MAX_RECV_BYTES = 4 * 1024 * 1024
# Stay clear of the limit: UUIDs of other vendors or a future field must not tip us over.
SAFETY_MARGIN = 0.9


class DeviceListTooLarge(ValueError):
    """The ListAndWatch message would exceed what kubelet accepts."""


def gpu_infos(gpus: list[Gpu], unit: MemoryUnit) -> list[GpuInfo]:
    """What the node annotation `gpushare.io/gpus` publishes."""
    return [GpuInfo(g.index, g.uuid, g.model, gpu_units(g, unit), g.healthy, g.parent_uuid) for g in gpus]


def device_list(gpus: list[Gpu], unit: MemoryUnit) -> pb.ListAndWatchResponse:
    """Every fake device of every GPU; an unhealthy GPU's devices are Unhealthy."""
    resp = pb.ListAndWatchResponse()
    for g in gpus:
        health = HEALTHY if g.healthy else UNHEALTHY
        resp.devices.extend(pb.Device(ID=device_id(g.uuid, n), health=health) for n in range(gpu_units(g, unit)))
    return resp


def check_device_ids(gpus: list[Gpu], unit: MemoryUnit) -> None:
    """kubelet rejects IDs over 63 characters: check the longest one each GPU will produce."""
    for g in gpus:
        longest = device_id(g.uuid, max(gpu_units(g, unit) - 1, 0))
        if len(longest) > DEVICE_ID_MAX_LEN:
            raise DeviceListTooLarge(
                f"GPU {g.index} ({g.uuid}): device ID {longest!r} is {len(longest)} characters; "
                f"kubelet accepts at most {DEVICE_ID_MAX_LEN}"
            )


def check_message_size(resp: pb.ListAndWatchResponse, gpus: list[Gpu], unit: MemoryUnit) -> int:
    """The encoded size in bytes; raises DeviceListTooLarge with advice when kubelet would drop it."""
    size = resp.ByteSize()
    budget = int(KUBELET_MAX_RECV_BYTES * SAFETY_MARGIN)
    if size > budget:
        total_gib = sum(g.memory_bytes for g in gpus) / 1024**3
        advice = (
            "use --memory-unit GiB (the default)"
            if unit is MemoryUnit.MiB
            else "this node has more GPU memory than one device list can describe"
        )
        raise DeviceListTooLarge(
            f"{len(resp.devices)} devices ({len(gpus)} GPUs, {total_gib:.0f} GiB in {unit.value} units) encode to "
            f"{size / 1024**2:.1f} MiB, over kubelet's gRPC receive limit of "
            f"{KUBELET_MAX_RECV_BYTES / 1024**2:.0f} MiB "
            f"(we keep {100 - SAFETY_MARGIN * 100:.0f}% headroom); kubelet would drop the list and advertise nothing: "
            f"{advice}"
        )
    return size
