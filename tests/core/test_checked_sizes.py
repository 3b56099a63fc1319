"""The core's size and address arithmetic on values a caller controls: its checked_mul/checked_add at
the 64-bit edges, then each place they guard, checked without the libraries (mpbind._core._testing
runs each hot call's checks): symmetric-memory bounds, NCCL counts, cuFFTMp layouts and boxes,
cuBLASMp grids, and registrations. A view running past the end of a symmetric allocation is refused;
one ending exactly at its end passes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from mpbind import _core
from mpbind.errors import UsageError

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_objects import Exported, InterfaceArray  # noqa: E402

T = _core._testing
TOP = 2**64
HEAP = [(0x10000, 4096), (0x20000, 4096)]
HIGH = 2**63 + 0x1000  # a symmetric range in the upper half: ptr + nbytes wraps there first
HIGH_HEAP = [(HIGH, 4096), (HIGH + 0x10000, 4096)]
C2C = 0x29  # CUFFT_C2C


def nv(name: str, *args: Any, heap: list[tuple[int, int]] = HEAP, npes: int = 2) -> tuple[Any, ...]:
    return tuple(T.nvshmem_plan(name, args, npes, False, heap))


def view(ptr: int, n: int, typestr: str = "<f4") -> InterfaceArray:
    return InterfaceArray((n,), typestr, ptr=ptr)


LOCAL = view(0x5000, 1024)


# --- checked arithmetic at the 64-bit edges ---------------------------------------------------------------


I64_MAX, I64_MIN, U64_MAX = 2**63 - 1, -(2**63), 2**64 - 1

FITS = [
    ("add", I64_MAX, 0, False), ("add", I64_MAX - 1, 1, False), ("add", I64_MIN, 0, False),
    ("add", -1, I64_MIN + 1, False), ("mul", I64_MAX, 1, False), ("mul", I64_MIN, 1, False),
    ("mul", 2**62, -2, False), ("mul", 3037000499, 3037000499, False), ("mul", -1, I64_MAX, False),
    ("mul", 0, I64_MIN, False),
    ("add", U64_MAX, 0, True), ("add", 2**63, 2**63 - 1, True), ("mul", U64_MAX, 1, True),
    ("mul", 2**32 - 1, 2**32 + 1, True), ("mul", 2**63, 1, True), ("mul", 0, U64_MAX, True),
]
OVERFLOWS = [
    ("add", I64_MAX, 1, False), ("add", I64_MIN, -1, False), ("mul", 2**62, 2, False), ("mul", I64_MIN, -1, False),
    ("mul", 3037000500, 3037000500, False), ("mul", 2**32, 2**31, False),
    ("add", U64_MAX, 1, True), ("add", 2**63, 2**63, True), ("mul", 2**63, 2, True), ("mul", 2**32, 2**32, True),
    ("mul", U64_MAX, U64_MAX, True),
]


@pytest.mark.parametrize(("op", "a", "b", "unsigned"), FITS)
def test_checked_arithmetic_that_fits(op: str, a: int, b: int, unsigned: bool) -> None:
    assert T.checked(op, a, b, unsigned) == (a + b if op == "add" else a * b)


@pytest.mark.parametrize(("op", "a", "b", "unsigned"), OVERFLOWS)
def test_checked_arithmetic_that_overflows(op: str, a: int, b: int, unsigned: bool) -> None:
    bound = r"64 bits \(at most 2\*\*64 - 1\)" if unsigned else r"a signed 64-bit integer \(at most 2\*\*63 - 1\)"
    sign = r"\*" if op == "mul" else r"\+"
    with pytest.raises(OverflowError, match=rf"the (product|sum) overflows: {a} {sign} {b} does not fit in {bound}"):
        T.checked(op, a, b, unsigned)


def test_checked_arithmetic_operands() -> None:
    with pytest.raises(OverflowError):
        T.checked("add", 2**63, 0)  # not an int64
    with pytest.raises(OverflowError):
        T.checked("add", -1, 0, True)  # not a uint64
    with pytest.raises(TypeError):
        T.checked("add", 1.0, 0)


# --- symmetric views: inside the allocation, up to its exact end ---------------------------------------


@pytest.mark.parametrize("base", [HEAP[0][0], HIGH_HEAP[0][0]], ids=["low", "high"])
def test_views_ending_exactly_at_the_end_pass(base: int) -> None:
    heap = HEAP if base < 2**63 else HIGH_HEAP
    other = heap[1][0]
    assert nv("put", view(base, 1024), LOCAL, 1, heap=heap)[2:5] == (base, 0x5000, 4096)
    assert nv("put", view(base + 4092, 1), view(0x5000, 1), 1, heap=heap)[4] == 4
    assert nv("get", view(0x5000, 512), view(base + 2048, 512), 0, heap=heap)[3:5] == (base + 2048, 2048)
    assert nv("broadcast", view(base + 2048, 512), view(other + 2048, 512), 0, heap=heap)[4] == 2048
    assert nv("fcollect", view(base, 1024), view(other + 2048, 512), heap=heap)[4] == 2048
    # DLPack views (data + byte_offset) the same way.
    assert nv("put", Exported((512,), data=base, byte_offset=2048), Exported((512,), data=0x5000), 1,
              heap=heap)[2] == base + 2048


@pytest.mark.parametrize("base", [HEAP[0][0], HIGH_HEAP[0][0]], ids=["low", "high"])
def test_views_past_the_end_are_refused(base: int) -> None:
    heap = HEAP if base < 2**63 else HIGH_HEAP
    other = heap[1][0]
    refusals: list[tuple[str, tuple[Any, ...], str]] = [
        ("put", (view(base, 1025), view(0x5000, 1025), 1), "dest is not NVSHMEM symmetric memory"),
        ("put", (view(base + 4, 1024), LOCAL, 1), "dest is not NVSHMEM symmetric memory"),
        ("put", (view(base + 4093, 1, "|u1"), view(0x5000, 1, "|u1"), 1), None),  # the last byte: fine
        ("put", (view(base + 4094, 1, "<u2"), view(0x5000, 1, "<u2"), 1), None),
        ("put", (view(base + 4095, 1, "<u2"), view(0x5000, 1, "<u2"), 1), "dest is not NVSHMEM symmetric memory"),
        ("get", (view(0x5000, 513), view(base + 2048, 513), 0), "src is not NVSHMEM symmetric memory"),
        ("broadcast", (view(base + 2052, 512), view(other, 512), 0), "dest is not NVSHMEM symmetric memory"),
        ("fcollect", (view(base, 1024), view(other + 2052, 512)), "src is not NVSHMEM symmetric memory"),
        ("alltoall", (view(base, 1026), view(other, 1026)), "dest is not NVSHMEM symmetric memory"),
        ("reduce", ("sum", view(base, 1024), view(other + 4, 1024)), "src is not NVSHMEM symmetric memory"),
    ]
    for name, args, match in refusals:
        if match is None:
            nv(name, *args, heap=heap)
            continue
        with pytest.raises(UsageError, match=match):
            nv(name, *args, heap=heap)


def test_views_whose_end_wraps_are_refused() -> None:
    # From inside a high range, an extent reaching past 2**64 used to wrap ptr + nbytes to a small
    # address that looked inside the range; the intake refuses the span before the bounds check.
    for n in (2**61 - 1, (TOP - HIGH) // 4, (TOP - HIGH - 16) // 4 + 1):
        with pytest.raises(UsageError, match=r"dest: shape .* reaches outside \[0, 2\*\*64\)"):
            nv("put", view(HIGH + 16, n), LOCAL, 1, heap=HIGH_HEAP)
    with pytest.raises(UsageError, match="reaches outside"):
        nv("put", Exported((2**61 - 1,), data=HIGH + 16, strides=None), LOCAL, 1, heap=HIGH_HEAP)


def test_fcollect_element_counts_do_not_wrap() -> None:
    # 2**62 int8 elements of src (a valid description, in a range that large) times 4 PEs wrapped to 0,
    # the elements of an empty dest.
    heap = [(0x10000, 2**62), (2**62 + 2**40, 2**62)]
    with pytest.raises(OverflowError, match=r"fcollect: the elements of dest \(team size x src elements\) overflows"):
        nv("fcollect", view(heap[0][0], 0, "|i1"), view(heap[1][0], 2**62, "|i1"), heap=heap, npes=4)


def test_planning_needs_pes() -> None:
    with pytest.raises(UsageError, match="npes must be >= 1"):
        nv("alltoall", view(HEAP[0][0], 4), view(HEAP[1][0], 4), npes=0)


# --- NCCL counts ----------------------------------------------------------------------------------------------


def test_nccl_counts_times_ranks_do_not_wrap() -> None:
    # 2**61 elements on each side: 2**61 x 8 ranks is 2**64, which wrapped to 0 == 0.
    send = InterfaceArray((2**61,), "|i1", ptr=0x1000)
    recv = InterfaceArray((2**61,), "|i1", ptr=2**62)
    with pytest.raises(OverflowError, match="sendbuf's elements x ranks overflows"):
        T.nccl_plan("all_gather", 0, 8, 0, send, recv)
    with pytest.raises(OverflowError, match="recvbuf's elements x ranks overflows"):
        T.nccl_plan("reduce_scatter", 0, 8, 0, send, recv)
    four, eight = InterfaceArray((4,), ptr=0x1000), InterfaceArray((8,), ptr=0x2000)
    assert T.nccl_plan("all_gather", 0, 2, 0, four, eight)[2] == 4


# --- cuFFTMp layouts ----------------------------------------------------------------------------------------------


def test_cufftmp_layout_sizes_are_checked() -> None:
    x = InterfaceArray((16,), "<c8", ptr=0x1000)
    assert T.cufftmp_exec(C2C, x, None, -1, {-1: ((4, 4), (4, 4))})[0] == 0x1000
    with pytest.raises(OverflowError, match="layout: the elements of a shape overflows"):
        T.cufftmp_exec(C2C, x, None, -1, {-1: ((2**40, 2**40), (4, 4))})
    with pytest.raises(UsageError, match="layout: negative extent -4 in a shape"):
        T.cufftmp_exec(C2C, x, None, -1, {-1: ((-4, -4), (4, 4))})  # -4 x -4 would pass as 16
    with pytest.raises(TypeError, match="layout: a shape's extents must be ints"):
        T.cufftmp_exec(C2C, x, None, -1, {-1: (("4", 4), (4, 4))})
    with pytest.raises(OverflowError, match="layout: the output's bytes overflows"):
        T.cufftmp_exec(0x2A, InterfaceArray((16,), "<f4", ptr=0x1000), None, -1, {-1: ((16,), (2**61,))})  # R2C
    with pytest.raises(UsageError, match="this PE's part needs 17"):
        T.cufftmp_exec(C2C, x, InterfaceArray((17,), "<c8", ptr=0x9000), -1, {-1: ((17,), (17,))})


# --- cuBLASMp grids ------------------------------------------------------------------------------------------------


def test_cublasmp_local_shape_refuses_what_would_divide_by_zero() -> None:
    assert T.cublasmp_local_shape(8, 8, 2, 2, 0, 0, 2, 2, 0, 3) == (4, 4)
    for args in [(8, 8, 2, 2, 0, 0, 0, 2, 0, 0), (8, 8, 0, 2, 0, 0, 2, 2, 0, 0), (8, 8, 2, 2, 0, 0, 2, 2, 0, 4),
                 (8, 8, 2, 2, 2, 0, 2, 2, 0, 0), (-8, 8, 2, 2, 0, 0, 2, 2, 0, 0), (8, 8, 2, 2, 0, 0, 2, 2, 0, -1)]:
        with pytest.raises(UsageError, match="local_shape: needs"):
            T.cublasmp_local_shape(*args)


# --- registrations ------------------------------------------------------------------------------------------------


def test_registrations_whose_range_wraps_are_refused() -> None:
    with T.Owner() as owner:
        with pytest.raises(UsageError, match="cannot register 32 bytes at 18446744073709551600: the range passes"):
            owner.register(TOP - 16, 32)
        owner.register(TOP - 17, 16).close()  # ends below 2**64 - 1
