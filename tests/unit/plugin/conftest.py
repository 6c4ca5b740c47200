"""Fixtures of the plugin tests; the helpers live in simnode.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tests.unit.plugin.simnode import SimNode
from tests.unit.plugin.simnode import start_node
from tests.unit.plugin.simnode import stop_node


@pytest.fixture
def sim_node() -> Iterator[SimNode]:
    node = start_node()
    yield node
    stop_node(node)
