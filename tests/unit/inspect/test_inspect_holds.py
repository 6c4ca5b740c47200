"""`kubectl inspect gpushare` shows GPU memory held for pods not bound yet, and for whom (the pods'
gpushare.io/holds annotations, share_core.holds)."""

from __future__ import annotations

import io
import json
import time

from share_core.contract import ANN_HOLDS
from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import encode_holds
from share_inspect.cli import main
from share_inspect.render import render_details
from share_inspect.render import render_summary
from share_inspect.report import build_report
from share_inspect.report import report_to_dict
from tests.unit.inspect.inspect_cluster import NODES
from tests.unit.inspect.inspect_cluster import PODS
from tests.unit.inspect.inspect_cluster import fake_cluster
from tests.unit.inspect.inspect_cluster import pod


def holder(name: str, holds: list[Hold], node: str | None = None) -> dict:
    p = pod("ml", name, node, 16)
    p["metadata"]["uid"] = f"uid-{name}"
    p["metadata"]["annotations"][ANN_HOLDS] = encode_holds(holds)
    return p


def reservation(node: str, gpus: tuple[int, ...], per_gpu: int, name: str, ttl: float = 300) -> Hold:
    return Hold(HoldKind.RESERVATION, node, gpus, per_gpu, 0, time.time() + ttl, f"uid-{name}", f"ml/{name}")


def test_live_holds_show_on_their_node_with_their_holder() -> None:
    now = time.time()
    big = holder("big", [reservation("gpu-a", (1,), 16, "big")])
    stale = holder("stale", [reservation("gpu-b", (0,), 8, "stale", ttl=-5)])  # expired: nothing
    spent = holder("spent", [reservation("gpu-b", (1,), 8, "spent")], node="gpu-b")  # bound: its own is spent
    report = build_report(NODES, [*PODS, big, stale, spent], now=now)
    nodes = {n.name: n for n in report.nodes}
    [held] = nodes["gpu-a"].held
    assert (held.kind, held.holder, held.gpus, held.per_gpu) == ("reservation", "ml/big", (1,), 16)
    assert 295 <= held.expires_in <= 301  # the annotation rounds the expiry up to the second
    assert nodes["gpu-b"].held == []
    doc = report_to_dict(report)
    assert doc["cluster"]["held"] == 16
    [node_a] = [n for n in doc["nodes"] if n["name"] == "gpu-a"]
    assert node_a["held"][0]["for"] == "ml/big" and node_a["held"][0]["gpus"] == [1]
    assert "Held(reservation):  16 GiB on GPU 1 for ml/big" in render_details(report)
    assert "Held for pods not bound yet: 16 GiB" in render_summary(report)


def test_a_garbled_holds_annotation_is_a_problem_not_a_crash() -> None:
    bad = pod("ml", "bad", None, 16, annotations={ANN_HOLDS: "[{"})
    report = build_report(NODES, [*PODS, bad], now=time.time())
    assert any("not JSON" in p for p in report.problems)
    assert all(n.held == [] for n in report.nodes)


def test_one_node_asked_still_shows_the_holds_of_unbound_pods() -> None:
    kube = fake_cluster()
    kube.add_pod(holder("big", [reservation("gpu-a", (1,), 16, "big")]))
    out = io.StringIO()
    assert main(["gpu-a", "-o", "json"], client=kube, stdout=out, stderr=io.StringIO()) == 0
    [node] = json.loads(out.getvalue())["nodes"]
    assert node["held"][0]["for"] == "ml/big"
