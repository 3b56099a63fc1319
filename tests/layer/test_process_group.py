"""mpbind.process_group without a GPU: exchanges among ranks simulated by threads (callable groups over
a shared table), the agreement protocol (the same refusal, with the same message, on every rank),
fixed-size frames whatever a rank asks, bounded waits, and bad input refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
from array import array
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mpbind import process_group as pg
from mpbind.errors import MpbindError, UsageError, WaitTimeoutError

sys.path.insert(0, str(Path(__file__).parent))
from fake_groups import FRAME_BYTES, ThreadWorld, same_error  # noqa: E402

# --- exchanges -------------------------------------------------------------------------------------------


def test_allgather_and_broadcast_deliver_in_rank_order() -> None:
    world = ThreadWorld(4)
    rows = world.run(lambda g: g.allgather_ints([g.rank, -g.rank, 2**63 - 1]))
    assert all(r == [[k, -k, 2**63 - 1] for k in range(4)] for r in rows)
    data = world.run(lambda g: g.allgather_bytes(bytes([g.rank]) * 9))
    assert all(d == [bytes([k]) * 9 for k in range(4)] for d in data)
    got = world.run(lambda g: g.broadcast_bytes(b"from two \xff" if g.rank == 2 else None, 2))
    assert got == [b"from two \xff"] * 4
    assert set(world.sent) == {FRAME_BYTES}  # one frame per rank, whatever the width


def test_a_group_with_only_a_broadcast_gathers_through_it() -> None:
    world = ThreadWorld(3)
    rows = world.run(lambda g: g.allgather_ints([10 + g.rank]), broadcast_only=True)
    assert rows == [[[10], [11], [12]]] * 3
    assert world.run(lambda g: g.broadcast_bytes(b"id" if g.rank == 1 else None, 1), broadcast_only=True) == [b"id"] * 3


@pytest.mark.parametrize(("exchange", "asked"), [
    (lambda g: g.allgather_ints([1, 2, 3] if g.rank == 1 else [1, 2]), "an allgather of 3 ints"),
    (lambda g: g.allgather_ints([1]) if g.rank == 2 else g.allgather_bytes(b"12345678"), "an allgather of 1 ints"),
    (lambda g: g.allgather_bytes(b"x" * (5 + (g.rank == 0))), "an allgather of 5 bytes"),
    (lambda g: g.broadcast_bytes(b"x" if g.rank == g.nranks - 1 else None, g.nranks - 1 if g.rank else 0),
     "a broadcast"),
])
def test_ranks_asking_different_exchanges_all_raise_the_same_error(exchange: Callable[[pg.ProcessGroup], Any],
                                                                   asked: str) -> None:
    world = ThreadWorld(3)
    message = same_error(world.run(exchange), UsageError)
    assert "the ranks made different exchanges" in message and asked in message
    assert set(world.sent) == {FRAME_BYTES}  # the transport saw the same size everywhere: nothing could hang


def test_one_rank_exchanges_without_the_transport() -> None:
    calls: list[bytes] = []
    group = pg.CallableProcessGroup(0, 1, allgather=lambda data: calls.append(data) or [data])
    assert group.allgather_ints([5, 6]) == [[5, 6]]
    assert group.broadcast_bytes(b"uid", 0) == b"uid"
    pg.agree(group, "a plan", 7)
    assert calls == []


# --- agreement -----------------------------------------------------------------------------------------


def test_agreed_values_pass_on_every_rank() -> None:
    world = ThreadWorld(3)
    assert world.run(lambda g: pg.agree(g, "a plan", pg.digest((8, 8), "float32"))) == [None] * 3
    assert world.run(lambda g: pg.decided(g, "a plan", 5, lambda: g.rank * 2)) == [0, 2, 4]


def test_a_refusal_on_one_rank_is_raised_alike_on_every_rank() -> None:
    world = ThreadWorld(4)
    own = TypeError("stream must be a CUDA stream, not str")

    def plan(g: pg.ProcessGroup) -> None:
        pg.agree(g, "fft.plan", 42, own if g.rank == 2 else None)

    results = world.run(plan)
    message = same_error(results, TypeError)
    assert message == "fft.plan refused on rank 2: stream must be a CUDA stream, not str; no rank went on"
    assert results[2].__cause__ is own and results[0].__cause__ is None


def test_the_first_refusal_is_named_with_the_others() -> None:
    world = ThreadWorld(4)

    def decide(rank: int) -> int:
        if rank in (1, 3):
            raise UsageError(f"rank {rank}'s array is too small")
        return rank

    message = same_error(world.run(lambda g: pg.decided(g, "a plan", 1, lambda: decide(g.rank))), UsageError)
    assert message == "a plan refused on rank 1 (and on rank 3): rank 1's array is too small; no rank went on"


def test_an_unexpected_failure_is_agreed_as_an_mpbind_error() -> None:
    world = ThreadWorld(2)

    def decide(rank: int) -> None:
        if rank == 0:
            raise KeyError("boom")

    message = same_error(world.run(lambda g: pg.decided(g, "a plan", 1, lambda: decide(g.rank))), MpbindError)
    assert "refused on rank 0: KeyError: 'boom'" in message


def test_other_values_on_one_rank_are_refused_on_every_rank() -> None:
    world = ThreadWorld(3)
    message = same_error(world.run(lambda g: pg.agree(g, "fft.plan", 7 if g.rank != 1 else 8,
                                                      described="shape and dtype")), UsageError)
    assert message == "fft.plan needs the same shape and dtype on every rank: rank 1 passed others than rank 0"
    fields = world.run(lambda g: pg.agree(g, "AllGatherMatmul", [64, 128, 32 + 32 * (g.rank == 2)],
                                          described="arguments", names=("m", "k", "n")))
    assert same_error(fields, UsageError).endswith("rank 2 passed others than rank 0 (n=32 on rank 0, 64 on rank 2)")


def test_a_refusal_goes_before_a_difference() -> None:
    world = ThreadWorld(2)
    results = world.run(lambda g: pg.agree(g, "a plan", [g.rank], UsageError("bad") if g.rank else None))
    assert same_error(results, UsageError) == "a plan refused on rank 1: bad; no rank went on"


def test_a_long_message_is_cut_alike_on_every_rank() -> None:
    world = ThreadWorld(2)
    long = "é" * pg.MESSAGE_BYTES
    message = same_error(world.run(lambda g: pg.agree(g, "a plan", 0, UsageError(long) if g.rank == 0 else None)),
                         UsageError)
    assert "é" * 200 in message and "...; no rank went on" in message


def test_largest_and_smallest() -> None:
    world = ThreadWorld(3)
    assert world.run(lambda g: pg.largest(g, [5, 9, 2][g.rank])) == [9] * 3
    assert world.run(lambda g: pg.smallest(g, [5, 9, 2][g.rank])) == [2] * 3


def test_digest_is_stable_and_fits_an_int64() -> None:
    a = pg.digest((10**5000, 3), "x")  # an int too long for decimal text
    assert a == pg.digest((10**5000, 3), "x") != pg.digest((10**5000 + 1, 3), "x")
    assert -(2**63) <= pg.digest({"a": 1}, None) < 2**63
    assert pg.digest(1, 2) != pg.digest(2, 1)


# --- bad input ----------------------------------------------------------------------------------------------


def one() -> pg.ProcessGroup:
    return pg.CallableProcessGroup(0, 2, allgather=lambda data: [data, data])


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: one().allgather_ints("12"), TypeError, "values must be a sequence of ints"),
    (lambda: one().allgather_ints([1, True]), TypeError, r"values\[1\] must be an int"),
    (lambda: one().allgather_ints([2**63]), UsageError, r"values\[0\] must be in"),
    (lambda: one().allgather_ints([0] * (pg.MAX_INTS + 1)), UsageError, f"at most {pg.MAX_INTS}"),
    (lambda: one().allgather_bytes("text"), TypeError, "data must be bytes"),
    (lambda: one().allgather_bytes(bytes(pg.MAX_BYTES + 1)), UsageError, f"at most {pg.MAX_BYTES}"),
    (lambda: one().broadcast_bytes(b"", 2), UsageError, "root is 2; the group has 2 ranks"),
    (lambda: pg.CallableProcessGroup(0, 1, allgather=list).broadcast_bytes(None, 0), UsageError,
     "rank 0, the root, passed None"),
    (lambda: pg.CallableProcessGroup(0, 2), UsageError, "allgather= or a broadcast="),
    (lambda: pg.CallableProcessGroup(0, 2, allgather=5), TypeError, "allgather must be callable"),  # type: ignore[arg-type]
    (lambda: pg.CallableProcessGroup(2, 2, allgather=list), UsageError, "rank must be in"),
    (lambda: pg.CallableProcessGroup(0, None, broadcast=lambda d, r: b"").allgather_ints([1]), UsageError,
     "without nranks"),
    (lambda: pg.CallableProcessGroup(0, 2, allgather=lambda d: [d]).allgather_ints([1]), UsageError,
     "delivered 1 frames"),
    (lambda: pg.CallableProcessGroup(0, 2, allgather=lambda d: b"xy").allgather_ints([1]), UsageError,
     "returned bytes, not a sequence"),
    (lambda: pg.CallableProcessGroup(0, 2, allgather=lambda d: [d, 5]).allgather_ints([1]), UsageError,
     "part 1 is int, not bytes"),
    (lambda: pg.CallableProcessGroup(1, 2, broadcast=lambda d, r: b"short").broadcast_bytes(None, 0), UsageError,
     f"5 bytes; the frame it was given has {FRAME_BYTES}"),
    (lambda: pg.process_group(5, what="placement_via"), TypeError, "placement_via must be an mpbind ProcessGroup"),
    (lambda: pg.process_group(lambda data: [data]), UsageError, "pass this process's rank= and the group's nranks="),
    (lambda: pg.agree(object(), "a plan", 1), TypeError, "group must be an mpbind ProcessGroup"),  # type: ignore[arg-type]
    (lambda: pg.agree(one(), "a plan", [1, 2], names=("m",)), UsageError, "1 names for 2 values"),
    (lambda: pg.agree(one(), "a plan", [0] * (pg.MAX_VALUES + 1)), UsageError, f"at most {pg.MAX_VALUES}"),
    (lambda: pg.MPIProcessGroup(object()), TypeError, "comm must be an mpi4py communicator"),
    (lambda: pg.NCCLProcessGroup(object()), TypeError, "comm must be an mpbind.nccl.Communicator"),
])
def test_bad_input_is_refused_naming_it(call: Callable[[], object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_process_group_takes_every_channel() -> None:
    group = one()
    assert pg.process_group(group) is group
    made = pg.process_group(lambda data: [data, data, data], rank=1, nranks=3)
    assert isinstance(made, pg.CallableProcessGroup) and (made.rank, made.nranks) == (1, 3)
    assert isinstance(pg.process_group(FakeMPI(0, 2)), pg.MPIProcessGroup)
    from mpbind import nccl, nvshmem

    comm = nccl.Communicator.__new__(nccl.Communicator)
    object.__setattr__(comm, "_core", SimpleNamespace(rank=1, size=4, device=0))
    over_nccl = pg.process_group(comm)
    assert isinstance(over_nccl, pg.NCCLProcessGroup) and (over_nccl.rank, over_nccl.nranks) == (1, 4)
    if not nvshmem.is_initialized():
        with pytest.raises(UsageError, match="needs NVSHMEM initialised first"):
            pg.process_group(nvshmem)
    assert pg.NVSHMEMProcessGroup.unit == "PE" and one().unit == "rank"


# --- MPI: a fake communicator (the non-blocking call the group makes), and mpi4py itself --------------------


class FakeMPI:
    """An mpi4py-like communicator of `size` ranks seen from `rank`: Iallgather answers with this
    rank's frame everywhere, at once or (`never`) not at all."""

    def __init__(self, rank: int, size: int, never: bool = False) -> None:
        self.rank, self.size, self.never = rank, size, never

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Iallgather(self, send: array[int], recv: array[int]) -> Any:  # noqa: N802
        if not self.never:
            recv[:] = array("q", list(send) * self.size)
        return SimpleNamespace(Test=lambda: not self.never)


