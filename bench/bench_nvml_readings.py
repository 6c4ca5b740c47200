"""What one NVML poll costs on a real GPU: NvmlBackend.readings() (used memory and compute processes of every
offered GPU), with no CUDA process and with N of them. bench/bench_monitor.py prices the rest of a monitor poll
with an NVML stand-in; this is the part only a driver can tell.
Run on a GPU machine: python bench/bench_nvml_readings.py [--processes 8] [--polls 200]
(needs PyTorch for the CUDA processes; GPUSHARE_GPU_PYTHON picks the interpreter that has it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from share_node.backend.nvml import NvmlBackend

HOLD = """
import sys, torch
x = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("READY", flush=True); sys.stdin.read()
"""


def timed(backend: NvmlBackend, polls: int) -> tuple[float, float, int]:
    """(wall us, CPU us) per readings() call, and the processes the last one listed."""
    backend.readings()  # warm
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(polls):
        readings = backend.readings()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return wall / polls * 1e6, cpu / polls * 1e6, sum(len(r.processes) for r in readings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--polls", type=int, default=200)
    args = parser.parse_args()
    backend = NvmlBackend()
    gpus = backend.gpus()
    print(f"{len(gpus)} GPU(s): {', '.join(g.model for g in gpus)}; driver {backend.driver_version}")
    wall, cpu, n = timed(backend, args.polls)
    print(f"no CUDA process: {wall:.0f} us wall, {cpu:.0f} us CPU per poll ({n} processes listed)")
    python = os.environ.get("GPUSHARE_GPU_PYTHON", sys.executable)
    procs = [
        subprocess.Popen([python, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(args.processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().startswith("READY")
        wall, cpu, n = timed(backend, args.polls)
        print(f"{args.processes} CUDA processes: {wall:.0f} us wall, {cpu:.0f} us CPU per poll ({n} processes listed)")
        print(f"per GPU: {wall / len(gpus):.0f} us wall; at the default 5 s interval {cpu / 5e6 * 100:.4f} % of a core")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        backend.close()


if __name__ == "__main__":
    main()
