"""share-sim: how much GPU does a workload strand under each placement policy?

Replays the openb trace (or a YAML of our own) with the extender's own placement policies, following
the protocol of Weng et al. (ATC '23); prints unallocated GPU % at arrived 90/95/100/130 %.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import share_placement as placement
from share_scheduler.sim import variants
from share_scheduler.sim.engine import CURVE_STEP
from share_scheduler.sim.engine import THRESHOLDS
from share_scheduler.sim.engine import SeedResult
from share_scheduler.sim.engine import run_policy
from share_scheduler.sim.workload import Workload
from share_scheduler.sim.workload import WorkloadError
from share_scheduler.sim.workload import load_openb
from share_scheduler.sim.workload import load_yaml


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="share-sim",
        description=__doc__.splitlines()[0],
        epilog="share-sim timeline --help: the churn mode (pods arrive, wait and leave over time)",
    )
    src = p.add_argument_group("input (either the openb CSVs or --yaml)")
    src.add_argument("--nodes", help="openb node list CSV (sn, cpu_milli, memory_mib, gpu, model)")
    src.add_argument("--pods", help="openb pod list CSV (cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, ...)")
    src.add_argument("--yaml", help="our own cluster+workload YAML (GiB); see share_scheduler/sim/examples/")
    p.add_argument(
        "--variant",
        metavar="FAMILY=VALUE",
        help="derive variants of the trace as the FGD paper does (comma-separated; 'doc': the docs' table): "
        "gpushare=20..100 (%% of GPU pods sharing a GPU), "
        "multigpu=20..50 (%% of GPU demand from multi-GPU pods), gpuspec=5..33 (%% of GPU pods restricted to GPU "
        "models), cpu=0..3 (x the CPU demand of CPU-only pods); see docs/simulator.md",
    )
    p.add_argument("--variant-seed", type=int, default=0, help="seed of the variant's resampling (default 0)")
    p.add_argument("--policy", default="binpack,random,frag", help="comma-separated: " + ",".join(placement.POLICIES))
    p.add_argument("--seeds", type=int, default=10, help="number of seeds to average (default 10)")
    p.add_argument("--seed-start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--tune", type=float, default=1.3, help="stop once this x cluster GPU capacity was asked (1.3)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="draw allocation vs arrived workload (needs matplotlib)")
    args = p.parse_args(argv)
    check_inputs(p, args)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    if not (args.tune > 0):
        p.error("--tune must be positive")
    return args


def check_inputs(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The input files and `--policy` of either mode (the protocol, `timeline`): one rule, one wording;
    sets `args.policies`."""
    if args.yaml and (args.nodes or args.pods):
        p.error("give either --yaml or --nodes and --pods, not both")
    if not args.yaml and not (args.nodes and args.pods):
        p.error("give --nodes and --pods (openb CSVs), or --yaml")
    args.policies = [s.strip() for s in args.policy.split(",") if s.strip()]
    unknown = [s for s in args.policies if s not in placement.POLICIES]
    if not args.policies or unknown:
        p.error(f"unknown policy {', '.join(unknown) or '(none)'}: choose from {', '.join(placement.POLICIES)}")


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if len(got) == len(values) and got else None


def summarise(name: str, results: list[SeedResult]) -> dict:
    """One policy's mean over seeds, in the --json schema (plus timing and the mean curve)."""
    unalloc = {str(t): _mean([r.unallocated_pct[str(t)] for r in results]) for t in THRESHOLDS}
    length = min(len(r.curve) for r in results)
    curve = [sum(r.curve[i] for r in results) / len(results) for i in range(length)]
    return {
        "policy": name,
        "seeds": len(results),
        "unallocated_pct": {k: None if v is None else round(v, 3) for k, v in unalloc.items()},
        "seconds_per_seed": round(sum(r.seconds for r in results) / len(results), 3),
        "failed_pods": round(sum(r.failed for r in results) / len(results), 1),
        "_curve": curve,
    }


def run(workload: Workload, policies: list[str], seeds: list[int], tune: float, jobs: int = 1) -> list[dict]:
    tasks = [(name, seed) for name in policies for seed in seeds]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_policy, workload, name, seed, tune) for name, seed in tasks]
            results = [f.result() for f in futures]
    else:
        results = [run_policy(workload, name, seed, tune) for name, seed in tasks]
    return [summarise(name, [r for (n, _), r in zip(tasks, results, strict=True) if n == name]) for name in policies]


