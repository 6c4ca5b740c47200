"""Chart tests: helm comes from hack/build-k8s.sh's cache; a missing helm fails the session, never skips."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.unit.chart import helm as helm_mod  # noqa: E402


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary built by hack/build-k8s.sh (raises HelmError if it cannot be had)."""
    return helm_mod.helm_binary()
