"""The GPU tier's hard-limit tests (tests/gpu/test_hard_limit_on_gpu.py, not collected here) decide whether they
can run with this gate: on the lent GPU's driver 580.x they must end XFAIL "unsupported driver <version>", and
fail (not xfail) for any other reason the node cannot run them."""

from __future__ import annotations

from share_node.hardlimit import GpuFacts
from tests.gpu.test_hard_limit_on_gpu import gate

WHOLE = (GpuFacts("GPU-0", False),)


def test_hard_limit_gpu_tier_gate_on_a_580_driver_is_an_xfail_naming_it() -> None:
    assert gate("580.159.04", False, True, WHOLE) == (
        "xfail",
        "unsupported driver 580.159.04: the per-cgroup GPU memory limit needs R615 or newer",
    )


def test_hard_limit_gpu_tier_gate_other_problems_fail() -> None:
    assert gate("615.20.01", True, True, WHOLE) is None
    kind, why = gate("615.20.01", True, False, WHOLE) or ("", "")
    assert kind == "fail" and "not cgroup v2" in why
    kind, why = gate("615.20.01", False, True, WHOLE) or ("", "")
    assert kind == "fail" and "nvmlDeviceSetMemoryLimits_v1" in why
    kind, why = gate("615.20.01", True, True, (GpuFacts("MIG-1", True),)) or ("", "")
    assert kind == "fail" and "MIG" in why
