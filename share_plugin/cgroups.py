"""Which pod and container a process belongs to, from the text of its `/proc/<pid>/cgroup`: pure parsing.

kubelet puts every container in a cgroup below its pod's cgroup, and the pod's cgroup is named after the
pod UID (k8s.io/kubernetes pkg/kubelet/cm/pod_container_manager_linux.go GetPodContainerName:
`pod<uid>`; with the systemd driver the name is escaped into a slice, `kubepods-burstable-pod<uid with _>.slice`,
cgroup_manager_linux.go). The container runtime names the container's own cgroup after the container ID.
Layouts seen in the wild, all handled here:

* cgroup v2, systemd driver, containerd: `0::/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`
* cgroup v2, systemd driver, CRI-O: `.../kubepods-pod<uid_>.slice/crio-<id>.scope` (its monitor, conmon,
  sits in `crio-conmon-<id>.scope`: not the container)
* docker-shim / cri-dockerd, systemd driver: `.../kubepods-besteffort-pod<uid_>.slice/docker-<id>.scope`
* cgroupfs driver (v1 or v2), any runtime: `/kubepods/burstable/pod<uid>/<id>`; Guaranteed pods drop the
  QoS level: `/kubepods/pod<uid>/<id>`
* cgroup v1: one line per hierarchy (`4:memory:/kubepods/...`); any line naming the pod will do.
* a reader in its own cgroup namespace (a container on cgroup v2) sees paths relative to its own cgroup,
  e.g. `0::/../../kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`, and nested setups (kind,
  a kubelet under its own slice) prefix the path: so the pod segment is searched anywhere in the path.

Static pods' cgroups carry their config hash (32 hex digits) where other pods carry their UID; both match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# `pod<uid>` as a path component (cgroupfs) or inside a systemd slice name (dashes become underscores).
_POD = re.compile(r"(?:^|[/-])pod([0-9a-fA-F][0-9a-fA-F_-]{30,35}[0-9a-fA-F])(?:\.slice)?(?=/|$)")
# A container's own cgroup: the bare ID (cgroupfs) or a runtime's systemd scope around it.
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker|cri-o|containerd)-)?([0-9a-fA-F]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """A process's pod UID and container ID ("" when the process sits in the pod cgroup but in no container's)."""

    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod and container named by a `/proc/<pid>/cgroup`; None for a process outside any pod."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ref = parse_cgroup_path(parts[2].strip())
        if ref is not None:
            return ref
    return None


def parse_cgroup_path(path: str) -> CgroupRef | None:
    """One cgroup path (the third field of a `/proc/<pid>/cgroup` line)."""
    pods = list(_POD.finditer(path))
    if not pods:
        return None
    last = pods[-1]
    uid = last.group(1).replace("_", "-").lower()
    rest = [c for c in path[last.end() :].split("/") if c]
    container_id = ""
    if rest:
        m = _CONTAINER.match(rest[0])
        if m:
            container_id = m.group(2).lower()
    return CgroupRef(uid, container_id)


def status_container_id(raw: str) -> str:
    """The bare ID from a pod status `containerID` (`containerd://<id>`, `cri-o://<id>`, `docker://<id>`)."""
    return raw.rpartition("://")[2].lower()
