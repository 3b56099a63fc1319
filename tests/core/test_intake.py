"""The core's intake rules for foreign arrays and streams (src/mpbind/_core/arrays.cpp, stated in
docs/DESIGN.md, The hot path), one test per rule per path that reaches it without a GPU: DLPack
capsules (versioned and legacy), DLPack's C exchange API, ``__cuda_array_interface__``, the
CuPy-like attribute path and ``(ptr, count, dtype)`` tuples. Every object here lies about itself;
none is dereferenced."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpbind import _core
from mpbind.errors import UsageError

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_objects import STREAMS, ExchangeTensor, Exported, InterfaceArray  # noqa: E402

MAX_NDIM = 64  # arrays.hpp: kMaxNdim
TOP = 2**64  # addresses are below it


def describe(obj: Any, **kwargs: Any) -> tuple[Any, ...]:
    return tuple(_core.array_info(obj, "x", **kwargs))


# The DLPack-backed paths share from_dltensor, but each is its own way in: versioned capsules,
# legacy capsules, the C exchange API.
def versioned(shape: Any, **kw: Any) -> Any:
    return Exported(shape, **kw)


def legacy(shape: Any, **kw: Any) -> Any:
    return Exported(shape, legacy=True, **kw)


def exchange(shape: Any, **kw: Any) -> Any:
    return ExchangeTensor(shape, **kw)


DLPACK_PATHS = [versioned, legacy, exchange]


# --- ndim: bounded before anything is read or allocated ---------------------------------------------


@pytest.mark.parametrize("make", DLPACK_PATHS)
@pytest.mark.parametrize("ndim", [MAX_NDIM + 1, 2**31 - 1, 1000, -1, -(2**31)])
def test_dlpack_ndim_out_of_bounds(make: Any, ndim: int) -> None:
    # The tensor's shape array holds 2 extents; the claim is refused before any is read.
    with pytest.raises(UsageError, match=rf"x: DLPack tensor with ndim {ndim} \(mpbind takes 0 to 64"):
        describe(make((2, 3), ndim=ndim))


@pytest.mark.parametrize("make", DLPACK_PATHS)
def test_dlpack_null_shape(make: Any) -> None:
    with pytest.raises(UsageError, match="x: DLPack tensor of ndim 2 with a NULL shape"):
        describe(make((2, 3), null_shape=True))
    assert describe(make((), null_shape=True))[1] == ()  # a 0-d tensor needs no shape


@pytest.mark.parametrize("make", DLPACK_PATHS)
def test_dlpack_ndim_at_the_limit(make: Any) -> None:
    assert describe(make((1,) * MAX_NDIM))[1] == (1,) * MAX_NDIM


def test_interface_ndim_out_of_bounds() -> None:
    with pytest.raises(UsageError, match="x: its shape has 65 entries; mpbind takes arrays of at most 64"):
        describe(InterfaceArray((1,) * (MAX_NDIM + 1)))
    assert describe(InterfaceArray((1,) * MAX_NDIM))[1] == (1,) * MAX_NDIM
    with pytest.raises(UsageError, match="x: its strides has 65 entries"):
        describe(InterfaceArray((1,), strides=(4,) * (MAX_NDIM + 1)))


class Endless:
    """A sequence that says it has one item and never ends."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        return 1


class Counting(Endless):
    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int) -> int:
        if i >= self.n:
            raise IndexError(i)
        return 2


def test_interface_shape_sequences_are_read_bounded() -> None:
    with pytest.raises(UsageError, match="x: its shape has more than 64 entries"):
        describe(InterfaceArray(Endless()))  # type: ignore[arg-type]
    assert describe(InterfaceArray(Counting(3)))[1] == (2, 2, 2)  # type: ignore[arg-type]
    assert describe(InterfaceArray([4, 3]))[1] == (4, 3)  # type: ignore[arg-type]
    for bad in (4, "44", b"4", {4: 4}, None):
        with pytest.raises(TypeError, match="x: its shape must be a sequence of ints"):
            describe(InterfaceArray(bad))  # type: ignore[arg-type]


def test_cupy_like_ndim_out_of_bounds() -> None:
    with pytest.raises(UsageError, match="at most 64"):
        describe(CupyLike((1,) * 65, (4,) * 65), source="cupy")


