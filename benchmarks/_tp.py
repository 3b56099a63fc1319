"""What the tensor-parallel matmul benchmarks share (``tp_collective_matmul.py``, ``tp_square_matmul.py``,
``planned_matmul_host.py``): one rank per GPU under mpirun, the two tensor-parallel layers as planned
matmuls on torch tensors, GPU timing aligned across ranks, the communication settings a plan can be
given (and the search for the fastest), and which NCCL each library loaded.

The layers, in torch's row-major terms, P ranks, M tokens, weights as torch's ``Linear`` keeps them
(out_features x in_features):

* AllGather+GEMM: ``x`` (M/P x K, this rank's tokens) times ``w`` (N/P x K, this rank's output
  features): ``out = all_gather(x) @ w.T`` (M x N/P);
* GEMM+ReduceScatter: ``h`` (M x K/P, this rank's input features) times ``w`` (N x K/P):
  ``out = reduce_scatter(h @ w.T)`` (M/P x N, this rank's tokens).

cuBLASMp sees the transposes (a row-major ``t`` is the column-major ``t.T``): TN, A = ``w.T``,
B = ``x.T`` (or ``h.T``), D = ``out.T``, which is also what FP8 needs (K contiguous in A and B).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import _results  # noqa: E402
import torch  # noqa: E402
import torch.distributed  # noqa: E402
from _torch_gpu import event_median_us, mapped_nccl, relative_error, start_process_group  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpbind import cublasmp, matmul, nccl  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind._infra import loader as _loader  # noqa: E402

Call = Callable[[], Any]
FP8 = torch.float8_e4m3fn
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": FP8}
# What cuBLASMp's result may differ from torch's by (max |error| / max |reference|).
TOLERANCE = 2e-2


@dataclass
class Ranks:
    """This process's place: the MPI world, the NCCL communicator, one stream and cuBLASMp handle."""

    world: Any
    rank: int
    size: int
    comm: nccl.Communicator
    stream: Any
    handle: cublasmp.Handle
    group_name: str | None = None  # the torch.distributed group, when started

    def close(self) -> None:
        torch.cuda.synchronize()
        self.handle.close()
        self.comm.close()
        if self.group_name is not None:
            torch.distributed.destroy_process_group()


def start(world: Any = None, torch_group: bool = True, port: int = 29541) -> Ranks:
    """One rank per GPU of this node; torch's NCCL process group too (for the unfused anchors)."""
    world = MPI.COMM_WORLD if world is None else world
    local = world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    torch.cuda.set_device(local % torch.cuda.device_count())
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)  # torch and the plans run on one stream
    comm = nccl.Communicator.from_mpi(world)
    ranks = Ranks(world, world.Get_rank(), world.Get_size(), comm, stream, cublasmp.Handle(stream))
    if torch_group:
        start_process_group(ranks.rank, ranks.size, port)
        ranks.group_name = torch.distributed.group.WORLD.group_name
    return ranks


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """The options every tensor-parallel benchmark takes: timings, the settings search, where to write."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--search-iters", type=int, default=5, help="timings per setting while exploring")
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    return ap


# --- timing -----------------------------------------------------------------------------------------


def event_us(ranks: Ranks, fn: Call, iters: int, warmup: int) -> float:
    """Microseconds of one call: the median of `iters` CUDA-event timings, the ranks aligned by a
    barrier before each, after `warmup` calls; the slowest rank's median (the same on every rank)."""
    return float(ranks.world.allreduce(event_median_us(fn, iters, warmup, ranks.world), op=MPI.MAX))


# --- the communication settings of a plan --------------------------------------------------------------

AT = cublasmp.MatmulAlgoType
# Hints only: cuBLASMp falls back to its default where one does not apply. The multicast ones are
# left out: NVLink multicast stays off on these machines.
ALGOS = (None, AT.SPLIT_P2P, AT.ATOMIC_P2P)
SM_COUNTS = (None, 4, 8, 16, 32)


def settings(reduces: bool, d_dtype: str) -> Iterator[dict[str, Any]]:
    """Every combination explored: algorithm hint x SMs for communication (x the type partial
    products travel in, for a reduction), and the algorithm without overlap once."""
    types = (None, d_dtype) if reduces else (None,)
    for algo, sms, kind in itertools.product(ALGOS, SM_COUNTS, types):
        yield {k: v for k, v in (("algo_type", algo), ("communication_sm_count", sms),
                                 ("communication_type", kind)) if v is not None}
    yield {"algo_type": AT.NO_OVERLAP}


