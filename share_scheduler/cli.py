"""`share-scheduler`: serve the extender (share_scheduler.server), or print the kube-scheduler configuration."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from collections.abc import Sequence

from share_core.config import add_config_arg
from share_core.config import parse_args
from share_core.config import start_logging
from share_core.contract import EXTENDER_DEFAULT_PORT
from share_core.contract import MemoryUnit
from share_placement import POLICIES
from share_scheduler.binder import BIND_EVENTS
from share_scheduler.config import DEFAULT_EXTENDER_URL
from share_scheduler.config import print_config
from share_scheduler.extender import FILTER_KEEPS
from share_scheduler.starvation import StarvationConfig

log = logging.getLogger("share_scheduler")
ON_OFF = ("on", "off")


def serve(a: argparse.Namespace) -> None:
    """ONE process, threads: the cache, the per-node bind locks and the assumed pods live in this
    process's memory; two processes would each hold their own view and could promise the same GPU
    memory twice. One is also all that is ever needed: kube-scheduler's leader election means a
    single scheduler, hence a single extender, is called at a time; threads let filter run while
    binds wait on the API server."""
    from share_core.kube import ApiServerClient
    from share_scheduler.app import MAX_BODY
    from share_scheduler.app import create_app
    from share_scheduler.server import ExtenderServer
    from share_scheduler.service import Extender

    # One kept-open connection per serving thread (each bind is one API call), plus the two watches.
    kube = ApiServerClient.from_kubeconfig(
        a.kubeconfig, a.context, component="gpushare-scheduler", max_connections=a.threads + 2
    )
    log.info(
        "gpushare extender: policy %s%s (filter keeps %s nodes%s), unit %s, %d threads, listening on %s:%d",
        a.policy,
        ", leaving room for waiting multi-GPU pods" if a.leave_room == "on" else "",
        a.filter_keeps,
        "; DRA claims too" if a.dra else "",
        a.memory_unit,
        a.threads,
        a.bind_address,
        a.port,
    )
    extender = Extender(
        kube,
        policy=a.policy,
        unit=MemoryUnit.parse(a.memory_unit),
        assume_ttl=a.assume_ttl,
        filter_keeps=a.filter_keeps,
        bind_events=a.bind_events,
        dra=a.dra,
        leader_lease=a.leader_lease or None,
        leader_identity=a.leader_identity or None,
        starvation=starvation_config(a),
    )
    app = create_app(extender=extender)
    try:
        server = ExtenderServer(
            app, app.extensions["gpushare"]["verbs"], a.bind_address, a.port, threads=a.threads, max_body=MAX_BODY
        )
    except OSError as exc:
        extender.stop()
        raise SystemExit(f"share-scheduler: cannot listen on {a.bind_address}:{a.port}: {exc}") from exc
    server.serve_forever()
    extender.stop()


def starvation_flags(p: argparse.ArgumentParser, d: Callable[[object], object]) -> None:
    """Reservations and consolidation for pods that waited too long (share_scheduler.starvation); the
    defaults are share-sim's (StarvationConfig)."""
    c = StarvationConfig()
    p.add_argument(
        "--reservations",
        action=argparse.BooleanOptionalAction,
        default=d(c.reserve),
        help="hold GPU room for pods that waited too long (the leader only; default on)",
    )
    p.add_argument(
        "--reserve-after",
        type=float,
        default=d(c.wait_threshold),
        help=f"seconds a pod waits before it gets a reservation or a consolidation (default {c.wait_threshold:g})",
    )
    p.add_argument(
        "--max-reservations",
        type=int,
        default=d(c.max_reservations),
        help=f"reservations at once, cluster-wide (default {c.max_reservations})",
    )
    p.add_argument(
        "--reservation-share",
        type=float,
        default=d(c.max_share),
        help=f"the share of the cluster's GPU memory reservations may take together (default {c.max_share:g})",
    )
    p.add_argument(
        "--hold-seconds",
        type=float,
        default=d(c.hold_seconds),
        help=f"how long one hold lasts (default {c.hold_seconds:g})",
    )
    p.add_argument(
        "--remedy-min-gpus",
        type=int,
        default=d(c.min_gpus),
        help=f"pods asking at least this many GPUs get reservations and consolidation (default {c.min_gpus})",
    )
    p.add_argument(
        "--hold-yield-after",
        type=_seconds_or_none,
        default=d(c.yield_after),
        metavar="SECONDS",
        help="reservations yield to a pod asking fewer than --remedy-min-gpus GPUs that kube-scheduler found "
        "no room for and that has waited longer than this since its creation (it may take the held memory); "
        "empty (default): reservations never yield (share-sim's `timeline --hold-yield-after`)",
    )
    p.add_argument(
        "--starvation-period",
        type=float,
        default=d(c.period),
        help=f"seconds between two passes of the loop (default {c.period:g})",
    )
    p.add_argument("--scheduler-name", default=d(c.scheduler), help="the profile whose waiting pods are weighed")
    p.add_argument(
        "--consolidation",
        action=argparse.BooleanOptionalAction,
        default=d(c.consolidate),
        help="evict pods that may move (a controller recreates them) so that a waiting pod fits, through the "
        "Eviction API (PodDisruptionBudgets honoured), only when the policy places every moved pod again; "
        "default off",
    )
    p.add_argument(
        "--consolidation-max-moves",
        type=int,
        default=d(c.max_moves),
        help=f"pods one consolidation may evict (default {c.max_moves})",
    )
    p.add_argument(
        "--evictions-per-minute",
        type=int,
        default=d(c.evictions_per_minute),
        help=f"consolidation's evictions a minute at most (default {c.evictions_per_minute})",
    )


