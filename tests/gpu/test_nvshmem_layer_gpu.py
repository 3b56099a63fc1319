"""mpbind.nvshmem (the Pythonic layer) on 1, 2 and 4 PEs sharing GPU 0, under mpirun.

Each case launches ``nvshmem_layer_mpi_suite.py`` (beside this file) with ``mpirun -np N`` and
checks that every PE finished and reported no failed check. Initialisation goes through a
unique id shared over MPI (``uid``) or through the MPI communicator (``mpi``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SUITE = Path(__file__).with_name("nvshmem_layer_mpi_suite.py")
TIMEOUT_S = 180.0
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
SUMMARY = re.compile(r"^pe=(\d+) passed=(\d+) failed=(\d+)", re.MULTILINE)


@pytest.fixture(scope="module")
def mpirun() -> str:
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("mpirun is not on PATH (install Open MPI to run the multi-PE NVSHMEM tests)")
    for module, why in (("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
                        ("cupy", "CuPy is not installed (the suite views symmetric memory through it)")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(why)
    return path


def _run(mpirun: str, nprocs: int, *args: str) -> tuple[int, str]:
    env = dict(os.environ)
    env.update(NVLS_OFF)
    # `-x NAME` forwards a variable; give the two it forwards by name a value if they lack one.
    env.setdefault("PYTHONPATH", "")
    env.setdefault("LD_LIBRARY_PATH", "")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(nprocs)]
    for name, value in NVLS_OFF.items():
        cmd += ["-x", f"{name}={value}"]
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        # Under an MPS daemon, PEs sharing the GPU whose thread percentages add up to at
        # most 100 get NVSHMEM's full multi-PE-per-GPU mode (collectives, teams, waits);
        # without MPS the suite skips what NVSHMEM's limited mode would exit on.
        cmd += ["-x", "CUDA_MPS_PIPE_DIRECTORY", "-x", f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={100 // nprocs}"]
    cmd += ["-x", "PYTHONPATH", "-x", "LD_LIBRARY_PATH", sys.executable, str(SUITE), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # mpirun forwards it to the ranks and cleans up
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, nothing else
            out, _ = proc.communicate()
        pytest.fail(f"mpirun -np {nprocs} {' '.join(args)} ran past {TIMEOUT_S:.0f} s:\n{out[-8000:]}")
    return proc.returncode, out


def _assert_clean(nprocs: int, rc: int, out: str) -> None:
    summaries = {int(pe): (int(passed), int(failed)) for pe, passed, failed in SUMMARY.findall(out)}
    failed_lines = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert rc == 0, f"mpirun exited {rc}; failed checks: {failed_lines}\n{out[-8000:]}"
    assert sorted(summaries) == list(range(nprocs)), f"summaries from PEs {sorted(summaries)}\n{out[-8000:]}"
    assert all(failed == 0 for _, failed in summaries.values()), f"{failed_lines}\n{out[-8000:]}"
    assert all(passed > 0 for passed, _ in summaries.values()), out[-8000:]


@pytest.mark.parametrize("init", ["uid", "mpi"])
@pytest.mark.parametrize("nprocs", [1, 2, 4], ids=lambda n: f"np{n}")
def test_nvshmem_layer_suite(mpirun: str, nprocs: int, init: str) -> None:
    rc, out = _run(mpirun, nprocs, "--init", init)
    print(out)  # shown with -s or on failure: every PASS/SKIP line
    _assert_clean(nprocs, rc, out)
