"""bench/bench_starvation.py's configs: a remedy alone, all three, or some joined by "+" (the chart's
defaults are reservations with room left: room+reserve)."""

from __future__ import annotations

import pytest

from share_scheduler.sim.remedies import RemedyOptions
from tests.unit.benchload import load_bench

bench = load_bench("bench_starvation")


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("off", RemedyOptions()),
        ("on", RemedyOptions(leave_room=True, reserve=True, consolidate=True)),
        ("reserve", RemedyOptions(reserve=True)),
        ("room+reserve", RemedyOptions(leave_room=True, reserve=True)),
        ("reserve+consolidate", RemedyOptions(reserve=True, consolidate=True)),
    ],
)
def test_a_config_names_its_remedies(spec: str, want: RemedyOptions) -> None:
    assert bench.remedy_options(spec) == want


@pytest.mark.parametrize("spec", ["", "all", "room+room", "room+", "room+off", "reserve+bogus"])
def test_anything_else_is_refused(spec: str) -> None:
    assert bench.remedy_options(spec) is None
