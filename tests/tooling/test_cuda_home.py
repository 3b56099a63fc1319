"""The layer's CUDA calls have one home and one error, read from the sources (no GPU needed).

* No module of ``src/mpbind`` raises a bare ``RuntimeError`` (``raise RuntimeError(...)`` or ``raise
  RuntimeError``): a failure is a class of :mod:`mpbind.errors`, whose ``LibraryError`` branch is
  still a ``RuntimeError`` for callers that catch that. Every ``.py`` file is read, the generated ones
  included; nothing is skipped.
* ``cuda.bindings``' runtime and driver modules are imported by ``mpbind._infra.cuda`` alone, whose
  failures are ``CudaError``. The one other reader is ``mpbind._infra.info.gpu_count``, a diagnostic that
  reports "no GPU" as text and never raises (``python -m mpbind info``); it is named here, with that
  reason, rather than skipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "mpbind"
CUDA_MODULES = {"cuda.bindings.runtime", "cuda.bindings.driver"}
HOME = "_infra/cuda.py"
# module path (relative to src/mpbind) -> why it may read the driver itself
ALSO_READS_THE_DRIVER = {
    "_infra/info.py": "gpu_count(): a diagnostic that reports why no GPU is visible, never raising",
}


def _sources() -> list[Path]:
    paths = sorted(SRC.rglob("*.py"))
    assert len(paths) > 20, f"found only {len(paths)} modules under {SRC}"
    return paths


def _bare_runtime_errors(text: str) -> list[int]:
    """Line numbers of ``raise RuntimeError`` / ``raise RuntimeError(...)`` in `text`."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "RuntimeError":
                lines.append(node.lineno)
    return lines


def _cuda_imports(text: str) -> list[int]:
    """Line numbers of imports of cuda.bindings' runtime or driver module in `text`."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            if any(alias.name in CUDA_MODULES for alias in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            if node.module in CUDA_MODULES or named & CUDA_MODULES:
                lines.append(node.lineno)
    return lines


def test_no_bare_runtime_error_is_raised() -> None:
    found = [f"{path.relative_to(SRC)}:{line}" for path in _sources()
             for line in _bare_runtime_errors(path.read_text())]
    assert found == [], "raise an mpbind.errors class instead of RuntimeError at " + ", ".join(found)


def test_cuda_runtime_and_driver_calls_live_in_one_module() -> None:
    found = [f"{path.relative_to(SRC)}:{line}" for path in _sources()
             if path.relative_to(SRC).as_posix() not in (HOME, *ALSO_READS_THE_DRIVER)
             for line in _cuda_imports(path.read_text())]
    assert found == [], "call CUDA through mpbind._infra.cuda, not cuda.bindings directly, at " + ", ".join(found)


def test_the_home_and_the_named_exception_still_read_cuda() -> None:
    """The allowance above names real readers: drop it when they stop reading."""
    for name in (HOME, *ALSO_READS_THE_DRIVER):
        assert _cuda_imports((SRC / name).read_text()), f"{name} no longer imports cuda.bindings"


@pytest.mark.parametrize(("code", "count"), [
    ("raise RuntimeError('x')", 1),
    ("def f():\n    if True:\n        raise RuntimeError\n", 1),
    ("raise errors.RuntimeError('x')", 0),  # an attribute is another class
    ("try:\n    pass\nexcept RuntimeError:\n    raise\n", 0),
    ("raise ValueError('x') from RuntimeError('y')", 0),
])
def test_the_raise_scan_finds_what_it_should(code: str, count: int) -> None:
    assert len(_bare_runtime_errors(code)) == count


@pytest.mark.parametrize(("code", "count"), [
    ("from cuda.bindings import runtime as cudart", 1),
    ("def f():\n    from cuda.bindings import driver\n", 1),
    ("import cuda.bindings.driver", 1),
    ("from cuda.bindings.runtime import cudaMemcpy", 1),
    ("from cuda.bindings import nvjitlink", 0),
    ("from cuda.core import Device", 0),
])
def test_the_import_scan_finds_what_it_should(code: str, count: int) -> None:
    assert len(_cuda_imports(code)) == count
