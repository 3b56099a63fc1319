"""The core's failure handling without a GPU: the bounded wait (deadline, Ctrl-C), blocking calls on a
thread of their own, the watchdog thread and its flight records, and the deadline arguments.

The wait, the Worker and a tracker are driven through mpbind._core._testing doubles: a condition
that holds after a while (or never), a "library call" that sleeps, and a tracker whose CUDA events
are counters that complete after a number of looks (or never). The same code serves the NCCL and
NVSHMEM objects, whose own cases need GPUs (tests/faults).
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mpbind import _core, errors
from mpbind.errors import CollectiveTimeoutError, CommunicatorAbortedError, MpbindError, UsageError, WaitTimeoutError

T = _core._testing
SLACK = 1.0  # seconds: the machine's scheduling on top of a deadline (the wait itself checks every 5 ms)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv("MPBIND_TIMEOUT", raising=False)
    monkeypatch.delenv("MPBIND_WATCHDOG", raising=False)
    yield monkeypatch


def _interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def _elapsed(fn: Callable[[], object]) -> tuple[float, BaseException | None]:
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:  # the caller asserts which
        return time.monotonic() - start, exc
    return time.monotonic() - start, None


# --- the bounded wait ----------------------------------------------------------------------------


def test_a_wait_that_never_ends_raises_at_its_deadline() -> None:
    gave_up = T.poll_gave_up()
    took, exc = _elapsed(lambda: T.poll(0.3))
    assert isinstance(exc, WaitTimeoutError) and isinstance(exc, TimeoutError) and isinstance(exc, MpbindError)
    assert 0.3 <= took < 0.3 + SLACK
    assert str(exc) == "testing.poll did not complete within 0.3 s: the test's condition never held"
    assert (exc.operation, exc.timeout, exc.detail) == ("testing.poll", 0.3, "the test's condition never held")
    assert T.poll_gave_up() == gave_up + 1  # the caller's give-up step ran before the error


def test_a_wait_returns_when_its_condition_holds() -> None:
    waited = T.poll(30.0, 0.05)
    assert 0.05 <= waited < 0.05 + SLACK


def test_ctrl_c_interrupts_a_wait_within_a_second() -> None:
    gave_up = T.poll_gave_up()
    _interrupt_after(0.2)
    took, exc = _elapsed(lambda: T.poll(60.0))
    assert isinstance(exc, KeyboardInterrupt), exc
    assert took < 0.2 + 1.0
    assert T.poll_gave_up() == gave_up + 1


def test_a_python_condition_waits_the_same_way() -> None:
    calls = []

    def ready() -> bool:
        calls.append(1)
        return len(calls) >= 3

    _core.wait_until(ready, 5.0, "three calls")
    assert len(calls) == 3
    took, exc = _elapsed(lambda: _core.wait_until(lambda: 0, 0.2, "never", "nothing comes"))
    assert isinstance(exc, WaitTimeoutError) and "never did not complete within 0.2 s: nothing comes" in str(exc)
    assert took < 0.2 + SLACK

    def broken() -> bool:
        raise LookupError("the condition itself failed")

    with pytest.raises(LookupError, match="the condition itself failed"):
        _core.wait_until(broken, 5.0, "broken")


def test_a_blocking_call_is_abandoned_at_the_deadline_and_cleans_up_when_it_returns() -> None:
    assert T.bounded_call(5.0, 0.01) == 7
    late = T.bounded_late()
    took, exc = _elapsed(lambda: T.bounded_call(0.2, 1.5))
    assert isinstance(exc, WaitTimeoutError), exc
    assert took < 1.0  # not the call's 1.5 s: it was left on its thread
    assert T.bounded_late() == late
    deadline = time.monotonic() + 10
    while T.bounded_late() == late and time.monotonic() < deadline:
        time.sleep(0.05)
    assert T.bounded_late() == late + 1  # the call returned and ran its own clean-up


def test_ctrl_c_abandons_a_blocking_call() -> None:
    _interrupt_after(0.2)
    took, exc = _elapsed(lambda: T.bounded_call(60.0, 3.0))
    assert isinstance(exc, KeyboardInterrupt), exc
    assert took < 0.2 + 1.0


# --- deadline and watchdog arguments ------------------------------------------------------------


def test_the_default_deadline_is_600_seconds_or_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert _core.default_timeout() == 600.0
    assert _core.timeout_arg(None, "timeout") == 600.0
    clean_env.setenv("MPBIND_TIMEOUT", "12.5")
    assert _core.timeout_arg(None, "timeout") == 12.5
    assert _core.timeout_arg(3, "timeout") == 3.0  # a given one wins
    for bad in ("abc", "0", "-1", "nan", "inf", "1e10", "5s"):
        clean_env.setenv("MPBIND_TIMEOUT", bad)
        with pytest.raises(UsageError, match=f"MPBIND_TIMEOUT must be a number of seconds > 0.*'{bad}'"):
            _core.timeout_arg(None, "timeout")


@pytest.mark.parametrize(("value", "error"), [
    (math.nan, UsageError), (math.inf, UsageError), (-math.inf, UsageError), (-1, UsageError), (0, UsageError),
    (0.0, UsageError), (1e10, UsageError), (2**200, UsageError), (True, TypeError), (False, TypeError),
    ("5", TypeError), (b"5", TypeError), ([5], TypeError), (object(), TypeError),
])
def test_a_bad_timeout_is_refused_naming_it(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="the_timeout must be a number of seconds > 0"):
        _core.timeout_arg(value, "the_timeout")


@pytest.mark.parametrize("value", [1e-3, 1, 2.5, 1e9])
def test_a_timeout_in_range_is_taken(value: float) -> None:
    assert _core.timeout_arg(value, "timeout") == float(value)


def test_the_watchdog_argument(clean_env: pytest.MonkeyPatch) -> None:
    assert _core.watchdog_arg(None, "watchdog") is False
    assert _core.watchdog_arg(True, "watchdog") is True
    clean_env.setenv("MPBIND_WATCHDOG", "1")
    assert _core.watchdog_arg(None, "watchdog") is True
    assert _core.watchdog_arg(False, "watchdog") is False
    clean_env.setenv("MPBIND_WATCHDOG", "0")
    assert _core.watchdog_arg(None, "watchdog") is False
    clean_env.setenv("MPBIND_WATCHDOG", "yes")
    with pytest.raises(UsageError, match="MPBIND_WATCHDOG must be 1 .* or 0, not 'yes'"):
        _core.watchdog_arg(None, "watchdog")
    for bad in (1, 0, "1", None.__class__):
        with pytest.raises(TypeError, match="watchdog must be True, False or None"):
            _core.watchdog_arg(bad, "watchdog")


# --- the watchdog and its flight records --------------------------------------------------------


def _until(predicate: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_an_operation_past_its_deadline_fails_its_tracker_with_the_flight_record(
        capfd: pytest.CaptureFixture[str]) -> None:
    t = T.FakeTracker(0.3)  # its events never complete
    seq = t.issue("all_reduce", 1024, 0x1234)
    start = time.monotonic()
    t.watch()
    assert _core.watchdog_running()
    assert _until(lambda: t.failed, 0.3 + 2 * SLACK)
    took = time.monotonic() - start
    assert took >= 0.3
    assert t.finding == {"reason": f"all_reduce #{seq} did not complete within 0.3 s", "overrun": True,
                         "operation": "all_reduce", "seq": seq}
    err = capfd.readouterr().err
    assert "mpbind: testing.FakeTracker failed: all_reduce #1 did not complete within 0.3 s" in err
    assert "flight record of testing.FakeTracker (last 1 operations, oldest first)" in err
    assert "#1 all_reduce 1024 x float32 (4096 B) on stream 0x1234" in err and ": pending" in err


def test_a_library_call_that_never_returns_is_an_overrun() -> None:
    t = T.FakeTracker(0.2, 0)
    t.begin("init")  # begun, never enqueued: it waits on the host
    t.watch()
    assert _until(lambda: t.failed, 0.2 + 2 * SLACK)
    assert "init #1 has not returned to the caller within 0.2 s" in t.finding["reason"]


def test_completed_operations_are_recorded_and_never_fail() -> None:
    t = T.FakeTracker(0.3, 1)  # each event completes on the second look
    for _ in range(3):
        t.issue("broadcast", 8)
    t.watch()
    assert _until(lambda: all(r["completed"] for r in t.recent()), 0.3 + 2 * SLACK)
    time.sleep(0.5)
    assert not t.failed
    rec = t.recent()
    assert [r["seq"] for r in rec] == [1, 2, 3]
    assert {r["state"] for r in rec} == {"completed"}
    first = rec[0]
    assert (first["operation"], first["count"], first["bytes"], first["dtype"], first["peer"]) == \
        ("broadcast", 8, 32, "float32", None)
    assert abs(first["enqueued"] - time.time()) < 60


def test_nothing_is_tracked_while_a_stream_captures_a_graph() -> None:
    t = T.FakeTracker(0.1, -1, True)
    t.issue("all_reduce", 4)
    t.watch()
    time.sleep(0.4)
    assert not t.failed  # no event was recorded in the capture: nothing to overrun
    assert [(r["state"], r["completed"]) for r in t.recent()] == [("untracked", None)]


def test_a_burst_between_looks_shares_events_per_stream_and_still_completes() -> None:
    t = T.FakeTracker(0.5, 1)  # each event completes on the second look after its last record
    for _ in range(40):  # a burst on one stream: 16 events from the pool, then the newest one again
        t.issue("all_reduce", 4, 0x10)
    assert t.events_made == 16
    t.issue("all_reduce", 4, 0x20)  # another stream: an event of its own
    assert t.events_made == 17
    t.watch()
    assert _until(lambda: all(r["state"] == "completed" for r in t.recent()), 0.5 + 2 * SLACK)
    time.sleep(0.3)
    assert not t.failed
    for _ in range(40):  # the pool is back: no event made
        t.issue("all_reduce", 4, 0x10)
    assert t.events_made == 17


def test_an_operation_covered_by_a_shared_event_still_overruns() -> None:
    t = T.FakeTracker(0.3)  # its events never complete
    for _ in range(30):
        t.issue("all_gather", 8, 0x10)
    t.watch()
    assert _until(lambda: t.failed, 0.3 + 2 * SLACK)
    assert t.finding["seq"] == 1 and t.finding["overrun"]
    states = [r["state"] for r in t.recent()]
    assert states == ["pending"] * 30, states


def test_the_flight_record_keeps_the_last_64_operations() -> None:
    t = T.FakeTracker(600.0, 0)
    for i in range(100):
        assert t.issue("send", i) == i + 1
    rec = t.recent()
    assert len(rec) == 64
    assert [r["seq"] for r in rec] == list(range(37, 101))
    assert [r["count"] for r in rec] == list(range(36, 100))


def test_tracking_an_operation_costs_little_host_time() -> None:
    # The flight record and the event pool without the driver's event record (GPU runs measure that):
    # a few hundred ns on a loaded CI core, well inside the 1 us budget of a watched all-reduce.
    ns = min(T.track_ns(20_000) for _ in range(3))
    assert ns < 1000, ns


def _run(code: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_the_watchdog_thread_stops_at_interpreter_exit() -> None:
    start = time.monotonic()
    proc = _run("""
        from mpbind import _core
        t = _core._testing.FakeTracker(600.0)
        t.issue("all_reduce", 1)
        t.watch()
        assert _core.watchdog_running()
        print("watching")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "watching"
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30


