"""mpbind.fft without a GPU: the ranks' agreement before anything collective (every refusal raised on
every rank), and execute's checks of this rank's arrays against the plan before any library call,
with where each array goes (used in place, or copied into the plan's buffer with its padding)."""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mpbind import _core, fft
from mpbind import distributions as dist
from mpbind._core import Composite
from mpbind._infra import interop as _interop
from mpbind.errors import UsageError
from mpbind.fft import _planner as fp


class FakeComm:
    """An mpi4py-like communicator of `size` ranks seen from `rank`: its non-blocking allgather answers
    with this rank's frame at its place and `others` (rank -> frame) elsewhere, and records the
    frames this rank sent."""

    def __init__(self, rank: int, size: int, others: dict[int, list[int]] | None = None) -> None:
        self.rank, self.size, self.others = rank, size, others or {}
        self.gathered: list[list[int]] = []

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Iallgather(self, send: array[int], recv: array[int]) -> Any:  # noqa: N802
        mine = list(send)
        self.gathered.append(mine)
        rows = [mine if r == self.rank else self.others.get(r, mine) for r in range(self.size)]
        recv[:] = array("q", [w for row in rows for w in row])
        return SimpleNamespace(Test=lambda: True)


# A frame: two header words, then the agreement's row (whether the rank refused first).
REFUSED = 2


class Collective(Exception):
    """Raised where a plan would start its collective part (NVSHMEM, cuFFTMp)."""


@pytest.fixture
def no_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise Collective

    monkeypatch.setattr(fft, "_runtime", refuse)


def agreed_row(comm: FakeComm, **kwargs: Any) -> list[int]:
    """What another rank passing these values sends (whether it refuses them or goes on)."""
    probe = FakeComm(comm.rank, comm.size)
    with pytest.raises((Collective, UsageError)):
        fft.plan(probe, **kwargs)
    return probe.gathered[0]


# --- agreement ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_collective")
def test_agreed_values_go_on_to_the_collective_part() -> None:
    comm = FakeComm(0, 2)
    with pytest.raises(Collective):
        fft.plan(comm, (8, 8, 8), "complex64")
    assert len(comm.gathered) == 1  # one exchange, then NVSHMEM and cuFFTMp


@pytest.mark.usefixtures("no_collective")
def test_a_refusal_on_this_rank_is_raised_after_the_exchange() -> None:
    comm = FakeComm(0, 2)
    with pytest.raises(UsageError, match="r2c transform takes a real input"):
        fft.plan(comm, (8, 8, 8), "complex64", kind="r2c")
    assert len(comm.gathered) == 1 and comm.gathered[0][REFUSED]  # it told the others it refused


@pytest.mark.usefixtures("no_collective")
def test_a_refusal_on_another_rank_is_raised_here_too() -> None:
    row = agreed_row(FakeComm(1, 2), shape=(8, 8, 8), dtype="complex64", kind="r2c")
    comm = FakeComm(0, 2, {1: row})
    with pytest.raises(UsageError, match=r"^fft.plan refused on rank 1: .*r2c transform takes a real input"):
        fft.plan(comm, (8, 8, 8), "complex64")


@pytest.mark.usefixtures("no_collective")
def test_other_values_on_another_rank_are_refused_everywhere() -> None:
    other = agreed_row(FakeComm(1, 2), shape=(8, 8, 8), dtype="complex128")
    comm = FakeComm(0, 2, {1: other})
    with pytest.raises(UsageError, match=r"needs the same shape, dtype, .* on every rank: rank 1 passed others"):
        fft.plan(comm, (8, 8, 8), "complex64")
    out = dist.Split((8, 8, 8), 2, axis=2)
    other = agreed_row(FakeComm(1, 2), shape=(8, 8, 8), dtype="complex64", output=out)
    with pytest.raises(UsageError, match="passed others"):
        fft.plan(FakeComm(0, 2, {1: other}), (8, 8, 8), "complex64")