def leave_room_flags(p: argparse.ArgumentParser, d: Callable[[object], object]) -> None:
    """Room for what waits (share_scheduler.leaveroom); share-sim's `timeline --leave-room` measures it."""
    c = StarvationConfig()
    p.add_argument(
        "--leave-room",
        choices=ON_OFF,
        default=d("on" if c.leave_room else "off"),
        help="the placement policy steers pods off the GPUs that multi-GPU pods found waiting (unschedulable) "
        "need, as share-sim's `timeline --leave-room on` does (default off; the chart renders on unless "
        "reservations.leaveRoom is false)",
    )
    p.add_argument(
        "--leave-room-linger",
        type=float,
        default=d(c.leave_room_linger),
        metavar="SECONDS",
        help=f"how long room is still left for a shape after its last pod stopped waiting (default "
        f"{c.leave_room_linger:g}, share-sim's)",
    )


def starvation_config(a: argparse.Namespace) -> StarvationConfig:
    return StarvationConfig(
        reserve=a.reservations,
        wait_threshold=a.reserve_after,
        max_reservations=a.max_reservations,
        max_share=a.reservation_share,
        hold_seconds=a.hold_seconds,
        period=a.starvation_period,
        scheduler=a.scheduler_name,
        min_gpus=a.remedy_min_gpus,
        consolidate=a.consolidation,
        max_moves=a.consolidation_max_moves,
        evictions_per_minute=a.evictions_per_minute,
        leave_room=a.leave_room == "on",
        leave_room_linger=a.leave_room_linger,
        yield_after=a.hold_yield_after,
    )


def _seconds_or_none(text: str) -> float | None:
    """A number of seconds, or None for an empty value (the chart passes its null as "")."""
    if not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds or nothing, got {text!r}") from None


