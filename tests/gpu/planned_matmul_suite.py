"""Matmuls planned from distributions (``mpbind.matmul.plan``) on 2 or 4 ranks, one GPU each,
every result compared with torch on the gathered operands.

    mpirun -np N python tests/gpu/planned_matmul_suite.py

All ranks build the same seeded global matrices, hand the plan their local pieces as the
distributions say (column-major device tensors), gather D over MPI and compare it with
``op(A) op(B)`` of the gathered global operands in float64 (then alpha, beta C and the epilogue).
Each check also asserts the algorithm the plan chose. Each rank reports one line per check and a
summary (``rank k``; tests/gpu/runner.py).

Covered: AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce, local and general plans (SUMMA on a
shared grid, 1-D layouts with no tensor-parallel pattern, uneven splits), bf16/fp32/fp64 and FP8,
replicated operands handed over as views, C with beta, bias/GELU/ReLU epilogues, reuse on new
arrays, ``capture()`` replayed on new values, and refusals raised on every rank alike (a wrong
local array on one rank, block scaling on a GPU below sm_100) without a hang.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from rank_per_gpu import rank_per_gpu  # noqa: E402
from runner import Check, Checks, Report, Skip, main  # noqa: E402

from mpbind import cublasmp, matmul, nccl  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

SEED = 2024
TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
# max |error| / max |reference| allowed per output type (fp32: full fp32 compute, not TF32)
TOLERANCE = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 2e-5, torch.float64: 1e-12}


class Ctx:
    def __init__(self, world: Any, comm: nccl.Communicator, handle: cublasmp.Handle, stream: Any) -> None:
        self.world = world
        self.comm = comm
        self.handle = handle
        self.stream = stream
        self.rank = comm.rank
        self.size = comm.size


def whole(shape: tuple[int, int], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The same global matrix on every rank, rounded to `dtype`, kept in float64 on the host."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
    if dtype != torch.float64:
        values = values.to(torch.float32).to(dtype)  # (float8 converts from float32)
    return values.to(torch.float64)


def index_sets(d: dist.Distribution, rank: int) -> tuple[list[int], list[int]]:
    """The global rows and columns of `rank`'s piece, in local order."""
    if isinstance(d, dist.BlockCyclic):
        args = d.to_block_cyclic()
        prow, pcol = args.coords(rank)
        rows = [i for i in range(d.shape[0]) if (i // args.mb + args.rsrc) % args.nprow == prow]
        cols = [j for j in range(d.shape[1]) if (j // args.nb + args.csrc) % args.npcol == pcol]
        return rows, cols
    box = d.box(rank)
    return list(range(box.lower[0], box.upper[0])), list(range(box.lower[1], box.upper[1]))


def local(d: dist.Distribution, full: torch.Tensor, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """`rank`'s piece of `full` as a column-major device tensor."""
    rows, cols = index_sets(d, rank)
    piece = full[rows][:, cols]
    piece = piece.to(dtype) if dtype == torch.float64 else piece.to(torch.float32).to(dtype)
    return piece.t().contiguous().to("cuda").t()


def empty_local(d: dist.Distribution, rank: int, dtype: torch.dtype) -> torch.Tensor:
    rows, cols = d.local_shape(rank)
    return torch.full((cols, rows), float("nan"), dtype=dtype, device="cuda").t()


def gathered(ctx: Ctx, d: dist.Distribution, piece: torch.Tensor) -> torch.Tensor:
    """The global float64 matrix assembled from every rank's piece (replicated: this rank's own,
    after checking that every rank holds the same)."""
    mine = piece.to(torch.float64).cpu().numpy()
    parts = ctx.world.allgather(mine)
    if d.replicated:
        for r, p in enumerate(parts):
            if not np.array_equal(p, mine, equal_nan=True):
                raise AssertionError(f"replicated D differs between rank {ctx.rank} and rank {r}")
        return torch.from_numpy(mine)
    out = np.full(d.shape, np.nan)
    for r, p in enumerate(parts):
        rows, cols = index_sets(d, r)
        if rows and cols:
            out[np.ix_(rows, cols)] = p
    return torch.from_numpy(out)


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> str:
    if torch.isnan(out).any():
        raise AssertionError(f"{what}: elements nobody wrote")
    scale = float(ref.abs().max()) or 1.0
    err = float((out - ref).abs().max()) / scale
    if err > TOLERANCE[dtype]:
        raise AssertionError(f"{what}: max |error| / max |ref| = {err:.3g} > {TOLERANCE[dtype]:g}")
    return f"relative error {err:.1e}"


def op(x: torch.Tensor, trans: bool) -> torch.Tensor:
    return x.t() if trans else x


def dists(ctx: Ctx, layout: str, m: int, n: int, k: int, transa: bool, transb: bool,
          uneven: bool = False) -> tuple[dist.Distribution, dist.Distribution, dist.Distribution]:
    """A, B, D distributions of one of the layouts by name."""
    p = ctx.size
    a_shape = (k, m) if transa else (m, k)
    b_shape = (n, k) if transb else (k, n)

    def split(shape: tuple[int, int], axis: int) -> dist.Distribution:
        if uneven:  # of NUMROC's form: a larger first part
            return dist.Split.blocked(shape, p, axis, shape[axis] // p + 8)
        return dist.Split(shape, p, axis)

    rep = dist.Replicated
    if layout == "ag":  # op(A) and D by rows, op(B) by columns
        return split(a_shape, 1 if transa else 0), split(b_shape, 0 if transb else 1), split((m, n), 0)
    if layout == "rs":  # op(A), op(B) along k, D by columns
        return split(a_shape, 0 if transa else 1), split(b_shape, 1 if transb else 0), split((m, n), 1)
    if layout == "ar":
        return split(a_shape, 0), split(b_shape, 0), rep((m, n), p)
    if layout == "local":  # rows of D from rows of A and all of B
        return split(a_shape, 1 if transa else 0), rep(b_shape, p), split((m, n), 0)
    if layout == "ag_rep_a":
        return rep(a_shape, p), split(b_shape, 0 if transb else 1), split((m, n), 0)
    if layout == "rows":  # no tensor-parallel pattern: general
        return split(a_shape, 0), split(b_shape, 0), split((m, n), 0)
    if layout == "bc":  # one 2-D block-cyclic grid: SUMMA
        grid = (2, p // 2)
        return (dist.BlockCyclic(a_shape, grid, (16, 16)), dist.BlockCyclic(b_shape, grid, (16, 16)),
                dist.BlockCyclic((m, n), grid, (16, 16)))
    raise AssertionError(layout)


def planned_matmul(ctx: Ctx, layout: str, type_name: str, expected: str, *, transa: bool = False,
                   transb: bool = False, uneven: bool = False, with_c: bool = False, epilogue: str | None = None,
                   sizes: tuple[int, int, int] | None = None) -> str:
    """Plan, execute, check; then execute on new arrays and check again."""
    p, r = ctx.size, ctx.rank
    dtype = TYPES[type_name]
    m, n, k = sizes or (64 * p, 32 * p, 48 * p)
    da, db, dd = dists(ctx, layout, m, n, k, transa, transb, uneven)
    A, B = whole(da.shape, SEED, dtype), whole(db.shape, SEED + 1, dtype)
    a, b, d = local(da, A, r, dtype), local(db, B, r, dtype), empty_local(dd, r, dtype)
    options: dict[str, Any] = {}
    Cm = None
    if with_c:
        Cm = whole((m, n), SEED + 2, dtype)
        options.update(c=local(dd, Cm, r, dtype), c_dist=dd, alpha=1.5, beta=-0.5)
    bias = None
    if epilogue is not None:
        bias_full = whole((m, 1), SEED + 3, dtype)[:, 0]
        rows, _ = index_sets(dd, r) if not dd.replicated else (list(range(m)), None)
        bias = bias_full[rows].to(dtype).to("cuda")
        options.update(epilogue=epilogue, bias=bias)
    plan = matmul.plan(ctx.comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, transa=transa, transb=transb,
                                handle=ctx.handle, **options)
    if plan.algorithm != expected:
        raise AssertionError(f"planned {plan.algorithm}, expected {expected}:\n{plan.explain()}")

    def reference(a_full: torch.Tensor, b_full: torch.Tensor) -> torch.Tensor:
        ref = op(a_full, transa) @ op(b_full, transb)
        if Cm is not None:
            ref = 1.5 * ref - 0.5 * Cm
        if epilogue is not None:
            ref = ref + bias_full[:, None]
            if epilogue.startswith("gelu"):
                ref = torch.nn.functional.gelu(ref, approximate="tanh")
            elif epilogue.startswith("relu"):
                ref = torch.relu(ref)
        return ref

    with plan:
        plan.execute()
        torch.cuda.synchronize()
        first = compare(gathered(ctx, dd, d), reference(A, B), dtype, "first run")
        # Reuse: new arrays of the planned shapes, no re-planning.
        A2, B2 = whole(da.shape, SEED + 10, dtype), whole(db.shape, SEED + 11, dtype)
        a2, b2, d2 = local(da, A2, r, dtype), local(db, B2, r, dtype), empty_local(dd, r, dtype)
        plan.execute(a2, b2, d2)
        torch.cuda.synchronize()
        again = compare(gathered(ctx, dd, d2), reference(A2, B2), dtype, "new arrays")
    return f"{plan.algorithm}: {first}; new arrays: {again}"


def captured(ctx: Ctx, layout: str, type_name: str, expected: str, transa: bool = False,
             algo_type: cublasmp.MatmulAlgoType | None = None) -> str:
    """capture(), then new values written into the planned arrays, replayed three times."""
    p, r = ctx.size, ctx.rank
    dtype = TYPES[type_name]
    m, n, k = 64 * p, 32 * p, 48 * p
    da, db, dd = dists(ctx, layout, m, n, k, transa, False)
    a = local(da, whole(da.shape, SEED, dtype), r, dtype)
    b = local(db, whole(db.shape, SEED + 1, dtype), r, dtype)
    d = empty_local(dd, r, dtype)
    with matmul.plan(ctx.comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, transa=transa,
                              handle=ctx.handle, algo_type=algo_type) as plan:
        if plan.algorithm != expected:
            raise AssertionError(f"planned {plan.algorithm}, expected {expected}")
        plan.capture(ctx.stream)
        results = []
        for step in range(3):
            A, B = whole(da.shape, SEED + 20 + step, dtype), whole(db.shape, SEED + 30 + step, dtype)
            with torch.cuda.stream(ctx.stream):
                a.copy_(local(da, A, r, dtype))
                b.copy_(local(db, B, r, dtype))
                d.fill_(float("nan"))
            plan.execute()
            torch.cuda.synchronize()
            results.append(compare(gathered(ctx, dd, d), op(A, transa) @ B, dtype, f"replay {step}"))
        try:
            plan.execute(a=a)
        except UsageError:
            pass
        else:
            raise AssertionError("a captured plan took new arrays")
    return "; ".join(results)


def overlapped_capture_refused(ctx: Ctx, layout: str, expected: str) -> str:
    """The overlapped algorithms do not replay from a graph: capture() refuses them, on every rank."""
    p, r = ctx.size, ctx.rank
    m, n, k = 64 * p, 32 * p, 48 * p
    da, db, dd = dists(ctx, layout, m, n, k, True, False)
    a = local(da, whole(da.shape, SEED, torch.float32), r, torch.float32)
    b = local(db, whole(db.shape, SEED + 1, torch.float32), r, torch.float32)
    d = empty_local(dd, r, torch.float32)
    with matmul.plan(ctx.comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, transa=True,
                              handle=ctx.handle) as plan:
        if plan.algorithm != expected:
            raise AssertionError(f"planned {plan.algorithm}, expected {expected}")
        try:
            plan.capture(ctx.stream)
        except UsageError as exc:
            if plan.captured:
                raise AssertionError("refused, yet captured") from exc
            return str(exc)
    raise AssertionError("an overlapped plan was captured")


def fp8(ctx: Ctx) -> str:
    """FP8 e4m3 x e4m3 -> bf16 with per-tensor scales, AllGather+GEMM layout, against float64."""
    if torch.cuda.get_device_capability() < (8, 9):
        raise Skip("FP8 needs compute capability 8.9")
    p, r = ctx.size, ctx.rank
    m, n, k = 64 * p, 32 * p, 96
    da, db, dd = dists(ctx, "ag", m, n, k, True, False)
    f8 = torch.float8_e4m3fn
    A, B = whole(da.shape, SEED, f8), whole(db.shape, SEED + 1, f8)
    a, b = local(da, A, r, f8), local(db, B, r, f8)
    d = empty_local(dd, r, torch.bfloat16)
    sa = torch.tensor([0.5], device="cuda")
    sb = torch.tensor([2.0], device="cuda")
    with matmul.plan(ctx.comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, transa=True,
                              scales={"a": sa, "b": sb}, handle=ctx.handle) as plan:
        if plan.algorithm != "allgather_gemm":
            raise AssertionError(plan.explain())
        plan.execute()
        torch.cuda.synchronize()
        return compare(gathered(ctx, dd, d), A.t() @ B, torch.bfloat16, "fp8")


def uneven_allreduce_refused(ctx: Ctx) -> str:
    """A replicated D from uneven k: refused at planning (cuBLASMp's GEMM+AllReduce needs equal parts)."""
    p, r = ctx.size, ctx.rank
    m, n, k = 64 * p, 32 * p, 48 * p
    da, db, dd = dists(ctx, "ar", m, n, k, True, False, uneven=True)
    a = local(da, whole(da.shape, SEED, torch.float32), r, torch.float32)
    b = local(db, whole(db.shape, SEED + 1, torch.float32), r, torch.float32)
    d = empty_local(dd, r, torch.float32)
    try:
        matmul.plan(ctx.comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, transa=True, handle=ctx.handle)
    except UsageError as exc:
        return str(exc)
    raise AssertionError("uneven k with a replicated D was planned")


def refused_everywhere(ctx: Ctx) -> str:
    """A wrong local array on the last rank only: every rank raises, none hangs in a collective."""
    p, r = ctx.size, ctx.rank
    m, n, k = 32 * p, 16 * p, 32
    da, db, dd = dists(ctx, "ag", m, n, k, True, False)
    a = local(da, whole(da.shape, SEED, torch.float32), r, torch.float32)
    b = local(db, whole(db.shape, SEED + 1, torch.float32), r, torch.float32)
    rows, cols = dd.local_shape(r)
    d = empty_local(dd, r, torch.float32) if r != p - 1 else torch.zeros((cols, rows + 1), device="cuda").t()
    try:
        matmul.plan(ctx.comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, transa=True, handle=ctx.handle)
    except UsageError as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("the plan was not refused")


def block_scaling_below_sm100(ctx: Ctx) -> str:
    if torch.cuda.get_device_capability() >= (10, 0):
        raise Skip("this GPU has block scaling")
    p, r = ctx.size, ctx.rank
    m, n, k = 128 * p, 128 * p, 128
    da, db, dd = dists(ctx, "ag", m, n, k, True, False)
    f8 = torch.float8_e4m3fn
    a = local(da, whole(da.shape, SEED, torch.float32), r, f8)
    b = local(db, whole(db.shape, SEED, torch.float32), r, f8)
    d = empty_local(dd, r, torch.bfloat16)
    scale_a = torch.zeros(128 * ((m // p + 127) // 128) * 4, dtype=torch.uint8, device="cuda")
    scale_b = torch.zeros(128 * ((n // p + 127) // 128) * 4, dtype=torch.uint8, device="cuda")
    try:
        matmul.plan(ctx.comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, transa=True, scaling="mxfp8",
                             scales={"a": scale_a, "b": scale_b}, handle=ctx.handle)
    except matmul.ComputeCapabilityError as exc:
        if "10.0" not in str(exc):
            raise
        return str(exc)
    raise AssertionError("MXFP8 was planned below sm_100")


CHECKS = Checks()


@CHECKS.cases
def checks(ctx: Ctx) -> Iterator[Check]:
    for t in ("bf16", "fp32"):
        yield (f"planned.allgather_gemm.TN.{t}", functools.partial(planned_matmul, ctx, "ag", t, "allgather_gemm",
                                                                   transa=True))
        yield (f"planned.gemm_reducescatter.TN.{t}",
               functools.partial(planned_matmul, ctx, "rs", t, "gemm_reducescatter", transa=True))
        yield (f"planned.gemm_allreduce.TN.{t}",
               functools.partial(planned_matmul, ctx, "ar", t, "gemm_allreduce", transa=True))
    yield ("planned.allgather_gemm.NN.fp16", functools.partial(planned_matmul, ctx, "ag", "fp16", "allgather_gemm"))
    yield ("planned.gemm_reducescatter.NN.fp32",
           functools.partial(planned_matmul, ctx, "rs", "fp32", "gemm_reducescatter"))
    yield ("planned.allgather_gemm.replicated_a.bf16",
           functools.partial(planned_matmul, ctx, "ag_rep_a", "bf16", "allgather_gemm"))
    yield ("planned.local.fp64", functools.partial(planned_matmul, ctx, "local", "fp64", "local"))
    yield ("planned.general.rows.fp64", functools.partial(planned_matmul, ctx, "rows", "fp64", "general"))
    yield ("planned.general.summa.fp64", functools.partial(planned_matmul, ctx, "bc", "fp64", "general",
                                                           sizes=(100, 72, 84)))
    yield ("planned.general.uneven_ag.bf16", functools.partial(planned_matmul, ctx, "ag", "bf16", "general",
                                                               transa=True, uneven=True))
    yield ("planned.general.uneven_rs.fp32", functools.partial(planned_matmul, ctx, "rs", "fp32", "general",
                                                               transa=True, uneven=True))
    yield ("planned.gemm_allreduce.uneven.refused", functools.partial(uneven_allreduce_refused, ctx))
    yield ("planned.c_beta.gemm_reducescatter.fp64",
           functools.partial(planned_matmul, ctx, "rs", "fp64", "gemm_reducescatter", transa=True, with_c=True))
    yield ("planned.c_beta.allgather_gemm.fp32",
           functools.partial(planned_matmul, ctx, "ag", "fp32", "allgather_gemm", transa=True, with_c=True))
    yield ("planned.epilogue.gelu_bias.allgather_gemm.bf16",
           functools.partial(planned_matmul, ctx, "ag", "bf16", "allgather_gemm", transa=True,
                             epilogue="gelu_bias"))
    yield ("planned.epilogue.relu_bias.gemm_reducescatter.fp32",
           functools.partial(planned_matmul, ctx, "rs", "fp32", "gemm_reducescatter", transa=True,
                             epilogue="relu_bias"))
    no_overlap = cublasmp.MatmulAlgoType.NO_OVERLAP
    yield ("planned.capture.allgather_gemm.no_overlap.bf16",
           functools.partial(captured, ctx, "ag", "bf16", "allgather_gemm", transa=True, algo_type=no_overlap))
    yield ("planned.capture.gemm_reducescatter.no_overlap.fp32",
           functools.partial(captured, ctx, "rs", "fp32", "gemm_reducescatter", transa=True, algo_type=no_overlap))
    yield ("planned.capture.gemm_allreduce.fp32",
           functools.partial(captured, ctx, "ar", "fp32", "gemm_allreduce", transa=True))
    for layout, expected in (("ag", "allgather_gemm"), ("rs", "gemm_reducescatter")):
        yield (f"planned.capture.{expected}.refused",
               functools.partial(overlapped_capture_refused, ctx, layout, expected))
    yield ("planned.capture.general.fp64", functools.partial(captured, ctx, "rows", "fp64", "general"))
    yield ("planned.fp8.allgather_gemm", functools.partial(fp8, ctx))
    yield ("planned.refused_on_every_rank", functools.partial(refused_everywhere, ctx))
    yield ("planned.block_scaling_below_sm100", functools.partial(block_scaling_below_sm100, ctx))


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    with rank_per_gpu() as (world, comm, stream, handle):
        yield Ctx(world, comm, handle, stream)


if __name__ == "__main__":
    sys.exit(main(__doc__, started, CHECKS, timeout=540.0, who="rank"))
