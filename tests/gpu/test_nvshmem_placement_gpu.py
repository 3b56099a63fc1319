"""NVSHMEM with PEs placed unevenly on two GPUs (2 + 1): every PE raises the same PlacementError
before NVSHMEM is entered, instead of hanging in nvshmemx_init_attr; even placements initialise.

Needs two GPUs and, for PEs sharing a GPU, preferably an MPS daemon."""

from __future__ import annotations

import pytest
from runner import find_mpirun, launch, need_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


@pytest.fixture(scope="module")
def mpirun() -> str:
    path = find_mpirun("NVSHMEM placement", (("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),))
    need_gpus(2)
    return path


@pytest.mark.parametrize("init", ["mpi", "uid_via"])
@pytest.mark.parametrize(("gpus", "expect"), [("0,0,1", "refused"), ("0,1,1", "refused"),
                                              ("0,0,1,1", "initialised"), ("0,1,0,1", "initialised"),
                                              ("0,1", "initialised"), ("0,0,0", "initialised")])
def test_placement(mpirun: str, gpus: str, expect: str, init: str) -> None:
    nprocs = len(gpus.split(","))
    launch("nvshmem_placement_suite.py", nprocs, "--gpus", gpus, "--init", init, "--expect", expect, timeout=120,
           mpirun=mpirun).expect_clean()
