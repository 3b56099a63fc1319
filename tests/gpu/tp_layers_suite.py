"""The tensor-parallel layers as the MLP example and the benchmarks run them, on 2 or 4 ranks, one
GPU each, every result compared with torch on the whole (seeded, the same on every rank) operands:

    mpirun -np N python tests/gpu/tp_layers_suite.py

In torch's row-major terms (weights as ``Linear`` keeps them, out x in), P ranks, M tokens:
all-gather+GEMM ``all_gather(x) @ w.T`` (x: M/P tokens, w: N/P output features) and
GEMM+reduce-scatter ``reduce_scatter(h @ w.T)`` (h and w: K/P input features), planned by
``mpbind.matmul.plan`` as TN matmuls of the transposes.

Checked: every communication setting the benchmarks explore gives the right result (algorithm hint x
SMs for communication x the type partial products travel in); a bias on GEMM+reduce-scatter is added
once, not once per rank; GELU and bias fused into all-gather+GEMM; FP8 (e4m3, per-tensor scales,
bf16 out) on both layers against ``torch._scaled_mm`` on the whole operands; uneven splits (general
plans whose workspace sizes differ between ranks) planned one after another, growing the shared
workspace, without a hang. Each rank reports one line per check and a summary (``rank k``;
tests/gpu/runner.py).
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

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rank_per_gpu import rank_per_gpu  # noqa: E402
from runner import Check, Checks, Report, Skip, main  # noqa: E402

from mpbind import cublasmp, matmul, nccl  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind.errors import CuBLASMpError  # noqa: E402

AT = cublasmp.MatmulAlgoType
TOLERANCE = 2e-2  # max |error| / max |reference|, bf16 results


class Ctx:
    def __init__(self, comm: nccl.Communicator, handle: cublasmp.Handle) -> None:
        self.comm, self.handle = comm, handle
        self.rank, self.size = comm.rank, comm.size


def whole(shape: tuple[int, int], seed: int, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> Any:
    """The same matrix on every rank."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype)


def check(got: Any, want: Any, what: str) -> str:
    if torch.isnan(got.float()).any():
        raise AssertionError(f"{what}: elements nobody wrote")
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    if not err <= TOLERANCE:
        raise AssertionError(f"{what}: max |error| / max |reference| = {err:.3g} > {TOLERANCE}")
    return f"{what}: relative error {err:.1e}"


def layouts(op: str, m: int, k: int, n: int, p: int) -> dict[str, dist.Distribution]:
    if op == "ag":  # A = w.T (k x n, its columns), B = x.T (k x m, its tokens), D = out.T (n x m, its rows)
        return dict(a_dist=dist.by_columns((k, n), p), b_dist=dist.by_columns((k, m), p),
                    d_dist=dist.by_rows((n, m), p))
    return dict(a_dist=dist.by_rows((k, n), p), b_dist=dist.by_rows((k, m), p), d_dist=dist.by_columns((n, m), p))


