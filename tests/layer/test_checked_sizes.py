"""Sizes, counts and addresses each planner and call computes from a caller's values are refused,
naming the quantity, where the C type they are handed to would wrap them (at the 2**31, 2**63 and
2**64 edges); values that are not what they claim (an __index__ that fails, a count that never
ends) are refused at once, before anything is allocated or waited for."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from mpbind import _fft_plan, _matmul_plan, cublasmp, fft
from mpbind import distributions as dist
from mpbind.errors import UsageError

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
        cublasmp._scalar(value, ct, False, "alpha")
    assert "alpha" in str(info.value)
    assert cublasmp._scalar(-(2**31), int(cublasmp.CublasComputeType.COMPUTE_32I), False) == (-(2**31)).to_bytes(
        4, "little", signed=True)


# --- other hostile values ------------------------------------------------------------------------------


def test_fft_plan_refuses_an_endless_shape_on_every_rank() -> None:
    class OneRank:
        def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
            return 0

        def Get_size(self) -> int:  # noqa: N802
            return 1

        def allgather(self, obj: Any) -> list[Any]:
            return [obj]

    _quick(lambda: fft.plan(OneRank(), range(10**12), "complex64"), UsageError, "shape has more than 64 entries")
    _quick(lambda: fft.plan(OneRank(), (8, 8), "complex64", stream=2**70), UsageError, "stream")
