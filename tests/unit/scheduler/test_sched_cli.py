"""`share-scheduler`: flags, print-config's shape against upstream field names, and a real server run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml

from share_scheduler.cli import build_parser
from share_scheduler.cli import main
from share_scheduler.config import scheduler_config

# Field names of kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1 types.go) that we use;
# kube-scheduler decodes this strictly, so an unknown or misspelt key would stop it from starting.
TOP_FIELDS = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
}
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
LEADER_FIELDS = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
                 "resourceNamespace"}  # fmt: skip
DEFAULT_SCORE_PLUGINS = {
    "TaintToleration", "NodeAffinity", "NodeResourcesFit", "PodTopologySpread", "InterPodAffinity",
    "NodeResourcesBalancedAllocation", "ImageLocality", "VolumeBinding",
}  # fmt: skip


def test_print_config_shape(capsys):
    assert main(["print-config", "--extender-url", "http://10.0.0.1:9999/gpushare-scheduler/", "--kubeconfig",
                 "/etc/kubernetes/scheduler.conf"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("# KubeSchedulerConfiguration")
    cfg = yaml.safe_load(out)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    assert set(cfg) <= TOP_FIELDS
    assert set(cfg["leaderElection"]) <= LEADER_FIELDS and cfg["leaderElection"]["leaderElect"] is True
    assert cfg["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert cfg["percentageOfNodesToScore"] == 100
    (profile,) = cfg["profiles"]
    assert set(profile) <= {"schedulerName", "plugins", "pluginConfig", "percentageOfNodesToScore"}
    assert profile["schedulerName"] == "gpushare-scheduler"
    disabled = {p["name"] for p in profile["plugins"]["score"]["disabled"]}
    assert disabled <= DEFAULT_SCORE_PLUGINS and "NodeResourcesFit" in disabled
    (ext,) = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert ext["urlPrefix"] == "http://10.0.0.1:9999/gpushare-scheduler"
    assert (ext["filterVerb"], ext["bindVerb"], ext["preemptVerb"]) == ("filter", "bind", "preempt")
    assert "prioritizeVerb" not in ext and "weight" not in ext  # filter keeps the policy's best nodes
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    # No managedResources: kube-scheduler (HTTPExtender.IsInterested) calls us for every pod of the profile.
    assert "managedResources" not in ext
    assert ext["httpTimeout"].endswith("s")


def test_print_config_fitting_ranks_with_a_dominant_weight(capsys):
    assert main(["print-config", "--filter-keeps", "fitting"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    disabled = {p["name"] for p in cfg["profiles"][0]["plugins"]["score"]["disabled"]}
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["weight"] >= 1
    # One step of our score (1 x weight x 10) outweighs every default score plugin left on (weight x 100).
    default_weights = {"TaintToleration": 3, "NodeAffinity": 2, "InterPodAffinity": 2, "VolumeBinding": 1}
    left_on = sum(w for name, w in default_weights.items() if name not in disabled) * 100
    assert ext["weight"] * 10 > left_on


def test_print_config_defaults():
    cfg = scheduler_config()
    assert cfg["extenders"][0]["urlPrefix"] == "http://127.0.0.1:12345/gpushare-scheduler"
    assert "clientConnection" not in cfg
    assert scheduler_config(leader_elect=False)["leaderElection"]["leaderElect"] is False


def test_serve_flags():
    args = build_parser().parse_args([])
    assert (args.port, args.bind_address, args.policy, args.memory_unit) == (12345, "0.0.0.0", "binpack", "GiB")
    args = build_parser().parse_args(
        ["serve", "--port", "8080", "--bind-address", "127.0.0.1", "--policy", "spread", "--threads", "4"]
    )
    assert (args.port, args.bind_address, args.policy, args.threads) == (8080, "127.0.0.1", "spread", 4)


def test_hold_yield_after_flag(capsys):
    """Unset by default (reservations never yield); a number of seconds; empty is unset; negative refused."""
    from share_scheduler.cli import starvation_config

    assert starvation_config(build_parser().parse_args([])).yield_after is None
    assert starvation_config(build_parser().parse_args(["--hold-yield-after", "0"])).yield_after == 0.0
    assert starvation_config(build_parser().parse_args(["serve", "--hold-yield-after", "90"])).yield_after == 90.0
    assert build_parser().parse_args(["--hold-yield-after", ""]).hold_yield_after is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--hold-yield-after", "soon"])
    assert "expected a number of seconds" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hold yield bound"):
        starvation_config(build_parser().parse_args(["--hold-yield-after", "-5"])).check()
    assert main(["--hold-yield-after", "-5"]) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _dead_kubeconfig(tmp_path):
    """A kubeconfig naming an API server that is not there."""
    dead = _free_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{dead}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return kubeconfig


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--bind-address", "127.0.0.1", "--port", str(port), "--kubeconfig", str(_dead_kubeconfig(tmp_path))]
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            main(argv)


def test_server_serves(tmp_path):
    """The real server process; no API server behind it, so healthy but never ready. SIGTERM ends it cleanly."""
    kubeconfig = _dead_kubeconfig(tmp_path)
    port = _free_port()
    cmd = [sys.executable, "-m", "share_scheduler.cli", "--bind-address", "127.0.0.1", "--port", str(port),
           "--kubeconfig", str(kubeconfig), "--threads", "2", "--log-level", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/healthz")
                assert b"ok" in body
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "share-scheduler did not start"
                time.sleep(0.1)
        assert status == 200
        assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 503
        assert _get(f"http://127.0.0.1:{port}/version")[0] == 200
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/gpushare-scheduler/filter",
            data=b'{"Pod": {}, "NodeNames": ["a"]}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=2) as resp:
            assert resp.status == 200 and b"still syncing" in resp.read()  # every pod waits for the cache
        metrics = _get(f"http://127.0.0.1:{port}/metrics")[1]
        assert b'gpushare_extender_request_seconds_count{verb="filter"} 1.0' in metrics
    finally:
        proc.terminate()  # the process this test started, by its PID
        assert proc.wait(timeout=15) == 0


def test_serve_flags_before_or_after_the_command_mean_the_same() -> None:
    from share_scheduler.cli import build_parser

    parser = build_parser()
    for argv in (["--kubeconfig", "K", "--port", "7", "serve"], ["serve", "--kubeconfig", "K", "--port", "7"]):
        args = parser.parse_args(argv)
        assert (args.kubeconfig, args.port, args.policy) == ("K", 7, "binpack"), argv
    assert parser.parse_args(["serve"]).port == 12345
