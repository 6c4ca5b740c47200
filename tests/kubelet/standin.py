"""The kubelet stand-in: pod manager, admission, pod worker, restart and the API-server-driven loop, mirroring
k8s.io/kubernetes v1.36.3 pkg/kubelet (kubelet.go, kubelet_pods.go, allocation/allocation_manager.go,
lifecycle/predicate.go, cm/topologymanager/scope.go, kuberuntime). See tests/kubelet/__init__.py.

One piece: it mirrors one upstream loop (admission, pod worker, restart) whose steps share state as they
do in kubelet.go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import grpc

from share_core.contract import KUBELET_SOCKET_NAME
from share_core.contract import RESOURCE_MEM
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc
from tests.kubelet.devicemanager import ENDPOINT_STOP_GRACE
from tests.kubelet.devicemanager import AllocateCall
from tests.kubelet.devicemanager import DeviceManager
from tests.kubelet.devicemanager import DeviceManagerError
from tests.kubelet.devicemanager import PodDevices
from tests.kubelet.devicemanager import app_containers
from tests.kubelet.devicemanager import effective_request
from tests.kubelet.devicemanager import init_containers
from tests.kubelet.devicemanager import is_restartable_init
from tests.kubelet.devicemanager import pod_uid
from tests.kubelet.podresources import DEFAULT_BURST
from tests.kubelet.podresources import DEFAULT_QPS
from tests.kubelet.podresources import PodResourcesServer
from tests.kubelet.podresources import RateLimiter

log = logging.getLogger("kubelet-standin")

Pod = Mapping[str, Any]
PodRef = tuple[str, str]
# A predicate admit check after device allocation: (reason, message) rejects the pod, None admits it.
Predicate = Callable[[Pod], tuple[str, str] | None]

TERMINAL = ("Succeeded", "Failed")
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"  # cm/admission/errors.go ErrorReasonUnexpected


class AdmissionError(Exception):
    """kubelet rejected the pod (kubelet.go rejectPod): `reason` and `message` as the admit handler returned
    them; the pod's status message is "Pod was rejected: " + message. An Allocate failure is reason
    UnexpectedAdmissionError, message "Allocate failed due to <error>, which is unexpected"."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ContainerStartError(Exception):
    """The pod worker could not start a container (GetDeviceRunContainerOptions failed); kubelet retries."""

    def __init__(self, uid: str, container: str, message: str) -> None:
        super().__init__(f"container {container!r} of pod {uid}: {message}")
        self.uid = uid
        self.container = container


@dataclass
class PodRecord:
    """One pod in kubelet's pod manager (pod/pod_manager.go, keyed by UID), with what the status manager
    (phase, reason, message) and the runtime (containers started, running) know about it."""

    pod: Pod
    uid: str
    namespace: str
    name: str
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    admitted: bool = False
    from_source: bool = False  # delivered by run_with_kube's API server source
    started: dict[str, dict[str, str]] = field(default_factory=dict)  # container -> env it was started with
    running: set[str] = field(default_factory=set)  # regular init containers ran to completion: not running

    @property
    def ref(self) -> PodRef:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL


@dataclass
class KubeletState:
    """What test_plugin_allocate hands from one stand-in to another as "kubelet kept its checkpoint"."""

    pods: dict[str, PodRecord]
    pod_devices: PodDevices


@dataclass
class _Source:
    kube: Any
    node: str


def _containers(pod: Pod) -> list[Mapping[str, Any]]:
    """Init containers then app containers (topologymanager/scope.go admitPolicyNone, scope_container.go Admit)."""
    return init_containers(pod) + app_containers(pod)


def _creation_order(pods: Iterable[Pod]) -> list[Pod]:
    """kubelet.go HandlePodAdditions: sort.Sort(sliceutils.PodsByCreationTime(pods)) (stable for equal times)."""
    return sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")


def _device_manager_view(name: str) -> Any:
    """A read-only attribute of the stand-in that reads its device manager's `name`."""
    return property(lambda self: getattr(self.dm, name))


