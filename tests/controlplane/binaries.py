"""Where the upstream binaries are: hack/build-k8s.sh builds them once and prints their directory.

GPUSHARE_K8S_VERSION (a supported minor such as "1.33", or a patch "1.33.13") picks the Kubernetes
release; it is passed through to hack/build-k8s.sh, whose table names the newest patch of each
supported minor. Unset: the script's default (what `make test` runs in full).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-k8s.sh"


class BuildError(RuntimeError):
    """The binaries could not be built; the message carries the build log's tail."""


@functools.cache
def k8s_bin_dir() -> Path:
    """The bin dir of hack/build-k8s.sh (last line of its stdout); GPUSHARE_K8S_BIN_DIR overrides.

    Builds on first use (minutes, cached across runs); never returns without the binaries.
    """
    preset = os.environ.get("GPUSHARE_K8S_BIN_DIR")
    if preset:
        return Path(preset)
    result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        tail = "\n".join(result.stderr.splitlines()[-60:])
        wanted = os.environ.get("GPUSHARE_K8S_VERSION") or "the default"
        raise BuildError(f"hack/build-k8s.sh ({wanted}) failed ({result.returncode}):\n{tail}")
    return Path(lines[-1])
