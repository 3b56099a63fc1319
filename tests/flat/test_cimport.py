"""A downstream Cython module cimports the installed cynccl.pxd and calls NCCL without the GIL."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import mpbind
from mpbind.bindings import nccl

DOWNSTREAM = """\
# cython: language_level=3
from mpbind.bindings.cynccl cimport ncclGetVersion, ncclResult_t


def version_nogil():
    cdef int version = 0
    cdef ncclResult_t status
    with nogil:
        status = ncclGetVersion(&version)
    if <int>status != 0:
        raise RuntimeError("ncclGetVersion returned %d" % <int>status)
    return version
"""


def test_downstream_cimport_calls_without_the_gil(tmp_path: Path, c_compiler: str) -> None:
    pytest.importorskip("Cython", reason="Cython is needed to build the downstream module")
    cc = c_compiler
    site = Path(mpbind.__file__).resolve().parent.parent
    assert (site / "mpbind" / "bindings" / "cynccl.pxd").is_file(), "cynccl.pxd is not installed"
    pyx = tmp_path / "mpbind_downstream.pyx"
    pyx.write_text(DOWNSTREAM)
    c_file = tmp_path / "mpbind_downstream.c"
    cythonize = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", str(site), str(pyx), "-o", str(c_file)],
                               capture_output=True, text=True, timeout=300)
    assert cythonize.returncode == 0, cythonize.stdout + cythonize.stderr
    ext = tmp_path / f"mpbind_downstream{sysconfig.get_config_var('EXT_SUFFIX')}"
    includes = {sysconfig.get_path("include"), sysconfig.get_path("platinclude")}
    cmd = [cc, "-shared", "-fPIC", "-O0", *(f"-I{d}" for d in sorted(includes)), str(c_file), "-o", str(ext)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    spec = importlib.util.spec_from_file_location("mpbind_downstream", ext)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.version_nogil()
    assert isinstance(got, int)
    assert got == nccl.get_version()


ALL_FOUR = """\
# cython: language_level=3
# One unit cimporting every cy module: the types two of them share (ncclComm_t,
# cudaStream_t, cudaDataType_t and its enumerators) must be declared compatibly.
from mpbind.bindings cimport cynccl, cynvshmem, cycublasmp, cycufftmp


def shared_types():
    cdef cynccl.ncclComm_t comm = NULL
    cdef cycublasmp.ncclComm_t same_comm = comm
    cdef cycublasmp.cudaDataType_t t1 = cycublasmp.CUDA_R_32F
    cdef cycufftmp.cudaDataType_t t2 = cycufftmp.CUDA_R_32F
    cdef cynvshmem.cudaStream_t stream = NULL
    cdef cycufftmp.cudaStream_t same_stream = stream
    return (<int>t1, <int>t2, same_comm == NULL, same_stream == NULL)
"""


def test_one_unit_can_cimport_every_module(tmp_path: Path, c_compiler: str) -> None:
    pytest.importorskip("Cython", reason="Cython is needed to build the downstream module")
    site = Path(mpbind.__file__).resolve().parent.parent
    pyx = tmp_path / "mpbind_all_four.pyx"
    pyx.write_text(ALL_FOUR)
    c_file = tmp_path / "mpbind_all_four.c"
    cythonize = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", str(site), str(pyx), "-o", str(c_file)],
                               capture_output=True, text=True, timeout=300)
    assert cythonize.returncode == 0, cythonize.stdout + cythonize.stderr
    ext = tmp_path / f"mpbind_all_four{sysconfig.get_config_var('EXT_SUFFIX')}"
    includes = {sysconfig.get_path("include"), sysconfig.get_path("platinclude")}
    cmd = [c_compiler, "-shared", "-fPIC", "-O0", "-Werror=incompatible-pointer-types",
           *(f"-I{d}" for d in sorted(includes)), str(c_file), "-o", str(ext)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    spec = importlib.util.spec_from_file_location("mpbind_all_four", ext)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.shared_types() == (0, 0, True, True)