# --- extents: >= 0, ints within 64 bits -------------------------------------------------------------


@pytest.mark.parametrize("make", DLPACK_PATHS)
def test_dlpack_negative_extents(make: Any) -> None:
    with pytest.raises(UsageError, match=r"x: negative extent -3 in its shape \(2, -3\)"):
        describe(make((2, -3), strides=(1, 1)))
    with pytest.raises(UsageError, match="negative extent"):
        describe(make((-(2**63),), strides=(1,)))
    with pytest.raises(UsageError, match="negative extent"):  # also with strides left NULL
        describe(make((4, -1), strides=None))


def test_other_paths_negative_extents() -> None:
    with pytest.raises(UsageError, match="x: negative extent -1 in its shape"):
        describe(InterfaceArray((4, -1)))
    with pytest.raises(UsageError, match="x: negative extent -2 in its shape"):
        describe(CupyLike((-2,), (4,)), source="cupy")
    with pytest.raises(UsageError, match="x: count must be >= 0"):
        describe((0x1000, -2, "float32"), tuples=True)


def test_extents_are_ints_within_64_bits() -> None:
    with pytest.raises(OverflowError, match="x: shape value 18446744073709551616 does not fit in 64 bits"):
        describe(InterfaceArray((2**64,)))
    with pytest.raises(OverflowError, match="x: count value"):
        describe((0x1000, 2**64, "float32"), tuples=True)
    with pytest.raises(OverflowError, match="x: strides value"):
        describe(InterfaceArray((2,), strides=(-(2**63) - 4,)))
    with pytest.raises(TypeError, match="x: shape must be an int, not float"):
        describe(InterfaceArray((2.0,)))  # type: ignore[arg-type]

    class RaisingIndex:
        def __index__(self) -> int:
            raise RuntimeError("no")

    with pytest.raises(TypeError, match="x: shape must be an int, not RaisingIndex"):
        describe(InterfaceArray((RaisingIndex(),)))  # type: ignore[arg-type]
    assert describe(InterfaceArray((np.int64(3), np.uint8(2))))[1] == (3, 2)  # type: ignore[arg-type]


# --- element count and byte size: within 2**63 - 1 --------------------------------------------------


@pytest.mark.parametrize("make", DLPACK_PATHS)
def test_dlpack_sizes_overflowing(make: Any) -> None:
    for shape in [(2**32, 2**32), (2**62, 2), (2**61,), (3, 2**62)]:  # float32: 2**61 elements are 2**63 bytes
        with pytest.raises(OverflowError, match=r"x: shape .* of float32 holds more than 2\*\*63 - 1 bytes"):
            describe(make(shape, strides=None, data=0x1000))
    # Just below: a valid description (taken on trust: nothing is dereferenced here).
    assert describe(make((2**61 - 1,), code=0, bits=8, strides=None, data=0x1000))[1] == (2**61 - 1,)


def test_other_paths_sizes_overflowing() -> None:
    with pytest.raises(OverflowError, match="x: shape .* holds more than 2"):
        describe(InterfaceArray((2**40, 2**40)))
    with pytest.raises(OverflowError, match=r"x: shape \(4611686018427387904,\) of float32 holds more than"):
        describe((0x1000, 2**62, "float32"), tuples=True)
    with pytest.raises(OverflowError, match="x: count value"):
        describe((0x1000, 2**63, "int8"), tuples=True)
    with pytest.raises(OverflowError, match="holds more than"):
        describe(CupyLike((2**40, 2**40), (4 * 2**40, 4)), source="cupy")


def test_empty_arrays_with_huge_extents() -> None:
    # A zero extent makes the array empty, but the other extents still bound its C strides.
    assert describe(InterfaceArray((0, 2**40)))[1] == (0, 2**40)
    with pytest.raises(OverflowError):
        describe(InterfaceArray((0, 2**40, 2**40)))


# --- strides and pointers: the span addressed lies in [0, 2**64) ----------------------------------


