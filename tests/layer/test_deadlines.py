"""Deadlines and Ctrl-C in the Pythonic layer without a GPU: the timeout= and watchdog= arguments of
mpbind.nccl and mpbind.nvshmem, NVSHMEM's initialisation given up at its deadline or by Ctrl-C, and
the arrival check over MPI that names the PEs that never came (with an in-process stand-in for MPI).

The NCCL waits themselves (init waiting for a missing peer, the watchdog over collectives) need a
GPU: tests/faults runs them.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from mpbind import nccl, nvshmem
from mpbind.errors import UsageError, WaitTimeoutError

UID = b"\0" * 128


# --- arguments, refused before anything collective ------------------------------------------------


@pytest.mark.parametrize(("value", "error"), [
    (math.nan, UsageError), (math.inf, UsageError), (-5, UsageError), (0, UsageError), (True, TypeError),
    ("600", TypeError),
])
def test_nccl_init_refuses_a_bad_timeout(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="timeout must be a number of seconds > 0"):
        nccl.Communicator.init(2, 0, UID, timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1, 0, "yes", 1.0])
def test_nccl_init_refuses_a_non_bool_watchdog(value: object) -> None:
    with pytest.raises(TypeError, match="watchdog must be True, False or None"):
        nccl.Communicator.init(2, 0, UID, watchdog=value)  # type: ignore[arg-type]


def test_from_mpi_checks_the_deadline_before_sharing_the_unique_id() -> None:
    class Comm:  # an mpi4py communicator whose broadcast must not run
        def Get_rank(self) -> int:  # noqa: N802 (mpi4py's names)
            return 0

        def Get_size(self) -> int:  # noqa: N802
            return 2

        def bcast(self, obj: object, root: int = 0) -> object:
            raise AssertionError("the unique id was shared before the arguments were checked")

    with pytest.raises(UsageError, match="timeout"):
        nccl.Communicator.from_mpi(Comm(), timeout=-1)
    with pytest.raises(TypeError, match="watchdog"):
        nccl.Communicator.from_mpi(Comm(), watchdog="on")  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"timeout": math.nan}, UsageError, "timeout"),
    ({"timeout": -1.0}, UsageError, "timeout"),
    ({"timeout": math.inf}, UsageError, "timeout"),
    ({"timeout": True}, TypeError, "timeout"),
    ({"watchdog": 1}, TypeError, "watchdog"),
])
def test_nvshmem_init_refuses_bad_deadline_arguments(kwargs: dict[str, Any], error: type[Exception],
                                                     name: str) -> None:
    with pytest.raises(error, match=name):
        nvshmem.init(UID, 0, 2, **kwargs)
    assert not nvshmem.is_initialized()


def test_the_flight_record_of_nvshmem_is_empty_while_not_watched() -> None:
    assert nvshmem.recent_operations() == []


# --- NVSHMEM's initialisation, bounded ----------------------------------------------------------

# The flat initialisation replaced by a call that blocks for 100 s (a PE that never comes).
_BLOCKED_INIT = """
    import os, signal, threading, time
    from mpbind import nvshmem as nv
    from mpbind.errors import UsageError, WaitTimeoutError
    nv._select_device = lambda device: None
    nv._flat().init_attr = lambda flags, attr: time.sleep(100)
