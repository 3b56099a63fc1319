"""mpbind's JAX functions under mpirun: ``jax_suite.py`` (inside ``jax.jit``, against NumPy and the
eager plans; gradients, finite differences, vmap).

One PE on one GPU, two PEs on two GPUs, two and four PEs sharing GPU 0 under CUDA MPS, and one PE
with XLA's command buffers (CUDA graphs) taking in the custom calls.
"""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch, need_gpus, need_mps

pytestmark = pytest.mark.gpu

TIMEOUT_S = 400.0
LIBRARY_VARS = ("MPBIND_CUFFTMP_PATH", "MPBIND_NVSHMEM_PATH", "NVSHMEM_SYMMETRIC_SIZE")
REQUIRED = ("collectives.one_rank_communicator", "fft.c2c.against_numpy_and_eager", "fft.r2c_c2r.against_numpy",
            "fft.gradients_against_one_gpu", "fft.finite_differences", "fft.vmap", "reshape.there_and_back",
            "errors.closed_plan_and_communicator")
# Custom calls into command buffers, even small ones (XLA's default minimum graph size is 5 commands).
COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("JAX", (("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
                               ("jax", "JAX is not installed (pip install 'mpbind[jax]')"),
                               ("cupy", "CuPy is not installed (the eager reference)")), library="cufftmp")


def test_one_pe(mpirun: str) -> None:
    launch("jax_suite.py", 1, "--one-gpu", timeout=TIMEOUT_S, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean(require=REQUIRED)


def test_one_pe_with_command_buffers(mpirun: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", COMMAND_BUFFERS)
    launch("jax_suite.py", 1, "--one-gpu", timeout=TIMEOUT_S, mpirun=mpirun,
           forward=(*LIBRARY_VARS, "XLA_FLAGS")).expect_clean(require=REQUIRED)


def test_two_pes_on_two_gpus(mpirun: str) -> None:
    need_gpus(2)
    launch("jax_suite.py", 2, timeout=TIMEOUT_S, mpirun=mpirun, forward=LIBRARY_VARS,
           share_gpu=False).expect_clean(require=REQUIRED)


@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_pes_sharing_one_gpu(mpirun: str, nprocs: int) -> None:
    need_mps(f"{nprocs} PEs on one GPU")
    launch("jax_suite.py", nprocs, "--one-gpu", timeout=TIMEOUT_S, mpirun=mpirun,
           forward=LIBRARY_VARS).expect_clean(require=REQUIRED)
