"""A bench/ script loaded as a module, for the unit tests of its pure parts (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_bench(script: str) -> ModuleType:
    """bench/<script>.py, imported once under its own name."""
    spec = importlib.util.spec_from_file_location(script, ROOT / "bench" / f"{script}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
