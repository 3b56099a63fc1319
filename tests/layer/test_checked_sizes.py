"""Sizes, counts and addresses each planner and call computes from a caller's values are refused,
naming the quantity, where the C type they are handed to would wrap them (at the 2**31, 2**63 and
2**64 edges); values that are not what they claim (an __index__ that fails, a count that never
ends) are refused at once, before anything is allocated or waited for."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpbind import collective as collective_matmul
from mpbind import cublasmp, cufftmp, fft, nccl
from mpbind import distributions as dist
from mpbind import kernels as nk
from mpbind import nvshmem as nv
from mpbind._infra.interop import device_span
from mpbind.errors import UsageError
from mpbind.fft import _planner as _fft_plan
from mpbind.matmul import _planner as _matmul_plan

sys.path.insert(0, str(Path(__file__).parent))
from fake_groups import Scripted, sent  # noqa: E402

I64 = 2**63 - 1
U64 = 2**64 - 1


class IndexRaises:
    def __index__(self) -> int:
        raise ZeroDivisionError("no")


def _quick(call: Any, error: type[Exception], message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(error, match=message):
        call()
    assert time.perf_counter() - start < 0.5  # refused before anything is built, allocated or waited for


# --- planners -------------------------------------------------------------------------------------


def test_planners_refuse_a_mistyped_count_at_once() -> None:
    _quick(lambda: _fft_plan.plan_fft((8, 8), "complex64", 2**40), UsageError,
           r"nranks must be an int in \[1, 1048576\]")
    a = dist.Replicated((2, 2), 1)
    _quick(lambda: _matmul_plan.plan(a=a, b=a, d=a, a_dtype="float32", scales=range(10**12)), UsageError,
           "scales has more than 8 entries")
    with pytest.raises(TypeError, match="a must be a distribution"):
        _matmul_plan.plan(a=None, b=a, d=a, a_dtype="float32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a_dtype must be a dtype name"):
        _matmul_plan.plan(a=a, b=a, d=a, a_dtype=None)  # type: ignore[arg-type]


def test_fft_buffer_beyond_an_int64_is_refused_before_anything_is_made() -> None:
    n = 2**31 - 1  # the largest extent cuFFTMp takes; three of them are 2**93 elements
    with pytest.raises(UsageError, match="element count"):
        _fft_plan.plan_fft((n, n, n), "complex64", 2)
    # Elements that fit, bytes that do not: 2**60 complex128 elements are 2**64 bytes.
    with pytest.raises(UsageError, match=r"in-place buffer \(bytes\) is 18446744073709551616"):
        _fft_plan.plan_fft((2**30, 2**27, 8), "complex128", 1)


def test_reshape_of_more_bytes_than_an_int64_holds_is_refused() -> None:
    a, b = dist.Split((2**31, 2**31), 2, 0), dist.Split((2**31, 2**31), 2, 1)  # 2**62 elements
    with pytest.raises(UsageError, match="byte size is 36893488147419103232"):
        _fft_plan.plan_reshape(a, b, "float64")
    with pytest.raises(UsageError, match="element size must be >= 1 byte"):
        _fft_plan.plan_reshape(a, b, "float64", itemsize=0)
    with pytest.raises(TypeError, match="element size must be an int"):
        _fft_plan.plan_reshape(a, b, "float64", itemsize=8.0)


def test_matmul_plan_staging_and_aux_bytes_are_checked() -> None:
    # AllGather+GEMM stages all of B: 2**31 x 2**31 float32 is 2**64 bytes (each piece fits).
    with pytest.raises(UsageError, match=r"the gathered B \(bytes\) is 18446744073709551616"):
        _matmul_plan.plan(a=dist.by_rows((2, 2**31), 2), b=dist.by_columns((2**31, 2**31), 2),
                          d=dist.by_rows((2, 2**31), 2), a_dtype="float32")
    p = _matmul_plan.plan(a=dist.Replicated((2**40, 2**22), 2), b=dist.Replicated((2**22, 8), 2),
                          d=dist.by_rows((2**40, 8), 2), a_dtype="float32", epilogue="gelu_aux")
    assert p.aux_layout(0)[2] == 2**39 * 8 * 4
    big = _matmul_plan.plan(a=dist.Replicated((2**60, 2), 1), b=dist.Replicated((2, 4), 1),
                            d=dist.Replicated((2**60, 4), 1), a_dtype="float64", epilogue="gelu_aux")
    with pytest.raises(UsageError, match="the aux matrix's bytes"):
        big.aux_layout(0)


def test_block_scale_counts_are_exact_integers() -> None:
    k = 2**60 + 32  # k / 32 as a float loses the last block
    assert _matmul_plan.block_scale_elements(128, k, "mxfp8") == 128 * (-(-(k // 32) // 4) * 4)
    assert _matmul_plan.block_scale_elements(128, k, "mxfp8") != 128 * (math.ceil(math.ceil(k / 32) / 4) * 4)


@pytest.mark.parametrize(("value", "scale", "ok"), [
    (65504.0, "float16", True), (65505.0, "float16", False), (float("inf"), "float16", True),
    (float("nan"), "float16", True), (3.5e38, "float32", False), (1e300, "float64", True),
])
def test_matmul_plan_scalars_fit_their_scale_type(value: float, scale: str, ok: bool) -> None:
    dtype = "float16" if scale == "float16" else "float32" if scale == "float32" else "float64"
    compute = cublasmp.CublasComputeType.COMPUTE_16F if scale == "float16" else None
    a = dist.Replicated((16, 16), 1)

    def plan() -> Any:
        return _matmul_plan.plan(a=a, b=a, d=a, a_dtype=dtype, alpha=value, compute_type=compute)

    if ok:
        plan()
    else:
        with pytest.raises(UsageError, match=f"alpha = .* is beyond the {scale} scalars"):
            plan()


@pytest.mark.parametrize(("value", "compute", "message"), [
    (2**31, "COMPUTE_32I", "an integer compute type takes an int32 scalar"),
    (1.5, "COMPUTE_32I", "int32 scalar"),  # no silent truncation to 1
    (float("nan"), "COMPUTE_32I", "int32 scalar"),
    (70000.0, "COMPUTE_16F", "beyond the float16 scalar"),
    (1e39, "COMPUTE_32F", "beyond the float32 scalar"),
    pytest.param(10**400, "COMPUTE_64F", "not a number a matmul scalar can hold", id="int-beyond-float"),
])
def test_cublasmp_scalars_are_refused_where_their_type_cannot_hold_them(value: Any, compute: str, message: str) -> None:
    ct = int(cublasmp.CublasComputeType[compute])
    with pytest.raises(UsageError, match=message) as info:
        cublasmp.scalar_bytes(value, ct, False, "alpha")
    assert "alpha" in str(info.value)
    assert cublasmp.scalar_bytes(-(2**31), int(cublasmp.CublasComputeType.COMPUTE_32I), False) == (-(2**31)).to_bytes(
        4, "little", signed=True)


# --- calls ----------------------------------------------------------------------------------------


def test_symmetric_allocation_bytes_beyond_an_int64_are_refused_before_the_runtime() -> None:
    with pytest.raises(UsageError, match="byte size is 9223372036854775808"):
        nv.empty((2**61,), "float32")  # 2**63 bytes: before "not initialised"
    with pytest.raises(UsageError, match="byte size"):
        nv.zeros((2**32, 2**32), "uint8")
    with pytest.raises(UsageError, match="not initialised"):
        nv.empty((2**60,), "float32")  # 2**62 bytes: a size (the runtime refuses it next)
    with pytest.raises(UsageError, match="alignment"):
        nv.empty(4, alignment=2**64)
    with pytest.raises(UsageError, match="not initialised"):
        nv.empty(4, alignment=np.int64(256))


@pytest.mark.parametrize(("buffer", "error", "message"), [
    ((U64 - 3, 8), UsageError, "runs past the end of the address space"),
    ((-8, 8), UsageError, "negative"),
    ((8, 2**64 + 1), UsageError, "more than a size_t"),
    ((True, 8), TypeError, r"\(ptr: int, nbytes: int\)"),
])
def test_buffers_given_as_ranges_may_not_wrap(buffer: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        device_span(buffer)
    with pytest.raises(error, match=message):
        nv.register(buffer)  # refused before the runtime is asked for


def test_cufftmp_extents_pointers_and_element_sizes_fit_their_c_types() -> None:
    with pytest.raises(UsageError, match=r"shape\[2\] must be in \[1, 2\*\*31 - 1\]"):
        cufftmp.Plan.create_3d(None, (8, 8, 2**31), cufftmp.Type.C2C)
    with pytest.raises(UsageError, match="comm .* is 18446744073709551616"):
        cufftmp.Plan.create_2d(2**64, (8, 8), cufftmp.Type.C2C)
    with pytest.raises(UsageError, match=r"upper_input\[0\] must be in \[-2\*\*63, 2\*\*63 - 1\]"):
        cufftmp.Plan._over(None).set_distribution((0, 0), (2**63, 1), (0, 0), (1, 1))
    with pytest.raises(UsageError, match="element count"):
        cufftmp.Plan.create_decomposition(None, (8, 8, 8), cufftmp.Type.C2C, ((0, 0, 0), (2**31, 2**31, 2**31)),
                                          ((0, 0, 0), (8, 8, 8)))
    r = cufftmp.Reshape.__new__(cufftmp.Reshape)
    with pytest.raises(UsageError, match="the input box's bytes"):
        r.make(None, 2**40, ((0, 0, 0), (2**12, 2**12, 1)), ((0, 0, 0), (1, 1, 1)))
    with pytest.raises(UsageError, match="element size is 9223372036854775808"):
        r.make(None, 2**63, ((0, 0, 0), (0, 0, 0)), ((0, 0, 0), (0, 0, 0)))
    with pytest.raises(UsageError, match=r"output \(a device pointer\) is 18446744073709551616"):
        cufftmp.Reshape._bytes(2**64, "output", 8, writable=True)


def test_collective_matmul_sizes_beyond_an_int64_are_refused_alike_on_every_pe() -> None:
    # The values travel as int64s: one beyond would wrap into an agreement on a small size.
    assert collective_matmul._local_problem(2**63, 8, 8, "float16", "host", None, n_pes=2)[0] == 1
    assert collective_matmul._local_problem(2**40, 2**20, 8, "float16", "host", None, n_pes=2)[0] == 6
    assert collective_matmul._local_problem(2**20, 2**20, 2**40, "float16", "host", None, n_pes=8)[0] == 6
    assert collective_matmul._local_problem(2**20, 2**20, 8, "float16", "host", 2**31, n_pes=2)[0] == 5
    assert collective_matmul._local_problem(2**20, 2**20, 8, "float16", "host", 2**31 - 1, n_pes=2)[0] == 0
    huge = sent(lambda group: collective_matmul._agreed(group, 2**41, 2**20, 8, "float16", "host", None))
    with pytest.raises(UsageError, match="refused on PE 1: the ring buffers"):
        collective_matmul._agreed(Scripted(huge, unit="PE"), 8, 8, 8, "float16", "host", None)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: nk._dims((2**31, 1, 1), "grid"), UsageError, "beyond CUDA's limits"),
    (lambda: nk._dims((1, 65536), "grid"), UsageError, "beyond CUDA's limits"),
    (lambda: nk._dims(1025, "block"), UsageError, "beyond CUDA's limits"),
    (lambda: nk._dims((32, 32, 2), "block"), UsageError, "1024 threads"),
    (lambda: nk._dims((IndexRaises(),), "grid"), TypeError, "__index__ failed"),
    (lambda: nk._shared(2**32), UsageError, r"\[0, 2\*\*32 - 1\]"),
    (lambda: nk._prepare([nk.value("f", "float32")], [1e39]), UsageError,
     "does not fit float32"),
    (lambda: nk._prepare([nk.value("f", "float64")], [10**400]), UsageError,
     "does not fit float64"),
    (lambda: nk._prepare([nk.value("n", "uint64")], [IndexRaises()]), TypeError,
     "__index__ failed"),
])
def test_kernel_launch_values_fit_what_cuda_takes(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_kernel_launch_values_at_the_edges_pass() -> None:
    assert nk._dims((2**31 - 1, 65535, 65535), "grid") == (2**31 - 1, 65535, 65535)
    assert nk._dims((1024, 1, 1), "block") == (1024, 1, 1)
    assert nk._shared(2**32 - 1) == 2**32 - 1
    values = nk._prepare([nk.value("f", "float32"), nk.value("g", "float32")],
                                     [float("inf"), 3.4e38])
    assert math.isinf(values[0].value) and values[1].value == pytest.approx(3.4e38)


# --- other hostile values ------------------------------------------------------------------------------


def test_nvshmem_refuses_before_allocating_or_waiting() -> None:
    _quick(lambda: nv.init(10**12, rank=0, nranks=2), TypeError, "unique_id must be")  # bytes(10**12) is a TB
    for after in (float("nan"), float("inf"), 1e300, -1.0, True):
        with pytest.raises(UsageError, match="notice_after"):
            nv.init(b"\0" * 128, rank=0, nranks=2, notice_after=after)
    _quick(lambda: nv.empty(range(10**12)), UsageError, "shape has more than 64 entries")
    with pytest.raises(UsageError, match="shape must be non-negative ints"):
        nv.empty((IndexRaises(),))
    with pytest.raises(TypeError, match="device must be an int; IndexRaises.__index__ failed"):
        nv.init(b"\0" * 128, rank=0, nranks=2, device=IndexRaises())


def test_a_pe_number_that_only_has_index_is_checked_as_an_int() -> None:
    class OnlyIndex:
        def __index__(self) -> int:
            return 1

    assert nv._check_pe(OnlyIndex(), "pe", 2) == 1
    assert nv._check_pe(np.int16(1), "pe", 2) == 1
    for bad in (IndexRaises(), 2, -1, 1.0, True):
        with pytest.raises(UsageError, match=r"pe must be a PE number in \[0, 2\)"):
            nv._check_pe(bad, "pe", 2)


def test_fft_plan_refuses_an_endless_shape_on_every_rank() -> None:
    class OneRank:
        def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
            return 0

        def Get_size(self) -> int:  # noqa: N802
            return 1

        def Iallgather(self, send: Any, recv: Any) -> Any:  # noqa: N802
            raise AssertionError("one rank exchanges nothing")

    _quick(lambda: fft.plan(OneRank(), range(10**12), "complex64"), UsageError, "shape has more than 64 entries")
    _quick(lambda: fft.plan(OneRank(), (8, 8), "complex64", stream=2**70), UsageError, "stream")


def test_nccl_shrink_reads_no_more_ranks_than_the_communicator_has() -> None:
    class Core:
        size = 4

        def shrink(self, *args: Any) -> Any:
            raise AssertionError("reached the library")

    comm = nccl.Communicator.__new__(nccl.Communicator)
    comm._core = Core()  # type: ignore[assignment]
    _quick(lambda: comm.shrink(range(10**12)), UsageError, "exclude_ranks has more than 4 entries")
    with pytest.raises(UsageError, match="exclude_ranks"):
        comm.shrink([-1])


def test_kernel_builds_take_bounded_lists_of_strings() -> None:
    _quick(lambda: nk.compile("x", defines=range(10**12)), UsageError, "defines has more than 4096 entries")
    with pytest.raises(TypeError, match="defines are"):
        nk.compile("x", defines=[3])
    with pytest.raises(TypeError, match="link_options must be strings"):
        nk.compile("x", link_options=[b"-x"])
    with pytest.raises(TypeError, match="arch must be a str"):
        nk.compile("x", arch=90)  # type: ignore[arg-type]
