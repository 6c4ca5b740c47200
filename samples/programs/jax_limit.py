"""JAX honouring its gpushare share: XLA_PYTHON_CLIENT_MEM_FRACTION must be set BEFORE jax is imported.

    python jax_limit.py

HOLD_SECONDS (default 0) keeps the pool that long afterwards, so the monitor's figure can be looked at.

XLA preallocates 75 % of every GPU by default, which would take memory other pods were promised.
The fraction (one value for every device: the smallest of ours) caps the preallocated pool.
"""

from __future__ import annotations

import os
import sys
import time

from gpushare_limits import load_or_exit


def main() -> int:
    share = load_or_exit("jax")
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{share.fraction:.4f}"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    print(f"jax: XLA_PYTHON_CLIENT_MEM_FRACTION={os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION']}")

    import jax  # only now: XLA reads the fraction when its GPU client starts
    import jax.numpy as jnp

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        print("jax: no GPU visible to JAX (jax[cuda] installed? NVIDIA runtime set up?)", file=sys.stderr)
        return 2
    for d in gpus:
        stats = d.memory_stats() or {}
        limit = stats.get("bytes_limit")
        print(f"jax: {d} pool limit {limit >> 20 if limit else '?'} MiB (share {share.limit_mib} MiB)")
    x = jnp.ones((1024, 1024))
    print(f"jax: computed {float((x @ x).sum()):.0f} within the share", flush=True)
    time.sleep(float(os.environ.get("HOLD_SECONDS", "0")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
