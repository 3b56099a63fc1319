"""What every multi-process GPU suite here prints, so that one pytest wrapper reads them all.

One line per check, tagged with the process that ran it:

    PASS name [pe k]            the check held (a note may follow a colon)
    FAIL name [pe k]: reason    it did not
    SKIP name [pe k]: reason    it could not run here (the reason says why)
    XFAIL name [pe k]: reason   a documented limitation of the library, seen as documented
    INFO name [pe k]: text      a recorded fact, not a check

and a closing ``pe=<k> passed=<p> failed=<f> skipped=<s>`` (``rank=`` for the NCCL suites;
`` xfailed=<x>`` is added for suites that check documented limitations).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from mpbind.errors import FunctionNotFoundError


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
        print(text, flush=True)

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
