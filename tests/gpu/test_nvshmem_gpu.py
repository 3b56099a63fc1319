"""NVSHMEM on 1, 2, 4 and 8 PEs sharing GPU 0, under mpirun: the flat bindings
(``nvshmem_mpi_suite.py``) and the Pythonic layer (``nvshmem_layer_mpi_suite.py``).

Each case launches a suite (beside this file) with ``mpirun -np N`` and checks that every PE
finished and reported no failed check. Initialisation goes through a unique id shared over MPI
(``uid``) or through the MPI communicator (``mpi``).
"""

from __future__ import annotations

import pytest
from mpirun_suite import assert_clean, find_mpirun, run

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("multi-PE NVSHMEM", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("cupy", "CuPy is not installed (the suites view symmetric memory through it)")))


@pytest.mark.parametrize("init", ["uid", "mpi"])
@pytest.mark.parametrize("nprocs", [1, 2, 4, 8], ids=lambda n: f"np{n}")
def test_nvshmem_suite(mpirun: str, nprocs: int, init: str) -> None:
    rc, out = run(mpirun, "nvshmem_mpi_suite.py", nprocs, "--init", init, timeout=120)
    assert_clean(nprocs, rc, out)


@pytest.mark.parametrize("init", ["uid", "mpi"])
def test_nvshmem_init_finalize_reports_status(mpirun: str, init: str) -> None:
    rc, out = run(mpirun, "nvshmem_mpi_suite.py", 2, "--reinit", "--init", init, timeout=120)
    assert_clean(2, rc, out)
    assert "reinit.init_status_after_finalize" in out, out[-8000:]


@pytest.mark.parametrize("init", ["uid", "mpi"])
@pytest.mark.parametrize("nprocs", [1, 2, 4, 8], ids=lambda n: f"np{n}")
def test_nvshmem_layer_suite(mpirun: str, nprocs: int, init: str) -> None:
    rc, out = run(mpirun, "nvshmem_layer_mpi_suite.py", nprocs, "--init", init, timeout=180)
    assert_clean(nprocs, rc, out)
