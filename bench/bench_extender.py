"""Extender latency and memory at scale: 5,000 nodes x 8 GPUs, 40,000 running GPU pods and 20,000
running CPU-only pods, every pod with CPU and memory requests, every node with allocatable CPU, memory
and pods (the extender sees the whole node, issue 31).

Prints filter / prioritize / bind latency (p50, p99) through the Flask app (JSON in and out, as
kube-scheduler calls it with nodeCacheCapable: NodeNames of all 5,000 nodes), filter apart for GPU
pods, CPU-only pods of a size seen before and pods of a new size (a CPU request no pod had: no memo
holds it), after the rounds the filter of three pods of GPU sizes never asked before (a learning
policy rebuilds its table for each: every node state is priced again), the time to build the cache
from the lists (the extender's time to ready, in process) and the process RSS with the cache built.
By default each round is one scheduling cycle of a new pod (the cluster changes between rounds);
--no-churn repeats one pod on an unchanged cluster.
Run: python bench/bench_extender.py [--nodes N --gpus G --pods P --cpu-pods C --rounds R --policy binpack|frag]
    [--leave-room on|off]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from share_core.assignment import Assignment
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import EXTENDER_PREFIX
from share_core.contract import RESOURCE_MEM
from share_core.fake import FakeKube
from share_scheduler.app import create_app
from share_scheduler.starvation import StarvationConfig
from share_scheduler.syncer import settle_gc


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


HOST = {"cpu": "128", "memory": "1Ti", "pods": "110"}  # a kubelet's allocatable beside the GPUs
CPUS = ["250m", "500m", "1", "2", "4", "8"]  # the CPU requests pods make (a few sizes, as replicas repeat them)
MEMS = ["512Mi", "1Gi", "4Gi", "8Gi", "16Gi"]


def node(name: str, gpus: int, mem: int) -> dict:
    items = [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "NVIDIA A100-SXM4-80GB", "memory": mem, "healthy": True}
             for i in range(gpus)]  # fmt: skip
    res = {RESOURCE_MEM: str(gpus * mem), **HOST}
    return {"metadata": {"name": name, "annotations": {ANN_NODE_GPUS: json.dumps(items)}},
            "status": {"capacity": res, "allocatable": res}}  # fmt: skip


def pod(
    name: str, mem: int, node_name: str | None = None, gpu: int | None = None, cpu: str = "1", memory: str = "1Gi"
) -> dict:
    """A pod asking `mem` GPU units (0: a CPU-only pod) and `cpu`, `memory`."""
    ann = {}
    if node_name is not None and gpu is not None:
        ann = Assignment((gpu,), (f"GPU-{node_name}-{gpu}",), mem, time.time_ns(), True).to_annotations()
    limits = {RESOURCE_MEM: str(mem)} if mem else {}
    p = {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "annotations": ann},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": limits, "requests": {"cpu": cpu, "memory": memory}}}]
        },
        "status": {"phase": "Running" if node_name else "Pending"},
    }
    if node_name:
        p["spec"]["nodeName"] = node_name
    return p


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu-mem", type=int, default=80)
    ap.add_argument("--pods", type=int, default=40000)
    ap.add_argument("--cpu-pods", type=int, default=20000, help="running pods that ask no GPU (default 20000)")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--binds", type=int, default=500)
    ap.add_argument("--policy", default="binpack")
    ap.add_argument(
        "--no-churn",
        dest="churn",
        action="store_false",
        help="repeat one pod's filter/prioritize on an unchanged cluster (default: each round a new pod "
        "of a varying size arrives, is filtered, prioritized and bound, so the cluster changes between rounds)",
    )
    ap.add_argument(
        "--leave-room",
        choices=("on", "off"),
        default="off",
        help="wrap the policy in room for what waits, as the chart's default reservations.leaveRoom does (no "
        "multi-GPU pod waits here: what the wrapper costs when idle)",
    )
    a = ap.parse_args()
    rng = random.Random(1)
    base = rss_mib()

    kube = FakeKube()  # holds only the pending pods the bind benchmark binds
    room = StarvationConfig(reserve=False, leave_room=a.leave_room == "on")
    app = create_app(kube, policy=a.policy, start_sync=False, starvation=room)
    cache = app.extensions["gpushare"]["cache"]
    names = [f"node-{i:05d}" for i in range(a.nodes)]
    t0 = time.perf_counter()
    cache.replace_nodes([node(n, a.gpus, a.gpu_mem) for n in names])
    free = {(n, g): a.gpu_mem for n in names for g in range(a.gpus)}
    running = []
    for i in range(a.pods):
        n, g = rng.choice(names), rng.randrange(a.gpus)
        mem = min(rng.choice([1, 2, 4, 8, 10, 16]), free[(n, g)])
        if mem <= 0:
            continue
        free[(n, g)] -= mem
        running.append(pod(f"run-{i}", mem, n, g, rng.choice(CPUS), rng.choice(MEMS)))
    for i in range(a.cpu_pods):
        running.append(pod(f"cpu-{i}", 0, rng.choice(names), None, rng.choice(CPUS), rng.choice(MEMS)))
    cache.replace_pods(running)
    build_s = time.perf_counter() - t0
    del running, free
    settle_gc()  # as the server does after its first full sync: freeze the cache, rarer collections
    built = rss_mib()

    client = app.test_client()
    sizes = [1, 2, 4, 8, 16]

    def post(verb: str, body: bytes) -> tuple[float, bytes]:
        t = time.perf_counter()
        resp = client.post(f"{EXTENDER_PREFIX}/{verb}", data=body, content_type="application/json")
        elapsed = time.perf_counter() - t
        assert resp.status_code == 200, resp.data[:200]
        return elapsed, resp.data

    gpu_pod = pod("want", 8, cpu="2", memory="8Gi")
    body = orjson.dumps({"Pod": gpu_pod, "Nodes": None, "NodeNames": names})
    first_filter, _ = post("filter", body)  # warm up: the first request prices every node state
    post("prioritize", body)
    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    kinds: dict[str, list[float]] = {"GPU pod": [], "CPU-only pod": [], "new size": []}
    passed = 0
    for r in range(a.rounds):
        kind = "GPU pod"
        if a.churn:
            # A scheduling cycle as kube-scheduler runs it: a new pod appears (the watch shows it;
            # workload-aware policies observe it), filter, prioritize, bind it to the best node. Every
            # third a CPU-only pod; every fifth a size no pod asked before (a CPU request of its own).
            gpu_mem = 0 if r % 3 == 2 else sizes[r % len(sizes)]
            kind = "CPU-only pod" if gpu_mem == 0 else "GPU pod"
            cpu = rng.choice(CPUS)
            if r % 5 == 4:
                cpu, kind = f"{1000 + 7 * r}m", "new size"
            new = pod(f"cycle-{r}", gpu_mem, cpu=cpu, memory=rng.choice(MEMS))
            kube.add_pod(new)
            cache.upsert_pod(new)
            body = orjson.dumps({"Pod": new, "Nodes": None, "NodeNames": names})
        # filter first, as kube-scheduler calls it (with the chart's filterKeeps best it is the only
        # call before bind: its time is the pod's own, no memo filled for it by another verb), then
        # prioritize (it reuses what filter memoised), then bind where filter pointed.
        elapsed, data = post("filter", body)
        times["filter"].append(elapsed)
        kinds[kind].append(elapsed)
        elapsed, _ = post("prioritize", body)
        times["prioritize"].append(elapsed)
        kept = orjson.loads(data)["NodeNames"]
        passed = len(kept)
        if a.churn:
            args = {"PodName": f"cycle-{r}", "PodNamespace": "bench", "PodUID": f"uid-cycle-{r}", "Node": kept[0]}
            t = time.perf_counter()
            resp = client.post(f"{EXTENDER_PREFIX}/bind", json=args)
            times["bind"].append(time.perf_counter() - t)
            assert resp.status_code == 200 and resp.get_json()["Error"] == "", resp.get_json()

    rebuilt: list[float] = []
    if a.churn:
        # Last, pods of GPU sizes no pod asked before: a learning policy (frag) rebuilds its table for
        # each, and every node state is priced again (as after each 2 % growth of the pods it learned).
        for r, gpu_mem in enumerate((3, 5, 6)):
            new = pod(f"shape-{r}", gpu_mem, cpu=rng.choice(CPUS), memory=rng.choice(MEMS))
            kube.add_pod(new)
            cache.upsert_pod(new)
            elapsed, _ = post("filter", orjson.dumps({"Pod": new, "Nodes": None, "NodeNames": names}))
            rebuilt.append(elapsed)
    for i in range(a.binds):
        kube.add_pod(pod(f"new-{i}", rng.choice([1, 2, 4, 8])))
    for i in range(a.binds):
        args = {"PodName": f"new-{i}", "PodNamespace": "bench", "PodUID": f"uid-new-{i}", "Node": names[i % len(names)]}
        t = time.perf_counter()
        resp = client.post(f"{EXTENDER_PREFIX}/bind", json=args)
        times["bind"].append(time.perf_counter() - t)
        assert resp.status_code == 200 and resp.get_json()["Error"] == "", resp.get_json()

    print(f"cluster: {a.nodes} nodes x {a.gpus} GPUs x {a.gpu_mem} GiB, {len(cache._pods)} running pods "
          f"({a.cpu_pods} CPU-only); "
          f"policy {a.policy}; {'churn' if a.churn else 'no churn'}; cache built in {build_s:.1f}s")  # fmt: skip
    print(f"NodeNames per request: {len(names)}; nodes filter kept (the policy's best): {passed}; "
          f"the first filter (warm-up, not counted below): {first_filter * 1000:.0f} ms")  # fmt: skip
    for verb, xs in times.items():
        print(f"{verb:<10} n={len(xs):<4} p50 {pct(xs, 0.5):8.2f} ms   p99 {pct(xs, 0.99):8.2f} ms   "
              f"mean {statistics.fmean(xs) * 1000:8.2f} ms")  # fmt: skip
    for kind, xs in kinds.items():
        if xs:
            print(f"  filter, {kind:<13} n={len(xs):<4} p50 {pct(xs, 0.5):8.2f} ms   p99 {pct(xs, 0.99):8.2f} ms   "
                  f"max {max(xs) * 1000:8.2f} ms")  # fmt: skip
    if rebuilt:
        shown = ", ".join(f"{x * 1000:.2f}" for x in rebuilt)
        print(f"  filter, a new GPU size (the learned table rebuilt): {shown} ms")
    print(f"RSS: {built:.0f} MiB with the cache built (interpreter and imports: {base:.0f} MiB; "
          f"cache: {built - base:.0f} MiB); now {rss_mib():.0f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
