"""Fixtures of the generator's tests: its modules (they live in codegen/, not in the package)
and a scratch copy of the tree it writes."""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
CODEGEN = REPO / "codegen"


@pytest.fixture(scope="session")
def generator() -> Callable[[str], ModuleType]:
    """Imports one of the generator's modules by name (generate, roles, emit_python, ...)."""
    if not (CODEGEN / "generate.py").is_file():
        pytest.skip("the generator is not in this checkout")
    if str(CODEGEN) not in sys.path:
        sys.path.insert(0, str(CODEGEN))
    return importlib.import_module


@pytest.fixture(scope="module")
def generate(generator: Callable[[str], ModuleType]) -> ModuleType:
    return generator("generate")


@pytest.fixture()
def tree_copy(tmp_path: Path, generator: Callable[[str], ModuleType]) -> Path:
    """The generator and every generated file, copied so that it can run on an edited copy."""
    root = tmp_path / "repo"
    shutil.copytree(CODEGEN, root / "codegen", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "src" / "mpbind", root / "src" / "mpbind",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.cpp"))
    return root
