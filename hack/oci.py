"""Write OCI image archives without a container engine, byte for byte reproducible.

An image here is one or more layers (each a list of `Entry`: files, dirs, symlinks, hard links,
device nodes) plus an image config; `write_archive` writes an OCI image-layout tar (`oci-layout`,
`index.json`, `blobs/sha256/...`) that `ctr images import`, `skopeo copy oci-archive:` and
`podman load` read. Every timestamp is fixed (`SOURCE_DATE_EPOCH`, default 0), owners are numeric,
entries are sorted and gzip carries no name or time, so the same inputs give the same digests.

Layers come from a file list (`file_entry`, `dir_entry`, `symlink_entry`) or from a root
filesystem directory (`entries_from_dir`, e.g. one made by mmdebstrap). Not kept: extended
attributes (file capabilities, SELinux labels) and sparse-file holes.

    python -m hack.oci --rootfs ROOT --ref gpushare.local/app:1 --entrypoint /app --out app.oci.tar
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import os
import platform
import stat
import sys
import tarfile
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
# containerd names an imported image after this annotation as it is (no --base-name needed).
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le"}


def source_date_epoch() -> int:
    """The fixed time every entry and the image config carry (SOURCE_DATE_EPOCH, default 0)."""
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def host_arch() -> str:
    """This machine's architecture in OCI (Go) spelling: amd64, arm64, ..."""
    machine = platform.machine()
    return _GO_ARCH.get(machine, machine)


@dataclass(frozen=True)
class Entry:
    """One entry of a layer. `path` is relative to the image root ("bin/sh", no leading slash)."""

    path: str
    type: bytes = tarfile.REGTYPE  # tarfile.REGTYPE, DIRTYPE, SYMTYPE, LNKTYPE, CHRTYPE, BLKTYPE, FIFOTYPE
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    data: bytes | None = None  # regular file contents (or read from `source`)
    source: Path | None = None
    linkname: str = ""  # symlink target, or the hard link's target path (relative, like `path`)
    devmajor: int = 0
    devminor: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _clean(self.path))
        if self.type == tarfile.LNKTYPE:
            object.__setattr__(self, "linkname", _clean(self.linkname))


def _clean(path: str) -> str:
    parts = [p for p in str(path).split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"bad path in image: {path!r}")
    return "/".join(parts)


def file_entry(path: str, source: Path | None = None, data: bytes | None = None, mode: int | None = None) -> Entry:
    """A regular file from `source` on disk (its permission bits unless `mode`) or from `data`."""
    if (source is None) == (data is None):
        raise ValueError("give exactly one of source and data")
    if mode is None:
        mode = stat.S_IMODE(Path(source).stat().st_mode) if source is not None else 0o644
    return Entry(path, tarfile.REGTYPE, mode, data=data, source=Path(source) if source is not None else None)


def dir_entry(path: str, mode: int = 0o755) -> Entry:
    return Entry(path, tarfile.DIRTYPE, mode)


def symlink_entry(path: str, target: str) -> Entry:
    return Entry(path, tarfile.SYMTYPE, 0o777, linkname=target)


def entries_from_dir(root: Path, keep_owners: bool = True) -> list[Entry]:
    """Every entry under `root` (not `root` itself), hard links kept as links, owners numeric
    (or all 0:0 when `keep_owners` is false). Sockets are skipped."""
    root = Path(root)
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            full = Path(dirpath) / name
            found.append((full.relative_to(root).as_posix(), full))
    found.sort(key=lambda item: _sort_key(item[0]))  # the order the layer is written in
    out: list[Entry] = []
    seen: dict[tuple[int, int], str] = {}  # inode -> first path: later ones become hard links
    for rel, full in found:
        st = full.lstat()
        owner = {"uid": st.st_uid, "gid": st.st_gid} if keep_owners else {}
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            out.append(Entry(rel, tarfile.DIRTYPE, mode, **owner))
        elif stat.S_ISLNK(st.st_mode):
            out.append(Entry(rel, tarfile.SYMTYPE, 0o777, linkname=os.readlink(full), **owner))
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in seen:
                out.append(Entry(rel, tarfile.LNKTYPE, mode, linkname=seen[key], **owner))
            else:
                seen[key] = rel
                out.append(Entry(rel, tarfile.REGTYPE, mode, source=full, **owner))
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            kind = tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.BLKTYPE
            dev = st.st_rdev
            out.append(Entry(rel, kind, mode, devmajor=os.major(dev), devminor=os.minor(dev), **owner))
        elif stat.S_ISFIFO(st.st_mode):
            out.append(Entry(rel, tarfile.FIFOTYPE, mode, **owner))
    return out


def _sort_key(path: str) -> list[str]:
    """Parents before children, siblings by name: the order entries are written in."""
    return path.split("/")


