"""`share-sim timeline`'s switches and knobs for issue 40's remedies (share_scheduler.sim.remedies)."""

from __future__ import annotations

import argparse

from share_placement.starvation import ReservationLimits
from share_scheduler.sim.remedies import RemedyOptions


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return value == "on"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The remedies' switches and knobs for `share-sim timeline` (all off by default: today's extender)."""
    d = RemedyOptions()
    lim = d.limits
    g = parser.add_argument_group("issue 40's remedies (docs/simulator.md, 'Starvation remedies')")
    g.add_argument(
        "--leave-room",
        type=_on_off,
        default=False,
        metavar="on|off",
        help="the policy leaves room for the multi-GPU shapes that wait (default off)",
    )
    g.add_argument(
        "--reserve",
        type=_on_off,
        default=False,
        metavar="on|off",
        help="reservations for pods that waited past --reserve-after (default off)",
    )
    g.add_argument(
        "--consolidate",
        type=_on_off,
        default=False,
        metavar="on|off",
        help="move movable pods to place a waiting multi-GPU pod (default off)",
    )
    g.add_argument(
        "--reserve-after",
        type=float,
        default=lim.after_s,
        metavar="S",
        help=f"seconds waited before a reservation (default {lim.after_s:g})",
    )
    g.add_argument(
        "--max-holds", type=int, default=lim.max_holds, help=f"reservations held at once (default {lim.max_holds})"
    )
    g.add_argument(
        "--max-hold-share",
        type=float,
        default=lim.max_share,
        metavar="FRACTION",
        help=f"share of the cluster's GPU units reservations may hold (default {lim.max_share:g})",
    )
    g.add_argument(
        "--hold-ttl",
        type=float,
        default=lim.ttl_s,
        metavar="S",
        help=f"a reservation's bound time, seconds (default {lim.ttl_s:g})",
    )
    g.add_argument(
        "--remedy-min-gpus",
        type=int,
        default=d.min_gpus,
        metavar="N",
        help=f"reservations and consolidation for pods asking N+ GPUs (default {d.min_gpus})",
    )
    g.add_argument(
        "--consolidate-after",
        type=float,
        default=d.consolidate_after_s,
        metavar="S",
        help=f"seconds waited before consolidation is tried (default {d.consolidate_after_s:g})",
    )
    g.add_argument(
        "--max-moves",
        type=int,
        default=d.max_moves,
        metavar="K",
        help=f"pods one consolidation may move (default {d.max_moves})",
    )
    g.add_argument(
        "--evictions-per-minute",
        type=float,
        default=d.evictions_per_minute,
        help=f"consolidation's eviction rate limit (default {d.evictions_per_minute:g})",
    )
    g.add_argument(
        "--hold-yield-after",
        type=float,
        default=None,
        metavar="S",
        help="a reservation yields to a pod that has waited S seconds (default: never)",
    )
    g.add_argument(
        "--movable-fraction",
        type=float,
        default=d.movable_fraction,
        metavar="FRACTION",
        help=f"share of arrivals a controller would recreate (movable; default {d.movable_fraction:g})",
    )


def options_from(args: argparse.Namespace) -> RemedyOptions:
    """RemedyOptions from parsed arguments; ValueError naming the bad knob."""
    return RemedyOptions(
        leave_room=args.leave_room,
        reserve=args.reserve,
        consolidate=args.consolidate,
        limits=ReservationLimits(
            after_s=args.reserve_after, max_holds=args.max_holds, max_share=args.max_hold_share, ttl_s=args.hold_ttl
        ),
        min_gpus=args.remedy_min_gpus,
        consolidate_after_s=args.consolidate_after,
        max_moves=args.max_moves,
        evictions_per_minute=args.evictions_per_minute,
        movable_fraction=args.movable_fraction,
        yield_after_s=args.hold_yield_after,
    )
