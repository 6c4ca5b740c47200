"""Scheduling throughput through the real kube-scheduler: alone, and with our extender, in one run.

Real etcd, kube-apiserver and kube-scheduler from hack/build-k8s.sh; no kubelets (pods are only
bound). Creates N nodes of G GPUs, then for each scenario starts a kube-scheduler of its own (the
`extenders` of a KubeSchedulerConfiguration apply to every profile, so "alone" cannot be a second
profile of the extender's scheduler), creates M pods at once and waits until all are bound.

Prints per scenario: pods/s (M over first create to last bind seen), scheduling latency p50/p99
(create to bound, seen by a watch), CPU seconds per 1,000 pods of etcd, kube-apiserver,
kube-scheduler, the extender and this client, and the extender's own mean filter/bind time; also
kube-scheduler's own cycle (its scheduling_algorithm and Filter/Score histograms: the extender's filter
round trip is algorithm less Filter) and each server's time runnable but waiting for a CPU (schedstat).
--pprof DIR adds py-spy's profile of the extender (bench/stacks_top.py ranks it) to the Go ones. The
ratio to "alone" at the same client QPS is the figure to read: every process shares the machine's
cores, so absolute numbers move with the machine, ratios far less. The extenders run as installed:
with the chart's ServiceAccount, RBAC and a token (--extender-auth admin-cert: the admin certificate,
as runs before 2026-11-23 did); kube-scheduler with a client certificate, as kubeadm runs it.

  python bench/bench_throughput.py                      # 1,000 nodes x 8 GPUs, 2,000 pods
  python bench/bench_throughput.py --nodes 5000 --qps 1000
  python bench/bench_throughput.py --baseline-src /work/base   # also an older checkout's extender
  python bench/bench_throughput.py --pace 20 --pods 400   # paced: bind latency when nothing queues
  python bench/bench_throughput.py --cpu-share 0.1335     # mixed: openb's share of CPU-only pods
  python bench/bench_throughput.py --watcher              # also alone with our extender watching beside it
  python bench/bench_throughput.py --webhook              # also each policy with share-webhook on
  python bench/bench_throughput.py --webhook --baseline-webhook /work/base   # and an older checkout's webhook
  python bench/bench_throughput.py --ready --nodes 5000 --running 40000   # extender time to ready
  python bench/bench_throughput.py --pace 20 --pods 400 --policies binpack --qps 1000 --rounds 3 \
      --go-extender /work/goorig/bin/gpushare-sche-extender   # side by side with the Go original

--go-extender runs the Go original (AliyunContainerService/gpushare-scheduler-extender, built outside
this repository; the bench never builds or fetches it) as one more scenario, in the paced mode and in
--ready. It reads aliyun.com/gpu-mem and aliyun.com/gpu-count on nodes and pods and its own ALIYUN_COM_*
annotations, so the nodes carry both its capacity and ours, its scenario's pods ask for aliyun.com/gpu-mem,
and its kube-scheduler gets our configuration with only managedResources changed (same flags, same
profile; its routes are /gpushare-scheduler/filter and /bind, as ours). It exposes no latency metrics:
its kube-scheduler calls it through a loopback TimingProxy, and ours runs once more behind the same
proxy, so `bind@proxy`/`filter@proxy` are the same extender-side measure for both; p50/p99 remain
create-to-bound as the watch sees it. With --ready it is ready once /version answers, and the time until
its cache holds every running pod is printed too (it may serve before its pod informer has synced).

--webhook adds a scenario per policy ("<policy> +webhook") in which the chart's admission webhook
configurations are installed and share-webhook runs (its own process at INFO, as installed, called by
kube-apiserver over TLS on 127.0.0.1: tests/controlplane/webhook.py, as tests/integration/test_webhook.py
runs it); its pods name no scheduler, so every one is given ours and validated at creation. The
configurations are removed after the scenario. --webhook-mutation policy,webhook runs it once per way the
chart sets the scheduler ("<policy> +webhook (policy)": the chart's MutatingAdmissionPolicy, applied inside
kube-apiserver, 1.36+; "(webhook)": share-webhook's /mutate); auto, the default, is what helm would
install. --baseline-webhook adds "<policy> +webhook (baseline)": the same with an older checkout's
share-webhook (this tree's extender and chart), the webhook's before and after in one run.

One piece: one benchmark script, its scenarios sharing one control plane and one report.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from share_core.assignment import Assignment  # noqa: E402
from share_core.contract import RESOURCE_MEM  # noqa: E402
from share_core.kube import ApiServerClient  # noqa: E402
from share_core.kube import KubeError  # noqa: E402
from tests.controlplane.barenodes import create_bare_nodes  # noqa: E402
from tests.controlplane.barenodes import gpu_pod  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.controlplane.cluster import ManagedProcess  # noqa: E402
from tests.controlplane.cluster import free_port  # noqa: E402
from tests.controlplane.gpucluster import EXTENDER_SA  # noqa: E402
from tests.controlplane.gpucluster import NAMESPACE as CHART_NAMESPACE  # noqa: E402
from tests.controlplane.gpucluster import install_chart_rbac  # noqa: E402
from tests.controlplane.webhook import Webhook  # noqa: E402

NAMESPACE = "bench"
EXTRA_EXTENDER_ARGS = [a for a in os.environ.get("BENCH_EXTENDER_ARGS", "").split() if a]
ALONE = "bench-alone"
SIZES = (1, 2, 2, 4, 4, 8)  # GiB per pod, drawn at random (seeded)
# The mixed workload (--cpu-share): openb's default trace has 1,088 CPU-only pods of 8,152 (13.35 %).
# Every pod of the mixed workload asks CPU and memory; a CPU-only pod asks no GPU (size 0) and, with
# no managedResources in our configuration, goes through the extender like every pod of the profile.
OPENB_CPU_SHARE = 1088 / 8152
HOST_REQUESTS = {"cpu": "500m", "memory": "1Gi"}

# The Go original's names (its pkg/utils/const.go), used only by the --go-extender scenario.
GO_RESOURCE_MEM = "aliyun.com/gpu-mem"
GO_RESOURCE_COUNT = "aliyun.com/gpu-count"
GO_ANN_INDEX = "ALIYUN_COM_GPU_MEM_IDX"
GO_ANN_POD = "ALIYUN_COM_GPU_MEM_POD"
GO_ANN_DEV = "ALIYUN_COM_GPU_MEM_DEV"
GO_ANN_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
GO_ANN_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
GO = "go"  # Scenario.policy of the Go original


# --------------------------------------------------------------------------- processes' CPU time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, user+system seconds) of one process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int, descendants: bool = True) -> float:
    """CPU time of a process and its descendants (a server that forks counts whole)."""
    if not descendants:
        st = _stat(pid)
        return st[1] if st else 0.0
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                stats[int(entry)] = st
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        total += stats[p][1]
        todo.extend(c for c, (ppid, _) in stats.items() if ppid == p)
    return total


def runqueue_wait_seconds(pid: int) -> float:
    """Time the process's live threads spent runnable but waiting for a CPU (/proc/PID/task/*/schedstat,
    second field, ns): on a saturated machine, the latency each hand-off between processes pays. Threads
    that ended meanwhile are not counted (the servers here keep theirs)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


