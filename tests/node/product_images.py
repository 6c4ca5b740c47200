"""The product's images (`make image`: hack/build-image.sh): gpushare and kube-scheduler OCI archives."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.node.images import NodeImage
from tests.node.images import read_images

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-image.sh"


class ProductImageError(RuntimeError):
    """hack/build-image.sh failed; the message carries its output."""


@dataclass(frozen=True)
class ProductImages:
    dir: Path
    gpushare: NodeImage  # gpushare.local/gpushare:<version>
    kube_scheduler: NodeImage  # gpushare.local/kube-scheduler:<k8s version>

    def all(self) -> list[NodeImage]:
        return [self.gpushare, self.kube_scheduler]


def load_product_images(directory: Path) -> ProductImages:
    images = read_images(directory)
    return ProductImages(Path(directory), images["gpushare"], images["kube-scheduler"])


def build_product_images(out: Path | None = None, fresh: bool = False) -> ProductImages:
    """Run hack/build-image.sh (warm: seconds; cold: a minute or two) and read what it wrote."""
    cmd = [str(BUILD_SCRIPT)]
    if out is not None:
        cmd += ["--out", str(out)]
    if fresh:
        cmd.append("--fresh")
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ProductImageError(f"hack/build-image.sh failed ({result.returncode}):\n{result.stderr[-6000:]}")
    return load_product_images(Path(lines[-1]).parent)


@functools.cache
def product_images() -> ProductImages:
    """The images `make image` built (GPUSHARE_PRODUCT_IMAGES_DIR points at a ready directory instead)."""
    preset = os.environ.get("GPUSHARE_PRODUCT_IMAGES_DIR")
    if preset:
        return load_product_images(Path(preset))
    return build_product_images()


def oci_manifest_and_config(archive: Path) -> tuple[dict, dict]:
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]

        def blob(digest: str) -> bytes:
            return tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}").read()  # type: ignore[union-attr]

        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        return manifest, config


def layer_listing(archive: Path) -> list[tuple[str, str, int, int, int, str]]:
    """Every entry of every layer: (path, type, mode, uid, gid, link target), in order."""
    manifest, _ = oci_manifest_and_config(archive)
    out = []
    with tarfile.open(archive) as outer:
        for layer in manifest["layers"]:
            f = outer.extractfile(f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}")
            with tarfile.open(fileobj=f, mode="r:gz") as tar:
                for m in tar:
                    out.append((m.name.rstrip("/"), m.type.decode(), m.mode, m.uid, m.gid, m.linkname))
    return out