@pytest.mark.parametrize("make", DLPACK_PATHS)
def test_dlpack_strides_out_of_range(make: Any) -> None:
    span = r"x: shape .* with strides .* elements of float32 from address 0x[0-9a-f]+ reaches outside \[0, 2\*\*64\)"
    for strides in [(2**62,), (-(2**62),), (2**61,), (2**63 - 1,), (-(2**63),)]:
        with pytest.raises(UsageError, match=span):
            describe(make((4,), strides=strides, data=0x1000))
    with pytest.raises(UsageError, match=span):  # a negative stride reaching below address 0
        describe(make((4,), strides=(-1,), data=0x8))
    d = describe(make((4,), strides=(-1,), data=0x10))  # the lowest element at 0x4: fine
    assert d[2] == (-1,) and not d[6]


@pytest.mark.parametrize("make", DLPACK_PATHS)
def test_dlpack_byte_offset_wrapping(make: Any) -> None:
    with pytest.raises(UsageError, match=r"x: DLPack data 0xfffffffffffffff0 \+ byte_offset 32 is past 2\*\*64"):
        describe(make((2,), data=TOP - 16, byte_offset=32))
    with pytest.raises(UsageError, match="reaches outside"):  # the offset fits, the elements do not
        describe(make((8,), data=TOP - 64, byte_offset=48))
    assert describe(make((2,), data=0x1000, byte_offset=2**40))[0] == 0x1000 + 2**40


def test_other_paths_spans() -> None:
    with pytest.raises(UsageError, match="reaches outside"):
        describe(InterfaceArray((4,), ptr=TOP - 8))
    with pytest.raises(UsageError, match="reaches outside"):
        describe(InterfaceArray((4, 4), strides=(2**62, 4)))
    with pytest.raises(UsageError, match="reaches outside"):
        describe((TOP - 4, 2, "float32"), tuples=True)
    with pytest.raises(UsageError, match="reaches outside"):
        describe(CupyLike((4,), (-4,), ptr=0x4), source="cupy")
    # The last byte just below 2**64 - 1: the end (one past it) still fits in 64 bits.
    assert describe((TOP - 9, 2, "float32"), tuples=True)[0] == TOP - 9
    # Empty arrays address nothing: any pointer and strides.
    assert describe(InterfaceArray((0, 4), strides=(2**62, 4), ptr=TOP - 1))[1] == (0, 4)
    assert describe(Exported((0,), strides=(2**62,), data=TOP - 1))[1] == (0,)


# --- devices ---------------------------------------------------------------------------------------


def test_device_ordinals() -> None:
    for make in DLPACK_PATHS:
        with pytest.raises(UsageError, match="x: device -5 is not a CUDA device ordinal"):
            describe(make((2,), device=(2, -5)))
    cupy_like = CupyLike((2,), (4,))
    cupy_like.data.device_id = -3
    with pytest.raises(UsageError, match="x: device -3 is not a CUDA device ordinal"):
        describe(cupy_like, source="cupy")


@pytest.mark.parametrize("make", DLPACK_PATHS)
def test_dlpack_device_types(make: Any) -> None:
    # CUDA (2) and CUDA managed (13) memory is a device's; CPU (1) and CUDA-pinned host (3) memory the host's;
    # a CUDA device id below 0 would read as the host, and another kind of device is neither
    assert describe(make((2,), device=(13, 1)))[4] == 1
    assert describe(make((2,), device=(3, 0)))[4] == -1
    with pytest.raises(UsageError, match="x: device -1 is not a CUDA device ordinal"):
        describe(make((2,), device=(2, -1)))
    for kind in (4, 10, 14, 0):
        with pytest.raises(UsageError, match=f"x: DLPack device type {kind} is neither CUDA"):
            describe(make((2,), device=(kind, 0)))


def test_null_data_with_elements() -> None:
    # Every path: an array with elements at address 0 is refused; an empty one may sit there.
    for obj in (Exported((2,), data=0), Exported((2,), data=0, legacy=True), ExchangeTensor((2,), data=0),
                InterfaceArray((2, 3), ptr=0)):
        with pytest.raises(UsageError, match="x: NULL data pointer for"):
            describe(obj)
    with pytest.raises(UsageError, match="x: NULL data pointer for 4 elements"):
        describe((0, 4, "float32"), tuples=True)
    assert describe(InterfaceArray((0, 3), ptr=0))[1] == (0, 3)
    assert describe((0, 0, "float32"), tuples=True)[1] == (0,)


