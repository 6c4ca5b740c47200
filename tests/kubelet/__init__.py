"""A kubelet stand-in that speaks the real device plugin API v1beta1 and PodResources v1 over unix sockets.

It must behave as upstream kubelet v1.36.3 does where a device plugin can tell (k8s.io/kubernetes@v1.36.3,
pkg/kubelet); each behaviour names the function it mirrors in its docstring. When a real kubelet and this
stand-in disagree, the stand-in is wrong. Modules:

* devicemanager.py (cm/devicemanager): registration on `<dir>/kubelet.sock` (plugin/v1beta1/server.go Register,
  handler.go connectClient), ListAndWatch (genericDeviceUpdateCallback), a plugin going away marks every device
  unhealthy (PluginDisconnected). podDevices keyed by pod UID (pod_devices.go), recorded only after Allocate
  returned (allocateContainerResources). Allocate (manager.go Allocate): a regular init container's devices are
  reused by later containers, a sidecar keeps its own. devicesToAllocate's checks in its order: pre-allocated
  devices; "Container detected running" after a restart; "cannot allocate unregistered device"; "no healthy
  devices present"; then reusable devices, then free healthy ones. A resource that is neither registered nor
  previously allocated is skipped (isDevicePluginResource). UpdateAllocatedDevices frees the devices of pods no
  longer active. GetDeviceRunContainerOptions Allocates for a starting container that has none recorded.
  The checkpoint (writeCheckpoint/readCheckpoint) survives restart().
* podresources.py (apis/podresources/server_v1.go): List reports active pods only (1.34+ default
  KubeletPodResourcesListUseActivePods; `list_all_pods=True` for the older "every pod in the pod manager"),
  after UpdateAllocatedDevices; List and Get report restartable init containers ("sidecars") then app
  containers, never regular init containers; one ContainerDevices per device; the rate limit of
  apis/grpc/ratelimit.go (100 qps, burst 10).
* standin.py (kubelet.go, kubelet_pods.go, lifecycle/predicate.go, kuberuntime): pods keyed by UID (a deleted
  and recreated pod of the same name is another pod). Admission (HandlePodAdditions): the pod joins the pod
  manager (so PodResources lists it), then the admit handlers in kubelet.go's order: device allocation
  (GetAllocateResourcesPodAdmitHandler → topologymanager scope.go admitPolicyNone: init containers, then app
  containers) BEFORE the predicate handler (predicateAdmitHandler.Admit: removeMissingExtendedResources, the
  resource fit, and a test's `predicate` for the rest), so a pod can be allocated and then rejected. A rejected
  pod is Failed (rejectPod: reason UnexpectedAdmissionError for an Allocate failure, "Pod was rejected: ..."),
  inactive, and its devices are free again. `start_containers(pod)` is the pod worker (SyncPod) starting
  containers, which may Allocate (GetDeviceRunContainerOptions). `restart()` mirrors a kubelet restart: sockets
  removed (CleanupPluginDirectory), the checkpoint read (or dropped), every active pod re-admitted with sources
  not ready, before or after the plugin registers again.

Drive it directly (`admit(pod)`, `start_containers(pod)`) in unit tests, or `run_with_kube()` to act as kubelet
for the pods a KubeClient shows bound to its node, in an order a callable picks, writing their phase (the
integration tier does this).
"""

from tests.kubelet.devicemanager import AllocateCall
from tests.kubelet.devicemanager import DeviceManager
from tests.kubelet.devicemanager import DeviceManagerError
from tests.kubelet.standin import AdmissionError
from tests.kubelet.standin import ContainerStartError
from tests.kubelet.standin import KubeletStandIn
from tests.kubelet.standin import KubeletState
from tests.kubelet.standin import Pod
from tests.kubelet.standin import PodRecord
from tests.kubelet.standin import PodRef
from tests.kubelet.standin import Predicate
from tests.kubelet.standin import set_pod_phase

__all__ = [
    "AdmissionError",
    "AllocateCall",
    "ContainerStartError",
    "DeviceManager",
    "DeviceManagerError",
    "KubeletStandIn",
    "KubeletState",
    "Pod",
    "PodRecord",
    "PodRef",
    "Predicate",
    "set_pod_phase",
]