@pytest.mark.usefixtures("no_collective")
@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda c: fft.plan(c, (8, 8), "complex64", input=dist.Split((8, 8), 3)), UsageError, "over 3 ranks"),
    (lambda c: fft.plan(c, (8, 8, 8), "float32", output=dist.Split((8, 8, 8), 2, 1)), UsageError, "halved"),
    (lambda c: fft.plan(c, (8, 8, 8), "not-a-dtype"), UsageError, "dtype"),
    (lambda c: fft.plan(c, (8, 8, 8), "complex64", stream="s"), TypeError, "stream"),
    (lambda c: fft.plan(c, (8, 8, 8), "complex64", algorithm="fast"), UsageError, "algorithm"),
    (lambda c: fft.plan_reshape(c, dist.Split((8, 8), 2), dist.Split((8, 9), 2), "float32"), UsageError, "shape"),
    (lambda c: fft.plan_reshape(c, dist.Split((8, 8), 4), dist.Split((8, 8), 4), "float32"), UsageError,
     "communicator has 2"),
    (lambda c: fft.plan_reshape(c, dist.Split((4, 9), 2), dist.Split((4, 9), 2, 1), "int16"), UsageError,
     "groups of 2"),
])
def test_every_refusal_is_raised_after_one_exchange(call: Any, error: type[Exception], match: str) -> None:
    comm = FakeComm(0, 2)
    with pytest.raises(error, match=match):
        call(comm)
    assert len(comm.gathered) == 1 and comm.gathered[0][REFUSED]


def test_comm_must_be_a_communicator_or_none() -> None:
    with pytest.raises(TypeError, match="mpi4py communicator"):
        fft.plan("world", (8, 8, 8), "complex64")
    if not fft.nvshmem.is_initialized():
        with pytest.raises(UsageError, match="initialise it first"):
            fft.plan(None, (8, 8, 8), "complex64")


@pytest.mark.parametrize(("cls", "maker"), [(fft.FFTPlan, "plan()"), (fft.ReshapePlan, "plan_reshape()")])
def test_plans_are_not_constructed_directly(cls: type, maker: str) -> None:
    with pytest.raises(TypeError, match=maker.replace("(", r"\(").replace(")", r"\)")):
        cls()


# --- execute's checks (a plan assembled without a library) ---------------------------------------------------


class DeviceArray:
    """A device array as __cuda_array_interface__ describes it (never dereferenced)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, ptr: int = 0x7F0000000000,
                 strides: tuple[int, ...] | None = None) -> None:
        dt = np.dtype(dtype)
        self.__cuda_array_interface__ = {"shape": shape, "typestr": dt.str, "data": (ptr, False), "version": 3,
                                         "strides": None if strides is None else tuple(s * dt.itemsize
                                                                                       for s in strides)}


DEVICE = _interop.device_array(DeviceArray((1,), np.float32), "probe").device


class Recorder:
    """The calls of a plan's executor, as the core's test double records them: ("copy", dst, dst_pitch,
    src, src_pitch, row_bytes, rows, stream) and ("exec", ptr, direction)."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    @property
    def calls(self) -> list[tuple[Any, ...]]:
        return self.executor.recorded

    def clear(self) -> None:
        self.executor.recorded.clear()


def assembled(spec: fp.FFTSpec, rank: int, symmetric: set[int] = frozenset(), buffer: int = 0x1000,
              device: int = DEVICE) -> tuple[fft.FFTPlan, Recorder]:
    """An FFTPlan over `spec` at `rank` whose executor is the core's test double (its copies and transforms
    recorded, not made); `symmetric` holds the pointers that lie in NVSHMEM memory with room enough."""
    p = fft.FFTPlan._over(Composite([], "test"))
    p.spec, p._rank, p._device = spec, rank, device
    p._buffer, p._room = buffer, spec.max_buffer_bytes
    p._need, p._stream, p._desc = spec.max_buffer_bytes, 0, None
    p._last = None
    directions = {"c2c": (fft.FORWARD, fft.INVERSE), "r2c": (fft.FORWARD,), "c2r": (fft.INVERSE,)}[spec.kind]
    sides = {d: tuple((s.dtype, s.shape, s.storage, repr(s.box)) for s in p._sides(d)) for d in directions}
    heap = [(ptr, spec.max_buffer_bytes) for ptr in symmetric]
    p._executor = _core._testing.cufftmp_executor(sides, p._need, buffer, device, spec.algorithm == "boxes",
                                                  "fft.FFTPlan", heap)
    return p, Recorder(p._executor)


