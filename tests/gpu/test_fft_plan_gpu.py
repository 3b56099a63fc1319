"""Planned distributed FFTs and reshapes (mpbind.fft) under mpirun: ``fft_plan_mpi_suite.py``.

    python -m pytest tests/gpu/test_fft_plan_gpu.py -m gpu

Two PEs need two GPUs; three, four and eight PEs share GPU 0 and need CUDA MPS for
NVSHMEM's full mode (``nvidia-cuda-mps-control -d`` with ``CUDA_MPS_PIPE_DIRECTORY`` exported).
The library is found as mpbind finds it everywhere (``MPBIND_CUFFTMP_PATH`` and
``MPBIND_NVSHMEM_PATH`` are passed on to the ranks when set).
"""

from __future__ import annotations

import os

import pytest
from mpirun_suite import assert_clean, find_mpirun, passed, run

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


def check(nprocs: int, rc: int, out: str) -> None:
    assert_clean(nprocs, rc, out)
    for pe in range(nprocs):
        done = passed(out, "pe", pe)
        missing = [name for name in REQUIRED if name not in done]
        assert not missing, f"pe {pe} did not pass {missing}\n{out[-8000:]}"


def test_one_pe(mpirun: str) -> None:
    rc, out = run(mpirun, "fft_plan_mpi_suite.py", 1, "--one-gpu", timeout=TIMEOUT_S, forward=LIBRARY_VARS)
    check(1, rc, out)


def test_two_pes_on_two_gpus(mpirun: str) -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    rc, out = run(mpirun, "fft_plan_mpi_suite.py", 2, timeout=TIMEOUT_S, forward=LIBRARY_VARS, share_gpu=False)
    check(2, rc, out)


@pytest.mark.parametrize("nprocs", [3, 4, 8], ids=lambda n: f"np{n}")
def test_pes_sharing_one_gpu(mpirun: str, nprocs: int) -> None:
    if not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        pytest.skip(f"{nprocs} PEs on one GPU need CUDA MPS (CUDA_MPS_PIPE_DIRECTORY)")
    rc, out = run(mpirun, "fft_plan_mpi_suite.py", nprocs, "--one-gpu", timeout=TIMEOUT_S, forward=LIBRARY_VARS)
    check(nprocs, rc, out)


def test_torch_tensors_on_two_pes(mpirun: str) -> None:
    """PyTorch imported first, tensors in and out (torch brings its own cuFFT beside cuFFTMp)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed")
    import cupy

    two = cupy.cuda.runtime.getDeviceCount() >= 2
    if not two and not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        pytest.skip("needs two GPUs, or CUDA MPS for two PEs on one GPU")
    args = ("--torch",) if two else ("--torch", "--one-gpu")
    rc, out = run(mpirun, "fft_plan_mpi_suite.py", 2, *args, timeout=TIMEOUT_S, forward=LIBRARY_VARS,
                  share_gpu=not two)
    assert_clean(2, rc, out)
