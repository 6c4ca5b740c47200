"""--hard-limit in share-dra: NodePrepareResources limits each pod's cgroup to the sum of its claims on each GPU
(the pod cgroup exists then, nothing of the pod runs); NodeUnprepareResources clears it; the checkpoint keeps the
pods and memory so a restarted driver finds and keeps the limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from share_dra.driver import ClaimRef
from share_dra.driver import Driver
from share_node.backend.simlimits import SimMemoryLimits
from share_node.hardlimit import Facts
from share_node.hardlimit import GpuFacts
from share_node.hardlimit import HardLimiter
from share_node.hardlimit import decide_support
from tests.unit.dra.fakeapi import FakeDraApi
from tests.unit.dra.fakeapi import allocated_claim
from tests.unit.dra.node import GIB
from tests.unit.dra.node import GPUS
from tests.unit.dra.node import make_driver

POD = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def reserved(claim: dict[str, Any], pod_uid: str, pod: str) -> dict[str, Any]:
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod_uid}]
    return claim


def setup(tmp_path: Path) -> tuple[Driver, SimMemoryLimits, Path, FakeDraApi]:
    api = FakeDraApi()
    api.add_claim(reserved(allocated_claim("ns", "c1", "uid-1", [("n1", "gpu-1", "8Gi")]), POD, "p"))
    api.add_claim(reserved(allocated_claim("ns", "c2", "uid-2", [("n1", "gpu-1", "3Gi")]), POD, "p"))
    root = tmp_path / "cg"
    cgroup = root / "kubepods" / "besteffort" / f"pod{POD}"
    cgroup.mkdir(parents=True)
    nvml = SimMemoryLimits(str(tmp_path / "limits.json"), euid=lambda: 0, fstype=lambda _p: "cgroup2")
    facts = Facts("auto", True, "615.1", str(root), True, tuple(GpuFacts(g.uuid, False) for g in GPUS))
    limiter = HardLimiter(nvml, decide_support(facts, None), str(root), "n1", clear_when_empty=False)
    driver = make_driver(tmp_path, api, limiter=limiter)
    return driver, nvml, cgroup, api


def test_dra_hard_limit_prepare_limits_the_pod_to_its_claims(tmp_path: Path) -> None:
    driver, nvml, cgroup, _api = setup(tmp_path)
    out = driver.prepare([ClaimRef("ns", "uid-1", "c1"), ClaimRef("ns", "uid-2", "c2")])
    assert not any(isinstance(v, str) for v in out.values()), out
    got = nvml.get("GPU-bbbb", str(cgroup))
    assert (got.soft, got.hard) == (11 * GIB, 11 * GIB)  # 8 + 3 GiB on the same GPU: one budget
    assert not nvml.get("GPU-aaaa", str(cgroup)).limited
    assert driver.pod_limits() == {POD: ("ns/p", {"GPU-bbbb": 11 * GIB})}
    driver.unprepare([ClaimRef("ns", "uid-1", "c1"), ClaimRef("ns", "uid-2", "c2")])
    assert not nvml.get("GPU-bbbb", str(cgroup)).limited  # cleared while the cgroup exists


def test_dra_hard_limit_restart_keeps_the_limit_from_the_checkpoint(tmp_path: Path) -> None:
    driver, nvml, cgroup, api = setup(tmp_path)
    driver.prepare([ClaimRef("ns", "uid-1", "c1")])
    restarted = make_driver(tmp_path, api, limiter=driver.limiter)
    assert restarted.pod_limits() == {POD: ("ns/p", {"GPU-bbbb": 8 * GIB})}
    assert driver.limiter is not None
    fresh = HardLimiter(nvml, driver.limiter.support, str(driver.limiter.root), "n1")  # the new process's
    report = fresh.adopt(restarted.pod_limits())
    assert report.kept == ["ns/p"] and nvml.get("GPU-bbbb", str(cgroup)).hard == 8 * GIB


def test_dra_hard_limit_missing_cgroup_fails_the_claim_for_kubelet_to_retry(tmp_path: Path) -> None:
    driver, _nvml, cgroup, _api = setup(tmp_path)
    cgroup.rmdir()
    out = driver.prepare([ClaimRef("ns", "uid-1", "c1")])
    assert isinstance(out["uid-1"], str) and f"pod{POD}" in out["uid-1"]


def test_dra_hard_limit_survives_an_empty_pod_cgroup(tmp_path: Path) -> None:
    """A new sandbox empties the pod's cgroup for a moment; kubelet does not prepare the claims again, so share-dra
    keeps the limit until NodeUnprepareResources."""
    driver, nvml, cgroup, _api = setup(tmp_path)
    driver.prepare([ClaimRef("ns", "uid-1", "c1")])
    assert driver.limiter is not None
    (cgroup / "cgroup.procs").write_text("99\n")
    driver.limiter.sweep()
    (cgroup / "cgroup.procs").write_text("")
    assert driver.limiter.sweep() == []
    assert nvml.get("GPU-bbbb", str(cgroup)).hard == 8 * GIB
