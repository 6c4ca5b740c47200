"""share-sim timeline: what a churning cluster gets (pods arrive, wait, run for their time and leave).

Allocation averaged over time and, per class of pod (share, whole, multi, cpu), how many waited and
how long, under each placement policy, for Poisson arrivals at offered GPU loads (`--rho`) or for the
trace's own arrivals compressed (`--replay`). See docs/simulator.md, "Timeline (churn)".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import share_placement as placement
from share_scheduler.sim import remedies
from share_scheduler.sim import remedies_cli
from share_scheduler.sim.cli import check_inputs
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.timeline import CLASSES
from share_scheduler.sim.timeline import DAY
from share_scheduler.sim.timeline import TimelineResult
from share_scheduler.sim.timeline import poisson_arrivals
from share_scheduler.sim.timeline import runnable
from share_scheduler.sim.timeline import simulate_timeline
from share_scheduler.sim.timeline import trace_arrivals
from share_scheduler.sim.workload import Workload
from share_scheduler.sim.workload import WorkloadError
from share_scheduler.sim.workload import load_openb
from share_scheduler.sim.workload import load_yaml

FIGURES = ("waited_pct", "p50_s", "p99_s", "max_s", "waiting_at_end")
# A run's cost relative to bestfit's at the same load (docs/simulator.md, the table's CPU seconds per
# run): only the order in which `--jobs` workers take the runs.
RELATIVE_COST = {"frag": 3.5, "fgd": 1.7, "bestfit": 1.0, "binpack": 0.9, "random": 0.5}


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{what} must be positive numbers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="share-sim timeline", description=__doc__.splitlines()[0])
    src = p.add_argument_group("input (either the openb CSVs or --yaml)")
    src.add_argument("--nodes", help="openb node list CSV")
    src.add_argument("--pods", help="openb pod list CSV (with qos, pod_phase, creation/deletion/scheduled_time)")
    src.add_argument("--yaml", help="our own cluster+workload YAML; pods need `duration` (s)")
    p.add_argument("--policy", default="bestfit", help="comma-separated: " + ",".join(placement.POLICIES))
    p.add_argument("--rho", help="offered GPU load, comma-separated (default 0.9): Poisson arrivals at that load")
    p.add_argument("--replay", type=float, metavar="COMPRESS", help="the trace's own arrivals, times / COMPRESS")
    p.add_argument("--days", type=float, default=3.0, help="simulated days (default 3)")
    p.add_argument("--warmup-days", type=float, default=1.0, help="days left out of every figure (default 1)")
    p.add_argument("--cap-days", type=float, default=1.0, help="cap on a pod's duration, days (default 1)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds to average (default 3)")
    p.add_argument("--seed-start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per policy and load, one a line")
    p.add_argument(
        "--preempt",
        choices=("on", "off"),
        help="priority preemption (share_scheduler/sim/preemption.py): on evicts lower-priority pods for a pod that "
        "fits nowhere, as the extender does; off runs the same engine without it; both add per-priority waits",
    )
    p.add_argument("--plot", metavar="FILE.png", help="allocation and waiting pods over time (needs matplotlib)")
    remedies_cli.add_arguments(p)
    args = p.parse_args(argv)
    try:
        args.remedies = remedies_cli.options_from(args)
    except ValueError as exc:
        p.error(str(exc))
    if args.preempt is not None and args.remedies.any:
        # Two engines over one Timeline (sim/preemption.py and sim/remedies.py); not yet one run.
        p.error("--preempt runs apart from the starvation remedies: give --preempt or --reserve/--consolidate")
    check_inputs(p, args)
    if args.replay is not None and args.rho is not None:
        p.error("give --rho (Poisson arrivals) or --replay (the trace's arrivals), not both")
    if args.replay is not None and not args.replay > 0:
        p.error("--replay COMPRESS must be positive")
    try:
        args.rhos = [None] if args.replay is not None else _floats(args.rho or "0.9", "--rho")
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if not args.days > 0 or not args.cap_days > 0:
        p.error("--days and --cap-days must be positive")
    if not 0 <= args.warmup_days < args.days:
        p.error(f"--warmup-days must be at least 0 and less than --days ({args.days:g})")
    if args.seeds < 1 or args.jobs < 1:
        p.error("--seeds and --jobs must be at least 1")
    return args


def run_one(
    workload: Workload,
    name: str,
    seed: int,
    rho: float | None,
    days: float,
    warmup_days: float,
    cap_days: float,
    replay: float | None = None,
    preempt: str | None = None,
    options: remedies.RemedyOptions | None = None,
) -> TimelineResult:
    """One seed of one policy at one load (or the trace replayed), the policy built as the extender builds it;
    with issue 40's remedies where `options` turns any on."""
    if replay is not None:
        arrivals = trace_arrivals(workload, replay, cap_days, days)
    else:
        assert rho is not None
        arrivals = poisson_arrivals(workload, rho, days, cap_days, seed)
    policy = build_policy(name, seed, workload)
    if preempt is not None:
        from share_scheduler.sim.preemption import simulate_preemption_timeline

        result: TimelineResult = simulate_preemption_timeline(
            workload, policy, arrivals, warmup_days * DAY, days * DAY, seed=seed, preempt=preempt == "on"
        )
    elif options is not None and options.any:
        result = remedies.simulate_with_remedies(
            workload, policy, arrivals, warmup_days * DAY, days * DAY, options, seed=seed
        )
    else:
        result = simulate_timeline(workload, policy, arrivals, warmup_days * DAY, days * DAY, seed=seed)
    result.policy = name
    return result


