"""The generator's own code: short functions, and no module reaching into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CODEGEN = Path(__file__).resolve().parents[2] / "codegen"
SOURCES = sorted(CODEGEN.glob("*.py"))
MAX_LINES = 80


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_function_is_longer_than_80_lines(path: Path) -> None:
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(_tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_LINES]
    assert long == [], f"{path.name}: split {', '.join(long)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_module_uses_another_modules_private_names(path: Path) -> None:
    local = {p.stem for p in SOURCES}
    used = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module in local:
            used += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in local \
                and node.attr.startswith("_"):
            used.append(f"{node.value.id}.{node.attr}")
    assert used == [], f"{path.name} uses {used}"


def test_the_generator_sources_are_found() -> None:
    if not SOURCES:
        pytest.skip("the generator is not in this checkout")
    assert {"generate.py", "roles.py", "ir_types.py"} <= {p.name for p in SOURCES}
