"""mpbind.fft without a GPU: the ranks' agreement before anything collective (every refusal raised on
every rank), and execute's checks of this rank's arrays against the plan before any library call,
with where each array goes (used in place, or copied into the plan's buffer with its padding)."""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mpbind import distributions as dist
from mpbind import fft
from mpbind._core import Composite
from mpbind._infra import cuda as _cuda
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
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


def assembled(spec: fp.FFTSpec, rank: int, monkeypatch: pytest.MonkeyPatch, symmetric: set[int] = frozenset(),
              buffer: int = 0x1000) -> tuple[fft.FFTPlan, Recorder]:
    """An FFTPlan over `spec` at `rank` whose library calls and copies are recorded; `symmetric` holds the
    pointers that lie in NVSHMEM memory with room enough."""
    rec = Recorder()
    p = fft.FFTPlan._over(Composite([], "test"))
    p.spec, p._rank, p._device = spec, rank, DEVICE
    p._buffer, p._room = buffer, spec.max_buffer_bytes
    p._need, p._stream, p._desc = spec.max_buffer_bytes, 0, None
    p._last = None

    def run(ptr: int, d: int) -> None:
        rec.calls.append(("exec", ptr, d))

    p._run = run  # type: ignore[method-assign]
    monkeypatch.setattr(fft, "_symmetric_room", lambda ptr, need: need if ptr in symmetric else 0)
    monkeypatch.setattr(_cuda, "copy_2d_async", lambda *a: rec.calls.append(("copy", *a)))
    return p, rec


def test_a_packed_array_is_copied_in_and_a_symmetric_one_used_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = fp.plan_fft((50, 62, 36), "complex64", 2)  # rank 1: X-slab 25 x 62 x 36, Y-slab 50 x 31 x 36
    p, rec = assembled(spec, 1, monkeypatch, symmetric={0x9000})
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


def test_the_real_side_is_padded_and_unpadded(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = fp.plan_fft((8, 6, 5), "float32", 2)  # real X-slab 4 x 6 x 5 stored as 4 x 6 x 6
    p, rec = assembled(spec, 0, monkeypatch)
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
    q, rec = assembled(c2r, 0, monkeypatch)
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
def test_execute_refuses_arrays_that_disagree_with_the_plan(monkeypatch: pytest.MonkeyPatch, x: Any,
                                                             match: str) -> None:
    p, rec = assembled(fp.plan_fft((50, 62, 36), "complex64", 2), 1, monkeypatch)
    with pytest.raises(UsageError, match=match):
        p.execute(x)
    assert rec.calls == []


def test_execute_refuses_a_complex_input_to_r2c_and_bad_directions(monkeypatch: pytest.MonkeyPatch) -> None:
    p, rec = assembled(fp.plan_fft((8, 6, 5), "float32", 2), 0, monkeypatch)
    with pytest.raises(UsageError, match="R2C plan takes the real array"):
        p.execute(DeviceArray((4, 6, 5), np.complex64))
    with pytest.raises(UsageError, match="only transforms FORWARD"):
        p.execute(direction=fft.INVERSE)
    c = fp.plan_fft((8, 6, 5), "complex64", 2)
    q, _ = assembled(c, 0, monkeypatch)
    for bad in (0, 2, True, "sideways"):
        with pytest.raises(UsageError, match="direction must be"):
            q.execute(direction=bad)
    q.execute(direction="inverse")
    assert rec.calls == []


def test_a_wrong_device_and_a_wrong_out_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    p, rec = assembled(fp.plan_fft((8, 8, 8), "complex64", 2), 0, monkeypatch)
    p._device = DEVICE + 5
    with pytest.raises(UsageError, match=f"device {DEVICE}; the plan runs on device {DEVICE + 5}"):
        p.execute(DeviceArray((4, 8, 8), np.complex64))
    p._device = DEVICE
    with pytest.raises(UsageError, match="out is complex128; this plan's output"):
        p.execute(out=DeviceArray((8, 4, 8), np.complex128))
    assert rec.calls == []


def test_box_plans_store_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (8, 6, 5)
    spec = fp.plan_fft(shape, "float32", 2, output=dist.Split(dist.hermitian_shape(shape), 2, axis=2))
    p, rec = assembled(spec, 1, monkeypatch)
    y = p.execute(DeviceArray((4, 6, 5), np.float32, ptr=0x5000))
    assert rec.calls[0] == ("copy", 0x1000, 5 * 4, 0x5000, 5 * 4, 5 * 4, 24, 0)
    assert y.shape == (8, 6, 1) and y.contiguous  # Z-slabs of the 3 halved columns: 2 + 1
