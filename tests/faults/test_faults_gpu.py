"""Fault injection: a rank killed, absent, late or elsewhere, and what the others see.

Each case starts its ranks as plain processes (fault_worker.py beside this file), each under
coreutils' ``timeout -k``, in a session of its own; kills one (SIGKILL) or leaves one out; then checks
what the survivors reported (their ``OUTCOME`` line: the error's class, message and time), that they
did so within the deadline plus a margin, that results completed before the fault are intact, that
(NCCL) a shrunk communicator of the survivors runs a correct all-reduce, and that no process of the
case is left behind. Open MPI's mpirun is used only where MPI is the point and nothing is killed: it
ends the whole job when a rank dies.

    one GPU:      init without a peer (blocking and non-blocking configs): WaitTimeoutError after the
                  deadline, Ctrl-C within 1 s; a rank that raises before init; NVSHMEM on 2-4 PEs under
                  CUDA MPS: a PE killed in a barrier loop or an FFT loop (the survivors end, exit status
                  70, with the watchdog's report), a PE missing at init (uid: cannot be named; MPI: named)
    two GPUs:     a rank killed in a loop of all-reduces, and of planned matmuls; a rank that skips a
                  collective (NCCL refuses two ranks on one GPU)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from runner import NVLS_OFF, find_mpirun, need_gpus, need_mps

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).with_name("fault_worker.py")
MARGIN = 5.0         # seconds past a deadline in which the survivors must have raised (watchdog period,
                     # revoke, the stream's release, process scheduling)
INIT_DEADLINE = 8.0  # timeout= of the init cases
DEADLINE = 15.0      # timeout= of the communicators and runtimes whose operations are watched
HANG_EXIT = 70       # the exit status of a PE the NVSHMEM watchdog ended


@pytest.fixture(autouse=True)
def _needs_torch() -> None:
    pytest.importorskip("torch")


@dataclass
class Rank:
    index: int
    proc: subprocess.Popen[str]
    out: Path
    err: Path
    ended_at: float | None = None

    def text(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def pid(self) -> int | None:
        for line in self.text().splitlines():
            if line.startswith("PID "):
                return int(line.split()[1])
        return None

    def steps(self) -> dict[str, float]:
        found = {}
        for line in self.text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "STEP":
                found[parts[1]] = float(parts[2])
        return found

    def outcome(self) -> dict[str, Any] | None:
        for line in self.text().splitlines():
            if line.startswith("OUTCOME "):
                return dict(json.loads(line[len("OUTCOME "):]))
        return None

    def show(self) -> str:
        head = f"--- rank {self.index} (exit {self.proc.returncode}) ---"
        return f"{head}\n{self.text()[-4000:]}\n{self.stderr()[-6000:]}"


@dataclass
class Case:
    """One run of a case: its ranks' processes and what they wrote."""

    name: str
    token: str
    folder: Path
    ranks: list[Rank] = field(default_factory=list)

    def rank(self, index: int) -> Rank:
        return next(r for r in self.ranks if r.index == index)

    def report(self) -> str:
        return "\n".join(r.show() for r in self.ranks)

    def wait(self, limit: float) -> None:
        """Every rank ended within `limit` seconds (else: killed, and the case fails as a hang)."""
        end = time.monotonic() + limit
        while any(r.proc.poll() is None for r in self.ranks) and time.monotonic() < end:
            for r in self.ranks:
                if r.ended_at is None and r.proc.poll() is not None:
                    r.ended_at = time.time()
            time.sleep(0.1)
        for r in self.ranks:
            if r.ended_at is None and r.proc.poll() is not None:
                r.ended_at = time.time()
        stuck = [r for r in self.ranks if r.proc.poll() is None]
        for r in stuck:
            os.killpg(r.proc.pid, signal.SIGKILL)  # the session this case started
            r.proc.wait()
        if stuck:
            pytest.fail(f"{self.name}: rank(s) {[r.index for r in stuck]} still ran after {limit:.0f} s (a hang)\n"
                        + self.report(), pytrace=False)


def _leftovers(token: str) -> list[int]:
    """Processes whose command line carries `token` (this case's, nothing else)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def case(name: str) -> Iterator[Case]:
    """A case's folder and token; at the end, no process of it may be left (they are killed, and it fails)."""
    token = f"mpbind-fault-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="mpbind-fault-") as folder:
        c = Case(name, token, Path(folder))
        try:
            yield c
        finally:
            for r in c.ranks:
                if r.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(r.proc.pid, signal.SIGKILL)
                    r.proc.wait()
            time.sleep(0.5)
            left = _leftovers(token)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # a process this case started
        assert not left, f"{name}: processes left behind: {left}"