def _avg(values: list) -> float | None:
    got = [v for v in values if v is not None]
    return round(sum(got) / len(got), 3) if got else None


def mean_figures(per_seed: list[dict]) -> dict:
    """The mean of the seeds' figures (`TimelineResult.figures()`), in their shape less the seed; a figure
    no seed has (the waits of a class none of whose pods arrived) stays None."""
    mean: dict = {
        key: _avg([f[key] for f in per_seed])
        for key in (
            "alloc_pct",
            "free_while_waiting_pct",
            "gpu_waiting_time_pct",
            "arrivals",
            "placed",
            "evictions_per_1000_placed",
        )
    }
    mean["classes"] = {
        c: {k: _avg([f["classes"][c][k] for f in per_seed]) for k in ("pods", *FIGURES)} for c in CLASSES
    }
    if all("preemption" in f for f in per_seed):  # --preempt: the numbers averaged, per priority too
        runs = [f["preemption"] for f in per_seed]
        mean["preemption"] = {
            k: _avg([r[k] for r in runs]) for k, v in runs[0].items() if k not in ("enabled", "by_priority")
        }
        mean["preemption"]["enabled"] = runs[0]["enabled"]
        prios = sorted({p for r in runs for p in r["by_priority"]}, key=int, reverse=True)
        mean["preemption"]["by_priority"] = {
            p: {
                k: _avg([r["by_priority"].get(p, {}).get(k) for r in runs])
                for k in ("pods", "waited_pct", "p50_s", "p99_s", "max_s")
            }
            for p in prios
        }
    return mean


def summarise(name: str, rho: float | None, replay: float | None, results: list[TimelineResult]) -> dict:
    """One policy at one load: the JSON object `--json` prints (see docs/simulator.md)."""
    out: dict = {"policy": name, "rho": rho}
    if replay is not None:
        out["replay"] = replay
    out["seeds"] = [r.figures() for r in results]
    out["mean"] = mean_figures(out["seeds"])
    out["seconds_per_seed"] = round(sum(r.seconds for r in results) / len(results), 2)
    return out


def run(
    workload: Workload,
    policies: list[str],
    rhos: list[float | None],
    seeds: list[int],
    days: float,
    warmup_days: float,
    cap_days: float,
    replay: float | None = None,
    jobs: int = 1,
    preempt: str | None = None,
    options: remedies.RemedyOptions | None = None,
) -> list[tuple[dict, list[TimelineResult]]]:
    """Every (policy, load) over every seed: (summary, the seeds' results) in policy-then-load order."""
    tasks = [(name, rho, seed) for name in policies for rho in rhos for seed in seeds]
    args = [
        (workload, name, seed, rho, days, warmup_days, cap_days, replay, preempt, options) for name, rho, seed in tasks
    ]
    if jobs > 1:
        # The costliest runs first, so that the last ones to finish are short and no worker idles long
        # while another ends a frag run (longest processing time first); results in the tasks' order.
        order = sorted(range(len(tasks)), key=lambda i: (-RELATIVE_COST.get(tasks[i][0], 1.0), -(tasks[i][1] or 0)))
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {i: pool.submit(run_one, *args[i]) for i in order}
            results = [futures[i].result() for i in range(len(tasks))]
    else:
        results = [run_one(*a) for a in args]
    out = []
    for name in policies:
        for rho in rhos:
            mine = [r for (n, x, _), r in zip(tasks, results, strict=True) if n == name and x == rho]
            out.append((summarise(name, rho, replay, mine), mine))
    return out