# --------------------------------------------------------------------------- cluster objects


def go_node_resources(gpus: int, mem: int) -> dict[str, str]:
    """The Go original's node capacity: total GPU memory and GPU count (its GetTotalGPUMemory and
    GetGPUCountInNode read them from status.capacity), in the same unit as ours (GiB)."""
    return {GO_RESOURCE_MEM: str(gpus * mem), GO_RESOURCE_COUNT: str(gpus)}


def create_nodes(admin: ApiServerClient, count: int, gpus: int, mem: int, go: bool = False) -> list[str]:
    """`go`: each node also carries the Go original's capacity, so one cluster serves both extenders."""
    names = [f"node-{i:05d}" for i in range(count)]
    create_bare_nodes(admin, names, gpus, mem, extra=go_node_resources(gpus, mem) if go else None)
    return names


def go_assignment_annotations(gpu: int, mem: int, per_gpu: int) -> dict[str, str]:
    """What the Go original writes on a pod it bound (utils.GetUpdatedPodAnnotationSpec), assigned."""
    return {GO_ANN_INDEX: str(gpu), GO_ANN_POD: str(mem), GO_ANN_DEV: str(per_gpu), GO_ANN_ASSIGNED: "true",
            GO_ANN_ASSUME_TIME: str(time.time_ns())}  # fmt: skip


def pod_body(
    name: str,
    scheduler: str,
    mem: int,
    node: str | None = None,
    gpu: int = 0,
    resources: tuple[str, ...] = (RESOURCE_MEM,),
    per_gpu: int = 0,
) -> dict[str, Any]:
    """`resources`: the GPU-memory resource names the pod asks `mem` of (ours, the Go original's, or
    both for a running pod both extenders must count); a bound pod gets each one's annotations."""
    pod = gpu_pod(NAMESPACE, name, scheduler, mem)
    pod["spec"]["containers"][0]["resources"]["limits"] = {r: str(mem) for r in resources} if mem else {}
    if node is not None:  # already bound, with its GPU recorded (a cluster that is running)
        pod["spec"]["nodeName"] = node
        ann: dict[str, str] = {}
        if RESOURCE_MEM in resources:
            ann |= Assignment((gpu,), (f"GPU-{node}-{gpu}",), mem, time.time_ns(), True).to_annotations()
        if GO_RESOURCE_MEM in resources:
            ann |= go_assignment_annotations(gpu, mem, per_gpu)
        pod["metadata"]["annotations"] = ann
    return pod


def delete_all_pods(admin: ApiServerClient, timeout: float = 600.0) -> None:
    """Delete the namespace's pods, asking again while some are left.

    A collection of thousands can outlive the client's timeout; the API server then cancels the
    deletion with the request's context, part done (seen at 5,000 nodes: 156 of 2,000 pods left,
    nothing deleting them), so one DELETE and a wait is not enough."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            admin.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"gracePeriodSeconds": "0"})
        except KubeError as exc:
            print(f"# deleting pods: {exc}; asking again", file=sys.stderr)
        try:
            left = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"limit": "1"})
        except KubeError:
            left = {"items": [None]}
        if not left.get("items"):
            return
        time.sleep(1.0)
    raise TimeoutError("pods were not deleted")


# --------------------------------------------------------------------------- one scenario


@dataclass(frozen=True)
class Scenario:
    label: str
    qps: int
    policy: str | None = None  # None: kube-scheduler alone
    src: Path = ROOT  # the checkout whose extender runs
    filter_keeps: str | None = "best"  # None: a checkout without --filter-keeps
    bind_events: str | None = None  # --bind-events, where the checkout has it
    binary: Path | None = None  # policy GO: the Go original's binary
    proxied: bool = False  # kube-scheduler calls the extender through a TimingProxy
    webhook: bool = False  # share-webhook gives the pods their scheduler at admission (they name none)
    webhook_src: Path = ROOT  # the checkout whose share-webhook runs
    webhook_mutation: str = "auto"  # the chart's webhook.mutation: policy (1.36+), webhook, auto
    # The extender runs and watches but kube-scheduler schedules alone (--watcher): what our watches cost
    # kube-apiserver (and the extender) with no verb called.
    watch_only: bool = False

    @property
    def scheduler_name(self) -> str:
        return ALONE if self.policy is None or self.watch_only else "gpushare-scheduler"

    @property
    def resource(self) -> str:
        """The GPU-memory resource this scenario's pods ask for."""
        return GO_RESOURCE_MEM if self.policy == GO else RESOURCE_MEM


def webhook_mutations(ap: argparse.ArgumentParser, value: str) -> list[str]:
    """--webhook-mutation: the chart's webhook.mutation values, one scenario each (bench_admission too)."""
    mutations = [m for m in value.split(",") if m]
    if not mutations or set(mutations) - {"auto", "policy", "webhook"}:
        ap.error("--webhook-mutation takes auto, policy and webhook")
    return mutations


def print_config(src: Path, extender_url: str, filter_keeps: str | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "share_scheduler.cli", "print-config", "--extender-url", extender_url,
            "--no-leader-elect"]  # fmt: skip
    if filter_keeps:
        argv += ["--filter-keeps", filter_keeps]
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=src, env=env).stdout
    return yaml.safe_load(out)


