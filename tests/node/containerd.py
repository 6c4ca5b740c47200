"""Where the node's containerd is: hack/build-containerd.sh builds containerd v2 once and prints its directory.

Debian's containerd 1.6 ignores the CRI field in which kubelet passes CDI device names (DRA claims and
device plugins' CDI names); containerd >= 2.0 applies them. The tier runs one runtime: this build, with
Debian's runc.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-containerd.sh"
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")


class ContainerdBuildError(RuntimeError):
    """hack/build-containerd.sh failed; the message carries its log's tail."""


@functools.cache
def containerd_bin_dir() -> Path:
    """The bin dir of hack/build-containerd.sh (last line of its stdout); GPUSHARE_CONTAINERD_BIN_DIR overrides.

    Builds on first use (minutes, cached across runs); never returns without the three binaries.
    """
    preset = os.environ.get("GPUSHARE_CONTAINERD_BIN_DIR")
    if preset:
        directory = Path(preset)
    else:
        result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
        lines = result.stdout.strip().splitlines()
        if result.returncode != 0 or not lines:
            tail = "\n".join(result.stderr.splitlines()[-60:])
            raise ContainerdBuildError(f"hack/build-containerd.sh failed ({result.returncode}):\n{tail}")
        directory = Path(lines[-1])
    missing = [b for b in BINARIES if not (directory / b).is_file()]
    if missing:
        raise ContainerdBuildError(f"{directory} lacks {', '.join(missing)}: run hack/build-containerd.sh")
    return directory