def test_mpi_exchanges_are_buffers_of_one_frame() -> None:
    group = pg.MPIProcessGroup(FakeMPI(1, 3))
    assert group.allgather_ints([4, 5]) == [[4, 5]] * 3
    assert group.allgather_bytes(b"abc") == [b"abc"] * 3


def test_an_exchange_that_never_completes_is_given_up_at_the_deadline() -> None:
    group = pg.MPIProcessGroup(FakeMPI(0, 2, never=True), timeout=0.2)
    kept = len(pg._abandoned)
    with pytest.raises(WaitTimeoutError, match="an MPI set-up exchange did not complete within 0.2 s: another rank"):
        group.allgather_ints([1])
    assert len(pg._abandoned) == kept + 1  # its buffers stay: MPI may still write them


def test_mpi4py_one_rank() -> None:
    mpi = pytest.importorskip("mpi4py.MPI", reason="mpi4py is an optional extra")
    group = pg.process_group(mpi.COMM_SELF)
    assert isinstance(group, pg.MPIProcessGroup) and (group.rank, group.nranks) == (0, 1)
    assert group.allgather_ints([3]) == [[3]]
    assert group.broadcast_bytes(b"uid", 0) == b"uid"
    with pytest.raises(UsageError, match="refused on rank 0: no"):
        pg.agree(group, "a plan", 1, UsageError("no"))
    frame = list(range(pg.FRAME_WORDS))
    assert group._allgather_frame(frame) == [frame]  # the MPI call itself, which one rank skips


