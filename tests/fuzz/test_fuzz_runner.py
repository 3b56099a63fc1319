"""The fuzz harness's runner: each way a call can end is recorded for that call, and the batch
goes on from the next call in a new child; a child's memory is limited."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fuzz_runner as runner


def _returns() -> int:
    return 1


def _segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _c_exit() -> None:
    ctypes.CDLL(None).exit(255)  # as the libraries do: C exit(), not SystemExit


def _blocks() -> None:
    time.sleep(60)


def _blocks_without_sigint() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    time.sleep(60)


def _execute(item: Callable[[], Any], state: None) -> dict[str, Any]:
    return {"outcome": "returned", "value": item()}


def test_every_ending_is_recorded_and_the_batch_goes_on(tmp_path: Path) -> None:
    batch = [_returns, _segfault, _returns, _c_exit, _blocks, _returns, _blocks_without_sigint, _returns]
    started = time.monotonic()
    [records] = runner.run([batch], _execute, lambda: None, jobs=1, timeout=0.5, workdir=tmp_path, grace=0.5)
    assert time.monotonic() - started < 20
    assert [r["outcome"] for r in records] == [
        "returned", "signal", "returned", "exit", "timeout", "returned", "timeout", "returned"]
    assert records[1]["signal"] == "SIGSEGV"
    assert records[3]["status"] == 255
    assert records[4]["interruptible"] is True
    assert records[6]["interruptible"] is False


def test_batches_run_side_by_side(tmp_path: Path) -> None:
    batches: list[list[Callable[[], Any]]] = [[_returns] * 3, [_segfault, _returns], [], [_c_exit]]
    results = runner.run(batches, _execute, lambda: None, jobs=2, timeout=5, workdir=tmp_path)
    assert [[r["outcome"] for r in rs] for rs in results] == [
        ["returned"] * 3, ["signal", "returned"], [], ["exit"]]


def _allocates_without_bound() -> None:
    hoard = []
    while True:
        hoard.append(bytearray(1 << 24))


def _execute_raising(item: Callable[[], Any], state: None) -> dict[str, Any]:
    try:
        return {"outcome": "returned", "value": item()}
    except MemoryError:
        return {"outcome": "raised", "exception": "MemoryError"}


def test_a_child_over_its_memory_limit_gets_memory_error(tmp_path: Path) -> None:
    [records] = runner.run([[_allocates_without_bound, _returns]], _execute_raising, lambda: None, jobs=1,
                           timeout=20, workdir=tmp_path, memory=256 << 20)
    assert [r["outcome"] for r in records] == ["raised", "returned"]
    assert records[0]["exception"] == "MemoryError"
