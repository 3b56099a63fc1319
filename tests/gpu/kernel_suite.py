"""What the suites of kernels that call NVSHMEM share (nvshmem_kernels_mpi_suite.py,
collective_matmul_mpi_suite.py): the example each one checks, the refusal check, and the main
that starts NVSHMEM on this PE's GPU and prints the report."""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from suite_report import Report, emit, expect

from mpbind.errors import UsageError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> Any:
    """examples/<name>.py as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(fn: Callable[[], object], match: str) -> str:
    """`fn()` raises UsageError mentioning `match`; its message, shortened, as the check's note."""
    try:
        fn()
    except UsageError as exc:
        expect(match in str(exc), f"UsageError {exc} does not mention {match!r}")
        return str(exc)[:120]
    raise AssertionError(f"no UsageError (expected one mentioning {match!r})")


def main(doc: str, run: Callable[[Report, argparse.Namespace], None],
         arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """Parse --one-gpu (and `arguments`), start NVSHMEM on this PE's GPU, run, print the summary."""
    from mpbind import nvshmem

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0 (several PEs share it)")
    if arguments is not None:
        arguments(ap)
    a = ap.parse_args()
    hang_after = int(os.environ.get("SUITE_DUMP_AFTER", "0") or 0)
    if hang_after > 0:  # where every thread is, should the suite still run then (a hang, not a failure)
        faulthandler.dump_traceback_later(hang_after, exit=False)
    comm, device = load_example("_pes").start(a.one_gpu)  # the examples' PE placement, NVLS off
    report = Report(comm.Get_rank(), tracebacks="NVSHMEM_SUITE_TRACEBACKS")
    a.comm = comm
    try:
        with nvshmem.init(mpi_comm=comm, device=device):
            run(report, a)
    except Exception as exc:  # noqa: BLE001 - reported as a failed setup
        report.failed += 1
        report.line("FAIL", "setup", f"{type(exc).__name__}: {exc}")
    emit(report.summary())
    return 1 if report.failed else 0
