"""Multi-rank checks of the flat cuBLASMp bindings, every result compared with torch.

    mpirun -np N python tests/gpu/cublasmp_multirank.py

One rank per GPU (NCCL allows no more): rank r uses local GPU ``local_rank``. All ranks build
the same seeded global matrices, hand cuBLASMp their local parts, gather the distributed result
over MPI and compare it with ``torch.matmul`` of the gathered global operands (float64). Each
rank prints one line per check

    PASS name [rank k]            the check held (a note may follow a colon)
    FAIL name [rank k]: reason    it did not
    SKIP name [rank k]: reason    it cannot run here
    INFO name [rank k]: text      a recorded fact

and closes with ``rank=<k> passed=<p> failed=<f> skipped=<s>``; the exit status is 1 when
anything failed.

Layouts (ScaLAPACK 2-D block-cyclic, column-major local matrices; global element ``(i, j)``
lives on process row ``(i // mb) % nprow`` and column ``(j // nb) % npcol``). The two
tensor-parallel cases follow cuBLASMp's "Using cuBLASMp for Tensor Parallelism" layouts, TN
(``transa = T``, ``transb = N``), P ranks, D = op(A) B with A stored as ``k x m``:

* AllGather+GEMM: A (``k x m``) and B (``k x n``) are split by columns over a 1 x P
  row-major grid (blocks ``k x m/P`` and ``k x n/P``); D (``m x n``) is split by rows over a
  P x 1 column-major grid (``m/P`` rows each). B is gathered; each rank computes its rows of D.
* GEMM+ReduceScatter: A (``k x m``) and B (``k x n``) are split by rows (``k/P`` each) over a
  P x 1 column-major grid; D (``m x n``) is split by columns (``n/P`` each) over a 1 x P
  row-major grid. Each rank computes a partial ``m x n`` product; the sum is scattered.
* SUMMA: ``gemm`` on a 2-D grid (2 x 1 for two ranks, 2 x 2 for four) with small square blocks
  that do not divide the sizes, so distribution is cyclic with ragged edges.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import functools
import os
import sys
from dataclasses import dataclass, field
from typing import Any

# Before anything loads CUDA or NCCL in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402
from suite_report import Report  # noqa: E402

from mpbind.bindings import cublasmp, nccl  # noqa: E402

SEED = 4321
CO = cublasmp.CublasOperation
GL = cublasmp.GridLayout
MDA = cublasmp.MatmulDescriptorAttribute
NO_DESC = cublasmp.MatrixDescriptor(0)  # C not given (beta is 0): NULL pointer and descriptor


# --- outcomes ------------------------------------------------------------------------------


# --- distribution --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    """Where a global ``rows x cols`` matrix lives: block sizes and this rank's grid position."""

    rows: int
    cols: int
    mb: int
    nb: int
    nprow: int
    npcol: int
    prow: int
    pcol: int

    def local_rows(self) -> list[int]:
        return [i for i in range(self.rows) if (i // self.mb) % self.nprow == self.prow]

    def local_cols(self) -> list[int]:
        return [j for j in range(self.cols) if (j // self.nb) % self.npcol == self.pcol]

    @property
    def lld(self) -> int:
        return max(1, cublasmp.numroc(self.rows, self.mb, self.prow, 0, self.nprow))


def grid_position(rank: int, nprow: int, npcol: int, layout: cublasmp.GridLayout) -> tuple[int, int]:
    if layout == GL.COL_MAJOR:
        return rank % nprow, rank // nprow
    return rank // npcol, rank % npcol


def scatter(global_: Any, dist: Dist, dtype: Any) -> Any:
    """This rank's local part of `global_` as column-major device storage (shape ``(lc, lr)``)."""
    rows, cols = dist.local_rows(), dist.local_cols()
    assert len(rows) == cublasmp.numroc(dist.rows, dist.mb, dist.prow, 0, dist.nprow)
    assert len(cols) == cublasmp.numroc(dist.cols, dist.nb, dist.pcol, 0, dist.npcol)
    local = global_[rows][:, cols]
    return local.t().contiguous().to(device="cuda", dtype=dtype)


def gather(comm: Any, local_buf: Any, dist: Dist) -> Any:
    """The global float64 matrix assembled from every rank's column-major local part."""
    local = local_buf.t().to(torch.float64).cpu().numpy()
    parts = comm.allgather((dist.local_rows(), dist.local_cols(), local))
    out = np.full((dist.rows, dist.cols), np.nan)
    for rows, cols, values in parts:
        if rows and cols:
            out[np.ix_(rows, cols)] = values
    return torch.from_numpy(out)


def random_matrix(shape: tuple[int, int], seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1


def expect_close(out: Any, ref: Any, atol: float, rtol: float, what: str) -> str:
    if torch.isnan(out).any():
        raise AssertionError(f"{what}: the gathered result has elements nobody wrote")
    err = (out - ref).abs()
    if bool((err > atol + rtol * ref.abs()).any()):
        raise AssertionError(f"{what}: max |error| {float(err.max()):.3g} > atol {atol:g} + rtol {rtol:g} * |ref|")
    return f"max |error| {float(err.max()):.2e}"


# --- the rank's cuBLASMp state -------------------------------------------------------------


@dataclass
class Env:
    mpi: Any
    rank: int
    size: int
    comm: nccl.Comm
    handle: cublasmp.Handle
    stream: Any
    grids: dict[tuple[int, int, int], cublasmp.Grid] = field(default_factory=dict)

    def grid(self, nprow: int, npcol: int, layout: cublasmp.GridLayout) -> cublasmp.Grid:
        key = (nprow, npcol, int(layout))
        if key not in self.grids:
            self.grids[key] = cublasmp.grid_create(nprow, npcol, layout, self.comm)
        return self.grids[key]

    def sync(self) -> None:
        self.stream.synchronize()


def make_desc(stack: contextlib.ExitStack, dist: Dist, dtype: cublasmp.CudaDataType,
              grid: cublasmp.Grid) -> cublasmp.MatrixDescriptor:
    desc = cublasmp.matrix_descriptor_create(dist.rows, dist.cols, dist.mb, dist.nb, 0, 0, dist.lld, dtype, grid)
    stack.callback(cublasmp.matrix_descriptor_destroy, desc)
    return desc


def workspace(stack: contextlib.ExitStack, env: Env, grid: cublasmp.Grid,
              sizes: tuple[int, int]) -> tuple[int, int, Any, int]:
    device_bytes, host_bytes = sizes
    device = 0
    if device_bytes:
        device = cublasmp.malloc(grid, device_bytes)  # collective over the grid

        def release() -> None:
            env.sync()
            cublasmp.free(grid, device)

        stack.callback(release)
    host = np.zeros(max(1, host_bytes), dtype=np.uint8)
    return device, device_bytes, host, host_bytes


TYPES: dict[str, tuple[Any, cublasmp.CudaDataType, float, float]] = {
    # torch dtype, CUDA data type, atol, rtol (D rounded to the data type, fp32 accumulation)
    "bf16": (torch.bfloat16, cublasmp.CudaDataType.R_16BF, 3e-2, 1e-2),
    "fp16": (torch.float16, cublasmp.CudaDataType.R_16F, 8e-3, 2e-3),
}


def tp_matmul(env: Env, kind: str, type_name: str) -> str:
    """AllGather+GEMM (kind 'ag') or GEMM+ReduceScatter (kind 'rs'), TN, through cublasMpMatmul."""
    p, r = env.size, env.rank
    dtype, cuda_type, atol, rtol = TYPES[type_name]
    if kind == "ag":
        m, n, k = 64 * p, 32 * p, 96
    else:
        m, n, k = 96, 32 * p, 64 * p
    a_op = random_matrix((m, k), SEED).to(dtype).to(torch.float64)  # op(A) = A^T, rounded
    b = random_matrix((k, n), SEED + 1).to(dtype).to(torch.float64)
    a_stored = a_op.t()  # A, k x m
    row_grid = (1, p, GL.ROW_MAJOR)
    col_grid = (p, 1, GL.COL_MAJOR)
    if kind == "ag":
        dist_a = Dist(k, m, k, m // p, 1, p, 0, r)
        dist_b = Dist(k, n, k, n // p, 1, p, 0, r)
        dist_d = Dist(m, n, m // p, n // p, p, 1, r, 0)
        grid_ab, grid_d = env.grid(*row_grid), env.grid(*col_grid)
    else:
        dist_a = Dist(k, m, k // p, m, p, 1, r, 0)
        dist_b = Dist(k, n, k // p, n // p, p, 1, r, 0)
        dist_d = Dist(m, n, m, n // p, 1, p, 0, r)
        grid_ab, grid_d = env.grid(*col_grid), env.grid(*row_grid)
    with contextlib.ExitStack() as stack:
        a_buf = scatter(a_stored, dist_a, dtype)
        b_buf = scatter(b, dist_b, dtype)
        d_buf = scatter(torch.full((m, n), float("nan"), dtype=torch.float64), dist_d, dtype)
        desc_a = make_desc(stack, dist_a, cuda_type, grid_ab)
        desc_b = make_desc(stack, dist_b, cuda_type, grid_ab)
        desc_d = make_desc(stack, dist_d, cuda_type, grid_d)
        mm = cublasmp.matmul_descriptor_create(cublasmp.CublasComputeType.COMPUTE_32F)
        stack.callback(cublasmp.matmul_descriptor_destroy, mm)
        cublasmp.matmul_descriptor_set(mm, MDA.TRANSA, CO.T)
        cublasmp.matmul_descriptor_set(mm, MDA.TRANSB, CO.N)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        args = (env.handle, mm, m, n, k, ctypes.addressof(alpha), a_buf.data_ptr(), 1, 1, desc_a,
                b_buf.data_ptr(), 1, 1, desc_b, ctypes.addressof(beta), 0, 1, 1, NO_DESC, d_buf.data_ptr(), 1, 1,
                desc_d)
        device, device_bytes, host, host_bytes = workspace(stack, env, grid_d, cublasmp.matmul_buffer_size(*args))
        env.sync()
        cublasmp.matmul(*args, device, device_bytes, int(host.ctypes.data), host_bytes)
        env.sync()
        out = gather(env.mpi, d_buf, dist_d)
    got_a = gather(env.mpi, a_buf, dist_a)
    got_b = gather(env.mpi, b_buf, dist_b)
    if not (torch.equal(got_a, a_stored) and torch.equal(got_b, b)):
        raise AssertionError("the gathered operands differ from the global ones (distribution helper)")
    ref = torch.matmul(got_a.t(), got_b)
    return expect_close(out, ref, atol, rtol, f"{kind} {type_name}")


def summa_gemm(env: Env, dtype: Any, cuda_type: cublasmp.CudaDataType, transa: cublasmp.CublasOperation,
               atol: float, rtol: float) -> str:
    """C = alpha op(A) B + beta C with gemm on a 2-D block-cyclic grid."""
    p, r = env.size, env.rank
    nprow = 2
    npcol = p // nprow
    prow, pcol = grid_position(r, nprow, npcol, GL.COL_MAJOR)
    grid = env.grid(nprow, npcol, GL.COL_MAJOR)
    m, n, k, blk = 100, 72, 84, 16
    a_op = random_matrix((m, k), SEED + 10)
    a_stored = a_op if transa == CO.N else a_op.t()
    b = random_matrix((k, n), SEED + 11)
    c = random_matrix((m, n), SEED + 12)
    compute = (cublasmp.CublasComputeType.COMPUTE_64F if dtype == torch.float64
               else cublasmp.CublasComputeType.COMPUTE_32F)
    scalar = ctypes.c_double if dtype == torch.float64 else ctypes.c_float
    alpha, beta = scalar(1.25), scalar(-0.5)
    dist_a = Dist(a_stored.shape[0], a_stored.shape[1], blk, blk, nprow, npcol, prow, pcol)
    dist_b = Dist(k, n, blk, blk, nprow, npcol, prow, pcol)
    dist_c = Dist(m, n, blk, blk, nprow, npcol, prow, pcol)
    with contextlib.ExitStack() as stack:
        a_buf = scatter(a_stored, dist_a, dtype)
        b_buf = scatter(b, dist_b, dtype)
        c_buf = scatter(c, dist_c, dtype)
        desc_a = make_desc(stack, dist_a, cuda_type, grid)
        desc_b = make_desc(stack, dist_b, cuda_type, grid)
        desc_c = make_desc(stack, dist_c, cuda_type, grid)
        args = (env.handle, transa, CO.N, m, n, k, ctypes.addressof(alpha), a_buf.data_ptr(), 1, 1, desc_a,
                b_buf.data_ptr(), 1, 1, desc_b, ctypes.addressof(beta), c_buf.data_ptr(), 1, 1, desc_c, compute)
        device, device_bytes, host, host_bytes = workspace(stack, env, grid, cublasmp.gemm_buffer_size(*args))
        env.sync()
        cublasmp.gemm(*args, device, device_bytes, int(host.ctypes.data), host_bytes)
        env.sync()
        out = gather(env.mpi, c_buf, dist_c)
    got_a = gather(env.mpi, a_buf, dist_a)
    got_b = gather(env.mpi, b_buf, dist_b)
    a_ref = got_a if transa == CO.N else got_a.t()
    ref = 1.25 * torch.matmul(a_ref, got_b) - 0.5 * c.to(dtype).to(torch.float64)
    return expect_close(out, ref, atol, rtol, "summa gemm")


# --- main ----------------------------------------------------------------------------------


def main() -> int:
    faulthandler.enable()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    report = Report(rank, who="rank", tracebacks="CUBLASMP_SUITE_TRACEBACKS")
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    devices = torch.cuda.device_count()
    if devices < local_size:
        report.failed += 1
        report.line("FAIL", "setup", f"{local_size} ranks on this node but {devices} GPUs: NCCL needs one GPU "
                                     f"per rank")
        print(report.summary(), flush=True)
        return 1
    torch.cuda.set_device(local_rank)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    uid = nccl.UniqueId(world.bcast(bytes(nccl.get_unique_id()) if rank == 0 else None, root=0))
    comm = nccl.comm_init_rank(size, uid, rank)
    handle = cublasmp.create(int(stream.cuda_stream))
    env = Env(world, rank, size, comm, handle, stream)
    report.line("INFO", "setup", f"{size} ranks, GPU {local_rank}, cuBLASMp {cublasmp.get_version()}, "
                                 f"NCCL {nccl.get_version()}")
    try:
        for type_name in TYPES:
            report.check(f"matmul.allgather_gemm.{type_name}", functools.partial(tp_matmul, env, "ag", type_name))
            report.check(f"matmul.gemm_reducescatter.{type_name}",
                         functools.partial(tp_matmul, env, "rs", type_name))
        if size % 2:
            report.skipped += 1
            report.line("SKIP", "gemm.summa", f"a 2-D grid needs an even number of ranks, not {size}")
        else:
            for label, dtype, cuda_type, atol, rtol in (
                ("fp32", torch.float32, cublasmp.CudaDataType.R_32F, 1e-4, 1e-5),
                ("fp64", torch.float64, cublasmp.CudaDataType.R_64F, 1e-11, 1e-11),
            ):
                for transa in (CO.N, CO.T):
                    report.check(f"gemm.summa.{label}.{transa.name}N",
                                 functools.partial(summa_gemm, env, dtype, cuda_type, transa, atol, rtol))
    finally:
        torch.cuda.synchronize()
        for grid in env.grids.values():
            cublasmp.grid_destroy(grid)
        cublasmp.destroy(handle)
        nccl.comm_finalize(comm)
        nccl.comm_destroy(comm)
    world.Barrier()
    print(report.summary(), flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
