"""NVSHMEM's collective launch of a real kernel (``nvshmem_launch_suite.py``, beside this file):
one PE on GPU 0, initialised with a unique id, so neither MPI nor a compiler is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun_suite import assert_clean

pytestmark = pytest.mark.gpu

SUITE = Path(__file__).parent / "nvshmem_launch_suite.py"


def test_nvshmem_collective_launch_suite() -> None:
    env = dict(os.environ, NVSHMEM_DISABLE_NVLS="1", NCCL_NVLS_ENABLE="0")
    try:
        proc = subprocess.run([sys.executable, str(SUITE)], capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{SUITE.name} ran past 180 s:\n{exc.stdout!r}")
    out = proc.stdout + proc.stderr
    print(out)  # every PASS/XFAIL line, shown with -s or on failure
    assert_clean(1, proc.returncode, out)
