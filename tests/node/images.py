"""The images a real node runs: built by hack/build-node-images.sh (never pulled), cached."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-node-images.sh"


class ImageBuildError(RuntimeError):
    """hack/build-node-images.sh failed; the message carries its output."""


@dataclass(frozen=True)
class NodeImage:
    ref: str  # e.g. gpushare.local/busybox:1.35
    archive: Path  # OCI image archive
    digest: str  # manifest digest


@dataclass(frozen=True)
class NodeImages:
    dir: Path
    pause: NodeImage  # the pod sandbox image (containerd's sandbox_image)
    busybox: NodeImage  # a tiny image with sh, env, cat, sleep, ... for test pods

    def all(self) -> list[NodeImage]:
        return [self.pause, self.busybox]


def read_images(directory: Path) -> dict[str, NodeImage]:
    """The images a build wrote to `directory`, by name, as its images.json lists them."""
    data = json.loads((Path(directory) / "images.json").read_text())["images"]
    return {
        key: NodeImage(item["ref"], Path(directory) / item["archive"], item["digest"]) for key, item in data.items()
    }


def load_images(directory: Path) -> NodeImages:
    images = read_images(directory)
    return NodeImages(Path(directory), images["pause"], images["busybox"])


@functools.cache
def node_images() -> NodeImages:
    """Build (first time, about a second) or find the cached images; GPUSHARE_NODE_IMAGES_DIR overrides."""
    preset = os.environ.get("GPUSHARE_NODE_IMAGES_DIR")
    if preset:
        return load_images(Path(preset))
    result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ImageBuildError(f"hack/build-node-images.sh failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return load_images(Path(lines[-1]))
