"""NVSHMEM on 1, 2, 4 and 8 PEs sharing GPU 0, under mpirun: the flat bindings and the Pythonic
layer (``nvshmem_suite.py --api flat|layer``).

Each case launches the suite (beside this file) with ``mpirun -np N`` and checks that every PE
finished and reported no failed check. Initialisation goes through a unique id shared over MPI
(``uid``) or through the MPI communicator (``mpi``).
"""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("multi-PE NVSHMEM", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("cupy", "CuPy is not installed (the suites view symmetric memory through it)")))


@pytest.mark.parametrize("init", ["uid", "mpi"])
@pytest.mark.parametrize("nprocs", [1, 2, 4, 8], ids=lambda n: f"np{n}")
def test_nvshmem_suite(mpirun: str, nprocs: int, init: str) -> None:
    launch("nvshmem_suite.py", nprocs, "--api", "flat", "--init", init, timeout=120, mpirun=mpirun).expect_clean()


@pytest.mark.parametrize("init", ["uid", "mpi"])
def test_nvshmem_init_finalize_reports_status(mpirun: str, init: str) -> None:
    result = launch("nvshmem_suite.py", 2, "--api", "flat", "--reinit", "--init", init, timeout=120, mpirun=mpirun)
    result.expect_clean()
    assert "INFO reinit.init_status_after_finalize" in result.out, result.out[-8000:]


@pytest.mark.parametrize("init", ["uid", "mpi"])
@pytest.mark.parametrize("nprocs", [1, 2, 4, 8], ids=lambda n: f"np{n}")
def test_nvshmem_layer_suite(mpirun: str, nprocs: int, init: str) -> None:
    launch("nvshmem_suite.py", nprocs, "--api", "layer", "--init", init, timeout=180, mpirun=mpirun).expect_clean()
