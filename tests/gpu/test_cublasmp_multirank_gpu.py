"""cuBLASMp and NCCL on 2 and 4 ranks, one per GPU, under mpirun: the flat bindings
(``cublasmp_multirank.py``) and the Pythonic layer (``layer_multirank.py``).

Each case launches a suite (beside this file) with ``mpirun -np N`` and checks that every rank
finished, reported no failed check and passed the suite's main checks. NCCL allows one rank per GPU, so a case
runs only where at least N GPUs are visible; on a one-GPU machine both are skipped.

The libraries are found as mpbind finds them everywhere: ``MPBIND_CUBLASMP_PATH`` and
``MPBIND_NCCL_PATH`` when set, and ``LD_PRELOAD`` (a newer NCCL for every library in the
process), which are passed on to the ranks.
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

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

# suite -> the checks every rank must have passed (name prefixes)
SUITES = {
    "cublasmp_multirank.py": ("matmul.allgather_gemm.", "matmul.gemm_reducescatter.", "gemm.summa."),
    "layer_multirank.py": ("nccl.collectives", "nccl.teardown_order", "cublasmp.matmul_2d.", "cublasmp.close_order"),
}
TIMEOUT_S = 300.0
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
FORWARDED = ("MPBIND_CUBLASMP_PATH", "MPBIND_NCCL_PATH", "LD_PRELOAD", "CUBLASMP_SUITE_TRACEBACKS")
SUMMARY = re.compile(r"^rank=(\d+) passed=(\d+) failed=(\d+)", re.MULTILINE)


@pytest.fixture(scope="module")
def mpirun() -> str:
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("mpirun is not on PATH (install Open MPI to run the multi-rank cuBLASMp tests)")
    for module, why in (("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
                        ("torch", "torch is not installed (the suite uses torch tensors as buffers)")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(why)
    from mpbind import _loader
    from mpbind.errors import LibraryNotFoundError

    try:
        _loader.load("cublasmp")
    except LibraryNotFoundError as exc:
        pytest.skip(f"the cuBLASMp library is not available: {exc}")
    return path


def _gpu_count() -> int:
    import torch

    return int(torch.cuda.device_count())


def _run(mpirun: str, nprocs: int, suite: str) -> tuple[int, str]:
    env = dict(os.environ)
    env.update(NVLS_OFF)
    env.setdefault("PYTHONPATH", "")
    env.setdefault("LD_LIBRARY_PATH", "")
    cmd = [mpirun, "--allow-run-as-root", "--bind-to", "none", "-np", str(nprocs)]
    for name, value in NVLS_OFF.items():
        cmd += ["-x", f"{name}={value}"]
    for name in FORWARDED:
        if os.environ.get(name):
            cmd += ["-x", name]
    cmd += ["-x", "PYTHONPATH", "-x", "LD_LIBRARY_PATH", sys.executable, str(Path(__file__).with_name(suite))]
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
        pytest.fail(f"mpirun -np {nprocs} ran past {TIMEOUT_S:.0f} s:\n{out[-8000:]}")
    return proc.returncode, out


def _assert_clean(nprocs: int, rc: int, out: str, suite: str) -> None:
    summaries = {int(r): (int(p), int(f)) for r, p, f in SUMMARY.findall(out)}
    failed_lines = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert rc == 0, f"mpirun exited {rc}; failed checks: {failed_lines}\n{out[-8000:]}"
    assert sorted(summaries) == list(range(nprocs)), f"summaries from ranks {sorted(summaries)}\n{out[-8000:]}"
    assert all(failed == 0 for _, failed in summaries.values()), f"{failed_lines}\n{out[-8000:]}"
    for rank in range(nprocs):
        for prefix in ("PASS " + name for name in SUITES[suite]):
            assert any(line.startswith(prefix) and line.split(":")[0].endswith(f"[rank {rank}]")
                       for line in out.splitlines()), f"rank {rank} passed no {prefix[5:]} check\n{out[-8000:]}"


@pytest.mark.parametrize("suite", sorted(SUITES))
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_cublasmp_multirank(mpirun: str, nprocs: int, suite: str) -> None:
    gpus = _gpu_count()
    if gpus < nprocs:
        pytest.skip(f"needs {nprocs} GPUs (NCCL allows one rank per GPU); {gpus} visible")
    rc, out = _run(mpirun, nprocs, suite)
    print(out)  # shown with -s or on failure: every PASS/SKIP line
    _assert_clean(nprocs, rc, out, suite)
