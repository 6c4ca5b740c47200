"""The report model: the numbers, which pods count, units, and how little it asks of the API server."""

from __future__ import annotations

import io

import yaml

from share_core.accounting import node_usage
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.contract import MemoryUnit
from share_core.gpus import node_gpus
from share_inspect.cli import LIVE_PODS
from share_inspect.cli import main
from share_inspect.render import render_details
from share_inspect.render import render_json
from share_inspect.render import render_summary
from share_inspect.render import render_yaml
from share_inspect.report import SCHEMA_VERSION
from share_inspect.report import build_report
from share_inspect.report import report_to_dict
from tests.unit.inspect.inspect_cluster import NODES
from tests.unit.inspect.inspect_cluster import PODS
from tests.unit.inspect.inspect_cluster import fake_cluster
from tests.unit.inspect.inspect_cluster import gpu
from tests.unit.inspect.inspect_cluster import node
from tests.unit.inspect.inspect_cluster import pod


def by_name(report):
    return {n.name: n for n in report.nodes}


def test_only_gpu_share_nodes_sorted_by_name() -> None:
    report = build_report(NODES, PODS)
    assert [n.name for n in report.nodes] == ["gpu-a", "gpu-b", "gpu-c"]
    assert report.unit is MemoryUnit.GiB


def test_finished_unbound_and_foreign_pods_do_not_count() -> None:
    nodes = by_name(build_report(NODES, PODS))
    names = {p.name for n in nodes.values() for p in n.pods}
    assert names == {"train-a", "infer-b", "multi", "waiting", "on-sick-gpu", "notebook"}
    assert nodes["gpu-a"].gpus[0].allocated == 40  # "done" (Succeeded, 20) is not counted
    assert nodes["gpu-b"].gpus[3].allocated == 0  # "failed" (Failed, 16) is not counted


def test_numbers_agree_with_share_core_accounting() -> None:
    """Inspect and the extender use the same accounting: per-GPU numbers must be identical."""
    report = by_name(build_report(NODES, PODS))
    for n in NODES:
        name = n["metadata"]["name"]
        if name not in report:
            continue
        usage = node_usage(node_gpus(n), [p for p in PODS if p["spec"].get("nodeName") == name])
        assert [(g.index, g.used, g.total, g.healthy) for g in usage.gpus] == [
            (g.index, g.allocated, g.total, g.healthy) for g in report[name].gpus
        ]


def test_totals_add_up() -> None:
    report = build_report(NODES, PODS)
    nodes = by_name(report)
    assert (nodes["gpu-a"].allocated, nodes["gpu-a"].total) == (48, 96)  # heterogeneous: 80 + 16
    assert (nodes["gpu-b"].allocated, nodes["gpu-b"].total, nodes["gpu-b"].pending) == (24, 64, 4)
    assert (nodes["gpu-c"].allocated, nodes["gpu-c"].total) == (10, 48)  # capacity fallback: 2 x 24
    assert (report.allocated, report.total, report.pending) == (82, 208, 4)
    for n in report.nodes:
        assert n.allocated == sum(p.allocated for p in n.pods)


def test_pod_states() -> None:
    pods = {p.name: p for n in build_report(NODES, PODS).nodes for p in n.pods}
    assert pods["train-a"].state == "assigned"
    assert pods["infer-b"].state == "allocating"
    assert pods["waiting"].state == "pending" and pods["waiting"].pending == 4 and not pods["waiting"].gpus
    assert pods["multi"].gpus == {0: 8, 1: 8}


def test_garbage_annotations_are_problems_not_crashes() -> None:
    bad_node = node("gpu-x", "10.0.0.99", None, {RESOURCE_MEM: "16", RESOURCE_COUNT: "1"})
    bad_node["metadata"]["annotations"] = {ANN_NODE_GPUS: "{not json"}
    report = build_report([bad_node], [pod("ns", "p", "gpu-x", 4, (7,))])
    (n,) = report.nodes
    assert [g.total for g in n.gpus] == [16]  # fell back to capacity
    assert len(n.problems) == 2
    assert "is not JSON" in n.problems[0]
    assert "assigned GPU 7, which the node does not have" in n.problems[1]
    assert report.problems[0].startswith("node gpu-x: ")


