"""Coverage audit: every C function of the pinned nccl.h is bound or excluded with a reason.

The header is read here with a regex, independently of the libclang-based generator.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpbind.bindings import _coverage, nccl

WHEEL = "nvidia-nccl-cu13"
# Host API declarations of nccl.h: `ncclResult_t ncclX(`, `const char* ncclX(`, `void ncclX(`.
# Each also has a `pnccl` profiling twin, which the pattern does not match.
DECLARATION = re.compile(r"^[ \t]*(?:ncclResult_t|const[ \t]+char[ \t]*\*|void)[ \t]+(nccl\w+)[ \t]*\(", re.M)
EXPECTED_DECLARATIONS = 73


@pytest.fixture(scope="module")
def header_functions() -> list[str]:
    try:
        dist = md.distribution(WHEEL)
    except md.PackageNotFoundError:
        pytest.skip(f"{WHEEL} is not installed: no pinned header to audit against")
    if dist.version != _coverage.PINNED["nccl"]:
        pytest.skip(f"{WHEEL} {dist.version} is installed; the bindings pin {_coverage.PINNED['nccl']}")
    header = Path(str(dist.locate_file("nvidia/nccl/include/nccl.h")))
    names = DECLARATION.findall(header.read_text())
    assert len(names) == len(set(names)), "a function is declared twice"
    return names


@pytest.fixture(scope="module")
def coverage() -> dict[str, tuple[str | None, str | None]]:
    return {c: (py, why) for c, py, why in _coverage.COVERAGE["nccl"]}


def test_header_declaration_count(header_functions: list[str]) -> None:
    assert len(header_functions) == EXPECTED_DECLARATIONS, sorted(header_functions)


def test_every_header_function_is_bound_or_excluded(
    header_functions: list[str], coverage: dict[str, tuple[str | None, str | None]]
) -> None:
    missing = sorted(set(header_functions) - coverage.keys())
    assert missing == [], f"declared in nccl.h but absent from the coverage table: {missing}"
    for name in header_functions:
        py, why = coverage[name]
        if py is None:
            assert why is not None and why.strip(), f"{name} is neither bound nor excluded with a reason"
        else:
            assert why is None, f"{name} is bound as {py} and also excluded ({why})"


def test_coverage_rows_are_unique(coverage: dict[str, tuple[str | None, str | None]]) -> None:
    rows = _coverage.COVERAGE["nccl"]
    assert len(rows) == len(coverage)
    bound = [py for py, _ in coverage.values() if py is not None]
    assert len(bound) == len(set(bound)), "two C functions share a Python name"


def test_every_bound_name_is_a_callable_of_the_module(coverage: dict[str, tuple[str | None, str | None]]) -> None:
    bound = {c: py for c, (py, _) in coverage.items() if py is not None}
    assert bound
    absent = sorted(f"{c} -> {py}" for c, py in bound.items() if not callable(getattr(nccl, py, None)))
    assert absent == []


def test_cli_json_agrees(coverage: dict[str, tuple[str | None, str | None]], tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mpbind", "coverage", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == set(_coverage.COVERAGE)
    assert data["nccl"]["pinned"] == _coverage.PINNED["nccl"]
    rows = {r["c_name"]: (r["python_name"], r["excluded"]) for r in data["nccl"]["functions"]}
    assert len(rows) == len(data["nccl"]["functions"])
    assert rows == coverage


def _bound_names() -> list[str]:
    return sorted(py for _, py, _ in _coverage.COVERAGE["nccl"] if py is not None)


@pytest.mark.parametrize("name", _bound_names())
def test_wrong_argument_type_raises_type_error(name: str) -> None:
    fn = getattr(nccl, name)
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        pytest.skip("takes no arguments")
    required = [p for p in params if p.default is inspect.Parameter.empty]
    # object() for the first parameter; 0 converts for every other scalar (int, enum, handle,
    # address, float, bool) and is only looked at after the first parameter.
    args: list[object] = [object()] + [0] * max(len(required) - 1, 0)
    with pytest.raises(TypeError):
        fn(*args)
