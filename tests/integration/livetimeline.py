"""A share-sim timeline replayed live: pods created at their arrival and deleted at their departure through
the real etcd, kube-apiserver, kube-scheduler and our extender as the chart installs them
(bench/bench_live_timeline.py, tests/integration/test_live_timeline.py).

The set-up is the chart's: its RBAC applied and the extender run under its ServiceAccount (as
tests/controlplane/gpucluster.py runs it), the extender reading the chart's configuration file (policy,
filterKeeps, threads; `memoryUnit: MiB`, so an openb GPU of 1000 units maps one to one, as in
tests/integration/livesim.py), kube-scheduler started from the chart's KubeSchedulerConfiguration (its
extender URL pointed at this extender, leader election off). Nodes are bare Node objects (no kubelet: pods
are bound, never run), pods carry the trace's CPU and memory as requests and their scheduling priority as
a PriorityClass that never preempts (`preemptionPolicy: Never`: share-sim's timeline preempts nothing).

The clock: simulated time t runs `compression` times faster than the wall clock, t = compression x (wall
seconds since the start). Each arrival is created when its time comes; kube-scheduler alone decides when
it is tried again (its own queue, backoff and requeueing on cluster events); once the watch shows it bound,
its departure is due `duration` simulated seconds later, and then it is deleted (grace period 0); it frees
its room when the watch shows it gone. Every time is taken on this side, when the request is sent or the
watch event arrives, and converted to simulated seconds, so the figures are computed from the same kind of
records share-sim keeps (tests/integration/livefigures.py).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import orjson
import yaml

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_node
from share_core.contract import NODE_LABEL
from share_core.contract import NODE_LABEL_VALUE
from share_core.kube import ApiServerClient
from share_core.kube import NotFound
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import create_node
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.cluster import SchedulerHandle
from tests.controlplane.cluster import free_port
from tests.controlplane.cluster import http_status
from tests.controlplane.gpucluster import EXTENDER_SA
from tests.controlplane.gpucluster import NAMESPACE as CHART_NAMESPACE
from tests.controlplane.gpucluster import RELEASE
from tests.controlplane.gpucluster import install_chart_rbac
from tests.controlplane.gpucluster import sa_identity
from tests.controlplane.gpucluster import wait_for
from tests.integration.livefigures import PodRecord
from tests.integration.liverun import PodWatch
from tests.integration.liverun import unschedulable
from tests.integration.livesim import node_object
from tests.integration.livesim import node_resources
from tests.integration.livesim import pod_object
from tests.unit.chart.helm import render_chart
from tests.unit.chart.helm import scheduler_config

log = logging.getLogger(__name__)

NAMESPACE = "live-timeline"
CHART_SCHEDULER = "gpushare-scheduler"  # the profile the chart's configuration defines
PRIORITY_CLASS = "timeline-priority-{}"  # one PriorityClass per priority value the arrivals carry


@dataclass
class Sample:
    """The cluster as the pods' annotations show it at one moment (simulated seconds)."""

    time: float
    allocated_units: int
    waiting: int
    gpus_over: list[str]  # "node/GPU used/total" for every GPU promised more than it has