def test_bools_are_not_extents_or_counts() -> None:
    with pytest.raises(TypeError, match="x: shape must be an int, not bool"):
        describe(InterfaceArray((True, 2)))
    with pytest.raises(TypeError, match="x: strides must be an int, not bool"):
        describe(InterfaceArray((2,), strides=(True,)))
    with pytest.raises(TypeError, match="x: count must be an int, not bool"):
        describe((0x1000, True, "float32"), tuples=True)


def test_masked_interface_arrays() -> None:
    masked = InterfaceArray((2,))
    masked.__cuda_array_interface__["mask"] = InterfaceArray((2,), typestr="|b1")
    with pytest.raises(UsageError, match="x: __cuda_array_interface__ with a mask"):
        describe(masked)
    unmasked = InterfaceArray((2,))
    unmasked.__cuda_array_interface__["mask"] = None
    assert describe(unmasked)[1] == (2,)


def test_exported_views_are_device_memory() -> None:
    with pytest.raises(UsageError, match="dlpack_view: device -1 is not a CUDA device ordinal"):
        _core.dlpack_view(0x1000, [2], 2, 32, -1, object())


def test_array_info_source_is_a_name() -> None:
    with pytest.raises(TypeError, match="source must be a str or None, not int"):
        _core.array_info(InterfaceArray((2,)), "x", 1)


# --- element types and the rest of a lying object ----------------------------------------------------


@pytest.mark.parametrize("make", DLPACK_PATHS)
@pytest.mark.parametrize(("code", "bits", "lanes"), [(0, 0, 0), (255, 255, 65535), (2, 32, 0), (0, 7, 1)])
def test_dlpack_odd_dtypes(make: Any, code: int, bits: int, lanes: int) -> None:
    if make is exchange and lanes != 1:
        pytest.skip("ExchangeTensor fixes lanes at 1")
    kw: dict[str, Any] = {"code": code, "bits": bits} | ({} if make is exchange else {"lanes": lanes})
    with pytest.raises(UsageError, match="x: unsupported DLPack dtype"):
        describe(make((2,), **kw))


def test_exchange_api_that_fills_nothing() -> None:
    with pytest.raises(UsageError, match=r"x: unsupported DLPack dtype \(code=0, bits=0, lanes=0\)"):
        describe(ExchangeTensor((2,), fill_nothing=True))


def test_lying_interface_dicts() -> None:
    class Lying:
        def __init__(self, cai: Any) -> None:
            self.__cuda_array_interface__ = cai

    good = {"shape": (2,), "typestr": "<f4", "data": (0x1000, False), "version": 3}
    assert describe(Lying(good))[1] == (2,)
    cases: list[tuple[Any, type[Exception], str]] = [
        ([("shape", (2,))], TypeError, "__cuda_array_interface__ must be a dict"),
        (good | {"typestr": 4}, TypeError, "needs 'shape', 'typestr' and 'data'"),
        ({"shape": (2,), "typestr": "<f4"}, TypeError, "needs 'shape', 'typestr' and 'data'"),
        (good | {"typestr": "<fx"}, UsageError, "unsupported __cuda_array_interface__ typestr"),
        (good | {"typestr": "<f/4"}, UsageError, "unsupported __cuda_array_interface__ typestr"),
        (good | {"data": 0x1000}, TypeError, r"\['data'\] must be \(ptr, readonly\)"),
        (good | {"data": (0x1000,)}, TypeError, r"\['data'\] must be \(ptr, readonly\)"),
        (good | {"data": (-1, False)}, UsageError, r"\['data'\]\[0\] must be an address"),
        (good | {"data": (TOP, False)}, UsageError, r"\['data'\]\[0\] must be an address"),
        (good | {"data": ("0x1000", False)}, UsageError, r"\['data'\]\[0\] must be an address"),
        (good | {"data": (0x1000, Unreadable())}, UsageError, r"\['data'\]\[1\] \(read-only\) is not a truth value"),
        (good | {"strides": (4, 4)}, UsageError, "1 extents but 2 strides"),
        (good | {"strides": (3,)}, UsageError, "not multiples of its itemsize"),
        (good | {"strides": 4}, TypeError, "its strides must be a sequence"),
    ]
    for cai, cls, message in cases:
        with pytest.raises(cls, match=message):
            describe(Lying(cai))