GPU_SETTLE = 120.0  # seconds the GPU may take to take new processes after a case killed one


def wait_for_the_gpu(env: dict[str, str]) -> None:
    """Return once a new process can use the GPU. Under MPS, a case that killed a PE in a kernel (or
    whose survivors exited while their kernels spun) leaves the server refusing new clients for a
    while ("busy or unavailable"); the next case waits for that, bounded, rather than failing."""
    probe = "import torch; torch.cuda.set_device(0); torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
    deadline = time.monotonic() + GPU_SETTLE
    while True:
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the GPU took no new process for {GPU_SETTLE:.0f} s: {done.stderr.strip()[-300:]}")
        time.sleep(1.0)


def start(c: Case, ranks: list[int], size: int, *args: str, limit: float, one_gpu: bool = False) -> None:
    """Start ranks `ranks` of a `size`-rank run of fault_worker.py (`args` after the case name), each
    under ``timeout -k 10 limit``, once the GPU takes new processes."""
    env = dict(os.environ, **NVLS_OFF, PYTHONUNBUFFERED="1")
    wait_for_the_gpu(env)
    if one_gpu and size > 1 and os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // size)
    wrapper = [shutil.which("timeout") or "timeout", "-k", "10", f"{limit:.0f}"]
    for r in ranks:
        out, err = c.folder / f"rank{r}.out", c.folder / f"rank{r}.err"
        cmd = [*wrapper, sys.executable, str(WORKER), *args, "--rank", str(r), "--size", str(size), "--dir",
               str(c.folder), "--token", c.token, *(["--one-gpu"] if one_gpu else [])]
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, text=True, start_new_session=True)
        c.ranks.append(Rank(r, proc, out, err))


def expect_error(c: Case, index: int, family: str) -> dict[str, Any]:
    """Rank `index`'s outcome, an error of class `family` (or a subclass)."""
    o = c.rank(index).outcome()
    assert o is not None, f"{c.name}: rank {index} reported nothing\n" + c.report()
    assert family in (o.get("mro") or []), f"{c.name}: rank {index} raised {o.get('error')}, not {family}: " \
                                           f"{o.get('message')}\n" + c.report()
    return o


def expect_survivor(c: Case, index: int, family: str, deadline: float, killed: int | None) -> dict[str, Any]:
    """The NCCL survivor's checks: the typed error within deadline + margin of the doomed operation,
    the result of the last complete iteration intact, a shrunk communicator's all-reduce correct."""
    o = expect_error(c, index, family)
    took = o["raised_at"] - o["doomed_at"]
    assert took <= deadline + MARGIN, f"{c.name}: rank {index} raised {took:.1f} s after the doomed operation " \
                                      f"began (deadline {deadline:g} s)\n" + c.report()
    assert o["intact"], f"{c.name}: the result completed before the fault changed\n" + c.report()
    shrunk = o.get("shrunk") or {}
    assert shrunk.get("correct") and shrunk.get("size") == 1, f"{c.name}: shrunk communicator: {shrunk}\n" \
                                                              + c.report()
    if killed is not None:
        assert any(k.startswith("killed.") for k in c.rank(killed).steps()), c.report()
    print(f"{c.name}: rank {index} raised {o['error']} {took:.2f} s after the doomed operation: {o['message']}")
    return o


# --- one GPU: NCCL initialisation ---------------------------------------------------------------------


@pytest.mark.parametrize("config", ["blocking", "nonblocking"])
def test_init_without_its_peer_times_out(config: str) -> None:
    with case(f"init-{config}") as c:
        start(c, [0], 2, "init", "--deadline", str(INIT_DEADLINE), "--config", config, limit=INIT_DEADLINE + 60)
        c.wait(INIT_DEADLINE + 70)
        o = expect_error(c, 0, "WaitTimeoutError")
        assert "TimeoutError" in o["mro"]
        took = o["raised_at"] - o["started"]
        assert INIT_DEADLINE <= took <= INIT_DEADLINE + MARGIN, f"raised after {took:.1f} s\n" + c.report()
        assert "rank 0 of 2" in o["message"], o["message"]
        assert c.rank(0).proc.returncode == 0, c.report()  # and the process ended (the init thread abandoned)
        print(f"init ({config}): WaitTimeoutError after {took:.2f} s: {o['message']}")


