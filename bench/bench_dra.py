"""DRA scheduling through the real kube-scheduler: claims for 1..16 GiB packed onto share-dra's slices.

Real etcd, kube-apiserver, kube-scheduler (its DynamicResources plugin, no extender) and
kube-controller-manager's resourceclaim controller (a claim per pod from ResourceClaimTemplates); no
kubelets. Each node's ResourceSlice is the one share-dra publishes (share_dra.slices, the same pure
functions), written by the bench so hundreds of nodes cost no plugin processes. Creates M pods at once,
waits until each is bound or marked unschedulable, then prints pods/s, create-to-bound latency p50/p99,
CPU seconds per 1,000 pods of each process, and the fullest GPU (allocated / capacity, never above 1).

  python bench/bench_dra.py                              # 50 nodes x 4 GPUs x 80 GiB, 500 pods
  python bench/bench_dra.py --nodes 200 --pods 2000 --qps 1000
  python bench/bench_dra.py --claims template            # claims from ResourceClaimTemplates
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.bench_throughput import cpu_seconds  # noqa: E402
from share_core.contract import DRA_CAPACITY_MEMORY, DRA_DEVICE_CLASS, DRA_DRIVER_NAME, MemoryUnit  # noqa: E402
from share_core.kube import ApiServerClient  # noqa: E402
from share_dra.claims import quantity_bytes  # noqa: E402
from share_dra.slices import resource_slice  # noqa: E402
from share_plugin.backend import Gpu  # noqa: E402
from tests.controlplane.barenodes import ready_condition  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402

RES = "/apis/resource.k8s.io/v1"
NS = "bench"


def setup(admin: ApiServerClient, nodes: int, gpus: int, gib: int) -> None:
    admin.request(
        "POST",
        f"{RES}/deviceclasses",
        body={
            "metadata": {"name": DRA_DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER_NAME}"'}}]},
        },
    )
    admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
    for n in range(1, 17):
        request = {"deviceClassName": DRA_DEVICE_CLASS, "capacity": {"requests": {DRA_CAPACITY_MEMORY: f"{n}Gi"}}}
        admin.request(
            "POST",
            f"{RES}/namespaces/{NS}/resourceclaimtemplates",
            body={
                "metadata": {"name": f"gpu-{n}gi"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
            },
        )

    def node(i: int) -> None:
        name = f"n{i:04d}"
        admin.request("POST", "/api/v1/nodes", body={"metadata": {"name": name}})
        res = {"cpu": "256", "memory": "2Ti", "pods": "1000"}
        admin.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body={"status": {"capacity": res, "allocatable": res, "conditions": [ready_condition()]}},
            content_type="application/merge-patch+json",
        )
        inventory = [Gpu(g, f"GPU-{name}-{g}", "NVIDIA A100-SXM4-80GB", gib * 1024**3, g) for g in range(gpus)]
        admin.request("POST", f"{RES}/resourceslices", body=resource_slice(name, inventory, MemoryUnit.GiB, 1))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(node, range(nodes)))


def claim_body(name: str, gib: int) -> dict:
    request = {"deviceClassName": DRA_DEVICE_CLASS, "capacity": {"requests": {DRA_CAPACITY_MEMORY: f"{gib}Gi"}}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}


def pod_body(name: str, gib: int, direct: bool) -> dict:
    ref = {"resourceClaimName": name} if direct else {"resourceClaimTemplateName": f"gpu-{gib}gi"}
    return {
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", **ref}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--gpu-mem", type=int, default=80, help="GiB per GPU")
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--qps", type=int, default=1000, help="kube-scheduler client QPS (and burst)")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument(
        "--claims",
        choices=["direct", "template"],
        default="direct",
        help="direct: the bench creates each pod's ResourceClaim (kube-scheduler's figure); template: "
        "kube-controller-manager's resourceclaim controller makes them (bounded by its client QPS, default 20)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dra.") as tmp:
        cp = ControlPlane(Path(tmp), k8s_bin_dir())
        cp.start()
        try:
            version = ".".join(map(str, cp.version()))
            if cp.version() < (1, 36):
                raise SystemExit(f"Kubernetes {version}: consumable capacity is off by default before 1.36")
            admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), max_connections=16)
            cp.start_controller_manager(controllers=("resourceclaim-controller",))
            setup(admin, args.nodes, args.gpus, args.gpu_mem)
            config = {"profiles": [{"schedulerName": "default-scheduler"}]}
            config["clientConnection"] = {"qps": args.qps, "burst": args.qps}
            sched = cp.start_scheduler(yaml.safe_dump(config))
            time.sleep(2.0)  # informers synced before the burst
            procs = {
                "etcd": cp._etcd.pid,  # type: ignore[union-attr]
                "apiserver": cp._apiserver.pid,  # type: ignore[union-attr]
                "scheduler": sched.pid,
                "controller-manager": cp.controller_manager.pid,  # type: ignore[union-attr]
            }
            before = {k: cpu_seconds(p) for k, p in procs.items()}
            rng = random.Random(args.seed)
            sizes = [rng.randint(1, 16) for _ in range(args.pods)]
            created: dict[str, float] = {}
            start = time.monotonic()

            def create(i: int) -> None:
                name = f"p{i:05d}-{sizes[i]}gi"
                created[name] = time.monotonic()
                if args.claims == "direct":
                    admin.request("POST", f"{RES}/namespaces/{NS}/resourceclaims", body=claim_body(name, sizes[i]))
                admin.request(
                    "POST", f"/api/v1/namespaces/{NS}/pods", body=pod_body(name, sizes[i], args.claims == "direct")
                )

            with ThreadPoolExecutor(16) as pool:
                list(pool.map(create, range(args.pods)))
            bound: dict[str, float] = {}
            deadline = time.monotonic() + 600
            waiting: set[str] = set()
            while time.monotonic() < deadline:
                now = time.monotonic()
                waiting = set()
                for p in admin.request("GET", f"/api/v1/namespaces/{NS}/pods").get("items") or []:
                    name = p["metadata"]["name"]
                    if p["spec"].get("nodeName"):
                        bound.setdefault(name, now)
                    elif any(
                        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                        for c in (p.get("status") or {}).get("conditions") or []
                    ):
                        waiting.add(name)
                if len(bound) + len(waiting) >= args.pods:
                    break
                time.sleep(0.1)
            else:
                raise TimeoutError(f"only {len(bound)} of {args.pods} pods bound in 600 s")
            end = max(bound.values()) if bound else time.monotonic()
            after = {k: cpu_seconds(p) for k, p in procs.items()}
            used: Counter[tuple[str, str]] = Counter()
            for c in admin.request("GET", f"{RES}/namespaces/{NS}/resourceclaims").get("items") or []:
                for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []:
                    used[(r["pool"], r["device"])] += quantity_bytes(r["consumedCapacity"][DRA_CAPACITY_MEMORY])
            fullest = max(used.values(), default=0) / (args.gpu_mem * 1024**3)
            latencies = sorted(bound[n] - created[n] for n in bound)
            asked = sum(sizes)
            print(
                f"Kubernetes {version}: {args.nodes} nodes x {args.gpus} GPUs x {args.gpu_mem} GiB, {args.pods} pods "
                f"asking {asked} GiB of {args.nodes * args.gpus * args.gpu_mem} GiB, scheduler QPS {args.qps}, "
                f"claims {args.claims}"
            )
            print(
                f"bound {len(bound)}, unschedulable {len(waiting)}; {len(bound) / (end - start):.1f} pods/s; "
                f"create-to-bound p50 {statistics.median(latencies) * 1000:.0f} ms, "
                f"p99 {latencies[int(0.99 * (len(latencies) - 1))] * 1000:.0f} ms"
            )
            print(
                "CPU s per 1,000 pods: "
                + ", ".join(f"{k} {(after[k] - before[k]) * 1000 / args.pods:.1f}" for k in procs)
            )
            print(f"GPUs used {len(used)} of {args.nodes * args.gpus}; fullest GPU {fullest:.3f} of its memory")
            if fullest > 1:
                print("OVERCOMMITTED", file=sys.stderr)
                return 1
        finally:
            cp.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
