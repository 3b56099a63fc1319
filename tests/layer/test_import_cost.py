"""Importing the layer loads NumPy only when a NumPy object is involved: neither importing a layer
module nor a hot call's coercion of non-NumPy objects imports it (each checked in a fresh process).
Nor does importing it load `typing` (with `re`, `contextlib` and the rest, about half of what
importing mpbind.nccl cost): annotations are strings, and what only type checkers read is under
`TYPE_CHECKING`. Nor, for the flat bindings and mpbind.nccl, `enum` (with functools and collections):
the flat bindings make their IntEnums on first use. `python benchmarks/import_time.py` reports the
times (docs/getting-started.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = ["mpbind", "mpbind.nccl", "mpbind.nvshmem", "mpbind.cufftmp", "mpbind.cublasmp", "mpbind.bootstrap",
           "mpbind.process_group", "mpbind._infra.interop", "mpbind.fft"]


# cublasmp's matmul-descriptor attributes and fft's plans are Generic classes, which need typing at run time.
TYPING_FREE = [m for m in MODULES if m not in ("mpbind.cublasmp", "mpbind.fft")] + [
    "mpbind.bindings.nccl", "mpbind.bindings.nvshmem", "mpbind.bindings.cufftmp", "mpbind.bindings.cublasmp"]

# The flat bindings make their IntEnums on first use (cublasmp's attribute table names its enums at
# import); mpbind.nccl re-exports DataType and RedOp the same way.
ENUM_FREE = ["mpbind", "mpbind.nccl", "mpbind.bootstrap", "mpbind.process_group", "mpbind._infra.interop",
             "mpbind.bindings.nccl", "mpbind.bindings.nvshmem", "mpbind.bindings.cufftmp"]


def _modules_after(code: str, top: str) -> list[str]:
    probe = code + f"\nimport sys\nprint(sorted(m for m in sys.modules if m == {top!r} or m.startswith({top!r} + '.')))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own printout of a list of str


def _numpy_modules_after(code: str) -> list[str]:
    return _modules_after(code, "numpy")


@pytest.mark.parametrize("module", MODULES)
def test_importing_a_layer_module_loads_no_numpy(module: str) -> None:
    assert _numpy_modules_after(f"import {module}") == []


@pytest.mark.parametrize("module", TYPING_FREE)
def test_importing_a_module_loads_no_typing(module: str) -> None:
    assert _modules_after(f"import {module}", "typing") == []


@pytest.mark.parametrize("module", ENUM_FREE)
def test_importing_a_module_loads_no_enum(module: str) -> None:
    assert _modules_after(f"import {module}", "enum") == []


def test_coercion_without_numpy_objects_loads_no_numpy() -> None:
    code = (
        "from mpbind import _core\n"
        "from mpbind._infra import interop as _interop\n"
        "class A:\n"
        "    __cuda_array_interface__ = {'shape': (4, 0), 'typestr': '<f4', 'data': (0, False), 'version': 3}\n"
        "_core.array_info(A())\n"
        "_core.array_info((1, 2, 'bfloat16'), tuples=True)\n"
        "_interop.dtype_name(float)\n"
        "_interop.stream_handle(2)\n"
        "_core._testing.nccl_plan('all_reduce', 0, 1, 0, A(), A())\n"
    )
    assert _numpy_modules_after(code) == []
