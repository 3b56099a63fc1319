"""Shared test configuration.

Tests marked ``gpu`` are skipped, with the reason, when no CUDA GPU is visible.
Tests import the installed ``mpbind`` (pytest runs with ``--import-mode=importlib``
and ``src/`` is never put on ``sys.path``). The pinned library versions tests expect
come from ``codegen/versions.toml`` (the ``pins`` fixture: those the bindings are
generated from; ``installed``: those of the wheel family this environment installed),
never from a literal.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

VERSIONS = Path(__file__).resolve().parents[1] / "codegen" / "versions.toml"

# A shell without job control starts a background command (`make test &`) with SIGINT ignored, and
# Python then leaves it ignored, as do the processes it starts: the Ctrl-C tests would wait in vain.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass(frozen=True)
class Pin:
    """A pinned library wheel (codegen/versions.toml)."""

    wheel: str
    version: str

    @property
    def parts(self) -> tuple[int, ...]:
        """The release's numbers: (2, 28, 9) for NCCL 2.28.9, (0, 9, 1, 3056) for cuBLASMp 0.9.1.3056
        (a `.postN` repackaging is the same release)."""
        return tuple(int(x) for x in re.findall(r"\d+", self.version.split(".post")[0]))

    @property
    def family(self) -> str:
        return self.wheel.rsplit("-", 1)[-1]


def _versions() -> dict[str, dict[str, Any]]:
    if not VERSIONS.is_file():
        pytest.skip("codegen/versions.toml is not in this checkout")
    return tomllib.loads(VERSIONS.read_text())


@pytest.fixture(scope="session")
def pins() -> dict[str, Pin]:
    """Library -> the wheel and version the bindings are generated from."""
    return {lib: Pin(d["wheel"], d["version"]) for lib, d in _versions().items()}


def _installed_pin(d: dict[str, Any]) -> Pin:
    """The pin of the first family whose wheel of the library is installed (the generator's when none is)."""
    families = [Pin(d["wheel"], d["version"])] + [Pin(v["wheel"], v["version"]) for k, v in d.items()
                                                   if re.fullmatch(r"cu\d+", k)]
    for pin in families:
        try:
            md.distribution(pin.wheel)
        except md.PackageNotFoundError:
            continue
        return pin
    return families[0]


@pytest.fixture(scope="session")
def installed() -> dict[str, Pin]:
    """Library -> the pinned wheel and version of the wheel family installed here (cu13, or cu12)."""
    return {lib: _installed_pin(d) for lib, d in _versions().items()}


@functools.cache
def gpu_status() -> tuple[int, str | None]:
    """``(visible CUDA devices, reason when none)``, probed once per test run."""
    from mpbind._infra.info import gpu_count

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
