"""The fuzz harness itself: each way a call can end is recorded for that call, and the batch goes on
from the next call in a new child; a child's memory is limited; every value can be made; a deep
recipe's slots are its arguments, their elements and the defaults it leaves out; a copy that
shares what it owns is found."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fuzz_deep
import fuzz_runner as runner
import fuzz_values
import pytest
from fuzz_targets import FUNCTION, Param, Target


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


def test_every_value_source_makes_a_value() -> None:
    for source, value in fuzz_values.VALUES.items():
        value.make()  # raises (a typo in a table) or returns
        assert fuzz_values.make(source) is not None or source == "None"


def test_a_recipe_slot_is_each_argument_element_and_left_out_default() -> None:
    target = Target("m", None, "f", FUNCTION, (Param("a"), Param("b"), Param("c", optional=True),
                                              Param("d", keyword_only=True, optional=True)), "fixed")
    recipe = fuzz_deep.parse(target, "f(dl(), (1, [2]))", curated=True)
    assert [(s.name, s.intake, s.added) for s in recipe.slots] == [
        ("a", True, False), ("b", False, False), ("b[0]", False, False), ("b[1]", False, False),
        ("b[1][0]", False, False), ("c", False, True), ("d", False, True)]
    rendered = [fuzz_deep.DeepCall(recipe, i, "None").render() for i in range(len(recipe.slots))]
    assert rendered == ["f(None, (1, [2]))", "f(dl(), None)", "f(dl(), (None, [2]))", "f(dl(), (1, None))",
                        "f(dl(), (1, [None]))", "f(dl(), (1, [2]), c=None)", "f(dl(), (1, [2]), d=None)"]


def test_a_ptr_nbytes_pair_is_malformed_as_an_array_not_as_a_buffer() -> None:
    # register() documents (ptr, nbytes) as a buffer; the hot calls take (ptr, count, dtype) only.
    def call(module: str, owner: str | None, name: str) -> fuzz_deep.DeepCall:
        target = Target(module, owner, name, FUNCTION, (Param("buffer"),), "fixed")
        return fuzz_deep.DeepCall(fuzz_deep.parse(target, f"{name}(intake(x))", curated=True), 0, "(PTR, 4)")

    assert not call("mpbind.nccl", "Communicator", "register").malformed_intake
    assert not call("mpbind.nvshmem", None, "register").malformed_intake
    assert call("mpbind.nccl", "Communicator", "all_reduce").malformed_intake


def test_a_recipe_must_give_every_required_parameter() -> None:
    target = Target("m", None, "f", FUNCTION, (Param("a"), Param("b")), "fixed")
    with pytest.raises(ValueError, match="required"):
        fuzz_deep.parse(target, "f(1)", curated=True)


class _Handle:
    """What an owning object holds: closing it closes every object that holds it."""

    closed = False


class _Owner:
    __module__ = "mpbind.fake"

    def __init__(self) -> None:
        self.handle = _Handle()

    @property
    def closed(self) -> bool:
        return self.handle.closed

    def close(self) -> None:
        self.handle.closed = True


class _RefusesCopy(_Owner):
    def __copy__(self) -> _RefusesCopy:
        raise TypeError("cannot copy")


class _CopiesToItself(_Owner):
    def __copy__(self) -> _CopiesToItself:
        return self


def test_a_copy_that_shares_what_it_owns_is_found() -> None:
    assert fuzz_deep.copy_shares(_Owner()) is not None
    assert fuzz_deep.copy_shares(_RefusesCopy()) is None
    assert fuzz_deep.copy_shares(_CopiesToItself()) is None
