"""Run batches of calls in forked child processes, so that a crash, an exit or a block costs
only the rest of its batch.

The parent imports every module once (and may load the libraries) and forks a child per batch:
a child starts in a few milliseconds with nothing to import. Each child runs its batch in order
and reports one JSON line per call on a pipe. When a child dies, the parent records how (signal
or exit status) for the call that was running and forks a new child from the next call. A call
that exceeds the timeout gets SIGINT (recorded as interruptible when the call then raises
KeyboardInterrupt), then SIGKILL to its process group. Children run in their own process group
and working directory, with their output in a log file whose tail is kept for crashes and exits,
and may be given a memory limit: a call that would allocate without bound then fails (MemoryError)
instead of taking the machine's memory.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import os
import resource
import select
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Record = dict[str, Any]
Execute = Callable[[Any, Any], Record]  # (item, per-child state) -> record, run in the child

_LOG_TAIL = 600  # bytes of a dead child's output kept with its record


@dataclass
class _Child:
    pid: int
    fd: int
    batch: int
    next: int                     # index of the call running now
    log: Path
    deadline: float
    interrupted: bool = False     # SIGINT sent for the call `next`
    done_by_interrupt: bool = False
    buffer: bytes = b""
    killed: bool = False


@dataclass
class Progress:
    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    last: float = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= 10 or self.done == self.total:
            self.last = now
            print(f"  {self.done}/{self.total} calls, {now - self.started:.0f} s", file=sys.stderr, flush=True)


def _child_main(items: Sequence[Any], start: int, execute: Execute, make_state: Callable[[], Any],
                wfd: int, log: Path, workdir: Path, memory: int | None) -> None:
    """The forked child: run items[start:] and report each; never returns."""
    code = 0
    try:
        os.setpgid(0, 0)
        if memory is not None:
            _limit_memory(memory)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.chdir(workdir)
        faulthandler.disable()  # a crash is the call's outcome, not a traceback on the parent's terminal
        _quick_exit()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        state = make_state()
        for item in items[start:]:
            try:
                record = execute(item, state)
            except KeyboardInterrupt:
                record = {"outcome": "interrupted"}
            _write_all(wfd, (json.dumps(record) + "\n").encode())
            if record["outcome"] == "interrupted":
                break
    except BaseException:  # the harness itself failed in the child: say so in its log
        import traceback

        traceback.print_exc()
        code = 70
    finally:
        os._exit(code)


def _quick_exit() -> None:
    """Make exit() end the process at once, with its status: the loaded libraries' destructors take
    longer than the call (thousands of calls end the process), and a dead child reports nothing.
    C stdout is made unbuffered so that what the library printed before exiting reaches the log."""
    libc = ctypes.CDLL(None)
    libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)  # handlers run last-registered first
    libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), None, 2, 0)  # _IONBF


def _limit_memory(extra: int) -> None:
    """Let this process's data (heap and private mappings, RLIMIT_DATA) grow by `extra` bytes."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmData:"))
    limit = kib * 1024 + extra
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _tail(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _LOG_TAIL))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def run(batches: Sequence[Sequence[Any]], execute: Execute, make_state: Callable[[], Any], *, jobs: int,
        timeout: float, workdir: Path, progress: Progress | None = None, grace: float = 2.0,
        memory: int | None = None) -> list[list[Record]]:
    """Run every batch (in up to `jobs` children at once); one record per item, in order.

    A call still running after `timeout` seconds gets SIGINT, and SIGKILL `grace` seconds later.
    `memory`: bytes a child may allocate beyond what it starts with (None: no limit)."""
    gc.freeze()  # children then copy fewer of the parent's pages (the collector would touch them all)
    results: list[list[Record | None]] = [[None] * len(b) for b in batches]
    pending: deque[tuple[int, int]] = deque((i, 0) for i, b in enumerate(batches) if b)
    children: dict[int, _Child] = {}
    serial = 0

    def record(child: _Child, rec: Record) -> None:
        results[child.batch][child.next] = rec
        child.next += 1
        child.deadline = time.monotonic() + timeout
        child.interrupted = False
        if progress is not None:
            progress.advance()

    def spawn(batch: int, start: int) -> None:
        nonlocal serial
        serial += 1
        log = workdir / f"child-{serial}.log"
        rfd, wfd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            for other in children.values():
                os.close(other.fd)
            _child_main(batches[batch], start, execute, make_state, wfd, log, workdir, memory)
        os.close(wfd)
        os.set_blocking(rfd, False)
        with _suppress_race():
            os.setpgid(pid, pid)  # also done in the child: whichever runs first
        children[rfd] = _Child(pid, rfd, batch, start, log, time.monotonic() + timeout)

    def read(child: _Child) -> bool:
        """Take what the child wrote; False when nothing more is there now."""
        try:
            chunk = os.read(child.fd, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            return False
        child.buffer += chunk
        *lines, child.buffer = child.buffer.split(b"\n")
        for line in lines:
            rec = json.loads(line)
            if rec["outcome"] == "interrupted":
                rec = {"outcome": "timeout", "interruptible": True}
                child.done_by_interrupt = True
            record(child, rec)
        return True

    def finish(child: _Child, status: int) -> None:
        _kill_group(child.pid)  # anything it started
        while read(child):  # what it wrote before dying
            pass
        os.close(child.fd)
        del children[child.fd]
        batch = batches[child.batch]
        if child.next >= len(batch):
            return
        if not (child.killed or child.done_by_interrupt):
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                rec: Record = {"outcome": "signal", "signal": signal.Signals(sig).name}
            else:
                rec = {"outcome": "exit", "status": os.WEXITSTATUS(status)}
            rec["log"] = _tail(child.log)
            record(child, rec)
        if child.next < len(batch):
            pending.appendleft((child.batch, child.next))

    try:
        while pending or children:
            while pending and len(children) < jobs:
                spawn(*pending.popleft())
            now = time.monotonic()
            wait = max(0.0, min(c.deadline for c in children.values()) - now)
            ready, _, _ = select.select(list(children), [], [], min(wait, 0.05))
            for fd in ready:
                if fd in children:
                    read(children[fd])
            for child in list(children.values()):
                pid, status = os.waitpid(child.pid, os.WNOHANG)
                if pid:
                    finish(child, status)
                    continue
                if time.monotonic() < child.deadline:
                    continue
                if not child.interrupted:
                    child.interrupted = True
                    child.deadline = time.monotonic() + grace
                    with _suppress_race():
                        os.kill(child.pid, signal.SIGINT)
                    continue
                # Not interruptible: kill it, record the block, go on from the next call.
                child.killed = True
                stuck = child.next
                _kill_group(child.pid)
                _, status = os.waitpid(child.pid, 0)
                while read(child):  # the call may have ended just before the kill
                    pass
                if child.next == stuck:
                    record(child, {"outcome": "timeout", "interruptible": False, "log": _tail(child.log)})
                finish(child, status)
    except KeyboardInterrupt:  # keep what was done; the rest is reported as not run
        print("interrupted: the calls not made yet are left out", file=sys.stderr)
    finally:
        for child in list(children.values()):
            _kill_group(child.pid)
            with _suppress_race():
                os.waitpid(child.pid, 0)
        gc.unfreeze()
    return [[r if r is not None else {"outcome": "not-run"} for r in batch] for batch in results]


def _kill_group(pid: int) -> None:
    with _suppress_race():
        os.killpg(pid, signal.SIGKILL)


class _suppress_race:
    """Ignore ProcessLookupError/ChildProcessError/PermissionError: the process is already gone."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> bool:
        return exc_type is not None and issubclass(exc_type, (ProcessLookupError, ChildProcessError, PermissionError))
