"""The names every part of gpushare agrees on (see DESIGN.md): defined here once, imported everywhere."""

from __future__ import annotations

import enum

# Extended resources.
RESOURCE_MEM = "nvidia.com/gpu-mem"
RESOURCE_COUNT = "nvidia.com/gpu-count"

SCHEDULER_NAME = "gpushare-scheduler"
NODE_LABEL = "gpushare"
NODE_LABEL_VALUE = "true"
NODE_LABEL_SELECTOR = f"{NODE_LABEL}={NODE_LABEL_VALUE}"

PLUGIN_SOCKET_NAME = "gpushare.sock"
DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET_NAME = "kubelet.sock"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEVICE_PLUGIN_API_VERSION = "v1beta1"

# Fake device IDs: "<GPU-UUID>-_-<n>"; kubelet rejects IDs longer than 63 characters.
DEVICE_ID_SEPARATOR = "-_-"
DEVICE_ID_MAX_LEN = 63

# Annotation domain.
ANNOTATION_PREFIX = "gpushare.io/"

# Node annotation written by the plugin: JSON list of GPUs.
ANN_NODE_GPUS = ANNOTATION_PREFIX + "gpus"
# Node annotation written by the plugin when it measures GPU memory: JSON, MiB used per GPU and per pod
# (share_core/gpuusage.py), rewritten on a change and at a bounded rate; kubectl inspect shows it.
ANN_NODE_GPU_USAGE = ANNOTATION_PREFIX + "gpu-usage"

# Node annotation written by a node agent (share-plugin, share-dra) once at start: whether this node puts a
# hard GPU memory limit on each pod through the NVIDIA driver (`--hard-limit`), and if not, why. JSON:
# {"mode": "auto", "enforced": false, "reason": "unsupported driver 580.95.05 ...", "driver": "580.95.05",
#  "agent": "share-plugin", "time": "<RFC 3339>"}; kubectl inspect shows it.
ANN_NODE_HARD_LIMIT = ANNOTATION_PREFIX + "hard-limit"

# Pod annotations written by the extender at bind, consumed by the plugin.
ANN_GPU_INDEX = ANNOTATION_PREFIX + "gpu-index"
ANN_GPU_UUID = ANNOTATION_PREFIX + "gpu-uuid"
ANN_GPU_MEM = ANNOTATION_PREFIX + "gpu-mem"
ANN_ASSUME_TIME = ANNOTATION_PREFIX + "assume-time"
ANN_ASSIGNED = ANNOTATION_PREFIX + "assigned"

# Pod annotation written by the extender's leader on a pod it holds GPU memory for (a preemptor, a pod
# that waited too long, a consolidation's waiting pod): a JSON list of holds (share_core/holds.py), so a
# restarted extender or the other replica rebuilds them from the API server.
ANN_HOLDS = ANNOTATION_PREFIX + "holds"
# Written by the leader on a pod whose held room fits it now while kube-scheduler has not tried it again
# (the time, RFC 3339): kube-scheduler retries a pod it found no room for only on a cluster event or after
# five minutes, and the event that freed the room may have reached it before the extender's cache did.
# The write is such an event (share_scheduler.starvation, "nudge").
ANN_ROOM_READY = ANNOTATION_PREFIX + "room-ready"

# Pod annotations a user may set.
ANN_GPU_COUNT = ANNOTATION_PREFIX + "gpu-count"
ANN_GPU_MODEL = ANNOTATION_PREFIX + "gpu-model"
# "true": consolidation may evict this pod to make room for a waiting one (it still needs a controller
# that recreates it); "false": never, even when its controller would recreate it.
ANN_MOVABLE = ANNOTATION_PREFIX + "movable"

# Env in each container's Allocate response.
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MEM_LIMIT_MIB = "GPUSHARE_MEM_LIMIT_MIB"
ENV_MEM_TOTAL_MIB = "GPUSHARE_MEM_TOTAL_MIB"
ENV_GPU_INDEX = "GPUSHARE_GPU_INDEX"
ENV_ALIYUN_CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"
ENV_ALIYUN_DEV = "ALIYUN_COM_GPU_MEM_DEV"
ENV_ALIYUN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ENV_ALIYUN_POD = "ALIYUN_COM_GPU_MEM_POD"
ENV_MPS_PINNED_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

