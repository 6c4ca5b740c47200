"""How low can unallocated GPU % at arrived 100 % go on a trace? An estimate from the sharing pods alone.

At arrived 100 % the pods have asked for the whole cluster, so the unallocated share is exactly the
capacity the placed pods could not use. Sharing pods leave the rest of their GPU to pods that fit in
it; whatever no pod fills is lost. Packing all of the trace's sharing pods offline, knowing them all in
advance, with first-fit decreasing (within a few % of optimal for bin packing) shows what even a
clairvoyant scheduler leaves in partly used GPUs, before CPU, GPU models and multi-GPU pods are counted.

    python bench/share_packing_bound.py [--pods ...openb_pod_list_default.csv] [--variant gpushare=60]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from share_scheduler.sim import variants
from share_scheduler.sim.workload import load_openb

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


def first_fit_decreasing(sizes: list[int], capacity: int) -> list[int]:
    """Room left in each bin after packing `sizes` first-fit decreasing."""
    bins: list[int] = []
    for s in sorted(sizes, reverse=True):
        for i, room in enumerate(bins):
            if room >= s:
                bins[i] = room - s
                break
        else:
            bins.append(capacity - s)
    return bins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"))
    ap.add_argument("--variant", help="a share-sim variant, e.g. gpushare=60")
    args = ap.parse_args()
    workload = load_openb(args.nodes, args.pods)
    if args.variant:
        workload = variants.derive(workload, args.variant)
    unit = variants.gpu_unit(workload)
    shares = [p.per_gpu for p in workload.pods if p.count == 1 and p.per_gpu < unit]
    demand = sum(p.gpu_request for p in workload.pods)
    bins = first_fit_decreasing(shares, unit)
    waste = sum(bins)
    # At arrived 100 % the arrivals are the trace scaled to the cluster's capacity.
    scale = workload.gpu_capacity / demand
    print(f"{len(shares)} sharing pods in {len(bins)} GPUs, {waste} units left in them")
    print(
        f"unallocated GPU % at arrived 100 % that an offline first-fit-decreasing packing of the sharing pods "
        f"alone leaves: {100 * waste * scale / workload.gpu_capacity:.2f}"
    )


if __name__ == "__main__":
    main()
