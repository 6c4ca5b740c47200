"""Issue 40's remedies against best-fit: multi-GPU waits, share and whole waits, allocation, evictions.

python bench/bench_starvation.py [--configs bestfit:off,frag:off,frag:on,binpack:off,binpack:on]
    [--rho 0.9,1.0] [--seeds 5] [--days 3] [--warmup-days 1] [--jobs 2] [--out DIR] [--table-only]

A config is POLICY:REMEDIES, REMEDIES one of off, on (all three: --leave-room, --reserve and --consolidate
with their defaults), room, reserve, consolidate (one alone), or some of them joined by "+" (room+reserve:
the chart's reservations with leaveRoom on, consolidation off). Every (config, rho, seed) is one share-sim
timeline run on the openb default trace (Poisson arrivals, the same arrivals for every config of a seed);
each run's figures are written to DIR as one JSON line (`--out`, default /tmp/bench_starvation), and a
run already there is not run again, so the comparison can be built in pieces. Then the table: per config
and rho, the mean over the seeds of allocation, multi-GPU pods' waited % / p50 / p99, share and whole
pods' p99, evictions per 1,000 placed, and issue 40's targets against bestfit:off at the same rho
(multi p99 at rho 0.9 and multi p50 at rho 1.0 at most a quarter of best-fit's; share and whole p99 at
most 60 s longer; allocation no lower).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.remedies import RemedyOptions
from share_scheduler.sim.remedies import simulate_with_remedies
from share_scheduler.sim.timeline import DAY
from share_scheduler.sim.timeline import poisson_arrivals
from share_scheduler.sim.timeline import simulate_timeline
from share_scheduler.sim.workload import load_openb

DATA = Path(os.environ.get("OPENB_DIR", Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"))
REMEDIES = {
    "off": RemedyOptions(),
    "on": RemedyOptions(leave_room=True, reserve=True, consolidate=True),
    "room": RemedyOptions(leave_room=True),
    "reserve": RemedyOptions(reserve=True),
    "consolidate": RemedyOptions(consolidate=True),
}
PARTS = {"room": "leave_room", "reserve": "reserve", "consolidate": "consolidate"}
BASELINE = "bestfit:off"


def remedy_options(spec: str) -> RemedyOptions | None:
    """The options a config's REMEDIES names (None: not a known name or combination)."""
    if spec in REMEDIES:
        return REMEDIES[spec]
    parts = spec.split("+")
    if len(parts) < 2 or len(set(parts)) != len(parts) or not set(parts) <= set(PARTS):
        return None
    return RemedyOptions(**{PARTS[p]: True for p in parts})


_WORKLOAD = None


def _workload(nodes: str, pods: str):
    global _WORKLOAD
    if _WORKLOAD is None:
        _WORKLOAD = load_openb(nodes, pods)
    return _WORKLOAD


def run_one(nodes: str, pods: str, config: str, rho: float, seed: int, days: float, warmup: float) -> dict:
    workload = _workload(nodes, pods)
    policy_name, remedies = config.split(":")
    options = remedy_options(remedies)
    assert options is not None, remedies
    arrivals = poisson_arrivals(workload, rho, days, 1.0, seed)
    policy = build_policy(policy_name, seed, workload)
    cpu0 = time.process_time()
    if options.any:
        result = simulate_with_remedies(workload, policy, arrivals, warmup * DAY, days * DAY, options, seed=seed)
    else:
        result = simulate_timeline(workload, policy, arrivals, warmup * DAY, days * DAY, seed=seed)
    figures = result.figures()
    figures.update(config=config, rho=rho, days=days, warmup_days=warmup, cpu_s=round(time.process_time() - cpu0, 1))
    return figures


def _key(f: dict) -> tuple[str, float, int, float, float]:
    return (f["config"], f["rho"], f["seed"], f["days"], f["warmup_days"])


def load(out: Path) -> dict[tuple, dict]:
    runs: dict[tuple, dict] = {}
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                f = json.loads(line)
                runs[_key(f)] = f
    return runs