class KubeletStandIn:
    def __init__(
        self,
        plugin_dir: str,
        pod_resources_socket: str,
        resource: str = RESOURCE_MEM,
        choose: Callable[[list[str], int], list[str]] | None = None,
        list_rejected: bool = False,
        *,
        list_all_pods: bool = False,
        predicate: Predicate | None = None,
        pod_resources_qps: float | None = DEFAULT_QPS,
        pod_resources_burst: int = DEFAULT_BURST,
        endpoint_stop_grace: float = ENDPOINT_STOP_GRACE,
        status_lag: float = 0.0,
    ) -> None:
        """`choose(free, n)` picks n device IDs (upstream: Go set order, i.e. random; default: sorted).
        `list_all_pods` (or the older name `list_rejected`): PodResources List reports every pod in the pod
        manager, as before 1.34 (KubeletPodResourcesListUseActivePods off). `predicate`: the predicate admit
        handler's verdict after device allocation (OutOfcpu, node affinity...). `pod_resources_qps`: the
        PodResources rate limit (None: none). `status_lag`: seconds before the status manager's write of a
        pod's status reaches the API server (status_manager.go writes from its own goroutine; kubelet
        admits the next pod meanwhile); writes stay in order."""
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.resource = resource
        self.list_all_pods = list_all_pods or list_rejected
        self.predicate = predicate
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._admit_lock = threading.RLock()  # admission, pod worker and restart run one at a time
        self._pod_manager: dict[str, PodRecord] = {}
        self._sources_ready = True
        self._running_at_start: set[tuple[str, str]] = set()
        self.dm = DeviceManager(
            plugin_dir,
            resource,
            self._lock,
            self._changed,
            active_pods=self.active_pod_uids,
            sources_ready=lambda: self._sources_ready,
            container_running=lambda uid, name: (uid, name) in self._running_at_start,
            choose=choose,
            endpoint_stop_grace=endpoint_stop_grace,
        )
        self.pod_resources_calls = 0
        self._limiter_args = (pod_resources_qps, pod_resources_burst)
        self._pr_server: grpc.Server | None = None
        self._source: _Source | None = None
        self._to_start: list[str] = []  # pod UIDs the pod worker has yet to start (run_with_kube)
        self._loop_stop = threading.Event()
        self.status_lag = status_lag
        self._status_queue: queue.Queue[tuple[float, Callable[[], None]]] = queue.Queue()
        self._status_writer: threading.Thread | None = None

    # -- what tests read ------------------------------------------------------------------------------

    # The device manager's own view: device ID -> health as the plugin last listed it (allDevices), how
    # often it registered, its socket, how many ListAndWatch updates came and the last one's size.
    devices = _device_manager_view("devices")
    registrations = _device_manager_view("registrations")
    endpoint = _device_manager_view("endpoint")
    updates = _device_manager_view("updates")
    last_message_bytes = _device_manager_view("last_message_bytes")

    @property
    def allocate_calls(self) -> list[AllocateCall]:
        """Every Allocate RPC made, in order."""
        with self._lock:
            return list(self.dm.allocate_calls)

    @property
    def choose(self) -> Callable[[list[str], int], list[str]]:
        return self.dm.choose

    @property
    def _pods(self) -> KubeletState:
        return KubeletState(self._pod_manager, self.dm.pod_devices)

    @_pods.setter
    def _pods(self, state: KubeletState) -> None:
        with self._lock:
            self._pod_manager = state.pods
            self.dm.pod_devices = state.pod_devices
            self.dm.allocated = self.dm._pod_devices_devices()

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET_NAME)

    def healthy_devices(self) -> list[str]:
        """The devices the device manager counts as healthy (healthyDevices): none while the plugin is away."""
        with self._lock:
            return [i for i in self.dm.devices if i in self.dm.healthy]

    def node_allocatable(self) -> int | None:
        """What the node status reports for the resource (cm GetCapacity, run by the node status loop):
        the healthy devices; None when the node lacks the resource."""
        return self.dm.get_capacity()

    def pods(self) -> list[PodRecord]:
        """Every pod in the pod manager (podManager.GetPods)."""
        with self._lock:
            return list(self._pod_manager.values())

    def active_pods(self) -> list[PodRecord]:
        """kubelet_pods.go GetActivePods / filterOutInactivePods: pods not in a terminal phase (a rejected pod
        is Failed)."""
        with self._lock:
            return [r for r in self._pod_manager.values() if not r.terminal]

    def active_pod_uids(self) -> set[str]:
        with self._lock:
            return {r.uid for r in self._pod_manager.values() if not r.terminal}

    def pod_by_name(self, namespace: str, name: str) -> PodRecord | None:
        """podManager.GetPodByName: the pod last added under that name, whatever its phase."""
        with self._lock:
            found = [r for r in self._pod_manager.values() if r.ref == (namespace, name)]
            return found[-1] if found else None

    def pod_record(self, uid: str) -> PodRecord | None:
        with self._lock:
            return self._pod_manager.get(uid)

    def envs(self) -> dict[PodRef, dict[str, dict[str, str]]]:
        """Active pods by (namespace, name): container -> env of its recorded devices."""
        with self._lock:
            return {r.ref: self._envs(r.uid) for r in self.active_pods()}

    def envs_by_uid(self) -> dict[str, dict[str, dict[str, str]]]:
        """podDevices as kubelet holds it (pods not yet garbage-collected included): uid -> container -> env."""
        with self._lock:
            return {uid: {c: dict(a.env) for c, a in cs.items()} for uid, cs in self.dm.pod_devices.items()}

    def pod_devices(self) -> dict[PodRef, dict[str, list[str]]]:
        """Active pods by (namespace, name): container -> device IDs recorded."""
        with self._lock:
            return {
                r.ref: {c: list(a.devices) for c, a in self.dm.pod_devices.get(r.uid, {}).items()}
                for r in self.active_pods()
            }

    def pod_devices_by_uid(self) -> dict[str, dict[str, list[str]]]:
        """podDevices as kubelet holds it: uid -> container -> device IDs."""
        with self._lock:
            return {uid: {c: list(a.devices) for c, a in cs.items()} for uid, cs in self.dm.pod_devices.items()}

    def _envs(self, uid: str) -> dict[str, dict[str, str]]:
        return {c: dict(a.env) for c, a in self.dm.pod_devices.get(uid, {}).items()}

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"kubelet stand-in: timed out waiting for {what}")
                self._changed.wait(min(left, 0.1))

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        self._start_registration()
        self._start_pod_resources()

    def _start_registration(self) -> None:
        self.dm.start_server()

    def _start_pod_resources(self) -> None:
        if not self.pod_resources_socket:
            return
        os.makedirs(os.path.dirname(self.pod_resources_socket), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pod_resources_socket)
        qps, burst = self._limiter_args
        limiter = RateLimiter(qps, burst) if qps else None
        self._pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-pr"))
        prgrpc.add_PodResourcesListerServicer_to_server(PodResourcesServer(self, limiter), self._pr_server)
        self._pr_server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        self._pr_server.start()

    def _stop_servers(self) -> None:
        self.dm.stop_server()
        if self._pr_server is not None:
            self._pr_server.stop(grace=0).wait(2)
            self._pr_server = None
        if self.pod_resources_socket:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.pod_resources_socket)

    def stop(self) -> None:
        self._loop_stop.set()
        self._stop_servers()

    def restart(
        self,
        timeout: float = 10.0,
        *,
        drop_checkpoint: bool = False,
        pods_first: bool = False,
        new_pods: Iterable[Pod] = (),
        wait: bool = True,
    ) -> float:
        """A kubelet restart. Returns seconds until the plugin registered again (0.0 with `wait=False`).

        The process ends (sockets go); the new one cleans up the plugin directory (CleanupPluginDirectory),
        reads the device manager checkpoint (readCheckpoint: podDevices kept, the resource known with no healthy
        device and a stopped endpoint until its plugin registers; `drop_checkpoint`: nothing kept, the resource
        unknown), and the runtime reports the containers still running. The pod source's first update
        re-adds every pod bound to the node (the API server's list under run_with_kube, else the pods this
        kubelet knew plus `new_pods`) and HandlePodAdditions admits each non-terminal one, with sources not yet
        ready: a running container with devices recorded needs no Allocate (devicesToAllocate "Container
        detected running"). `pods_first`: that update arrives before the plugin registers again (re-admission
        finds the resource with no healthy device, or unknown); otherwise the plugin registers first.
        """
        with self._admit_lock:
            before = self.dm.registrations
            with self._lock:
                old = dict(self._pod_manager)
                running = {(uid, c) for uid, r in old.items() if not r.terminal for c in r.running}
            first_update = self._first_update(old, new_pods)
            self._stop_servers()
            with self._lock:
                self._pod_manager = {}
                self._to_start = []
                self._sources_ready = False
                self._running_at_start = running
                self.dm.read_checkpoint(dropped=drop_checkpoint)
            t0 = time.monotonic()
            took = 0.0
            self._start_pod_resources()
            if not pods_first:
                self._start_registration()
                if wait:
                    took = self._wait_registered(before, timeout, t0)
            for pod in first_update:
                self._readmit(pod, old.get(pod_uid(pod)))
            with self._lock:
                self._sources_ready = True  # kubelet.go syncLoopIteration: AddSource after the first update
                self._changed.notify_all()
            if pods_first:
                self._start_registration()
                if wait:
                    took = self._wait_registered(before, timeout, t0)
            return took

    def _wait_registered(self, before: int, timeout: float, t0: float) -> float:
        self.wait_for(lambda: self.dm.registrations > before and bool(self.dm.healthy), timeout, "re-registration")
        return time.monotonic() - t0

    def _first_update(self, old: Mapping[str, PodRecord], new_pods: Iterable[Pod]) -> list[Pod]:
        pods: list[Pod] | None = None
        if self._source is not None:
            try:
                pods = self._list_source()
            except Exception as exc:  # the API server may be away: use what kubelet knew
                log.warning("kubelet stand-in: listing pods on restart failed: %s", exc)
        if pods is None:
            pods = [r.pod for r in old.values()] + list(new_pods)
        return _creation_order(pods)

    def _readmit(self, pod: Pod, prev: PodRecord | None) -> None:
        if prev is not None and prev.terminal:
            with self._lock:  # the API shows it terminal: added to the pod manager, not admitted
                self._pod_manager[prev.uid] = prev
            return
        try:
            self._admit(pod, from_source=self._source is not None, prev=prev)
        except AdmissionError as exc:
            log.warning("kubelet stand-in: pod %s rejected on restart: %s", pod_uid(pod), exc)
            return
        rec = self.pod_record(pod_uid(pod))
        if self._source is not None and rec is not None and rec.admitted:
            self._to_start.append(rec.uid)

    # -- admission (kubelet.go HandlePodAdditions) -------------------------------------------------------

    def admit(self, pod: Pod, predicate: Predicate | None = None) -> dict[str, dict[str, str]]:
        """HandlePodAdditions for one pod: into the pod manager (PodResources lists it from now on), then the
        admit handlers in kubelet.go's order: device allocation (GetAllocateResourcesPodAdmitHandler: one
        Allocate per container that needs devices, init containers first), then the predicate handler
        (removeMissingExtendedResources, the resource fit, then `predicate` or the stand-in's). Returns
        container -> env for the containers with devices recorded.

        Raises AdmissionError when a handler rejects the pod: it is Failed, so no longer active, and its
        devices are free again. A pod already in a terminal phase is added but not admitted. Admitting a UID
        this kubelet rejected starts over as a new pod (a test's second attempt; kubelet never sees a UID
        twice).
        """
        with self._admit_lock:
            return self._admit(pod, predicate=predicate)

    def _admit(
        self,
        pod: Pod,
        predicate: Predicate | None = None,
        from_source: bool = False,
        prev: PodRecord | None = None,
    ) -> dict[str, dict[str, str]]:
        uid = pod_uid(pod)
        meta = pod.get("metadata") or {}
        with self._lock:
            rec = self._pod_manager.get(uid)
            if rec is None or rec.terminal:
                if rec is not None:
                    self.dm.forget_pod(uid)
                rec = PodRecord(pod, uid, meta.get("namespace") or "default", meta.get("name") or "")
                rec.from_source = from_source
                if prev is not None:  # a kubelet restart: the runtime still runs what ran
                    rec.phase, rec.started, rec.running = prev.phase, dict(prev.started), set(prev.running)
                self._pod_manager[uid] = rec  # podManager.AddPod, before the admit handlers run
            else:
                rec.pod = pod
            api_phase = (pod.get("status") or {}).get("phase")
            self._changed.notify_all()
            if api_phase in TERMINAL:  # HandlePodAdditions admits no terminal pod
                rec.phase = api_phase
                rec.running.clear()
                return {}
        # allocation_manager.go canAdmitPod: the handlers in order; the first rejection wins
        for container in _containers(pod):
            try:
                self.dm.allocate(pod, container)
            except DeviceManagerError as exc:
                self._reject(rec, UNEXPECTED_ADMISSION_ERROR, f"Allocate failed due to {exc}, which is unexpected")
        verdict = self._predicate_admit(rec, predicate or self.predicate)
        if verdict is not None:
            self._reject(rec, *verdict)
        with self._lock:
            rec.admitted = True
            self._changed.notify_all()
            return self._envs(uid)

    def _predicate_admit(self, rec: PodRecord, predicate: Predicate | None) -> tuple[str, str] | None:
        """lifecycle/predicate.go predicateAdmitHandler.Admit, for our resource: the node's allocatable
        (GetCapacity), raised to what is allocated when the pod holds devices (UpdatePluginResources →
        sanitizeNodeAllocatable); a resource the node lacks is dropped from the request
        (removeMissingExtendedResources); then the fit against the other active pods (generalFilter →
        InsufficientResourceError: reason "OutOf<resource>"); then `predicate` for everything else."""
        res = self.resource
        allocatable = self.dm.get_capacity()
        if self.dm.has_pod(rec.uid):
            allocated = self.dm.allocated_count()
            if allocated is not None and (allocatable is None or allocatable < allocated):
                allocatable = allocated
        requested = effective_request(rec.pod, res)
        if allocatable is not None and requested > 0:
            used = sum(effective_request(r.pod, res) for r in self.active_pods() if r.uid != rec.uid)
            if requested > allocatable - used:
                return (
                    f"OutOf{res}",
                    f"Node didn't have enough resource: {res}, requested: {requested}, used: {used}, "
                    f"capacity: {allocatable}",
                )
        return predicate(rec.pod) if predicate is not None else None

    def _reject(self, rec: PodRecord, reason: str, message: str) -> None:
        """kubelet.go rejectPod: the status manager marks the pod Failed ("Pod was rejected: " + message)."""
        with self._lock:
            rec.phase = "Failed"
            rec.reason = reason
            rec.message = f"Pod was rejected: {message}"
            rec.running.clear()
            self._changed.notify_all()
        self._report(rec)
        raise AdmissionError(reason, message)

    # -- the pod worker ----------------------------------------------------------------------------------

    def start_containers(self, pod: Pod) -> dict[str, dict[str, str]]:
        """The pod worker starts the admitted pod's containers (kuberuntime_manager.go SyncPod): init
        containers in order (a regular one runs to completion, a sidecar keeps running), then app containers.
        Each start asks GetDeviceRunContainerOptions (via GenerateRunContainerOptions → GetResources), which
        Allocates for a container asking a device plugin resource that has no devices recorded. Containers
        already started are left alone. Returns container -> env for the containers started with devices.

        Raises ContainerStartError (the container and the ones after it stay unstarted; kubelet retries)."""
        uid = pod_uid(pod)
        with self._admit_lock:
            rec = self.pod_record(uid)
            if rec is None or not rec.admitted or rec.terminal:
                raise ContainerStartError(uid, "", "the pod is not admitted (or is terminal)")
            regular_init = {c.get("name") for c in init_containers(rec.pod) if not is_restartable_init(c)}
            for container in _containers(rec.pod):
                name = container.get("name", "")
                if name in rec.started:
                    continue
                try:
                    env = self.dm.get_device_run_container_options(rec.pod, container)
                except DeviceManagerError as exc:
                    raise ContainerStartError(uid, name, str(exc)) from exc
                with self._lock:
                    rec.started[name] = env or {}
                    if name not in regular_init:  # a regular init container runs to completion
                        rec.running.add(name)
                    self._changed.notify_all()
            with self._lock:
                if not rec.terminal:
                    rec.phase = "Running"
                return {c: dict(e) for c, e in rec.started.items() if e}

    def started_envs(self) -> dict[PodRef, dict[str, dict[str, str]]]:
        """Active pods: container -> the env it was started with (empty: started without devices)."""
        with self._lock:
            return {r.ref: {c: dict(e) for c, e in r.started.items()} for r in self.active_pods()}

    def finish_pod(self, namespace: str, name: str, phase: str = "Succeeded") -> None:
        """The pod's containers exited: it is terminal, no longer active; its devices are freed at the next
        UpdateAllocatedDevices (the next allocation or PodResources List)."""
        with self._lock:
            for rec in self._pod_manager.values():
                if rec.ref == (namespace, name) and not rec.terminal:
                    rec.phase = phase
                    rec.running.clear()
            self._changed.notify_all()

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod finished or was deleted: it leaves the pod manager (HandlePodRemoves), so its devices are
        free again at the next UpdateAllocatedDevices."""
        with self._lock:
            for uid in [u for u, r in self._pod_manager.items() if r.ref == (namespace, name)]:
                del self._pod_manager[uid]
            self._changed.notify_all()

    # -- driven by the API server -------------------------------------------------------------------------

    def run_with_kube(
        self,
        kube: Any,
        node: str,
        order: Callable[[list[Pod]], list[Pod]] | None = None,
        interval: float = 0.2,
        stop: threading.Event | None = None,
    ) -> threading.Thread:
        """Act as kubelet for the pods a KubeClient shows bound to `node`: admit new ones (each batch
        reordered by `order`; kubelet sorts one batch by creation time, but pods arrive in many batches),
        start their containers and report Running; a rejected pod is reported Failed with kubelet's reason and
        message. Pods gone from the API leave the pod manager; pods the API shows terminal become inactive.
        Returns the (daemon) thread; it ends with `stop` or stop()."""
        stop = stop or self._loop_stop
        self._source = _Source(kube, node)

        def loop() -> None:
            while not stop.is_set():
                try:
                    pods = self._list_source()
                except Exception as exc:  # keep going, as kubelet's reflector does
                    log.warning("kubelet stand-in: listing pods failed: %s", exc)
                    stop.wait(interval)
                    continue
                self._sync_source(pods, order)
                self._run_pod_workers()
                stop.wait(interval)

        t = threading.Thread(target=loop, name="kubelet-standin", daemon=True)
        t.start()
        return t

    def _list_source(self) -> list[Pod]:
        assert self._source is not None
        return list(self._source.kube.list_pods(field_selector=f"spec.nodeName={self._source.node}").items)

    def _sync_source(self, pods: list[Pod], order: Callable[[list[Pod]], list[Pod]] | None) -> None:
        with self._admit_lock:
            by_uid = {pod_uid(p): p for p in pods}
            with self._lock:
                for uid, rec in list(self._pod_manager.items()):
                    api = by_uid.get(uid)
                    if api is None:
                        if rec.from_source:  # HandlePodRemoves
                            del self._pod_manager[uid]
                        continue
                    phase = (api.get("status") or {}).get("phase")
                    if phase in TERMINAL and not rec.terminal:  # HandlePodUpdates: terminal in the API
                        rec.phase = phase
                        rec.running.clear()
                self._changed.notify_all()
                new = [p for uid, p in by_uid.items() if uid not in self._pod_manager]
            batch = []
            for pod in new:
                if (pod.get("status") or {}).get("phase") in TERMINAL:
                    self._admit(pod, from_source=True)  # into the pod manager, not admitted
                else:
                    batch.append(pod)
            for pod in order(batch) if order else batch:
                try:
                    self._admit(pod, from_source=True)
                except AdmissionError as exc:
                    log.warning("kubelet stand-in: pod %s rejected: %s", pod_uid(pod), exc)
                    continue
                rec = self.pod_record(pod_uid(pod))
                if rec is not None and rec.admitted and not rec.terminal:
                    self._to_start.append(rec.uid)

    def _run_pod_workers(self) -> None:
        with self._admit_lock:
            pending, self._to_start = self._to_start, []
            for uid in pending:
                rec = self.pod_record(uid)
                if rec is None or rec.terminal:
                    continue
                was = rec.phase
                try:
                    self.start_containers(rec.pod)
                except ContainerStartError as exc:
                    log.warning("kubelet stand-in: %s (will retry)", exc)
                    self._to_start.append(uid)
                    continue
                if was != "Running":
                    self._report(rec)

    def _container_statuses(self, rec: PodRecord) -> dict[str, Any]:
        """kubelet_pods.go generateAPIPodStatus → convertToAPIContainerStatuses, reduced to what a device
        plugin may read: a started container is running, a regular init container that ran is terminated
        (Completed), a container not started yet is waiting."""

        def status(c: Mapping[str, Any], init: bool) -> dict[str, Any]:
            name = c.get("name", "")
            if name not in rec.started:
                state: dict[str, Any] = {"waiting": {"reason": "PodInitializing"}}
            elif name in rec.running:
                state = {"running": {"startedAt": "1970-01-01T00:00:00Z"}}
            else:
                state = {"terminated": {"exitCode": 0, "reason": "Completed"}}
            started = "running" in state
            ready = started or (init and "terminated" in state)
            return {
                "name": name,
                "image": c.get("image", ""),
                "imageID": "",
                "state": state,
                "ready": ready,
                "restartCount": 0,
                "started": started,
            }

        with self._lock:
            out: dict[str, Any] = {"containerStatuses": [status(c, False) for c in app_containers(rec.pod)]}
            if init_containers(rec.pod):
                out["initContainerStatuses"] = [status(c, True) for c in init_containers(rec.pod)]
            return out

    def _report(self, rec: PodRecord) -> None:
        """The status manager writes the pod's phase to the API server (pods from the API source only)."""
        if self._source is None or not rec.from_source:
            return
        kube = self._source.kube
        extra = self._container_statuses(rec) if rec.phase == "Running" else None
        ns, name, phase, reason, message, uid = rec.namespace, rec.name, rec.phase, rec.reason, rec.message, rec.uid

        def write() -> None:
            for attempt in (extra, None) if extra else (None,):
                try:
                    set_pod_phase(kube, ns, name, phase, reason, message, uid, attempt)
                    return
                except Exception as exc:  # the status manager retries; so does the next sync
                    log.warning("kubelet stand-in: status of %s/%s not written: %s", ns, name, exc)

        if self.status_lag <= 0:
            write()
            return
        if self._status_writer is None:
            self._status_writer = threading.Thread(target=self._write_statuses, name="status-manager", daemon=True)
            self._status_writer.start()
        self._status_queue.put((time.monotonic() + self.status_lag, write))

    def _write_statuses(self) -> None:
        """The status manager's goroutine: each write `status_lag` after it was made, in order."""
        while not self._loop_stop.is_set():
            try:
                due, write = self._status_queue.get(timeout=0.1)
            except queue.Empty:
                continue
            time.sleep(max(0.0, due - time.monotonic()))
            write()


