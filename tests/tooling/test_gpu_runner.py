"""The GPU suites' runner (tests/gpu/runner.py) on a CPU: its per-rank report, its registration of
checks, the merge of every rank's report into one pytest outcome, and launches of a trivial suite as
plain processes (the rank given by the environment) and, where Open MPI is installed, under mpirun.
Nothing on a CPU machine runs the GPU suites, so without these the runner could break unseen."""

from __future__ import annotations

import importlib.util
import io
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mpbind.errors import FunctionNotFoundError

GPU_TESTS = Path(__file__).resolve().parents[1] / "gpu"


def _load_runner() -> Any:
    spec = importlib.util.spec_from_file_location("runner", GPU_TESTS / "runner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("runner", module)
    spec.loader.exec_module(module)
    return module


runner = _load_runner()

# A suite whose ranks pass, fail, skip, crash, hang or fail their set-up as --mode says.
SUITE = textwrap.dedent('''
    import contextlib
    import os
    import sys
    import time

    from runner import Checks, KnownLimitation, Skip, expect, main

    CHECKS = Checks()


    @CHECKS("first")
    def first(c):
        if c["mode"] == "skip":
            raise Skip(f"nothing to run on rank {c['rank']}")
        return f"rank {c['rank']} of {c['size']}"


    @CHECKS.cases
    def by_mode(c):
        mode, rank = c["mode"], c["rank"]
        if mode == "skip":
            yield "second", lambda: (_ for _ in ()).throw(Skip("no GPU here"))
            return
        yield "agree", lambda: expect(mode != "fail" or rank != 1, "rank 1 disagrees")
        yield "documented", lambda: (_ for _ in ()).throw(KnownLimitation("as documented"))
        if mode == "crash" and rank == 1:
            os.abort()
        if mode == "hang" and rank == 1:
            time.sleep(600)
        if mode == "slow":
            time.sleep(60)
        yield "last", lambda: None


    @CHECKS.info("where")
    def where(c):
        return f"pid {os.getpid()}"


    @contextlib.contextmanager
    def started(args, report):
        if args.mode == "setup":
            raise RuntimeError("no device")
        yield {"mode": args.mode, "rank": report.index, "size": int(os.environ.get("SUITE_SIZE", "0"))}


    def arguments(ap):
        ap.add_argument("--mode", default="pass")


    if __name__ == "__main__":
        sys.exit(main(__doc__, started, CHECKS, arguments=arguments, timeout=120.0))
''')


@pytest.fixture
def suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "trivial_suite.py"
    path.write_text(SUITE)
    monkeypatch.setenv("PYTHONPATH", str(GPU_TESTS))  # where the ranks find the runner
    return path


# --- the rank side ------------------------------------------------------------------------------------------


class Writes(io.StringIO):
    """stdout that records each write."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_each_line_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Writes()
    monkeypatch.setattr(sys, "stdout", out)
    report = runner.Report(3, "rank")

    def fails() -> None:
        raise ValueError("wrong\nvalue")

    def missing() -> None:
        raise FunctionNotFoundError("ncclNew", "libnccl.so.2", "2.19.3", "2.27.3")

    def limited() -> None:
        raise runner.KnownLimitation("as documented")

    def skipped() -> None:
        raise runner.Skip("no peer")

    report.check("a", lambda: "fine")
    report.check("b", fails)
    report.check("c", skipped)
    report.check("d", missing)
    report.check("e", limited)
    report.info("f", "a fact")
    report.passes("g")
    runner.emit(report.summary())
    assert out.calls == [
        "PASS a [rank 3]: fine\n",
        "FAIL b [rank 3]: ValueError: wrong value\n",  # one line, whatever the message
        "SKIP c [rank 3]: no peer\n",
        "SKIP d [rank 3]: the loaded library lacks it: ncclNew is not exported by libnccl.so.2 (version 2.19.3); "
        "it first appeared in 2.27.3\n",
        "XFAIL e [rank 3]: as documented\n",
        "INFO f [rank 3]: a fact\n",
        "PASS g [rank 3]\n",
        "rank=3 passed=2 failed=1 skipped=2 xfailed=1\n",
    ]


def test_checks_run_in_the_order_registered() -> None:
    checks = runner.Checks()
    seen: list[str] = []

    @checks("one")
    def one(ctx: list[str]) -> None:
        ctx.append("one")

    @checks.each(("two.a", "a"), ("two.b", "b"))
    def two(ctx: list[str], which: str) -> None:
        ctx.append(f"two.{which}")

    @checks.info("note")
    def note(ctx: list[str]) -> str:
        return f"{len(ctx)} so far"

    @checks.cases
    def three(ctx: list[str]) -> Any:
        ctx.append("set-up")
        yield "three", lambda: ctx.append("three")

    @checks("four", value=4)
    def four(ctx: list[str], value: int) -> str:
        return str(value)

    class Recorded(runner.Report):
        def line(self, status: str, name: str, detail: str = "") -> None:
            seen.append(f"{status} {name} {detail}".strip())

    ctx: list[str] = []
    checks.run(ctx, Recorded(0))
    assert ctx == ["one", "two.a", "two.b", "set-up", "three"]
    assert seen == ["PASS one", "PASS two.a", "PASS two.b", "INFO note 3 so far", "PASS three", "PASS four 4"]


def test_the_rank_comes_from_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in runner.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert runner.rank_from_environment() == 0
    monkeypatch.setenv("SUITE_RANK", "2")
    assert runner.rank_from_environment() == 2
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    assert runner.rank_from_environment() == 5


# --- the merge ----------------------------------------------------------------------------------------------

CLEAN = """\
PASS init [pe 0]
PASS init [pe 1]
PASS slab.c2c [pe 1]: rel. err 1e-7
some library's own chatter
PASS slab.c2c [pe 0]: rel. err 2e-7
SKIP box.c2c [pe 0]: refused by the library
SKIP box.c2c [pe 1]: refused by the library
INFO elapsed [pe 0]: 1.00 s
pe=0 passed=2 failed=0 skipped=1 xfailed=0
pe=1 passed=2 failed=0 skipped=1 xfailed=0
"""


def test_a_clean_run() -> None:
    merged = runner.merge(CLEAN, 2, 0, require=("init", ("slab.", "box."), "slab."))
    assert merged.failures == [] and merged.skip is None
    assert merged.passed(0) == merged.passed(1) == {"init", "slab.c2c"}


def test_what_makes_a_run_fail() -> None:
    failing = CLEAN.replace("PASS slab.c2c [pe 1]: rel. err 1e-7", "FAIL slab.c2c [pe 1]: AssertionError: off")
    failing = failing.replace("pe=1 passed=2 failed=0", "pe=1 passed=1 failed=1")
    assert runner.merge(failing, 2, 1).failures == ["exit status 1", "FAIL slab.c2c [pe 1]: AssertionError: off"]
    crashed = CLEAN.replace("pe=1 passed=2 failed=0 skipped=1 xfailed=0\n", "")
    assert runner.merge(crashed, 2, 134).failures == [
        "exit status 134", "no summary from rank(s) [1]: crashed, ended by the watchdog, or still running"]
    assert runner.merge(CLEAN, 3, 0).failures[0].startswith("no summary from rank(s) [2]")
    garbled = CLEAN.replace("pe=1 passed=2 failed=0", "pe=1 passed=2 failed=1")
    assert runner.merge(garbled, 2, 0).failures == ["pe 1 counted 1 failed check(s) whose lines are missing"]
    idle = CLEAN.replace("pe=1 passed=2", "pe=1 passed=0")
    assert runner.merge(idle, 2, 0).failures == ["pe 1 passed no check"]


def test_required_checks() -> None:
    # "box." a prefix (skipped: its reason shown), "slab.c2c" a name (passed), "slab.c2" a name (never reported)
    merged = runner.merge(CLEAN, 2, 0, require=("box.", "slab.c2c", "slab.c2"))
    assert merged.failures == [
        "pe 0 did not pass 'box.': ['SKIP box.c2c [pe 0]: refused by the library']",
        "pe 0 did not pass 'slab.c2' (never reported)",
        "pe 1 did not pass 'box.': ['SKIP box.c2c [pe 1]: refused by the library']",
        "pe 1 did not pass 'slab.c2' (never reported)",
    ]


def test_a_run_where_every_check_skipped_is_a_skip() -> None:
    out = ("SKIP a [rank 0]: no GPU\nSKIP a [rank 1]: no GPU\nSKIP b [rank 1]: no peer\n"
           "rank=0 passed=0 failed=0 skipped=1 xfailed=0\nrank=1 passed=0 failed=0 skipped=2 xfailed=0\n")
    merged = runner.merge(out, 2, 0, require=("a",))
    assert merged.failures == [] and merged.skip == "every check skipped: a: no GPU; b: no peer"


# --- launches -----------------------------------------------------------------------------------------------


def test_passing_ranks_as_plain_processes(suite: Path) -> None:
    result = runner.launch(suite, 3, timeout=60, mpirun=None)
    merged = result.expect_clean(require=("first", "agree", "last"))
    assert {line.index for line in merged.lines if line.status == "XFAIL"} == {0, 1, 2}
    assert "PASS first [pe 2]: rank 2 of 3" in result.out


def test_a_failing_check_fails_with_its_line(suite: Path) -> None:
    result = runner.launch(suite, 3, "--mode", "fail", timeout=60, mpirun=None)
    with pytest.raises(pytest.fail.Exception, match=r"FAIL agree \[pe 1\]: AssertionError: rank 1 disagrees"):
        result.expect_clean()


def test_every_check_skipped_is_a_skip(suite: Path) -> None:
    result = runner.launch(suite, 2, "--mode", "skip", timeout=60, mpirun=None)
    reasons = ("every check skipped: first: nothing to run on rank 0; second: no GPU here; "
               "first: nothing to run on rank 1")
    with pytest.raises(pytest.skip.Exception, match=reasons):
        result.expect_clean()


def test_a_crashed_rank(suite: Path) -> None:
    result = runner.launch(suite, 3, "--mode", "crash", timeout=60, mpirun=None)
    assert result.rc != 0
    with pytest.raises(pytest.fail.Exception, match=r"no summary from rank\(s\) \[1\]"):
        result.expect_clean()


def test_a_hung_rank_is_ended_by_its_watchdog(suite: Path) -> None:
    result = runner.launch(suite, 2, "--mode", "hang", "--timeout", "3", timeout=60, mpirun=None)
    assert "Timeout (0:00:03)!" in result.out  # every thread's stack, from the watchdog
    with pytest.raises(pytest.fail.Exception, match=r"no summary from rank\(s\) \[1\]"):
        result.expect_clean()


def test_a_failed_set_up(suite: Path) -> None:
    result = runner.launch(suite, 2, "--mode", "setup", timeout=60, mpirun=None)
    with pytest.raises(pytest.fail.Exception, match=r"FAIL setup \[pe 0\]: RuntimeError: no device"):
        result.expect_clean()


def test_a_run_past_its_time_fails(suite: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="ran past 3 s"):
        runner.launch(suite, 2, "--mode", "slow", timeout=3, mpirun=None)


def test_the_mpirun_command() -> None:
    cmd = runner.mpirun_command("/usr/bin/mpirun", 4, share_gpu=False)
    assert cmd[:6] == ["/usr/bin/mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", "4"]
    assert "NCCL_NVLS_ENABLE=0" in cmd and "NVSHMEM_DISABLE_NVLS=1" in cmd
    assert "TORCH_SYMM_MEM_DISABLE_MULTICAST=1" in cmd and "--oversubscribe" not in cmd


def test_pes_sharing_a_gpu_under_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps")
    monkeypatch.setenv("MPBIND_NVSHMEM_PATH", "/opt/nvshmem/lib/libnvshmem_host.so.3")
    monkeypatch.delenv("MPBIND_CUFFTMP_PATH", raising=False)
    cmd = runner.mpirun_command("mpirun", 4, forward=("MPBIND_NVSHMEM_PATH", "MPBIND_CUFFTMP_PATH"))
    assert "--oversubscribe" in cmd
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in cmd and "CUDA_MPS_PIPE_DIRECTORY" in cmd
    assert "MPBIND_NVSHMEM_PATH" in cmd and "MPBIND_CUFFTMP_PATH" not in cmd  # passed on only when set


@pytest.mark.parametrize("mode", ["pass", "fail"])
def test_under_mpirun(suite: Path, mode: str) -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not on PATH (install Open MPI to launch the trivial suite under it)")
    result = runner.launch(suite, 2, "--mode", mode, timeout=120, mpirun=mpirun)
    if mode == "pass":
        result.expect_clean(require=("first", "agree", "last"))
    else:
        with pytest.raises(pytest.fail.Exception, match=r"FAIL agree \[pe 1\]"):
            result.expect_clean()
