"""The multi-process GPU suites' test runner: a suite is a script every rank runs under mpirun; each
rank reports one line per check; the pytest side merges every rank's report into one outcome.

Rank side, in the suite script::

    checks = Checks()                    # run in the order they are registered

    @checks("rma.put")                   # check "rma.put": put(ctx)
    def put(c: Ctx) -> str | None: ...   # a note, or raises: AssertionError and the like FAIL,
                                         # Skip SKIP, KnownLimitation XFAIL

    @contextlib.contextmanager
    def started(args, report) -> Iterator[Ctx]: ...   # set-up; after the checks, the teardown

    sys.exit(main(__doc__, started, checks, timeout=120.0))

Each rank writes, every line in one write (the ranks share mpirun's output)::

    PASS name [pe k]: note          the check held
    FAIL name [pe k]: reason        it did not
    SKIP name [pe k]: reason        it cannot run here
    XFAIL name [pe k]: reason       a documented limitation of the library, seen as documented
    INFO name [pe k]: text          a recorded fact, not a check
    pe=k passed=p failed=f skipped=s xfailed=x      the summary, last ("rank" in NCCL suites)

A watchdog ends a rank that runs past ``--timeout`` seconds, with every thread's stack on stderr;
``SUITE_TRACEBACKS=1`` prints a failed check's traceback. A rank's index comes from the launcher's
environment (Open MPI's, PMIx's, or ``SUITE_RANK`` for plain processes).

pytest side, in the test module: :func:`find_mpirun` skips saying what is missing; :func:`launch`
runs a suite under ``timeout mpirun`` (or as plain processes) and returns a :class:`Result`, whose
:meth:`Result.expect_clean` fails showing the failing lines, skips when every check skipped, and
asserts that every rank passed the checks a test requires.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mpbind.errors import FunctionNotFoundError

HERE = Path(__file__).parent
EXAMPLES = HERE.parents[1] / "examples"
# NVLink multicast off in every rank, before NCCL, NVSHMEM or torch start anything.
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SUITE_RANK")
TRACEBACKS = "SUITE_TRACEBACKS"
STATUSES = ("PASS", "FAIL", "SKIP", "XFAIL", "INFO")

F = TypeVar("F", bound=Callable[..., Any])
Check = tuple[str, Callable[[], str | None]]


# --- rank side: the report ----------------------------------------------------------------------------------


def emit(line: str) -> None:
    """Write one line in one write: `print` writes the text and the newline apart (with unbuffered
    output), and the lines of several processes sharing mpirun's output then run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def rank_from_environment() -> int:
    """This process's rank as its launcher gave it (0 when started alone)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name)
        if value:
            return int(value)
    return 0


class Skip(Exception):
    """The check cannot run here; the message says why."""


class KnownLimitation(Exception):
    """The library behaved as its documented limitation says."""


@dataclass
class Report:
    """What one rank reports: a line per check, then the summary."""

    index: int  # this process's PE or rank
    who: str = "pe"
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

    def passes(self, name: str, detail: str = "") -> None:
        """A step that is not a check of its own (an initialisation the rest needs) went through."""
        self.passed += 1
        self.line("PASS", name, detail)

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
            if os.environ.get(TRACEBACKS):
                traceback.print_exc()
        else:
            self.passed += 1
            self.line("PASS", name, note or "")

    def summary(self) -> str:
        return (f"{self.who}={self.index} passed={self.passed} failed={self.failed} skipped={self.skipped} "
                f"xfailed={self.xfailed}")


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def expect_raises(exc_type: type[BaseException], fn: Callable[[], Any], what: str, match: str | None = None) -> str:
    """`fn()` raises `exc_type` (whose message mentions `match`, when given); its message."""
    try:
        fn()
    except exc_type as exc:
        text = str(exc)
        expect(match is None or match in text, f"{what}: {type(exc).__name__} {text!r} does not mention {match!r}")
        return text
    except Exception as exc:
        raise AssertionError(f"{what}: raised {type(exc).__name__}: {exc}, expected {exc_type.__name__}") from None
    raise AssertionError(f"{what}: did not raise {exc_type.__name__}")


# --- rank side: the checks and the main ---------------------------------------------------------------------


class Checks:
    """A suite's checks, run in the order they are registered, each given the suite's context:

    * ``@checks(name, **params)``: ``fn(ctx, **params)`` is check `name`;
    * ``@checks.each((name, *args), ...)``: ``fn(ctx, *args)`` is check `name`, for each in turn;
    * ``@checks.cases``: ``fn(ctx)`` yields ``(name, thunk)`` pairs: variants of one check, names
      known only at run time, set-up between checks (it runs as the pairs are taken);
    * ``@checks.info(name)``: ``fn(ctx)`` returns the text of an INFO line (its errors are the run's).
    """

    def __init__(self) -> None:
        self._steps: list[Callable[[Any, Report], None]] = []

    def _check(self, name: str, fn: Callable[..., str | None], *args: Any, **params: Any) -> None:
        self._steps.append(lambda ctx, report: report.check(name, functools.partial(fn, ctx, *args, **params)))

    def __call__(self, name: str, **params: Any) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self._check(name, fn, **params)
            return fn

        return register

    def each(self, *cases: tuple[Any, ...]) -> Callable[[F], F]:
        def register(fn: F) -> F:
            for name, *args in cases:
                self._check(name, fn, *args)
            return fn

        return register

    def cases(self, fn: Callable[[Any], Iterable[Check]]) -> Callable[[Any], Iterable[Check]]:
        def step(ctx: Any, report: Report) -> None:
            for name, thunk in fn(ctx):
                report.check(name, thunk)

        self._steps.append(step)
        return fn

    def info(self, name: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self._steps.append(lambda ctx, report: report.info(name, fn(ctx)))
            return fn

        return register

    def run(self, ctx: Any, report: Report) -> None:
        for step in self._steps:
            step(ctx, report)


Start = Callable[[argparse.Namespace, Report], contextlib.AbstractContextManager[Any]]


def main(doc: str | None, start: Start, checks: Checks | Callable[[argparse.Namespace], Checks], *,
         timeout: float | Callable[[argparse.Namespace], float], who: str = "pe",
         arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """Run a suite on this rank; the process's exit status (1 when anything failed).

    Parses the suite's `arguments` and ``--timeout`` (by default `timeout` seconds, or what
    ``timeout(args)`` says for the suite's mode), enters ``start(args, report)`` (the set-up; its
    exit is the teardown), runs the checks (`checks`, or those ``checks(args)`` chooses) and writes
    the summary. A C-level watchdog dumps every thread's stack
    and ends the process after ``--timeout`` seconds: it fires even while a thread is blocked in
    CUDA or a library. An exception out of the set-up, the steps between checks or the teardown
    is one ``FAIL setup`` line and its traceback (nothing else can run).
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if arguments is not None:
        arguments(ap)
    ap.add_argument("--timeout", type=float, default=None,
                    help="dump every thread's stack and exit after this many seconds (a hang)")
    args = ap.parse_args()
    if args.timeout is None:
        args.timeout = timeout if isinstance(timeout, (int, float)) else timeout(args)
    report = Report(rank_from_environment(), who)
    chosen = checks if isinstance(checks, Checks) else checks(args)
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    began = time.monotonic()
    try:
        with start(args, report) as ctx:
            chosen.run(ctx, report)
    except Exception as exc:
        report.failed += 1
        report.line("FAIL", "setup", f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    finally:
        faulthandler.cancel_dump_traceback_later()
        report.info("elapsed", f"{time.monotonic() - began:.2f} s")
        emit(report.summary())
    return 1 if report.failed else 0


def run_alone(script: str | os.PathLike[str], done: str, timeout: float = 300) -> None:
    """The pytest side of a single-process GPU script: run `script` as a child with none of an enclosing
    mpirun's variables (a job of its own); it must exit 0 (a signal is what such checks prevent), print
    `done`, and report no FAIL line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    proc = subprocess.run([sys.executable, str(Path(script).resolve())], capture_output=True, text=True,
                          timeout=timeout, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert done in proc.stdout, out[-6000:]
    assert "FAIL" not in proc.stdout, out[-6000:]


@contextlib.contextmanager
def single_pe(n: int) -> Iterator[tuple[Any, Any, Any, Any, Any]]:
    """One NVSHMEM PE on GPU 0 for a single-process GPU script (a unique id, no MPI; the NVSHMEM of
    ``MPBIND_NVSHMEM_PATH`` loaded before torch maps its own): (torch, mpbind.nvshmem, a stream, dest,
    src), the last two zeroed symmetric float32 arrays of `n`. After: the device synchronised, the
    arrays freed, NVSHMEM finalised."""
    if os.environ.get("MPBIND_NVSHMEM_PATH"):
        import mpbind

        mpbind.load_libraries("nvshmem")
    import torch

    from mpbind import nvshmem as nv
    from mpbind.bindings import nvshmem as flat

    torch.cuda.set_device(0)
    rt = nv.init(flat.get_uniqueid(), 0, 1, device=0)
    dest, src = nv.zeros(n, "float32"), nv.zeros(n, "float32")
    try:
        yield torch, nv, torch.cuda.Stream(), dest, src
    finally:
        torch.cuda.synchronize()
        dest.free()
        src.free()
        rt.finalize()


def run_checks(checks: Sequence[tuple[str, Callable[[], object]]], done: str) -> None:
    """For a single-process GPU script: run every check, printing ``PASS name: detail`` or ``FAIL name:
    error`` (one failure does not stop the others); exit status 1 when one failed, else print `done`
    (the line the parent test waits for)."""
    failed = 0
    for name, check in checks:
        try:
            print(f"PASS {name}: {check()}", flush=True)
        except Exception as e:  # report every check, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    if failed:
        sys.exit(1)
    print(done, flush=True)


def nvshmem_teardown(report: Report, comm: Any, sync: Callable[[], object], finalize: Callable[[], None]) -> None:
    """The end of a suite over NVSHMEM, on every PE alike: its work synchronised (`sync`), the PEs
    aligned, then the checks that no release is left queued for ``mpbind.drain()`` and that
    `finalize` (NVSHMEM's) succeeds."""
    import mpbind

    sync()
    comm.Barrier()
    report.check("teardown.queue_empty", lambda: expect(mpbind.queued() == [], f"{mpbind.queued()}"))
    report.check("teardown.nvshmem_finalize", finalize)


@contextlib.contextmanager
def nvshmem_session(report: Report, comm: Any, device: int, sync: Callable[[], object]) -> Iterator[None]:
    """NVSHMEM initialised over the mpi4py `comm` on `device` for a suite's checks; then
    :func:`nvshmem_teardown` with NVSHMEM's finalize."""
    from mpbind import nvshmem

    nvshmem.init(mpi_comm=comm, device=device)
    report.passes("init.nvshmem", f"{comm.Get_size()} PE(s), device {device}")
    try:
        yield
    finally:
        nvshmem_teardown(report, comm, sync, nvshmem.finalize)


def nvshmem_status(value: int) -> str:
    """NVSHMEM's ``init_status()`` by name."""
    from mpbind.bindings import nvshmem

    try:
        return f"{nvshmem.InitStatus(value).name}({value})"
    except ValueError:
        return str(value)


def load_example(name: str) -> Any:
    """examples/<name>.py as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- pytest side: merging the ranks' reports ----------------------------------------------------------------

LINE = re.compile(r"^(PASS|FAIL|SKIP|XFAIL|INFO) (\S+) \[([a-z]+) (\d+)\](?:: (.*))?$", re.MULTILINE)
SUMMARY = re.compile(r"^([a-z]+)=(\d+) passed=(\d+) failed=(\d+) skipped=(\d+)(?: xfailed=(\d+))?\s*$", re.MULTILINE)
# A check every rank must pass: a name, a prefix ending in "." (any check under it), or a tuple (any one of them).
Required = str | tuple[str, ...]


@dataclass(frozen=True)
class Line:
    status: str
    name: str
    who: str
    index: int
    detail: str

    def __str__(self) -> str:
        return f"{self.status} {self.name} [{self.who} {self.index}]" + (f": {self.detail}" if self.detail else "")


@dataclass
class Summary:
    who: str
    passed: int
    failed: int
    skipped: int
    xfailed: int


@dataclass
class Merged:
    """Every rank's report from one run, judged: failures (empty when clean), or a reason to skip."""

    lines: list[Line]
    summaries: dict[int, Summary]
    failures: list[str] = field(default_factory=list)
    skip: str | None = None

    def passed(self, index: int) -> set[str]:
        """The names of the checks rank `index` passed."""
        return {line.name for line in self.lines if line.status == "PASS" and line.index == index}


def matches(name: str, required: Required) -> bool:
    if isinstance(required, tuple):
        return any(matches(name, one) for one in required)
    return name.startswith(required) if required.endswith(".") else name == required


def merge(out: str, nprocs: int, rc: int, require: Sequence[Required] = ()) -> Merged:
    """Judge a run of `nprocs` ranks: it is clean when the launcher exited 0, every rank 0..nprocs-1
    wrote its summary, no check failed, every rank passed at least one check and every rank passed
    each of `require`. When nothing failed and no rank passed anything but every rank skipped
    something, the run is a skip, with the ranks' reasons."""
    lines = [Line(s, n, w, int(i), d or "") for s, n, w, i, d in LINE.findall(out)]
    summaries = {int(i): Summary(w, int(p), int(f), int(s), int(x or 0)) for w, i, p, f, s, x in SUMMARY.findall(out)}
    merged = Merged(lines, summaries)
    fail = merged.failures.append
    if rc != 0:
        fail(f"exit status {rc}")
    for line in lines:
        if line.status == "FAIL":
            fail(str(line))
    missing = [i for i in range(nprocs) if i not in summaries]
    if missing:
        fail(f"no summary from rank(s) {missing}: crashed, ended by the watchdog, or still running")
    extra = sorted(i for i in summaries if not 0 <= i < nprocs)
    if extra:
        fail(f"summaries from rank(s) {extra} of a run of {nprocs}")
    for i, s in sorted(summaries.items()):
        if s.failed and not any(line.status == "FAIL" and line.index == i for line in lines):
            fail(f"{s.who} {i} counted {s.failed} failed check(s) whose lines are missing")
    if merged.failures:
        return merged
    idle = [i for i, s in sorted(summaries.items()) if s.passed == 0]
    if idle and len(idle) == len(summaries) and all(summaries[i].skipped for i in idle):
        reasons = dict.fromkeys(f"{line.name}: {line.detail}" for line in lines if line.status == "SKIP")
        merged.skip = "every check skipped: " + "; ".join(reasons)
        return merged
    for i in idle:
        fail(f"{summaries[i].who} {i} passed no check")
    for i in range(nprocs):
        done = merged.passed(i)
        for required in require:
            if not any(matches(name, required) for name in done):
                seen = [str(line) for line in lines if line.index == i and matches(line.name, required)]
                who = summaries[i].who if i in summaries else "rank"
                fail(f"{who} {i} did not pass {required!r}" + (f": {seen}" if seen else " (never reported)"))
    return merged


# --- pytest side: launching ---------------------------------------------------------------------------------


def find_mpirun(what: str, modules: Iterable[tuple[str, str]] = (), library: str | None = None) -> str:
    """mpirun's path, or skip saying what is missing: mpirun, a Python module, or `library`."""
    import pytest

    path = shutil.which("mpirun")
    if path is None:
        pytest.skip(f"mpirun is not on PATH (install Open MPI to run the {what} tests)")
    for module, why in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(why)
    if library is not None:
        need_library(library)
    return path


def need_library(library: str) -> None:
    """Skip unless mpbind loads `library`; two copies in the process is a failure to see, not a skip."""
    import pytest

    import mpbind
    from mpbind.errors import LibraryConflictError, LibraryNotFoundError

    try:
        mpbind.load_libraries(library)
    except LibraryConflictError:
        raise
    except LibraryNotFoundError as exc:
        pytest.skip(f"the {library} library is not available: {exc}")


def visible_gpus() -> int:
    from mpbind._infra.info import gpu_count

    return gpu_count()[0]


def need_gpus(count: int, why: str = "") -> None:
    """Skip unless `count` GPUs are visible (`why`: what needs them)."""
    import pytest

    from mpbind._infra.info import gpu_count

    visible, reason = gpu_count()
    if visible < count:
        pytest.skip(f"needs {count} GPUs{why}; {visible} visible" + (f" ({reason})" if reason else ""))


def need_mps(what: str) -> None:
    """Skip unless an MPS daemon is there for PEs sharing a GPU (NVSHMEM's full multi-PE-per-GPU mode)."""
    import pytest

    if not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        pytest.skip(f"{what} need CUDA MPS (CUDA_MPS_PIPE_DIRECTORY)")


@dataclass
class Result:
    """One run of a suite: the command, its exit status and every rank's output together."""

    command: str
    nprocs: int
    rc: int
    out: str

    def merged(self, require: Sequence[Required] = ()) -> Merged:
        return merge(self.out, self.nprocs, self.rc, require)

    def expect_clean(self, require: Sequence[Required] = ()) -> Merged:
        """Fail with the failing checks' lines, or skip with the reasons when every check skipped;
        otherwise the merged report."""
        import pytest

        merged = self.merged(require)
        if merged.failures:
            pytest.fail(f"{self.command}:\n  " + "\n  ".join(merged.failures) + f"\n{self.out[-8000:]}",
                        pytrace=False)
        if merged.skip is not None:
            pytest.skip(merged.skip)
        return merged


def mpirun_command(mpirun: str, nprocs: int, forward: Iterable[str] = (), share_gpu: bool = True) -> list[str]:
    """``mpirun -np nprocs`` with NVLink multicast off in every rank, `forward`'s variables passed on
    when set, and the ranks' GPUs: with `share_gpu` the ranks may outnumber the cores, and under an
    MPS daemon (``CUDA_MPS_PIPE_DIRECTORY``) each gets an equal share of the SMs, which NVSHMEM
    needs for its full multi-PE-per-GPU mode; otherwise (one rank per GPU) they are not bound to cores."""
    cmd = [mpirun, "--allow-run-as-root", *(["--oversubscribe"] if share_gpu else ["--bind-to", "none"]),
           "-np", str(nprocs)]
    for name, value in NVLS_OFF.items():
        cmd += ["-x", f"{name}={value}"]
    if share_gpu and os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        cmd += ["-x", "CUDA_MPS_PIPE_DIRECTORY", "-x", f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={100 // nprocs}"]
    for name in (*forward, TRACEBACKS):
        if os.environ.get(name):
            cmd += ["-x", name]
    return cmd + ["-x", "PYTHONPATH", "-x", "LD_LIBRARY_PATH"]


def with_timeout(cmd: list[str], timeout: float) -> list[str]:
    """`cmd` under coreutils' timeout (SIGTERM at `timeout` s, SIGKILL 15 s later), where it exists:
    the run ends even should the pytest process that started it die."""
    path = shutil.which("timeout")
    return [path, "--kill-after=15", f"{timeout:.0f}", *cmd] if path else cmd


def launch(suite: str | os.PathLike[str], nprocs: int, *args: str, timeout: float, mpirun: str | None,
           forward: Iterable[str] = (), share_gpu: bool = True) -> Result:
    """Run `suite` (a file beside this one, or a path) on `nprocs` ranks: under `mpirun`, or, with
    `mpirun` None, as `nprocs` plain processes whose rank is ``SUITE_RANK``. Fails (a hang) when the
    run goes past `timeout` seconds; the output is printed (shown with -s or on failure)."""
    import pytest

    script = Path(suite) if Path(suite).is_absolute() else HERE / suite
    env = dict(os.environ, **NVLS_OFF)
    # `-x NAME` forwards a variable; give the two it always forwards a value if they lack one.
    env.setdefault("PYTHONPATH", "")
    env.setdefault("LD_LIBRARY_PATH", "")
    python = [sys.executable, str(script), *args]
    if mpirun is not None:
        shown = f"mpirun -np {nprocs} {script.name} {' '.join(args)}".rstrip()
        rc, out, late = _run([with_timeout(mpirun_command(mpirun, nprocs, forward, share_gpu) + python, timeout)],
                             [env], timeout)
    else:
        shown = f"{nprocs} x {script.name} {' '.join(args)}".rstrip()
        envs = [dict(env, SUITE_RANK=str(k), SUITE_SIZE=str(nprocs)) for k in range(nprocs)]
        if share_gpu and nprocs > 1 and os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
            for e in envs:
                e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // nprocs)
        rc, out, late = _run([with_timeout(python, timeout)] * nprocs, envs, timeout)
    print(out)  # every line of every rank, shown with -s or on failure
    if late:
        pytest.fail(f"{shown} ran past {timeout:.0f} s:\n{out[-8000:]}", pytrace=False)
    return Result(shown, nprocs, rc, out)


def _run(commands: list[list[str]], envs: list[dict[str, str]], timeout: float) -> tuple[int, str, bool]:
    """Run the commands side by side, each in a session of its own, their output into files (no pipe
    to fill): (the first non-zero exit status or 0, the outputs in order, whether the time ran out).
    A command past `timeout` (and the margin coreutils' timeout needs) gets SIGTERM, then SIGKILL."""
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in commands]
        procs = [subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env,
                                  start_new_session=True) for cmd, env, f in zip(commands, envs, files, strict=True)]
        began = time.monotonic()
        deadline = began + timeout + 30
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [p for p in procs if p.poll() is None]
        for proc in stuck:
            proc.send_signal(signal.SIGTERM)  # mpirun forwards it to the ranks and cleans up
        for proc in stuck:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the session this run started, nothing else
                proc.wait()
        codes = [p.returncode for p in procs]
        ran = time.monotonic() - began
        outs = []
        for f in files:
            f.seek(0)
            outs.append(f.read())
    # coreutils' timeout exits 124 when it ended the command, 137 when it had to kill it
    late = bool(stuck) or any(code == 124 or (code == 137 and ran >= timeout) for code in codes)
    return next((code for code in codes if code), 0), "".join(outs), late
