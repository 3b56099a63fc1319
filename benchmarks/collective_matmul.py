"""The collective matmul ``out = all_gather(x, rows) @ w`` through mpbind (NVSHMEM ring, host-issued
and kernel-issued) against NCCL ``all_gather_into_tensor`` + ``torch.matmul``, cuBLASMp's
all-gather+GEMM through mpbind, and PyTorch's ``torch.ops.symm_mem.fused_all_gather_matmul``.

On two GPUs (cuBLASMp needs NCCL 2.29.2 or newer: preload it so that every library uses it)::

    mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x LD_PRELOAD=$NCCL_229/libnccl.so.2 \\
        -x PYTHONPATH python benchmarks/collective_matmul.py [--dtype float16] [--iters 50] [--out DIR]

Shapes (rows of x per GPU, K, columns of w per GPU): the JAX Pallas guide's (1024, 4096, 4096) and
(8192, 8192, 8192). Two figures per implementation, every result checked against the NCCL +
torch.matmul one first:

* aligned: the median of ``--iters`` CUDA-event timings of one call, after ``--warmup`` calls, the
  GPUs idle and the PEs aligned by a barrier before each (the host's time to issue the call counts);
* back to back: ``--iters`` calls queued without a wait between them, one event pair around all
  (time per call as in a model's forward pass, where the host runs ahead of the GPU).

Rows named ``part:`` time the pieces at that shape (this PE's GEMM alone, the GEMM of all gathered
rows, NCCL's all-gather alone, mpbind's host-issued ring with no GEMM), to show what limits it.
PE 0 prints the table and writes ``collective_matmul.csv`` (and ``.png`` with matplotlib) under
``--out``; an implementation that cannot run here is reported with the reason and left out of the
plot.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import mpbind  # noqa: E402

mpbind.load_libraries("nvshmem")  # before torch maps its own NVSHMEM: ours is then the one copy in the process
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
from _torch_gpu import event_median_us, queued_us, relative_error, start_process_group  # noqa: E402

from mpbind import nvshmem  # noqa: E402
from mpbind.collective import AllGatherMatmul  # noqa: E402

SHAPES = ((1024, 4096, 4096), (8192, 8192, 8192))
Call = Callable[[], Any]


def nccl_then_matmul(x: Any, w: Any, p: int) -> Call:
    gathered = x.new_empty((p * x.shape[0], x.shape[1]))
    out = x.new_empty((p * x.shape[0], w.shape[1]))

    def call() -> Any:
        dist.all_gather_into_tensor(gathered, x)
        return torch.matmul(gathered, w, out=out)
    return call


def torch_fused(x: Any, w: Any) -> Call:
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD
    symm_mem.enable_symm_mem_for_group(group.group_name)

    def call() -> Any:
        return torch.ops.symm_mem.fused_all_gather_matmul(x, [w], gather_dim=0, group_name=group.group_name)[1][0]
    return call


def cublasmp_ag_gemm(x: Any, w: Any, p: int, rank: int, stack: list[Any]) -> Call:
    """cuBLASMp TN all-gather+GEMM in its column-major terms: D (p*n x p*m) = A^T B with A = w^T split
    by columns, B = x^T split by columns (gathered), D = out^T split by rows."""
    from mpbind import bootstrap, cublasmp, nccl

    m, k = x.shape
    n = w.shape[1]
    comm = nccl.Communicator.init(p, rank, bootstrap.share_unique_id("nccl", MPI.COMM_WORLD))
    stream = torch.cuda.current_stream()
    handle = cublasmp.Handle(stream)
    row, col = cublasmp.grid(comm, 1, p, cublasmp.GridLayout.ROW_MAJOR), cublasmp.grid(comm, p, 1,
                                                                                       cublasmp.GridLayout.COL_MAJOR)
    wt = w.t().contiguous()
    out = x.new_empty((p * m, n))
    a = cublasmp.Matrix(row, wt.T, shape=(k, p * n), block=(k, n))
    b = cublasmp.Matrix(row, x.T, shape=(k, p * m), block=(k, m))
    d = cublasmp.Matrix(col, out.T, shape=(p * n, p * m), block=(n, m))
    plan = cublasmp.Matmul(handle, a, b, d, transa=True)
    stack.extend([plan, d, b, a, handle, comm])  # closed newest first

    def call() -> Any:
        plan.execute(stream)
        return out
    return call


def timings(fn: Call, a: argparse.Namespace, comm: Any) -> tuple[float, float]:
    """(aligned µs per call, back-to-back µs per call)."""
    aligned = event_median_us(fn, a.iters, a.warmup, comm)
    torch.cuda.synchronize()
    comm.Barrier()
    return aligned, queued_us(fn, a.iters)


def measure(shape: tuple[int, int, int], dtype: Any, a: argparse.Namespace, comm: Any) -> dict[str, Any]:
    m, k, n = shape
    p, rank = comm.Get_size(), comm.Get_rank()
    g = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    w = (torch.randn(k, n, generator=g, device="cuda") / k**0.5).to(dtype)
    results: dict[str, Any] = {}
    reference = nccl_then_matmul(x, w, p)
    want = reference().clone()
    results["nccl+torch.matmul"] = timings(reference, a, comm)
    stack: list[Any] = []
    plans: list[AllGatherMatmul] = []

    def ours(method: str) -> Call:
        plan = AllGatherMatmul(m, k, n, dtype, method=method)
        plans.append(plan)
        out = x.new_empty((p * m, n))
        return lambda: plan(x, w, out=out)

    candidates: dict[str, Callable[[], Call]] = {
        "mpbind host": lambda: ours("host"),
        "mpbind kernel": lambda: ours("kernel"),
        "cublasmp ag+gemm": lambda: cublasmp_ag_gemm(x, w, p, rank, stack),
        "torch fused_all_gather_matmul": lambda: torch_fused(x, w),
    }
    for name, make in candidates.items():
        outcome: str | None = None
        try:
            fn = make()
            got = fn()
            torch.cuda.synchronize()
            err = relative_error(got, want)
            if not err < 2e-2:
                outcome = f"wrong: relative error {err:.3g} against NCCL + torch.matmul"
        except Exception as exc:  # noqa: BLE001 - reported, and the others still run
            outcome = f"unavailable: {type(exc).__name__}: {exc}"[:200]
        # Every rank agrees before timing: a candidate that failed on one rank is skipped on all
        # (none waits in a collective the others left).
        if comm.allreduce(outcome is not None, op=MPI.LOR):
            results[name] = outcome or "unavailable: failed on another rank"
            continue
        results[name] = timings(fn, a, comm)
    gathered = x.new_empty((p * m, k))
    mine, everyone = x.new_empty((m, n)), x.new_empty((p * m, n))
    ring_only = AllGatherMatmul(m, k, n, dtype, method="host", gemm=lambda *_: None)
    plans.append(ring_only)
    parts: dict[str, Call] = {
        "part: torch.matmul of this PE's rows": lambda: torch.matmul(x, w, out=mine),
        "part: torch.matmul of all gathered rows": lambda: torch.matmul(gathered, w, out=everyone),
        "part: NCCL all_gather alone": lambda: dist.all_gather_into_tensor(gathered, x),
        "part: mpbind host ring alone (no GEMM)": lambda: ring_only(x, w, out=everyone),
    }
    for name, fn in parts.items():
        results[name] = timings(fn, a, comm)
    torch.cuda.synchronize()
    for plan in plans:
        plan.close()
    for obj in stack:
        obj.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    start_process_group(rank, p, port=29533)
    dtype = getattr(torch, a.dtype)
    rows = []
    with nvshmem.init(mpi_comm=comm, device=torch.cuda.current_device()):
        for shape in SHAPES:
            res = measure(shape, dtype, a, comm)
            base = res["nccl+torch.matmul"]
            for name, value in res.items():
                timed = isinstance(value, tuple)
                rows.append([f"{shape[0]}x{shape[1]}x{shape[2]}", shape[0], name,
                             value[0] if timed else value, value[0] / base[0] if timed else "",
                             value[1] if timed else "", value[1] / base[1] if timed else ""])
    dist.destroy_process_group()
    if rank == 0:
        header = ["shape (m/GPU x K x n/GPU)", "m_per_gpu", "implementation", "us", "vs nccl+matmul",
                  "us back to back", "vs nccl+matmul back to back"]
        print(f"{p} GPUs, {a.dtype}")
        print(_results.table(header, rows))
        _results.write_csv(a.out / "collective_matmul.csv", header, rows)
        aligned: dict[str, tuple[list[float], list[float]]] = {}
        queued: dict[str, tuple[list[float], list[float]]] = {}
        for _, m, name, us, _, b2b, _ in rows:
            if isinstance(us, float) and not name.startswith("part:"):
                for series, value in ((aligned, us), (queued, b2b)):
                    xs, ys = series.setdefault(name, ([], []))
                    xs.append(m)
                    ys.append(value)
        _results.plot(a.out / "collective_matmul.png", f"all_gather(x) @ w, {p} GPUs, {a.dtype}", "rows of x per GPU",
                      [("time per call, aligned (us)", aligned), ("time per call, back to back (us)", queued)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