@dataclass
class LiveTimelineResult:
    records: list[PodRecord]
    samples: list[Sample] = field(default_factory=list)
    lag_s: list[float] = field(default_factory=list)  # wall seconds each request went out after it was due
    setup_s: float = 0.0
    replay_s: float = 0.0
    extender_holds: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # at the end
    scheduler_counters: dict[str, float] = field(default_factory=dict)  # kube-scheduler's, at the end

    @property
    def gpus_over(self) -> list[str]:
        return [g for s in self.samples for g in s.gpus_over]

    def lag_summary(self) -> dict[str, float]:
        if not self.lag_s:
            return {"p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0}
        ordered = sorted(self.lag_s)
        return {
            "p50_s": statistics.median(ordered),
            "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "max_s": ordered[-1],
        }


# --------------------------------------------------------------------------- the cluster, as the chart installs it


def chart_documents(policy: str) -> list[dict[str, Any]]:
    """The chart rendered with this policy and a GPU of 1000 "MiB" (openb's units)."""
    return render_chart(
        set_values={"scheduler.policy": policy, "memoryUnit": "MiB"}, release=RELEASE, namespace=CHART_NAMESPACE
    )


def chart_extender_config(docs: Sequence[dict[str, Any]]) -> str:
    """The programs' configuration file the chart mounts into the extender (its --config)."""
    configmaps = [d for d in docs if d.get("kind") == "ConfigMap" and "config.yaml" in (d.get("data") or {})]
    if len(configmaps) != 1:
        raise LookupError(f"expected one ConfigMap with config.yaml in the chart, found {len(configmaps)}")
    return configmaps[0]["data"]["config.yaml"]


def chart_scheduler_config(docs: Sequence[dict[str, Any]], extender_url: str) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration, the extender reached at `extender_url` (in the chart it is
    127.0.0.1 in the same pod) and leader election off (this test identity may not take the chart's
    Lease; tests/integration/test_chart.py does the same)."""
    config = scheduler_config(docs)
    (extender,) = config["extenders"]
    extender["urlPrefix"] = f"{extender_url}/gpushare-scheduler"
    config["leaderElection"] = {"leaderElect": False}
    return config


@dataclass
class ChartScheduler:
    """The extender and kube-scheduler of one run; stop() ends both, by PID."""

    extender: ManagedProcess
    url: str
    scheduler: SchedulerHandle | None = None

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.process.stop()
        self.extender.stop()

    def logs(self, lines: int = 60) -> str:
        out = f"--- extender ---\n{self.extender.log_tail(lines)}"
        if self.scheduler is not None:
            out += f"\n--- kube-scheduler ---\n{self.scheduler.process.log_tail(lines)}"
        return out


def start_chart_scheduler(
    cp: ControlPlane, workdir: Path, policy: str, extender_flags: Sequence[str] = ()
) -> ChartScheduler:
    """The chart's RBAC, the extender on its ServiceAccount with the chart's configuration, and
    kube-scheduler with the chart's scheduler configuration. `extender_flags` come after `--config` and
    override it (a bench's remedies, their times scaled to its clock)."""
    docs = chart_documents(policy)
    install_chart_rbac(cp)
    kubeconfig = cp.kubeconfig_for(*sa_identity(CHART_NAMESPACE, EXTENDER_SA))
    config_path = workdir / "gpushare-config.yaml"
    config_path.write_text(chart_extender_config(docs))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The chart's container runs `share-scheduler --config=...`; the address and port are this host's.
    argv = [sys.executable, "-m", "share_scheduler.cli", f"--config={config_path}", "--kubeconfig", str(kubeconfig),
            "--port", str(port), "--bind-address", "127.0.0.1", *extender_flags]  # fmt: skip
    extender = ManagedProcess("extender", argv, workdir / "extender.log")
    running = ChartScheduler(extender, url)
    try:
        try:
            wait_for(lambda: http_status(url + "/readyz") == 200, 90, "the extender's first sync", interval=0.2)
        except TimeoutError as exc:
            raise extender.fail(str(exc)) from exc
        config = chart_scheduler_config(docs, url)
        running.scheduler = cp.launch_scheduler(yaml.safe_dump(config), "kube-scheduler-timeline")
    except BaseException:
        running.stop()
        raise
    return running


def create_cluster_objects(admin: ApiServerClient, nodes: Sequence[SimNode], priorities: set[int]) -> None:
    """The namespace, the nodes (bare, labelled gpushare=true) and one PriorityClass per priority."""
    admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    for value in sorted(priorities):
        admin.request(
            "POST",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            body={
                "metadata": {"name": PRIORITY_CLASS.format(value)},
                "value": value,
                "preemptionPolicy": "Never",
                "description": "share-sim timeline priority (openb QoS); never preempts, as in share-sim",
            },
        )

    def make(node: SimNode) -> None:
        annotations = node_object(node)["metadata"]["annotations"]
        create_node(admin, node.name, node_resources(node), {NODE_LABEL: NODE_LABEL_VALUE}, annotations)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, nodes))


def timeline_pod(name: str, pod: SimPod) -> dict[str, Any]:
    """An arrival as a Pod of the chart's profile: livesim's objects (trace CPU and memory as requests,
    GPU units as nvidia.com/gpu-mem, gpu-count for a multi-GPU pod), created when it arrives (no gate),
    with its priority's class."""
    body = pod_object(name, pod, CHART_SCHEDULER)
    del body["spec"]["schedulingGates"]
    body["spec"]["priorityClassName"] = PRIORITY_CLASS.format(pod.priority)
    return body


# --------------------------------------------------------------------------- the replay


class _Clock:
    """Simulated seconds from the wall clock: t = compression x (monotonic - start)."""

    def __init__(self, compression: float) -> None:
        if compression <= 0:
            raise ValueError(f"compression must be positive, got {compression}")
        self.compression = compression
        self.start = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self.start) * self.compression

    def wall_at(self, t: float) -> float:
        return self.start + t / self.compression