def go_extender_config(config: dict[str, Any]) -> dict[str, Any]:
    """Our KubeSchedulerConfiguration turned to the Go original: the same flags and profile, its
    resource as the managed one, and only the verbs it serves (filter, bind: pkg/routes/routes.go)."""
    out = dict(config)
    extenders = []
    for ext in config["extenders"]:
        ext = {k: v for k, v in ext.items() if k not in ("prioritizeVerb", "weight", "preemptVerb")}
        ext["managedResources"] = [{"name": GO_RESOURCE_MEM, "ignoredByScheduler": False}]
        if ext.get("filterVerb") != "filter" or ext.get("bindVerb") != "bind":
            raise ValueError(f"the Go original serves filter and bind only, not {ext}")
        extenders.append(ext)
    out["extenders"] = extenders
    return out


def scheduler_config(sc: Scenario, extender_url: str) -> dict[str, Any]:
    if sc.policy == GO:  # our configuration as the Go original's chart would have it: same flags
        return go_extender_config(scheduler_config(Scenario(sc.label, sc.qps, "binpack"), extender_url))
    config = print_config(sc.src, extender_url, sc.filter_keeps)
    if sc.policy is None or sc.watch_only:
        # The same configuration, without the extender: same profile shape, same percentage.
        del config["extenders"]
        config["profiles"][0]["schedulerName"] = ALONE
    config["clientConnection"] = {"qps": sc.qps, "burst": sc.qps}
    return config


# --------------------------------------------------------------------------- the extenders' credentials

# Which kubeconfig each extender runs with; empty: the admin certificate (install_identities fills it).
KUBECONFIGS: dict[str, Path] = {}
GO_SA = "gpushare-go-original"


def install_identities(cp: ControlPlane) -> None:
    """Run the extenders as they run when installed: ours as the chart's ServiceAccount, with the
    chart's RBAC, authenticating with a service account token (what its pod's in-cluster config
    holds); the Go original as a ServiceAccount of its own (its chart's RBAC is not ours: bound to
    cluster-admin here), also by token. kube-scheduler keeps a client certificate, as kubeadm runs it.

    Why it matters to the figures: the admin kubeconfig's certificate is verified on every request
    (x509.Verify, an ECDSA check), and Python's TLS (OpenSSL) sends the CA certificate along with it,
    which the front-proxy (requestheader) authenticator then also checks: by kube-apiserver's profile,
    client-certificate authentication cost 0.48 ms per pod with our binds against 0.38 with
    kube-scheduler's (docs/policies.md "How the policy meets kube-scheduler"), a cost the installed
    extender, on a cached token, does not have."""
    install_chart_rbac(cp)
    KUBECONFIGS["ours"] = cp.token_kubeconfig(CHART_NAMESPACE, EXTENDER_SA)
    cp.kubectl("create", "serviceaccount", GO_SA, "-n", CHART_NAMESPACE, check=False)
    cp.kubectl("create", "clusterrolebinding", GO_SA, "--clusterrole=cluster-admin",
               f"--serviceaccount={CHART_NAMESPACE}:{GO_SA}", check=False)  # fmt: skip
    KUBECONFIGS[GO] = cp.token_kubeconfig(CHART_NAMESPACE, GO_SA)


def extender_kubeconfig(cp: ControlPlane, policy: str | None) -> Path:
    return KUBECONFIGS.get(GO if policy == GO else "ours", cp.admin_kubeconfig)


