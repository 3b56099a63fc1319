"""The C++ core's ABI headers (src/mpbind/bindings/_core_abi/*.hpp), rendered by codegen/emit_core.py.

Each header carries, per function the core calls, the signature Cython records in the
function's capsule; the core refuses a pointer whose capsule says otherwise. These tests check
that the emitter spells every bound function's signature exactly as Cython does, and that a
changed signature in the IR makes the committed header stale for ``generate.py --check``
(instead of surfacing only when the core first loads the table).
"""

from __future__ import annotations

import copy
import ctypes
import importlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ABI = Path(__file__).resolve().parents[2] / "src" / "mpbind" / "bindings" / "_core_abi"
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


@pytest.fixture(scope="module")
def emit_core(generator: Callable[[str], ModuleType]) -> ModuleType:
    return generator("emit_core")


def _capsules(module: str) -> dict[str, str]:
    capi = importlib.import_module(module).__pyx_capi__
    return {name: _capsule_name(capsule).decode() for name, capsule in capi.items()}


@pytest.mark.parametrize("lib", LIBRARIES)
def test_every_bound_signature_is_spelled_as_cython_records_it(
        lib: str, generate: ModuleType, emit_core: ModuleType) -> None:
    """Not only the core's functions: every C entry point, so that any the core adds is right."""
    capsules = _capsules(f"mpbind.bindings.cy{lib}")
    entries = emit_core.library_entries(generate.load_library(lib))
    assert {e.name for e in entries} == set(capsules)
    wrong = {e.name: (emit_core.capsule_signature(e), capsules[e.name]) for e in entries
             if emit_core.capsule_signature(e) != capsules[e.name]}
    assert not wrong


@pytest.mark.parametrize("section", ["cuda_driver", "cuda_runtime"])
def test_the_cuda_prototypes_are_cuda_bindings_capsules(emit_core: ModuleType, section: str) -> None:
    assert section in emit_core.CUDA
    spec = emit_core.spec()[section]
    capsules = _capsules(spec["module"])
    assert {name: capsules.get(name) for name in spec["functions"]} == spec["functions"]


@pytest.mark.parametrize(("section", "module"), [("cuda_driver", "driver"), ("cuda_runtime", "runtime")])
def test_the_cuda_enum_values_are_cuda_bindings_values(emit_core: ModuleType, section: str, module: str) -> None:
    python_module = importlib.import_module(f"cuda.bindings.{module}")
    for enum, members in emit_core.spec()[section]["enums"].items():
        python = getattr(python_module, enum)
        assert {name: int(getattr(python, name)) for name in members} == members, enum


def _with_count_as_long(ir: dict[str, Any]) -> dict[str, Any]:
    """A copy of the NCCL IR where ncclCommCount writes a long, not an int."""
    changed = copy.deepcopy(ir)
    f = next(f for f in changed["functions"] if f["name"] == "ncclCommCount")
    f["params"][1]["type"]["pointee"]["name"] = "long"
    return changed


def test_a_changed_signature_changes_the_rendered_header(generate: ModuleType) -> None:
    irs = {lib: generate.load_ir(lib) for lib in generate.LIBRARIES}
    path = ABI / "nccl.hpp"
    assert generate.render(irs)[path] == path.read_text()
    irs["nccl"] = _with_count_as_long(irs["nccl"])
    stale = generate.render(irs)[path]
    assert stale != path.read_text()
    assert '"ncclResult_t (ncclComm_t const , long *)"' in stale
    assert "capi::Fn<ncclResult_t (const ncclComm_t, long *), capi::Status, capi::KeepGil> ncclCommCount" in stale


def test_check_reports_the_header_stale_after_a_signature_change(tree_copy: Path, generate: ModuleType) -> None:
    root = tree_copy
    ir_file = root / "codegen" / "ir" / "nccl.json"
    ir_file.write_text(generate.dump_ir(_with_count_as_long(generate.load_ir("nccl"))))
    proc = subprocess.run([sys.executable, str(root / "codegen" / "generate.py"), "--check", "--lib", "nccl"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
    assert "error: src/mpbind/bindings/_core_abi/nccl.hpp: stale" in proc.stdout
    assert "src/mpbind/bindings/_core_abi/cufftmp.hpp" not in proc.stdout


def test_a_function_the_library_does_not_bind_is_refused(generate: ModuleType, emit_core: ModuleType) -> None:
    with pytest.raises(KeyError, match="ncclNoSuchCall"):
        emit_core.library_entries(generate.load_library("nccl"), ["ncclCommCount", "ncclNoSuchCall"])
