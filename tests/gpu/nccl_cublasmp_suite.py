"""NCCL and cuBLASMp on N ranks, one per GPU, every result checked against NumPy or torch.

    mpirun -np N python tests/gpu/nccl_cublasmp_suite.py --checks flat|layer|raw

``--checks flat``: the flat cuBLASMp bindings (``mpbind.bindings.cublasmp``) on torch CUDA memory:
AllGather+GEMM and GEMM+ReduceScatter (bf16, fp16) through ``cublasMpMatmul`` and SUMMA ``gemm``
(fp32, fp64, even rank counts).

``--checks layer``: the Pythonic layer on torch tensors: collectives of ``mpbind.nccl.Communicator``,
windows, rank-consistent teardown of communicators dropped in a different order on each rank, and a
2-D block-cyclic matmul built only from ``mpbind.cublasmp`` (cached grids, ``Matrix``, ``Matmul``).

``--checks raw``: neither torch nor CuPy in the process, device memory from cuda.bindings' runtime:
the flat NCCL collectives and a point-to-point ring, the layer's Communicator with (pointer, count,
dtype) operands, the flat cuBLASMp cases of ``--checks flat``, and a layer Matmul run directly and
replayed from a captured CUDA graph (the core's cuda-bindings driver capsules); at the end, that no
torch or CuPy module was imported. It runs the libraries of either wheel family, in particular the
CUDA 12 ones on a machine whose torch and CuPy are CUDA 13 builds (torch would load its own NCCL).

All ranks build the same seeded global matrices, hand the library their local parts, gather the
distributed result over MPI and compare it with the product of the global operands in float64.
Each rank reports one line per check and a summary (``rank k``; tests/gpu/runner.py).

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

import argparse
import contextlib
import ctypes
import functools
import gc
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# Before anything loads CUDA or NCCL in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
from cuda.bindings import runtime as rt  # noqa: E402
from mpi4py import MPI  # noqa: E402
from rank_per_gpu import local_gpu, rank_per_gpu  # noqa: E402
from runner import Check, Checks, Report, Skip, expect, main  # noqa: E402

from mpbind import cublasmp as layer_cublasmp  # noqa: E402
from mpbind import nccl as layer_nccl  # noqa: E402
from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.bindings import cublasmp, nccl  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

# --- the flat cuBLASMp cases: layouts and library calls on pointers -----------------------------------------

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
    """The rank's flat NCCL communicator, cuBLASMp handle and grids, a way to wait for its stream,
    and the device memory it puts matrices in (torch's or cuda.bindings')."""

    mpi: Any
    rank: int
    size: int
    comm: nccl.Comm
    handle: cublasmp.Handle
    sync: Callable[[], None]
    memory: Callable[[np.ndarray], Any]  # a host array in device memory: .ptr, .get(), .free()
    stream: Any = 0
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


# --- device memory: torch's, or cuda.bindings' (no torch in the process) ------------------------------------


def cuda(result: tuple[Any, ...]) -> Any:
    """The value of a cuda.bindings runtime call ((error, value...)); raises on an error."""
    err, *rest = result
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA runtime error {err}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class Device:
    """A NumPy array's bytes in device memory (cudaMalloc); 2-D arrays are kept column-major and
    exported so through ``__cuda_array_interface__``."""

    def __init__(self, host: np.ndarray) -> None:
        host = np.asfortranarray(host) if host.ndim == 2 else np.ascontiguousarray(host)
        self.shape: tuple[int, ...] = host.shape
        self.dtype = host.dtype
        self.nbytes = host.nbytes
        self.ptr = int(cuda(rt.cudaMalloc(max(1, host.nbytes))))
        self.set(host)

    def set(self, host: np.ndarray) -> None:
        host = np.asfortranarray(host, dtype=self.dtype) if host.ndim == 2 else np.ascontiguousarray(host, self.dtype)
        assert host.shape == self.shape
        cuda(rt.cudaDeviceSynchronize())
        cuda(rt.cudaMemcpy(self.ptr, host.ctypes.data, self.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))

    def get(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype, order="F")
        cuda(rt.cudaDeviceSynchronize())
        cuda(rt.cudaMemcpy(out.ctypes.data, self.ptr, self.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return out

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        size = self.dtype.itemsize
        strides = (size, size * max(1, self.shape[0])) if len(self.shape) == 2 else None
        return {"version": 3, "shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": strides, "stream": None}

    def free(self) -> None:
        if self.ptr:
            cuda(rt.cudaFree(self.ptr))
            self.ptr = 0


class TorchMemory:
    """A NumPy array's bytes in a torch CUDA tensor (copied on torch's current stream); 2-D arrays
    are kept column-major."""

    def __init__(self, host: np.ndarray) -> None:
        import torch

        self.shape: tuple[int, ...] = host.shape
        self.dtype = host.dtype
        raw = np.frombuffer(host.tobytes(order="F"), np.uint8).copy()
        self.tensor: Any = torch.from_numpy(raw).to("cuda")
        self.ptr = int(self.tensor.data_ptr())

    def get(self) -> np.ndarray:
        raw = self.tensor.cpu().numpy().tobytes()
        return np.frombuffer(raw, self.dtype).reshape(self.shape, order="F").copy()

    def free(self) -> None:
        self.tensor = None
        self.ptr = 0


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 (round to nearest even) as uint16 bits: NumPy has no bfloat16."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def to_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def to_f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def to_f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


# (encode float64 -> stored, decode stored -> float64, CUDA data type, atol, rtol); D is rounded to the
# data type, with fp32 accumulation
Codec = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray], Any, float, float]
TP_TYPES: dict[str, Codec] = {
    "bf16": (bf16_bits, from_bf16_bits, cublasmp.CudaDataType.R_16BF, 3e-2, 1e-2),
    "fp16": (to_f16, to_f64, cublasmp.CudaDataType.R_16F, 8e-3, 2e-3),
}


def random_matrix(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(shape) * 2 - 1


def scatter(r: Env, stack: contextlib.ExitStack, global_: np.ndarray, dist: Dist,
            encode: Callable[[np.ndarray], np.ndarray]) -> Any:
    """This rank's local part of `global_` in device memory, column-major, freed with `stack`."""
    rows, cols = dist.local_rows(), dist.local_cols()
    expect(len(rows) == cublasmp.numroc(dist.rows, dist.mb, dist.prow, 0, dist.nprow)
           and len(cols) == cublasmp.numroc(dist.cols, dist.nb, dist.pcol, 0, dist.npcol),
           "the distribution helper disagrees with numroc")
    buf = r.memory(encode(global_[np.ix_(rows, cols)]))
    stack.callback(buf.free)
    return buf


