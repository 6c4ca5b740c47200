"""The Dockerfile and `make image` (hack/gpushare_image.py) describe one image: same packages list,
same setup script, same ENV, USER, WORKDIR and CMD."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hack import gpushare_image  # noqa: E402

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _runtime_stage() -> str:
    stages = re.split(r"^FROM ", DOCKERFILE, flags=re.M)
    return stages[-1]


def _instruction(stage: str, name: str) -> str:
    """The last `name` instruction of the stage, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", stage)
    found = re.findall(rf"^{name} (.+)$", joined, flags=re.M)
    assert found, f"no {name} in the Dockerfile's runtime stage"
    return found[-1].strip()


def test_both_ways_install_from_the_same_files():
    runtime = _runtime_stage()
    assert "hack/image/packages.txt" in runtime and "sh /tmp/image/setup.sh /wheels" in runtime
    assert "hack/image/packages.txt" in DOCKERFILE.split("# ---- runtime")[0]  # the build stage's python too
    assert gpushare_image.packages() == ["python3", "python3-venv"]
    assert "FROM ${DEBIAN_IMAGE}" in DOCKERFILE and f"debian:{gpushare_image.SUITE}-slim" in DOCKERFILE


def test_runtime_config_matches():
    runtime = _runtime_stage()
    cfg = gpushare_image.DOCKERFILE_CONFIG
    assert _instruction(runtime, "USER") == cfg["user"]
    assert _instruction(runtime, "WORKDIR") == cfg["working_dir"]
    assert json.loads(_instruction(runtime, "CMD")) == cfg["cmd"]
    env = _instruction(runtime, "ENV").split()
    assert env == cfg["env"]


def test_user_matches_the_charts_scheduler():
    values = (REPO / "charts" / "gpushare" / "values.yaml").read_text()
    uid, gid = gpushare_image.USER.split(":")
    assert f"runAsUser: {uid}" in values and f"runAsGroup: {gid}" in values
    setup = (REPO / "hack" / "image" / "setup.sh").read_text()
    assert f"--uid {uid} --gid {gid}" in setup