def describe(options: dict[str, Any]) -> str:
    if not options:
        return "default"
    parts = []
    if "algo_type" in options:
        parts.append(AT(options["algo_type"]).name)
    if "communication_sm_count" in options:
        parts.append(f"{options['communication_sm_count']} SMs")
    if "communication_type" in options:
        parts.append(f"sends {options['communication_type']}")
    return ", ".join(parts)


# --- the two layers ---------------------------------------------------------------------------------


@dataclass
class Layer:
    """One tensor-parallel layer's local operands, its unfused torch pair, its local GEMM alone, and
    how to plan it through mpbind with given settings."""

    op: str  # "ag" or "rs"
    dtype: str  # "bf16", "fp16", "fp8"
    m: int  # tokens, all ranks together
    k: int
    n: int
    ranks: Ranks
    tensors: dict[str, Any] = field(default_factory=dict)

    @property
    def d_dtype(self) -> str:
        return "float16" if self.dtype == "fp16" else "bfloat16"

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def plan(self, x: Any = None, **options: Any) -> matmul.PlannedMatmul:
        """The layer as a planned matmul (on `x` in place of this rank's x, when given)."""
        t, p = self.tensors, self.ranks.size
        m, k, n = self.m, self.k, self.n
        if self.op == "ag":
            dists = dict(a_dist=dist.by_columns((k, n), p), b_dist=dist.by_columns((k, m), p),
                         d_dist=dist.by_rows((n, m), p))
        else:
            dists = dict(a_dist=dist.by_rows((k, n), p), b_dist=dist.by_rows((k, m), p),
                         d_dist=dist.by_columns((n, m), p))
        if self.dtype == "fp8":
            options["scales"] = {"a": t["w_scale"], "b": t["x_scale"]}
        x = t["x"] if x is None else x
        options.setdefault("handle", self.ranks.handle)
        return matmul.plan(self.ranks.comm, t["w"].T, x.T, t["out"].T, transa=True, **dists, **options)

    def registered_x(self, keep: list[Any]) -> Any:
        """A copy of x in ncclMemAlloc memory registered on B's grid: cuBLASMp's AllGather+GEMM may
        gather B faster from there (NCCL symmetric memory). `keep` gets what to close, newest last."""
        x = self.tensors["x"]
        nbytes = x.numel() * x.element_size()
        buffer = nccl.mem_alloc(nbytes)
        keep.append(buffer)
        raw = torch.as_tensor(_Raw(buffer.ptr, nbytes), device="cuda")
        copy = raw.view(x.dtype).view(x.shape)
        copy.copy_(x)
        grid = cublasmp.grid(self.ranks.comm, 1, self.ranks.size, cublasmp.GridLayout.ROW_MAJOR)
        keep.append(grid.register(buffer.ptr, nbytes, buffer))  # collective: every rank, one size
        return copy

    def local_gemm(self) -> Call:
        """This rank's GEMM alone, on operands of the sizes it multiplies (the time with every
        byte of communication hidden)."""
        t = self.tensors
        x = t["x_full"] if self.op == "ag" else t["x"]
        return self._gemm(x, t["w"], t["partial"])

    def unfused(self) -> Call:
        """NCCL (through torch.distributed) and torch's GEMM, one after the other."""
        t = self.tensors
        import torch.distributed as td

        if self.op == "ag":
            gemm = self._gemm(t["x_full"], t["w"], t["partial"])
            whole, mine = (t["x_full"], t["x"]) if self.dtype != "fp8" else (t["x_full"].view(torch.uint8),
                                                                              t["x"].view(torch.uint8))

            def ag() -> Any:
                td.all_gather_into_tensor(whole, mine)
                return gemm()
            return ag
        gemm = self._gemm(t["x"], t["w"], t["partial"])

        def rs() -> Any:
            td.reduce_scatter_tensor(t["unfused_out"], gemm())
            return t["unfused_out"]
        return rs

    def torch_fused(self) -> Call:
        """PyTorch's symmetric-memory fused ops (multicast off), the anchors a PyTorch user picks."""
        if self.dtype == "fp8":
            raise NotImplementedError("the FP8 fused ops take other arguments; not measured")
        import torch.distributed._symmetric_memory as symm_mem

        name = self.ranks.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(name)
        t = self.tensors
        if self.op == "ag":
            return lambda: torch.ops.symm_mem.fused_all_gather_matmul(t["x"], [t["w"].t()], gather_dim=0,
                                                                      group_name=name)[1][0]
        return lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(t["x"], t["w"].t(), "sum", 0, name)

    def _gemm(self, x: Any, w: Any, out: Any) -> Call:
        if self.dtype == "fp8":
            t = self.tensors
            return lambda: torch._scaled_mm(x, w.t(), scale_a=t["x_scale"], scale_b=t["w_scale"],
                                            out_dtype=torch.bfloat16)
        return lambda: torch.matmul(x, w.t(), out=out)

    def reference(self) -> Any:
        """The layer's result at this rank from the unfused pair (its own buffer)."""
        out = self.unfused()()
        torch.cuda.synchronize()
        return out.clone()

    def result(self) -> Any:
        return self.tensors["out"]