def gather(mpi: Any, buf: Any, dist: Dist, decode: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    return gather_parts(mpi, decode(buf.get()), dist)


def expect_within(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float, what: str) -> str:
    expect(not np.isnan(out).any(), f"{what}: the gathered result has elements nobody wrote")
    err = np.abs(out - ref)
    expect(bool((err <= atol + rtol * np.abs(ref)).all()),
           f"{what}: max |error| {err.max():.3g} > atol {atol:g} + rtol {rtol:g} * |ref|")
    return f"max |error| {err.max():.2e}"


def tp_matmul(r: Env, kind: str, type_name: str) -> str:
    """AllGather+GEMM ('ag') or GEMM+ReduceScatter ('rs'), TN, through cublasMpMatmul."""
    encode, decode, cuda_type, atol, rtol = TP_TYPES[type_name]
    case = tp_case(r, kind)
    m, n, k, dist_a, dist_b, dist_d = case[:6]
    a_op = decode(encode(random_matrix((m, k), SEED)))  # op(A) = A^T, rounded to the type
    b = decode(encode(random_matrix((k, n), SEED + 1)))
    a_stored = a_op.T.copy()  # A, k x m
    with contextlib.ExitStack() as stack:
        a_buf, b_buf = scatter(r, stack, a_stored, dist_a, encode), scatter(r, stack, b, dist_b, encode)
        d_buf = scatter(r, stack, np.full((m, n), np.nan), dist_d, encode)
        matmul_tn(r, case, cuda_type, a_buf.ptr, b_buf.ptr, d_buf.ptr)
        out = gather(r.mpi, d_buf, dist_d, decode)
        expect(np.array_equal(gather(r.mpi, a_buf, dist_a, decode), a_stored)
               and np.array_equal(gather(r.mpi, b_buf, dist_b, decode), b), "the distribution helper is wrong")
    return expect_within(out, a_op @ b, atol, rtol, f"{kind} {type_name}")


def summa(r: Env, label: str, transa: Any) -> str:
    """C = alpha op(A) B + beta C with gemm on a 2-D block-cyclic grid."""
    _, cuda_type, compute, atol, rtol = next(t for t in SUMMA_TYPES if t[0] == label)
    encode = to_f32 if label == "fp32" else to_f64
    m, n, k, _ = SUMMA_SHAPE
    a_op = random_matrix((m, k), SEED + 10)
    a_stored = a_op if transa == CO.N else a_op.T.copy()
    b, c = random_matrix((k, n), SEED + 11), random_matrix((m, n), SEED + 12)
    dists = summa_dists(r, a_stored.shape)
    with contextlib.ExitStack() as stack:
        a_buf, b_buf = scatter(r, stack, a_stored, dists[0], encode), scatter(r, stack, b, dists[1], encode)
        c_buf = scatter(r, stack, c, dists[2], encode)
        summa_gemm(r, dists, cuda_type, compute, transa, a_buf.ptr, b_buf.ptr, c_buf.ptr)
        out = gather(r.mpi, c_buf, dists[2], to_f64)
    rounded = [to_f64(encode(x)) for x in (a_op, b, c)]
    return expect_within(out, 1.25 * (rounded[0] @ rounded[1]) - 0.5 * rounded[2], atol, rtol, "summa gemm")


def skipped(reason: str) -> Callable[[], None]:
    def skip() -> None:
        raise Skip(reason)

    return skip


def flat_cublasmp(r: Env) -> Iterator[Check]:
    """Every tensor-parallel case per type, and the SUMMA cases on even rank counts."""
    for type_name in TP_TYPES:
        yield f"matmul.allgather_gemm.{type_name}", functools.partial(tp_matmul, r, "ag", type_name)
        yield f"matmul.gemm_reducescatter.{type_name}", functools.partial(tp_matmul, r, "rs", type_name)
    if r.size % 2:
        yield "gemm.summa", skipped(f"a 2-D grid needs an even number of ranks, not {r.size}")
        return
    for label, *_ in SUMMA_TYPES:
        for transa in (CO.N, CO.T):
            yield f"gemm.summa.{label}.{transa.name}N", functools.partial(summa, r, label, transa)


FLAT = Checks()
FLAT.cases(flat_cublasmp)


# --- raw: the flat NCCL calls and the layer on cuda.bindings memory, no torch ---------------------------------

N = 1024
F32 = nccl.DataType.FLOAT32


def mine(rank: int, n: int = N) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 97) + 1000 * rank


