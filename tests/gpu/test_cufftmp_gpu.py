"""cuFFTMp on 1, 2, 4 and 8 PEs sharing GPU 0, under mpirun: the flat bindings
(``cufftmp_mpi_suite.py``) and the Pythonic layer (``cufftmp_layer_mpi_suite.py``).

Each case launches a suite (beside this file) with ``mpirun -np N`` and checks that every PE
finished and reported no failed check. The flat suite initialises NVSHMEM through MPI before any
cuFFTMp call (``nvshmem``), or leaves it to cuFFTMp, which initialises it when a plan is made
with ``CommType.MPI`` (``library``).

The library is found as mpbind finds it everywhere: ``MPBIND_CUFFTMP_PATH`` (and
``MPBIND_NVSHMEM_PATH``) when set, which are passed on to the ranks, else cuda.pathfinder.
"""

from __future__ import annotations

import pytest
from mpirun_suite import assert_clean, find_mpirun, passed, run

pytestmark = pytest.mark.gpu

TIMEOUT_S = 240.0
LIBRARY_VARS = ("MPBIND_CUFFTMP_PATH", "MPBIND_NVSHMEM_PATH")
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
    rc, out = run(mpirun, "cufftmp_mpi_suite.py", nprocs, "--init", "nvshmem", timeout=TIMEOUT_S,
                  forward=LIBRARY_VARS)
    assert_clean(nprocs, rc, out)
    # At least one transform must have been checked against NumPy on every PE, not all skipped.
    for pe in range(nprocs):
        assert any(name.startswith(("slab.", "box.")) for name in passed(out, "pe", pe)), \
            f"pe {pe} passed no FFT check\n{out[-8000:]}"


def test_cufftmp_suite_library_initialises_nvshmem(mpirun: str) -> None:
    rc, out = run(mpirun, "cufftmp_mpi_suite.py", 2, "--init", "library", timeout=TIMEOUT_S, forward=LIBRARY_VARS)
    assert_clean(2, rc, out)
    assert "PASS init.by_cufftmp_plan" in out, out[-8000:]


@pytest.mark.parametrize("nprocs", [1, 2, 4, 8], ids=lambda n: f"np{n}")
def test_cufftmp_layer_suite(mpirun: str, nprocs: int) -> None:
    rc, out = run(mpirun, "cufftmp_layer_mpi_suite.py", nprocs, timeout=TIMEOUT_S, forward=LIBRARY_VARS)
    assert_clean(nprocs, rc, out)
    for pe in range(nprocs):
        done = passed(out, "pe", pe)
        for name in LAYER_CHECKS:
            assert name in done, f"pe {pe} did not pass {name}\n{out[-8000:]}"