class LiveTimeline:
    """Drives one replay: arrivals and departures on the clock, bindings seen by the watch."""

    def __init__(
        self,
        admin: ApiServerClient,
        pods: Sequence[SimPod],
        arrivals: Sequence[Arrival],
        compression: float,
        end_s: float,
        sample_every_s: float,
        gpu_sizes: dict[str, tuple[int, ...]],
    ) -> None:
        self.admin = admin
        self.pods = [pods[a.pod] for a in arrivals]  # the pod of each arrival
        self.arrivals = arrivals
        self.names = [f"t-{i:05d}" for i in range(len(arrivals))]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.compression = compression
        self.end_s = end_s
        self.sample_every_s = sample_every_s
        self.gpu_sizes = gpu_sizes
        self.records = [PodRecord() for _ in arrivals]
        self.lag: list[float] = []
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self.held: dict[str, tuple[str, tuple[int, ...], int]] = {}  # bound, not deleted: node, GPUs, per GPU
        self.gone: set[str] = set()  # pods the watch has shown deleted
        self.asked: set[int] = set()  # arrivals whose delete request went out
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, str, int]] = []  # (simulated time, seq, "create"|"delete", arrival)
        self._seq = itertools.count()
        self._clock: _Clock | None = None
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="timeline-api")

    # -- events from the watch -------------------------------------------------------------------

    def on_pod(self, event_type: str, pod: dict[str, Any]) -> None:
        """Keep what the API server holds of every bound arrival (node, GPUs, per-GPU units, from its
        annotations) until it is deleted; the first time one shows bound, note when and make its departure
        due `duration` simulated seconds later."""
        name = pod["metadata"]["name"]
        i = self.index.get(name)
        if i is None or self._clock is None:
            return
        node = pod_node(pod)
        with self._lock:
            record = self.records[i]
            if event_type == "DELETED":  # gone from the API server: its room is free from now
                self.held.pop(name, None)
                self.gone.add(name)
                if record.deleted is None:
                    record.deleted = self._clock.now()
                self._lock.notify_all()
                return
            if not node:
                if record.bound is None and unschedulable(pod):
                    record.waited = True  # kube-scheduler found it no room: it went to the queue
                return
            assignment = parse_assignment(pod_annotations(pod))
            gpus = tuple(sorted(assignment.gpu_indices)) if assignment else ()
            self.held[name] = (node, gpus, assignment.per_gpu if assignment else 0)
            if record.bound is not None:
                return
            record.bound = self._clock.now()
            record.node, record.gpus = node, gpus
            self._push(record.bound + self.arrivals[i].duration, "delete", i)

    def _push(self, t: float, kind: str, i: int) -> None:
        heapq.heappush(self._due, (t, next(self._seq), kind, i))
        self._lock.notify_all()

    # -- requests ---------------------------------------------------------------------------------

    def _send(self, kind: str, i: int, due: float) -> None:
        """Create or delete arrival `i`, due at simulated second `due`; how late it went out is noted, and a
        creation's time is taken as the request goes out."""
        assert self._clock is not None
        with self._lock:
            now = self._clock.now()
            self.lag.append((now - due) / self.compression)
            if kind == "create":
                self.records[i].created = now
            else:
                self.asked.add(i)
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        try:
            if kind == "create":
                self.admin.request("POST", path, body=timeline_pod(self.names[i], self.pods[i]))
            else:
                self.admin.request("DELETE", f"{path}/{self.names[i]}", query={"gracePeriodSeconds": 0})
        except NotFound as exc:
            if kind == "create":
                self.errors.append(f"{kind} {self.names[i]}: {exc}")
        except Exception as exc:  # noted and reported: one lost request must not stop the replay
            self.errors.append(f"{kind} {self.names[i]}: {exc}")

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, watch: PodWatch) -> None:
        """The replay, from now until `end_s` simulated seconds (the watch already runs)."""
        for i, a in enumerate(self.arrivals):
            if a.time < self.end_s:
                self._due.append((a.time, next(self._seq), "create", i))
        heapq.heapify(self._due)
        self._clock = clock = _Clock(self.compression)
        next_sample = 0.0
        try:
            while True:
                with self._lock:
                    now = clock.now()
                    if now >= next_sample:
                        self.samples.append(self._sample(now))
                        next_sample = now + self.sample_every_s
                    if now >= self.end_s:
                        break
                    due_at = self._due[0][0] if self._due else self.end_s
                    if due_at > now:
                        wake = min(due_at, next_sample, self.end_s)
                        self._lock.wait(max(0.0, clock.wall_at(wake) - time.monotonic()))
                        continue
                    t, _, kind, i = heapq.heappop(self._due)
                if watch.error is not None:
                    raise RuntimeError(f"the pod watch died: {watch.error!r}")
                self._pool.submit(self._send, kind, i, t)
        finally:
            self._pool.shutdown(wait=True)

    def _sample(self, now: float) -> Sample:
        """Allocation and waiting pods from the records; every GPU's use from the bound pods' annotations
        (under the lock)."""
        units = waiting = 0
        for i, r in enumerate(self.records):
            if r.created is None:
                continue
            if r.bound is None:
                waiting += 1
            elif r.deleted is None:
                units += self.pods[i].gpu_request
        used: dict[tuple[str, int], int] = {}
        for node, gpus, per_gpu in self.held.values():
            for g in gpus:
                used[(node, g)] = used.get((node, g), 0) + per_gpu
        over = [
            f"{node}/{g} {u}/{self.gpu_sizes[node][g]}" for (node, g), u in used.items() if u > self.gpu_sizes[node][g]
        ]
        return Sample(now, units, waiting, over)

    def settle(self, timeout: float) -> bool:
        """Wait until the watch has shown every pod deleted that was asked to be; whether it did."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                missing = [self.names[i] for i in self.asked if self.names[i] not in self.gone]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return not missing
                self._lock.wait(min(left, 0.5))


def extender_holders(url: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Which pod the extender counts on which node and GPUs (its /inspect), by "namespace/name"."""
    with urllib.request.urlopen(f"{url}/gpushare-scheduler/inspect", timeout=30) as resp:
        view = orjson.loads(resp.read())
    held: dict[str, list[int]] = {}
    nodes: dict[str, str] = {}
    for node in view["nodes"]:
        for gpu in node["gpus"]:
            for pod in gpu["pods"]:
                held.setdefault(pod["pod"], []).append(gpu["index"])
                nodes[pod["pod"]] = node["name"]
    return {key: (nodes[key], tuple(sorted(indices))) for key, indices in held.items()}


