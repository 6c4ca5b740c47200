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


@functools.cache
def k8s_version() -> tuple[int, int, int]:
    """The Kubernetes release the tests run against: that of GPUSHARE_K8S_BIN_DIR's kube-apiserver when
    set, else the one hack/build-k8s.sh would build (GPUSHARE_K8S_VERSION honoured), without building."""
    preset = os.environ.get("GPUSHARE_K8S_BIN_DIR")
    argv = [str(Path(preset) / "kube-apiserver"), "--version"] if preset else [str(BUILD_SCRIPT), "--version"]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    words = result.stdout.split()
    if result.returncode != 0 or not words:
        raise BuildError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return parse_version(words[-1])


def parse_version(text: str) -> tuple[int, int, int]:
    """`v1.34.4` or `1.34` -> (1, 34, 4) / (1, 34, 0)."""
    parts = text.removeprefix("v").split("-", 1)[0].split(".")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"not a Kubernetes version: {text!r}") from None
    if not 2 <= len(numbers) <= 3:
        raise ValueError(f"not a Kubernetes version: {text!r}")
    return (numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 0)
