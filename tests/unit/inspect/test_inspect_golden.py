"""Golden output of every format on the fixed cluster. Regenerate: GPUSHARE_UPDATE_GOLDEN=1 python -m pytest."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from share_inspect.cli import main
from tests.unit.inspect.inspect_cluster import fake_cluster

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPUSHARE_UPDATE_GOLDEN") == "1"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(argv: list[str], out: io.StringIO | None = None, env: dict[str, str] | None = None) -> tuple[str, str]:
    out = out if out is not None else io.StringIO()
    err = io.StringIO()
    code = main(argv, client=fake_cluster(), stdout=out, stderr=err, env=env or {})
    assert code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def check(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with GPUSHARE_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from golden; GPUSHARE_UPDATE_GOLDEN=1 regenerates it"


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        ([], "summary.txt"),
        (["-d"], "details.txt"),
        (["--details", "gpu-b"], "details_gpu-b.txt"),
        (["gpu-a", "gpu-c"], "summary_filtered.txt"),
        (["-o", "json"], "report.json"),
        (["-o", "yaml"], "report.yaml"),
    ],
)
def test_plain_output_matches_golden(argv: list[str], name: str) -> None:
    text, _ = run(argv)
    assert "\x1b[" not in text and "\u2588" not in text  # a pipe gets neither colour nor bars
    check(name, text)


def test_terminal_gets_colour_and_bars() -> None:
    text, _ = run([], out=Tty())
    assert "\x1b[31m" in text  # the unhealthy GPU is red
    assert "\u2588" in text
    check("summary_tty.txt", text)


def test_terminal_details_golden() -> None:
    text, _ = run(["-d"], out=Tty(), env={"NO_COLOR": "1"})
    assert "\x1b[" not in text and "\u2588" in text
    check("details_tty_nocolor.txt", text)


def test_problems_go_to_stderr_not_into_the_table() -> None:
    text, err = run([])
    assert "garbage" not in text
    assert (
        err
        == "warning: node gpu-c: pod ml/garbage: annotation gpushare.io/gpu-index='x' is not a list of GPU indices\n"
    )