class Unreadable:
    def __bool__(self) -> bool:
        raise RuntimeError("no truth here")


# --- dtype objects that cannot say their name -----------------------------------------------------------


class NameRaises:
    @property
    def name(self) -> str:
        raise RuntimeError("no name")


class StrRaises:
    def __str__(self) -> str:
        raise ValueError("no str")


class NameNotText(StrRaises):
    name = 42


class Interrupting:
    @property
    def name(self) -> str:
        raise KeyboardInterrupt


def test_hostile_dtype_objects() -> None:
    for spec, raised in [(NameRaises(), "RuntimeError: no name"), (StrRaises(), "ValueError: no str"),
                         (NameNotText(), "ValueError: no str")]:
        with pytest.raises(UsageError, match=f"unsupported dtype: a {type(spec).__name__} that cannot give its "
                                             f"name \\({raised}"):
            _core.dtype_info(spec)
        with pytest.raises(UsageError, match="unsupported dtype"):
            describe((0x1000, 2, spec), tuples=True)
    with pytest.raises(UsageError, match="unsupported dtype"):
        _core.dtype_info("float\udc80")  # not encodable: no name of ours
    with pytest.raises(KeyboardInterrupt):
        _core.dtype_info(Interrupting())


# --- streams ------------------------------------------------------------------------------------------


class Stop(BaseException):
    """Like KeyboardInterrupt: not an Exception, so it passes through."""


def protocol_stream(result: Any = None, raises: BaseException | None = None) -> Any:
    class Stream:
        def __cuda_stream__(self) -> Any:
            if raises is not None:
                raise raises
            return result

    return Stream()


def test_stream_protocols_that_raise() -> None:
    with pytest.raises(UsageError, match=r"stream: __cuda_stream__\(\) of Stream raised RuntimeError: broken"):
        _core.stream_handle(protocol_stream(raises=RuntimeError("broken")))
    with pytest.raises(UsageError, match=r"stream: __cuda_stream__\(\) of Stream raised AttributeError"):
        _core.stream_handle(protocol_stream(raises=AttributeError("gone")))
    with pytest.raises(Stop):
        _core.stream_handle(protocol_stream(raises=Stop()))

    class BadProperty:
        @property
        def cuda_stream(self) -> int:
            raise ValueError("closed")

    with pytest.raises(UsageError, match=r"stream: \.cuda_stream of BadProperty raised ValueError: closed"):
        _core.stream_handle(BadProperty())

    class BadProtocolProperty:
        @property
        def __cuda_stream__(self) -> Any:
            raise LookupError("not now")

    with pytest.raises(UsageError, match="stream: __cuda_stream__ of BadProtocolProperty raised LookupError"):
        _core.stream_handle(BadProtocolProperty())

    class BadGetattr:  # an instance attribute lookup that raises (no attribute on the type)
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(f"no {name}")

    with pytest.raises(UsageError, match="stream: __cuda_stream__ of BadGetattr raised RuntimeError"):
        _core.stream_handle(BadGetattr())

    class HostileMessage(Exception):
        def __str__(self) -> str:
            raise RuntimeError("and its message raises too")

    with pytest.raises(UsageError, match=r"stream: __cuda_stream__\(\) of Stream raised HostileMessage"):
        _core.stream_handle(protocol_stream(raises=HostileMessage()))


def test_stream_protocols_that_lie() -> None:
    assert _core.stream_handle(protocol_stream((0, STREAMS[0]))) == STREAMS[0]
    for result in [None, [0, 5], (0,), (0, 5, 6), 7]:
        with pytest.raises(TypeError, match=r"stream: __cuda_stream__\(\) of Stream must return a \(version, handle\)"):
            _core.stream_handle(protocol_stream(result))
    for version in [1, -1, True, "0", 2**70, None]:
        with pytest.raises(UsageError, match=r"stream: __cuda_stream__\(\) of Stream gives protocol version .*; "
                                             "mpbind reads version 0"):
            _core.stream_handle(protocol_stream((version, 5)))
    for handle in ["5", 5.0, True, None]:
        with pytest.raises(TypeError, match=r"stream: __cuda_stream__\(\)\[1\] must be an int"):
            _core.stream_handle(protocol_stream((0, handle)))
    for handle in [-1, TOP]:
        with pytest.raises(UsageError, match=r"stream: __cuda_stream__\(\)\[1\] must be a cudaStream_t"):
            _core.stream_handle(protocol_stream((0, handle)))


