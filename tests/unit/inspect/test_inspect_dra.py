"""`kubectl inspect gpushare` on DRA nodes: the gpushare.io ResourceSlices and allocated ResourceClaims (shaped
as resource.k8s.io/v1 serves them) in the same table as the device plugin's annotation-based nodes."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from share_core.contract import MemoryUnit
from share_inspect.cli import CLAIMS_PATH
from share_inspect.cli import SLICES_PATH
from share_inspect.cli import main
from share_inspect.dra import DRA_DRIVER
from share_inspect.dra import dra_state
from share_inspect.dra import quantity_mib
from share_inspect.render import render_details
from share_inspect.render import render_summary
from share_inspect.report import MODE_DEVICE_PLUGIN
from share_inspect.report import MODE_DRA
from share_inspect.report import build_report
from share_inspect.report import report_to_dict
from tests.unit.inspect.inspect_cluster import NODES
from tests.unit.inspect.inspect_cluster import PODS
from tests.unit.inspect.test_inspect_cli import api_server  # noqa: F401  (fixture)


def device(index: int, model: str, memory: str, *, taints: list[dict] | None = None) -> dict[str, Any]:
    """One GPU as share-dra publishes it (the agreed names): gpu-<index>, attributes, capacity `memory`."""
    d: dict[str, Any] = {
        "name": f"gpu-{index}",
        "attributes": {
            "model": {"string": model},
            "uuid": {"string": f"GPU-{model[-3:]}-{index}"},
            "index": {"int": index},
        },
        "capacity": {
            "memory": {
                "value": memory,
                "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
            }
        },
        "allowMultipleAllocations": True,
    }
    if taints:
        d["taints"] = taints
    return d


def rslice(node: str, *devices: dict[str, Any], driver: str = DRA_DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-x7k2p"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


def claim(
    ns: str,
    name: str,
    results: list[tuple[str, str, str | None]],
    pods: tuple[str, ...] = (),
    driver: str = DRA_DRIVER,
) -> dict[str, Any]:
    """An allocated claim: (node, device, consumed memory or None) per result, reserved for `pods`."""
    res = []
    for i, (node, dev, mem) in enumerate(results):
        r: dict[str, Any] = {"request": f"req-{i}", "driver": driver, "pool": node, "device": dev}
        if mem is not None:
            r["consumedCapacity"] = {"memory": mem}
            r["shareID"] = f"5a0e{i}"
        res.append(r)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": res}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods],
        },
    }


def dra_node(name: str, ip: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"gpushare": "true"}}, "status": {"addresses": [
        {"type": "InternalIP", "address": ip}]}}  # fmt: skip


def live_pod(ns: str, name: str, node: str, phase: str = "Running") -> dict[str, Any]:
    """A pod with claims: no nvidia.com/gpu-mem limit, nothing the device-plugin view would count."""
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]},
        "status": {"phase": phase},
    }


DRA_NODES = [dra_node("dra-a", "10.0.1.1"), dra_node("dra-b", "10.0.1.2")]
SLICES = [
    rslice("dra-a", device(1, "Tesla T4", "16Gi"), device(0, "NVIDIA A100-SXM4-80GB", "80Gi")),
    rslice("dra-b", device(0, "Tesla T4", "16Gi", taints=[{"key": "xid", "value": "79", "effect": "NoSchedule"}])),
    rslice("other", device(0, "Some NIC", "1Gi"), driver="nic.example.com"),
]
CLAIMS = [
    claim("ml", "trainer-gpu-x1", [("dra-a", "gpu-0", "4Gi")], ("trainer",)),
    claim("ml", "shared-gpu-x2", [("dra-a", "gpu-0", "6Gi")], ("eval-1", "eval-2")),
    claim("ml", "two-gpus-x3", [("dra-a", "gpu-0", "8Gi"), ("dra-a", "gpu-1", "8Gi")], ("worker",)),
    claim("batch", "left-over-x4", [("dra-b", "gpu-0", "2Gi")]),
    claim("ml", "nic-x5", [("other", "gpu-0", "1Gi")], ("trainer",), driver="nic.example.com"),
    {"metadata": {"namespace": "ml", "name": "pending-x6"}, "spec": {}, "status": {}},  # not allocated
]
DRA_PODS = [
    live_pod("ml", "trainer", "dra-a"),
    live_pod("ml", "eval-1", "dra-a"),
    live_pod("ml", "eval-2", "dra-a", phase="Pending"),
    live_pod("ml", "worker", "dra-a", phase="Pending"),
]


def report(unit: MemoryUnit | None = None, nodes: list | None = None, pods: list | None = None, **kw: Any) -> Any:
    state = dra_state(kw.get("slices", SLICES), kw.get("claims", CLAIMS))
    return build_report(DRA_NODES if nodes is None else nodes, DRA_PODS if pods is None else pods, unit=unit, dra=state)


# ------------------------------------------------------------------------------------ the model


@pytest.mark.parametrize(
    ("value", "mib"), [("80Gi", 81920), ("4096Mi", 4096), ("16G", 15258), ("1073741824", 1024), (1048576, 1)]
)
def test_quantity_mib(value: Any, mib: int) -> None:
    assert quantity_mib(value, "x") == mib


def test_gpus_come_from_the_drivers_slices_only() -> None:
    state = dra_state(SLICES, [])
    assert sorted(state.gpus) == ["dra-a", "dra-b"]
    a = state.gpus["dra-a"]
    assert [(g.index, g.device, g.model, g.memory_mib) for g in a] == [
        (0, "gpu-0", "NVIDIA A100-SXM4-80GB", 81920),
        (1, "gpu-1", "Tesla T4", 16384),
    ]
    assert a[0].uuid == "GPU-0GB-0" and a[0].healthy
    assert not state.gpus["dra-b"][0].healthy, "a NoSchedule device taint takes no new claims"


def test_claims_give_memory_per_device_and_pods() -> None:
    state = dra_state(SLICES, CLAIMS)
    got = {(c.namespace, c.name): (c.node, c.devices, c.pods) for c in state.claims}
    assert got == {
        ("ml", "trainer-gpu-x1"): ("dra-a", {"gpu-0": 4096}, [("ml", "trainer")]),
        ("ml", "shared-gpu-x2"): ("dra-a", {"gpu-0": 6144}, [("ml", "eval-1"), ("ml", "eval-2")]),
        ("ml", "two-gpus-x3"): ("dra-a", {"gpu-0": 8192, "gpu-1": 8192}, [("ml", "worker")]),
        ("batch", "left-over-x4"): ("dra-b", {"gpu-0": 2048}, []),
    }
    assert not state.problems


def test_report_counts_every_allocated_claim_once() -> None:
    r = report()
    a, b = r.nodes
    assert (a.name, a.mode, a.address, b.name, b.mode) == ("dra-a", MODE_DRA, "10.0.1.1", "dra-b", MODE_DRA)
    assert [(g.index, g.allocated, g.total, g.healthy) for g in a.gpus] == [(0, 18, 80, True), (1, 8, 16, True)]
    assert [(g.index, g.allocated, g.total, g.healthy) for g in b.gpus] == [(0, 2, 16, False)]
    rows = {(p.namespace, p.name): (p.state, p.claim, p.gpus) for p in a.pods}
    assert rows == {
        ("ml", "trainer"): ("assigned", "trainer-gpu-x1", {0: 4}),
        ("ml", "eval-1,eval-2"): ("assigned", "shared-gpu-x2", {0: 6}),  # 6 GiB once, for both pods
        ("ml", "worker"): ("allocating", "two-gpus-x3", {0: 8, 1: 8}),
    }
    assert [(p.name, p.state) for p in b.pods] == [("left-over-x4", "unused")]
    assert (r.allocated, r.total) == (28, 112)


def test_finished_pods_do_not_name_a_claim_but_it_still_holds_memory() -> None:
    r = report(pods=[p for p in DRA_PODS if p["metadata"]["name"] != "trainer"])
    row = next(p for p in r.nodes[0].pods if p.claim == "trainer-gpu-x1")
    assert (row.name, row.state, row.gpus) == ("trainer-gpu-x1", "unused", {0: 4})
    assert r.nodes[0].gpus[0].allocated == 18


def test_claim_without_consumed_capacity_holds_the_whole_gpu() -> None:
    r = report(claims=[claim("ml", "exclusive", [("dra-b", "gpu-0", None)], ("trainer",))])
    assert r.nodes[1].gpus[0].allocated == 16


def test_mib_unit_is_exact_and_gib_rounds_allocations_up() -> None:
    odd = [claim("ml", "odd", [("dra-a", "gpu-1", "1536Mi")], ("trainer",))]
    assert report(MemoryUnit.MiB, claims=odd).nodes[0].gpus[1].allocated == 1536
    assert report(claims=odd).nodes[0].gpus[1].allocated == 2, "1.5 GiB taken shows as 2, never 1"


def test_same_table_as_device_plugin_nodes() -> None:
    r = report(nodes=NODES + DRA_NODES, pods=PODS + DRA_PODS)
    modes = {n.name: n.mode for n in r.nodes}
    assert modes["dra-a"] == MODE_DRA and modes["gpu-a"] == MODE_DEVICE_PLUGIN
    plain = build_report(NODES, PODS)
    assert r.allocated == plain.allocated + 28 and r.total == plain.total + 112
    text = render_summary(r)
    header = text.splitlines()[0].split()
    assert header[:3] == ["NAME", "IPADDRESS", "MODE"]
    line = next(x for x in text.splitlines() if x.startswith("dra-a"))
    assert line.split()[:5] == ["dra-a", "10.0.1.1", "dra", "18/80", "8/16"]
    assert next(x for x in text.splitlines() if x.startswith("gpu-a")).split()[2] == "deviceplugin"


def test_summary_without_dra_has_no_mode_column() -> None:
    assert "MODE" not in render_summary(build_report(NODES, PODS))
    assert "MODE" not in render_summary(build_report(NODES, PODS, dra=dra_state([], [])))


def test_details_name_the_claims() -> None:
    text = render_details(report())
    assert "MODE:       dra" in text
    lines = text.splitlines()
    header = next(x for x in lines if x.startswith("NAME ") and "NAMESPACE" in x).split()
    assert header == ["NAME", "NAMESPACE", "CLAIM", "GPU0(Allocated)", "GPU1(Allocated)"]
    worker = next(x for x in lines if x.startswith("worker"))
    assert worker.split() == ["worker", "(allocating)", "ml", "two-gpus-x3", "8", "8"]
    assert any(x.split()[:3] == ["left-over-x4", "(unused)", "batch"] for x in lines)
    assert "Allocated:" in text and "18 (22%)" in text


def test_json_marks_mode_and_claim() -> None:
    data = report_to_dict(report(nodes=NODES + DRA_NODES, pods=PODS + DRA_PODS))
    nodes = {n["name"]: n for n in data["nodes"]}
    assert nodes["dra-a"]["mode"] == "dra" and nodes["gpu-a"]["mode"] == "deviceplugin"
    shared = next(p for p in nodes["dra-a"]["pods"] if p.get("claim") == "shared-gpu-x2")
    assert shared == {
        "namespace": "ml",
        "name": "eval-1,eval-2",
        "state": "assigned",
        "allocated": 6,
        "gpus": [{"index": 0, "allocated": 6}],
        "claim": "shared-gpu-x2",
    }
    assert all("claim" not in p for p in nodes["gpu-a"]["pods"])


def test_node_filter_applies_to_dra_nodes() -> None:
    state = dra_state(SLICES, CLAIMS)
    r = build_report(DRA_NODES, DRA_PODS, node_names=["dra-b"], dra=state)
    assert [n.name for n in r.nodes] == ["dra-b"]


# ------------------------------------------------------------------------------------- bad input


def test_garbage_devices_and_claims_are_problems_not_crashes() -> None:
    bad_dev = device(3, "X", "lots")
    no_index = device(4, "Y", "8Gi")
    del no_index["attributes"]["index"]
    slices = [rslice("dra-a", device(0, "A", "8Gi"), bad_dev, no_index), {"spec": {"driver": DRA_DRIVER}}]
    claims = [
        claim("ml", "ghost", [("dra-a", "gpu-9", "1Gi")], ("trainer",)),
        claim("ml", "weird", [("dra-a", "gpu-0", "-3Gi")], ("trainer",)),
    ]
    r = report(slices=slices, claims=claims)
    assert [g.index for g in r.nodes[0].gpus] == [0]
    problems = "\n".join(r.problems)
    assert "gpu-3 memory: 'lots' is not a valid quantity" in problems
    assert "gpu-4: attribute index is None" in problems
    assert "claim ml/ghost: device gpu-9 of pool dra-a is in no gpushare.io slice" in problems
    assert "claim ml/weird memory: '-3Gi' is negative" in problems
    assert "no node" in problems


def test_a_node_in_both_modes_is_reported() -> None:
    slices = [rslice("gpu-a", device(0, "A", "8Gi"))]
    r = report(nodes=NODES, pods=PODS, slices=slices, claims=[])
    row = next(n for n in r.nodes if n.name == "gpu-a")
    assert row.mode == MODE_DEVICE_PLUGIN and len([n for n in r.nodes if n.name == "gpu-a"]) == 1
    assert any("also publishes gpushare.io ResourceSlices" in p for p in row.problems)


# ------------------------------------------------------------------------------------- through the CLI


def test_cli_reads_slices_and_claims_from_the_api(api_server: Any) -> None:  # noqa: F811
    kubeconfig, handler = api_server
    handler.dra = {SLICES_PATH: SLICES[:2], CLAIMS_PATH: CLAIMS}
    out, err = io.StringIO(), io.StringIO()
    assert main(["--kubeconfig", str(kubeconfig), "-o", "json"], stdout=out, stderr=err) == 0, err.getvalue()
    nodes = {n["name"]: n for n in json.loads(out.getvalue())["nodes"]}
    assert nodes["dra-a"]["allocated"] == 26 and nodes["dra-b"]["allocated"] == 2
    assert nodes["dra-a"]["ipAddress"] == "", "the fake server's node list has no dra-a: shown without address"
    assert nodes["gpu-a"]["mode"] == "deviceplugin"
    paths = [r.split("?")[0] for r in handler.requests]
    assert paths.count(SLICES_PATH) == 1 and paths.count(CLAIMS_PATH) == 2, "paginated: 6 claims, pages of 3"
    out = io.StringIO()
    assert main(["--kubeconfig", str(kubeconfig), "dra-b"], stdout=out, stderr=io.StringIO()) == 0
    assert "dra-b" in out.getvalue() and "2/16!" in out.getvalue()


def test_cli_without_permission_on_claims_warns(api_server: Any) -> None:  # noqa: F811
    kubeconfig, handler = api_server
    handler.dra = {SLICES_PATH: SLICES[:2], CLAIMS_PATH: CLAIMS}
    handler.forbidden = {CLAIMS_PATH}  # this user may list slices, not claims
    out, err = io.StringIO(), io.StringIO()
    assert main(["--kubeconfig", str(kubeconfig)], stdout=out, stderr=err) == 0
    assert "warning: cannot list resourceclaims.resource.k8s.io: DRA allocations are not shown" in err.getvalue()
    assert "dra-a" in out.getvalue()


# ------------------------------------------------------------------------------- share-dra's own slices


def test_reads_the_slice_share_dra_publishes() -> None:
    """share_dra.slices builds what the plugin publishes: inspect must read exactly that."""
    import dataclasses

    from share_core.contract import DRA_UNHEALTHY_TAINT
    from share_dra.slices import resource_slice
    from share_dra.slices import slice_spec
    from share_node.backend.sim import SimBackend

    gpus = SimBackend("1xA100:80GiB,1xT4:16GiB", "n1").gpus()
    gpus[1] = dataclasses.replace(gpus[1], healthy=False)
    published = resource_slice(slice_spec("n1", gpus, MemoryUnit.GiB, 7, unhealthy=DRA_UNHEALTHY_TAINT))
    state = dra_state([published], [claim("ml", "c", [("n1", "gpu-1", "4Gi")], ("p",))])
    assert [(g.index, g.device, g.model, g.uuid, g.memory_mib, g.healthy) for g in state.gpus["n1"]] == [
        (0, "gpu-0", "NVIDIA A100-SXM4-80GB", gpus[0].uuid, 81920, True),
        (1, "gpu-1", "Tesla T4", gpus[1].uuid, 16384, False),  # tainted gpushare.io/unhealthy NoSchedule
    ]
    r = build_report([], [live_pod("ml", "p", "n1")], dra=state)
    assert [(g.allocated, g.total, g.healthy) for g in r.nodes[0].gpus] == [(0, 80, True), (4, 16, False)]
    assert "4/16!" in render_summary(r)
