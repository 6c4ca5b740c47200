"""Live versus simulated, as figures: openb's nodes (a sample, or the whole default trace) through the
real etcd, kube-apiserver, kube-scheduler and our extender, pod by pod, and through share-sim on the
same arrivals.

Every arrival names the gpushare-scheduler profile, CPU-only pods included and not pinned: they reach
the extender like every pod of the profile (no managedResources) and the policy places them on the
whole node, as in share-sim (issue 31). Arrivals follow share-sim's protocol (its seeded draws, up to
`--tune` x the GPU capacity asked; 1.0 is enough for the 100 % mark). Prints per seed the unallocated
GPU % at arrived 100 % live, share-sim's on the same arrivals (its policy taught what the extender
learns, the arrivals) and share-sim's own (taught the whole trace), GPUs over their memory in the
live run, placements that differ, and the wall time of the live replay.

  python bench/bench_live_vs_sim.py                                   # frag, 32 nodes, seed 7
  python bench/bench_live_vs_sim.py --nodes all --tune 1.0 --seeds 0,1,2   # the whole default trace
  python bench/bench_live_vs_sim.py --policy binpack --nodes 48
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from share_placement import POLICIES  # noqa: E402
from share_scheduler.sim.workload import load_openb  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.integration import livesim  # noqa: E402
from tests.integration.liverun import run_live  # noqa: E402


def gpus_over(nodes: list, arrivals: list, placements: list) -> int:
    """GPUs whose placed shares sum over their memory (the extender must never allow one)."""
    used: dict[tuple[str, int], int] = {}
    for pod, where in zip(arrivals, placements, strict=True):
        if where is not None:
            for i in where[1]:
                used[(where[0], i)] = used.get((where[0], i), 0) + pod.per_gpu
    size = {(n.name, i): g for n in nodes for i, g in enumerate(n.gpus)}
    return sum(1 for k, u in used.items() if u > size[k])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="frag", choices=sorted(POLICIES))
    ap.add_argument("--nodes", default="32", help="openb nodes in the sample, or 'all' (default 32)")
    ap.add_argument("--seeds", default="7", help="comma-separated seeds (sample and arrival order)")
    ap.add_argument("--tune", type=float, default=1.3)
    args = ap.parse_args()
    trace = load_openb(livesim.OPENB / "openb_node_list_gpu_node.csv", livesim.OPENB / "openb_pod_list_default.csv")
    count = len(trace.nodes) if args.nodes == "all" else int(args.nodes)
    print(f"policy {args.policy}, {count} nodes, tune {args.tune}, CPU-only pods through the extender (not pinned)")
    print("seed  arrivals  failed live/sim  unallocated%@100 live  sim(same arrivals)  sim(own)  over  differ  seconds")
    for seed in (int(s) for s in args.seeds.split(",")):
        nodes = list(trace.nodes) if count == len(trace.nodes) else list(livesim.sample_nodes(trace.nodes, count, seed))
        nodes.sort(key=lambda n: n.name)
        sim, arrivals, expected = livesim.simulate_sample(nodes, trace.pods, seed, args.tune, args.policy, True)
        _, _, own = livesim.simulate_sample(nodes, trace.pods, seed, args.tune, args.policy, False)
        with tempfile.TemporaryDirectory(prefix="gpushare-live-vs-sim-") as tmp:
            cp = ControlPlane(Path(tmp) / "cp", k8s_bin_dir())
            cp.start()
            started = time.monotonic()
            try:
                live = run_live(cp, Path(tmp), args.policy, nodes, arrivals)
            finally:
                cp.stop()
        differ = sum(1 for a, b in zip(live, expected, strict=True) if a != b)

        pct = [livesim.unallocated_at(nodes, arrivals, p) for p in (live, expected, own)]
        live_pct, sim_pct, own_pct = ("-" if v is None else f"{v:.2f}" for v in pct)
        print(
            f"{seed:>4}  {len(arrivals):>8}  {live.count(None):>7}/{sim.failed:<7}  {live_pct:>21}  "
            f"{sim_pct:>18}  {own_pct:>8}  {gpus_over(nodes, arrivals, live):>4}  {differ:>6}  "
            f"{time.monotonic() - started:>7.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