def operands(ctx: Ctx, op: str, m: int, k: int, n: int, dtype: torch.dtype = torch.bfloat16,
             seed: int = 11) -> tuple[Any, Any, Any, Any, Any]:
    """(x, w whole; this rank's x, w and an empty result) of one layer."""
    p, r = ctx.size, ctx.rank
    fp8 = dtype == torch.float8_e4m3fn
    x = whole((m, k), seed, dtype=dtype)
    w = whole((n, k), seed + 1, 1.0 if fp8 else k**-0.5, dtype=dtype)
    out_dtype = torch.bfloat16 if fp8 else dtype
    if op == "ag":
        mine = slice(r * m // p, (r + 1) * m // p), slice(r * n // p, (r + 1) * n // p)
        x_mine, w_mine = x[mine[0]].contiguous(), w[mine[1]].contiguous()
        out = torch.full((m, n // p), float("nan"), dtype=out_dtype, device="cuda")
    else:
        ks = slice(r * k // p, (r + 1) * k // p)
        x_mine, w_mine = x[:, ks].contiguous(), w[:, ks].contiguous()
        out = torch.full((m // p, n), float("nan"), dtype=out_dtype, device="cuda")
    return x, w, x_mine, w_mine, out


def mine(ctx: Ctx, op: str, y: Any) -> Any:
    """This rank's part of a whole result y (M x N)."""
    p, r = ctx.size, ctx.rank
    if op == "ag":
        return y[:, r * y.shape[1] // p:(r + 1) * y.shape[1] // p]
    return y[r * y.shape[0] // p:(r + 1) * y.shape[0] // p]


def settings_give_the_right_result(ctx: Ctx, op: str) -> str:
    p = ctx.size
    m, k, n = 256 * p, 512 * p, 384 * p
    x, w, x_mine, w_mine, out = operands(ctx, op, m, k, n)
    want = mine(ctx, op, x @ w.t())
    notes: list[str] = []
    refused: list[str] = []
    types = (None, "bfloat16") if op == "rs" else (None,)
    for algo in (None, AT.SPLIT_P2P, AT.ATOMIC_P2P, AT.NO_OVERLAP):
        for sms in (None, 8):
            for kind in types:
                options = {key: v for key, v in (("algo_type", algo), ("communication_sm_count", sms),
                                                 ("communication_type", kind)) if v is not None}
                out.fill_(float("nan"))
                try:
                    with matmul.plan(ctx.comm, w_mine.T, x_mine.T, out.T, transa=True, handle=ctx.handle,
                                              **layouts(op, m, k, n, p), **options) as planned:
                        planned.execute()
                        torch.cuda.synchronize()
                except CuBLASMpError as exc:  # refused is fine (the benchmarks skip it); wrong is not
                    refused.append(f"{options}: {exc.status}")
                    continue
                notes.append(check(out, want, str(options or "default")))
    return f"{len(notes)} settings right, {len(refused)} refused {refused}; " + "; ".join(notes[-2:])


def bias_on_reduce_scatter_is_added_once(ctx: Ctx) -> str:
    p = ctx.size
    m, k, n = 128 * p, 256 * p, 192
    x, w, x_mine, w_mine, out = operands(ctx, "rs", m, k, n)
    bias = whole((1, n), 5, 0.5)[0].contiguous()  # along D's rows (n): every rank holds all of it
    with matmul.plan(ctx.comm, w_mine.T, x_mine.T, out.T, transa=True, epilogue="bias", bias=bias,
                              handle=ctx.handle, **layouts("rs", m, k, n, p)) as planned:
        planned.execute()
        torch.cuda.synchronize()
    once = mine(ctx, "rs", x @ w.t() + bias)
    if p > 1:
        per_rank = mine(ctx, "rs", x @ w.t() + p * bias)
        err = float((out.float() - per_rank.float()).abs().max() / per_rank.float().abs().max())
        if err < 1e-3:
            raise AssertionError(f"the bias was added on every rank ({p} times): cuBLASMp adds it to each partial "
                                 "product of GEMM+ReduceScatter; the plan must hand it to one rank only")
    return check(out, once, "bias added once")


def gelu_bias_on_allgather(ctx: Ctx) -> str:
    p = ctx.size
    m, k, n = 128 * p, 256, 256 * p
    x, w, x_mine, w_mine, out = operands(ctx, "ag", m, k, n)
    bias = whole((1, n), 6, 0.5)[0]
    bias_mine = bias[ctx.rank * n // p:(ctx.rank + 1) * n // p].contiguous()
    with matmul.plan(ctx.comm, w_mine.T, x_mine.T, out.T, transa=True, epilogue="gelu_bias",
                              bias=bias_mine, handle=ctx.handle, **layouts("ag", m, k, n, p)) as planned:
        planned.execute()
        torch.cuda.synchronize()
    return check(out, mine(ctx, "ag", F.gelu(F.linear(x, w, bias), approximate="tanh")), "GELU(x w.T + b)")


def fp8_against_scaled_mm(ctx: Ctx, op: str) -> str:
    if torch.cuda.get_device_capability() < (8, 9):
        raise Skip("FP8 needs compute capability 8.9")
    p = ctx.size
    m, k, n = 128 * p, 256 * p, 128 * p
    f8 = torch.float8_e4m3fn
    x, w, x_mine, w_mine, out = operands(ctx, op, m, k, n, f8)
    sx, sw = torch.tensor([0.5], device="cuda"), torch.tensor([k**-0.5], device="cuda")
    with matmul.plan(ctx.comm, w_mine.T, x_mine.T, out.T, transa=True, scales={"a": sw, "b": sx},
                              handle=ctx.handle, **layouts(op, m, k, n, p)) as planned:
        planned.execute()
        torch.cuda.synchronize()
    want = torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
    return check(out, mine(ctx, op, want), f"FP8 {op} against torch._scaled_mm")


def uneven_plans_one_after_another(ctx: Ctx) -> str:
    """The all-gather+GEMM layout with uneven parts (general plans whose ranks need different
    workspaces), growing sizes: every plan takes the shared workspace at one size on every rank."""
    p, r = ctx.size, ctx.rank
    notes = []
    for m, k, n in ((48 * p + 8, 64, 40 * p + 8), (96 * p + 8, 128, 80 * p + 8), (192 * p + 8, 256, 160 * p + 8)):
        a_dist = dist.Split.blocked((k, n), p, 1, n // p + 8)
        b_dist = dist.Split.blocked((k, m), p, 1, m // p + 8)
        d_dist = dist.Split.blocked((n, m), p, 0, n // p + 8)
        x, w = whole((m, k), 21), whole((n, k), 22, k**-0.5)
        xs, ws = b_dist.box(r), a_dist.box(r)
        x_mine = x[xs.lower[1]:xs.upper[1]].contiguous()
        w_mine = w[ws.lower[1]:ws.upper[1]].contiguous()
        rows = d_dist.box(r)
        out = torch.full((m, rows.upper[0] - rows.lower[0]), float("nan"), dtype=torch.bfloat16, device="cuda")
        with matmul.plan(ctx.comm, w_mine.T, x_mine.T, out.T, transa=True, handle=ctx.handle,
                                  a_dist=a_dist, b_dist=b_dist, d_dist=d_dist) as planned:
            if planned.algorithm != "general" or planned.plan.uniform:
                raise AssertionError(planned.explain())
            planned.execute()
            torch.cuda.synchronize()
            notes.append(check(out, (x @ w.t())[:, rows.lower[0]:rows.upper[0]], f"{m} x {n} x {k}"))
    return "; ".join(notes)


CHECKS = Checks()


@CHECKS.cases
def checks(ctx: Ctx) -> Iterator[Check]:
    yield "tp.settings.allgather_gemm", functools.partial(settings_give_the_right_result, ctx, "ag")
    yield "tp.settings.gemm_reducescatter", functools.partial(settings_give_the_right_result, ctx, "rs")
    yield "tp.bias_once.gemm_reducescatter", functools.partial(bias_on_reduce_scatter_is_added_once, ctx)
    yield "tp.gelu_bias.allgather_gemm", functools.partial(gelu_bias_on_allgather, ctx)
    yield "tp.fp8.allgather_gemm", functools.partial(fp8_against_scaled_mm, ctx, "ag")
    yield "tp.fp8.gemm_reducescatter", functools.partial(fp8_against_scaled_mm, ctx, "rs")
    yield "tp.uneven_workspaces", functools.partial(uneven_plans_one_after_another, ctx)


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    with rank_per_gpu() as (_, comm, _, handle):
        yield Ctx(comm, handle)


if __name__ == "__main__":
    sys.exit(main(__doc__, started, CHECKS, timeout=540.0, who="rank"))
