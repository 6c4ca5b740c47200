"""The node the DRA driver's unit tests run on: two GPUs of different sizes, and a driver over them whose CDI
specs and checkpoint live in a test's tmp_path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from share_core.contract import MemoryUnit
from share_dra.driver import CHECKPOINT_NAME
from share_dra.driver import Checkpoint
from share_dra.driver import ClaimSource
from share_dra.driver import Driver
from share_node.backend import Gpu
from share_node.hardlimit import HardLimiter

GIB = 1024**3
GPUS = [Gpu(0, "GPU-aaaa", "Tesla T4", 16 * GIB, 0), Gpu(1, "GPU-bbbb", "Tesla V100", 32 * GIB, 1)]


def make_driver(
    tmp_path: Path, api: ClaimSource, spec_dirs: Sequence[str] = (), limiter: HardLimiter | None = None
) -> Driver:
    """Node n1's driver over GPUS; a second one made on the same tmp_path is the first restarted."""
    return Driver(
        "n1",
        lambda: GPUS,
        api,
        str(tmp_path / "cdi"),
        Checkpoint(tmp_path / "plugin" / CHECKPOINT_NAME),
        MemoryUnit.GiB,
        spec_dirs,
        limiter=limiter,
    )
