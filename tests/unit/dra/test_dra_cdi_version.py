"""The CDI spec share-dra writes declares a version new enough for what it uses.

A runtime's CDI library refuses a spec whose features need a newer `cdiVersion` than it declares, and the
claim's containers then fail ("unresolvable CDI devices"): seen with containerd 2.4 on the real node. The
rules are the CDI spec's (container-device-interface specs-go/version.go, requiresV060 and later):
spec- or device-level `annotations` and a dot in the kind's class need 0.6.0.
"""

from __future__ import annotations

from share_core.contract import MemoryUnit
from share_dra.claims import AllocatedDevice
from share_dra.claims import prepare
from share_node.backend import Gpu

GPUS = [Gpu(0, "GPU-aaaa", "Tesla T4", 16 * 1024**3, 0)]


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def needed(spec: dict) -> tuple[int, ...]:
    """The lowest CDI version the spec's features need (the features share-dra can emit)."""
    _, _, cls = spec["kind"].partition("/")
    if spec.get("annotations") or any(d.get("annotations") for d in spec["devices"]) or "." in cls:
        return (0, 6, 0)
    return (0, 3, 0)


def test_the_claim_spec_declares_the_version_its_features_need() -> None:
    prep = prepare("u1", [AllocatedDevice("gpu", "n1", "gpu-0", 4096, "s")], GPUS, MemoryUnit.GiB, spec_file="/x")
    assert version(prep.spec["cdiVersion"]) >= needed(prep.spec), prep.spec