@pytest.mark.parametrize("config", ["blocking", "nonblocking"])
def test_ctrl_c_interrupts_init_within_a_second(config: str) -> None:
    with case(f"sigint-{config}") as c:
        start(c, [0], 2, "init", "--deadline", "300", "--config", config, limit=120)
        r = c.rank(0)
        end = time.monotonic() + 60
        while "ready" not in r.steps() and r.proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        pid = r.pid()
        assert pid is not None and "ready" in r.steps(), c.report()
        time.sleep(2.0)  # inside the initialisation's wait
        sent = time.time()
        os.kill(pid, signal.SIGINT)
        c.wait(60)
        o = expect_error(c, 0, "KeyboardInterrupt")
        took = o["raised_at"] - sent
        assert took < 1.0, f"KeyboardInterrupt {took:.2f} s after SIGINT\n" + c.report()
        ended = (r.ended_at or time.time()) - sent
        print(f"init ({config}): KeyboardInterrupt {took:.3f} s after SIGINT; the process ended {ended:.1f} s after")


def test_a_rank_that_raises_before_init() -> None:
    with case("raise-before-init") as c:
        start(c, [0, 1], 2, "raise_before", "--deadline", str(INIT_DEADLINE), limit=INIT_DEADLINE + 60)
        c.wait(INIT_DEADLINE + 70)
        assert c.rank(1).proc.returncode != 0 and "fails before it initialises" in c.rank(1).stderr(), c.report()
        o = expect_error(c, 0, "WaitTimeoutError")
        took = o["raised_at"] - o["started"]
        assert took <= INIT_DEADLINE + MARGIN, c.report()


# --- two GPUs: NCCL collectives, one rank per GPU -------------------------------------------------------


@pytest.mark.parametrize("work", ["kill_allreduce", "kill_matmul"], ids=["all_reduce", "planned_matmul"])
def test_a_rank_killed_in_a_loop(work: str) -> None:
    """Rank 1 SIGKILLed at iteration 5 of a loop of all-reduces, or of planned cuBLASMp matmuls."""
    need_gpus(2, " (one NCCL rank per GPU)")
    with case(work.replace("_", "-")) as c:
        start(c, [0, 1], 2, work, "--deadline", str(DEADLINE), "--kill-at", "5", limit=DEADLINE + 120)
        c.wait(DEADLINE + 130)
        o = expect_survivor(c, 0, "CommunicatorAbortedError", DEADLINE, killed=1)
        assert o["last_good"] == 4, c.report()


def test_a_rank_that_skips_a_collective() -> None:
    need_gpus(2, " (one NCCL rank per GPU)")
    with case("skip") as c:
        start(c, [0, 1], 2, "skip", "--deadline", str(DEADLINE), "--iterations", "6", limit=DEADLINE + 120)
        c.wait(DEADLINE + 130)
        o = expect_survivor(c, 0, "CollectiveTimeoutError", DEADLINE, killed=None)
        assert o["raised_at"] - o["doomed_at"] >= DEADLINE - 1, "raised before the deadline: " + c.report()
        assert o["last_good"] == 4 and (c.rank(1).outcome() or {}).get("skipped"), c.report()


# --- one GPU: NVSHMEM, PEs sharing it under CUDA MPS ---------------------------------------------------


def _ended_by_the_watchdog(c: Case, survivors: list[int], what: str) -> None:
    """Each survivor ended, not hung, within the deadline and a margin of the kill: by the watchdog
    (exit status 70, its report naming the PE and `what`), or earlier by NVSHMEM itself should it
    notice the PE is gone (any other failing status; printed, so that the run shows which)."""
    killed = [v for k, v in c.rank(1).steps().items() if k.startswith("killed.")]
    assert killed, "PE 1 was not killed where the case kills it\n" + c.report()
    for i in survivors:
        r = c.rank(i)
        err = r.stderr()
        took = (r.ended_at or time.time()) - killed[0]
        assert took <= DEADLINE + MARGIN + 5, f"PE {i} ended {took:.1f} s after the kill\n" + c.report()
        assert r.proc.returncode not in (0, 124, 137), f"PE {i} ended with {r.proc.returncode}\n" + c.report()
        if r.proc.returncode == HANG_EXIT:
            assert f"NVSHMEM PE {i} of " in err and what in err and "ending the process (exit status 70)" in err, \
                c.report()
            assert "flight record of NVSHMEM PE" in err, c.report()
            print(f"{c.name}: PE {i} ended by the watchdog (exit 70) {took:.1f} s after PE 1 was killed")
        else:
            print(f"{c.name}: PE {i} ended by NVSHMEM itself (exit {r.proc.returncode}) {took:.1f} s after PE 1 "
                  f"was killed: {err.strip().splitlines()[-3:]}")