def start_go_extender(
    sc: Scenario, cp: ControlPlane, workdir: Path, log_path: Path | None = None
) -> tuple[ManagedProcess, str]:
    """The Go original, configured as its cmd/main.go reads it: PORT and KUBECONFIG from the
    environment, its default log level; ready once /version answers (it serves after its node
    informer has synced and it has built its cache from the pod lister)."""
    assert sc.binary is not None
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "PORT": str(port), "KUBECONFIG": str(extender_kubeconfig(cp, GO))}
    log_path = log_path or workdir / f"extender-{sc.label}.log"
    proc = ManagedProcess("go-extender", [sc.binary], log_path, env=env, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/version", proc, 300)
    return proc, url


def stop_extender(sc: Scenario, proc: ManagedProcess) -> None:
    """The Go original exits on a second SIGTERM only (the first closes its informers' stop channel
    while its HTTP server keeps serving: pkg/utils/signals): send one, then stop() sends the second."""
    if sc.policy == GO and proc.alive():
        proc.popen.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    proc.stop()


def start_extender(sc: Scenario, cp: ControlPlane, workdir: Path) -> tuple[ManagedProcess, str]:
    if sc.policy == GO:
        return start_go_extender(sc, cp, workdir)
    port = free_port()
    # BENCH_EXTENDER_MAIN: a script to run instead of the module (e.g. a profiler wrapping share_scheduler.cli.main)
    wrapper = os.environ.get("BENCH_EXTENDER_MAIN")
    main = [wrapper] if wrapper else ["-m", "share_scheduler.cli"]
    kubeconfig = extender_kubeconfig(cp, sc.policy)
    argv = [sys.executable, *main, "--port", str(port), "--bind-address", "127.0.0.1",
            "--kubeconfig", str(kubeconfig), "--policy", str(sc.policy), "--log-level", "INFO"]  # fmt: skip
    if sc.filter_keeps:
        argv += ["--filter-keeps", sc.filter_keeps]
    if sc.bind_events:
        argv += ["--bind-events", sc.bind_events]
    argv += EXTRA_EXTENDER_ARGS  # BENCH_EXTENDER_ARGS: more flags for our extender (e.g. --threads 64)
    env = dict(os.environ, PYTHONPATH=str(sc.src))
    proc = ManagedProcess("extender", argv, workdir / f"extender-{sc.label}.log", env=env, cwd=sc.src)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/readyz", proc, 300)
    return proc, url


class TimingProxy:
    """A loopback HTTP proxy in front of an extender that times each call it forwards, by verb (the
    last path segment): the same extender-side measure for the Go original, which exposes no
    metrics, and for ours behind the same proxy. It times the upstream round trip only (the
    extender's handler plus one loopback HTTP exchange), not its own parsing."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.times: dict[str, list[float]] = {}
        self.errors = 0  # calls that found no extender behind the proxy
        self._lock = threading.Lock()
        self._local = threading.local()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep kube-scheduler's connections open, as without it

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {"Content-Type": self.headers.get("Content-Type") or "application/json"}
                try:
                    status, data = proxy.call(self.command, self.path, body, headers)
                except OSError as exc:  # the extender is gone or dropped the call: kube-scheduler sees a 502
                    proxy._local.conn = None
                    with proxy._lock:
                        proxy.errors += 1
                    status, data = 502, json.dumps({"error": f"proxy: {exc}"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def call(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        start = time.perf_counter()
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        elapsed = time.perf_counter() - start
        with self._lock:
            self.times.setdefault(path.rstrip("/").rsplit("/", 1)[-1], []).append(elapsed)
        return resp.status, data

    def latency(self) -> dict[str, dict[str, float]]:
        """Per verb, milliseconds: mean, p50, p99 (filter and bind; not the bench's own GETs)."""
        out = {}
        with self._lock:
            for verb, times in self.times.items():
                if verb not in ("filter", "bind"):
                    continue
                ts = sorted(times)
                out[verb] = {"mean": statistics.fmean(ts) * 1000, "p50": statistics.median(ts) * 1000,
                             "p99": ts[math.ceil(0.99 * len(ts)) - 1] * 1000}  # fmt: skip
        return out

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_http(url: str, proc: ManagedProcess, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not proc.alive():
            raise proc.fail("exited")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.05)
    raise proc.fail(f"{url} not ready in {timeout}s")


def extender_metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def _label(line: str, name: str) -> str:
    return line.split(f'{name}="')[1].split('"')[0]


def extender_latency(text: str) -> dict[str, dict[str, float]]:
    """Per verb: mean, and p50/p99 read off the histogram as Prometheus' histogram_quantile does
    (linear within the bucket), in milliseconds."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        value = line.rsplit(" ", 1)[-1]
        if line.startswith("gpushare_extender_request_seconds_bucket{"):
            le = _label(line, "le")
            buckets.setdefault(_label(line, "verb"), []).append(
                (float("inf") if le == "+Inf" else float(le), float(value))
            )
        elif line.startswith("gpushare_extender_request_seconds_sum{"):
            sums[_label(line, "verb")] = float(value)
        elif line.startswith("gpushare_extender_request_seconds_count{"):
            counts[_label(line, "verb")] = float(value)
    out = {}
    for verb, count in counts.items():
        if not count:
            continue
        row = {"mean": sums[verb] / count * 1000}
        cumulative = sorted(buckets[verb])
        for q in (0.5, 0.99):
            rank, lower, below = q * count, 0.0, 0.0
            for upper, seen in cumulative:
                if seen >= rank:
                    span = seen - below
                    upper = upper if upper != float("inf") else lower
                    row[f"p{int(q * 100)}"] = (lower + (upper - lower) * ((rank - below) / span if span else 1)) * 1000
                    break
                lower, below = upper, seen
        out[verb] = row
    return out


def bind_failures(text: str) -> dict[str, float]:
    return {_label(line, "reason"): float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("gpushare_bind_failures_total{")}  # fmt: skip


def apiserver_requests(admin: ApiServerClient) -> dict[str, float]:
    """kube-apiserver's own count of requests, by verb and resource (apiserver_request_total)."""
    text = admin._open("GET", "/metrics").data.decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
            what = f"{labels.get('verb')} {labels.get('resource')}"
            if labels.get("subresource"):
                what += f"/{labels['subresource']}"
            out[what] = out.get(what, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class BoundWatch:
    """Records when each pod of the namespace is first seen with a node."""

    def __init__(self, admin: ApiServerClient, expected: int) -> None:
        self.admin = admin
        self.expected = expected
        self.bound: dict[str, float] = {}
        self.done = threading.Event()
        rv = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"limit": "1"})["metadata"][
            "resourceVersion"
        ]
        self._thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self._thread.start()

    def _run(self, rv: str) -> None:
        while not self.done.is_set():
            for event in self.admin.watch_pods(rv, field_selector=f"metadata.namespace={NAMESPACE}"):
                obj = event.object
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if (obj.get("spec") or {}).get("nodeName"):
                    name = obj["metadata"]["name"]
                    if name not in self.bound:
                        self.bound[name] = time.monotonic()
                        if len(self.bound) >= self.expected:
                            self.done.set()
                            return


def measure_burst(
    cp: ControlPlane,
    admin: ApiServerClient,
    scheduler_pid: int,
    pods: int,
    create: Callable[[int], str],
    extender_pid: int | None = None,
    pace: float = 0,
    webhook_pid: int | None = None,
) -> dict[str, Any]:
    """Create `pods` pods (`create(i)` makes pod i and returns its name) all at once, or at `pace` pods/s,
    and wait until every one is bound: pods/s, create-to-bound latency, CPU per pod of each process and
    API calls per pod (not watches, not the bench's own GETs of /metrics)."""
    procs: dict[str, Callable[[], float]] = {
        "etcd": lambda: cpu_seconds(cp._etcd.pid),  # type: ignore[union-attr]
        "apiserver": lambda: cpu_seconds(cp._apiserver.pid),  # type: ignore[union-attr]
        "scheduler": lambda: cpu_seconds(scheduler_pid),
        "client": lambda: cpu_seconds(os.getpid(), descendants=False),  # the servers are our children
    }
    if extender_pid is not None:
        procs["extender"] = lambda: cpu_seconds(extender_pid)
    if webhook_pid is not None:
        procs["webhook"] = lambda: cpu_seconds(webhook_pid)
    waits: dict[str, Callable[[], float]] = {
        "apiserver": lambda: runqueue_wait_seconds(cp._apiserver.pid),  # type: ignore[union-attr]
        "scheduler": lambda: runqueue_wait_seconds(scheduler_pid),
    }
    if extender_pid is not None:
        waits["extender"] = lambda: runqueue_wait_seconds(extender_pid)
    watch = BoundWatch(admin, pods)
    before = {k: f() for k, f in procs.items()}
    waited_before = {k: f() for k, f in waits.items()}
    requests_before = apiserver_requests(admin)
    created: dict[str, float] = {}
    start = time.monotonic()

    def one(i: int) -> None:
        t = time.monotonic()
        created[create(i)] = t

    if pace:
        for i in range(pods):
            time.sleep(max(0.0, start + i / pace - time.monotonic()))
            one(i)
    else:
        with ThreadPoolExecutor(16) as pool:  # the client keeps 16 connections open
            list(pool.map(one, range(pods)))
    if not watch.done.wait(600):
        raise TimeoutError(f"only {len(watch.bound)}/{pods} pods bound in 600 s")
    end = max(watch.bound.values())
    after = {k: f() for k, f in procs.items()}
    waited = {k: (f() - waited_before[k]) * 1000 / pods for k, f in waits.items()}
    per_pod = {k: (v - requests_before.get(k, 0.0)) / pods for k, v in apiserver_requests(admin).items()}
    latencies = sorted(watch.bound[n] - created[n] for n in created)
    return {
        "pods_per_s": pods / (end - start),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000,
        "cpu_ms_per_pod": {k: (after[k] - before[k]) * 1000 / pods for k in procs},
        "runqueue_ms_per_pod": waited,
        "api_per_pod": {k: v for k, v in sorted(per_pod.items()) if v >= 0.05 and not k.startswith("WATCH")},
    }


PPROF_DIR: Path | None = None  # --pprof: CPU profiles of kube-apiserver and kube-scheduler per scenario
PPROF_SECONDS = 12


def capture_pprof(cp: ControlPlane, scheduler_port: int, label: str) -> None:
    """Go CPU profiles taken during the burst (`go tool pprof -top FILE` reads them)."""
    assert PPROF_DIR is not None
    context = cp.admin_context(verify_server=False)  # kube-scheduler's serving cert is self-signed
    time.sleep(1.5)  # into the burst
    targets = {"apiserver": cp.server, "scheduler": f"https://127.0.0.1:{scheduler_port}"}

    def fetch(item: tuple[str, str]) -> None:
        name, base = item
        url = f"{base}/debug/pprof/profile?seconds={PPROF_SECONDS}"
        try:
            with urllib.request.urlopen(url, context=context, timeout=PPROF_SECONDS + 30) as resp:
                (PPROF_DIR / f"{label}-{name}.pb.gz").write_bytes(resp.read())
        except OSError as exc:
            print(f"# pprof {name}: {exc}", file=sys.stderr)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(fetch, targets.items()))