class _Raw:
    """Bytes of device memory as a CUDA array (for torch.as_tensor)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def layer(ranks: Ranks, op: str, dtype: str, m: int, k: int, n: int, seed: int = 0) -> Layer:
    """The local operands of one layer at this rank (`m`, `k`, `n` global; split as the layer splits)."""
    p, r = ranks.size, ranks.rank
    g = torch.Generator(device="cuda").manual_seed(seed + 101 * r)
    store = DTYPES[dtype]
    out_dtype = torch.bfloat16 if dtype == "fp8" else store

    def random(*shape: int, scale: float = 1.0) -> Any:
        values = torch.randn(shape, generator=g, device="cuda")
        return (values * scale if dtype != "fp8" else values).to(store)

    fp8_scale = k**-0.5  # FP8 weights stay O(1); their per-tensor scale carries 1/sqrt(K)
    if op == "ag":
        x, w = random(m // p, k), random(n // p, k, scale=k**-0.5)
        tensors = dict(x=x, w=w, x_full=torch.empty((m, k), dtype=store, device="cuda"),
                       out=torch.empty((m, n // p), dtype=out_dtype, device="cuda"),
                       partial=torch.empty((m, n // p), dtype=out_dtype, device="cuda"))
    else:
        x, w = random(m, k // p), random(n, k // p, scale=k**-0.5)
        tensors = dict(x=x, w=w, out=torch.empty((m // p, n), dtype=out_dtype, device="cuda"),
                       unfused_out=torch.empty((m // p, n), dtype=out_dtype, device="cuda"),
                       partial=torch.empty((m, n), dtype=out_dtype, device="cuda"))
    if dtype == "fp8":
        tensors.update(x_scale=torch.ones(1, device="cuda"), w_scale=torch.full((1,), fp8_scale, device="cuda"))
    return Layer(op, dtype, m, k, n, ranks, tensors)


# --- the settings search ------------------------------------------------------------------------------


@dataclass
class Found:
    """A plan's time with each setting explored (µs, or the reason it could not run) and the best."""

    default_us: float
    best_us: float
    best: dict[str, Any]
    tried: list[tuple[str, float | str]]
    registered_us: float | str | None = None  # AllGather+GEMM, best settings, B in registered NCCL memory


def measured(lay: Layer, make: Callable[[], tuple[Call, Callable[[], Any] | None]], want: Any, iters: int,
             warmup: int) -> float | str:
    """Make a candidate (its call, and where its result lands: None for the call's return value),
    run it once and check the result against `want`, agree on every rank that it ran right, then
    time it; or say why not. The ranks agree before anything is timed, so that a candidate refused
    on one rank is skipped on all (none waits in a collective the others left)."""
    outcome: str | None = None
    fn: Call | None = None
    try:
        fn, where = make()
        got = fn()
        torch.cuda.synchronize()
        err = relative_error(got if where is None else where(), want)
        if not err <= TOLERANCE:
            outcome = f"wrong: relative error {err:.3g} against NCCL + torch"
    except Exception as exc:  # noqa: BLE001 - reported in the tables, the others still run
        outcome = f"{type(exc).__name__}: {exc}"[:160]
    if lay.ranks.world.allreduce(outcome is not None, op=MPI.LOR):
        return outcome or "failed on another rank"
    assert fn is not None
    return event_us(lay.ranks, fn, iters, warmup)


