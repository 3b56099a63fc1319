"""Importing the layer loads NumPy only when a NumPy object is involved: neither importing a layer
module nor a hot call's coercion of non-NumPy objects imports it (each checked in a fresh process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = ["mpbind", "mpbind.nccl", "mpbind.nvshmem", "mpbind.cufftmp", "mpbind.cublasmp", "mpbind.bootstrap",
           "mpbind._interop", "mpbind.fft"]


def _numpy_modules_after(code: str) -> list[str]:
    probe = code + "\nimport sys\nprint(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('numpy.')))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own printout of a list of str


@pytest.mark.parametrize("module", MODULES)
def test_importing_a_layer_module_loads_no_numpy(module: str) -> None:
    assert _numpy_modules_after(f"import {module}") == []


def test_coercion_without_numpy_objects_loads_no_numpy() -> None:
    code = (
        "from mpbind import _core, _interop\n"
        "class A:\n"
        "    __cuda_array_interface__ = {'shape': (4, 0), 'typestr': '<f4', 'data': (0, False), 'version': 3}\n"
        "_core.array_info(A())\n"
        "_core.array_info((1, 2, 'bfloat16'), tuples=True)\n"
        "_interop.dtype_name(float)\n"
        "_interop.stream_handle(5)\n"
        "_core._testing.nccl_plan('all_reduce', 0, 1, 0, A(), A())\n"
    )
    assert _numpy_modules_after(code) == []
