"""The framework samples on a real GPU with the env our Allocate gives: each caps itself at its share."""

from __future__ import annotations

import re

from share_node.backend import Gpu
from tests.gpu.conftest import SAMPLES
from tests.gpu.conftest import run_python
from tests.gpu.conftest import share_env


def test_pytorch_sample_stops_at_its_limit_less_the_context_reserve(gpu: Gpu) -> None:
    env = {**share_env(gpu, 4096), "GPUSHARE_CONTEXT_RESERVE_MIB": "768"}
    result = run_python([str(SAMPLES / "pytorch_limit.py")], env)
    print(result.stdout, result.stderr[-1500:])
    assert result.returncode == 0, result.stderr[-2000:]
    stopped = int(re.search(r"allocator stopped at (\d+) MiB \(limit 4096 MiB\)", result.stdout).group(1))
    assert 4096 - 768 - 256 <= stopped <= 4096 - 768  # 256 MiB steps up to (limit - reserve)


def test_jax_sample_caps_its_preallocated_pool(gpu: Gpu) -> None:
    result = run_python([str(SAMPLES / "jax_limit.py")], share_env(gpu, 4096))
    print(result.stdout, result.stderr[-1500:])
    assert result.returncode == 0, result.stderr[-2000:]
    pool = int(re.search(r"pool limit (\d+) MiB \(share 4096 MiB\)", result.stdout).group(1))
    assert 0.95 * 4096 <= pool <= 4096
    assert "within the share" in result.stdout


def test_a_sample_without_a_share_says_what_is_missing(gpu: Gpu) -> None:
    result = run_python([str(SAMPLES / "pytorch_limit.py")], {"CUDA_VISIBLE_DEVICES": gpu.uuid})
    assert result.returncode == 2
    assert "GPUSHARE_MEM_LIMIT_MIB" in result.stderr and "schedulerName: gpushare-scheduler" in result.stderr