"""


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(_BLOCKED_INIT) + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout)


def test_nvshmem_init_gives_up_at_its_deadline_and_cannot_be_tried_again() -> None:
    start = time.monotonic()
    proc = _run("""
        t = time.monotonic()
        try:
            nv.init(b"\\0" * 128, 0, 2, timeout=0.5, notice_after=0.2)
        except WaitTimeoutError as e:
            print(f"{time.monotonic() - t:.2f}", e)
        try:
            nv.init(b"\\0" * 128, 0, 2, timeout=0.5)
        except UsageError as e:
            print(e)
        print(nv.is_initialized())
    """)
    assert proc.returncode == 0, proc.stderr
    took, *_ = proc.stdout.split()
    assert 0.5 <= float(took) < 2.0
    lines = proc.stdout.splitlines()
    assert "nvshmem.init (rank 0 of 2, uid bootstrap) did not complete within 0.5 s: not every PE called init" \
        in lines[0]
    assert "which PEs are missing cannot be known over a unique id" in lines[0]
    assert lines[1] == ("an earlier nvshmem.init (rank 0 of 2, uid bootstrap) was given up (WaitTimeoutError); "
                        "NVSHMEM cannot be initialised again in this process: end it")
    assert lines[2] == "False"
    assert "has waited 0.2 s for the other PEs" in proc.stderr and "given up after 0.5 s" in proc.stderr
    assert time.monotonic() - start < 30  # the process ends although the init thread still waits


def test_ctrl_c_interrupts_nvshmem_init_within_a_second() -> None:
    proc = _run("""
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t = time.monotonic()
        try:
            nv.init(b"\\0" * 128, 0, 2, timeout=60)
        except KeyboardInterrupt:
            print(f"{time.monotonic() - t:.2f}")
    """)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) < 0.3 + 1.0


# --- the arrival check over MPI -----------------------------------------------------------------


class _Net:
    """Messages between in-process stand-ins for the ranks of an MPI communicator."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.boxes: dict[tuple[int, int, int], list[Any]] = {}


class _Request:
    def __init__(self, net: _Net, key: tuple[int, int, int] | None) -> None:
        self.net, self.key = net, key

    def test(self) -> tuple[bool, Any]:
        if self.key is None:
            return True, None
        with self.net.lock:
            box = self.net.boxes.get(self.key)
            if box:
                return True, box.pop(0)
        return False, None

    def cancel(self) -> None:
        self.key = None


class _Comm:
    """What mpbind.nvshmem's arrival check uses of an mpi4py communicator."""

    def __init__(self, net: _Net, rank: int, size: int) -> None:
        self.net, self.rank, self.size = net, rank, size

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's names)
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def isend(self, obj: Any, dest: int, tag: int) -> _Request:
        with self.net.lock:
            self.net.boxes.setdefault((self.rank, dest, tag), []).append(obj)
        return _Request(self.net, None)

    def irecv(self, source: int, tag: int) -> _Request:
        return _Request(self.net, (source, self.rank, tag))


def _arrive(comms: list[_Comm], seconds: float) -> dict[int, BaseException | None]:
    """Run the arrival check of each of `comms` on a thread of its own (the ranks that came)."""
    out: dict[int, BaseException | None] = {}

    def one(c: _Comm) -> None:
        try:
            nvshmem._arrival(c, seconds, "nvshmem.init")
            out[c.rank] = None
        except BaseException as exc:
            out[c.rank] = exc

    threads = [threading.Thread(target=one, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_every_pe_there_passes_the_arrival_check() -> None:
    net = _Net()
    out = _arrive([_Comm(net, r, 3) for r in range(3)], 10.0)
    assert out == {0: None, 1: None, 2: None}


def test_the_pes_that_arrived_name_the_one_that_never_did() -> None:
    net = _Net()
    start = time.monotonic()
    out = _arrive([_Comm(net, 0, 3), _Comm(net, 2, 3)], 0.5)  # PE 1 never comes
    assert time.monotonic() - start < 0.5 + 2.0
    for rank in (0, 2):
        exc = out[rank]
        assert isinstance(exc, WaitTimeoutError), out
        assert "PE 1 of 3 never called init (checked over MPI before NVSHMEM's initialisation)" in str(exc)


def test_without_pe_0_the_others_say_what_cannot_be_known() -> None:
    net = _Net()
    out = _arrive([_Comm(net, 1, 2)], 0.3)
    exc = out[1]
    assert isinstance(exc, WaitTimeoutError)
    assert "PE 0, which collects who arrived, never did (or died); which other PEs arrived cannot be known" in str(exc)


def test_environment_default_reaches_nvshmem_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPBIND_TIMEOUT", "-3")
    with pytest.raises(UsageError, match="MPBIND_TIMEOUT must be a number of seconds > 0"):
        nvshmem.init(UID, 0, 2)
    monkeypatch.setenv("MPBIND_TIMEOUT", "1")
    monkeypatch.setenv("MPBIND_WATCHDOG", "maybe")
    with pytest.raises(UsageError, match="MPBIND_WATCHDOG"):
        nvshmem.init(UID, 0, 2)
    assert os.environ["MPBIND_TIMEOUT"] == "1"
