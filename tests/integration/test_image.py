"""`make image` (hack/build-image.sh): what the gpushare image holds, and that two builds of one
commit give the same file list. Needs root and the network (Debian archive, PyPI), like make test."""

from __future__ import annotations

import json
import subprocess
import tarfile

import pytest

from tests.node.product_images import build_product_images
from tests.node.product_images import layer_listing
from tests.node.product_images import oci_manifest_and_config
from tests.node.product_images import product_images

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_gpushare_image_layout():
    images = product_images()
    listing = {e[0]: e for e in layer_listing(images.gpushare.archive)}
    for script in (
        "share-plugin",
        "share-dra",
        "share-scheduler",
        "share-webhook",
        "share-sim",
        "kubectl-inspect-gpushare",
    ):
        entry = listing[f"usr/local/bin/{script}"]
        assert entry[1] == tarfile.SYMTYPE.decode() and entry[5] == f"/opt/gpushare/bin/{script}"
        assert f"opt/gpushare/bin/{script}" in listing
    assert "usr/bin/python3" in listing or "usr/bin/python3.11" in listing
    assert not any(p.startswith("opt/gpushare/lib/python3.11/site-packages/pip/") for p in listing)
    assert [p for p in listing if p.startswith(("dev/", "proc/", "sys/", "tmp/"))] == []
    _, config = oci_manifest_and_config(images.gpushare.archive)
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Cmd"] == ["share-scheduler", "--port", "12345"]
    assert images.gpushare.ref.startswith("gpushare.local/gpushare:")


def test_kube_scheduler_image_layout():
    images = product_images()
    listing = {e[0]: e for e in layer_listing(images.kube_scheduler.archive)}
    assert listing["usr/local/bin/kube-scheduler"][2] == 0o755
    assert listing["tmp"][2] == 0o1777
    _, config = oci_manifest_and_config(images.kube_scheduler.archive)
    assert config["config"]["User"] == "65532:65532"


def test_two_builds_give_the_same_file_list(tmp_path):
    """A second build from scratch (the Debian base is reused, everything after it is redone)."""
    first = product_images()
    before = layer_listing(first.gpushare.archive)
    again = build_product_images(out=tmp_path, fresh=True)
    after = layer_listing(again.gpushare.archive)
    assert [e[0] for e in after] == [e[0] for e in before]
    assert after == before  # types, modes, owners and links too
    assert again.kube_scheduler.digest == first.kube_scheduler.digest


def test_archives_read_by_another_implementation_and_converted_for_docker_load(tmp_path):
    """skopeo (containers/image, not our code) reads each OCI archive and writes the `docker save`
    format that every Docker's `docker load` reads: the README's path for Docker users."""
    images = product_images()
    for image in (images.gpushare, images.kube_scheduler):
        inspected = subprocess.run(
            ["skopeo", "inspect", "--config", f"oci-archive:{image.archive}"],
            capture_output=True,
            text=True,
            check=True,
        )
        _, config = oci_manifest_and_config(image.archive)
        assert json.loads(inspected.stdout)["rootfs"] == config["rootfs"]
        out = tmp_path / f"{image.archive.stem}.docker.tar"
        subprocess.run(
            ["skopeo", "copy", "-q", f"oci-archive:{image.archive}", f"docker-archive:{out}:{image.ref}"],
            capture_output=True,
            text=True,
            check=True,
        )
        with tarfile.open(out) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == [image.ref]
        assert len(manifest[0]["Layers"]) == len(config["rootfs"]["diff_ids"])
