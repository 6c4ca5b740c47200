"""Build the two images a real test node runs, without pulling anything (hack/build-node-images.sh).

* `gpushare.local/pause:<TAG>`: the pod sandbox image, from upstream's build/pause/linux/pause.c in the
  k8s.io/kubernetes module (the version build-k8s.sh pins), compiled as upstream's Makefile does
  (`gcc -Os -Wall -Werror -static -DVERSION=v<TAG>-<REV>`, stripped), USER 65535:65535.
* `gpushare.local/busybox:<major.minor>`: Debian's static busybox at /bin/busybox, a symlink per
  applet, /etc/passwd and /etc/group, /tmp.

Both are OCI archives written by hack/oci.py (reproducible), cached in
${GPUSHARE_CACHE:-$HOME/.cache/gpushare}/images/<stamp>/ with an images.json naming them. The stamp
hashes every input (sources, compiler, busybox binary, these scripts), so a change rebuilds.
Progress goes to stderr; the last line of stdout is the directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `hack` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hack import oci

RECIPE = 1  # bump when the recipe changes in a way the hashed inputs do not show
HACK = Path(__file__).resolve().parent
REGISTRY = "gpushare.local"
PAUSE_REV = "gpushare"


def log(msg: str) -> None:
    print(f"[node-images] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("GPUSHARE_CACHE") or Path.home() / ".cache" / "gpushare") / "images"


def k8s_version() -> str:
    """The Kubernetes release hack/build-k8s.sh builds (its table; K8S_VERSION/GPUSHARE_K8S_VERSION pick one)."""
    result = subprocess.run([str(HACK / "build-k8s.sh"), "--version"], capture_output=True, text=True, check=False)
    version = result.stdout.strip()
    if result.returncode != 0 or not version.startswith("v"):
        raise SystemExit(f"node-images: hack/build-k8s.sh --version failed: {result.stderr.strip()}")
    return version


def kubernetes_module_dir(version: str) -> Path:
    """The k8s.io/kubernetes module source in the Go module cache (downloaded through the proxy if absent)."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    with tempfile.TemporaryDirectory() as empty:  # outside any module
        result = subprocess.run(
            [go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
            capture_output=True,
            text=True,
            env=env,
            cwd=empty,
            check=False,
        )
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or not info.get("Dir"):
        raise SystemExit(
            f"node-images: go mod download k8s.io/kubernetes@{version} failed:\n{result.stdout}{result.stderr}"
        )
    return Path(info["Dir"])


def is_static_elf(path: Path) -> bool:
    """True when the ELF file has no program interpreter (PT_INTERP), i.e. it is statically linked."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF":
        return False
    is64, little = data[4] == 2, data[5] == 1
    end = "<" if little else ">"
    if is64:
        (phoff,) = struct.unpack_from(end + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36)
    else:
        (phoff,) = struct.unpack_from(end + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 0x2A)
    p_types = (struct.unpack_from(end + "I", data, phoff + i * phentsize)[0] for i in range(phnum))
    return 3 not in p_types  # PT_INTERP


def input_stamp(inputs: dict) -> str:
    """A short, stable name for a build's inputs: the cache key of every image build here."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def find_busybox() -> tuple[Path, str]:
    """Debian's static busybox and its version (major.minor)."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")):
        if candidate and Path(candidate).is_file():
            path = Path(candidate).resolve()
            break
    else:
        raise SystemExit("node-images: no busybox; run hack/node-deps.sh (installs busybox-static)")
    if not is_static_elf(path):
        raise SystemExit(f"node-images: {path} is not statically linked; install busybox-static (hack/node-deps.sh)")
    banner = subprocess.run([str(path)], capture_output=True, text=True, check=False).stdout
    m = re.search(r"BusyBox v(\d+)\.(\d+)", banner)
    if not m:
        raise SystemExit(f"node-images: cannot read the version of {path}: {banner[:200]!r}")
    return path, f"{m.group(1)}.{m.group(2)}"


def compiler() -> tuple[str, str]:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise SystemExit("node-images: no C compiler; run hack/node-deps.sh (installs gcc, libc6-dev)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return cc, version


def build_pause(cc: str, source: Path, tag: str, workdir: Path) -> Path:
    out = workdir / "pause"
    cflags = ["-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{tag}-{PAUSE_REV}"]
    result = subprocess.run([cc, *cflags, "-o", str(out), str(source)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"node-images: {cc} {' '.join(cflags)} {source} failed:\n{result.stderr}")
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, str(out)], check=True)
    if not is_static_elf(out):
        raise SystemExit("node-images: the pause binary is not static (libc6-dev's libc.a missing?)")
    return out


def busybox_entries(busybox: Path) -> list[oci.Entry]:
    applets = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout
    entries = [oci.file_entry("bin/busybox", source=busybox, mode=0o755)]
    for line in sorted(set(applets.split())):
        path = line.strip("/")
        if path and path != "bin/busybox":
            entries.append(oci.symlink_entry(path, "/bin/busybox"))
    entries += [
        oci.file_entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
        oci.file_entry("etc/group", data=b"root:x:0:\nnogroup:x:65534:\n"),
        oci.dir_entry("tmp", 0o1777),
        oci.dir_entry("root", 0o700),
        *(oci.dir_entry(d) for d in ("proc", "sys", "dev", "etc", "var")),
    ]
    return entries


def build(out_dir: Path, pause_src: Path, pause_tag: str, cc: str, busybox: Path, busybox_tag: str) -> dict:
    images: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        pause_bin = build_pause(cc, pause_src, pause_tag, Path(tmp))
        layer = oci.build_layer([oci.file_entry("pause", source=pause_bin, mode=0o755)])
        ref = f"{REGISTRY}/pause:{pause_tag}"
        config = oci.ImageConfig(entrypoint=["/pause"], user="65535:65535", env=())
        digest = oci.write_archive(out_dir / "pause.oci.tar", [layer], config, ref)
        images["pause"] = {"ref": ref, "archive": "pause.oci.tar", "digest": digest}
    layer = oci.build_layer(busybox_entries(busybox))
    ref = f"{REGISTRY}/busybox:{busybox_tag}"
    config = oci.ImageConfig(cmd=["sh"])
    digest = oci.write_archive(out_dir / "busybox.oci.tar", [layer], config, ref)
    images["busybox"] = {"ref": ref, "archive": "busybox.oci.tar", "digest": digest}
    return images


def main() -> int:
    start = time.monotonic()
    version = k8s_version()
    module = kubernetes_module_dir(version)
    pause_src = module / "build" / "pause" / "linux" / "pause.c"
    makefile = (module / "build" / "pause" / "Makefile").read_text()
    m = re.search(r"^TAG \?= (\S+)", makefile, re.M)
    if not m or not pause_src.is_file():
        raise SystemExit(f"node-images: no pause source/TAG in {module}/build/pause")
    pause_tag = m.group(1)
    cc, cc_version = compiler()
    busybox, busybox_tag = find_busybox()
    inputs = {
        "recipe": RECIPE,
        "kubernetes": version,
        "pause.c": sha256_file(pause_src),
        "pause_tag": pause_tag,
        "cc": cc_version,
        "busybox": sha256_file(busybox),
        "oci.py": sha256_file(HACK / "oci.py"),
        "node_images.py": sha256_file(Path(__file__)),
        "arch": oci.host_arch(),
        "source_date_epoch": oci.source_date_epoch(),
    }
    out_dir = cache_root() / f"pause-{pause_tag}_busybox-{busybox_tag}_{input_stamp(inputs)}"
    manifest = out_dir / "images.json"
    if manifest.is_file():
        log(f"cache warm: {out_dir}")
        print(out_dir)
        return 0
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out_dir}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per stamp; the others wait and reuse
        if not manifest.is_file():
            log(f"building into {out_dir}")
            staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
            staging.chmod(0o755)
            try:
                images = build(staging, pause_src, pause_tag, cc, busybox, busybox_tag)
                (staging / "images.json").write_text(json.dumps({"images": images, "inputs": inputs}, indent=2))
                if out_dir.exists():
                    shutil.rmtree(out_dir)
                staging.rename(out_dir)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            log(f"built in {time.monotonic() - start:.1f}s")
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