# Extender HTTP routes.
EXTENDER_PREFIX = "/gpushare-scheduler"
EXTENDER_DEFAULT_PORT = 12345

# Event reasons the device plugin records on a pod (kubectl describe pod shows them).
EVENT_ALLOCATE_REFUSED = "GpuShareAllocateRefused"  # a pod gpushare cannot serve asked for gpu-mem
EVENT_RUNS_WITHOUT_GPU = "GpuShareRunsWithoutGpu"  # admitted by kubelet without our Allocate
EVENT_GPU_ASSIGNED = "GPUShareAssigned"  # the extender bound a pod: which GPU(s), how much of each
EVENT_BIND_FAILED = "FailedGPUShareBinding"  # the extender could not bind a pod, and why
EVENT_OVER_LIMIT = "GpuShareOverLimit"  # a container uses more GPU memory than its limit
EVENT_OVER_LIMIT_KILLED = "GpuShareOverLimitKilled"  # --over-limit kill ended its processes
# Event reasons the extender's leader records about waiting pods (share_scheduler.starvation).
EVENT_RESERVED = "GpuShareReserved"  # GPU memory is held for a pod that waited too long: where, how much
EVENT_CONSOLIDATING = "GpuShareConsolidating"  # pods are moved to make room for this waiting pod
EVENT_CONSOLIDATION_EVICTED = "GpuShareConsolidationEvicted"  # this pod was evicted to make room; where it goes
EVENT_CONSOLIDATION_REFUSED = "GpuShareConsolidationRefused"  # no consolidation for this pod, and why

# Where the MPS control daemon's pipes live on the node and in the containers (--mps).
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_MPS_PIPE_DIR = "/run/gpushare/mps"


class DeviceListStrategy(enum.StrEnum):
    """How a container is told its GPUs (--device-list-strategy), as NVIDIA's device plugin names them."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_CRI = "cdi-cri"


DEVICE_LIST_STRATEGIES = tuple(DeviceListStrategy)
# volume-mounts: the NVIDIA container toolkit reads the device list from mounts under this directory
# (mounted from /dev/null) instead of NVIDIA_VISIBLE_DEVICES, which a pod can set itself.
VISIBLE_DEVICES_MOUNT_ROOT = "/var/run/nvidia-container-devices"
# cdi-cri: fully qualified CDI names of the devices the NVIDIA toolkit's CDI spec (nvidia-ctk cdi generate) defines.
CDI_NVIDIA_GPU_KIND = "nvidia.com/gpu"


class HardLimitMode(enum.StrEnum):
    """--hard-limit: the NVIDIA driver's per-cgroup GPU memory limit (nvmlDeviceSetMemoryLimits_v1, R615+)."""

    AUTO = "auto"  # where the node supports it; else say why and go on without
    CGROUP = "cgroup"  # required: the agent refuses to start without it
    OFF = "off"


HARD_LIMIT_MODES = tuple(HardLimitMode)
HARD_LIMIT_MIN_DRIVER = (615,)  # the first driver branch with nvmlDeviceSetMemoryLimits_v1
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"  # cgroup v2's mount; NVML takes a pod cgroup's full path below it

# Pod phases whose containers are gone: their memory is free again.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class MemoryUnit(enum.Enum):
    """The unit of one `nvidia.com/gpu-mem`: one fake device per unit."""

    GiB = "GiB"
    MiB = "MiB"

    @property
    def mib(self) -> int:
        """MiB in one unit."""
        return 1024 if self is MemoryUnit.GiB else 1

    def from_bytes(self, n_bytes: int) -> int:
        """Whole units in `n_bytes` (rounded down: never advertise memory a GPU lacks)."""
        return n_bytes // (self.mib * 1024 * 1024)

    @classmethod
    def parse(cls, text: str) -> MemoryUnit:
        for unit in cls:
            if unit.value.lower() == text.strip().lower():
                return unit
        raise ValueError(f"unknown memory unit {text!r}: expected GiB or MiB")


