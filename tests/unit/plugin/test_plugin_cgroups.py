"""Process -> pod and container from `/proc/<pid>/cgroup`, for every layout kubelet and the runtimes produce."""

from __future__ import annotations

import pytest

from share_plugin.cgroups import CgroupRef
from share_plugin.cgroups import parse_cgroup
from share_plugin.cgroups import status_container_id

UID = "0f3c8b6e-5a8d-4b8e-9c1e-2d7f4a6b9e10"
UID_ = UID.replace("-", "_")
CID = "4c5e2f6a8b9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091"
WANT = CgroupRef(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver, containerd
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        # cgroup v2, systemd driver, CRI-O; Guaranteed pod (no QoS slice)
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n",
        # docker-shim / cri-dockerd with the systemd driver
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope\n",
        # cgroupfs driver, cgroup v2 (any runtime)
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        # cgroup v1, cgroupfs driver (docker-shim's classic layout): one line per hierarchy
        f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:cpuset:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n",
        # cgroup v1, systemd driver, containerd
        f"4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        # read from inside a container with its own cgroup namespace (v2): relative to the reader's cgroup
        f"0::/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        # kubelet nested under its own slice (kind, a test node)
        f"0::/system.slice/gs-node.slice/kubepods/pod{UID}/{CID}\n",
    ],
)
def test_container_of_every_layout(text: str) -> None:
    assert parse_cgroup(text) == WANT


def test_process_outside_any_pod() -> None:
    assert parse_cgroup("0::/system.slice/nvidia-persistenced.service\n") is None
    assert parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert parse_cgroup("") is None
    assert parse_cgroup("garbage\n") is None


def test_pod_cgroup_without_container_and_crio_conmon() -> None:
    # a process in the pod's own cgroup (no container's), and CRI-O's container monitor: the pod, no container
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID}\n") == CgroupRef(UID, "")
    conmon = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope\n"
    assert parse_cgroup(conmon) == CgroupRef(UID, "")


def test_static_pod_hash_uid() -> None:
    h = "6d3d4fd3a1b2c3d4e5f60718293a4b5c"
    assert parse_cgroup(f"0::/kubepods/burstable/pod{h}/{CID}\n") == CgroupRef(h, CID)


def test_status_container_ids() -> None:
    assert status_container_id(f"containerd://{CID}") == CID
    assert status_container_id(f"cri-o://{CID}") == CID
    assert status_container_id(f"docker://{CID.upper()}") == CID
