"""PyTorch honouring its gpushare share: cap the caching allocator of every visible GPU.

    python pytorch_limit.py            # in a pod with nvidia.com/gpu-mem and schedulerName gpushare-scheduler

HOLD_SECONDS (default 0) keeps the memory that long after the demonstration, so that what the device
plugin's monitor measures for the container (`kubectl inspect gpushare`, the metrics) can be looked at.

torch.cuda.set_per_process_memory_fraction(f, device) makes allocations beyond f x the device's
memory raise torch.cuda.OutOfMemoryError in this process, instead of taking memory other pods
were promised. f = GPUSHARE_MEM_LIMIT_MIB / GPUSHARE_MEM_TOTAL_MIB (see gpushare_limits.py).
"""

from __future__ import annotations

import os
import sys
import time

from gpushare_limits import load_or_exit


def main() -> int:
    share = load_or_exit("pytorch")  # before touching CUDA: a missing env fails here, clearly
    import torch

    if not torch.cuda.is_available():
        print("pytorch: CUDA is not available in this container (is the NVIDIA runtime set up?)", file=sys.stderr)
        return 2
    if torch.cuda.device_count() != share.gpu_count:
        print(f"pytorch: sees {torch.cuda.device_count()} GPUs, gpushare gave {share.gpu_count}", file=sys.stderr)
        return 2
    for device, frac in enumerate(share.fractions):
        torch.cuda.set_per_process_memory_fraction(frac, device)
        print(f"pytorch: cuda:{device} capped at {frac:.4f} of {torch.cuda.get_device_name(device)}")

    # Show the cap working: fill to just under the limit, then one step over.
    limit_bytes = share.limit_mib * 1024 * 1024
    block = 256 * 1024 * 1024
    held = []
    try:
        while True:
            held.append(torch.empty(block, dtype=torch.uint8, device="cuda:0"))
    except torch.cuda.OutOfMemoryError:
        used = len(held) * block
        print(
            f"pytorch: allocator stopped at {used >> 20} MiB (limit {limit_bytes >> 20} MiB): the share holds",
            flush=True,
        )
    time.sleep(float(os.environ.get("HOLD_SECONDS", "0")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