def device_id(gpu_uuid: str, n: int) -> str:
    """The fake device ID for unit `n` of a GPU."""
    return f"{gpu_uuid}{DEVICE_ID_SEPARATOR}{n}"


def gpu_uuid_of_device(dev_id: str) -> str:
    """The GPU UUID a fake device ID belongs to."""
    uuid, sep, _ = dev_id.rpartition(DEVICE_ID_SEPARATOR)
    if not sep or not uuid:
        raise ValueError(f"not a gpushare device ID: {dev_id!r}")
    return uuid


# --- Dynamic Resource Allocation (share-dra, resource.k8s.io/v1) ------------------------------------
# One name for the driver: ResourceSlice spec.driver, the kubelet plugin registration name, the
# DeviceClass (the chart creates it, selecting `device.driver == "gpushare.io"`) and the attribute domain.
DRA_DRIVER_NAME = "gpushare.io"
DRA_DEVICE_CLASS = "gpushare.io"
DRA_DEVICE_PREFIX = "gpu-"  # device `gpu-<index>` in the slice (a DNS label)
# Attributes, read in CEL as device.attributes["gpushare.io"].<name>.
DRA_ATTR_MODEL = "model"
DRA_ATTR_UUID = "uuid"
DRA_ATTR_INDEX = "index"
DRA_ATTR_DRIVER_VERSION = "driverVersion"
# Consumable capacity (KEP-5075): a claim asks `capacity.requests.memory`; the scheduler records it in
# status.allocation.devices.results[].consumedCapacity.memory.
DRA_CAPACITY_MEMORY = "memory"
# `--unhealthy taint` (1.36+, DRADeviceTaints): an unhealthy GPU stays listed with this NoSchedule taint.
DRA_TAINT_UNHEALTHY = "gpushare.io/unhealthy"
DRA_UNHEALTHY_WITHDRAW = "withdraw"
DRA_UNHEALTHY_TAINT = "taint"
DRA_UNHEALTHY_MODES = (DRA_UNHEALTHY_WITHDRAW, DRA_UNHEALTHY_TAINT)
# CDI: vendor/class of our devices, one spec file per claim, one device per (claim, request, device).
DRA_CDI_KIND = "gpushare.io/gpu"
DEFAULT_CDI_DIR = "/var/run/cdi"
# CDI dirs a runtime reads (containerd's and CRI-O's defaults), where NVIDIA's own spec may lie.
DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# kubelet's plugin watcher (pluginregistration.v1) and the DRA service socket.
DEFAULT_PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_DRA_PLUGIN_DIR = "/var/lib/kubelet/plugins/gpushare.io"
DRA_REGISTRATION_SOCKET_NAME = "gpushare.io-reg.sock"
DRA_SOCKET_NAME = "dra.sock"
DRA_PLUGIN_TYPE = "DRAPlugin"
# gRPC services kubelet may choose (pkg/kubelet/cm/dra/plugin: "<version>.<service>"), newest first.
DRA_SERVICE_V1 = "v1.DRAPlugin"
DRA_SERVICE_V1BETA1 = "v1beta1.DRAPlugin"


def dra_device_name(index: int) -> str:
    """The slice's device name for GPU `index` (`gpu-0`)."""
    return f"{DRA_DEVICE_PREFIX}{index}"


def dra_cdi_spec_file(claim_uid: str) -> str:
    """The file name of a claim's CDI spec (under the CDI dir)."""
    return f"{DRA_DRIVER_NAME}-claim_{claim_uid}.json"


def dra_cdi_device(claim_uid: str, device: str) -> str:
    """The CDI device name (unqualified) of one allocated device of a claim: `<claim-uid>-<device>`."""
    return f"{claim_uid}-{device}"
