"""cuBLASMp and NCCL on 2 and 4 ranks, one per GPU, under mpirun (``nccl_cublasmp_suite.py``): the
flat bindings (``--checks flat``) and the Pythonic layer (``--checks layer``), on torch memory.

Each case launches the suite (beside this file) with ``mpirun -np N`` and checks that every rank
finished, reported no failed check and passed the suite's main checks. NCCL allows one rank per
GPU, so a case runs only where at least N GPUs are visible; on a one-GPU machine all are skipped.

The libraries are found as mpbind finds them everywhere: ``MPBIND_CUBLASMP_PATH`` and
``MPBIND_NCCL_PATH`` when set, and ``LD_PRELOAD`` (a newer NCCL for every library in the
process), which are passed on to the ranks.
"""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch, need_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

FORWARDED = ("MPBIND_CUBLASMP_PATH", "MPBIND_NCCL_PATH", "LD_PRELOAD")
# --checks -> the checks every rank must have passed (a name ending in "." is a prefix)
REQUIRED = {
    "flat": ("matmul.allgather_gemm.", "matmul.gemm_reducescatter.", "gemm.summa."),
    "layer": ("nccl.collectives", "nccl.teardown_order", "cublasmp.matmul_2d.", "cublasmp.close_order"),
}


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("multi-rank cuBLASMp", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("torch", "torch is not installed (the suites use torch tensors as buffers)")), library="cublasmp")


@pytest.mark.parametrize("checks", sorted(REQUIRED))
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_cublasmp_multirank(mpirun: str, nprocs: int, checks: str) -> None:
    need_gpus(nprocs, " (NCCL allows one rank per GPU)")
    launch("nccl_cublasmp_suite.py", nprocs, "--checks", checks, timeout=300, mpirun=mpirun, forward=FORWARDED,
           share_gpu=False).expect_clean(require=REQUIRED[checks])