# kube-scheduler's own histograms (pkg/scheduler/metrics): the serial scheduling cycle, where an
# extender's filter round trip sits (findNodesThatPassExtenders runs inside SchedulingAlgorithmLatency).
CYCLE_METRICS = {
    "scheduler_scheduling_algorithm_duration_seconds": "algorithm",
    "scheduler_scheduling_attempt_duration_seconds": "attempt",
}


def scheduler_cycle_ms(cp: ControlPlane, port: int) -> dict[str, float]:
    """Mean milliseconds per scheduling attempt, as kube-scheduler counts them (its /metrics), plus its
    own Filter and Score extension points (plugins only: the difference to `algorithm` is the extender)."""
    context = cp.admin_context(verify_server=False)
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=10) as resp:
            text = resp.read().decode()
    except OSError as exc:
        print(f"# kube-scheduler /metrics: {exc}", file=sys.stderr)
        return {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if not rest and " " in line:
            name = line.split(" ", 1)[0]
        value = line.rsplit(" ", 1)[-1]
        for suffix, into in (("_sum", sums), ("_count", counts)):
            base = name.removesuffix(suffix)
            if base == name:
                continue
            label = CYCLE_METRICS.get(base)
            if label is None and base == "scheduler_framework_extension_point_duration_seconds":
                point = _label(line, "extension_point")
                label = point.lower() if point in ("Filter", "Score", "PreFilter", "Reserve") else None
            if label is not None:
                into[label] = into.get(label, 0.0) + float(value)
    return {k: sums[k] / counts[k] * 1000 for k in sums if counts.get(k)}


def capture_py_spy(pid: int, label: str) -> None:
    """The extender's own profile over the same window as the Go ones: py-spy's collapsed stacks
    (`bench/stacks_top.py FILE` ranks them). py-spy is a tool of the bench, not a dependency."""
    assert PPROF_DIR is not None
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = PPROF_DIR / f"{label}-extender.collapsed"
    time.sleep(1.5)
    cmd = [spy, "record", "--pid", str(pid), "--duration", str(PPROF_SECONDS), "--rate", "250", "--format", "raw"]
    cmd += ["--subprocesses", "--nonblocking", "--gil", "--output", str(out)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=90)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"# py-spy of the extender ({spy}; pip install py-spy): {exc}", file=sys.stderr)


def run_scenario(
    sc: Scenario,
    cp: ControlPlane,
    admin: ApiServerClient,
    pods: int,
    workdir: Path,
    seed: int,
    pace: float = 0,
    cpu_share: float = 0.0,
) -> dict[str, Any]:
    """`pace` > 0: create pods at that rate (one at a time) instead of all at once. `cpu_share` > 0: the
    mixed workload, that share of the pods asking no GPU and every pod asking CPU and memory."""
    extender = None
    proxy = None
    url = "http://127.0.0.1:1"
    if sc.policy is not None:
        extender, url = start_extender(sc, cp, workdir)
    sched_url = url
    if sc.proxied:
        proxy = TimingProxy(url)
        sched_url = proxy.url
    hook = None
    if sc.webhook:
        which = "" if sc.webhook_src == ROOT else f"{sc.webhook_src.name}-"
        log = workdir / f"webhook-{which}{sc.qps}.log"
        hook = Webhook(cp, log, log_level="INFO", node_refresh=30.0, src=sc.webhook_src, mutation=sc.webhook_mutation)
        try:
            hook.install()
            hook.start()
            hook.wait_trusted()
        except BaseException:  # no extender or webhook outlives a scenario that failed to start
            hook.stop()
            hook.uninstall()
            if proxy is not None:
                proxy.stop()
            if extender is not None:
                stop_extender(sc, extender)
            raise
    sched = cp.start_scheduler(yaml.safe_dump(scheduler_config(sc, sched_url + "/gpushare-scheduler")))
    time.sleep(2.0)  # let kube-scheduler's informers sync before the burst
    rng = random.Random(seed)
    sizes = [rng.choice(SIZES) for _ in range(pods)]
    if cpu_share > 0:
        mixed = random.Random(seed + 1)
        sizes = [0 if mixed.random() < cpu_share else size for size in sizes]

    def create(i: int) -> str:
        name = f"p{i:06d}"
        body = pod_body(name, sc.scheduler_name, sizes[i], resources=(sc.resource,))
        if cpu_share > 0:
            body["spec"]["containers"][0]["resources"]["requests"] = dict(HOST_REQUESTS)
        if sc.webhook:
            del body["spec"]["schedulerName"]  # the webhook gives it
        admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)
        return name

    profiler = None
    spy = None
    if PPROF_DIR is not None:
        profiler = threading.Thread(target=capture_pprof, args=(cp, sched.port, sc.label), daemon=True)
        profiler.start()
        if extender is not None and sc.policy != GO:
            spy = threading.Thread(target=capture_py_spy, args=(extender.pid, sc.label), daemon=True)
            spy.start()
    try:
        hook_pid = hook.proc.pid if hook is not None and hook.proc is not None else None
        burst = measure_burst(cp, admin, sched.pid, pods, create, extender.pid if extender else None, pace, hook_pid)
        if profiler is not None:
            profiler.join()
        if spy is not None:
            spy.join()
        cycle = scheduler_cycle_ms(cp, sched.port)
        metrics = extender_metrics(url) if extender is not None and sc.policy != GO else ""  # Go: no /metrics
    except TimeoutError as exc:
        raise TimeoutError(f"{sc.label}: {exc}") from exc
    finally:  # also on failure or ^C: no extender outlives the bench
        cp.stop_scheduler()
        proxied, proxy_errors = {}, {}
        if proxy is not None:
            proxied = {f"{verb}@proxy": v for verb, v in proxy.latency().items()}
            proxy_errors = {"proxy errors": float(proxy.errors)} if proxy.errors else {}
            proxy.stop()
        if extender is not None:
            stop_extender(sc, extender)
        if hook is not None:
            hook.stop()
            hook.uninstall()
    delete_all_pods(admin)
    return {
        "label": sc.label,
        "qps": sc.qps,
        **burst,
        "extender_ms": extender_latency(metrics) | proxied,
        "cycle_ms": cycle,
        "bind_failures": bind_failures(metrics) | proxy_errors,
    }