def test_torch_one_rank() -> None:
    dist = pytest.importorskip("torch.distributed", reason="torch is an optional extra")
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = pg.process_group(dist)
        assert isinstance(group, pg.TorchProcessGroup) and (group.rank, group.nranks) == (0, 1)
        frame = list(range(pg.FRAME_WORDS))
        assert group._allgather_frame(frame) == [frame]  # the torch call itself, which one rank skips
        assert pg.process_group(dist.group.WORLD).nranks == 1
    finally:
        dist.destroy_process_group()


RANKS = """
from mpi4py import MPI
from mpbind import process_group as pg
g = pg.process_group(MPI.COMM_WORLD)
assert g.allgather_ints([g.rank, -1]) == [[r, -1] for r in range(g.nranks)]
assert g.broadcast_bytes(b"id" if g.rank == 1 else None, 1) == b"id"
for values, failure in (([g.rank], None), (5, ValueError("too big") if g.rank == 2 else None)):
    try:
        pg.agree(g, "a plan", values, failure)
    except ValueError as exc:
        print(f"rank {g.rank}: {type(exc).__name__}: {exc}", flush=True)
"""


def test_mpi4py_ranks_agree(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py.MPI", reason="mpi4py is an optional extra")
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec")
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(proc.stdout.splitlines())
    assert [line.split(":", 1)[0] for line in lines] == ["rank 0", "rank 0", "rank 1", "rank 1", "rank 2", "rank 2"]
    messages = {line.split(": ", 1)[1] for line in lines}
    assert messages == {"UsageError: a plan needs the same values on every rank: ranks 1, 2 passed others than rank 0",
                        "UsageError: a plan refused on rank 2: too big; no rank went on"}
