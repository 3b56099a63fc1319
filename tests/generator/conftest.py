"""The generator's own modules (they live in bindings/, not in the installed package)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BINDINGS = Path(__file__).resolve().parents[2] / "bindings"


@pytest.fixture(scope="session")
def generator() -> Callable[[str], ModuleType]:
    """Imports one of bindings/*.py by name; skips where the generator is not in the checkout."""
    if not (BINDINGS / "generate.py").is_file():
        pytest.skip("the generator is not in this checkout")
    if str(BINDINGS) not in sys.path:
        sys.path.insert(0, str(BINDINGS))
    return importlib.import_module
