"""bench_throughput: its side-by-side with the Go original (the configuration and pods it renders) and its rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from share_core.contract import RESOURCE_MEM
from tests.unit.benchload import load_bench

ROOT = Path(__file__).resolve().parents[2]


bench = load_bench("bench_throughput")
URL = "http://127.0.0.1:9/gpushare-scheduler"


@pytest.mark.parametrize("keeps", ["best", "fitting"])
def test_go_config_is_ours_with_its_resource_and_verbs(keeps: str) -> None:
    ours = bench.print_config(ROOT, URL, keeps)
    go = bench.go_extender_config(ours)
    assert go["profiles"] == ours["profiles"]
    assert go["percentageOfNodesToScore"] == ours["percentageOfNodesToScore"]
    (ext,) = go["extenders"]
    assert ext["urlPrefix"] == URL and ext["filterVerb"] == "filter" and ext["bindVerb"] == "bind"
    assert ext["nodeCacheCapable"] is True  # its filter reads args.NodeNames only
    assert ext["managedResources"] == [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}]
    assert "prioritizeVerb" not in ext  # it serves no prioritize route
    assert "managedResources" not in ours["extenders"][0]  # ours left as it was: every pod reaches us


def test_go_config_refuses_verbs_it_does_not_serve() -> None:
    ours = bench.print_config(ROOT, URL, "best")
    ours["extenders"][0]["filterVerb"] = "predicates"
    with pytest.raises(ValueError, match="filter and bind only"):
        bench.go_extender_config(ours)


def test_running_pod_for_both_extenders_carries_both_records() -> None:
    both = (RESOURCE_MEM, bench.GO_RESOURCE_MEM)
    pod = bench.pod_body("r1", "gpushare-scheduler", 4, "node-00001", 3, both, 80)
    assert pod["spec"]["nodeName"] == "node-00001"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {RESOURCE_MEM: "4", "aliyun.com/gpu-mem": "4"}
    ann = pod["metadata"]["annotations"]
    assert ann["ALIYUN_COM_GPU_MEM_IDX"] == "3" and ann["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert ann["ALIYUN_COM_GPU_MEM_DEV"] == "80" and ann["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"
    assert any(v == "3" for k, v in ann.items() if not k.startswith("ALIYUN_"))  # our GPU index too


def test_pending_go_pod_asks_its_resource_only() -> None:
    pod = bench.pod_body("p1", "gpushare-scheduler", 2, resources=(bench.GO_RESOURCE_MEM,))
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"aliyun.com/gpu-mem": "2"}
    assert "nodeName" not in pod["spec"] and "annotations" not in pod["metadata"]


def test_timing_proxy_forwards_and_times_each_verb() -> None:
    import http.server
    import threading
    import urllib.request

    class Upstream(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            data = b'{"echo":' + body + b',"path":"' + self.path.encode() + b'"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    proxy = bench.TimingProxy(f"http://127.0.0.1:{upstream.server_address[1]}")
    try:
        for verb in ("filter", "bind", "bind"):
            req = urllib.request.Request(f"{proxy.url}/gpushare-scheduler/{verb}", data=b"1", method="POST")
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.read() == b'{"echo":1,"path":"/gpushare-scheduler/' + verb.encode() + b'"}'
        lat = proxy.latency()
        assert set(lat) == {"filter", "bind"} and len(proxy.times["bind"]) == 2
        assert 0 < lat["bind"]["p50"] <= lat["bind"]["p99"] < 10_000
    finally:
        proxy.stop()
        upstream.shutdown()
        upstream.server_close()


def test_rounds_alternate_so_no_scenario_always_runs_first() -> None:
    scenarios = [bench.Scenario("alone", 1000), bench.Scenario("binpack", 1000, "binpack")]
    scenarios.append(bench.Scenario("frag", 1000, "frag"))
    orders = [[sc.label for sc in bench.round_order(scenarios, r)] for r in range(4)]
    assert orders == [["alone", "binpack", "frag"], ["frag", "binpack", "alone"]] * 2
    assert [sc.label for sc in scenarios] == ["alone", "binpack", "frag"]  # the caller's list is left as it was