def format_table(rows: list[dict], workload: Workload) -> str:
    head = f"{'policy':<10}" + "".join(f"{t:>7}%" for t in THRESHOLDS) + f"{'s/seed':>9}"
    lines = [
        f"unallocated GPU % at arrived workload %, mean of {rows[0]['seeds']} seeds "
        f"({len(workload.nodes)} nodes, {workload.gpu_count} GPUs, {len(workload.pods)} pods; lower is better)",
        head,
    ]
    for row in rows:
        cells = "".join(
            f"{'-':>8}" if v is None else f"{v:>8.2f}" for v in (row["unallocated_pct"][str(t)] for t in THRESHOLDS)
        )
        lines.append(f"{row['policy']:<10}{cells}{row['seconds_per_seed']:>9.1f}")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("share-sim: --plot needs matplotlib: pip install 'gpushare[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = 0.0
    for row in rows:
        xs = [i * CURVE_STEP for i in range(len(row["_curve"]))]
        at100 = row["unallocated_pct"].get("100")
        label = row["policy"] if at100 is None else f"{row['policy']} ({at100:.2f}% unallocated at 100%)"
        ax.plot(xs, row["_curve"], label=label)
        top = max(top, xs[-1] if xs else 0.0)
    ax.plot([0, min(top, 100)], [0, min(top, 100)], color="grey", linestyle=":", linewidth=1, label="ideal")
    if top >= 100:
        ax.axvline(100, color="black", linestyle="--", linewidth=0.8, label="arrived = 100%")
    seeds = rows[0]["seeds"] if rows else 0
    ax.set_title(f"GPU allocation as the workload arrives (mean of {seeds} seed{'s' if seeds != 1 else ''})")
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation (%)")
    ax.set_xlim(max(0.0, top - 60), top)
    ax.set_ylim(max(0.0, top - 60 - 5), 100)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def variant_specs(value: str) -> list[str]:
    """'gpushare=20,cpu=3' -> both; 'doc' -> every family at the points of docs/simulator.md's table."""
    if value.strip() == "doc":
        return [f"{f}={v:g}" for f, points in variants.DOC_POINTS.items() for v in points]
    return [v.strip() for v in value.split(",") if v.strip()]


def format_variant_table(results: list[tuple[str, list[dict]]], policies: list[str]) -> str:
    """One row per variant: each policy's unallocated GPU % at arrived 100 %, and which is lowest."""
    seeds = results[0][1][0]["seeds"]
    lines = [
        f"unallocated GPU % at arrived 100 %, mean of {seeds} seeds (lower is better)",
        f"{'variant':<14}" + "".join(f"{p:>10}" for p in policies) + f"{'lowest':>10}",
    ]
    for spec, rows in results:
        values = [row["unallocated_pct"]["100"] for row in rows]
        cells = "".join(f"{'-':>10}" if v is None else f"{v:>10.2f}" for v in values)
        known = [(v, row["policy"]) for v, row in zip(values, rows, strict=True) if v is not None]
        lines.append(f"{spec:<14}{cells}{(min(known)[1] if known else '-'):>10}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["timeline"]:  # the churn mode: its own options (share-sim timeline --help)
        from share_scheduler.sim import timeline_cli

        return timeline_cli.main(argv[1:])
    args = parse_args(argv)
    try:
        workload = load_yaml(args.yaml) if args.yaml else load_openb(args.nodes, args.pods)
        specs = variant_specs(args.variant) if args.variant else []
        derived = []
        if specs:
            print(f"share-sim: trace: {variants.mix(workload).line()}", file=sys.stderr)
        for spec in specs:
            w = variants.derive(workload, spec, args.variant_seed)
            print(f"share-sim: variant {spec} (seed {args.variant_seed}): {variants.mix(w).line()}", file=sys.stderr)
            derived.append((spec, w))
    except (OSError, WorkloadError, variants.VariantError) as exc:
        print(f"share-sim: {exc}", file=sys.stderr)
        return 2
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    if len(derived) > 1:
        if args.plot:
            print("share-sim: --plot draws one workload; give one --variant", file=sys.stderr)
            return 2
        results = [(spec, run(w, args.policies, seeds, args.tune, args.jobs)) for spec, w in derived]
        if args.json:
            out = [
                {"variant": spec, **{k: v for k, v in row.items() if not k.startswith("_")}}
                for spec, rows in results
                for row in rows
            ]
            print(json.dumps(out, indent=2, allow_nan=False))
        else:
            print(format_variant_table(results, args.policies))
        return 0
    if derived:
        workload = derived[0][1]
    rows = run(workload, args.policies, seeds, args.tune, args.jobs)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        out = [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        print(format_table(rows, workload))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
