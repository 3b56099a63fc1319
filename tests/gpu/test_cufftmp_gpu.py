"""cuFFTMp on 1, 2, 4 and 8 PEs sharing GPU 0, under mpirun: the flat bindings and the Pythonic
layer (``cufftmp_suite.py --api flat|layer``).

Each case launches the suite (beside this file) with ``mpirun -np N`` and checks that every PE
finished and reported no failed check. The flat checks initialise NVSHMEM through MPI before any
cuFFTMp call (``nvshmem``), or leave it to cuFFTMp, which initialises it when a plan is made with
``CommType.MPI`` (``library``).

The library is found as mpbind finds it everywhere: ``MPBIND_CUFFTMP_PATH`` (and
``MPBIND_NVSHMEM_PATH``) when set, which are passed on to the ranks, else cuda.pathfinder.
"""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch

pytestmark = pytest.mark.gpu

TIMEOUT_S = 240.0
LIBRARY_VARS = ("MPBIND_CUFFTMP_PATH", "MPBIND_NVSHMEM_PATH")
# At least one transform checked against NumPy on every PE, not all skipped.
FLAT_CHECKS = (("slab.", "box."),)
LAYER_CHECKS = ("slab.c2c.exec", "slab.z2z.exec", "slab.r2c_c2r.exec", "slab.c2c.descriptor",
                "reshape.xslab_to_yslab.complex64", "reshape.xslab_to_yslab.int32",
                "teardown.dropped_plan_drained", "plan.lifecycle", "teardown.queue_empty")


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("multi-PE cuFFTMp", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("cupy", "CuPy is not installed (the suites view device memory through it)")), library="cufftmp")


@pytest.mark.parametrize("nprocs", [1, 2, 4, 8], ids=lambda n: f"np{n}")
def test_cufftmp_suite(mpirun: str, nprocs: int) -> None:
    result = launch("cufftmp_suite.py", nprocs, "--api", "flat", "--init", "nvshmem", timeout=TIMEOUT_S,
                    mpirun=mpirun, forward=LIBRARY_VARS)
    result.expect_clean(require=FLAT_CHECKS)


def test_cufftmp_suite_library_initialises_nvshmem(mpirun: str) -> None:
    result = launch("cufftmp_suite.py", 2, "--api", "flat", "--init", "library", timeout=TIMEOUT_S, mpirun=mpirun,
                    forward=LIBRARY_VARS)
    result.expect_clean(require=("init.by_cufftmp_plan",))


@pytest.mark.parametrize("nprocs", [1, 2, 4, 8], ids=lambda n: f"np{n}")
def test_cufftmp_layer_suite(mpirun: str, nprocs: int) -> None:
    result = launch("cufftmp_suite.py", nprocs, "--api", "layer", timeout=TIMEOUT_S, mpirun=mpirun,
                    forward=LIBRARY_VARS)
    result.expect_clean(require=LAYER_CHECKS)
