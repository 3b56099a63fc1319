"""The Pythonic cuFFTMp layer (mpbind.cufftmp) on 1, 2 and 4 PEs sharing GPU 0, under mpirun.

Each case launches ``cufftmp_layer_mpi_suite.py`` (beside this file) with ``mpirun -np N`` and
checks that every PE finished, reported no failed check, ran the FFT and reshape checks, and
drained a dropped plan. The library is found as mpbind finds it everywhere:
``MPBIND_CUFFTMP_PATH`` (and ``MPBIND_NVSHMEM_PATH``) when set, which are passed on to the
ranks, else cuda.pathfinder.
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

SUITE = Path(__file__).with_name("cufftmp_layer_mpi_suite.py")
TIMEOUT_S = 240.0
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
LIBRARY_VARS = ("MPBIND_CUFFTMP_PATH", "MPBIND_NVSHMEM_PATH")
SUMMARY = re.compile(r"^pe=(\d+) passed=(\d+) failed=(\d+)", re.MULTILINE)


@pytest.fixture(scope="module")
def mpirun() -> str:
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("mpirun is not on PATH (install Open MPI to run the multi-PE cuFFTMp tests)")
    for module, why in (("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
                        ("cupy", "CuPy is not installed (the suite views device memory through it)")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(why)
    from mpbind import _loader
    from mpbind.errors import LibraryNotFoundError

    try:
        _loader.load("cufftmp")
    except LibraryNotFoundError as exc:
        pytest.skip(f"the cuFFTMp library is not available: {exc}")
    return path


def _run(mpirun: str, nprocs: int, *args: str) -> tuple[int, str]:
    env = dict(os.environ)
    env.update(NVLS_OFF)
    # `-x NAME` forwards a variable; give the two it always forwards a value if they lack one.
    env.setdefault("PYTHONPATH", "")
    env.setdefault("LD_LIBRARY_PATH", "")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(nprocs)]
    for name, value in NVLS_OFF.items():
        cmd += ["-x", f"{name}={value}"]
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        # Under an MPS daemon, PEs sharing the GPU whose thread percentages add up to at most
        # 100 get NVSHMEM's full multi-PE-per-GPU mode; without it NVSHMEM runs them in its
        # limited mode (the suite reports which as INFO init_status).
        cmd += ["-x", "CUDA_MPS_PIPE_DIRECTORY", "-x", f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={100 // nprocs}"]
    for name in LIBRARY_VARS:
        if os.environ.get(name):
            cmd += ["-x", name]
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
    for pe in range(nprocs):
        passed = {line.split(" [pe ")[0][len("PASS "):] for line in out.splitlines()
                  if line.startswith("PASS ") and f"[pe {pe}]" in line}
        for name in ("slab.c2c.exec", "slab.z2z.exec", "slab.r2c_c2r.exec", "slab.c2c.descriptor",
                     "reshape.xslab_to_yslab.complex64", "reshape.xslab_to_yslab.int32",
                     "teardown.dropped_plan_drained", "plan.lifecycle", "teardown.queue_empty"):
            assert name in passed, f"pe {pe} did not pass {name}\n{out[-8000:]}"


@pytest.mark.parametrize("nprocs", [1, 2, 4], ids=lambda n: f"np{n}")
def test_cufftmp_layer_suite(mpirun: str, nprocs: int) -> None:
    rc, out = _run(mpirun, nprocs)
    print(out)  # shown with -s or on failure: every PASS line
    _assert_clean(nprocs, rc, out)
