"""`share-dra`'s command line: what it refuses, and why (it never starts serving half configured)."""

from __future__ import annotations

import pytest

from share_dra.cli import build_parser
from share_dra.cli import main


def test_node_name_is_required(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["--backend=sim"]) == 2
    assert "--node-name" in caplog.text


def test_a_bad_sim_spec_is_explained(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["--node-name=n", "--backend=sim", "--sim-gpus=lots"]) == 1
    assert "COUNTxMODEL:SIZE" in caplog.text


def test_a_missing_kubeconfig_is_explained(caplog: pytest.LogCaptureFixture, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["--node-name=n", "--backend=sim", f"--kubeconfig={tmp_path / 'none'}"]) == 1
    assert "cannot load the Kubernetes client configuration" in caplog.text


def test_defaults_are_kubelets_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "GPUSHARE_PLUGINS_REGISTRY_DIR",
        "GPUSHARE_DRA_PLUGIN_DIR",
        "GPUSHARE_CDI_DIR",
        "GPUSHARE_DRA_UNHEALTHY",
    ):
        monkeypatch.delenv(var, raising=False)
    args = build_parser().parse_args([])
    assert args.plugins_registry_dir == "/var/lib/kubelet/plugins_registry"
    assert args.plugin_dir == "/var/lib/kubelet/plugins/gpushare.io"
    assert args.cdi_dir == "/var/run/cdi"
    assert args.unhealthy == "withdraw"