@pytest.mark.parametrize("npes", [2, 3, 4], ids=lambda n: f"np{n}")
def test_an_nvshmem_pe_killed_in_a_barrier(npes: int) -> None:
    need_mps("several NVSHMEM PEs on one GPU")
    with case(f"kill-barrier-{npes}") as c:
        start(c, list(range(npes)), npes, "kill_barrier", "--deadline", str(DEADLINE), "--kill-at", "3",
              limit=DEADLINE + 120, one_gpu=True)
        c.wait(DEADLINE + 130)
        _ended_by_the_watchdog(c, [i for i in range(npes) if i != 1], "barrier_all #")


def test_an_nvshmem_pe_killed_in_an_fft() -> None:
    need_mps("several NVSHMEM PEs on one GPU")
    with case("kill-fft") as c:
        start(c, [0, 1], 2, "kill_fft", "--deadline", str(DEADLINE), "--kill-at", "3", limit=DEADLINE + 120,
              one_gpu=True)
        c.wait(DEADLINE + 130)
        assert "fft.2" in c.rank(0).steps(), "the FFTs before the fault did not complete\n" + c.report()
        _ended_by_the_watchdog(c, [0], "cufftmp.")


@pytest.mark.parametrize("npes", [2, 4], ids=lambda n: f"np{n}")
def test_an_nvshmem_pe_missing_at_init(npes: int) -> None:
    need_mps("several NVSHMEM PEs on one GPU")
    with case(f"nvshmem-init-{npes}") as c:
        start(c, list(range(npes - 1)), npes, "nvshmem_init", "--deadline", str(INIT_DEADLINE),
              limit=INIT_DEADLINE + 60, one_gpu=True)
        c.wait(INIT_DEADLINE + 70)
        for i in range(npes - 1):
            o = expect_error(c, i, "WaitTimeoutError")
            assert "cannot be known over a unique id" in o["message"], o["message"]
            took = o["raised_at"] - o["started"]
            assert INIT_DEADLINE - 1 <= took <= INIT_DEADLINE + MARGIN, c.report()


def test_an_nvshmem_pe_that_never_calls_init_is_named() -> None:
    need_mps("several NVSHMEM PEs on one GPU")
    mpirun = find_mpirun("NVSHMEM arrival", (("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),))
    with case("nvshmem-init-mpi") as c:
        env_args = [a for name, value in NVLS_OFF.items() for a in ("-x", f"{name}={value}")]
        if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
            env_args += ["-x", "CUDA_MPS_PIPE_DIRECTORY", "-x", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=33"]
        cmd = [shutil.which("timeout") or "timeout", "-k", "10", f"{INIT_DEADLINE + 90:.0f}", mpirun,
               "--allow-run-as-root", "--oversubscribe", "-np", "3", *env_args, "-x", "PYTHONPATH",
               "-x", "LD_LIBRARY_PATH", sys.executable, str(WORKER), "nvshmem_init", "--mpi", "--kill-rank", "2",
               "--deadline", str(INIT_DEADLINE), "--dir", str(c.folder), "--token", c.token]
        out, err = c.folder / "mpirun.out", c.folder / "mpirun.err"
        env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", ""),
                   LD_LIBRARY_PATH=os.environ.get("LD_LIBRARY_PATH", ""))
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, text=True, start_new_session=True)
        c.ranks.append(Rank(0, proc, out, err))
        c.wait(INIT_DEADLINE + 100)
        outcomes = [json.loads(line[len("OUTCOME "):]) for line in out.read_text().splitlines()
                    if line.startswith("OUTCOME ")]
        named = [o for o in outcomes if o.get("error") == "WaitTimeoutError"]
        assert len(named) == 2 and all("PE 2 of 3 never called init" in o["message"] for o in named), c.report()
        assert any(o.get("absent") for o in outcomes), c.report()
