"""bench_live_timeline --remedies: the live extender is given share-sim's remedies, on its own clock."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from share_scheduler import cli as extender_cli
from tests.unit.benchload import load_bench

CHART_CONFIG = """apiVersion: gpushare.io/v1
kind: Configuration
scheduler:
  leaderLease: gpushare-system/gpushare-scheduler
  reservations: true
  reserveAfter: 600
  leaveRoom: "off"
  consolidation: false
"""


bench = load_bench("bench_live_timeline")


def args(remedies: str, compression: float = 6.0, hold_yield_after: float | None = None) -> argparse.Namespace:
    return argparse.Namespace(remedies=remedies, compression=compression, reserve_after=120.0, hold_seconds=1200.0,
                              remedy_period=30.0, linger=600.0, hold_yield_after=hold_yield_after)  # fmt: skip


def extender_args(flags: list[str], tmp_path: Path) -> argparse.Namespace:
    """The flags as the extender reads them after the chart's configuration file (flags override it)."""
    config = tmp_path / "config.yaml"
    config.write_text(CHART_CONFIG)
    return extender_cli.parse_args(extender_cli.build_parser(), [f"--config={config}", *flags])


def test_remedies_on_gives_both_sides_the_same_knobs_the_live_ones_on_its_clock(tmp_path):
    a = args("on")
    sim = bench.remedy_options(a)
    assert sim is not None and sim.reserve and sim.leave_room and not sim.consolidate
    assert (sim.limits.after_s, sim.limits.ttl_s, sim.tick_s, sim.linger_s) == (120.0, 1200.0, 30.0, 600.0)
    live = extender_args(bench.extender_flags(a), tmp_path)
    assert live.reservations is True and live.consolidation is False and live.leave_room == "on"
    assert (live.reserve_after, live.hold_seconds, live.starvation_period, live.leave_room_linger) == (20, 200, 5, 100)
    assert (live.max_reservations, live.reservation_share, live.remedy_min_gpus) == (
        sim.limits.max_holds,
        sim.limits.max_share,
        sim.min_gpus,
    )
    # A lone replica: with the chart's Lease and a kube-scheduler that holds none it would never act.
    assert live.leader_lease == ""
    assert (sim.yield_after_s, live.hold_yield_after) == (None, None)  # reservations never yield unless asked


@pytest.mark.parametrize("after", [0.0, 60.0])
def test_the_yield_bound_reaches_both_sides(after, tmp_path):
    a = args("on", hold_yield_after=after)
    sim = bench.remedy_options(a)
    assert sim is not None and sim.yield_after_s == after
    assert extender_args(bench.extender_flags(a), tmp_path).hold_yield_after == pytest.approx(after / 6.0)


def test_remedies_off_turns_them_off_and_chart_leaves_the_chart_alone(tmp_path):
    assert bench.remedy_options(args("off")) is None and bench.remedy_options(args("chart")) is None
    off = extender_args(bench.extender_flags(args("off")), tmp_path)
    assert off.reservations is False and off.consolidation is False and off.leave_room == "off"
    assert bench.extender_flags(args("chart")) == []
    chart = extender_args([], tmp_path)
    assert chart.reservations is True and chart.reserve_after == 600 and chart.leader_lease != ""


@pytest.mark.parametrize("compression", [1.0, 3.0, 10.0])
def test_the_live_times_are_the_simulated_ones_over_the_compression(compression, tmp_path):
    live = extender_args(bench.extender_flags(args("on", compression)), tmp_path)
    assert live.reserve_after == pytest.approx(120.0 / compression)
    assert live.hold_seconds == pytest.approx(1200.0 / compression)
