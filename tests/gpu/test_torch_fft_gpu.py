"""mpbind's torch FFT and reshape operators under mpirun: ``torch_fft_suite.py`` (against torch.fft on
one GPU; gradients, torch.compile, CUDA graphs).

One PE on one GPU, two PEs on two GPUs, and two and four PEs sharing GPU 0 under CUDA MPS
(``nvidia-cuda-mps-control -d`` with ``CUDA_MPS_PIPE_DIRECTORY`` exported).
"""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch, need_gpus, need_mps

pytestmark = pytest.mark.gpu

TIMEOUT_S = 400.0
LIBRARY_VARS = ("MPBIND_CUFFTMP_PATH", "MPBIND_NVSHMEM_PATH", "NVSHMEM_SYMMETRIC_SIZE")
REQUIRED = ("fft.c2c.forward_inverse", "fft.c2c.gradient_against_one_gpu", "fft.c2c.gradcheck",
            "fft.c2c.compiled_loss", "fft.c2c.cuda_graph", "fft.r2c_c2r.gradients_against_one_gpu",
            "reshape.there_and_back")


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("torch FFT operator", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("torch", "PyTorch is not installed")), library="cufftmp")


def test_one_pe(mpirun: str) -> None:
    launch("torch_fft_suite.py", 1, "--one-gpu", timeout=TIMEOUT_S, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean(require=REQUIRED)


def test_two_pes_on_two_gpus(mpirun: str) -> None:
    need_gpus(2)
    launch("torch_fft_suite.py", 2, timeout=TIMEOUT_S, mpirun=mpirun, forward=LIBRARY_VARS,
           share_gpu=False).expect_clean(require=REQUIRED)


@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_pes_sharing_one_gpu(mpirun: str, nprocs: int) -> None:
    need_mps(f"{nprocs} PEs on one GPU")
    launch("torch_fft_suite.py", nprocs, "--one-gpu", timeout=TIMEOUT_S, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean(require=REQUIRED)
