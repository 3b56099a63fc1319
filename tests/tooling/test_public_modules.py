"""The public modules are listed once, in ``mpbind._PUBLIC_MODULES``, and each says what it exports.

Every module under src/mpbind is listed there or private: a part of its dotted name starts with an
underscore (``mpbind._infra.loader``, ``mpbind.fft._planner``), or it is the Cython-level twin
``bindings.cy<lib>`` of a listed flat module (for ``cimport``). A listed top-level module is what
``mpbind.<name>`` imports on first access and what ``dir(mpbind)`` shows. Each listed hand-written
module has ``__all__``: every name in it resolves, and every public class or function the module
defines itself is in it. The generated flat modules (``bindings.<lib>``) have no ``__all__``: their
public names are the generator's, checked against their stubs (tests/flat/test_stubs.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import mpbind

SRC = Path(__file__).resolve().parents[2] / "src"
PUBLIC = mpbind._PUBLIC_MODULES


def _source_modules(src: Path) -> set[str]:
    """Dotted names (relative to mpbind) of the package's Python and Cython modules."""
    names = set()
    for path in (src / "mpbind").rglob("*"):
        if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
            continue
        parts = path.relative_to(src / "mpbind").with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts:
            names.add(".".join(parts))
    return names


def unlisted(modules: set[str], public: tuple[str, ...]) -> list[str]:
    """Modules neither listed nor private."""
    def private(name: str) -> bool:
        parts = name.split(".")
        twin = len(parts) == 2 and parts[0] == "bindings" and parts[1].startswith("cy")
        return any(p.startswith("_") for p in parts) or (twin and f"bindings.{parts[1][2:]}" in public)

    return sorted(m for m in modules if m not in public and not private(m))


def missing_from_all(module: object) -> tuple[list[str], list[str]]:
    """(names in __all__ that do not resolve, public classes and functions defined here not in __all__)."""
    listed = list(module.__all__)  # type: ignore[attr-defined]
    name = module.__name__  # type: ignore[attr-defined]
    absent = [n for n in listed if not hasattr(module, n)]
    own = [n for n, v in vars(module).items()
           if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
           and getattr(v, "__module__", None) == name and n not in listed]
    return absent, sorted(own)


def test_the_list_has_no_duplicates_and_every_entry_exists() -> None:
    assert len(set(PUBLIC)) == len(PUBLIC)
    if not (SRC / "mpbind").is_dir():
        pytest.skip("the package's sources are not in this checkout")
    assert set(PUBLIC) <= _source_modules(SRC), sorted(set(PUBLIC) - _source_modules(SRC))


def test_every_other_module_is_private() -> None:
    if not (SRC / "mpbind").is_dir():
        pytest.skip("the package's sources are not in this checkout")
    found = unlisted(_source_modules(SRC), PUBLIC)
    assert not found, f"modules neither in mpbind._PUBLIC_MODULES nor private: {found}"


def test_the_check_sees_an_unlisted_module() -> None:
    modules = {"nccl", "_infra.args", "fft", "fft._planner", "bindings", "bindings.nccl", "bindings.cynccl",
               "bindings.cynvshmem", "fft.helpers", "__main__"}
    assert unlisted(modules, ("nccl", "fft", "bindings", "bindings.nccl")) == ["bindings.cynvshmem", "fft.helpers"]


def _available(name: str) -> bool:
    """Whether public module `name` can be imported here (an optional package it needs is installed)."""
    package = mpbind._OPTIONAL_MODULES.get(name)
    return package is None or importlib.util.find_spec(package) is not None


def test_top_level_modules_are_reached_lazily_and_shown() -> None:
    top = [m for m in PUBLIC if "." not in m]
    here = [m for m in top if _available(m)]
    missing = [m for m in top if not _available(m)]
    probe = ("import sys, mpbind\n"
             f"assert not [m for m in {top!r} if 'mpbind.' + m in sys.modules], 'imported by import mpbind'\n"
             f"shown = set(dir(mpbind))\nassert set({top!r}) <= shown, set({top!r}) - shown\n"
             f"for m in {here!r}:\n    assert getattr(mpbind, m) is sys.modules['mpbind.' + m]\n"
             "from mpbind.errors import MissingDependencyError\n"
             f"for m in {missing!r}:\n"
             "    try:\n        getattr(mpbind, m)\n"
             "    except MissingDependencyError as e:\n        assert 'pip install' in str(e), e\n"
             "    else:\n        raise AssertionError(m + ' imported without its package')\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("name", [m for m in PUBLIC if not m.startswith("bindings")])
def test_every_hand_written_public_module_lists_its_names(name: str) -> None:
    if not _available(name):
        pytest.skip(f"mpbind.{name} needs {mpbind._OPTIONAL_MODULES[name]}, which is not installed")
    module = importlib.import_module(f"mpbind.{name}")
    assert isinstance(getattr(module, "__all__", None), (list, tuple)), f"mpbind.{name} has no __all__"
    absent, own = missing_from_all(module)
    assert not absent, f"mpbind.{name}.__all__ names what it does not have: {absent}"
    assert not own, f"mpbind.{name} defines public names __all__ leaves out: {own}"


def test_the_check_sees_a_name_left_out() -> None:
    import types

    module = types.ModuleType("fabricated")
    exec("__all__ = ['f', 'gone']\ndef f(): pass\ndef g(): pass\nclass C: pass\ndef _h(): pass\n", vars(module))
    assert missing_from_all(module) == (["gone"], ["C", "g"])
