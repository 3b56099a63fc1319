"""Run one of the multi-process suites beside this file under mpirun and judge its output.

The suites print the lines of ``suite_report``; a run is clean when mpirun exits 0 and every
process printed a summary with no failure and at least one pass.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

HERE = Path(__file__).parent
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def find_mpirun(what: str, modules: Iterable[tuple[str, str]], library: str | None = None) -> str:
    """mpirun's path, or skip saying what is missing: mpirun, a Python module, or `library`."""
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip(f"mpirun is not on PATH (install Open MPI to run the {what} tests)")
    for module, why in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(why)
    if library is not None:
        from mpbind import _loader
        from mpbind.errors import LibraryConflictError, LibraryNotFoundError

        try:
            _loader.load(library)
        except LibraryConflictError:
            raise  # two copies in the process is a failure to see, not a missing library
        except LibraryNotFoundError as exc:
            pytest.skip(f"the {library} library is not available: {exc}")
    return path


def run(mpirun: str, suite: str, nprocs: int, *args: str, timeout: float, forward: Iterable[str] = (),
        share_gpu: bool = True) -> tuple[int, str]:
    """``mpirun -np nprocs python suite args``: (exit status, output).

    `forward` names variables passed on to the ranks when set. With `share_gpu` the ranks may
    outnumber the cores, and under an MPS daemon (``CUDA_MPS_PIPE_DIRECTORY``) each gets an equal
    share of the GPU, which NVSHMEM needs for its full multi-PE-per-GPU mode; otherwise
    (one rank per GPU) they are not bound to cores.
    """
    env = dict(os.environ)
    env.update(NVLS_OFF)
    # `-x NAME` forwards a variable; give the two it always forwards a value if they lack one.
    env.setdefault("PYTHONPATH", "")
    env.setdefault("LD_LIBRARY_PATH", "")
    cmd = [mpirun, "--allow-run-as-root", *(["--oversubscribe"] if share_gpu else ["--bind-to", "none"]),
           "-np", str(nprocs)]
    for name, value in NVLS_OFF.items():
        cmd += ["-x", f"{name}={value}"]
    if share_gpu and os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        cmd += ["-x", "CUDA_MPS_PIPE_DIRECTORY", "-x", f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={100 // nprocs}"]
    for name in forward:
        if os.environ.get(name):
            cmd += ["-x", name]
    cmd += ["-x", "PYTHONPATH", "-x", "LD_LIBRARY_PATH", sys.executable, str(HERE / suite), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # mpirun forwards it to the ranks and cleans up
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, nothing else
            out, _ = proc.communicate()
        pytest.fail(f"mpirun -np {nprocs} {suite} {' '.join(args)} ran past {timeout:.0f} s:\n{out[-8000:]}")
    print(out)  # shown with -s or on failure: every PASS/SKIP/XFAIL line
    return proc.returncode, out


def passed(out: str, who: str, index: int) -> set[str]:
    """The names of the checks process `index` passed."""
    tag = f" [{who} {index}]"
    return {line[len("PASS "):].split(tag)[0] for line in out.splitlines()
            if line.startswith("PASS ") and line.split(":")[0].endswith(tag)}


def assert_clean(nprocs: int, rc: int, out: str, who: str = "pe") -> None:
    summary = re.compile(rf"^{who}=(\d+) passed=(\d+) failed=(\d+)", re.MULTILINE)
    summaries = {int(i): (int(p), int(f)) for i, p, f in summary.findall(out)}
    failed_lines = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert rc == 0, f"mpirun exited {rc}; failed checks: {failed_lines}\n{out[-8000:]}"
    assert sorted(summaries) == list(range(nprocs)), f"summaries from {who}s {sorted(summaries)}\n{out[-8000:]}"
    assert all(failed == 0 for _, failed in summaries.values()), f"{failed_lines}\n{out[-8000:]}"
    assert all(p > 0 for p, _ in summaries.values()), out[-8000:]
