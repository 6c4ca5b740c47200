"""The extender in DRA mode: GPUs from our ResourceSlices, memory from allocated ResourceClaims, pods with
claims placed by the policy, and filter's hold on the device the allocator will take until the claim's
allocation shows."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from share_core.contract import RESOURCE_MEM
from share_core.fake import FakeKube
from share_scheduler.cache import ClusterCache
from share_scheduler.service import Extender
from share_scheduler.syncer import DRA_KINDS
from tests.controlplane.draworkload import gpu_slice
from tests.controlplane.draworkload import memory_claim
from tests.unit.scheduler.conftest import fast_backoff
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import wait_until

SLICES, CLAIMS = DRA_KINDS["resourceslices"], DRA_KINDS["resourceclaims"]


def bare_node(name: str) -> dict[str, Any]:
    """A node in DRA mode: no device plugin annotation, its GPUs only in its slice."""
    node = make_node(name, [])
    node["metadata"]["annotations"] = {}
    for field in ("capacity", "allocatable"):
        node["status"][field].pop(RESOURCE_MEM)
    return node


def allocated(claim: dict[str, Any], pool: str, device: str, consumed: str | None = "4Gi", driver: str = "gpushare.io"):
    out = copy.deepcopy(claim)
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
    if consumed is not None:
        result["consumedCapacity"] = {"memory": consumed}
    out["status"] = {"allocation": {"devices": {"results": [result]}}}
    return out


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "gpushare-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def test_the_cache_counts_slices_and_claims_as_kube_scheduler_does() -> None:
    cache = ClusterCache(dra=True)
    cache.replace_nodes([bare_node("n1")])
    claim = memory_claim("default", "c1", 4)
    # The claim's allocation comes before the slice that names its device: counted once the slice comes.
    cache.replace_claims([allocated(claim, "n1", "gpu-1")])
    cache.replace_slices([gpu_slice("n1", [("T4", 16), ("T4", 16)])])
    assert cache.usage() == {"n1": {0: 0, 1: 4}}
    assert cache.node_snapshot("n1").order == (0, 1)
    # Another driver's result and a whole-device allocation (no consumedCapacity).
    cache.upsert_claim(allocated(memory_claim("default", "other", 4), "n1", "gpu-0", driver="example.com"))
    cache.upsert_claim(allocated(memory_claim("default", "whole", 1), "n1", "gpu-0", consumed=None))
    assert cache.usage() == {"n1": {0: 16, 1: 4}}
    cache.delete_claim(memory_claim("default", "whole", 1))
    assert cache.usage() == {"n1": {0: 0, 1: 4}}
    assert cache.host_usage()["n1"][2] == 0  # claims take no pod slot
    # The slice goes: the node has no GPU and the claim nothing to count on.
    cache.replace_slices([])
    assert cache.usage() == {"n1": {}}
    cache.replace_pods([])
    assert cache.synced


def test_a_device_plugin_node_keeps_its_own_gpus() -> None:
    cache = ClusterCache(dra=True)
    cache.replace_nodes([make_node("dp", [16])])
    cache.replace_slices([gpu_slice("dp", [("T4", 80), ("T4", 80)])])
    assert cache.usage() == {"dp": {0: 0}}


@pytest.fixture
def dra_extender() -> Extender:
    kube = FakeKube()
    for name in ("n1", "n2"):
        kube.add_node(bare_node(name))
        kube.put_object(SLICES, gpu_slice(name, [("T4", 16), ("T4", 16)]))
    ext = Extender(kube, policy="binpack", sync_backoff=fast_backoff, dra=True)
    ext.start()
    wait_until(lambda: ext.cache.synced, what="first sync")
    # The fake starts a watch when its reader first asks (it keeps no history to replay from a version).
    wait_until(lambda: len(kube._watchers) == len(ext.syncer.kinds), what="the four watches")
    yield ext
    ext.stop()


def test_filter_places_a_claim_by_the_policy_and_holds_the_first_fit_device(dra_extender: Extender) -> None:
    kube: FakeKube = dra_extender.kube  # type: ignore[assignment]
    kube.put_object(CLAIMS, allocated(memory_claim("default", "old", 8), "n2", "gpu-1", "8Gi"))
    wait_until(lambda: dra_extender.cache.usage()["n2"][1] == 8, what="the allocated claim counted")
    kube.put_object(CLAIMS, memory_claim("default", "c1", 6))
    pod = claim_pod("p1", "c1")
    status, answer = dra_extender.filter(orjson.dumps(filter_args(pod, ["n1", "n2"])))
    assert (status, answer["NodeNames"]) == (200, ["n2"])  # binpack: the fuller node
    # The allocator takes the first device with room in slice order: gpu-0 (16 free) comes before gpu-1.
    assert dra_extender.cache.usage()["n2"] == {0: 6, 1: 8}
    # The allocation shows: the hold gives way to the claim itself, counted once.
    kube.put_object(CLAIMS, allocated(memory_claim("default", "c1", 6), "n2", "gpu-0", "6Gi"))
    wait_until(lambda: dra_extender.cache.claim("default", "c1")[1], what="the allocation seen")
    assert dra_extender.cache.usage()["n2"] == {0: 6, 1: 8}
    assert not dra_extender.cache.snapshot()["pending"]


def test_a_claim_the_watch_has_not_brought_is_read_and_odd_shapes_left_to_kube_scheduler(
    dra_extender: Extender,
) -> None:
    kube: FakeKube = dra_extender.kube  # type: ignore[assignment]
    dra_extender.syncer.stop()  # the watch brings nothing more: filter must read the claim itself
    kube.put_object(CLAIMS, memory_claim("default", "late", 4))
    status, answer = dra_extender.filter(orjson.dumps(filter_args(claim_pod("p", "late"), ["n1", "n2"])))
    assert (status, answer["NodeNames"]) == (200, ["n1"])
    two_sizes = memory_claim("default", "odd", 4)
    second = copy.deepcopy(two_sizes["spec"]["devices"]["requests"][0])
    second["name"] = "more"
    second["exactly"]["capacity"]["requests"]["memory"] = "2Gi"
    two_sizes["spec"]["devices"]["requests"].append(second)
    kube.put_object(CLAIMS, two_sizes)
    status, answer = dra_extender.filter(orjson.dumps(filter_args(claim_pod("q", "odd"), ["n1", "n2"])))
    assert (status, answer["NodeNames"]) == (200, ["n1", "n2"])  # every node kube-scheduler found room on
    status, answer = dra_extender.filter(orjson.dumps(filter_args(claim_pod("r", "missing"), ["n1", "n2"])))
    assert (status, answer["NodeNames"]) == (200, ["n1", "n2"])


def test_odd_objects_are_counted_right_or_left_out_never_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    cache = ClusterCache(dra=True)
    cache.replace_nodes([bare_node("n1")])
    other = gpu_slice("n1", [("X", 40)])
    other["metadata"]["name"] = "n1-example.com"
    other["spec"]["driver"] = "example.com"
    broken = gpu_slice("n2", [("T4", 16)])
    broken["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    cache.replace_slices([gpu_slice("n1", [("T4", 16)]), other, broken])
    assert cache.usage() == {"n1": {0: 0}}  # another driver's devices on our node are not ours
    assert "lots" in caplog.text
    garbage = allocated(memory_claim("default", "g", 4), "n1", "gpu-0", consumed="a lot")
    shared = allocated(memory_claim("default", "shared", 4), "n1", "gpu-0")
    shared["status"]["reservedFor"] = [
        {"resource": "pods", "name": n, "uid": f"u-{n}"} for n in ("p1", "p2")
    ]  # two pods, one claim: its memory counted once
    foreign = allocated(memory_claim("default", "by-someone-else", 2), "n1", "gpu-0", "2Gi")
    cache.replace_claims([garbage, shared, foreign, {"metadata": {"name": "no-spec"}}])
    assert cache.usage() == {"n1": {0: 6}}
    assert "a lot" in caplog.text


def test_a_pod_sharing_an_allocated_claim_asks_nothing_more(dra_extender: Extender) -> None:
    kube: FakeKube = dra_extender.kube  # type: ignore[assignment]
    kube.put_object(CLAIMS, allocated(memory_claim("default", "shared", 8), "n1", "gpu-0", "8Gi"))
    wait_until(lambda: dra_extender.cache.claim("default", "shared")[1], what="the claim seen")
    status, answer = dra_extender.filter(orjson.dumps(filter_args(claim_pod("second", "shared"), ["n1", "n2"])))
    assert status == 200 and answer["Error"] == ""
    assert dra_extender.cache.usage()["n1"] == {0: 8, 1: 0}  # nothing held for a claim already allocated


def test_prioritize_ranks_a_claim_pod_by_its_gpus(dra_extender: Extender) -> None:
    kube: FakeKube = dra_extender.kube  # type: ignore[assignment]
    kube.put_object(CLAIMS, allocated(memory_claim("default", "old", 12), "n2", "gpu-0", "12Gi"))
    kube.put_object(CLAIMS, memory_claim("default", "c", 4))
    wait_until(lambda: dra_extender.cache.usage()["n2"][0] == 12, what="the allocated claim counted")
    status, scores = dra_extender.prioritize(orjson.dumps(filter_args(claim_pod("p", "c"), ["n1", "n2"])))
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert status == 200 and by_host["n2"] > by_host["n1"]  # binpack: 4 GiB fits the fuller GPU exactly
