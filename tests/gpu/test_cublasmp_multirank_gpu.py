"""cuBLASMp and NCCL on 2 and 4 ranks, one per GPU, under mpirun: the flat bindings
(``cublasmp_multirank.py``) and the Pythonic layer (``layer_multirank.py``).

Each case launches a suite (beside this file) with ``mpirun -np N`` and checks that every rank
finished, reported no failed check and passed the suite's main checks. NCCL allows one rank per
GPU, so a case runs only where at least N GPUs are visible; on a one-GPU machine all are skipped.

The libraries are found as mpbind finds them everywhere: ``MPBIND_CUBLASMP_PATH`` and
``MPBIND_NCCL_PATH`` when set, and ``LD_PRELOAD`` (a newer NCCL for every library in the
process), which are passed on to the ranks.
"""

from __future__ import annotations

import pytest
from mpirun_suite import assert_clean, find_mpirun, passed, run

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

FORWARDED = ("MPBIND_CUBLASMP_PATH", "MPBIND_NCCL_PATH", "LD_PRELOAD", "CUBLASMP_SUITE_TRACEBACKS")
# suite -> the checks every rank must have passed (name prefixes)
SUITES = {
    "cublasmp_multirank.py": ("matmul.allgather_gemm.", "matmul.gemm_reducescatter.", "gemm.summa."),
    "layer_multirank.py": ("nccl.collectives", "nccl.teardown_order", "cublasmp.matmul_2d.", "cublasmp.close_order"),
}


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("multi-rank cuBLASMp", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("torch", "torch is not installed (the suites use torch tensors as buffers)")), library="cublasmp")


@pytest.mark.parametrize("suite", sorted(SUITES))
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_cublasmp_multirank(mpirun: str, nprocs: int, suite: str) -> None:
    import torch

    gpus = int(torch.cuda.device_count())
    if gpus < nprocs:
        pytest.skip(f"needs {nprocs} GPUs (NCCL allows one rank per GPU); {gpus} visible")
    rc, out = run(mpirun, suite, nprocs, timeout=300, forward=FORWARDED, share_gpu=False)
    assert_clean(nprocs, rc, out, who="rank")
    for rank in range(nprocs):
        done = passed(out, "rank", rank)
        for prefix in SUITES[suite]:
            assert any(name.startswith(prefix) for name in done), f"rank {rank} passed no {prefix} check\n{out[-8000:]}"
