"""Golden renderings of NVSHMEM per-type family dispatchers and their stub lines."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE_GOLDEN = os.environ.get("MPBIND_UPDATE_GOLDEN") == "1"
STUB_MARKER = "# --- stub ---"

# A plain copy operation, a scalar put whose value type differs per member (int | float),
# and an on-stream reduction whose members are a subset of the family types.
FAMILIES = ["put", "p", "sum_reduce_on_stream"]


@pytest.fixture(scope="module")
def library(generate: ModuleType) -> Any:
    return generate.load_library("nvshmem")


def _render(generator: Callable[[str], ModuleType], lib: Any, op: str) -> str:
    emit_python, emit_stubs = generator("emit_python"), generator("emit_stubs")
    lines: list[str] = emit_python._families(lib)
    table = next(i for i, line in enumerate(lines) if line.startswith(f"_FAMILY_{op} = "))
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {op}("))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ")), len(lines))
    body = "\n".join([lines[table], *lines[start:end]]).rstrip() + "\n"
    lines = emit_stubs.stub(lib).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(f"def {op}(")]
    assert len(starts) == 1, starts
    stop = next((i for i in range(starts[0] + 1, len(lines)) if lines[i][:1] not in ("", " ")), len(lines))
    stub = "\n".join(lines[starts[0]:stop])
    return f"{body}{STUB_MARKER}\n{stub}\n"


@pytest.mark.parametrize("op", FAMILIES)
def test_golden_family_rendering(generator: Callable[[str], ModuleType], library: Any, op: str) -> None:
    got = _render(generator, library, op)
    path = GOLDEN / f"family_{op}.txt"
    if UPDATE_GOLDEN:
        path.write_text(got)
    assert path.is_file(), f"no golden file {path.name}; run with MPBIND_UPDATE_GOLDEN=1"
    assert got == path.read_text(), f"rendering of family {op} differs from {path.name}"


@pytest.mark.parametrize("op", FAMILIES)
def test_rendering_is_what_the_module_was_built_from(generator: Callable[[str], ModuleType], library: Any,
                                                     op: str) -> None:
    pyx = (REPO / "src" / "mpbind" / "bindings" / "nvshmem.pyx").read_text()
    pyi = (REPO / "src" / "mpbind" / "bindings" / "nvshmem.pyi").read_text()
    body, stub = _render(generator, library, op).split(f"{STUB_MARKER}\n")
    table, _, function = body.partition("\n")
    assert f"\n{table}\n" in pyx
    assert f"\n{function}" in pyx
    assert f"\n{stub}" in pyi
