"""Shared test configuration.

Tests marked ``gpu`` are skipped, with the reason, when no CUDA GPU is visible.
Tests import the installed ``mpbind`` (pytest runs with ``--import-mode=importlib``
and ``src/`` is never put on ``sys.path``).
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_status() -> tuple[int, str | None]:
    """``(visible CUDA devices, reason when none)``, probed once per test run."""
    from mpbind._info import gpu_count

    return gpu_count()


def pytest_report_header(config: pytest.Config) -> str:
    import mpbind

    return f"mpbind {mpbind.__version__} from {mpbind.__file__}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    count, reason = gpu_status()
    if count > 0:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU; no GPU visible: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def c_compiler() -> str:
    """Path of a C compiler; tests that build C code skip without one."""
    import shutil

    for cc in ("cc", "gcc", "clang"):
        path = shutil.which(cc)
        if path:
            return path
    pytest.skip("no C compiler (cc, gcc or clang) on PATH")
