"""Planned distributed FFTs and reshapes (mpbind.fft) under mpirun: ``fft_plan_suite.py``.

    python -m pytest tests/gpu/test_fft_plan_gpu.py -m gpu

Two PEs need two GPUs; three, four and eight PEs share GPU 0 and need CUDA MPS for
NVSHMEM's full mode (``nvidia-cuda-mps-control -d`` with ``CUDA_MPS_PIPE_DIRECTORY`` exported).
The library is found as mpbind finds it everywhere (``MPBIND_CUFFTMP_PATH`` and
``MPBIND_NVSHMEM_PATH`` are passed on to the ranks when set).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from runner import find_mpirun, launch, need_gpus, need_mps, visible_gpus

pytestmark = pytest.mark.gpu

TIMEOUT_S = 600.0
LIBRARY_VARS = ("MPBIND_CUFFTMP_PATH", "MPBIND_NVSHMEM_PATH", "NVSHMEM_SYMMETRIC_SIZE")
# Checks every PE must pass (not skip) in every configuration.
REQUIRED = ("c2c.c64.50x62x36", "c2c.c128.50x62x36", "c2c.c64.51x63x36.x_to_x", "c2c.c128.51x63x36.x_to_x",
            "r2c.f32.50x62x35.odd", "r2c.f64.50x62x35.odd", "r2c.f32.51x63x36.x_to_x", "reshape.c64.x_to_y",
            "reshape.i8.x_to_y", "refusals.execute", "refusals.plan_agreement", "lifetimes", "teardown.queue_empty")


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("planned FFT", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("cupy", "CuPy is not installed (the suite views device memory through it)")), library="cufftmp")


def test_one_pe(mpirun: str) -> None:
    launch("fft_plan_suite.py", 1, "--one-gpu", timeout=TIMEOUT_S, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean(require=REQUIRED)


def test_two_pes_on_two_gpus(mpirun: str) -> None:
    need_gpus(2)
    launch("fft_plan_suite.py", 2, timeout=TIMEOUT_S, mpirun=mpirun, forward=LIBRARY_VARS,
           share_gpu=False).expect_clean(require=REQUIRED)


@pytest.mark.parametrize("nprocs", [3, 4, 8], ids=lambda n: f"np{n}")
def test_pes_sharing_one_gpu(mpirun: str, nprocs: int) -> None:
    need_mps(f"{nprocs} PEs on one GPU")
    launch("fft_plan_suite.py", nprocs, "--one-gpu", timeout=TIMEOUT_S, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean(require=REQUIRED)


def test_torch_tensors_on_two_pes(mpirun: str) -> None:
    """PyTorch imported first, tensors in and out (torch brings its own cuFFT beside cuFFTMp)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed")
    two = visible_gpus() >= 2
    if not two and not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        pytest.skip("needs two GPUs, or CUDA MPS for two PEs on one GPU")
    args = ("--torch",) if two else ("--torch", "--one-gpu")
    launch("fft_plan_suite.py", 2, *args, timeout=TIMEOUT_S, mpirun=mpirun, forward=LIBRARY_VARS,
           share_gpu=not two).expect_clean()