# A handle other than 0, 1, 2 must point at readable, pointer-aligned memory: the driver dereferences
# it without a check (a made-up int is a segfault), and cannot be asked whether it is a stream.
MADE_UP_STREAMS = [3, 4, 0x1234, 2**31, 2**40, 2**63 - 1, 2**63, 2**64 - 1]


def stream_paths(handle: int) -> list[Any]:
    class TorchLike:
        cuda_stream = handle

    class CupyLike:
        ptr = handle

    return [handle, protocol_stream((0, handle)), TorchLike(), CupyLike()]


@pytest.mark.parametrize("handle", MADE_UP_STREAMS)
def test_made_up_stream_handles_are_refused_on_every_path(handle: int) -> None:
    for stream in stream_paths(handle):
        with pytest.raises(UsageError, match=rf"stream: .* is {handle:#x}, which is no CUDA stream"):
            _core.stream_handle(stream)


def test_special_and_readable_stream_handles_pass() -> None:
    for handle in (0, 1, 2, *STREAMS):
        for stream in stream_paths(handle):
            assert _core.stream_handle(stream) == handle
    for _ in range(3):  # again, from the checked-handle cache
        assert _core.stream_handle(STREAMS[1]) == STREAMS[1]
    with pytest.raises(UsageError, match="which is no CUDA stream: no readable, pointer-aligned memory"):
        _core.stream_handle(STREAMS[0] + 1)  # readable but misaligned


def test_a_refused_stream_handle_is_refused_again() -> None:
    # Only handles that passed are cached: a refusal is never remembered as a pass.
    for _ in range(3):
        with pytest.raises(UsageError, match="no CUDA stream"):
            _core.stream_handle(2**31)


# --- helpers shared by the attribute-path tests ------------------------------------------------------------


class CupyLike:
    """What the core reads of a CuPy array: data.ptr, data.device_id, shape, strides (bytes), dtype."""

    class MemoryPointer:
        def __init__(self, ptr: int, device_id: int) -> None:
            self.ptr, self.device_id = ptr, device_id

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], ptr: int = 0x2000) -> None:
        self.shape, self.strides, self.dtype = shape, strides, np.dtype(np.float32)
        self.data = self.MemoryPointer(ptr, 1)


# --- what the core exports (SymmetricArray.__dlpack__ and the like, through dlpack_view) -----------------


def test_exported_views_follow_the_same_rules() -> None:
    owner = object()
    assert _core.dlpack_view(0x1000, [2, 3], 2, 32, 0, owner) is not None
    assert _core.dlpack_view(TOP - 1, [0, 2**40], 2, 32, 0, owner) is not None  # empty: addresses nothing
    with pytest.raises(OverflowError, match="dlpack_view: extent 9223372036854775808 does not fit"):
        _core.dlpack_view(0x1000, [2**63], 1, 8, 0, owner)
    with pytest.raises(OverflowError, match="dlpack_view: shape .* holds more than 2"):
        _core.dlpack_view(0x1000, [2**62, 4], 1, 8, 0, owner)
    with pytest.raises(UsageError, match="dlpack_view: 65 dimensions"):
        _core.dlpack_view(0x1000, [1] * 65, 2, 32, 0, owner)
    with pytest.raises(UsageError, match="dlpack_view: shape .* reaches outside"):
        _core.dlpack_view(TOP - 8, [4], 2, 32, 0, owner)
    with pytest.raises(UsageError, match="dlpack_view: unsupported DLPack dtype"):
        _core.dlpack_view(0x1000, [4], 2, 7, 0, owner)
    with pytest.raises(UsageError, match="dlpack_view: device -4"):
        _core.dlpack_view(0x1000, [4], 2, 32, -4, owner)
