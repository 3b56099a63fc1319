"""Kernels that call NVSHMEM and the collective matmul, on the GPU under mpirun.

    python -m pytest tests/gpu/test_nvshmem_kernels_gpu.py -m gpu

Two PEs need two GPUs; three and eight PEs share GPU 0 and need CUDA MPS for NVSHMEM's
full mode (``nvidia-cuda-mps-control -d`` with ``CUDA_MPS_PIPE_DIRECTORY`` exported; each PE gets
an equal part of the SMs, as 8 ranks per GPU would on a larger machine).
"""

from __future__ import annotations

import os

import pytest
from mpirun_suite import assert_clean, find_mpirun, run

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("NVSHMEM kernel", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("torch", "PyTorch is not installed (the suites check results with it)"),
        ("cuda.core", "cuda-core is not installed (pip install 'mpbind[kernels]')")), library="nvshmem")


SUITES = [("nvshmem_kernels_mpi_suite.py", ()),
          ("collective_matmul_mpi_suite.py", ("--method", "host")),
          ("collective_matmul_mpi_suite.py", ("--method", "kernel"))]
IDS = ["kernels", "matmul-host", "matmul-kernel"]


@pytest.mark.parametrize(("suite", "args"), SUITES, ids=IDS)
def test_two_pes_on_two_gpus(mpirun: str, suite: str, args: tuple[str, ...]) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    rc, out = run(mpirun, suite, 2, *args, timeout=600, share_gpu=False)
    assert_clean(2, rc, out)


@pytest.mark.parametrize("nprocs", [3, 8])
@pytest.mark.parametrize(("suite", "args"), SUITES, ids=IDS)
def test_pes_sharing_one_gpu(mpirun: str, suite: str, args: tuple[str, ...], nprocs: int) -> None:
    if not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        pytest.skip("PEs sharing one GPU need CUDA MPS (CUDA_MPS_PIPE_DIRECTORY)")
    rc, out = run(mpirun, suite, nprocs, "--one-gpu", *args, timeout=600)
    assert_clean(nprocs, rc, out)