def test_a_packed_array_is_copied_in_and_a_symmetric_one_used_in_place() -> None:
    spec = fp.plan_fft((50, 62, 36), "complex64", 2)  # rank 1: X-slab 25 x 62 x 36, Y-slab 50 x 31 x 36
    p, rec = assembled(spec, 1, symmetric={0x9000})
    y = p.execute(DeviceArray((25, 62, 36), np.complex64, ptr=0x5000))
    assert rec.calls == [("copy", 0x1000, 36 * 8, 0x5000, 36 * 8, 36 * 8, 25 * 62, 0), ("exec", 0x1000, fft.FORWARD)]
    assert isinstance(y, fft.DeviceView) and (y.ptr, y.shape, y.dtype) == (0x1000, (50, 31, 36), "complex64")
    assert y.__cuda_array_interface__["strides"] is None
    rec.calls.clear()
    x = DeviceArray((25, 62, 36), np.complex64, ptr=0x9000)
    y = p.execute(x)
    assert rec.calls == [("exec", 0x9000, fft.FORWARD)] and y.ptr == 0x9000
    assert p.execute(x) is y  # the same array again: no check, no copy
    back = p.execute(y, direction=fft.INVERSE)  # the view is symmetric: in place again
    assert rec.calls[-1] == ("exec", 0x9000, fft.INVERSE) and back.shape == (25, 62, 36)


def test_the_real_side_is_padded_and_unpadded() -> None:
    spec = fp.plan_fft((8, 6, 5), "float32", 2)  # real X-slab 4 x 6 x 5 stored as 4 x 6 x 6
    p, rec = assembled(spec, 0)
    p.execute(DeviceArray((4, 6, 5), np.float32, ptr=0x5000))
    assert rec.calls[0] == ("copy", 0x1000, 6 * 4, 0x5000, 5 * 4, 5 * 4, 24, 0)
    rec.calls.clear()
    p.execute(DeviceArray((4, 6, 6), np.float32, ptr=0x6000))  # already padded: copied whole rows
    assert rec.calls[0] == ("copy", 0x1000, 6 * 4, 0x6000, 6 * 4, 5 * 4, 24, 0)
    view = p.input_view()
    assert view.shape == (4, 6, 5) and view.strides == (36, 6, 1) and not view.contiguous
    assert view.__cuda_array_interface__["strides"] == (144, 24, 4)
    with pytest.raises(BufferError, match="strided"):
        view.__dlpack__()
    c2r = fp.plan_fft((8, 6, 5), "complex64", 2, kind="c2r")
    q, rec = assembled(c2r, 0)
    assert q.input_view().shape == (8, 3, 3) and q.input_view().contiguous  # its complex Y-slab
    out = DeviceArray((4, 6, 5), np.float32, ptr=0x7000)
    assert q.execute(DeviceArray((8, 3, 3), np.complex64, ptr=0x5000), out=out) is out
    assert rec.calls[-1] == ("copy", 0x7000, 5 * 4, 0x1000, 6 * 4, 5 * 4, 24, 0)  # unpadded into out


@pytest.mark.parametrize(("x", "match"), [
    (DeviceArray((25, 62, 36), np.complex128), "x is complex128; this plan's input on this rank is complex64"),
    (DeviceArray((25, 62, 35), np.complex64), r"x has shape \(25, 62, 35\); this rank's piece is \(25, 62, 36\)"),
    (DeviceArray((50, 31, 36), np.complex64), r"this rank's piece is \(25, 62, 36\)"),
    (DeviceArray((25, 62, 36), np.complex64, strides=(1, 25, 25 * 62)), "C-contiguous"),
    (np.zeros((25, 62, 36), np.complex64), "GPU"),
])
def test_execute_refuses_arrays_that_disagree_with_the_plan(x: Any, match: str) -> None:
    p, rec = assembled(fp.plan_fft((50, 62, 36), "complex64", 2), 1)
    with pytest.raises(UsageError, match=match):
        p.execute(x)
    assert rec.calls == []


def test_execute_refuses_a_complex_input_to_r2c_and_bad_directions() -> None:
    p, rec = assembled(fp.plan_fft((8, 6, 5), "float32", 2), 0)
    with pytest.raises(UsageError, match="R2C plan takes the real array"):
        p.execute(DeviceArray((4, 6, 5), np.complex64))
    with pytest.raises(UsageError, match="only transforms FORWARD"):
        p.execute(direction=fft.INVERSE)
    c = fp.plan_fft((8, 6, 5), "complex64", 2)
    q, _ = assembled(c, 0)
    for bad in (0, 2, True, "sideways"):
        with pytest.raises(UsageError, match="direction must be"):
            q.execute(direction=bad)
    q.execute(direction="inverse")
    assert rec.calls == []


