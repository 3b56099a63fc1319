"""Kernels that call NVSHMEM and the collective matmul, on the GPU under mpirun
(``nvshmem_kernels_suite.py --checks kernels|collective_matmul``).

    python -m pytest tests/gpu/test_nvshmem_kernels_gpu.py -m gpu

Two PEs need two GPUs; three and eight PEs share GPU 0 and need CUDA MPS for NVSHMEM's
full mode (``nvidia-cuda-mps-control -d`` with ``CUDA_MPS_PIPE_DIRECTORY`` exported; each PE gets
an equal part of the SMs, as 8 ranks per GPU would on a larger machine).
"""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch, need_gpus, need_mps

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("NVSHMEM kernel", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("torch", "PyTorch is not installed (the suites check results with it)"),
        ("cuda.core", "cuda-core is not installed (pip install 'mpbind[kernels]')")), library="nvshmem")


CHECKS = [("--checks", "kernels"),
          ("--checks", "collective_matmul", "--method", "host"),
          ("--checks", "collective_matmul", "--method", "kernel")]
IDS = ["kernels", "matmul-host", "matmul-kernel"]


@pytest.mark.parametrize("args", CHECKS, ids=IDS)
def test_two_pes_on_two_gpus(mpirun: str, args: tuple[str, ...]) -> None:
    need_gpus(2)
    launch("nvshmem_kernels_suite.py", 2, *args, timeout=600, mpirun=mpirun, share_gpu=False).expect_clean()


@pytest.mark.parametrize("nprocs", [3, 8])
@pytest.mark.parametrize("args", CHECKS, ids=IDS)
def test_pes_sharing_one_gpu(mpirun: str, args: tuple[str, ...], nprocs: int) -> None:
    need_mps("PEs sharing one GPU")
    launch("nvshmem_kernels_suite.py", nprocs, "--one-gpu", *args, timeout=600, mpirun=mpirun).expect_clean()
