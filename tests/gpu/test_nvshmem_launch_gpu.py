"""NVSHMEM's collective launch of a real kernel (``nvshmem_launch_suite.py``, beside this file):
one PE on GPU 0, initialised with a unique id, so neither MPI nor a compiler is needed."""

from __future__ import annotations

import pytest
from runner import launch

pytestmark = pytest.mark.gpu


def test_nvshmem_collective_launch_suite() -> None:
    launch("nvshmem_launch_suite.py", 1, timeout=180, mpirun=None).expect_clean()