def nccl_collectives(r: Env) -> str:
    p = r.size
    with contextlib.ExitStack() as stack:
        def dev(host: np.ndarray) -> Device:
            buf = Device(host)
            stack.callback(buf.free)
            return buf

        send, recv = dev(mine(r.rank)), dev(np.zeros(N, np.float32))
        nccl.all_reduce(send.ptr, recv.ptr, N, F32, nccl.RedOp.SUM, r.comm, r.stream)
        r.sync()
        expect(np.array_equal(recv.get(), sum(mine(k) for k in range(p))), "all_reduce: wrong sum")
        gathered = dev(np.zeros(N * p, np.float32))
        nccl.all_gather(send.ptr, gathered.ptr, N, F32, r.comm, r.stream)
        r.sync()
        expect(np.array_equal(gathered.get(), np.concatenate([mine(k) for k in range(p)])), "all_gather: wrong")
        big = dev(np.concatenate([mine(r.rank) + k for k in range(p)]))
        part = dev(np.zeros(N, np.float32))
        nccl.reduce_scatter(big.ptr, part.ptr, N, F32, nccl.RedOp.SUM, r.comm, r.stream)
        r.sync()
        expect(np.array_equal(part.get(), sum(mine(k) + r.rank for k in range(p))), "reduce_scatter: wrong")
        nccl.broadcast(send.ptr, recv.ptr, N, F32, 0, r.comm, r.stream)
        r.sync()
        expect(np.array_equal(recv.get(), mine(0)), "broadcast: not rank 0's data")
        nccl.group_start()
        nccl.send(send.ptr, N, F32, (r.rank + 1) % p, r.comm, r.stream)
        nccl.recv(recv.ptr, N, F32, (r.rank - 1) % p, r.comm, r.stream)
        nccl.group_end()
        r.sync()
        expect(np.array_equal(recv.get(), mine((r.rank - 1) % p)), "send/recv ring: not the left neighbour's")
    return f"{p} ranks, {N} float32 each"