class _OtherPod(Exception):
    """The pod of that name has another UID now: the precondition fails, nothing is written."""


def set_pod_phase(
    kube: Any,
    namespace: str,
    name: str,
    phase: str,
    reason: str = "",
    message: str = "",
    uid: str = "",
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write a pod's phase (and reason, message), as kubelet's status manager does (pkg/util/pod/pod.go
    PatchPodStatus: the pod's UID rides in the patch as a precondition, so a new pod of the same name is not
    touched). `extra`: more status fields (container statuses). FakeKube directly; a real API server through
    the status subresource."""
    status: dict[str, Any] = {"phase": phase}
    if reason or message:
        status.update(reason=reason, message=message)
    status.update(extra or {})
    if hasattr(kube, "set_pod_phase"):  # FakeKube
        if not uid and len(status) == 1:
            kube.set_pod_phase(namespace, name, phase)
            return

        def mutate(pod: dict[str, Any]) -> None:
            if uid and (pod.get("metadata") or {}).get("uid", uid) != uid:
                raise _OtherPod
            pod.setdefault("status", {}).update(status)

        with contextlib.suppress(_OtherPod):
            kube.update_pod(namespace, name, mutate)
        return
    body: dict[str, Any] = {"status": status}
    if uid:
        body["metadata"] = {"uid": uid}
    kube.request(  # ApiServerClient: KubeClient has no status write, and only kubelet needs one
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        body=body,
        content_type="application/merge-patch+json",
    )
