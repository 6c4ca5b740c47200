"""A PyTorch program that ignores its limit on purpose: the check of gpushare's enforcement on a GPU node.

It allocates in 256 MiB steps up to GPUSHARE_MEM_LIMIT_MIB + OVERSHOOT_MIB (default 1024) and holds the
memory for HOLD_SECONDS (default 300). What to expect (README, "Used memory, over-limit warn and kill"):
- `overLimit: warn`: a GpuShareOverLimit Event on the pod; the program runs to the end.
- `overLimit: kill`: after the grace period the container is ended (exit 137), GpuShareOverLimitKilled.
- MPS mode: the allocation past CUDA_MPS_PINNED_DEVICE_MEM_LIMIT fails; the program says so and exits 3.
Compare `gpushare_container_gpu_memory_used_bytes` with what `nvidia-smi` shows for the process.
"""

from __future__ import annotations

import os
import sys
import time

import torch

STEP_MIB = 256


def main() -> int:
    limit = int(os.environ["GPUSHARE_MEM_LIMIT_MIB"])
    target = limit + int(os.environ.get("OVERSHOOT_MIB", "1024"))
    hold = float(os.environ.get("HOLD_SECONDS", "300"))
    blocks = []
    held = 0
    while held < target:
        try:
            blocks.append(torch.empty(STEP_MIB * 1024 * 1024, dtype=torch.uint8, device="cuda"))
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError under MPS's pinned limit
            print(f"allocation refused at {held} MiB (limit {limit} MiB): {exc}", flush=True)
            return 3
        held += STEP_MIB
        print(f"holding {held} MiB (limit {limit} MiB)", flush=True)
    print(f"over the limit by {held - limit} MiB; holding for {hold:.0f} s", flush=True)
    time.sleep(hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
