"""The GPU suites on the libraries of either wheel family, with no torch in any process: NCCL and
cuBLASMp on two GPUs, one rank per GPU (``nccl_cublasmp_suite.py --checks raw``: device memory from
cuda.bindings), NVSHMEM and cuFFTMp on 1, 2 and 3 PEs sharing GPU 0 (``nvshmem_suite.py`` and
``cufftmp_suite.py`` with ``--api flat``: device memory viewed through CuPy).

Run this file alone (other GPU test modules import torch, which loads its own NCCL). With
``MPBIND_EXPECT_FAMILY=cu12`` (or ``cu13``) every library must come from that family's wheels. Wheels
staged outside the environment are found through ``MPBIND_<LIB>_PATH``, passed on to the ranks.
"""

from __future__ import annotations

import os
import sys

import pytest
from runner import find_mpirun, launch, need_gpus

from mpbind._infra import loader as _loader

pytestmark = pytest.mark.gpu

LIBRARY_VARS = ("MPBIND_NCCL_PATH", "MPBIND_NVSHMEM_PATH", "MPBIND_CUBLASMP_PATH", "MPBIND_CUFFTMP_PATH")
# The checks every rank must have passed (a name ending in "." is a prefix).
RAW_CHECKS = ("nccl.collectives", "nccl.layer", "matmul.allgather_gemm.", "matmul.gemm_reducescatter.",
              "gemm.summa.", "cublasmp.layer_matmul", "process.no_torch_no_cupy")


@pytest.mark.parametrize("lib", list(_loader.LIBRARIES))
def test_each_library_comes_from_the_expected_family(lib: str) -> None:
    family = os.environ.get("MPBIND_EXPECT_FAMILY")
    if not family:
        pytest.skip("MPBIND_EXPECT_FAMILY is not set")
    loaded = _loader.load(lib)
    assert loaded.owner is not None and loaded.owner.family == family, (loaded.path, loaded.owner)
    print(f"{lib}: {_loader.loaded_version(lib)} from {loaded.owner} ({loaded.path})")
    assert "torch" not in sys.modules


def test_nccl_and_cublasmp_on_two_gpus() -> None:
    mpirun = find_mpirun("multi-rank NCCL and cuBLASMp", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),), library="cublasmp")
    need_gpus(2, " (NCCL allows one rank per GPU)")
    launch("nccl_cublasmp_suite.py", 2, "--checks", "raw", timeout=300, mpirun=mpirun, forward=LIBRARY_VARS,
           share_gpu=False).expect_clean(require=RAW_CHECKS)


def _multi_pe(what: str, library: str) -> str:
    return find_mpirun(what, (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("cupy", "CuPy is not installed (the suites view device memory through it)")), library=library)


@pytest.mark.parametrize("nprocs", [1, 2, 3], ids=lambda n: f"np{n}")
def test_nvshmem_on_pes_sharing_one_gpu(nprocs: int) -> None:
    mpirun = _multi_pe("multi-PE NVSHMEM", "nvshmem")
    launch("nvshmem_suite.py", nprocs, "--api", "flat", "--init", "uid", timeout=180, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean()


@pytest.mark.parametrize("nprocs", [1, 2, 3], ids=lambda n: f"np{n}")
def test_cufftmp_on_pes_sharing_one_gpu(nprocs: int) -> None:
    mpirun = _multi_pe("multi-PE cuFFTMp", "cufftmp")
    launch("cufftmp_suite.py", nprocs, "--api", "flat", "--init", "nvshmem", timeout=240, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean(require=(("slab.", "box."),))