def human(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def format_table(rows: list[dict], workload: Workload, days: float, warmup_days: float) -> str:
    seeds = len(rows[0]["seeds"])
    lines = [
        f"timeline: {days:g} days, first {warmup_days:g} left out, mean of {seeds} seed{'s' if seeds != 1 else ''} "
        f"({len(workload.nodes)} nodes, {workload.gpu_count} GPUs); per class: waited % / wait p50 / p99 / "
        "longest / waiting at the end",
        f"{'policy':<9}{'rho':>6}{'alloc%':>8}{'free%':>7}  " + "".join(f"{c:<31}" for c in CLASSES) + f"{'s/seed':>8}",
    ]
    for row in rows:
        m = row["mean"]
        rho = "replay" if row["rho"] is None else f"{row['rho']:g}"
        free = m["free_while_waiting_pct"]
        cells = ""
        for c in CLASSES:
            f = m["classes"][c]
            if f["pods"] in (None, 0):
                cells += f"{'-':<31}"
                continue
            cell = (
                f"{f['waited_pct']:.1f}/{human(f['p50_s'])}/{human(f['p99_s'])}/{human(f['max_s'])}/"
                f"{f['waiting_at_end']:g}"
            )
            cells += f"{cell:<31}"
        lines.append(
            f"{row['policy']:<9}{rho:>6}{m['alloc_pct']:>8.1f}{'-' if free is None else f'{free:.1f}':>7}  "
            f"{cells}{row['seconds_per_seed']:>8.1f}"
        )
    lines.append("free%: free GPU capacity, time-averaged over the time some GPU pod waited")
    for row in rows:  # issue 40's consolidation (--consolidate on)
        evictions = row["mean"].get("evictions_per_1000_placed")
        if evictions:
            lines.append(f"{row['policy']} rho {row['rho']}: {evictions:g} evictions by consolidation per 1,000 placed")
    return "\n".join(lines)


def plot(runs: list[tuple[dict, list[TimelineResult]]], path: str, warmup_days: float) -> None:
    """Allocation % (top) and waiting pods per class (bottom) over time, the mean of the seeds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("share-sim: --plot needs matplotlib: pip install 'gpushare[plot]'") from None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    styles = ["-", "--", ":", "-."]
    colours = {"share": "tab:blue", "whole": "tab:orange", "multi": "tab:red", "cpu": "tab:grey"}
    for i, (row, results) in enumerate(runs):
        length = min(len(r.series.times) for r in results)
        hours = [t / 3600 for t in results[0].series.times[:length]]
        label = row["policy"] + ("" if row["rho"] is None else f" rho {row['rho']:g}")
        alloc = [sum(r.series.alloc_pct[j] for r in results) / len(results) for j in range(length)]
        top.plot(hours, alloc, label=f"{label} ({row['mean']['alloc_pct']:.1f}% after warm-up)")
        for c in CLASSES:
            waiting = [sum(r.series.waiting[c][j] for r in results) / len(results) for j in range(length)]
            if any(waiting):
                bottom.plot(hours, waiting, color=colours[c], linestyle=styles[i % len(styles)], label=f"{label}: {c}")
    for ax in (top, bottom):
        ax.axvspan(0, warmup_days * 24, color="grey", alpha=0.12, label="_warm-up")
        ax.grid(True, alpha=0.3)
    seeds = len(runs[0][1])
    top.set_title(
        f"GPU allocation and waiting pods over time (mean of {seeds} seed{'s' if seeds != 1 else ''}; shaded: warm-up)"
    )
    top.set_ylabel("GPU allocated (%)")
    top.legend(loc="lower right", fontsize="small")
    bottom.set_ylabel("pods waiting")
    bottom.set_xlabel("time (hours)")
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        workload = load_yaml(args.yaml) if args.yaml else load_openb(args.nodes, args.pods)
    except (OSError, WorkloadError) as exc:
        print(f"share-sim: {exc}", file=sys.stderr)
        return 2
    left_out = len(workload.pods) - len(runnable(workload))
    if left_out:
        print(
            f"share-sim: left out {left_out} of {len(workload.pods)} pods with no duration "
            "(Pending in the trace: they never ran)",
            file=sys.stderr,
        )
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    try:
        runs = run(
            workload,
            args.policies,
            args.rhos,
            seeds,
            args.days,
            args.warmup_days,
            args.cap_days,
            args.replay,
            args.jobs,
            args.preempt,
            args.remedies,
        )
    except ValueError as exc:
        print(f"share-sim: {exc}", file=sys.stderr)
        return 2
    rows = [row for row, _ in runs]
    if args.plot:
        plot(runs, args.plot, args.warmup_days)
    if args.json:
        for row in rows:
            print(json.dumps(row, allow_nan=False))
    else:
        print(format_table(rows, workload, args.days, args.warmup_days))
        if args.preempt:
            from share_scheduler.sim.preemption import format_preemption

            print(format_preemption(rows))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0
