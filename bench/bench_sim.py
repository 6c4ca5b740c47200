"""Simulator time per seed per policy on the openb default trace (protocol of the paper, tune 1.3).

python bench/bench_sim.py [--policy binpack,bestfit,spread,random,frag] [--seeds 1]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from share_scheduler.sim.engine import run_policy
from share_scheduler.sim.workload import load_openb

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"))
    ap.add_argument("--policy", default="binpack,bestfit,spread,random,frag")
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    workload = load_openb(args.nodes, args.pods)
    print(f"{len(workload.nodes)} nodes, {workload.gpu_count} GPUs; seconds per seed (policy build included)")
    print(f"{'policy':<10}{'s/seed':>9}{'arrivals':>10}{'us/arrival/node':>17}")
    for name in args.policy.split(","):
        runs = [run_policy(workload, name, seed) for seed in range(args.seeds)]
        secs = statistics.mean(r.seconds for r in runs)
        arrivals = statistics.mean(r.arrivals for r in runs)
        per = secs / arrivals / len(workload.nodes) * 1e6
        print(f"{name:<10}{secs:>9.2f}{arrivals:>10.0f}{per:>17.3f}")


if __name__ == "__main__":
    main()
