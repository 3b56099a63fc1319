"""The core's function tables against the real capsules, on any machine (no GPU, no library).

mpbind._core._abi.load() looks up every entry of every generated table (src/mpbind/bindings/_core_abi)
in its module's __pyx_capi__ and checks the capsule's signature, as the core does when it
first calls a library; nothing is loaded but the Cython modules.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from pathlib import Path

import pytest

from mpbind import _core

SPEC = Path(__file__).resolve().parents[2] / "codegen" / "specs" / "core.toml"

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def test_every_entry_of_every_table_loads() -> None:
    assert _core._abi.load() == len(_core._abi.entries())


def test_every_entry_carries_its_capsule_signature() -> None:
    for module, name, signature in _core._abi.entries():
        capsule = importlib.import_module(module).__pyx_capi__[name]
        assert _capsule_name(capsule).decode() == signature, f"{module}.{name}"


def test_the_tables_hold_what_the_spec_lists() -> None:
    if not SPEC.is_file():
        pytest.skip("codegen/specs/core.toml is not in this checkout")
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    spec = tomllib.loads(SPEC.read_text())
    listed = {(part.get("module", f"mpbind.bindings.cy{lib}"), name)
              for lib, part in spec.items() for name in part["functions"]}
    assert {(module, name) for module, name, _ in _core._abi.entries()} == listed