SCHEDULER_SERIES = ("scheduler_schedule_attempts_total", "scheduler_queue_incoming_pods_total")


def scheduler_counters(cp: ControlPlane, handle: SchedulerHandle) -> dict[str, float]:
    """kube-scheduler's own count of scheduling attempts (by result) and of pods moved between its queues
    (by event and queue), from its /metrics, as `series{labels}` -> value."""
    url = f"https://127.0.0.1:{handle.port}/metrics"
    with urllib.request.urlopen(url, context=cp.admin_context(verify_server=False), timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(SCHEDULER_SERIES):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def run_live_timeline(
    cp: ControlPlane,
    workdir: Path,
    policy: str,
    workload: Workload,
    arrivals: Sequence[Arrival],
    compression: float,
    end_s: float,
    sample_every_s: float | None = None,
    extender_flags: Sequence[str] = (),
) -> LiveTimelineResult:
    """Replay `arrivals` up to simulated second `end_s` through the chart's scheduler on `nodes`; at the
    end, once the watch has shown every deleted pod gone, what the extender still counts."""
    started = time.monotonic()
    admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-timeline")
    nodes = workload.nodes
    create_cluster_objects(admin, nodes, {workload.pods[a.pod].priority for a in arrivals})
    running = start_chart_scheduler(cp, workdir, policy, extender_flags)
    timeline = LiveTimeline(
        admin,
        workload.pods,
        arrivals,
        compression,
        end_s,
        sample_every_s if sample_every_s is not None else end_s / 200,
        {n.name: n.gpus for n in nodes},
    )
    watch = None
    try:
        rv = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"limit": 1})["metadata"][
            "resourceVersion"
        ]
        watch = PodWatch(admin, rv, namespace=NAMESPACE, on_event=timeline.on_pod)
        setup_s = time.monotonic() - started
        timeline.run(watch)
        replay_s = time.monotonic() - started - setup_s
        if not timeline.settle(30):
            raise RuntimeError("the watch did not show every deleted pod gone within 30 s")
        held = extender_holders(running.url)
        counters = scheduler_counters(cp, running.scheduler) if running.scheduler is not None else {}
    except BaseException:
        log.error("replay failed:\n%s", running.logs())
        raise
    finally:
        if watch is not None:
            watch.stop()
        running.stop()
    if timeline.errors:
        raise RuntimeError(f"{len(timeline.errors)} API requests failed; first: {timeline.errors[:3]}")
    return LiveTimelineResult(timeline.records, timeline.samples, timeline.lag, setup_s, replay_s, held, counters)
