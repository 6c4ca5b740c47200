"""Read the GPU memory share gpushare gave this container, and turn it into a framework's fraction.

Pure Python, no GPU and no framework needed (the samples beside it import it; tests run it anywhere).

The device plugin sets, in each container (see README "What the limit means"):
  GPUSHARE_MEM_LIMIT_MIB   this container's limit on each of its GPUs, MiB
  GPUSHARE_MEM_TOTAL_MIB   each GPU's total memory, MiB (comma-separated for a multi-GPU pod)
  GPUSHARE_GPU_INDEX       the GPU index(es) on the node
  NVIDIA_VISIBLE_DEVICES   the GPU(s) the container sees, which CUDA numbers 0, 1, ...
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT  only under MPS: a hard limit the MPS daemon enforces

Frameworks cap their own allocator by a fraction of the device: limit / total. The CUDA context
(a few hundred MiB) lives outside that allocator; `reserve_mib` leaves room for it so the process as
a whole stays inside its share.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

ENV_LIMIT = "GPUSHARE_MEM_LIMIT_MIB"
ENV_TOTAL = "GPUSHARE_MEM_TOTAL_MIB"
ENV_INDEX = "GPUSHARE_GPU_INDEX"
ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_MPS = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_RESERVE = "GPUSHARE_CONTEXT_RESERVE_MIB"  # optional, set by the user: MiB kept for the CUDA context


class LimitError(ValueError):
    """The env does not describe a gpushare share; the message says what is wrong and what to check."""


HINT = (
    "gpushare's device plugin sets it when the pod names schedulerName: gpushare-scheduler and the "
    "container asks for nvidia.com/gpu-mem in resources.limits"
)


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise LimitError(f"{name}={text!r} is not a whole number of MiB") from None
    if value <= 0:
        raise LimitError(f"{name}={text!r} must be a positive number of MiB")
    return value


def fraction(limit_mib: int, total_mib: int, reserve_mib: int = 0) -> float:
    """The share of one GPU's memory a framework's allocator may use: (limit - reserve) / total.

    Rounded down to 4 decimals so that rounding never grants more than the limit.
    """
    if limit_mib <= 0 or total_mib <= 0:
        raise LimitError(f"limit ({limit_mib} MiB) and total ({total_mib} MiB) must be positive")
    if reserve_mib < 0:
        raise LimitError(f"reserve ({reserve_mib} MiB) must not be negative")
    if limit_mib > total_mib:
        raise LimitError(f"limit {limit_mib} MiB is more than the GPU's {total_mib} MiB")
    usable = limit_mib - reserve_mib
    if usable <= 0:
        raise LimitError(f"reserve {reserve_mib} MiB leaves nothing of the {limit_mib} MiB limit")
    return int(usable * 10_000 / total_mib) / 10_000


@dataclass(frozen=True)
class GpuShare:
    limit_mib: int  # per GPU
    totals_mib: tuple[int, ...]  # one per visible GPU, in CUDA device order
    gpu_indices: tuple[str, ...]
    visible_devices: str
    reserve_mib: int = 0
    mps_limit: str | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.totals_mib)

    @property
    def fractions(self) -> tuple[float, ...]:
        """Per CUDA device (0, 1, ...): the fraction of that device this container may use."""
        return tuple(fraction(self.limit_mib, t, self.reserve_mib) for t in self.totals_mib)

    @property
    def fraction(self) -> float:
        """One fraction for frameworks that take a single one for every device: the smallest, to be safe."""
        return min(self.fractions)

    def describe(self) -> str:
        gpus = ", ".join(
            f"GPU {i}: {self.limit_mib} of {t} MiB ({f:.2%})"
            for i, t, f in zip(self.gpu_indices, self.totals_mib, self.fractions, strict=True)
        )
        text = f"gpushare share: {gpus}; visible devices {self.visible_devices}"
        if self.reserve_mib:
            text += f"; {self.reserve_mib} MiB kept for the CUDA context"
        text += "; hard limit by MPS: " + (self.mps_limit if self.mps_limit else "no (the program must honour it)")
        return text


def from_env(env: Mapping[str, str] | None = None) -> GpuShare:
    """The share described by the environment; raises LimitError naming what is missing or wrong."""
    env = os.environ if env is None else env
    missing = [n for n in (ENV_LIMIT, ENV_TOTAL) if not env.get(n, "").strip()]
    if missing:
        raise LimitError(f"{' and '.join(missing)} not set: {HINT}")
    limit = _positive_int(ENV_LIMIT, env[ENV_LIMIT])
    totals = tuple(_positive_int(ENV_TOTAL, t) for t in env[ENV_TOTAL].split(","))
    indices = tuple(i.strip() for i in env.get(ENV_INDEX, "").split(",") if i.strip())
    if not indices:
        indices = tuple(str(i) for i in range(len(totals)))
    if len(indices) != len(totals):
        raise LimitError(f"{ENV_INDEX}={env.get(ENV_INDEX)!r} names {len(indices)} GPUs, {ENV_TOTAL} {len(totals)}")
    reserve = 0
    if env.get(ENV_RESERVE, "").strip():
        try:
            reserve = int(env[ENV_RESERVE])
        except ValueError:
            raise LimitError(f"{ENV_RESERVE}={env[ENV_RESERVE]!r} is not a whole number of MiB") from None
    share = GpuShare(
        limit_mib=limit,
        totals_mib=totals,
        gpu_indices=indices,
        visible_devices=env.get(ENV_VISIBLE, ""),
        reserve_mib=reserve,
        mps_limit=env.get(ENV_MPS) or None,
    )
    share.fractions  # noqa: B018 -- validate now (limit <= total, reserve < limit)
    return share


def load_or_exit(program: str) -> GpuShare:
    """from_env() for a sample program: print the share, or a clear error and exit 2."""
    try:
        share = from_env()
    except LimitError as e:
        print(f"{program}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{program}: {share.describe()}", flush=True)
    return share


if __name__ == "__main__":
    s = load_or_exit("gpushare_limits")
    print(f"fraction for a framework allocator: {s.fraction}")
