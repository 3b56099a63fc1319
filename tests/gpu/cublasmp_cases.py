"""The cuBLASMp cases of the multi-rank suites, with no array library: the torch suite
(``cublasmp_multirank.py``) and the raw-memory one (``raw_multirank.py``) share them and supply their
own device arrays and references.

Layouts (ScaLAPACK 2-D block-cyclic, column-major local matrices; global element ``(i, j)``
lives on process row ``(i // mb) % nprow`` and column ``(j // nb) % npcol``). The two
tensor-parallel cases follow cuBLASMp's "Using cuBLASMp for Tensor Parallelism" layouts, TN
(``transa = T``, ``transb = N``), P ranks, D = op(A) B with A stored as ``k x m``:

* AllGather+GEMM ('ag'): A (``k x m``) and B (``k x n``) are split by columns over a 1 x P
  row-major grid (blocks ``k x m/P`` and ``k x n/P``); D (``m x n``) is split by rows over a
  P x 1 column-major grid (``m/P`` rows each). B is gathered; each rank computes its rows of D.
* GEMM+ReduceScatter ('rs'): A (``k x m``) and B (``k x n``) are split by rows (``k/P`` each) over a
  P x 1 column-major grid; D (``m x n``) is split by columns (``n/P`` each) over a 1 x P
  row-major grid. Each rank computes a partial ``m x n`` product; the sum is scattered.
* SUMMA: ``gemm`` on a 2-D grid (2 x 1 for two ranks, 2 x 2 for four) with small square blocks
  that do not divide the sizes, so distribution is cyclic with ragged edges.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from suite_report import Report

from mpbind.bindings import cublasmp, nccl

CO = cublasmp.CublasOperation
GL = cublasmp.GridLayout
MDA = cublasmp.MatmulDescriptorAttribute
NO_DESC = cublasmp.MatrixDescriptor(0)  # C not given (beta is 0): NULL pointer and descriptor
SEED = 4321
SUMMA_SHAPE = (100, 72, 84, 16)  # m, n, k, block
# (name, CUDA data type, compute type, atol, rtol) of the SUMMA cases
SUMMA_TYPES = (("fp32", cublasmp.CudaDataType.R_32F, cublasmp.CublasComputeType.COMPUTE_32F, 1e-4, 1e-5),
               ("fp64", cublasmp.CudaDataType.R_64F, cublasmp.CublasComputeType.COMPUTE_64F, 1e-11, 1e-11))


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


@dataclass
class Env:
    """The rank's NCCL communicator, cuBLASMp handle, grids and a way to wait for its stream."""

    mpi: Any
    rank: int
    size: int
    comm: nccl.Comm
    handle: cublasmp.Handle
    sync: Callable[[], None]
    grids: dict[tuple[int, int, int], cublasmp.Grid] = field(default_factory=dict)

    def grid(self, nprow: int, npcol: int, layout: cublasmp.GridLayout) -> cublasmp.Grid:
        key = (nprow, npcol, int(layout))
        if key not in self.grids:
            self.grids[key] = cublasmp.grid_create(nprow, npcol, layout, self.comm)
        return self.grids[key]

    def close(self) -> None:
        for grid in self.grids.values():
            cublasmp.grid_destroy(grid)
        cublasmp.destroy(self.handle)
        nccl.comm_finalize(self.comm)
        nccl.comm_destroy(self.comm)


def gather_parts(mpi: Any, local: np.ndarray, dist: Dist) -> np.ndarray:
    """The global float64 matrix assembled from every rank's (rows x cols) local part."""
    parts = mpi.allgather((dist.local_rows(), dist.local_cols(), local))
    out = np.full((dist.rows, dist.cols), np.nan)
    for rows, cols, values in parts:
        if rows and cols:
            out[np.ix_(rows, cols)] = values
    return out


# (m, n, k, dist of A, of B, of D, grid of A and B, grid of D)
TpCase = tuple[int, int, int, Dist, Dist, Dist, cublasmp.Grid, cublasmp.Grid]


