"""What admission alone costs: pods created through the real kube-apiserver with no webhook, with this tree's
share-webhook, and (--baseline-webhook) with an older checkout's, alternating rounds; no scheduler runs, so
the figures are the creates' own: pods/s and CPU per pod of kube-apiserver, etcd and the webhook.

The webhook runs as bench/bench_throughput.py --webhook runs it (tests/controlplane/webhook.py: the chart's
configurations, its own certificate, INFO logging), in front of N gpushare nodes (its validation's view);
the pods name no scheduler, so each is given ours and validated. At the end it counts the connections the API
server holds open to the webhook. --webhook-mutation policy,webhook runs one scenario per way the chart sets
the scheduler (kube-apiserver's MutatingAdmissionPolicy, 1.36+, or share-webhook's /mutate).

    python bench/bench_admission.py --pods 1000 --rounds 3 --baseline-webhook /work/base
    python bench/bench_admission.py --pods 1000 --rounds 5 --webhook-mutation policy,webhook
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_throughput as bt  # noqa: E402

from share_core.kube import ApiServerClient  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.controlplane.webhook import Webhook  # noqa: E402


def open_connections(port: int) -> int:
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True)
    return len(out.stdout.splitlines())


def one_round(
    cp: ControlPlane, admin: ApiServerClient, src: Path | None, pods: int, work: Path, mutation: str = "auto"
) -> dict[str, float]:
    hook = None
    if src is not None:
        log = work / f"webhook-{src.name}-{mutation}.log"
        hook = Webhook(cp, log, log_level="INFO", node_refresh=30.0, src=src, mutation=mutation)
        hook.install()
        hook.start()
        hook.wait_trusted()
        time.sleep(1.0)
    procs = {"apiserver": cp._apiserver.pid, "etcd": cp._etcd.pid}  # type: ignore[union-attr]
    if hook is not None and hook.proc is not None:
        procs["webhook"] = hook.proc.pid
    before = {k: bt.cpu_seconds(pid) for k, pid in procs.items()}

    def create(i: int) -> None:
        body = bt.pod_body(f"p{i:06d}", "unused", bt.SIZES[i % len(bt.SIZES)])
        del body["spec"]["schedulerName"]  # the webhook gives it
        admin.request("POST", f"/api/v1/namespaces/{bt.NAMESPACE}/pods", body=body)

    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:  # as bench_throughput creates them
        list(pool.map(create, range(pods)))
    out = {"pods_per_s": pods / (time.monotonic() - start)}
    out |= {k: (bt.cpu_seconds(pid) - before[k]) * 1000 / pods for k, pid in procs.items()}
    if hook is not None:
        out["connections"] = open_connections(hook.port)
        named = admin.request("GET", f"/api/v1/namespaces/{bt.NAMESPACE}/pods/p000000")["spec"]["schedulerName"]
        assert named == "gpushare-scheduler", f"the webhook did not mutate: {named}"
        hook.stop()
        hook.uninstall()
    bt.delete_all_pods(admin)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-webhook", type=Path, help="also an older checkout's share-webhook")
    ap.add_argument("--webhook-mutation", default="auto",
                    help="the chart's webhook.mutation values, e.g. policy,webhook (one scenario each)")  # fmt: skip
    args = ap.parse_args()
    mutations = bt.webhook_mutations(ap, args.webhook_mutation)
    scenarios: dict[str, tuple[Path | None, str]] = {"none": (None, "auto")}
    for mutation in mutations:
        scenarios["webhook" if len(mutations) == 1 else f"webhook ({mutation})"] = (ROOT, mutation)
    if args.baseline_webhook:
        scenarios["webhook (baseline)"] = (args.baseline_webhook.resolve(), "webhook")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in scenarios}
    with tempfile.TemporaryDirectory(prefix="gpushare-admission-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(work / "cp", k8s_bin_dir())
        cp.start()
        try:
            admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-bench")
            admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": bt.NAMESPACE}})
            bt.create_nodes(admin, args.nodes, 8, 80)
            for r in range(args.rounds):
                names = list(scenarios) if r % 2 == 0 else list(reversed(scenarios))  # bench_throughput.round_order
                for name in names:
                    src, mutation = scenarios[name]
                    res = one_round(cp, admin, src, args.pods, work, mutation)
                    results[name].append(res)
                    figures = " ".join(f"{k}={v:.2f}" for k, v in res.items())
                    print(f"round {r + 1} {name:<20} {figures}  load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            cp.stop()
    print(f"\n# medians over {args.rounds} rounds, {args.pods} pods; CPU in ms per pod")
    for name, runs in results.items():
        print(f"{name:<20} " + " ".join(f"{k}={statistics.median(r[k] for r in runs):.2f}" for k in runs[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
