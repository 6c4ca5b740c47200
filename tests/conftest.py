"""Options for the whole suite. `--gpu` runs tests/gpu, the tier that needs an NVIDIA GPU (make gpu-test).

Without `--gpu` that directory is not collected at all, and the run's header says so: `make test` runs on
machines without a GPU (CI has none), and a GPU tier that skipped there would pass without having run.
With `--gpu` it fails, never skips, on a machine that cannot run it.
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