def import_summaries(path: Path, days: float, warmup: float) -> list[dict]:
    """Per-seed figures from `share-sim timeline --json` output (runs without remedies), as POLICY:off
    records: the same code path as this bench's off runs, so the same figures for the same seed."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        for f in row["seeds"]:
            f = dict(f)
            f.setdefault("evictions_per_1000_placed", 0.0)
            f.update(config=f"{row['policy']}:off", rho=row["rho"], days=days, warmup_days=warmup, cpu_s=None)
            out.append(f)
    return out


def _mean(values: list) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def _h(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"


def table(runs: dict[tuple, dict], configs: list[str], rhos: list[float], seeds: list[int], days: float, warmup: float):
    lines = [
        f"openb default trace, {days:g} days ({warmup:g} warm-up), cap 1 day; mean of seeds {seeds[0]}..{seeds[-1]}",
        f"{'config':<22}{'rho':>5}{'n':>3}{'alloc%':>8}  {'multi waited/p50/p99':<24}{'share p99':>10}"
        f"{'whole p99':>10}{'evict/1k':>9}{'cpu s':>7}  targets vs bestfit:off",
    ]
    for rho in rhos:
        base_runs = [runs.get((BASELINE, rho, s, days, warmup)) for s in seeds]
        base_runs = [r for r in base_runs if r]
        base = _summary(base_runs) if base_runs else None
        for config in configs:
            got = [runs.get((config, rho, s, days, warmup)) for s in seeds]
            got = [r for r in got if r]
            if not got:
                continue
            m = _summary(got)
            verdict = "" if base is None or config == BASELINE else _targets(m, base, rho)
            cpu = "-" if m["cpu"] is None else f"{m['cpu']:.0f}"
            multi = f"{m['multi_waited']:.1f}%/{_h(m['multi_p50'])}/{_h(m['multi_p99'])}"
            lines.append(
                f"{config:<22}{rho:>5g}{len(got):>3}{m['alloc']:>8.2f}  {multi:<24}{_h(m['share_p99']):>10}"
                f"{_h(m['whole_p99']):>10}{m['evictions']:>9.2f}{cpu:>7}  {verdict}"
            )
    return "\n".join(lines)


def _summary(runs: list[dict]) -> dict:
    c = [r["classes"] for r in runs]
    return {
        "alloc": _mean([r["alloc_pct"] for r in runs]),
        "multi_waited": _mean([x["multi"]["waited_pct"] for x in c]) or 0.0,
        "multi_p50": _mean([x["multi"]["p50_s"] for x in c]),
        "multi_p99": _mean([x["multi"]["p99_s"] for x in c]),
        "share_p99": _mean([x["share"]["p99_s"] for x in c]),
        "whole_p99": _mean([x["whole"]["p99_s"] for x in c]),
        "evictions": _mean([r.get("evictions_per_1000_placed", 0.0) for r in runs]) or 0.0,
        "cpu": _mean([r.get("cpu_s") for r in runs]),
    }


def _check(name: str, got: float, limit: float, at_least: bool = False) -> str:
    """'name <= limit: ok', or how far off."""
    if at_least:
        return f"{name} >= {limit:.2f}: " + ("ok" if got >= limit - 1e-9 else f"MISSED by {limit - got:.2f} points")
    return f"{name} <= {_h(limit)}: " + ("ok" if got <= limit else f"MISSED by {_h(got - limit)}")


def _targets(m: dict, base: dict, rho: float) -> str:
    """Issue 40's targets, each 'ok' or how far off."""
    out = []
    if abs(rho - 0.9) < 1e-9:
        out.append(_check("multi p99", m["multi_p99"] or 0, (base["multi_p99"] or 0) / 4))
    if abs(rho - 1.0) < 1e-9:
        out.append(_check("multi p50", m["multi_p50"] or 0, (base["multi_p50"] or 0) / 4))
    for cls in ("share", "whole"):
        out.append(_check(f"{cls} p99", m[f"{cls}_p99"] or 0, (base[f"{cls}_p99"] or 0) + 60))
    out.append(_check("alloc", m["alloc"], base["alloc"], at_least=True))
    return "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"))
    ap.add_argument("--configs", default="bestfit:off,frag:off,frag:on,binpack:off,binpack:on")
    ap.add_argument("--rho", default="0.9,1.0")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--warmup-days", type=float, default=1.0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="/tmp/bench_starvation")
    ap.add_argument("--table-only", action="store_true", help="print the table from what DIR holds, run nothing")
    ap.add_argument("--no-baseline", action="store_true", help="do not run bestfit:off (DIR or --import has it)")
    ap.add_argument(
        "--import",
        dest="imports",
        nargs="*",
        default=[],
        metavar="FILE",
        help="share-sim timeline --json lines (no remedies, same days/warm-up/cap 1) to count as POLICY:off runs",
    )
    args = ap.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        policy, _, remedies = c.partition(":")
        if not policy or remedy_options(remedies) is None:
            ap.error(f"config {c!r}: expected POLICY:{'|'.join(REMEDIES)} or some of {'+'.join(PARTS)}")
    rhos = [float(r) for r in args.rho.split(",")]
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in args.imports:
        imported = import_summaries(Path(path), args.days, args.warmup_days)
        with (out / f"imported-{Path(path).stem}.jsonl").open("w") as fh:
            fh.writelines(json.dumps(f) + "\n" for f in imported)
    runs = load(out)
    baseline = [] if args.no_baseline or BASELINE in configs else [BASELINE]
    todo = [  # seed by seed, so a comparison cut short still has every config at every load
        (c, r, s)
        for s in seeds
        for r in rhos
        for c in baseline + configs
        if (c, r, s, args.days, args.warmup_days) not in runs
    ]
    if not args.table_only and todo:
        print(f"{len(todo)} runs to do, {args.jobs} at a time", flush=True)
        sink = out / f"runs-{os.getpid()}.jsonl"
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = {
                pool.submit(run_one, args.nodes, args.pods, c, r, s, args.days, args.warmup_days): (c, r, s)
                for c, r, s in todo
            }
            for fut in futures:
                f = fut.result()
                with sink.open("a") as fh:
                    fh.write(json.dumps(f) + "\n")
                m = f["classes"]["multi"]
                print(
                    f"done {f['config']} rho {f['rho']:g} seed {f['seed']}: alloc {f['alloc_pct']:.2f} multi p50 "
                    f"{_h(m['p50_s'])} p99 {_h(m['p99_s'])} evictions/1k {f['evictions_per_1000_placed']} "
                    f"({f['cpu_s']} cpu s)",
                    flush=True,
                )
        runs = load(out)
    all_configs = ([BASELINE] if BASELINE not in configs else []) + configs
    print(table(runs, all_configs, rhos, seeds, args.days, args.warmup_days))


if __name__ == "__main__":
    main()