def _with_parents(entries: Iterable[Entry]) -> list[Entry]:
    """Entries plus any missing parent directory (0755, root), sorted by path; a later entry for the
    same path replaces an earlier one."""
    by_path: dict[str, Entry] = {}
    for e in entries:
        by_path[e.path] = e
    for path in list(by_path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            by_path.setdefault("/".join(parts[:i]), dir_entry("/".join(parts[:i])))
    return [by_path[p] for p in sorted(by_path, key=_sort_key)]


def _tarinfo(e: Entry, mtime: int) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(e.path + ("/" if e.type == tarfile.DIRTYPE else ""))
    info.type = e.type
    info.mode = e.mode
    info.uid, info.gid = e.uid, e.gid
    info.uname = info.gname = ""
    info.mtime = mtime
    info.linkname = e.linkname
    info.devmajor, info.devminor = e.devmajor, e.devminor
    data = None
    if e.type == tarfile.REGTYPE:
        data = e.data if e.data is not None else Path(e.source).read_bytes()  # type: ignore[arg-type]
        info.size = len(data)
    return info, data


def _tar_bytes(members: Iterable[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        desc: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}
        if self.annotations:
            desc["annotations"] = dict(self.annotations)
        desc.update(extra)
        return desc


@dataclass(frozen=True)
class Layer:
    blob: Blob  # the gzip'd tar
    diff_id: str  # sha256 of the uncompressed tar


def build_layer(entries: Iterable[Entry], mtime: int | None = None, compresslevel: int = 9) -> Layer:
    """A gzip'd tar layer: parents added, sorted, fixed times, reproducible gzip (a lower
    `compresslevel` for big layers: 6 is several times faster than 9 and a few % larger)."""
    mtime = source_date_epoch() if mtime is None else mtime
    raw = _tar_bytes(_tarinfo(e, mtime) for e in _with_parents(entries))
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=0, compresslevel=compresslevel) as f:
        f.write(raw)
    return Layer(Blob(MEDIA_LAYER_GZIP, gz.getvalue()), "sha256:" + hashlib.sha256(raw).hexdigest())


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _rfc3339(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an OCI image config (what a Dockerfile's ENV, ENTRYPOINT, ... set)."""

    entrypoint: Sequence[str] | None = None
    cmd: Sequence[str] | None = None
    env: Sequence[str] = (f"PATH={DEFAULT_PATH}",)
    user: str = ""
    working_dir: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    arch: str = dataclasses.field(default_factory=host_arch)
    os: str = "linux"

    def blob(self, layers: Sequence[Layer], created: int) -> Blob:
        runtime: dict[str, Any] = {"Env": list(self.env)}
        if self.entrypoint is not None:
            runtime["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            runtime["Cmd"] = list(self.cmd)
        if self.user:
            runtime["User"] = self.user
        if self.working_dir:
            runtime["WorkingDir"] = self.working_dir
        if self.labels:
            runtime["Labels"] = dict(self.labels)
        when = _rfc3339(created)
        config = {
            "architecture": self.arch,
            "os": self.os,
            "created": when,
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
            "history": [{"created": when, "created_by": "hack/oci.py"} for _ in layers],
        }
        return Blob(MEDIA_CONFIG, _json_bytes(config))


def image_blobs(layers: Sequence[Layer], config: ImageConfig, ref: str) -> tuple[list[Blob], dict[str, Any]]:
    """All blobs of one image (config, layers, manifest) and its index.json."""
    cfg = config.blob(layers, source_date_epoch())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": cfg.descriptor(),
        "layers": [layer.blob.descriptor() for layer in layers],
    }
    manifest_blob = Blob(MEDIA_MANIFEST, _json_bytes(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            manifest_blob.descriptor(
                annotations={ANNOTATION_REF_NAME: ref, ANNOTATION_CONTAINERD_NAME: ref},
                platform={"architecture": config.arch, "os": config.os},
            )
        ],
    }
    return [cfg, *(layer.blob for layer in layers), manifest_blob], index


def write_archive(out: Path, layers: Sequence[Layer], config: ImageConfig, ref: str) -> str:
    """Write an OCI image-layout tar to `out` (atomically); returns the manifest digest."""
    blobs, index = image_blobs(layers, config, ref)
    mtime = source_date_epoch()
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []

    def add(path: str, data: bytes | None, kind: bytes = tarfile.REGTYPE) -> None:
        e = Entry(path, kind, 0o755 if kind == tarfile.DIRTYPE else 0o644, data=data)
        members.append(_tarinfo(e, mtime))

    add("blobs", None, tarfile.DIRTYPE)
    add("blobs/sha256", None, tarfile.DIRTYPE)
    written: set[str] = set()
    for blob in sorted(blobs, key=lambda b: b.digest):
        if blob.digest not in written:  # two identical layers are one blob
            written.add(blob.digest)
            add(f"blobs/sha256/{blob.digest.removeprefix('sha256:')}", blob.data)
    add("index.json", _json_bytes(index))
    add("oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(_tar_bytes(members))
    tmp.replace(out)
    return str(index["manifests"][0]["digest"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="root filesystem directory -> reproducible OCI image archive")
    parser.add_argument("--rootfs", type=Path, required=True, help="directory that becomes the image's /")
    parser.add_argument("--ref", required=True, help="image name, e.g. gpushare.local/gpushare:0.1.0")
    parser.add_argument("--out", type=Path, required=True, help="archive to write (.oci.tar)")
    parser.add_argument("--entrypoint", nargs="*", default=None)
    parser.add_argument("--cmd", nargs="*", default=None)
    parser.add_argument("--env", action="append", default=None, help="KEY=VALUE (repeat); default PATH only")
    parser.add_argument("--user", default="")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--arch", default=host_arch())
    parser.add_argument("--root-owned", action="store_true", help="every entry 0:0 instead of the files' owners")
    args = parser.parse_args(argv)
    layer = build_layer(entries_from_dir(args.rootfs, keep_owners=not args.root_owned))
    config = ImageConfig(
        entrypoint=args.entrypoint,
        cmd=args.cmd,
        env=args.env or (f"PATH={DEFAULT_PATH}",),
        user=args.user,
        working_dir=args.workdir,
        arch=args.arch,
    )
    digest = write_archive(args.out, [layer], config, args.ref)
    print(f"{args.out} {args.ref} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