def tp_case(env: Env, kind: str) -> TpCase:
    p, r = env.size, env.rank
    row_grid, col_grid = env.grid(1, p, GL.ROW_MAJOR), env.grid(p, 1, GL.COL_MAJOR)
    if kind == "ag":
        m, n, k = 64 * p, 32 * p, 96
        return (m, n, k, Dist(k, m, k, m // p, 1, p, 0, r), Dist(k, n, k, n // p, 1, p, 0, r),
                Dist(m, n, m // p, n // p, p, 1, r, 0), row_grid, col_grid)
    m, n, k = 96, 32 * p, 64 * p
    return (m, n, k, Dist(k, m, k // p, m, p, 1, r, 0), Dist(k, n, k // p, n // p, p, 1, r, 0),
            Dist(m, n, m, n // p, 1, p, 0, r), col_grid, row_grid)


def summa_dists(env: Env, a_shape: tuple[int, int]) -> tuple[Dist, Dist, Dist, cublasmp.Grid]:
    """(dist of A stored as `a_shape`, of B, of C, the grid) of the SUMMA case."""
    nprow, npcol = 2, env.size // 2
    prow, pcol = grid_position(env.rank, nprow, npcol, GL.COL_MAJOR)
    m, n, k, blk = SUMMA_SHAPE
    return (Dist(a_shape[0], a_shape[1], blk, blk, nprow, npcol, prow, pcol),
            Dist(k, n, blk, blk, nprow, npcol, prow, pcol), Dist(m, n, blk, blk, nprow, npcol, prow, pcol),
            env.grid(nprow, npcol, GL.COL_MAJOR))


def _desc(stack: contextlib.ExitStack, dist: Dist, dtype: cublasmp.CudaDataType,
          grid: cublasmp.Grid) -> cublasmp.MatrixDescriptor:
    desc = cublasmp.matrix_descriptor_create(dist.rows, dist.cols, dist.mb, dist.nb, 0, 0, dist.lld, dtype, grid)
    stack.callback(cublasmp.matrix_descriptor_destroy, desc)
    return desc


def _run(env: Env, call: Callable[..., None], sizes: Callable[..., tuple[int, int]], args: tuple[Any, ...],
         grid: cublasmp.Grid) -> None:
    """`call(*args, workspace...)` with the workspace `sizes(*args)` asks for (device memory collective over
    `grid`), waiting for the stream before and after."""
    device_bytes, host_bytes = sizes(*args)
    device = cublasmp.malloc(grid, device_bytes) if device_bytes else 0
    host = np.zeros(max(1, host_bytes), dtype=np.uint8)
    try:
        env.sync()
        call(*args, device, device_bytes, int(host.ctypes.data), host_bytes)
        env.sync()
    finally:
        if device:
            cublasmp.free(grid, device)


def matmul_tn(env: Env, case: TpCase, cuda_type: cublasmp.CudaDataType, a: int, b: int, d: int) -> None:
    """D = A^T B with cublasMpMatmul (fp32 compute) on the pointers of the local parts of `case`."""
    m, n, k, dist_a, dist_b, dist_d, grid_ab, grid_d = case
    with contextlib.ExitStack() as stack:
        desc_a, desc_b = _desc(stack, dist_a, cuda_type, grid_ab), _desc(stack, dist_b, cuda_type, grid_ab)
        desc_d = _desc(stack, dist_d, cuda_type, grid_d)
        mm = cublasmp.matmul_descriptor_create(cublasmp.CublasComputeType.COMPUTE_32F)
        stack.callback(cublasmp.matmul_descriptor_destroy, mm)
        cublasmp.matmul_descriptor_set(mm, MDA.TRANSA, CO.T)
        cublasmp.matmul_descriptor_set(mm, MDA.TRANSB, CO.N)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        args = (env.handle, mm, m, n, k, ctypes.addressof(alpha), a, 1, 1, desc_a, b, 1, 1, desc_b,
                ctypes.addressof(beta), 0, 1, 1, NO_DESC, d, 1, 1, desc_d)
        _run(env, cublasmp.matmul, cublasmp.matmul_buffer_size, args, grid_d)


def summa_gemm(env: Env, dists: tuple[Dist, Dist, Dist, cublasmp.Grid], cuda_type: cublasmp.CudaDataType,
               compute: cublasmp.CublasComputeType, transa: cublasmp.CublasOperation, a: int, b: int, c: int) -> None:
    """C = 1.25 op(A) B - 0.5 C with cublasMpGemm on the pointers of the local parts."""
    dist_a, dist_b, dist_c, grid = dists
    m, n, k, _ = SUMMA_SHAPE
    scalar = ctypes.c_double if compute == cublasmp.CublasComputeType.COMPUTE_64F else ctypes.c_float
    alpha, beta = scalar(1.25), scalar(-0.5)
    with contextlib.ExitStack() as stack:
        args = (env.handle, transa, CO.N, m, n, k, ctypes.addressof(alpha), a, 1, 1,
                _desc(stack, dist_a, cuda_type, grid), b, 1, 1, _desc(stack, dist_b, cuda_type, grid),
                ctypes.addressof(beta), c, 1, 1, _desc(stack, dist_c, cuda_type, grid), compute)
        _run(env, cublasmp.gemm, cublasmp.gemm_buffer_size, args, grid)


def check_all(report: Report, env: Env, tp_types: list[str], tp: Callable[[str, str], str],
              summa: Callable[[str, cublasmp.CublasOperation], str]) -> None:
    """Every tensor-parallel case per type, and the SUMMA cases on even rank counts."""
    for type_name in tp_types:
        report.check(f"matmul.allgather_gemm.{type_name}", functools.partial(tp, "ag", type_name))
        report.check(f"matmul.gemm_reducescatter.{type_name}", functools.partial(tp, "rs", type_name))
    if env.size % 2:
        report.skipped += 1
        report.line("SKIP", "gemm.summa", f"a 2-D grid needs an even number of ranks, not {env.size}")
        return
    for label, *_ in SUMMA_TYPES:
        for transa in (CO.N, CO.T):
            report.check(f"gemm.summa.{label}.{transa.name}N", functools.partial(summa, label, transa))