def test_the_watchdog_thread_stops_after_a_failure_too() -> None:
    proc = _run("""
        import time
        from mpbind import _core
        t = _core._testing.FakeTracker(0.1)
        t.issue("all_reduce", 1)
        t.watch()
        while not t.failed:
            time.sleep(0.01)
        _core._stop_watchdog()
        print(_core.watchdog_running())
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
    assert "did not complete within 0.1 s" in proc.stderr


# --- the error classes --------------------------------------------------------------------------


def test_the_failure_errors_are_picklable_and_typed() -> None:
    wait = WaitTimeoutError("nccl.Communicator.init (rank 0 of 2)", 5.0, "a rank never came")
    aborted = CommunicatorAbortedError("nccl.Communicator serial 3 (rank 1 of 2, device 1)", 1, "all_reduce", 7,
                                       "NCCL reported ncclRemoteError (6) on this communicator")
    overrun = CollectiveTimeoutError("nccl.Communicator serial 3 (rank 1 of 2, device 1)", 1, "all_reduce", 7,
                                     "all_reduce #7 did not complete within 5 s")
    for e in (wait, overrun):
        assert isinstance(e, TimeoutError) and isinstance(e, OSError) and isinstance(e, MpbindError)
        assert e.errno is None  # one message argument, not (errno, strerror)
    assert isinstance(overrun, CommunicatorAbortedError) and not isinstance(aborted, TimeoutError)
    for e in (wait, aborted, overrun):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and back.args == e.args
    assert str(wait) == "nccl.Communicator.init (rank 0 of 2) did not complete within 5 s: a rank never came"
    assert (overrun.communicator, overrun.rank, overrun.operation, overrun.sequence) == \
        ("nccl.Communicator serial 3 (rank 1 of 2, device 1)", 1, "all_reduce", 7)
    assert str(overrun).startswith("nccl.Communicator serial 3 (rank 1 of 2, device 1) failed on rank 1 (at "
                                   "all_reduce #7): all_reduce #7 did not complete within 5 s. Every later call")
    for name in ("WaitTimeoutError", "CommunicatorAbortedError", "CollectiveTimeoutError"):
        assert name in errors.__all__
