"""Matmuls planned from distributions (``cublasmp.plan_matmul``) on 2 and 4 ranks, one per GPU,
under mpirun (``planned_matmul_multirank.py``): every algorithm the planner picks, checked against
torch on the gathered operands, reused on new arrays and captured.

NCCL allows one rank per GPU, so a case runs only where at least N GPUs are visible.
"""

from __future__ import annotations

import pytest
from mpirun_suite import assert_clean, find_mpirun, passed, run

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

FORWARDED = ("MPBIND_CUBLASMP_PATH", "MPBIND_NCCL_PATH", "LD_PRELOAD", "CUBLASMP_SUITE_TRACEBACKS")
# The checks every rank must have passed (name prefixes): one per algorithm, reuse and capture.
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
    import torch

    gpus = int(torch.cuda.device_count())
    if gpus < nprocs:
        pytest.skip(f"needs {nprocs} GPUs (NCCL allows one rank per GPU); {gpus} visible")
    rc, out = run(mpirun, "planned_matmul_multirank.py", nprocs, timeout=600, forward=FORWARDED, share_gpu=False)
    assert_clean(nprocs, rc, out, who="rank")
    for rank in range(nprocs):
        done = passed(out, "rank", rank)
        for prefix in REQUIRED:
            assert any(name.startswith(prefix) for name in done), f"rank {rank} passed no {prefix} check\n{out[-8000:]}"