_seconds_or_none.config_kind = "number or null"  # type: ignore[attr-defined]  # docs/configuration.md


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="share-scheduler", description="gpushare kube-scheduler extender")
    add_config_arg(parser)
    sub = parser.add_subparsers(dest="command")

    def serve_flags(p: argparse.ArgumentParser, with_defaults: bool) -> None:
        # The flags live on the top-level parser (with defaults) and again on `serve` without
        # defaults, so `share-scheduler --port 1 serve` and `share-scheduler serve --port 1` agree:
        # a subparser's defaults would otherwise overwrite what was given before the command.
        def d(value: object) -> object:
            return value if with_defaults else argparse.SUPPRESS

        p.add_argument("--port", type=int, default=d(EXTENDER_DEFAULT_PORT), help="HTTP port (default 12345)")
        p.add_argument(
            "--bind-address", default=d("0.0.0.0"), help="address to listen on (default 0.0.0.0; tests use 127.0.0.1)"
        )
        p.add_argument(
            "--kubeconfig", default=d(None), help="kubeconfig path (default: in-cluster, else ~/.kube/config)"
        )
        p.add_argument("--context", default=d(None), help="kubeconfig context")
        p.add_argument(
            "--policy", default=d("binpack"), choices=sorted(POLICIES), help="placement policy (default binpack)"
        )
        p.add_argument(
            "--filter-keeps",
            default=d("best"),
            choices=FILTER_KEEPS,
            help="filter answers with the policy's best nodes (default; kube-scheduler needs no prioritize "
            "call) or every fitting node (ranked by prioritize); kube-scheduler's config must match",
        )
        p.add_argument(
            "--bind-events",
            default=d("failures"),
            choices=BIND_EVENTS,
            help="Events on the pod: for failed binds only (default; kube-scheduler's own Scheduled event names "
            "the node, the annotations and `kubectl inspect gpushare` the GPU) or for every bind as well (which "
            "GPU, how much: one more API write per pod)",
        )
        p.add_argument(
            "--threads",
            type=int,
            default=d(32),
            help="serving threads in the one process (default 32): kube-scheduler's binds arrive concurrently "
            "and each waits on the API server; a filter must never queue behind them",
        )
        p.add_argument(
            "--dra",
            action=argparse.BooleanOptionalAction,
            default=d(False),
            help="DRA mode too: read gpushare.io ResourceSlices and every ResourceClaim, and place pods whose "
            "claims ask our DeviceClass by the policy (kube-scheduler's allocator then takes the device "
            "share-dra lists first); needs resource.k8s.io/v1 (Kubernetes 1.34+)",
        )
        p.add_argument(
            "--leader-lease",
            default=d(""),
            metavar="NAMESPACE/NAME",
            help="kube-scheduler's leader Lease: only the extender beside its holder acts on its own (evictions, "
            "reservations); empty (default): this replica is the only one and always acts",
        )
        p.add_argument(
            "--leader-identity",
            default=d(""),
            help="the hostname kube-scheduler names itself by in the Lease (default: this host's, shared by the "
            "containers of one pod)",
        )
        starvation_flags(p, d)
        leave_room_flags(p, d)
        p.add_argument("--log-level", default=d("INFO"), choices=["DEBUG", "INFO", "WARNING", "ERROR"])
        p.add_argument("--memory-unit", default=d("GiB"), choices=[u.value for u in MemoryUnit])
        p.add_argument(
            "--assume-ttl",
            type=float,
            default=d(300.0),
            help="seconds a pod whose bind chose a GPU counts before its Binding is seen (default 300)",
        )

    serve = sub.add_parser("serve", help="serve the extender (the default command)")
    serve_flags(serve, with_defaults=False)
    serve.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="as before the command")
    cfg = sub.add_parser("print-config", help="print a KubeSchedulerConfiguration that uses this extender")
    cfg.add_argument("--extender-url", default=DEFAULT_EXTENDER_URL, help="extender URL prefix (default %(default)s)")
    cfg.add_argument("--kubeconfig", default=None, help="kubeconfig for kube-scheduler's clientConnection")
    cfg.add_argument(
        "--filter-keeps",
        default="best",
        choices=FILTER_KEEPS,
        help="best: no prioritizeVerb (the extender's filter already chose); fitting: filter + prioritize",
    )
    cfg.add_argument(
        "--bind",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the extender binds (device-plugin mode: it writes the GPU annotations); --no-bind for DRA mode "
        "alone, where kube-scheduler binds and its DynamicResources plugin writes the claims",
    )
    cfg.add_argument(
        "--leader-elect", action=argparse.BooleanOptionalAction, default=True, help="kube-scheduler leader election"
    )
    serve_flags(parser, with_defaults=True)  # `share-scheduler --port ...` serves, too
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    if args.command == "print-config":
        sys.stdout.write(
            print_config(
                extender_url=args.extender_url,
                kubeconfig=args.kubeconfig,
                leader_elect=args.leader_elect,
                filter_keeps=args.filter_keeps,
                bind=args.bind,
            )
        )
        return 0
    if args.threads < 1 or not 0 < args.port < 65536:
        print("share-scheduler: --threads must be >= 1 and --port in 1..65535", file=sys.stderr)
        return 2
    try:
        starvation_config(args).check()
    except ValueError as exc:
        print(f"share-scheduler: {exc}", file=sys.stderr)
        return 2
    start_logging(args.log_level)
    serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
