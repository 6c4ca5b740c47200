"""A share-sim timeline live: a sample of openb's nodes through the real etcd, kube-apiserver, kube-scheduler
and our extender as the chart installs them, pods created at their arrival and deleted at their departure,
kube-scheduler retrying on its own; the same figures beside share-sim's timeline for the same arrivals on
the same nodes.

The arrivals are share-sim's (`timeline.poisson_arrivals`, or `--trace-compress` for the trace's own
order): a Poisson stream at offered GPU load rho, durations capped at --cap-days. share-sim's policy is
taught the arrivals' pods (the extender learns from the pods it sees, every arrival once). The live
clock runs --compression times faster than the simulated one; waits and times are printed in simulated
seconds. Prints a table, then one JSON object as the last line.

  python bench/bench_live_timeline.py                         # frag, 200 nodes, rho 0.9, seed 0
  python bench/bench_live_timeline.py --policy binpack --nodes 100 --compression 10
  python bench/bench_live_timeline.py --policy binpack --remedies on   # issue 40's remedies, both sides

`--remedies`: `chart` (default) runs the extender as the chart configures it and share-sim without
remedies; `off` turns reservations and room-leaving off in the extender; `on` turns on reservations
and room-leaving on both sides with the same knobs, their times (`--reserve-after`, `--hold-seconds`,
`--remedy-period`, `--linger`, and `--hold-yield-after` when given, in simulated seconds) divided by
--compression for the live extender,
which acts as a lone replica (no leader Lease: the harness's kube-scheduler runs without leader
election, and with the chart's Lease the extender would never act on its own).
Consolidation stays off: the replay's pods are bare (no controller recreates an evicted one), so the
extender would rightly never move them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from share_placement import POLICIES  # noqa: E402
from share_placement.starvation import ReservationLimits  # noqa: E402
from share_scheduler.sim.engine import build_policy  # noqa: E402
from share_scheduler.sim.remedies import RemedyOptions  # noqa: E402
from share_scheduler.sim.remedies import simulate_with_remedies  # noqa: E402
from share_scheduler.sim.timeline import CLASSES  # noqa: E402
from share_scheduler.sim.timeline import DAY  # noqa: E402
from share_scheduler.sim.timeline import poisson_arrivals  # noqa: E402
from share_scheduler.sim.timeline import simulate_timeline  # noqa: E402
from share_scheduler.sim.timeline import trace_arrivals  # noqa: E402
from share_scheduler.sim.workload import Workload  # noqa: E402
from share_scheduler.sim.workload import load_openb  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.integration import livesim  # noqa: E402
from tests.integration.livefigures import live_figures  # noqa: E402
from tests.integration.livetimeline import run_live_timeline  # noqa: E402


def _fmt(v: float | int | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v / 60:.1f}m" if v < 3600 else f"{v / 3600:.2f}h"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def table(sim: dict, live: dict) -> str:
    rows = [f"allocated GPU % (time-averaged): share-sim {sim['alloc_pct']:.2f}  live {live['alloc_pct']:.2f}  "
            f"gap {live['alloc_pct'] - sim['alloc_pct']:+.2f} points",
            "class  | pods sim/live | waited % sim/live | wait p50 sim/live | p99 sim/live | max sim/live "
            "| waiting at end sim/live"]  # fmt: skip
    for c in CLASSES:
        s, v = sim["classes"][c], live["classes"][c]
        rows.append(
            f"{c:<6} | {s['pods']}/{v['pods']} | {_fmt(s['waited_pct'])}/{_fmt(v['waited_pct'])} | "
            f"{_fmt(s['p50_s'], 's')}/{_fmt(v['p50_s'], 's')} | {_fmt(s['p99_s'], 's')}/{_fmt(v['p99_s'], 's')} | "
            f"{_fmt(s['max_s'], 's')}/{_fmt(v['max_s'], 's')} | {s['waiting_at_end']}/{v['waiting_at_end']}"
        )
    return "\n".join(rows)


def chart_policies() -> list[str]:
    """The policies the chart installs (its values schema's scheduler.policy), each one share-sim knows."""
    schema = json.loads((ROOT / "charts" / "gpushare" / "values.schema.json").read_text())
    return [p for p in schema["properties"]["scheduler"]["properties"]["policy"]["enum"] if p in POLICIES]


def label(key: str, name: str) -> str:
    """The value of label `name` in a Prometheus series key (`series{a="x",b="y"}`), or ""."""
    for part in key.partition("{")[2].rstrip("}").split(","):
        k, _, v = part.partition("=")
        if k == name:
            return v.strip('"')
    return ""


def scheduler_summary(counters: dict[str, float]) -> dict[str, dict[str, int]]:
    """kube-scheduler's attempts by result, and the pods it moved to activeQ/backoffQ by the event that moved
    them (every retry of a waiting pod is one of those)."""
    attempts: dict[str, int] = {}
    moved: dict[str, int] = {}
    for key, value in counters.items():
        if key.startswith("scheduler_schedule_attempts_total"):
            result = label(key, "result")
            attempts[result] = attempts.get(result, 0) + int(value)
        elif label(key, "queue") in ("active", "backoff"):
            event = label(key, "event")
            moved[event] = moved.get(event, 0) + int(value)
    return {"attempts": attempts, "moved_to_active_or_backoff": dict(sorted(moved.items(), key=lambda kv: -kv[1]))}


def remedy_options(args: argparse.Namespace) -> RemedyOptions | None:
    """share-sim's side of `--remedies on` (None: no remedies in share-sim)."""
    if args.remedies != "on":
        return None
    d = ReservationLimits()
    limits = ReservationLimits(after_s=args.reserve_after, max_holds=d.max_holds, max_share=d.max_share,
                               ttl_s=args.hold_seconds)  # fmt: skip
    return RemedyOptions(leave_room=True, reserve=True, consolidate=False, limits=limits,
                         tick_s=args.remedy_period, linger_s=args.linger,
                         yield_after_s=args.hold_yield_after)  # fmt: skip


def extender_flags(args: argparse.Namespace) -> list[str]:
    """The live extender's side: the same knobs, on its clock (simulated seconds / --compression)."""
    if args.remedies == "chart":
        return []
    if args.remedies == "off":
        return ["--no-reservations", "--no-consolidation", "--leave-room", "off"]
    o = remedy_options(args)
    assert o is not None
    live = lambda s: f"{s / args.compression:g}"  # noqa: E731
    # One replica: the harness's kube-scheduler runs without leader election, so the chart's leaderLease
    # would leave the extender never acting on its own; without a Lease it always does (a lone replica).
    return ["--leader-lease=", "--reservations", "--no-consolidation", "--leave-room", "on",
            "--reserve-after", live(o.limits.after_s), "--hold-seconds", live(o.limits.ttl_s),
            "--max-reservations", str(o.limits.max_holds), "--reservation-share", f"{o.limits.max_share:g}",
            "--remedy-min-gpus", str(o.min_gpus), "--starvation-period", live(o.tick_s),
            "--leave-room-linger", live(o.linger_s),
            "--hold-yield-after", "" if o.yield_after_s is None else live(o.yield_after_s)]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="frag", choices=chart_policies(), help="the chart's scheduler.policy")
    ap.add_argument("--nodes", type=int, default=200, help="openb nodes in the sample (model mix kept)")
    ap.add_argument("--seed", type=int, default=0, help="node sample, arrivals and ties")
    ap.add_argument("--rho", type=float, default=0.9, help="offered GPU load")
    ap.add_argument("--days", type=float, default=1 / 48, help="simulated time, days (default 30 min)")
    ap.add_argument("--warmup-days", type=float, default=1 / 144, help="left out of every figure (default 10 min)")
    ap.add_argument("--cap-days", type=float, default=1 / 144, help="longest duration, days (default 10 min)")
    ap.add_argument("--trace-compress", type=float, default=None, help="the trace's own arrivals, time / this")
    ap.add_argument("--compression", type=float, default=3.0, help="simulated seconds per wall second")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the control plane's files and logs here")
    ap.add_argument("--remedies", default="chart", choices=["chart", "off", "on"], help="issue 40's remedies")
    ap.add_argument("--reserve-after", type=float, default=120.0, help="simulated s waited before a reservation")
    ap.add_argument("--hold-seconds", type=float, default=1200.0, help="simulated s one hold lasts")
    ap.add_argument("--remedy-period", type=float, default=30.0, help="simulated s between the remedies' passes")
    ap.add_argument("--linger", type=float, default=600.0, help="simulated s room is left after a shape waited")
    ap.add_argument(
        "--hold-yield-after",
        type=float,
        default=None,
        help="simulated s after which reservations yield to a small pod that found no room (default: never)",
    )
    args = ap.parse_args()
    if not args.compression > 0:
        ap.error("--compression must be positive")

    trace = load_openb(livesim.OPENB / "openb_node_list_gpu_node.csv", livesim.OPENB / "openb_pod_list_default.csv")
    nodes = livesim.sample_nodes(trace.nodes, args.nodes, args.seed)
    workload = Workload(nodes, trace.pods)
    if args.trace_compress:
        arrivals = trace_arrivals(workload, args.trace_compress, args.cap_days, args.days)
    else:
        arrivals = poisson_arrivals(workload, args.rho, args.days, args.cap_days, args.seed)
    end_s, warmup_s = args.days * DAY, args.warmup_days * DAY
    # Taught what the extender learns: every arrival once (drawn with replacement: repeats count).
    taught = Workload(nodes, tuple(trace.pods[a.pod] for a in arrivals))
    gpus = sum(len(n.gpus) for n in nodes)
    print(
        f"{args.policy}, {len(nodes)} openb nodes ({gpus} GPUs), seed {args.seed}, "
        + (f"trace order / {args.trace_compress}" if args.trace_compress else f"rho {args.rho}")
        + f", {len(arrivals)} arrivals over {end_s / 3600:.2f} h (warm-up {warmup_s / 3600:.2f} h, "
        f"cap {args.cap_days * DAY / 60:.0f} min), compression {args.compression:g}x: "
        f"{end_s / args.compression / 60:.1f} min live",
        flush=True,
    )
    policy = build_policy(args.policy, args.seed, taught)
    options = remedy_options(args)
    if options is None:
        sim = simulate_timeline(workload, policy, arrivals, warmup_s, end_s, args.seed)
    else:
        sim = simulate_with_remedies(workload, policy, arrivals, warmup_s, end_s, options, args.seed)
    print(f"share-sim: {sim.seconds:.1f} s", flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpushare-live-timeline-") as tmp:
        workdir = args.workdir or Path(tmp)
        cp = ControlPlane(workdir / "cp", k8s_bin_dir())
        cp.start()
        try:
            live = run_live_timeline(cp, workdir, args.policy, workload, arrivals, args.compression, end_s,
                                     extender_flags=extender_flags(args))  # fmt: skip
        finally:
            cp.stop()
    wall_s = time.monotonic() - started
    if args.workdir is not None:  # the live records, kept: the figures can be computed again without a rerun
        (args.workdir / "records.json").write_text(json.dumps([dataclasses.asdict(r) for r in live.records]))
    figures = live_figures(workload, arrivals, live.records, warmup_s, end_s, policy, args.seed)

    first_try = [
        (r.bound - r.created) / args.compression
        for r in live.records
        if r.bound is not None and r.created is not None and not r.waited
    ]
    first_try.sort()
    latency = {
        "p50_s": round(first_try[len(first_try) // 2], 3) if first_try else None,
        "p99_s": round(first_try[int(0.99 * (len(first_try) - 1))], 3) if first_try else None,
    }
    sim_f, live_f = sim.figures(), figures.figures()
    print(table(sim_f, live_f))
    lag = live.lag_summary()
    print(
        f"live: {len(live.records)} arrivals replayed in {live.replay_s:.0f} s (set-up {live.setup_s:.0f} s, "
        f"whole run {wall_s:.0f} s); the driver's requests went out late by p50 {lag['p50_s'] * 1000:.0f} ms, "
        f"p99 {lag['p99_s'] * 1000:.0f} ms, max {lag['max_s']:.2f} s (wall); first-try binding latency "
        f"p50 {latency['p50_s']} s, p99 {latency['p99_s']} s (wall); GPUs over their memory: {len(live.gpus_over)}"
    )
    kube_scheduler = scheduler_summary(live.scheduler_counters)
    print(f"kube-scheduler: attempts {kube_scheduler['attempts']}; pods moved to activeQ/backoffQ by event "
          f"{kube_scheduler['moved_to_active_or_backoff']}")  # fmt: skip
    out = {
        "policy": args.policy,
        "nodes": len(nodes),
        "gpus": gpus,
        "seed": args.seed,
        "rho": None if args.trace_compress else args.rho,
        "trace_compress": args.trace_compress,
        "days": args.days,
        "warmup_days": args.warmup_days,
        "cap_days": args.cap_days,
        "compression": args.compression,
        "remedies": args.remedies,
        "extender_flags": extender_flags(args),
        "arrivals": len(arrivals),
        "sim": sim_f,
        "live": live_f,
        "alloc_gap_points": round(live_f["alloc_pct"] - sim_f["alloc_pct"], 3),
        "live_run": {
            "replay_s": round(live.replay_s, 1),
            "setup_s": round(live.setup_s, 1),
            "wall_s": round(wall_s, 1),
            "request_lag_s": {k: round(v, 3) for k, v in lag.items()},
            "first_try_latency_s": latency,
            "gpus_over": len(live.gpus_over),
            "kube_scheduler": kube_scheduler,
        },
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
