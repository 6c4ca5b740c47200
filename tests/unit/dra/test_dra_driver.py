"""Prepare / Unprepare with their checkpoint (share_dra/driver.py), against an in-memory API and real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from share_dra.driver import CHECKPOINT_NAME
from share_dra.driver import ClaimRef
from tests.unit.dra.fakeapi import FakeDraApi
from tests.unit.dra.fakeapi import allocated_claim
from tests.unit.dra.node import make_driver


@pytest.fixture
def api() -> FakeDraApi:
    api = FakeDraApi()
    api.add_claim(allocated_claim("ns", "c1", "uid-1", [("n1", "gpu-1", "8Gi")]))
    api.add_claim(allocated_claim("ns", "c2", "uid-2", [("n1", "gpu-0", "3Gi")]))
    return api


def test_prepare_writes_a_spec_per_claim_and_checkpoints_it(tmp_path: Path, api: FakeDraApi) -> None:
    driver = make_driver(tmp_path, api)
    out = driver.prepare([ClaimRef("ns", "uid-1", "c1"), ClaimRef("ns", "uid-2", "c2")])
    assert out["uid-1"][0].cdi_device_ids == ("gpushare.io/gpu=uid-1-gpu-1",)
    assert out["uid-2"][0].cdi_device_ids == ("gpushare.io/gpu=uid-2-gpu-0",)
    files = sorted(p.name for p in (tmp_path / "cdi").iterdir())
    assert files == ["gpushare.io-claim_uid-1.json", "gpushare.io-claim_uid-2.json"]
    spec = json.loads((tmp_path / "cdi" / files[0]).read_text())
    assert "GPUSHARE_MEM_LIMIT_MIB=8192" in spec["devices"][0]["containerEdits"]["env"]
    saved = json.loads((tmp_path / "plugin" / CHECKPOINT_NAME).read_text())
    assert sorted(saved["claims"]) == ["uid-1", "uid-2"] and saved["version"] == 1


def test_prepare_is_idempotent_and_does_not_ask_the_api_again(tmp_path: Path, api: FakeDraApi) -> None:
    driver = make_driver(tmp_path, api)
    first = driver.prepare([ClaimRef("ns", "uid-1", "c1")])
    api.claims.clear()  # a second Prepare must answer from the checkpoint
    assert driver.prepare([ClaimRef("ns", "uid-1", "c1")]) == first
    # After a restart, too.
    assert make_driver(tmp_path, api).prepare([ClaimRef("ns", "uid-1", "c1")]) == first


def test_a_lost_spec_file_is_written_again(tmp_path: Path, api: FakeDraApi) -> None:
    driver = make_driver(tmp_path, api)
    driver.prepare([ClaimRef("ns", "uid-1", "c1")])
    spec = tmp_path / "cdi" / "gpushare.io-claim_uid-1.json"
    spec.unlink()
    assert not isinstance(driver.prepare([ClaimRef("ns", "uid-1", "c1")])["uid-1"], str)
    assert spec.exists()


def test_unprepare_after_a_restart_removes_exactly_what_prepare_made(tmp_path: Path, api: FakeDraApi) -> None:
    make_driver(tmp_path, api).prepare([ClaimRef("ns", "uid-1", "c1"), ClaimRef("ns", "uid-2", "c2")])
    (tmp_path / "cdi" / "nvidia.yaml").write_text("kind: nvidia.com/gpu\ndevices: []\n")
    restarted = make_driver(tmp_path, api)
    assert restarted.unprepare([ClaimRef("ns", "uid-1", "c1")]) == {"uid-1": ""}
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == ["gpushare.io-claim_uid-2.json", "nvidia.yaml"]
    assert sorted(json.loads((tmp_path / "plugin" / CHECKPOINT_NAME).read_text())["claims"]) == ["uid-2"]
    # Twice, or a claim never prepared here: nothing to do, no error.
    assert restarted.unprepare([ClaimRef("ns", "uid-1", "c1"), ClaimRef("ns", "uid-9", "c9")]) == {
        "uid-1": "",
        "uid-9": "",
    }


def test_prepare_errors_are_per_claim_and_name_the_claim(tmp_path: Path, api: FakeDraApi) -> None:
    api.add_claim({"metadata": {"namespace": "ns", "name": "pending", "uid": "uid-p"}, "status": {}})
    out = make_driver(tmp_path, api).prepare(
        [
            ClaimRef("ns", "uid-1", "c1"),
            ClaimRef("ns", "uid-x", "gone"),
            ClaimRef("ns", "uid-old", "c2"),
            ClaimRef("ns", "uid-p", "pending"),
        ]
    )
    assert not isinstance(out["uid-1"], str)
    assert "ns/gone" in out["uid-x"] and "gone" in out["uid-x"]
    assert "now has UID uid-2" in out["uid-old"]
    assert "not allocated" in out["uid-p"]
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == ["gpushare.io-claim_uid-1.json"]


def test_nvidias_spec_on_the_node_is_referenced(tmp_path: Path, api: FakeDraApi) -> None:
    etc = tmp_path / "etc-cdi"
    etc.mkdir()
    (etc / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-bbbb\n  containerEdits: {}\n"
    )
    (etc / "broken.json").write_text("{not json")
    out = make_driver(tmp_path, api, (str(etc), str(tmp_path / "cdi"))).prepare([ClaimRef("ns", "uid-1", "c1")])
    assert out["uid-1"][0].cdi_device_ids == ("gpushare.io/gpu=uid-1-gpu-1", "nvidia.com/gpu=GPU-bbbb")


def test_an_unreadable_checkpoint_stops_the_start_with_a_clear_error(tmp_path: Path, api: FakeDraApi) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / CHECKPOINT_NAME).write_text("{")
    with pytest.raises(RuntimeError, match=r"unreadable .* move it away"):
        make_driver(tmp_path, api)
