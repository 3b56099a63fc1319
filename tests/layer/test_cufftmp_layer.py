"""The Pythonic cuFFTMp layer (mpbind.cufftmp over mpbind._core.cufftmp) without a GPU.

What is decided before a library call is checked here: argument validation, dtype and size
checks against a plan, use after close, idempotent close, and that the real library's
failures without a GPU arrive as typed mpbind.errors classes. Creating a Reshape loads the
whole function table of the core, so it also checks every capsule signature the core expects.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import numpy as np
import pytest

from mpbind import _core, cufftmp
from mpbind._infra import info as _info
from mpbind.errors import CuFFTMpError, UsageError

cf = _core.cufftmp


def _no_gpu() -> None:
    count, _ = _info.gpu_count()
    if count:
        pytest.skip("a GPU is visible: these check the failures without one")


# --- plans --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: cf.Plan(), lambda: cufftmp.Plan()], ids=["core", "facade"])
def test_plan_without_a_gpu_raises_the_typed_error(make: Any) -> None:
    _no_gpu()
    with pytest.raises(CuFFTMpError) as info:
        make()
    err = info.value
    assert type(err) is not CuFFTMpError and err.status == type(err).status_code
    assert err.function == "cufftCreate"
    assert _core.queued() == []


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: cufftmp.Plan.create_3d(None, (8, 0, 4), cufftmp.Type.C2C), UsageError, r"shape\[1\] must be in \[1"),
        (lambda: cufftmp.Plan.create_3d(None, (8, 8), cufftmp.Type.C2C), UsageError, "3 extents"),
        (lambda: cufftmp.Plan.create_2d(None, (8, 8, 8), cufftmp.Type.C2C), UsageError, "2 extents"),
        (lambda: cufftmp.Plan.create_3d(None, (8, 8, 4), 7), UsageError, "not a cufftmp.Type"),
        (lambda: cufftmp.Plan.create_3d(None, (8, 8, 4), "C2C"), TypeError, "fft_type"),
        (lambda: cufftmp.Plan.create_3d(None, (8, 8.0, 4), cufftmp.Type.C2C), TypeError, r"shape\[1\] must be an int"),
        (lambda: cufftmp.Plan.create_3d(None, 8, cufftmp.Type.C2C), TypeError, "sequence"),
        (lambda: cufftmp.Plan.create_decomposition(None, (4, 4, 4, 4), cufftmp.Type.C2C, ([0] * 4, [4] * 4),
                                                   ([0] * 4, [4] * 4)), UsageError, "2-D or 3-D"),
        (lambda: cufftmp.Plan.create_decomposition(None, (4, 4, 4), cufftmp.Type.C2C, ([0, 0], [4, 4, 4]),
                                                   ([0, 0, 0], [4, 4, 4])), UsageError, "3 coordinates"),
        (lambda: cufftmp.Plan.create_decomposition(None, (4, 4, 4), cufftmp.Type.C2C, ([0, 2, 0], [4, 1, 4]),
                                                   ([0, 0, 0], [4, 4, 4])), UsageError, "not a box"),
        (lambda: cufftmp.Plan.create(None, (8, 8, 8, 8), cufftmp.Type.C2C), UsageError, "2-D or 3-D"),
        (lambda: cufftmp.Plan.create(None, (8, 8, 4), cufftmp.Type.C2C, subformats=(99, 1)), UsageError,
         r"subformats\[0\] must be a cufftmp.SubFormat"),
        (lambda: cufftmp.Plan.create(None, (8, 8, 4), cufftmp.Type.C2C, subformats=5), TypeError,
         r"\(forward, inverse\) pair"),
    ],
)
def test_plan_arguments_are_refused_before_the_library(call: Any, error: type, match: str) -> None:
    # Without a GPU, reaching cufftCreate would raise CuFFTMpError instead.
    with pytest.raises(error, match=match):
        call()


def test_communicators_are_resolved_or_refused() -> None:
    from mpbind.cufftmp import _resolve_comm

    assert _resolve_comm(None) == (cufftmp.CommType.NONE, 0, None)
    assert _resolve_comm(0x1234) == (cufftmp.CommType.MPI, 0x1234, None)
    with pytest.raises(UsageError, match="0"):
        _resolve_comm(0)
    with pytest.raises(TypeError, match="communicator|address"):
        _resolve_comm("world")
    with pytest.raises(TypeError):
        _resolve_comm(True)


def test_descriptors_come_only_from_a_plan() -> None:
    with pytest.raises(TypeError, match="Plan.malloc"):
        cufftmp.Descriptor()
    with pytest.raises(TypeError):
        cf.Descriptor()


def test_module_surface() -> None:
    for name in cufftmp.__all__:
        assert hasattr(cufftmp, name), name
    assert cufftmp.FORWARD == -1 and cufftmp.INVERSE == 1
    for method in ("attach_comm", "set_stream", "set_subformat_default", "set_distribution", "make_plan_2d",
                   "make_plan_3d", "exec", "malloc", "exec_descriptor", "executor", "close", "destroy", "__enter__"):
        assert hasattr(cf.Plan, method), method
        assert hasattr(cufftmp.Plan, method), method
    for factory in ("create", "create_2d", "create_3d", "create_decomposition"):
        assert hasattr(cufftmp.Plan, factory), factory


# --- the facade's checks against a plan (a stand-in core: no plan can be made here) -------------


class FakeCore:
    """What mpbind.cufftmp.Plan reads from its core plan. exec runs the core's own checks of a made
    plan (mpbind._core._testing.cufftmp_exec) and records what cufftExec* would get."""

    def __init__(self, fft_type: int, shape: tuple[int, ...]) -> None:
        self.fft_type = int(fft_type)
        self.shape = list(shape)
        self.closed = False
        self.calls: list[tuple[int, int, int]] = []

    def exec(self, input: Any, output: Any, direction: Any, layout: Any) -> None:
        if self.closed:
            raise UsageError("cufftmp.Plan is closed")
        self.calls.append(tuple(_core._testing.cufftmp_exec(self.fft_type, input, output, direction, layout)))

    def close(self) -> None:
        self.closed = True


class FakeComm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size


class DeviceArray:
    """A device array as __cuda_array_interface__ describes it (never dereferenced)."""

    def __init__(self, n: int, dtype: Any, ptr: int = 0x7F0000000000, readonly: bool = False) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": np.dtype(dtype).str, "data": (ptr, readonly),
                                         "strides": None, "version": 3}


def fake_plan(fft_type: cufftmp.Type, shape: tuple[int, ...], rank: int = 0, size: int = 1) -> cufftmp.Plan:
    plan = cufftmp.Plan.__new__(cufftmp.Plan)
    plan._core = FakeCore(fft_type, shape)
    plan._comm = FakeComm(rank, size)
    plan._distribution = None
    plan._layout = plan._local_layout(shape, fft_type)
    return plan


def test_slab_layouts() -> None:
    # 10 planes over 3 PEs: 4, 3, 3 (the first X % N get one more); Y = 7 -> 3, 2, 2.
    p = fake_plan(cufftmp.Type.C2C, (10, 7, 6), rank=1, size=3)
    assert p.local_shapes(cufftmp.FORWARD) == ((3, 7, 6), (10, 2, 6))
    assert p.local_shapes(cufftmp.INVERSE) == ((10, 2, 6), (3, 7, 6))
    r = fake_plan(cufftmp.Type.R2C, (10, 7, 6), rank=0, size=3)
    assert r.local_shapes(cufftmp.FORWARD) == ((4, 7, 8), (10, 3, 4))  # Z padded to 2*(6//2+1)
    assert r.local_shapes(cufftmp.INVERSE) is None
    c = fake_plan(cufftmp.Type.Z2D, (10, 7, 5), rank=2, size=3)
    assert c.local_shapes(cufftmp.INVERSE) == ((10, 2, 3), (3, 7, 6))
    assert fake_plan(cufftmp.Type.C2C, (5, 9), rank=1, size=2).local_shapes(cufftmp.FORWARD) == ((2, 9), (5, 4))
    with pytest.raises(UsageError, match="direction"):
        p.local_shapes(0)


def test_swapped_slab_subformats_swap_the_layout() -> None:
    """Plan.create(subformats=(INPLACE_SHUFFLED, INPLACE)): a forward transform reads Y-slabs."""
    swapped = (cufftmp.SubFormat.XT_FORMAT_INPLACE_SHUFFLED, cufftmp.SubFormat.XT_FORMAT_INPLACE)
    default = (cufftmp.SubFormat.XT_FORMAT_INPLACE, cufftmp.SubFormat.XT_FORMAT_INPLACE_SHUFFLED)
    p = fake_plan(cufftmp.Type.C2C, (10, 7, 6), rank=1, size=3)
    layout = cufftmp._in_subformats(p._layout, cufftmp.Type.C2C, swapped)
    assert layout == {cufftmp.FORWARD: ((10, 2, 6), (3, 7, 6)), cufftmp.INVERSE: ((3, 7, 6), (10, 2, 6))}
    assert cufftmp._in_subformats(p._layout, cufftmp.Type.C2C, default) == p._layout
    assert cufftmp._in_subformats(p._layout, cufftmp.Type.C2C, None) == p._layout
    r = fake_plan(cufftmp.Type.R2C, (10, 7, 6), rank=0, size=3)
    assert cufftmp._in_subformats(r._layout, cufftmp.Type.R2C, swapped) is None


@pytest.mark.parametrize(
    ("fft_type", "dtypes"),
    [(cufftmp.Type.C2C, ("complex64", "complex64")), (cufftmp.Type.Z2Z, ("complex128", "complex128")),
     (cufftmp.Type.R2C, ("float32", "complex64")), (cufftmp.Type.D2Z, ("float64", "complex128")),
     (cufftmp.Type.C2R, ("complex64", "float32")), (cufftmp.Type.Z2D, ("complex128", "float64"))],
)
def test_plan_dtypes(fft_type: cufftmp.Type, dtypes: tuple[str, str]) -> None:
    plan = fake_plan(fft_type, (4, 4, 4))
    direction = cufftmp.INVERSE if fft_type in (cufftmp.Type.C2R, cufftmp.Type.Z2D) else cufftmp.FORWARD
    assert plan.dtypes(direction) == dtypes


def test_exec_checks_arrays_before_the_library() -> None:
    plan = fake_plan(cufftmp.Type.C2C, (4, 4, 4))  # one PE: 64 elements in and out
    core = plan._core
    with pytest.raises(UsageError, match="dtype complex128, expected complex64"):
        plan.exec(DeviceArray(64, np.complex128), direction=cufftmp.FORWARD)
    with pytest.raises(UsageError, match="63 elements; this PE's part needs 64"):
        plan.exec(DeviceArray(63, np.complex64), direction=cufftmp.FORWARD)
    with pytest.raises(UsageError, match="needs direction"):
        plan.exec(DeviceArray(64, np.complex64))
    with pytest.raises(UsageError, match="FORWARD"):
        plan.exec(DeviceArray(64, np.complex64), direction=2)
    with pytest.raises(TypeError, match="direction"):
        plan.exec(DeviceArray(64, np.complex64), direction="forward")
    with pytest.raises(UsageError, match="read-only"):
        plan.exec(DeviceArray(64, np.complex64, readonly=True), direction=cufftmp.FORWARD)
    with pytest.raises(UsageError, match="GPU memory"):
        plan.exec(np.zeros(64, np.complex64), direction=cufftmp.FORWARD)
    with pytest.raises(UsageError, match="output has dtype"):
        plan.exec(DeviceArray(64, np.complex64), DeviceArray(64, np.float32), cufftmp.FORWARD)
    with pytest.raises(UsageError, match="NULL"):
        plan.exec(0, direction=cufftmp.FORWARD)
    assert core.calls == []
    plan.exec(DeviceArray(64, np.complex64, ptr=0x1000), direction=cufftmp.INVERSE)
    plan.exec(DeviceArray(64, np.complex64, ptr=0x1000), DeviceArray(64, np.complex64, ptr=0x2000), -1)
    plan.exec(0x3000, 0x4000, cufftmp.FORWARD)  # raw pointers pass unchecked
    assert core.calls == [(0x1000, 0, 1), (0x1000, 0x2000, -1), (0x3000, 0x4000, -1)]


def test_real_plans_imply_their_direction() -> None:
    r2c = fake_plan(cufftmp.Type.R2C, (4, 4, 6))
    # In place: 4*4*8 padded reals in, 4*4*4 complex out (= 128 reals): 128 reals needed.
    with pytest.raises(UsageError, match="only transforms FORWARD"):
        r2c.exec(DeviceArray(128, np.float32), direction=cufftmp.INVERSE)
    with pytest.raises(UsageError, match="needs 128"):
        r2c.exec(DeviceArray(127, np.float32))
    with pytest.raises(UsageError, match="dtype complex64, expected float32"):
        r2c.exec(DeviceArray(128, np.complex64))
    r2c.exec(DeviceArray(128, np.float32, ptr=0x10))
    z2d = fake_plan(cufftmp.Type.Z2D, (4, 4, 6))
    with pytest.raises(UsageError, match="only transforms INVERSE"):
        z2d.exec(DeviceArray(64, np.complex128), direction=cufftmp.FORWARD)
    z2d.exec(DeviceArray(64, np.complex128, ptr=0x20))
    assert r2c._core.calls == [(0x10, 0, -1)] and z2d._core.calls == [(0x20, 0, 1)]


def test_facade_plan_after_close() -> None:
    plan = fake_plan(cufftmp.Type.C2C, (4, 4, 4))
    with plan:
        pass
    assert plan.closed
    plan.close()  # idempotent
    for call in (lambda: plan.exec(DeviceArray(64, np.complex64), direction=-1), lambda: plan.handle,
                 lambda: plan.local_shapes(-1), lambda: plan.fft_type, lambda: plan.malloc()):
        with pytest.raises(UsageError, match="closed"):
            call()
    assert plan._core.calls == []


# --- reshapes (cufftMpCreateReshape works without a GPU) ----------------------------------------

BOX = ([0, 0, 0], [4, 4, 4])
STRIDES = [16, 4, 1]


def test_reshape_lifecycle_and_use_after_close() -> None:
    r = cufftmp.Reshape()
    assert not r.closed and "not made" in repr(r)
    with pytest.raises(UsageError, match="not made"):
        _ = r.workspace_size
    with pytest.raises(UsageError, match="not made"):
        r.exec(0x10, 0x20)
    r.close()
    r.close()  # idempotent
    assert r.closed and "closed" in repr(r)
    for call in (lambda: r.workspace_size, lambda: r.exec(0x10, 0x20), lambda: r.make(None, 8, BOX, BOX),
                 lambda: r._core.handle, lambda: r._core.make(8, *BOX, STRIDES, *BOX, STRIDES, 1)):
        with pytest.raises(UsageError, match="closed"):
            call()
    with cufftmp.Reshape() as r2:
        assert not r2.closed
    assert r2.closed
    with cf.Reshape() as r3:
        assert r3.handle != 0 and not r3.made
    assert r3.closed
    with pytest.raises(UsageError, match="closed"):
        r3.destroy() or r3.handle  # destroy is close: idempotent, then the handle is gone


def test_unmade_reshape_dropped_is_released_locally() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = cf.Reshape()
        del r
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert _core.queued() == []


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, *BOX, STRIDES, *BOX, STRIDES, 1), "element_size"),
        ((8, [0, 0], [4, 4, 4], STRIDES, *BOX, STRIDES, 1), "upper_input has 3 elements; rank is 2"),
        ((8, *BOX, [4, 1], *BOX, STRIDES, 1), "strides_input"),
        ((8, *BOX, STRIDES, [0, 0, 0], [4, 4], STRIDES, 1), "upper_output"),
        ((8, [0, 3, 0], [4, 2, 4], STRIDES, *BOX, STRIDES, 1), "lower_input"),
        ((8, [], [], [], [], [], [], 1), "1 to 3 dimensions"),
        ((8, *BOX, STRIDES, *BOX, STRIDES, 0), "MPI_Comm"),  # MPI without an address
        ((8, *BOX, STRIDES, *BOX, STRIDES, 1, 0x1000), "NONE takes no communicator"),
        ((8, *BOX, STRIDES, *BOX, STRIDES, 5), "comm_type"),
    ],
)
def test_core_reshape_make_validates(args: tuple[Any, ...], match: str) -> None:
    with cf.Reshape() as r:
        with pytest.raises(UsageError, match=match):
            r.make(*args)
        assert not r.made


def test_facade_reshape_make_validates() -> None:
    with cufftmp.Reshape() as r:
        with pytest.raises(UsageError, match="unsupported dtype"):
            r.make(None, "complex32", BOX, BOX)
        with pytest.raises(UsageError, match=">= 1 byte"):
            r.make(None, 0, BOX, BOX)
        with pytest.raises(TypeError):
            r.make(None, True, BOX, BOX)
        with pytest.raises(UsageError, match="3 coordinates"):
            r.make(None, "int32", BOX, ([0, 0], [4, 4]))
        with pytest.raises(TypeError, match="comm must be"):
            r.make("world", "int32", BOX, BOX)


def test_reshape_make_without_a_gpu_raises_the_typed_error() -> None:
    _no_gpu()
    with cufftmp.Reshape() as r:
        with pytest.raises(CuFFTMpError) as info:
            r.make(None, np.complex64, BOX, BOX)
        assert info.value.function == "__cufftMpMakeReshape_11_4"
        assert type(info.value) is not CuFFTMpError
        assert not r._core.made  # a failed make leaves it unmade (a local release)
    assert r.closed and _core.queued() == []
