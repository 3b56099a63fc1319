"""The distributed matmul planner (mpbind.matmul._planner), without a GPU: distributions in, algorithm,
grids, descriptors, views and memory out, and every refusal before anything collective.

Besides the decision table, every plan of a sweep over layouts is checked for what cuBLASMp needs:
each operand's descriptor, applied to the pieces the ranks hand over (a replicated operand's view),
describes exactly the caller's global matrix; the blocks of one dimension agree in every matrix
(mbA == mbD, nbB == nbD, kbA == kbB); and the ``local`` plans' per-rank products give D."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpbind import cublasmp, matmul
from mpbind import distributions as dist
from mpbind.errors import UsageError
from mpbind.matmul import _planner as mp
from mpbind.matmul._planner import ComputeCapabilityError, MatmulPlan, plan

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
from dlpack_objects import InterfaceArray  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from fake_groups import Scripted  # noqa: E402

CT = cublasmp.CublasComputeType
GL = cublasmp.GridLayout


# --- a CPU model of what the ranks hand over and what a descriptor says -----------------------------


def pieces(d: dist.Distribution, whole: np.ndarray) -> list[np.ndarray]:
    """Every rank's local array of `whole` under the caller's distribution."""
    if d.replicated:
        return [whole for _ in range(d.nranks)]
    if isinstance(d, dist.BlockCyclic):
        args = d.to_block_cyclic()
        out = []
        for r in range(d.nranks):
            prow, pcol = args.coords(r)
            rows = [i for i in range(d.shape[0]) if (i // args.mb + args.rsrc) % args.nprow == prow]
            cols = [j for j in range(d.shape[1]) if (j // args.nb + args.csrc) % args.npcol == pcol]
            out.append(whole[np.ix_(rows, cols)])
        return out
    return [whole[tuple(slice(lo, up) for lo, up in zip(b.lower, b.upper, strict=True))]
            for b in (d.box(r) for r in range(d.nranks))]


def assemble(args: dist.BlockCyclicArgs, local: list[np.ndarray]) -> np.ndarray:
    """The global matrix a descriptor makes of the ranks' local pieces (NaN where nobody writes)."""
    out = np.full((args.m, args.n), np.nan)
    for r, piece in enumerate(local):
        assert piece.shape == args.local_shape(r), (r, piece.shape, args)
        prow, pcol = args.coords(r)
        for i, j in itertools.product(range(piece.shape[0]), range(piece.shape[1])):
            gi = (i // args.mb) * args.nprow * args.mb + ((prow - args.rsrc) % args.nprow) * args.mb + i % args.mb
            gj = (j // args.nb) * args.npcol * args.nb + ((pcol - args.csrc) % args.npcol) * args.nb + j % args.nb
            assert np.isnan(out[gi, gj]), "two ranks hold one element"
            out[gi, gj] = piece[i, j]
    return out


def handed_over(o: mp.OperandPlan, whole: np.ndarray) -> list[np.ndarray]:
    out = []
    for r, piece in enumerate(pieces(o.distribution, whole)):
        view = o.views[r]
        out.append(piece if view is None else piece[view[0]:view[1], view[2]:view[3]])
    return out


def check_descriptors(p: MatmulPlan, rng: np.random.Generator) -> None:
    """What cuBLASMp is told describes the caller's matrices, with one block size per dimension."""
    wholes = {o.name: rng.standard_normal(o.shape) for o in p.operands}
    if p.algorithm == "local":
        a, b, d = (handed_over(o, wholes[o.name]) for o in (p.a, p.b, p.d))
        expected = pieces(p.d.distribution, (wholes["a"].T if p.transa else wholes["a"])
                          @ (wholes["b"].T if p.transb else wholes["b"]))
        for r in range(p.nranks):
            assert a[r].shape == p.a.local_shape(r) and b[r].shape == p.b.local_shape(r)
            assert d[r].shape == p.d.local_shape(r) == expected[r].shape
            got = (a[r].T if p.transa else a[r]) @ (b[r].T if p.transb else b[r])
            np.testing.assert_allclose(got, expected[r], atol=1e-12)
            assert p.gemm_shape(r) == (*d[r].shape, p.k)
        return
    for o in p.operands:
        args = o.descs[0]
        assert all(x == args for x in o.descs) and args.nranks == p.nranks
        local = handed_over(o, wholes[o.name])
        if p.algorithm == "gemm_allreduce" and o.name in ("c", "d"):
            np.testing.assert_array_equal(assemble(args, local), np.hstack([wholes[o.name]] * p.nranks))
        else:
            np.testing.assert_array_equal(assemble(args, local), wholes[o.name])
        for r in range(p.nranks):
            assert o.local_shape(r) == local[r].shape
    # One block size per dimension: mbA == mbD, nbB == nbD, kbA == kbB (and C as D).
    dims = {"a": ("k", "m") if p.transa else ("m", "k"), "b": ("n", "k") if p.transb else ("k", "n"),
            "c": ("m", "n"), "d": ("m", "n")}
    blocks: dict[str, set[int]] = {"m": set(), "n": set(), "k": set()}
    for o in p.operands:
        args = o.descs[0]
        blocks[dims[o.name][0]].add(args.mb)
        blocks[dims[o.name][1]].add(args.nb)
    assert all(len(v) == 1 for v in blocks.values()), blocks


# --- the decision table ---------------------------------------------------------------------------

M, N, K = 12, 8, 16


def kind(name: str, shape: tuple[int, int], p: int) -> dist.Distribution:
    if name == "rows":
        return dist.by_rows(shape, p)
    if name == "cols":
        return dist.by_columns(shape, p)
    if name == "rep":
        return dist.Replicated(shape, p)
    if name == "rows~":  # uneven, of NUMROC's form
        return dist.Split.blocked(shape, p, 0, shape[0] // p + 1)
    if name == "cols~":
        return dist.Split.blocked(shape, p, 1, shape[1] // p + 1)
    if name == "bc":
        return dist.BlockCyclic(shape, (2, p // 2), (2, 2))
    raise AssertionError(name)


def planned(a: str, b: str, d: str, transa: bool = False, transb: bool = False, p: int = 2, dtype: str = "float32",
            **options: Any) -> MatmulPlan:
    a_shape = (K, M) if transa else (M, K)
    b_shape = (N, K) if transb else (K, N)
    return plan(a=kind(a, a_shape, p), b=kind(b, b_shape, p), d=kind(d, (M, N), p), a_dtype=dtype, transa=transa,
                transb=transb, **options)


DECISIONS = [
    # A, B, D, transa, transb -> algorithm; "rows"/"cols" are the stored matrix's
    ("cols", "cols", "rows", True, False, "allgather_gemm"),  # cuBLASMp's TN AG+GEMM
    ("rows", "cols", "rows", False, False, "allgather_gemm"),  # NN
    ("rows", "rows", "rows", False, True, "allgather_gemm"),  # NT: B is n x k, its rows are n
    ("cols", "rows", "rows", True, True, "allgather_gemm"),  # TT
    ("rep", "cols", "rows", False, False, "allgather_gemm"),  # A replicated: hands over its rows
    ("rows", "rows", "cols", True, False, "gemm_reducescatter"),  # cuBLASMp's TN GEMM+RS
    ("cols", "rows", "cols", False, False, "gemm_reducescatter"),  # NN
    ("cols", "cols", "cols", False, True, "gemm_reducescatter"),  # NT
    ("rows", "rep", "cols", True, False, "gemm_reducescatter"),  # B replicated: hands over its k rows
    ("rows", "rows", "rep", True, False, "gemm_allreduce"),  # TN only
    ("rep", "rows", "rep", True, False, "gemm_allreduce"),
    ("rows", "rep", "rows", False, False, "local"),
    ("rep", "cols", "cols", False, False, "local"),
    ("rep", "rows", "cols", False, True, "local"),  # NT: B's rows are n
    ("rep", "rep", "rep", False, False, "local"),
    ("rep", "rep", "rows", True, True, "local"),
    ("rep", "rep", "cols", False, False, "local"),
    ("rows", "rows", "rows", False, False, "general"),  # B split along k, D along m: no TP layout
    ("rows", "cols", "cols", False, False, "general"),
    ("cols", "cols", "rows", False, False, "general"),
    ("cols~", "cols", "rows~", True, False, "general"),  # the AG+GEMM layout, uneven
    ("rows~", "rows~", "cols", True, False, "general"),  # the GEMM+RS layout, uneven k
    ("rows", "rep", "rows~", False, False, "local"),  # uneven rows need no equal parts locally
]


@pytest.mark.parametrize(("a", "b", "d", "transa", "transb", "algorithm"), DECISIONS)
@pytest.mark.parametrize("p", [2, 4])
def test_decision_table(a: str, b: str, d: str, transa: bool, transb: bool, algorithm: str, p: int) -> None:
    if a == "rows" and d == "rows~":
        a = "rows~"  # the same uneven rows for A and D
    result = planned(a, b, d, transa, transb, p)
    assert result.algorithm == algorithm, result.explain()
    assert result.explain().splitlines()[0].startswith(f"D ({M} x {N})")
    check_descriptors(result, np.random.default_rng(7))


def test_summa_on_one_2d_grid() -> None:
    result = planned("bc", "bc", "bc", p=4, dtype="float64")
    assert result.algorithm == "general"
    assert "SUMMA on the 2 x 2 grid" in result.explain()
    assert {o.grid for o in result.operands} == {(2, 2, GL.COL_MAJOR)}
    check_descriptors(result, np.random.default_rng(1))


def test_one_1d_grid_puts_d_on_the_other_layout() -> None:
    result = planned("rows", "rows", "rows")
    assert (result.a.grid, result.b.grid, result.d.grid) == ((2, 1, GL.COL_MAJOR),) * 2 + ((2, 1, GL.ROW_MAJOR),)
    assert "does not run SUMMA on a 1-D layout" in result.explain()


# Why a layout of the sweep may be refused: the data layouts disagree, and the data is not moved.
REFUSED = r"the [mnk] blocks differ|D is replicated|[AB]: Split.*NUMROC|[AB] is replicated, but"


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize(("transa", "transb"), list(itertools.product([False, True], repeat=2)))
def test_every_layout_plans_correct_descriptors_or_refuses(p: int, transa: bool, transb: bool) -> None:
    rng = np.random.default_rng(p)
    kinds = ["rows", "cols", "rep", "rows~", "cols~"] + (["bc"] if p % 2 == 0 else [])
    planned_count = 0
    for a, b, d in itertools.product(kinds, repeat=3):
        try:
            result = planned(a, b, d, transa, transb, p)
        except UsageError as exc:
            assert re.match(REFUSED, str(exc)), exc
            continue
        planned_count += 1
        check_descriptors(result, rng)
    assert planned_count >= 50


# --- the tensor-parallel descriptors of cuBLASMp's guide -------------------------------------------


def test_allgather_gemm_descriptors_follow_the_guide() -> None:
    p = 4
    result = plan(a=dist.by_columns((K, M * 2), p), b=dist.by_columns((K, N * 2), p), d=dist.by_rows((M * 2, N * 2), p),
                  a_dtype="bfloat16", transa=True)
    m, n = M * 2, N * 2
    assert result.algorithm == "allgather_gemm"
    a, b, d = (result.a.descs[0], result.b.descs[0], result.d.descs[0])
    # A, B: k x (m|n), 1 x P row-major, blocks k x m/P and k x n/P; D: P x 1 column-major, m/P x n/P (nbB == nbD).
    assert (a.mb, a.nb, a.nprow, a.npcol, a.layout) == (K, m // p, 1, p, "row")
    assert (b.mb, b.nb, b.nprow, b.npcol, b.layout) == (K, n // p, 1, p, "row")
    assert (d.mb, d.nb, d.nprow, d.npcol, d.layout) == (m // p, n // p, p, 1, "col")
    assert result.symmetric_workspace and result.staging_bytes == K * n * 2
    assert result.local_shapes(3) == {"a": (K, m // p), "b": (K, n // p), "d": (m // p, n)}
    assert result.local_shapes(np.int64(3)) == result.local_shapes(3)
    for rank in (4, -1, 2**63):  # a rank the plan has not: refused by name, not an IndexError
        with pytest.raises(UsageError, match="rank must be in"):
            result.local_shapes(rank)
    with pytest.raises(TypeError, match="rank must be an int"):
        result.local_shapes(1.0)


def test_reduce_scatter_and_allreduce_descriptors_follow_the_guide() -> None:
    p = 2
    rs = plan(a=dist.by_rows((K, M), p), b=dist.by_rows((K, N), p), d=dist.by_columns((M, N), p),
              a_dtype="float16", transa=True)
    a, b, d = (rs.a.descs[0], rs.b.descs[0], rs.d.descs[0])
    assert (a.mb, a.nb, a.nprow, a.layout) == (K // p, M, p, "col")
    assert (b.mb, b.nb, b.nprow, b.layout) == (K // p, N // p, p, "col")
    assert (d.mb, d.nb, d.npcol, d.layout) == (M, N // p, p, "row")
    assert rs.staging_bytes == M * N * 4  # 16-bit results are communicated in 32 bits
    ar = plan(a=dist.by_rows((K, M), p), b=dist.by_rows((K, N), p), d=dist.Replicated((M, N), p),
              c=dist.Replicated((M, N), p), c_dtype="float32", a_dtype="float32", transa=True, beta=0.5)
    # D (and C): every rank's whole m x n is column block r of an m x nP matrix on a 1 x P grid.
    for o in (ar.d, ar.c):
        assert o is not None
        args = o.descs[0]
        assert (args.m, args.n, args.mb, args.nb, args.nprow, args.npcol, args.layout) == (M, N * p, M, N, 1, p, "row")
        assert o.local_shape(1) == (M, N)
    assert ar.epilogue_member == cublasmp.MatmulEpilogue.ALLREDUCE
    assert ar.gemm_shape(0) == (M, N, K)


def test_communication_type_of_the_reductions() -> None:
    rs = planned("rows", "rows", "cols", True, dtype="bfloat16", communication_type="bfloat16")
    assert rs.algorithm == "gemm_reducescatter" and rs.communication_dtype == "bfloat16"
    assert rs.staging_bytes == M * N * 2 and "partial products communicated in bfloat16" in rs.explain()
    wide = planned("rows", "rows", "cols", True, dtype="bfloat16", communication_type=cublasmp.CudaDataType.R_32F)
    assert wide.communication_dtype == "float32" and wide.staging_bytes == M * N * 4
    ar = planned("rows", "rows", "rep", True, dtype="float16", communication_type="float16")
    assert ar.communication_dtype == "float16"
    ag = planned("cols", "cols", "rows", True, dtype="bfloat16", communication_type="bfloat16")
    assert ag.communication_dtype is None  # nothing is reduced
    assert "communication type bfloat16: not used (allgather_gemm reduces no partial products)" in ag.explain()
    z = planned("rows", "rows", "cols", True, dtype="complex64", communication_type="complex64")
    assert z.communication_dtype == "complex64"
    fp8 = plan(a=dist.by_rows((32, 64), 2), b=dist.by_rows((32, 32), 2), d=dist.by_columns((64, 32), 2),
               a_dtype="float8_e4m3fn", d_dtype="float8_e4m3fn", transa=True, scales={"a", "b", "d"},
               communication_type="bfloat16")
    assert fp8.communication_dtype == "bfloat16" and fp8.staging_bytes == 64 * 32 * 2


@pytest.mark.parametrize(("dtype", "given", "error", "message"), [
    ("bfloat16", "float64", UsageError, r"no wider than the scale type \(float32\)"),
    ("float32", "float16", UsageError, r"as wide as D \(float32\)"),
    ("float32", "complex64", UsageError, "real like D"),
    ("float64", "float32", UsageError, r"as wide as D \(float64\)"),
    ("bfloat16", "int8", UsageError, "communication_type 'int8' is not one of"),
    ("bfloat16", 12345, UsageError, "not a type cuBLASMp multiplies"),
    ("bfloat16", True, TypeError, "communication_type must be a dtype name"),
])
def test_communication_type_refusals(dtype: str, given: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        planned("rows", "rows", "cols", True, dtype=dtype, communication_type=given)


def test_uniform_plans() -> None:
    assert planned("cols", "cols", "rows", True).uniform
    assert not planned("cols~", "cols", "rows~", True).uniform  # uneven: a general plan, pieces differ


def test_uneven_k_with_a_replicated_d_is_refused() -> None:
    # GEMM+AllReduce is the only way to a replicated D, and cuBLASMp refuses it on uneven k.
    with pytest.raises(UsageError, match="GEMM\\+AllReduce needs equal parts along k"):
        planned("rows~", "rows~", "rep", True)


def test_replicated_operand_hands_over_a_view() -> None:
    result = planned("rows", "rep", "cols", True, False, p=4)
    assert result.algorithm == "gemm_reducescatter"
    assert result.b.views == ((0, 4, 0, N), (4, 8, 0, N), (8, 12, 0, N), (12, 16, 0, N))
    assert result.a.views == (None,) * 4
    local = planned("rep", "cols", "cols", p=2)
    assert local.a.views == (None, None)  # A whole on every rank
    assert local.gemm_shape(1) == (M, N // 2, K)


def test_general_with_a_replicated_operand() -> None:
    result = planned("rep", "rows", "rows")  # B split along k, D along m: A adopts D's m split
    assert result.algorithm == "general"
    assert result.a.views == ((0, M // 2, 0, K), (M // 2, M, 0, K))
    assert "A is replicated: it is described as split along m" in result.explain()
    check_descriptors(result, np.random.default_rng(3))


def test_plans_are_values() -> None:
    one, two = planned("cols", "cols", "rows", True), planned("cols", "cols", "rows", True)
    assert one == two and hash(one) == hash(two) and one.explain() == two.explain()
    assert planned("rows", "rows", "cols", True) != one


# --- epilogues, types, scalars ---------------------------------------------------------------------


def test_epilogue_bias_and_aux_sizes() -> None:
    result = planned("cols", "cols", "rows", True, epilogue="gelu_aux_bias", dtype="bfloat16")
    assert result.epilogue_member == cublasmp.MatmulEpilogue.GELU_AUX_BIAS
    assert result.bias_dtype == "bfloat16" and result.aux_dtype == "bfloat16"
    assert result.bias_length(0) == M // 2  # D's local rows
    assert result.aux_layout(1) == (8, N, 8 * N * 2)  # ld 6 rounded up to 8
    relu = planned("rows", "rows", "cols", True, epilogue="relu_aux")
    assert relu.aux_dtype is None and relu.aux_layout(0) == (128, N // 2, 16 * N // 2)  # a bit mask
    assert relu.bias_dtype is None
    grad = planned("rows", "rows", "cols", True, epilogue="bgradb")
    assert grad.bias_length(0) == N  # a bias gradient comes out whole
    assert planned("rows", "rows", "cols", True, epilogue="drelu_bgrad").bias_length(1) == M


@pytest.mark.parametrize(("dtype", "compute"), [("float16", CT.COMPUTE_32F), ("bfloat16", CT.COMPUTE_32F),
                                                ("float32", CT.COMPUTE_32F), ("float64", CT.COMPUTE_64F),
                                                ("complex64", CT.COMPUTE_32F), ("complex128", CT.COMPUTE_64F)])
def test_default_compute_types(dtype: str, compute: CT) -> None:
    assert planned("cols", "cols", "rows", True, dtype=dtype).compute_type == compute


def test_chosen_compute_type_and_complex_scalars() -> None:
    result = planned("cols", "cols", "rows", True, compute_type=CT.COMPUTE_32F_FAST_TF32)
    assert result.compute_type == CT.COMPUTE_32F_FAST_TF32
    z = planned("rows", "rows", "cols", True, dtype="complex128", alpha=1 + 2j)
    assert z.alpha == 1 + 2j and z.beta == 0


@pytest.mark.parametrize(("a_dtype", "b_dtype", "d_dtype"), [
    ("float8_e4m3fn", "float8_e4m3fn", "bfloat16"), ("float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn"),
    ("float8_e4m3fn", "float8_e5m2", "float16"), ("float8_e5m2", "float8_e4m3fn", "float32"),
    ("float8_e4m3fn", "float8_e5m2", "float8_e5m2"),
])
def test_fp8_plans(a_dtype: str, b_dtype: str, d_dtype: str) -> None:
    scales = {"a", "b"} | ({"d", "amax_d"} if d_dtype.startswith("float8") else set())
    result = plan(a=dist.by_columns((32, 64), 2), b=dist.by_columns((32, 32), 2), d=dist.by_rows((64, 32), 2),
                  a_dtype=a_dtype, b_dtype=b_dtype, d_dtype=d_dtype, transa=True, scales=scales,
                  compute_capability=(9, 0))
    assert result.algorithm == "allgather_gemm" and result.scaling == "tensor"
    assert result.scale_mode == cublasmp.MatmulMatrixScale.SCALAR_FP32
    assert result.required_capability == (8, 9) and result.compute_type == CT.COMPUTE_32F
    assert set(result.scales) == scales


def test_block_scaling_is_checked_against_the_gpu() -> None:
    kw: dict[str, Any] = dict(a=dist.by_columns((256, 512), 2), b=dist.by_columns((256, 256), 2),
                              d=dist.by_rows((512, 256), 2), a_dtype="float8_e4m3fn", d_dtype="bfloat16",
                              transa=True, scaling="mxfp8", scales={"a", "b"})
    ok = plan(**kw, compute_capability=(10, 0))
    assert ok.scale_mode == cublasmp.MatmulMatrixScale.VEC32_UE8M0 and ok.required_capability == (10, 0)
    with pytest.raises(ComputeCapabilityError, match=r"MXFP8 block scaling needs compute capability 10\.0 or newer; "
                                                     r"this GPU is 9\.0 \(sm_90\)") as info:
        plan(**kw, compute_capability=(9, 0))
    assert info.value.capability == (9, 0) and info.value.required == (10, 0)
    assert isinstance(info.value, UsageError)
    with pytest.raises(ComputeCapabilityError, match=r"FP8 matmul needs compute capability 8\.9.* 8\.0 \(sm_80\)"):
        plan(**{**kw, "scaling": "tensor"}, compute_capability=(8, 0))
    # One scale per 32 elements along K, in 128 x 4 tiles: A's local 256 x 256 (k x m/2).
    assert mp.block_scale_elements(256, 256, "mxfp8") == 256 * 8
    assert mp.block_scale_elements(100, 48, "nvfp4") == 128 * 4


# --- refusals ----------------------------------------------------------------------------------


def R(shape: tuple[int, int], p: int = 2) -> dist.Distribution:
    return dist.by_rows(shape, p)


def C(shape: tuple[int, int], p: int = 2) -> dist.Distribution:
    return dist.by_columns(shape, p)


BASE: dict[str, Any] = dict(a=R((M, K)), b=C((K, N)), d=R((M, N)), a_dtype="float32")
FP8: dict[str, Any] = dict(a=C((32, 64)), b=C((32, 32)), d=R((64, 32)), a_dtype="float8_e4m3fn", transa=True,
                           scales={"a", "b"})
REFUSALS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"b": C((K + 1, N))}, UsageError, "B must have k = 16 rows"),
    ({"b": C((N, K)), "transb": False}, UsageError, "B must have k = 16 rows"),
    ({"d": R((M, N + 2))}, UsageError, r"D's shape is \(12, 10\); op\(A\) op\(B\) is 12 x 8"),
    ({"c": R((M, N + 2)), "c_dtype": "float32"}, UsageError, r"C's shape is \(12, 10\)"),
    ({"c": C((M, N)), "c_dtype": "float32"}, UsageError, "C must be distributed as D"),
    ({"c": R((M, N)), "c_dtype": "float64"}, UsageError, "C must be float32 like D"),
    ({"b": C((K, N), 4)}, UsageError, "same ranks.*B: 4"),
    ({"b_dtype": "float64"}, UsageError, "A, B and D must have one type"),
    ({"a_dtype": "int8"}, UsageError, "A is int8; cuBLASMp multiplies"),
    ({"d": dist.by_rows((M, N), 2, counts=(5, 7)), "a": dist.by_rows((M, K), 2, counts=(5, 7))}, UsageError,
     r"A: Split\(shape=\(12, 16\), axis=0, counts=\(5, 7\)\): the pieces are not .*NUMROC's form"),
    ({"a": dist.Boxes((M, K), [((0, 0), (7, K)), ((6, 0), (M, K))])}, UsageError, "A: ranks 0 and 1 overlap"),
    ({"a": dist.BlockCyclic((M, K), (1, 2), (4, 2)), "b": dist.BlockCyclic((K, N), (2, 1), (3, 4)),
      "d": dist.BlockCyclic((M, N), (2, 1), (2, 4))}, UsageError, "the k blocks differ: A 2, B 3"),
    ({"a": dist.BlockCyclic((M, K), (2, 1), (2, 8)), "d": dist.BlockCyclic((M, N), (2, 1), (4, 8))}, UsageError,
     "the m blocks differ: A 2, D 4"),
    ({"d": dist.Replicated((M, N), 2)}, UsageError, "D is replicated: cuBLASMp returns a replicated D only through"),
    ({"a": R((K, M)), "b": R((K, N)), "d": dist.Replicated((M, N), 2), "transa": True, "epilogue": "gelu"},
     UsageError, "ALLREDUCE epilogue, which combines with no other epilogue; asked for 'gelu'"),
    ({"a": dist.Replicated((M, K), 4), "b": dist.BlockCyclic((K, N), (2, 2), (2, 2)),
      "d": dist.BlockCyclic((M, N), (2, 2), (2, 2))}, UsageError, "A is replicated, but .* cyclic"),
    ({"beta": 0.5}, UsageError, "beta = 0.5 needs C"),
    ({"alpha": 1j}, UsageError, r"alpha = 1j is complex but the operands are float32"),
    ({"alpha": "1"}, TypeError, "alpha must be a number"),
    ({"epilogue": "swish"}, UsageError, "epilogue must be one of none, bias"),
    ({"epilogue": 3}, TypeError, "epilogue must be a str"),
    ({"compute_type": CT.COMPUTE_64F}, UsageError, "compute_type COMPUTE_64F does not multiply float32"),
    ({"compute_type": 12345}, UsageError, "not a CublasComputeType"),
    ({"compute_type": "32F"}, TypeError, "compute_type must be a CublasComputeType"),
    ({"scaling": "mx"}, UsageError, "scaling must be 'tensor', 'mxfp8', 'nvfp4' or None"),
    ({"scaling": "mxfp8"}, UsageError, "scaling='mxfp8' applies to FP8/FP4 operands; A and B are float32"),
    ({"scales": {"a"}}, UsageError, r"scales \['a'\] apply to FP8/FP4 operands only"),
    ({"a": dist.by_rows((0, K), 2)}, UsageError, "A must be a non-empty matrix"),
    ({"a": dist.Split((M, K, 2), 2)}, UsageError, "A must be a non-empty matrix"),
    ({"a": "rows"}, TypeError, "a must be a distribution"),
    ({"transa": 1}, TypeError, "transa must be a bool"),
]
FP8_REFUSALS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"b_dtype": "float8_e5m2", "a_dtype": "float8_e5m2"}, UsageError, "FP8 multiplies float8_e4m3fn x"),
    ({"b_dtype": "bfloat16"}, UsageError, "FP8 multiplies"),
    ({"transa": False, "a": R((64, 32))}, UsageError, "FP8/FP4 operands need transa=True, transb=False"),
    ({"d_dtype": "float8_e5m2"}, UsageError, "D of float8_e4m3fn x float8_e4m3fn must be one of"),
    ({"scales": {"a"}}, UsageError, "tensor scaling needs scales for B"),
    ({"d_dtype": "float8_e4m3fn"}, UsageError, "tensor scaling needs scales for D"),
    ({"scales": {"a", "b", "amax_d"}}, UsageError, "amax_d is the amax of an FP8 D; D is bfloat16"),
    ({"scales": {"a", "b", "x"}}, UsageError, "scales are named"),
    ({"scaling": "nvfp4"}, UsageError, "scaling='nvfp4' does not fit float8_e4m3fn"),
    ({"c": R((64, 32)), "c_dtype": "float32", "d_dtype": "float8_e4m3fn", "scales": {"a", "b", "d"}}, UsageError,
     "C with a float8_e4m3fn D must be bfloat16 or float16"),
    ({"a": C((40, 64)), "b": C((40, 32))}, UsageError, "multiples of 16 along k; rank 0's local GEMM is 32 x 32 x 40"),
    ({"scaling": "mxfp8"}, UsageError, "multiples of 128 along m"),
    ({"scaling": "mxfp8", "d_dtype": "float8_e4m3fn"}, UsageError, "block scaling needs D's output scales"),
]


@pytest.mark.parametrize(("change", "error", "message"), REFUSALS + [({**FP8, **c}, e, m) for c, e, m in FP8_REFUSALS])
def test_refusals_name_the_operand(change: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        plan(**{**BASE, **change})


def test_replicated_d_outside_tn_says_why() -> None:
    with pytest.raises(UsageError, match="transa=True, transb=False with A and B split along k"):
        planned("cols", "rows", "rep", False, False)


# --- the executable plan's checks, without a GPU ------------------------------------------------------


def test_matmul_plan_needs_a_communicator() -> None:
    with pytest.raises(TypeError, match="comm must be an mpbind.nccl.Communicator"):
        matmul.plan(object(), None, None, None, a_dist=BASE["a"], b_dist=BASE["b"],  # type: ignore[arg-type]
                             d_dist=BASE["d"])


def col_major(shape: tuple[int, int], typestr: str = "<f4", itemsize: int = 4) -> InterfaceArray:
    return InterfaceArray(shape, typestr, strides=(itemsize, itemsize * max(shape[0], 1)))


def test_local_checks_of_the_arrays() -> None:
    from mpbind._infra.interop import device_array
    from mpbind.matmul import _check_local

    result = planned("rows", "cols", "rows", epilogue="bias")
    good = {"a": col_major((M // 2, K)), "b": col_major((K, N // 2)), "d": col_major((M // 2, N))}

    def check(arrays: dict[str, Any], bias: Any = None, aux: Any = None, scales: dict[str, Any] | None = None) -> None:
        infos = {k: device_array(v, k, contiguous=False) for k, v in arrays.items()}
        _check_local(result, 1, 0, {**arrays, "c": None}, infos, bias, aux, scales or {})

    bias = InterfaceArray((M // 2,), "<f4")
    check(good, bias)
    with pytest.raises(UsageError, match=r"a: rank 1's local array is 6 x 15; .* gives it 6 x 16"):
        check({**good, "a": col_major((M // 2, K - 1))}, bias)
    with pytest.raises(UsageError, match="b must be column-major"):
        check({**good, "b": InterfaceArray((K, N // 2), "<f4")}, bias)
    with pytest.raises(UsageError, match="bias is required"):
        check(good)
    with pytest.raises(UsageError, match="bias must be 6 contiguous float32 on device 0; got 12 float32"):
        check(good, InterfaceArray((M,), "<f4"))
    with pytest.raises(UsageError, match="aux= is for an epilogue with an auxiliary matrix"):
        check(good, bias, aux=InterfaceArray((8,), "<f4"))


def test_ranks_agree_on_the_gpus_a_plan_needs() -> None:
    from mpbind import matmul as pm

    result = plan(**FP8)
    pm._agree_on_capability(Scripted([90]), result, (9, 0))  # every GPU new enough
    group = Scripted([80], [75])
    with pytest.raises(ComputeCapabilityError, match=r"rank 1's GPU is 8\.0 \(sm_80\)"):
        pm._agree_on_capability(group, result, (9, 0))  # the first rank too old is named, on every rank
    assert group.sent == [[90]]


# --- the plan, built from the layer's objects (recorded by doubles: no library) ------------------


class Recorder:
    """Doubles of the layer's cuBLASMp objects that record what a planned matmul asks of them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.grids: list[tuple[Any, int, int, int]] = []
        self.matrices: list[dict[str, Any]] = []
        self.descriptors: list[dict[str, Any]] = []
        self.plans: list[tuple[Any, ...]] = []
        self.executed: list[dict[str, Any]] = []
        self.workspaces: list[Any] = []
        rec = self

        class Closing:
            closed = False
            serial = 1

            def close(self) -> None:
                self.closed = True

        class Matrix(Closing):
            def __init__(self, grid: Any, local: Any, shape: Any, block: Any, src: Any) -> None:
                self.grid, self.local, self.shape, self.block, self.src = grid, local, shape, block, src
                self.ptr = 0x1000 * (len(rec.matrices) + 1)
                self.descriptor = Closing()
                rec.matrices.append(dict(grid=grid, shape=tuple(local.shape), global_shape=shape, block=block,
                                         src=src))

            def operand(self) -> tuple[Any, ...]:
                return (self, 1, 1)

        class Descriptor(Closing):
            def __init__(self, compute: Any, **attributes: Any) -> None:
                object.__setattr__(self, "attributes", {"compute_type": compute, **attributes})
                object.__setattr__(self, "_core", self)
                rec.descriptors.append(self.attributes)

            def __setattr__(self, name: str, value: Any) -> None:
                self.attributes[name] = value

        class Plan(Closing):
            def __init__(self, *args: Any) -> None:
                rec.plans.append(args)

            def execute(self, stream: Any = None, **arrays: Any) -> None:
                rec.executed.append(arrays)

        class Workspace:
            def __init__(self, grid: Any, nbytes: int) -> None:
                self.grid, self.nbytes, self.served = grid, nbytes, []

            def serve(self, grids: list[Any]) -> None:
                self.served.append(list(grids))

        def shared_workspace(grid: Any, nbytes: int) -> Workspace:
            rec.workspaces.append(Workspace(grid, nbytes))
            return rec.workspaces[-1]

        def grid(comm: Any, nprow: int, npcol: int, layout: Any) -> tuple[Any, int, int, int]:
            rec.grids.append((comm, nprow, npcol, int(layout)))
            return rec.grids[-1]

        monkeypatch.setattr(cublasmp, "grid", grid)
        monkeypatch.setattr(cublasmp, "Matrix", Matrix)
        monkeypatch.setattr(cublasmp, "MatmulDescriptor", Descriptor)
        monkeypatch.setattr(cublasmp, "Handle", lambda stream: Closing())
        from mpbind import _core

        monkeypatch.setattr(_core.cublasmp, "MatmulPlan", Plan)
        monkeypatch.setattr(_core.cublasmp, "shared_workspace", shared_workspace)


class FakeComm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.device = rank, size, 0
        self.splits: list[tuple[int, int]] = []
        self.closed = False

    def split(self, color: int, key: int) -> FakeComm:
        self.splits.append((color, key))
        return FakeComm(0, 1)

    def close(self) -> None:
        self.closed = True


def build(p: MatmulPlan, rank: int, arrays: dict[str, Any], **extra: Any) -> Any:
    from mpbind.matmul import PlannedMatmul

    options: dict[str, Any] = dict(bias=None, aux=None, scales={}, handle=None, stream=None, algo_type=None,
                                   sm_count=None)
    options.update(extra)
    return PlannedMatmul._build(FakeComm(rank, p.nranks), p, {"c": None, **arrays}, **options)  # type: ignore[arg-type]


def test_allgather_gemm_is_built_on_the_guide_grids(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    p = planned("cols", "cols", "rows", True, dtype="bfloat16")
    arrays = {"a": np.zeros((K, M // 2)), "b": np.zeros((K, N // 2)), "d": np.zeros((M // 2, N))}
    with build(p, 1, arrays) as made:
        assert made.algorithm == "allgather_gemm" and "AllGather+GEMM" in made.explain()
        assert [g[1:] for g in rec.grids] == [(1, 2, int(GL.ROW_MAJOR)), (1, 2, int(GL.ROW_MAJOR)),
                                              (2, 1, int(GL.COL_MAJOR))]
        assert [(m["global_shape"], m["block"]) for m in rec.matrices] == [
            ((K, M), (K, M // 2)), ((K, N), (K, N // 2)), ((M, N), (M // 2, N // 2))]
        (attributes,) = rec.descriptors
        assert attributes["transa"] == cublasmp.CublasOperation.T and attributes["transb"] == cublasmp.CublasOperation.N
        assert attributes["epilogue"] == cublasmp.MatmulEpilogue.DEFAULT
        args = rec.plans[0]
        assert args[2:5] == (M, N, K)
        assert made.local_shapes == {"a": (K, M // 2), "b": (K, N // 2), "d": (M // 2, N)}
        made.execute(d=arrays["d"])
        assert rec.executed[-1] == {"a": None, "b": None, "c": None, "d": arrays["d"]}
        assert "allgather_gemm 12 x 8 x 16" in repr(made)
    assert made.closed and all(m.closed for m in made._core.parts if isinstance(m, cublasmp.Matrix))


def test_allreduce_d_is_described_as_a_wider_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    p = planned("rows", "rows", "rep", True)
    build(p, 0, {"a": np.zeros((K // 2, M)), "b": np.zeros((K // 2, N)), "d": np.zeros((M, N))})
    assert rec.matrices[2]["global_shape"] == (M, 2 * N) and rec.matrices[2]["block"] == (M, N)
    assert rec.descriptors[0]["epilogue"] == cublasmp.MatmulEpilogue.ALLREDUCE
    assert rec.plans[0][2:5] == (M, N, K)


def test_replicated_operands_are_sliced_at_plan_and_execute_time(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    p = planned("rows", "rep", "cols", True)  # GEMM+RS: B replicated hands over its k rows
    full_b = np.arange(K * N, dtype=float).reshape(K, N)
    made = build(p, 1, {"a": np.zeros((K // 2, M)), "b": full_b, "d": np.zeros((M, N // 2))})
    assert rec.matrices[1]["shape"] == (K // 2, N)
    new_b = full_b + 1
    made.execute(b=new_b)
    np.testing.assert_array_equal(rec.executed[-1]["b"], new_b[K // 2:])
    with pytest.raises(UsageError, match=r"b is replicated: the new array must be 16 x 8, not \(8, 8\)"):
        made.execute(b=np.zeros((8, 8)))


def test_local_plans_run_on_a_one_rank_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    p = planned("rows~", "rep", "rows~")
    assert p.algorithm == "local"
    made = build(p, 1, {"a": np.zeros((5, K)), "b": np.zeros((K, N)), "d": np.zeros((5, N))})
    assert [g[1:3] for g in rec.grids] == [(1, 1)] * 3 and rec.plans[0][2:5] == (5, N, K)
    made.close()
    assert [p for p in made._core.parts if isinstance(p, FakeComm)][-1].closed  # the per-rank communicator
    empty = planned("rows", "rep", "rows", p=4)
    rows = dist.Split.blocked((M, N), 4, 0, 4)  # (4, 4, 4, 0): the last rank computes nothing
    q = plan(a=dist.Split.blocked((M, K), 4, 0, 4), b=empty.b.distribution, d=rows, a_dtype="float32")
    idle = build(q, 3, {"a": np.zeros((0, K)), "b": np.zeros((K, N)), "d": np.zeros((0, N))})
    assert idle.matmul is None and idle.workspace_size == (0, 0)
    idle.execute()
    idle.capture()
    assert not idle.captured


def test_epilogue_pointers_reach_the_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    p = planned("cols", "cols", "rows", True, dtype="bfloat16", epilogue="gelu_aux_bias")
    bias = InterfaceArray((M // 2,), "<f4", ptr=0x5000)
    aux = InterfaceArray((8 * N,), "<f4", ptr=0x6000)
    build(p, 0, {"a": np.zeros((K, M // 2)), "b": np.zeros((K, N // 2)), "d": np.zeros((M // 2, N))}, bias=bias,
          aux=aux, algo_type=cublasmp.MatmulAlgoType.SPLIT_P2P, sm_count=8)
    attributes = rec.descriptors[0]
    assert attributes["epilogue"] == cublasmp.MatmulEpilogue.GELU_AUX_BIAS
    assert attributes["bias_pointer"] == 0x5000 and attributes["bias_data_type"] == cublasmp.CudaDataType.R_16BF
    assert attributes["epilogue_aux_pointer"] == 0x6000 and attributes["epilogue_aux_ld"] == 8
    assert attributes["algo_type"] == cublasmp.MatmulAlgoType.SPLIT_P2P
    assert attributes["communication_sm_count"] == 8
    assert "bias_result_scheme" not in attributes  # a bias read has no result to reduce
    assert "communication_type" not in attributes


def test_bias_gradients_and_communication_type_reach_the_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    p = planned("rows", "rows", "cols", True, dtype="bfloat16", epilogue="bgradb", communication_type="bfloat16")
    grad = InterfaceArray((N,), "<f4", ptr=0x7000)
    build(p, 0, {"a": np.zeros((K // 2, M)), "b": np.zeros((K // 2, N)), "d": np.zeros((M, N // 2))}, bias=grad)
    attributes = rec.descriptors[0]
    assert attributes["bias_result_scheme"] == cublasmp.ResultScheme.FULL  # the gradient comes out whole
    assert attributes["communication_type"] == cublasmp.CudaDataType.R_16BF


def test_uneven_plans_take_one_workspace_size_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpbind import matmul as pm

    rec = Recorder(monkeypatch)
    p = planned("cols~", "cols", "rows~", True)  # the AG+GEMM layout, uneven: general, pieces differ by rank
    assert p.algorithm == "general" and not p.uniform
    asked: list[tuple[Any, ...]] = []

    def device_bytes(handle: Any, descriptor: Any, operands: Any, mnk: Any, alpha: bytes, beta: bytes) -> int:
        asked.append((mnk, len(alpha), len(beta), sorted(operands)))
        return 100

    monkeypatch.setattr(pm, "_device_bytes", device_bytes)
    group = Scripted([300])
    monkeypatch.setattr(pm, "NCCLProcessGroup", lambda comm: group)
    rows = p.d.local_shape(0)[0]
    build(p, 0, {"a": np.zeros((K, rows)), "b": np.zeros((K, N // 2)), "d": np.zeros((rows, N))})
    assert asked == [((M, N, K), 4, 4, ["a", "b", "d"])]
    (workspace,) = rec.workspaces
    assert workspace.nbytes == 300  # the largest any rank needs
    assert workspace.grid == rec.matrices[2]["grid"]  # D's grid, where the plan looks for it
    assert workspace.served == [[m["grid"] for m in rec.matrices]]
    assert group.sent == [[100]]
    # Equal pieces on every rank: cuBLASMp asks the same everywhere, nothing is exchanged.
    monkeypatch.setattr(pm, "NCCLProcessGroup", lambda comm: pytest.fail("exchanged"))
    build(planned("cols", "cols", "rows", True), 0,
          {"a": np.zeros((K, M // 2)), "b": np.zeros((K, N // 2)), "d": np.zeros((M // 2, N))})
    assert len(asked) == 1 and len(rec.workspaces) == 1


def test_device_bytes_asks_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from mpbind import matmul as pm
    from mpbind.bindings import cublasmp as flat

    calls: list[tuple[Any, ...]] = []

    def buffer_size(*args: Any) -> tuple[int, int]:
        calls.append(args)
        return 4096, 16

    monkeypatch.setattr(flat, "matmul_buffer_size", buffer_size)
    matrix = {name: SimpleNamespace(ptr=ptr, descriptor=SimpleNamespace(ptr=ptr + 1))
              for name, ptr in (("a", 0x10), ("b", 0x20), ("d", 0x40))}
    got = pm._device_bytes(SimpleNamespace(ptr=7), SimpleNamespace(ptr=8), matrix, (3, 4, 5), b"\0" * 4, b"\0" * 4)
    (args,) = calls
    assert got == 4096 and args[:5] == (7, 8, 3, 4, 5)
    assert args[6:10] == (0x10, 1, 1, 0x11) and args[10:14] == (0x20, 1, 1, 0x21)
    assert args[15:19] == (0, 1, 1, 0) and args[19:] == (0x40, 1, 1, 0x41)  # no C
    assert args[14] == args[5] + 4  # beta right after alpha


def test_communication_settings_are_checked_and_agreed(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from mpbind import matmul as pm
    from mpbind import nccl

    assert pm._settings(cublasmp.MatmulAlgoType.SPLIT_P2P, 8) == (cublasmp.MatmulAlgoType.SPLIT_P2P, 8)
    assert pm._settings(1, None) == (cublasmp.MatmulAlgoType.SPLIT_P2P, None)
    with pytest.raises(UsageError, match="algo_type 99 is not a cublasmp.MatmulAlgoType"):
        pm._settings(99, None)
    with pytest.raises(TypeError, match="algo_type must be"):
        pm._settings("split", None)
    with pytest.raises(UsageError, match="communication_sm_count must be >= 1"):
        pm._settings(None, 0)
    with pytest.raises(TypeError, match="communication_sm_count must be an int"):
        pm._settings(None, 2.0)

    comm = nccl.Communicator.__new__(nccl.Communicator)
    object.__setattr__(comm, "_core", SimpleNamespace(rank=0, size=2, device=0))
    seen: list[tuple[int, BaseException | None]] = []

    def agree(group: Any, what: str, values: int, failure: BaseException | None, **kwargs: Any) -> None:
        seen.append((values, failure))
        raise RuntimeError("stop before building")

    monkeypatch.setattr(pm, "agree", agree)
    arrays = {"a": col_major((M // 2, K)), "b": col_major((K, N // 2)), "d": col_major((M // 2, N))}
    for options in ({}, {"communication_sm_count": 8}, {"communication_sm_count": 8},
                    {"algo_type": cublasmp.MatmulAlgoType.ATOMIC_P2P}, {"algo_type": 99}):
        with pytest.raises(RuntimeError, match="stop before building"):
            matmul.plan(comm, arrays["a"], arrays["b"], arrays["d"], a_dist=BASE["a"], b_dist=BASE["b"],
                                 d_dist=BASE["d"], **options)
    prints = [f for f, _ in seen]
    assert prints[1] == prints[2] and len({prints[0], prints[1], prints[3]}) == 3  # the settings are agreed on
    assert [type(e).__name__ for _, e in seen] == ["NoneType"] * 4 + ["UsageError"]  # refused before a collective


def test_fp8_scales_reach_the_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    p = plan(**{**FP8, "d_dtype": "float8_e4m3fn", "scales": {"a", "b", "d", "amax_d"}})
    names = ("a", "b", "d", "amax_d")
    scales = {name: InterfaceArray((1,), "<f4", ptr=0x100 * (i + 1)) for i, name in enumerate(names)}
    build(p, 0, {"a": np.zeros((32, 32)), "b": np.zeros((32, 16)), "d": np.zeros((32, 32))}, scales=scales)
    attributes = rec.descriptors[0]
    assert (attributes["a_scale_pointer"], attributes["b_scale_pointer"], attributes["d_scale_pointer"],
            attributes["amax_d_pointer"]) == (0x100, 0x200, 0x300, 0x400)
    assert attributes["a_scale_mode"] == cublasmp.MatmulMatrixScale.SCALAR_FP32
    assert attributes["compute_type"] == CT.COMPUTE_32F
