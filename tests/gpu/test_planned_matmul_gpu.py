"""Matmuls planned from distributions (``mpbind.matmul.plan``) on 2 and 4 ranks, one per GPU,
under mpirun (``planned_matmul_suite.py``): every algorithm the planner picks, checked against
torch on the gathered operands, reused on new arrays and captured.

NCCL allows one rank per GPU, so a case runs only where at least N GPUs are visible.
"""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch, need_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

FORWARDED = ("MPBIND_CUBLASMP_PATH", "MPBIND_NCCL_PATH", "LD_PRELOAD")
# The checks every rank must have passed (a name ending in "." is a prefix): one per algorithm, reuse and capture.
REQUIRED = ("planned.allgather_gemm.TN.", "planned.gemm_reducescatter.TN.", "planned.gemm_allreduce.TN.",
            "planned.local.", "planned.general.rows.", "planned.general.summa.", "planned.general.uneven_ag.",
            "planned.capture.", "planned.refused_on_every_rank")


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("planned matmul", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("torch", "torch is not installed (the suite uses torch tensors as local pieces)")), library="cublasmp")


@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_planned_matmul_multirank(mpirun: str, nprocs: int) -> None:
    need_gpus(nprocs, " (NCCL allows one rank per GPU)")
    launch("planned_matmul_suite.py", nprocs, timeout=600, mpirun=mpirun, forward=FORWARDED,
           share_gpu=False).expect_clean(require=REQUIRED)
