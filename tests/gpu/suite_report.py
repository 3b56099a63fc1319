"""What every multi-process GPU suite here prints, so that one pytest wrapper reads them all.

One line per check, tagged with the process that ran it:

    PASS name [pe k]            the check held (a note may follow a colon)
    FAIL name [pe k]: reason    it did not
    SKIP name [pe k]: reason    it could not run here (the reason says why)
    XFAIL name [pe k]: reason   a documented limitation of the library, seen as documented
    INFO name [pe k]: text      a recorded fact, not a check

and a closing ``pe=<k> passed=<p> failed=<f> skipped=<s>`` (``rank=`` for the NCCL suites;
`` xfailed=<x>`` is added for suites that check documented limitations).

A suite's main runs its body under :func:`watched` (a watchdog, a failed setup reported, the
summary, the exit status); a suite over NVSHMEM ends with :func:`nvshmem_teardown`.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpbind.errors import FunctionNotFoundError


def emit(line: str) -> None:
    """Write one line in one write: `print` writes the text and the newline apart (with unbuffered
    output), and the lines of several processes sharing mpirun's output then run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Skip(Exception):
    """The check cannot run here; the message says why."""


class KnownLimitation(Exception):
    """The library behaved as its documented limitation says."""


@dataclass
class Report:
    index: int  # this process's PE or rank
    who: str = "pe"
    tracebacks: str = "SUITE_TRACEBACKS"  # set this environment variable to print a failure's traceback
    xfail_column: bool = False
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0

    def line(self, status: str, name: str, detail: str = "") -> None:
        text = f"{status} {name} [{self.who} {self.index}]"
        if detail:
            text += ": " + " ".join(detail.split())  # one line, whatever the message
        emit(text)

    def info(self, name: str, detail: str) -> None:
        self.line("INFO", name, detail)

    def check(self, name: str, fn: Callable[[], str | None]) -> None:
        try:
            note = fn()
        except Skip as exc:
            self.skipped += 1
            self.line("SKIP", name, str(exc))
        except KnownLimitation as exc:
            self.xfailed += 1
            self.line("XFAIL", name, str(exc))
        except FunctionNotFoundError as exc:
            self.skipped += 1
            self.line("SKIP", name, f"the loaded library lacks it: {exc}")
        except Exception as exc:
            self.failed += 1
            self.line("FAIL", name, f"{type(exc).__name__}: {exc}")
            if os.environ.get(self.tracebacks):
                traceback.print_exc()
        else:
            self.passed += 1
            self.line("PASS", name, note or "")

    def summary(self) -> str:
        text = f"{self.who}={self.index} passed={self.passed} failed={self.failed} skipped={self.skipped}"
        return text + (f" xfailed={self.xfailed}" if self.xfail_column else "")


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def expect_raises(exc_type: type[BaseException], fn: Callable[[], Any], what: str) -> str:
    """`fn()` raises `exc_type`; its message."""
    try:
        fn()
    except exc_type as exc:
        return str(exc)
    except Exception as exc:
        raise AssertionError(f"{what}: raised {type(exc).__name__}: {exc}, expected {exc_type.__name__}") from None
    raise AssertionError(f"{what}: did not raise {exc_type.__name__}")


def add_timeout(ap: argparse.ArgumentParser, default: float) -> None:
    """The ``--timeout`` option of a suite run under :func:`watched`."""
    ap.add_argument("--timeout", type=float, default=default,
                    help="dump every thread's stack and exit after this many seconds (a hang)")


def watched(report: Report, timeout: float, body: Callable[[], None], *, elapsed: bool = False) -> int:
    """Run a suite's `body` and print its summary; the process's exit status (1 when anything failed).

    A C-level watchdog dumps every thread's stack and exits after `timeout` seconds: it fires even
    while a thread is blocked in CUDA or a library. An exception out of `body` is its setup failing
    (nothing else can run): one ``FAIL setup`` line and its traceback. With `elapsed`, an ``INFO
    elapsed`` line (seconds since the start) comes before the summary.
    """
    faulthandler.dump_traceback_later(timeout, exit=True)
    start = time.monotonic()
    try:
        body()
    except Exception as exc:
        report.failed += 1
        report.line("FAIL", "setup", f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    finally:
        faulthandler.cancel_dump_traceback_later()
        if elapsed:
            report.info("elapsed", f"{time.monotonic() - start:.2f} s")
        emit(report.summary())
    return 1 if report.failed else 0


def nvshmem_teardown(report: Report, comm: Any, sync: Callable[[], object], finalize: Callable[[], None]) -> None:
    """The end of a suite over NVSHMEM, on every PE alike: its work synchronised (`sync`), the PEs
    aligned, then the checks that no release is left queued for ``mpbind.drain()`` and that
    `finalize` (NVSHMEM's) succeeds."""
    from mpbind import _core  # on use: importing this module starts nothing of mpbind's

    sync()
    comm.Barrier()
    report.check("teardown.queue_empty", lambda: expect(_core.queued() == [], f"{_core.queued()}"))
    report.check("teardown.nvshmem_finalize", finalize)
