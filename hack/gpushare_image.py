"""`make image`: the gpushare image and a kube-scheduler image, built with no registry and no engine.

* `gpushare.local/gpushare:<version>`: a Debian bookworm root filesystem (`mmdebstrap
  --variant=minbase`, the packages in hack/image/packages.txt), then hack/image/setup.sh run in it
  under chroot (the same script the Dockerfile RUNs): the project's wheel and its dependencies'
  wheels (from PyPI) in a venv at /opt/gpushare, the console scripts in /usr/local/bin, user
  gpushare 65532:65532. Image config as the Dockerfile's: USER 65532:65532, WORKDIR /tmp,
  CMD share-scheduler --port 12345 (`DOCKERFILE_CONFIG`, checked against the Dockerfile by a test).
* `gpushare.local/kube-scheduler:<k8s version>`: the kube-scheduler hack/build-k8s.sh builds
  (static) at /usr/local/bin/kube-scheduler, /etc/passwd, /tmp, USER 65532:65532 (like upstream's
  distroless image), for the chart's scheduler Deployment.

Both are OCI archives written by hack/oci.py (not umoci or buildah: those want an OCI layout to
unpack and repack, keep the build host's mtimes unless told otherwise and, for buildah, a storage
driver; hack/oci.py turns a directory into a layer with fixed times and sorted entries in one
step, so two builds give the same file list and, for unchanged inputs, the same digests), under
build/ (`build/images.json` names them). `ctr images import build/gpushare.oci.tar` names the
image; `docker load` reads the same archive (Docker 25+ loads OCI archives).

Cached in ${GPUSHARE_CACHE:-~/.cache/gpushare}/images/: the Debian base by the package list, the
suites' Release dates and this recipe; the image by the base, every wheel's hash and the scripts.
A rebuild with nothing changed builds the project's wheel, resolves the dependencies (pip's cache)
and copies two archives. Progress on stderr; the last line of stdout is build/images.json.

    python -m hack.gpushare_image [--out build] [--fresh]
"""

from __future__ import annotations

import argparse
import calendar
import email.utils
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `hack` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hack import oci
from hack.node_images import cache_root
from hack.node_images import input_stamp
from hack.node_images import k8s_version
from hack.node_images import sha256_file