def plan_us(lay: Layer, options: dict[str, Any], want: Any, iters: int, warmup: int, x: Any = None) -> float | str:
    """The plan with `options` (on `x`, when given), checked, then timed (closed after)."""
    with contextlib.ExitStack() as stack:

        def make() -> tuple[Call, Callable[[], Any]]:
            planned = stack.enter_context(lay.plan(x=x, **options))
            lay.result().fill_(float("nan"))  # a plan that writes nothing is not taken for a right one
            return planned.execute, lay.result

        return measured(lay, make, want, iters, warmup)


def anchor_us(lay: Layer, make: Callable[[], Call], want: Any, iters: int, warmup: int) -> float | str:
    """An anchor's time, after checking its result (or why it could not run, agreed on every rank)."""
    return measured(lay, lambda: (make(), None), want, iters, warmup)


def explore(lay: Layer, want: Any, iters: int, warmup: int, search_iters: int) -> Found:
    """Time the plan with each setting (checked against `want` first), then the default and the
    fastest again with `iters` timings. Every rank tries the same settings in the same order."""
    tried: list[tuple[str, float | str]] = []
    best: tuple[float, dict[str, Any]] = (float("inf"), {})
    for options in settings(lay.op == "rs", lay.d_dtype):
        outcome = plan_us(lay, options, want, search_iters, 1)
        tried.append((describe(options), outcome))
        if isinstance(outcome, float) and outcome < best[0]:
            best = (outcome, options)
    default_us = plan_us(lay, {}, want, iters, warmup)
    if not isinstance(default_us, float):
        raise RuntimeError(f"the plan with cuBLASMp's defaults failed: {default_us}")
    best_us = plan_us(lay, best[1], want, iters, warmup) if best[1] else default_us
    if isinstance(best_us, float) and best_us < default_us:
        found = Found(default_us, best_us, best[1], tried)
    else:
        found = Found(default_us, default_us, {}, tried)
    if lay.op == "ag":
        found.registered_us = _with_registered_b(lay, found.best, want, iters, warmup)
    return found


def _with_registered_b(lay: Layer, options: dict[str, Any], want: Any, iters: int, warmup: int) -> float | str:
    keep: list[Any] = []
    try:
        x = lay.registered_x(keep)
    except Exception as exc:  # noqa: BLE001 - reported
        x, failure = None, f"{type(exc).__name__}: {exc}"[:160]
    if lay.ranks.world.allreduce(x is None, op=MPI.LOR):
        outcome: float | str = failure if x is None else "failed on another rank"
    else:
        outcome = plan_us(lay, options, want, iters, warmup, x=x)
    torch.cuda.synchronize()
    for obj in reversed(keep):  # the registration (collective, every rank) before its buffer
        obj.close()
    return outcome


# --- what the process loaded ------------------------------------------------------------------------


def nccl_report() -> dict[str, str]:
    """Which NCCL each side uses: mpbind's (version and path), torch's (its ncclGetVersion), and every
    libnccl mapped into the process."""
    try:
        version = torch.cuda.nccl.version()
        torch_nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception as exc:  # noqa: BLE001
        torch_nccl = f"unknown ({exc})"
    return {"mpbind": f"{_loader.loaded_version('nccl')} ({_loader.load('nccl').path})", "torch": torch_nccl,
            "mapped": mapped_nccl()}


def header(ranks: Ranks) -> str:
    report = nccl_report()
    return (f"{ranks.size} x {torch.cuda.get_device_name()}; torch {torch.__version__}; cuBLASMp "
            f"{_loader.loaded_version('cublasmp')}; NCCL: mpbind {report['mpbind']}, torch.distributed "
            f"{report['torch']}; libnccl mapped: {report['mapped']}")


def finish(ranks: Ranks, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str | None:
    """Close every rank's communicators and handle; rank 0 prints the header of its report and the
    table of `rows`, and gets that header (the others None)."""
    title = header(ranks)
    ranks.close()
    if ranks.rank != 0:
        return None
    print(title)
    print(_results.table(columns, rows))
    return title