def nccl_layer(r: Env, uid: bytes) -> str:
    p = r.size
    with layer_nccl.Communicator.init(p, r.rank, uid) as comm:
        send, recv = Device(mine(r.rank)), Device(np.zeros(N, np.float32))
        try:
            comm.all_reduce((send.ptr, N, "float32"), (recv.ptr, N, "float32"), op="sum", stream=r.stream)
            r.sync()
            expect(np.array_equal(recv.get(), sum(mine(k) for k in range(p))), "layer all_reduce: wrong sum")
            comm.all_reduce((send.ptr, N, "float32"), (recv.ptr, N, "float32"), op="max", stream=r.stream)
            r.sync()
            expect(np.array_equal(recv.get(), mine(p - 1)), "layer all_reduce max: wrong")
        finally:
            send.free()
            recv.free()
    return f"device {r.rank}"


def layer_matmul(r: Env, uid: bytes) -> str:
    """AllGather+GEMM fp32 through cublasmp.Matmul, run directly, then (capture refused until the
    descriptor asks for NO_OVERLAP) captured into a CUDA graph and replayed (the core calls
    cuStreamBeginCapture ... cuGraphLaunch through cuda-bindings' capsules)."""
    p, k_ = r.size, r.rank
    m, n, k = 32 * p, 16 * p, 48
    a_op, b = random_matrix((m, k), SEED + 20), random_matrix((k, n), SEED + 21)
    ref = a_op.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    dist_a, dist_b = Dist(k, m, k, m // p, 1, p, 0, k_), Dist(k, n, k, n // p, 1, p, 0, k_)
    dist_d = Dist(m, n, m // p, n // p, p, 1, k_, 0)
    notes = []
    with contextlib.ExitStack() as stack, layer_nccl.Communicator.init(p, k_, uid) as comm:
        a_buf, b_buf = scatter(r, stack, a_op.T.copy(), dist_a, to_f32), scatter(r, stack, b, dist_b, to_f32)
        d_buf = scatter(r, stack, np.full((m, n), np.nan), dist_d, to_f32)
        row, col = layer_cublasmp.grid(comm, 1, p, GL.ROW_MAJOR), layer_cublasmp.grid(comm, p, 1, GL.COL_MAJOR)
        handle = layer_cublasmp.Handle(r.stream)
        with layer_cublasmp.Matrix(row, a_buf, shape=(k, m), block=(k, m // p)) as a, \
                layer_cublasmp.Matrix(row, b_buf, shape=(k, n), block=(k, n // p)) as bm, \
                layer_cublasmp.Matrix(col, d_buf, shape=(m, n), block=(m // p, n // p)) as d, \
                layer_cublasmp.Matmul(handle, a, bm, d, transa=True) as plan:
            plan.execute(r.stream)
            r.sync()
            out = gather(r.mpi, d_buf, dist_d, to_f64)
            notes.append("direct " + expect_within(out, ref, 1e-4, 1e-5, "layer matmul"))
            d_buf.set(np.full(d_buf.shape, np.nan, np.float32))
            try:  # over two processes cuBLASMp 0.10 may overlap the all-gather: refused without NO_OVERLAP
                plan.capture(r.stream)
            except UsageError as exc:
                expect("NO_OVERLAP" in str(exc) and not plan.captured, f"refused as {exc}")
            else:
                raise AssertionError("capture() without NO_OVERLAP was not refused")
            plan.descriptor.algo_type = layer_cublasmp.MatmulAlgoType.NO_OVERLAP
            plan.capture(r.stream)
            expect(plan.captured, "capture() did not capture")
            plan.execute()
            r.sync()
            notes.append("graph " + expect_within(gather(r.mpi, d_buf, dist_d, to_f64), ref, 1e-4, 1e-5,
                                                  "captured matmul"))
        handle.close()
    return "; ".join(notes)


def new_uid(world: Any) -> bytes:
    """An NCCL unique id from rank 0, the same on every rank."""
    uid: bytes = world.bcast(bytes(nccl.get_unique_id()) if world.Get_rank() == 0 else None, root=0)
    return uid


RAW = Checks()


@RAW.cases
def raw_checks(r: Env) -> Iterator[Check]:
    yield "nccl.collectives", functools.partial(nccl_collectives, r)
    yield "nccl.layer", functools.partial(nccl_layer, r, new_uid(r.mpi))
    yield from flat_cublasmp(r)
    yield "cublasmp.layer_matmul", functools.partial(layer_matmul, r, new_uid(r.mpi))
    yield "process.no_torch_no_cupy", lambda: expect(
        not {"torch", "cupy"} & set(sys.modules), f"imported: {sorted({'torch', 'cupy'} & set(sys.modules))}")


# --- layer: the Pythonic NCCL and cuBLASMp layer on torch tensors ---------------------------------------------

LAYER_SEED = 97


@dataclass
class Layer:
    world: Any
    comm: layer_nccl.Communicator
    handle: layer_cublasmp.Handle


LAYER = Checks()


@LAYER("nccl.collectives")
def collectives(ctx: Layer) -> str:
    import torch

    comm = ctx.comm
    r, p = comm.rank, comm.size
    x = torch.arange(12, dtype=torch.float32, device="cuda") + 100 * r
    out = torch.empty_like(x)
    comm.all_reduce(x, out)
    gathered = torch.empty(12 * p, device="cuda")
    comm.all_gather(x, gathered)
    rs = torch.empty(12 // p if 12 % p == 0 else 0, device="cuda")
    if rs.numel():
        comm.reduce_scatter(x, rs, op="max")
    a2a = torch.empty_like(x)
    comm.all_to_all(x, a2a)
    ring = torch.empty_like(x)
    with layer_nccl.group():
        comm.send(x, peer=(r + 1) % p)
        comm.recv(ring, peer=(r - 1) % p)
    bcast = torch.empty_like(x)
    comm.broadcast(x, bcast, root=p - 1)
    torch.cuda.synchronize()
    base = np.arange(12, dtype=np.float32)
    every = [base + 100 * q for q in range(p)]
    np.testing.assert_array_equal(out.cpu().numpy(), sum(every))
    np.testing.assert_array_equal(gathered.cpu().numpy(), np.concatenate(every))
    if rs.numel():
        n = 12 // p
        np.testing.assert_array_equal(rs.cpu().numpy(), every[-1][r * n:(r + 1) * n])
    block = 12 // p
    expect_a2a = np.concatenate([every[q][r * block:(r + 1) * block] for q in range(p)]) if 12 % p == 0 else None
    if expect_a2a is not None:
        np.testing.assert_array_equal(a2a.cpu().numpy(), expect_a2a)
    np.testing.assert_array_equal(ring.cpu().numpy(), every[(r - 1) % p])
    np.testing.assert_array_equal(bcast.cpu().numpy(), every[-1])
    return f"{p} ranks"


@LAYER("nccl.windows")
def windows(ctx: Layer) -> str:
    comm = ctx.comm
    buf = layer_nccl.mem_alloc(1 << 21)
    try:
        w1 = comm.register_window(buf)
    except Exception as exc:  # noqa: BLE001 - the system may not offer symmetric windows
        raise Skip(f"ncclCommWindowRegister: {exc}") from None
    w2 = comm.register_window(buf)  # no second collective call: every rank does the same
    assert w1.handle == w2.handle and w1.references == 2
    w1.close()
    w2.close()  # the last reference: collective deregistration on every rank
    assert not comm.registrations()
    buf.close()
    return "one window, two references"


@LAYER("nccl.teardown_order")
def teardown_order(ctx: Layer) -> str:
    comm = ctx.comm
    subs = [comm.split(color=0, key=comm.rank) for _ in range(3)]
    serials = [s.serial for s in subs if s is not None]
    order = list(range(3)) if comm.rank % 2 == 0 else [2, 0, 1]  # dropped differently on each rank
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for i in order:
            subs[i] = None  # type: ignore[call-overload]
        gc.collect()
    queued = [s for kind, s in layer_nccl.queued() if kind == "nccl.Communicator"]
    assert queued == sorted(serials, reverse=True), (queued, serials)
    ran = layer_nccl.drain()  # the same order on every rank: no hang
    assert ran >= 3 and not layer_nccl.queued()
    return f"{ran} released newest first"


@LAYER.each(("cublasmp.matmul_2d.fp32", "float32", 1e-4, 1e-5), ("cublasmp.matmul_2d.fp64", "float64", 1e-11, 1e-11))
def matmul_2d(ctx: Layer, dtype_name: str, atol: float, rtol: float) -> str:
    import torch

    comm, handle, dtype = ctx.comm, ctx.handle, getattr(torch, dtype_name)
    p = comm.size
    if p % 2:
        raise Skip(f"a 2-D grid needs an even number of ranks, not {p}")
    nprow, npcol = 2, p // 2
    grid = layer_cublasmp.grid(comm, nprow, npcol)
    assert layer_cublasmp.grid(comm, nprow, npcol).handle == grid.handle  # cached
    prow, pcol = grid_position(comm.rank, nprow, npcol, layer_cublasmp.GridLayout.COL_MAJOR)
    m, n, k, mb = 96, 80, 64, 16
    a_g, b_g = torch_matrix((m, k), LAYER_SEED), torch_matrix((k, n), LAYER_SEED + 1)
    da, db, dd = (Dist(r, c, mb, mb, nprow, npcol, prow, pcol) for r, c in ((m, k), (k, n), (m, n)))

    def local(global_: Any, dist: Dist) -> Any:
        part = global_[dist.local_rows()][:, dist.local_cols()]
        return part.t().contiguous().to(device="cuda", dtype=dtype).t()  # column-major (lr x lc) view

    a, b = local(a_g, da), local(b_g, db)
    d = torch.zeros((len(dd.local_cols()), len(dd.local_rows())), device="cuda", dtype=dtype).t()
    ma = layer_cublasmp.Matrix(grid, a, shape=(m, k), block=(mb, mb))
    mb_ = layer_cublasmp.Matrix(grid, b, shape=(k, n), block=(mb, mb))
    md = layer_cublasmp.Matrix(grid, d, shape=(m, n), block=(mb, mb))
    with layer_cublasmp.Matmul(handle, ma, mb_, md) as plan:
        plan.execute()
    torch.cuda.synchronize()
    out = gather_parts(MPI.COMM_WORLD, d.to(torch.float64).cpu().numpy(), dd)
    return expect_within(out, (a_g.to(dtype).double() @ b_g.to(dtype).double()).numpy(), atol, rtol, "D")


def torch_matrix(shape: tuple[int, int], seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1


@LAYER("cublasmp.close_order")
def close_order(ctx: Layer) -> str:
    comm = layer_nccl.Communicator.from_mpi(ctx.world)
    grid = layer_cublasmp.grid(comm, comm.size, 1)
    ws = layer_cublasmp.Workspace(grid, 1 << 20)
    ws.serve([layer_cublasmp.grid(comm, 1, comm.size)])
    comm.close()  # the workspace, then the grids, then the communicator: on every rank
    assert ws.closed and grid.closed
    return "workspace, grids, communicator"


# --- the run ------------------------------------------------------------------------------------------------


def wheels() -> str:
    out = []
    for lib in ("nccl", "cublasmp"):
        loaded = _loader.load(lib)
        out.append(f"{lib} {_loader.loaded_version(lib)} from {loaded.owner or loaded.path}")
    return "; ".join(out)


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Env | Layer]:
    """This rank on its GPU with its communicator, stream and handle (the layer's, or the flat ones on
    torch's or cuda.bindings' memory); after the checks, everything closed on every rank alike."""
    if args.checks == "layer":
        with rank_per_gpu() as (world, comm, _, handle):
            yield Layer(world, comm, handle)
        return
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if args.checks == "raw":
        local_rank = local_gpu(world, int(cuda(rt.cudaGetDeviceCount())))
        cuda(rt.cudaSetDevice(local_rank))
        stream = int(cuda(rt.cudaStreamCreate()))
        comm = nccl.comm_init_rank(size, nccl.UniqueId(new_uid(world)), rank)
        env = Env(world, rank, size, comm, cublasmp.create(stream), lambda: cuda(rt.cudaStreamSynchronize(stream)),
                  Device, stream=stream)
        report.info("setup", f"{size} ranks, GPU {local_rank}; {wheels()}")
        try:
            yield env
        finally:
            cuda(rt.cudaDeviceSynchronize())
            env.close()
        world.Barrier()
        return
    import torch

    local_rank = local_gpu(world, torch.cuda.device_count())
    torch.cuda.set_device(local_rank)
    torch_stream = torch.cuda.Stream()
    torch.cuda.set_stream(torch_stream)
    comm = nccl.comm_init_rank(size, nccl.UniqueId(new_uid(world)), rank)
    env = Env(world, rank, size, comm, cublasmp.create(int(torch_stream.cuda_stream)), torch_stream.synchronize,
              TorchMemory, stream=torch_stream)
    report.info("setup", f"{size} ranks, GPU {local_rank}, cuBLASMp {cublasmp.get_version()}, "
                         f"NCCL {nccl.get_version()}")
    try:
        yield env
    finally:
        torch.cuda.synchronize()
        env.close()
    world.Barrier()


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--checks", choices=("flat", "layer", "raw"), default="flat",
                    help="the flat cuBLASMp bindings on torch memory, the layer on torch tensors, or both "
                         "APIs on cuda.bindings memory with no torch in the process")


if __name__ == "__main__":
    sys.exit(main(__doc__, started, lambda args: {"flat": FLAT, "layer": LAYER, "raw": RAW}[args.checks],
                  arguments=arguments, timeout=270.0, who="rank"))