RECIPE = 1  # bump when the recipe changes in a way the hashed inputs do not show
HACK = Path(__file__).resolve().parent
REPO = HACK.parent
PACKAGES_FILE = HACK / "image" / "packages.txt"
SETUP_SCRIPT = HACK / "image" / "setup.sh"
REGISTRY = "gpushare.local"
SUITE = "bookworm"
PYTHON_VERSION = "3.11"  # bookworm's python3: the wheels are picked for it
MIRROR = os.environ.get("GPUSHARE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("GPUSHARE_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
SOURCES = [
    (MIRROR, SUITE),
    (MIRROR, f"{SUITE}-updates"),
    (SECURITY_MIRROR, f"{SUITE}-security"),
]
# What the Dockerfile's runtime stage sets, the same here (tests/unit/test_image_recipe.py compares).
USER = "65532:65532"
DOCKERFILE_CONFIG = {
    "user": USER,
    "working_dir": "/tmp",
    "cmd": ["share-scheduler", "--port", "12345"],
    "env": [
        "PATH=/opt/gpushare/bin:" + oci.DEFAULT_PATH,
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
    ],
}
# Not in the image: documentation and translations (dpkg path-exclude, as Debian's slim images do).
DPKG_EXCLUDES = [
    "/usr/share/man/*",
    "/usr/share/doc/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
]
DPKG_INCLUDES = ["/usr/share/doc/*/copyright"]  # the licences stay
# manylinux tags bookworm's glibc (2.36) runs, newest first (pip takes several --platform).
PLATFORMS = [f"manylinux_2_{minor}_{{arch}}" for minor in range(36, 16, -1)] + ["manylinux2014_{arch}"]
PY_ARCH = {"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le"}


def log(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def packages() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in PACKAGES_FILE.read_text().splitlines())
    return [line for line in lines if line]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if result.returncode != 0:
        raise SystemExit(f"image: {' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def release_date(mirror: str, suite: str) -> str:
    """The Date: of a suite's Release file: it changes whenever a package in the suite does."""
    url = f"{mirror}/dists/{suite}/Release"
    req = urllib.request.Request(url, headers={"Range": "bytes=0-2047"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        head = resp.read(2048).decode(errors="replace")
    m = re.search(r"^Date: (.+)$", head, re.M)
    if not m:
        raise SystemExit(f"image: no Date in {url}")
    return email.utils.parsedate_to_datetime(m.group(1)).strftime("%Y%m%dT%H%M%SZ")


# ---- the Debian base -----------------------------------------------------------------------------


def base_rootfs() -> tuple[Path, dict]:
    """The cached mmdebstrap root filesystem (built when its inputs changed) and its inputs."""
    if not shutil.which("mmdebstrap"):
        raise SystemExit("image: no mmdebstrap; run hack/image-deps.sh")
    inputs = {
        "recipe": RECIPE,
        "packages": packages(),
        "sources": [f"{m} {s}" for m, s in SOURCES],
        "release_dates": [release_date(m, s) for m, s in SOURCES],
        "mmdebstrap": run(["mmdebstrap", "--version"]).stdout.strip(),
        "dpkg_excludes": DPKG_EXCLUDES,
        "arch": oci.host_arch(),
    }
    stamp = input_stamp(inputs)
    out = cache_root() / f"debian-{SUITE}-base_{stamp}"
    done = out / ".done"
    if done.is_file():
        log(f"base warm: {out}")
        return out / "rootfs", inputs
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            start = time.monotonic()
            log(f"mmdebstrap {SUITE} {' '.join(packages())} -> {out}")
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            dpkgopts = [f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES]
            dpkgopts += [f"--dpkgopt=path-include={p}" for p in DPKG_INCLUDES]
            # The newest Release date: mmdebstrap sets every mtime it can to it (reproducible).
            epoch = str(max(calendar.timegm(time.strptime(d, "%Y%m%dT%H%M%SZ")) for d in inputs["release_dates"]))
            run(
                [
                    "mmdebstrap",
                    "--quiet",
                    "--variant=minbase",
                    "--mode=root",
                    f"--include={','.join(packages())}",
                    *dpkgopts,
                    "--aptopt=Acquire::Retries 3",
                    SUITE,
                    str(out / "rootfs"),
                    *(f"deb {m} {s} main" for m, s in SOURCES),
                ],
                env={**os.environ, "SOURCE_DATE_EPOCH": epoch},
            )
            (out / "inputs.json").write_text(json.dumps(inputs, indent=2))
            done.write_text(stamp)
            log(f"base built in {time.monotonic() - start:.1f}s")
    return out / "rootfs", inputs


# ---- wheels --------------------------------------------------------------------------------------


def wheelhouse(dest: Path, python: str) -> list[str]:
    """The project's wheel and every dependency's wheel for bookworm's Python, in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "SOURCE_DATE_EPOCH": str(oci.source_date_epoch())}
    with tempfile.TemporaryDirectory() as build_dir:
        run(
            [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest), str(REPO)],
            env={**env, "TMPDIR": build_dir},
            cwd=build_dir,
        )
    project = sorted(dest.glob("gpushare-*.whl"))
    if len(project) != 1:
        raise SystemExit(f"image: expected one gpushare wheel in {dest}, found {project}")
    arch = PY_ARCH.get(oci.host_arch(), oci.host_arch())
    platforms = [f"--platform={p.format(arch=arch)}" for p in PLATFORMS]
    run(
        [
            python,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            f"--python-version={PYTHON_VERSION}",
            "--implementation=cp",
            *platforms,
            "-d",
            str(dest),
            str(project[0]),
        ],
        env=env,
    )
    return sorted(f"{p.name} {sha256_file(p)}" for p in dest.glob("*.whl"))


# ---- the images ----------------------------------------------------------------------------------


def _strip_special(root: Path) -> None:
    """Empty /dev, /proc, /sys, /run, /tmp: the runtime mounts them; device nodes have no place in a layer."""
    for name in ("dev", "proc", "sys", "run", "tmp"):
        d = root / name
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()


def build_gpushare(base: Path, wheels: Path, out: Path, ref: str) -> str:
    with tempfile.TemporaryDirectory(prefix="gpushare-rootfs.", dir=out.parent) as tmp:
        root = Path(tmp) / "rootfs"
        run(["cp", "-a", "--reflink=auto", str(base), str(root)])
        (root / "tmp" / "wheels").mkdir(parents=True)
        for whl in wheels.glob("*.whl"):
            shutil.copy2(whl, root / "tmp" / "wheels" / whl.name)
        shutil.copy2(SETUP_SCRIPT, root / "tmp" / "setup.sh")
        env = {"PATH": oci.DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "SOURCE_DATE_EPOCH": "0"}
        run(["chroot", str(root), "/bin/sh", "/tmp/setup.sh", "/tmp/wheels"], env=env)
        _strip_special(root)
        for name in ("etc/hostname", "etc/resolv.conf"):  # the runtime provides them
            p = root / name
            if p.is_file() or p.is_symlink():
                p.unlink()
        layer = oci.build_layer(oci.entries_from_dir(root), compresslevel=6)
    config = oci.ImageConfig(
        cmd=DOCKERFILE_CONFIG["cmd"],
        env=DOCKERFILE_CONFIG["env"],
        user=DOCKERFILE_CONFIG["user"],
        working_dir=DOCKERFILE_CONFIG["working_dir"],
        labels={
            "org.opencontainers.image.title": "gpushare",
            "org.opencontainers.image.version": ref.rsplit(":", 1)[1],
            "org.opencontainers.image.licenses": "Apache-2.0",
        },
    )
    return oci.write_archive(out, [layer], config, ref)


def build_kube_scheduler(binary: Path, out: Path, ref: str) -> str:
    entries = [
        oci.file_entry("usr/local/bin/kube-scheduler", source=binary, mode=0o755),
        oci.file_entry(
            "etc/passwd",
            data=b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        ),
        oci.file_entry("etc/group", data=b"root:x:0:\nnonroot:x:65532:\n"),
        oci.dir_entry("tmp", 0o1777),
        *(oci.dir_entry(d) for d in ("dev", "proc", "sys", "etc", "var", "run")),
    ]
    layer = oci.build_layer(entries)
    config = oci.ImageConfig(entrypoint=["/usr/local/bin/kube-scheduler"], user=USER)
    return oci.write_archive(out, [layer], config, ref)


def k8s_bin_dir() -> Path:
    preset = os.environ.get("GPUSHARE_K8S_BIN_DIR")
    if preset:
        return Path(preset)
    result = run([str(HACK / "build-k8s.sh")])
    return Path(result.stdout.strip().splitlines()[-1])


def project_version() -> str:
    text = (REPO / "share_core" / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not m:
        raise SystemExit("image: no __version__ in share_core/__init__.py")
    return m.group(1)


def image_inputs(ref: str, own: dict) -> dict:
    """What an image is built from: the recipe, its `own` inputs, the builders (this script, oci.py), its
    reference and the timestamp of its files. The same inputs give the same cached image."""
    return {
        "recipe": RECIPE,
        **own,
        "oci.py": sha256_file(HACK / "oci.py"),
        "gpushare_image.py": sha256_file(Path(__file__)),
        "ref": ref,
        "source_date_epoch": oci.source_date_epoch(),
    }


def cached_build(kind: str, inputs: dict, build, fresh: bool) -> tuple[Path, str]:
    """`build(path) -> digest` once per inputs; returns the cached archive and its digest."""
    stamp = input_stamp(inputs)
    out_dir = cache_root() / f"{kind}_{stamp}"
    archive, meta = out_dir / f"{kind}.oci.tar", out_dir / "image.json"
    if meta.is_file() and not fresh:
        log(f"{kind} warm: {out_dir}")
        return archive, json.loads(meta.read_text())["digest"]
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(f"{out_dir}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if fresh or not meta.is_file():
            start = time.monotonic()
            digest = build(archive)
            meta.write_text(json.dumps({"digest": digest, "inputs": inputs}, indent=2))
            log(f"{kind} built in {time.monotonic() - start:.1f}s: {archive} ({archive.stat().st_size >> 20} MiB)")
    return archive, json.loads(meta.read_text())["digest"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build the gpushare and kube-scheduler OCI archives")
    parser.add_argument("--out", type=Path, default=REPO / "build", help="where the archives and images.json go")
    parser.add_argument("--python", default=sys.executable, help="the Python whose pip builds and fetches wheels")
    parser.add_argument("--fresh", action="store_true", help="rebuild the images (not the Debian base) even if cached")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("image: needs root (mmdebstrap --mode=root, chroot)")
    start = time.monotonic()
    version, k8s = project_version(), k8s_version()
    base, base_inputs = base_rootfs()
    with tempfile.TemporaryDirectory(prefix="gpushare-wheels.") as tmp:
        wheels = Path(tmp)
        wheel_list = wheelhouse(wheels, args.python)
        gpushare_ref = f"{REGISTRY}/gpushare:{version}"
        gpushare_inputs = image_inputs(
            gpushare_ref, {"base": base_inputs, "wheels": wheel_list, "setup.sh": sha256_file(SETUP_SCRIPT)}
        )
        gpushare_archive, gpushare_digest = cached_build(
            "gpushare", gpushare_inputs, lambda out: build_gpushare(base, wheels, out, gpushare_ref), args.fresh
        )
    binary = k8s_bin_dir() / "kube-scheduler"
    sched_ref = f"{REGISTRY}/kube-scheduler:{k8s}"
    sched_inputs = image_inputs(sched_ref, {"kube-scheduler": sha256_file(binary)})
    sched_archive, sched_digest = cached_build(
        "kube-scheduler", sched_inputs, lambda out: build_kube_scheduler(binary, out, sched_ref), args.fresh
    )
    args.out.mkdir(parents=True, exist_ok=True)
    images = {}
    for key, archive, ref, digest in (
        ("gpushare", gpushare_archive, gpushare_ref, gpushare_digest),
        ("kube-scheduler", sched_archive, sched_ref, sched_digest),
    ):
        dest = args.out / archive.name
        tmp_dest = dest.with_name(dest.name + ".tmp")
        shutil.copyfile(archive, tmp_dest)
        tmp_dest.replace(dest)
        images[key] = {"ref": ref, "archive": archive.name, "digest": digest, "size": dest.stat().st_size}
    manifest = args.out / "images.json"
    manifest.write_text(json.dumps({"images": images}, indent=2) + "\n")
    log(f"done in {time.monotonic() - start:.1f}s: {manifest}")
    print(manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
