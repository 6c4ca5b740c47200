"""Options for the whole suite. `--gpu` runs tests/gpu, the tier that needs an NVIDIA GPU (make gpu-test).

Without `--gpu` that directory is not collected at all, and the run's header says so: `make test` runs on
machines without a GPU (CI has none), and a GPU tier that skipped there would pass without having run.
With `--gpu` it fails, never skips, on a machine that cannot run it.

Where the order is shuffled (pytest-random-order, asked for with `--random-order-bucket=...`: `make unit`
and `make test` do for the unit tier), the seed is printed before the first test and again at the end, so
a failure that depends on the order can be replayed (docs/testing.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

GPU_TIER = Path(__file__).parent / "gpu"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpu",
        action="store_true",
        help="run tests/gpu: an NVIDIA GPU and driver, root (cgroups, MPS), and a Python with PyTorch and JAX",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path == GPU_TIER and not config.getoption("--gpu"):
        return True
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("--gpu"):
        return None
    return "tests/gpu not collected: the GPU tier runs with --gpu on a machine with an NVIDIA GPU (make gpu-test)"


def random_order(config: pytest.Config) -> tuple[str, str] | None:
    """(bucket, seed) where pytest-random-order shuffles this run, else None (it shuffles only when asked)."""
    if not config.pluginmanager.hasplugin("random_order"):
        return None
    from random_order.config import Config  # the plugin's own reading of its options

    order = Config(config)
    return (order.bucket_type, order.seed) if order.is_enabled else None


def _order_line(config: pytest.Config) -> str | None:
    order = random_order(config)
    if order is None:
        return None
    bucket, seed = order
    return (
        f"test order shuffled (pytest-random-order): --random-order-bucket={bucket} --random-order-seed={seed}; "
        f"the same selection with these options replays it (the unit tier: make unit SEED={seed})"
    )


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """Printed even under -q, before the first test runs."""
    line = _order_line(config)
    return [line] if line else []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    line = _order_line(config)
    if line:
        terminalreporter.write_line(line, bold=True)