def test_mib_nodes_detected_and_mixed_cluster_shown_in_mib() -> None:
    mib_node = node("mib", "10.0.1.1", [gpu("mib", 0, "Tesla T4", 15360)])
    gib_node = node("gib", "10.0.1.2", [gpu("gib", 0, "Tesla T4", 16)])
    pods = [pod("ns", "m", "mib", 2048, (0,)), pod("ns", "g", "gib", 2, (0,))]
    only_mib = build_report([mib_node], pods)
    assert only_mib.unit is MemoryUnit.MiB and only_mib.nodes[0].gpus[0].total == 15360
    mixed = by_name(build_report([mib_node, gib_node], pods))
    assert (mixed["gib"].gpus[0].allocated, mixed["gib"].gpus[0].total) == (2048, 16384)
    assert mixed["gib"].pods[0].gpus == {0: 2048}
    assert (mixed["mib"].gpus[0].allocated, mixed["mib"].gpus[0].total) == (2048, 15360)
    assert "GPU Memory(MiB)" in render_summary(build_report([mib_node, gib_node], pods))
    forced = build_report([gib_node], pods, unit=MemoryUnit.MiB)
    assert forced.unit is MemoryUnit.MiB and forced.nodes[0].gpus[0].total == 16  # told so: taken as MiB


def test_over_promised_gpu_is_shown_as_it_is() -> None:
    n = node("n", "10.0.2.1", [gpu("n", 0, "T4", 16)])
    report = build_report([n], [pod("a", "x", "n", 12, (0,)), pod("a", "y", "n", 12, (0,))])
    assert "24/16" in render_summary(report)
    assert "24 (150%)" in render_details(report)


def test_empty_report_renders() -> None:
    report = build_report([], [])
    assert report.nodes == [] and report.total == 0
    assert render_summary(report).endswith("0/0 (0%)\n")
    assert '"percent": 0.0' in render_json(report)


def test_schema_is_stable() -> None:
    data = report_to_dict(build_report(NODES, PODS))
    assert data["schemaVersion"] == SCHEMA_VERSION == "gpushare.io/inspect/v1"
    assert list(data) == ["schemaVersion", "unit", "nodes", "cluster"]
    assert list(data["nodes"][0]) == [
        *("name", "ipAddress", "allocated", "total", "pending", "gpus", "pods", "problems"),
        "mode",  # added with DRA mode: "deviceplugin" or "dra"
    ]
    assert list(data["nodes"][0]["gpus"][0]) == ["index", "uuid", "model", "healthy", "allocated", "total", "free"]
    assert list(data["nodes"][0]["pods"][0]) == ["namespace", "name", "state", "allocated", "gpus"]
    assert list(data["cluster"]) == ["nodes", "gpus", "unhealthyGpus", "allocated", "total", "pending", "percent"]


def test_two_list_calls_and_live_pod_selector() -> None:
    kube = fake_cluster()
    assert main([], client=kube, stdout=io.StringIO(), stderr=io.StringIO()) == 0
    assert dict(kube.calls) == {"list_nodes": 1, "list_pods": 1}
    assert LIVE_PODS == "status.phase!=Failed,status.phase!=Succeeded"


def test_one_node_lets_the_server_filter_pods() -> None:
    kube = fake_cluster()
    seen: list[str | None] = []
    real = kube.list_pods

    def spy(field_selector=None, label_selector=None):
        seen.append(field_selector)
        return real(field_selector, label_selector)

    kube.list_pods = spy  # type: ignore[method-assign]
    out = io.StringIO()
    assert main(["gpu-b"], client=kube, stdout=out, stderr=io.StringIO()) == 0
    # the node's pods, and the unbound ones (memory may be held on gpu-b for them: gpushare.io/holds)
    assert seen == [f"{LIVE_PODS},spec.nodeName=gpu-b", f"{LIVE_PODS},spec.nodeName="]
    assert "24/64 (37%)" in out.getvalue()


TRICKY = [
    "",
    "yes",
    "No",
    "null",
    "~",
    "1e3",
    "0x1F",
    "12:30",
    "1_000",
    ".inf",
    "10.0.0.11",
    "a: b",
    "a:",
    "#x",
    "x #y",
    "- x",
    "'q'",
    '"dq"',
    "trailing ",
    " leading",
    "tab\there",
    "new\nline",
    "ünïcode",
    "\u2028sep",
    "back\\slash",
    "{flow}",
    "[list]",
    "&anchor",
    "*alias",
    "!tag",
    "%pct",
    "@at",
    "`tick",
    "NVIDIA A100-SXM4-80GB",
    "GPU-1a2b",
]


def test_yaml_round_trips_any_string() -> None:
    """The hand-written YAML emitter must give a YAML reader back exactly the JSON document."""
    nodes = [node(f"n{i}", text, [gpu(f"n{i}", 0, text, 16)]) for i, text in enumerate(TRICKY)]
    pods = [pod(text or "ns", f"p{i}", f"n{i}", 2, (0,)) for i, text in enumerate(TRICKY)]
    report = build_report(nodes, pods)
    assert yaml.safe_load(render_yaml(report)) == report_to_dict(report)
    assert {g.model for n in report.nodes for g in n.gpus} == set(TRICKY)