def test_a_wrong_device_and_a_wrong_out_are_refused() -> None:
    p, rec = assembled(fp.plan_fft((8, 8, 8), "complex64", 2), 0, device=DEVICE + 5)
    with pytest.raises(UsageError, match=f"device {DEVICE}; the plan runs on device {DEVICE + 5}"):
        p.execute(DeviceArray((4, 8, 8), np.complex64))
    assert rec.calls == []
    p, rec = assembled(fp.plan_fft((8, 8, 8), "complex64", 2), 0)
    with pytest.raises(UsageError, match="out is complex128; this plan's output"):
        p.execute(out=DeviceArray((8, 4, 8), np.complex128))
    assert rec.calls == []


def test_box_plans_store_packed() -> None:
    shape = (8, 6, 5)
    spec = fp.plan_fft(shape, "float32", 2, output=dist.Split(dist.hermitian_shape(shape), 2, axis=2))
    p, rec = assembled(spec, 1)
    y = p.execute(DeviceArray((4, 6, 5), np.float32, ptr=0x5000))
    assert rec.calls[0] == ("copy", 0x1000, 5 * 4, 0x5000, 5 * 4, 5 * 4, 24, 0)
    assert y.shape == (8, 6, 1) and y.contiguous  # Z-slabs of the 3 halved columns: 2 + 1


class ReadOnlyArray(DeviceArray):
    def __init__(self, shape: tuple[int, ...], dtype: Any, ptr: int) -> None:
        super().__init__(shape, dtype, ptr)
        self.__cuda_array_interface__["data"] = (ptr, True)


def test_a_read_only_symmetric_input_is_copied_and_out_gets_the_result() -> None:
    spec = fp.plan_fft((8, 8, 8), "complex64", 2)  # rank 0: X-slab 4 x 8 x 8, Y-slab 8 x 4 x 8
    p, rec = assembled(spec, 0, symmetric={0x9000})
    y = p.execute(ReadOnlyArray((4, 8, 8), np.complex64, 0x9000))
    assert rec.calls == [("copy", 0x1000, 64, 0x9000, 64, 64, 32, 0), ("exec", 0x1000, fft.FORWARD)]
    assert y.ptr == 0x1000
    rec.clear()
    out = DeviceArray((8, 4, 8), np.complex64, ptr=0x7000)
    assert p.execute(DeviceArray((4, 8, 8), np.complex64, ptr=0x9000), out=out) is out  # in place, then out
    assert rec.calls == [("exec", 0x9000, fft.FORWARD), ("copy", 0x7000, 64, 0x9000, 64, 64, 32, 0)]
    rec.clear()
    with pytest.raises(UsageError, match="out is read-only"):
        p.execute(out=ReadOnlyArray((8, 4, 8), np.complex64, 0x7000))
    with pytest.raises(UsageError, match=r"out has shape \(4, 8, 8\); this rank's piece is \(8, 4, 8\), box "):
        p.execute(out=DeviceArray((4, 8, 8), np.complex64, ptr=0x7000))
    assert rec.calls == []


def test_an_input_short_of_the_largest_buffer_is_copied() -> None:
    """In place needs the largest rank's buffer from the array's start (alike on every rank)."""
    spec = fp.plan_fft((9, 8, 8), "complex64", 2)  # rank 1 holds 4 planes; rank 0's 5 set the need
    p, rec = assembled(spec, 1)
    p._executor = _core._testing.cufftmp_executor(
        {d: tuple((s.dtype, s.shape, s.storage, repr(s.box)) for s in p._sides(d)) for d in (fft.FORWARD, fft.INVERSE)},
        p._need, 0x1000, DEVICE, False, "fft.FFTPlan", [(0x9000, spec.buffer_bytes(1))])
    p.execute(DeviceArray((4, 8, 8), np.complex64, ptr=0x9000))
    assert p._executor.recorded[0][0] == "copy" and spec.buffer_bytes(1) < p._need
