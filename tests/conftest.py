"""Shared test configuration.

Tests marked ``gpu`` are skipped, with the reason, when no CUDA GPU is visible.
Tests import the installed ``mpbind`` (pytest runs with ``--import-mode=importlib``
and ``src/`` is never put on ``sys.path``). The pinned library versions tests expect
come from ``bindings/versions.toml`` (the ``pins`` fixture), never from a literal.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

VERSIONS = Path(__file__).resolve().parents[1] / "bindings" / "versions.toml"


@dataclass(frozen=True)
class Pin:
    """A pinned library wheel (bindings/versions.toml)."""

    wheel: str
    version: str

    @property
    def parts(self) -> tuple[int, ...]:
        """The release's numbers: (2, 28, 9) for NCCL 2.28.9, (0, 9, 1, 3056) for cuBLASMp 0.9.1.3056."""
        return tuple(int(x) for x in self.version.split("."))


@pytest.fixture(scope="session")
def pins() -> dict[str, Pin]:
    """Library -> its pinned wheel and version."""
    if not VERSIONS.is_file():
        pytest.skip("bindings/versions.toml is not in this checkout")
    return {lib: Pin(d["wheel"], d["version"]) for lib, d in tomllib.loads(VERSIONS.read_text()).items()}


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