# --------------------------------------------------------------------------- time to ready


def create_running(
    admin: ApiServerClient, nodes: list[str], running: int, gpus: int, go: bool = False, per_gpu: int = 0
) -> None:
    """`running` pods already bound with their GPU recorded: the cluster an extender starts into.
    `go`: each pod also asks the Go original's resource and carries its annotations, so both
    extenders start into the same 40,000 pods."""
    rng = random.Random(3)
    sizes = [rng.choice(SIZES) for _ in range(running)]
    resources = (RESOURCE_MEM, GO_RESOURCE_MEM) if go else (RESOURCE_MEM,)
    t = time.monotonic()

    def make(i: int) -> None:
        node = nodes[i % len(nodes)]
        body = pod_body(f"r{i:06d}", "gpushare-scheduler", sizes[i], node, (i // len(nodes)) % gpus, resources, per_gpu)
        admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(make, range(running)))
    print(f"# created {running} bound pods in {time.monotonic() - t:.0f} s", file=sys.stderr)


def time_to_ready(cp: ControlPlane, workdir: Path, src: Path, runs: int) -> list[float]:
    """Seconds from starting the extender to its /readyz answering 200."""
    out = []
    for i in range(runs):
        sc = Scenario(f"ready-{src.name}-{i}", 0, "binpack", src, filter_keeps=None)
        start = time.monotonic()
        proc, _ = start_extender(sc, cp, workdir)
        out.append(time.monotonic() - start)
        time.sleep(3)  # the pods line is logged once the heap is settled, after /readyz turns 200
        proc.stop()
        listed = [line for line in proc.log_path.read_text().splitlines() if "listed" in line]
        print(f"# {src} run {i}: {out[-1]:.2f} s; " + " | ".join(x.split(": ", 1)[-1] for x in listed), file=sys.stderr)
    return out


def go_nodes_with_a_free_gpu(url: str, nodes: list[str], per_gpu: int) -> int:
    """How many nodes the Go original's filter passes for a pod asking a whole GPU: 0 once its cache
    counts a pod on every GPU. The running pods put exactly one pod on each GPU, so 0 means it holds
    them all. (Its filter takes the node's lock; its /inspect reads the node map unlocked and could
    crash it while the cache fills.)"""
    pod = pod_body("probe", "gpushare-scheduler", per_gpu, resources=(GO_RESOURCE_MEM,))
    pod["metadata"]["uid"] = "probe"
    body = json.dumps({"pod": pod, "nodenames": nodes}).encode()
    req = urllib.request.Request(url + "/gpushare-scheduler/filter", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as resp:
        # Its ExtenderFilterResult (k8s.io/kube-scheduler v0.26 extender/v1) has no json tags: Go field names.
        result = {k.lower(): v for k, v in json.loads(resp.read()).items()}
    if result.get("error"):
        raise RuntimeError(f"Go original's filter: {result['error']}")
    passed, failed = result.get("nodenames") or [], result.get("failednodes") or {}
    reasons = set(failed.values()) - {"Insufficient GPU Memory in one device"}
    if reasons or len(passed) + len(failed) != len(nodes):  # a node failing for another cause proves nothing
        raise RuntimeError(f"Go original's filter: {len(passed)} passed, {len(failed)} failed: {sorted(reasons)[:3]}")
    return len(passed)


def go_time_to_ready(
    cp: ControlPlane, workdir: Path, binary: Path, runs: int, nodes: list[str], per_gpu: int, probe: bool
) -> list[float]:
    """Seconds from starting the Go original to /version answering 200. It does not wait for its pod
    informer before serving (pkg/gpushare/controller.go waits for nodes only), so the time until its
    cache holds every running pod (its filter, polled each second, passes no node for a whole-GPU
    pod) is printed too."""
    out = []
    for i in range(runs):
        sc = Scenario(f"ready-go-{binary.name}-{i}", 0, GO, binary=binary)
        start = time.monotonic()
        # Its log goes to /dev/null here: at its default level it prints, per pod it adds, the pod and
        # its whole node map (pkg/cache/cache.go AddOrUpdatePod), some 6 GB for 40,000 pods on 5,000
        # nodes. It still formats every line; only the writing is spared.
        proc, url = start_go_extender(sc, cp, workdir, Path(os.devnull))
        out.append(time.monotonic() - start)
        free, full = -1, float("nan")
        try:
            while probe and time.monotonic() < start + 600:
                free = go_nodes_with_a_free_gpu(url, nodes, per_gpu)
                if free == 0:
                    full = time.monotonic() - start
                    break
                time.sleep(1.0)
        finally:
            stop_extender(sc, proc)
        print(f"# {binary} run {i}: {out[-1]:.2f} s to /version; its cache held every running pod after "
              f"{full:.1f} s (nodes left with a free GPU: {free})", file=sys.stderr)  # fmt: skip
    return out


# --------------------------------------------------------------------------- main


def round_order(scenarios: list[Scenario], round_: int) -> list[Scenario]:
    """Every other round runs the scenarios backwards.

    The machine drifts within a run (the first scenario meets a cold API server and etcd; neighbours
    come and go), and a fixed order hands that drift to the same scenario every round: with alone
    always first, its pods/s rose from 104 to 139 over three rounds while the extender's stayed near
    97. Alternating puts each scenario early and late equally often, so the per-round ratios bracket
    the drift and their median cancels it."""
    return list(scenarios) if round_ % 2 == 0 else list(reversed(scenarios))


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per scenario: the median of each figure over the rounds (the ratio is taken per round,
    against that round's kube-scheduler alone, then the median of those)."""
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        rows.setdefault((r["label"], r["qps"]), []).append(r)
    out = []
    for (label, qps), runs in rows.items():
        med = statistics.median
        out.append({
            "label": f"{label} ({len(runs)} rounds)",
            "qps": qps,
            "pods_per_s": med(r["pods_per_s"] for r in runs),
            "ratio": med(r["ratio"] for r in runs),
            "ratios": [round(r["ratio"], 2) for r in runs],
            "p50_ms": med(r["p50_ms"] for r in runs),
            "p99_ms": med(r["p99_ms"] for r in runs),
            "cpu_ms_per_pod": {k: med(r["cpu_ms_per_pod"][k] for r in runs) for k in runs[0]["cpu_ms_per_pod"]},
            "api_per_pod": runs[-1]["api_per_pod"],
            "extender_ms": runs[-1]["extender_ms"],
            "cycle_ms": {k: med(r["cycle_ms"].get(k, 0.0) for r in runs) for k in runs[-1]["cycle_ms"]},
            "runqueue_ms_per_pod": {
                k: med(r["runqueue_ms_per_pod"].get(k, 0.0) for r in runs) for k in runs[-1]["runqueue_ms_per_pod"]
            },
            "bind_failures": {k: sum(r["bind_failures"].get(k, 0) for r in runs) for k in runs[-1]["bind_failures"]},
        })  # fmt: skip
    return out


def fmt_row(r: dict[str, Any], alone: dict[int, float]) -> str:
    ratio = r.get("ratio", r["pods_per_s"] / alone[r["qps"]] if r["qps"] in alone else float("nan"))
    ratio_text = f"x{ratio:4.2f}"
    if "ratios" in r:
        ratio_text += f" (rounds: {', '.join(map(str, r['ratios']))})"
    cpu = r["cpu_ms_per_pod"]
    procs = ("etcd", "apiserver", "scheduler", "extender", "webhook", "client")
    cpus = " ".join(f"{k}={cpu[k]:.1f}" for k in procs if k in cpu)
    ext = " ".join(
        f"{verb}={v['mean']:.1f}/{v.get('p50', 0):.1f}/{v.get('p99', 0):.1f}"
        for verb, v in sorted(r["extender_ms"].items())
    )
    if r["bind_failures"]:
        ext += " bind failures: " + " ".join(f"{k}={v:.0f}" for k, v in sorted(r["bind_failures"].items()))
    api = " ".join(f"{k}={v:.2f}" for k, v in r["api_per_pod"].items())
    cycle = " ".join(f"{k}={v:.2f}" for k, v in sorted(r.get("cycle_ms", {}).items()))
    waited = " ".join(f"{k}={v:.2f}" for k, v in sorted(r.get("runqueue_ms_per_pod", {}).items()))
    return (
        f"{r['label']:<28} qps={r['qps']:<5} {r['pods_per_s']:7.1f} pods/s  {ratio_text}  "
        f"p50={r['p50_ms']:7.0f} ms p99={r['p99_ms']:7.0f} ms  cpu ms/pod: {cpus}  extender ms mean/p50/p99: {ext}"
        f"\n{'':<28} API calls per pod: {api}"
        f"\n{'':<28} kube-scheduler ms per attempt (mean): {cycle}; waiting for a CPU, ms/pod: {waited}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu-mem", type=int, default=80, help="GiB per GPU")
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--qps", default="50,1000", help="kube-scheduler client QPS values (burst = QPS)")
    ap.add_argument("--policies", default="binpack,frag")
    ap.add_argument("--filter-keeps", default="best", choices=["best", "fitting"])
    ap.add_argument("--bind-events", default="failures", help="extender --bind-events values to run (failures,all)")
    ap.add_argument("--baseline-src", type=Path, help="also run this checkout's extender (e.g. a git worktree)")
    ap.add_argument("--webhook", action="store_true", help="also run each policy with share-webhook on")
    ap.add_argument(
        "--webhook-mutation",
        default="auto",
        help="with --webhook: the chart's webhook.mutation values to run, e.g. policy,webhook (one "
        "scenario each; auto: policy where kube-apiserver serves MutatingAdmissionPolicy)",
    )
    ap.add_argument("--baseline-webhook", type=Path, help="with --webhook: also each policy with this checkout's "
                    "share-webhook ('<policy> +webhook (baseline)', this tree's extender)")  # fmt: skip
    ap.add_argument("--ready", action="store_true", help="measure the extender's time to ready instead")
    ap.add_argument("--running", type=int, default=40000, help="with --ready: bound pods in the cluster")
    ap.add_argument("--runs", type=int, default=3, help="with --ready: extender starts measured")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cpu-share", type=float, default=0.0,
                    help=f"the mixed workload: this share of pods asks no GPU, every pod asks CPU and memory "
                    f"(openb's share: {OPENB_CPU_SHARE:.4f}; default 0, GPU pods only)")  # fmt: skip
    ap.add_argument(
        "--watcher",
        action="store_true",
        help="also kube-scheduler alone with our extender running "
        "beside it, watching, never called: what its watches cost kube-apiserver",
    )
    ap.add_argument("--pace", type=float, default=0, help="create pods at this rate (pods/s) instead of at once")
    ap.add_argument("--rounds", type=int, default=1, help="run every scenario this many times, alternating; "
                    "print the medians (a noisy machine moves single runs by +-20%%)")  # fmt: skip
    ap.add_argument("--pprof", type=Path, help="write kube-apiserver's and kube-scheduler's CPU profiles here")
    ap.add_argument("--extender-auth", default="token", choices=["token", "admin-cert"],
                    help="token: the extenders authenticate as installed (service account token, the chart's "
                    "RBAC); admin-cert: with the admin kubeconfig's client certificate (earlier runs)")  # fmt: skip
    ap.add_argument("--go-extender", type=Path, action="append", default=[],
                    help="also run the Go original, built outside this repository (paced mode and --ready; "
                    "repeat it for several builds, each a scenario named after its file); the bench never "
                    "builds or fetches it")  # fmt: skip
    args = ap.parse_args()
    for binary in args.go_extender:
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            ap.error(f"--go-extender {binary}: not an executable file")
    if args.baseline_webhook and not args.webhook:
        ap.error("--baseline-webhook goes with --webhook")
    mutations = webhook_mutations(ap, args.webhook_mutation)
    if args.go_extender and not (args.ready or args.pace):
        ap.error("--go-extender runs in the paced mode (--pace) or with --ready")
    if args.pprof:
        global PPROF_DIR
        args.pprof.mkdir(parents=True, exist_ok=True)
        PPROF_DIR = args.pprof.resolve()

    qps_values = [int(q) for q in args.qps.split(",")]
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        workdir = Path(tmp)
        cp = ControlPlane(workdir / "cp", k8s_bin_dir(), profiling=PPROF_DIR is not None)
        cp.start()
        try:
            admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-bench")
            admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
            if args.extender_auth == "token":
                install_identities(cp)
            print(f"# the extenders authenticate with: {args.extender_auth}", file=sys.stderr)
            t = time.monotonic()
            go = bool(args.go_extender)
            nodes = create_nodes(admin, args.nodes, args.gpus, args.gpu_mem, go)
            print(f"# {args.nodes} nodes x {args.gpus} GPUs x {args.gpu_mem} GiB in {time.monotonic() - t:.0f} s; "
                  f"{os.cpu_count()} CPUs", file=sys.stderr)  # fmt: skip
            if args.ready:
                create_running(admin, nodes, args.running, args.gpus, go, args.gpu_mem)
                for size in (500, 1000, 5000):  # the floor: what reading the list alone costs this client
                    t = time.monotonic()
                    pages = admin.pod_pages(page_size=size)
                    for _ in pages:
                        pass
                    print(f"# reading {pages.count} pods in pages of {size}: {time.monotonic() - t:.2f} s",
                          file=sys.stderr)  # fmt: skip
                srcs = [ROOT] + ([args.baseline_src] if args.baseline_src else [])
                for src in srcs:
                    times = time_to_ready(cp, workdir, src, args.runs)
                    print(f"time to ready ({src}): " + ", ".join(f"{x:.2f} s" for x in times)
                          + f"; median {statistics.median(times):.2f} s")  # fmt: skip
                for binary in args.go_extender:
                    probe = args.running == args.nodes * args.gpus  # one pod per GPU: the probe can tell
                    times = go_time_to_ready(cp, workdir, binary, args.runs, nodes, args.gpu_mem, probe)
                    print(f"time to ready (Go original {binary}): " + ", ".join(f"{x:.2f} s" for x in times)
                          + f"; median {statistics.median(times):.2f} s")  # fmt: skip
                return 0
            scenarios = []
            for qps in qps_values:
                scenarios.append(Scenario("alone", qps))
                if args.watcher:
                    policy = args.policies.split(",")[0]
                    scenarios.append(Scenario("alone +watching extender", qps, policy, watch_only=True))
                for policy in args.policies.split(","):
                    for events in args.bind_events.split(","):
                        label = policy if events == "failures" else f"{policy} (events: {events})"
                        scenarios.append(Scenario(label, qps, policy, ROOT, args.filter_keeps, events))
                        if go:  # the same proxy as the Go original's, for the same extender-side measure
                            scenarios.append(Scenario(f"{label} (proxied)", qps, policy, ROOT, args.filter_keeps,
                                                      events, proxied=True))  # fmt: skip
                    for mutation in mutations if args.webhook else ():
                        named = "" if len(mutations) == 1 else f" ({mutation})"
                        scenarios.append(Scenario(f"{policy} +webhook{named}", qps, policy, ROOT, args.filter_keeps,
                                                  "failures", webhook=True, webhook_mutation=mutation))  # fmt: skip
                    if args.webhook and args.baseline_webhook:
                        scenarios.append(Scenario(f"{policy} +webhook (baseline)", qps, policy, ROOT,
                                                  args.filter_keeps, "failures", webhook=True,
                                                  webhook_src=args.baseline_webhook.resolve()))  # fmt: skip
                    if args.baseline_src:
                        scenarios.append(Scenario(f"{policy} (baseline)", qps, policy, args.baseline_src, None))
                for binary in args.go_extender:
                    scenarios.append(Scenario(f"go {binary.name}", qps, GO, binary=binary, proxied=True))
            results = []
            position = {(sc.label, sc.qps): i for i, sc in enumerate(scenarios)}  # rows print in this order
            for round_ in range(args.rounds):
                round_results = []
                for sc in round_order(scenarios, round_):
                    r = run_scenario(sc, cp, admin, args.pods, workdir, args.seed, args.pace, args.cpu_share)
                    r["round"] = round_
                    round_results.append(r)
                    print(f"# round {round_ + 1}: {sc.label} qps={sc.qps}: {r['pods_per_s']:.1f} pods/s",
                          file=sys.stderr, flush=True)  # fmt: skip
                alone = {r["qps"]: r["pods_per_s"] for r in round_results if r["label"] == "alone"}
                for r in sorted(round_results, key=lambda r: position[(r["label"], r["qps"])]):
                    r["ratio"] = r["pods_per_s"] / alone[r["qps"]] if r["qps"] in alone else float("nan")
                    results.append(r)
                    print(fmt_row(r, alone), flush=True)
            mix = f" ({args.cpu_share:.2%} CPU-only)" if args.cpu_share else ""
            print(f"\n# {args.nodes} nodes, {args.pods} pods{mix}; x = pods/s over kube-scheduler alone at that QPS"
                  + (f" in the same round; medians over {args.rounds} rounds" if args.rounds > 1 else ""))  # fmt: skip
            for row in summarise(results) if args.rounds > 1 else results:
                print(fmt_row(row, {}))
        except (KubeError, TimeoutError) as exc:
            print(f"bench failed: {exc}\n{cp.logs()}", file=sys.stderr)
            return 1
        finally:
            cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
