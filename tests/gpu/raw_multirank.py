"""NCCL and cuBLASMp on N ranks, one per GPU, with neither torch nor CuPy in the process: device
memory from cuda.bindings' runtime, every result compared with NumPy.

    mpirun -np 2 python tests/gpu/raw_multirank.py

It runs the libraries of either wheel family, in particular the CUDA 12 ones (extra cu12) on a
machine whose torch and CuPy are CUDA 13 builds (torch would load its own NCCL). Checks: the flat
NCCL collectives and a point-to-point ring; the layer's Communicator with (pointer, count, dtype)
operands; cuBLASMp AllGather+GEMM and GEMM+ReduceScatter (fp16, bf16) and SUMMA gemm (fp32, fp64,
even rank counts) through the flat bindings (the layouts of ``cublasmp_multirank.py``); a layer
Matmul run directly and replayed from a captured CUDA graph (the core's cuda-bindings driver
capsules). Each rank prints the lines of suite_report (``rank k``), the wheel each library came
from, and checks at the end that no torch or CuPy module was imported.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Before anything loads CUDA or NCCL in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
from cublasmp_cases import (  # noqa: E402
    CO,
    GL,
    SEED,
    SUMMA_SHAPE,
    SUMMA_TYPES,
    Dist,
    Env,
    check_all,
    gather_parts,
    matmul_tn,
    summa_dists,
    summa_gemm,
    tp_case,
)
from cuda.bindings import runtime as rt  # noqa: E402
from mpi4py import MPI  # noqa: E402
from rank_per_gpu import finish, local_gpu  # noqa: E402
from suite_report import Report, expect  # noqa: E402

from mpbind import _loader  # noqa: E402
from mpbind import cublasmp as layer_cublasmp  # noqa: E402
from mpbind import nccl as layer_nccl  # noqa: E402
from mpbind.bindings import cublasmp, nccl  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

# --- device memory -------------------------------------------------------------------------------


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


# (encode float64 -> stored, decode stored -> float64, CUDA data type, atol, rtol)
Codec = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray], Any, float, float]
TP_TYPES: dict[str, Codec] = {
    "bf16": (bf16_bits, from_bf16_bits, cublasmp.CudaDataType.R_16BF, 3e-2, 1e-2),
    "fp16": (to_f16, to_f64, cublasmp.CudaDataType.R_16F, 8e-3, 2e-3),
}


# --- distribution ----------------------------------------------------------------------------------


def random_matrix(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(shape) * 2 - 1


def scatter(stack: contextlib.ExitStack, global_: np.ndarray, dist: Dist,
            encode: Callable[[np.ndarray], np.ndarray]) -> Device:
    buf = Device(encode(global_[np.ix_(dist.local_rows(), dist.local_cols())]))
    stack.callback(buf.free)
    return buf


def gather(mpi: Any, buf: Device, dist: Dist, decode: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    return gather_parts(mpi, decode(buf.get()), dist)


def expect_close(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float, what: str) -> str:
    expect(not np.isnan(out).any(), f"{what}: the gathered result has elements nobody wrote")
    err = np.abs(out - ref)
    expect(bool((err <= atol + rtol * np.abs(ref)).all()),
           f"{what}: max |error| {err.max():.3g} > atol {atol:g} + rtol {rtol:g} * |ref|")
    return f"max |error| {err.max():.2e}"


# --- NCCL ------------------------------------------------------------------------------------------


@dataclass
class Rank(Env):
    """The shared Env, with this suite's stream (an int)."""

    stream: int = 0


N = 1024
F32 = nccl.DataType.FLOAT32


def mine(rank: int, n: int = N) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 97) + 1000 * rank


def nccl_collectives(r: Rank) -> str:
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


def nccl_layer(r: Rank, uid: bytes) -> str:
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


# --- cuBLASMp (flat) ------------------------------------------------------------------------------


def tp_matmul(r: Rank, kind: str, type_name: str) -> str:
    """AllGather+GEMM ('ag') or GEMM+ReduceScatter ('rs'), TN, through cublasMpMatmul."""
    encode, decode, cuda_type, atol, rtol = TP_TYPES[type_name]
    case = tp_case(r, kind)
    m, n, k, dist_a, dist_b, dist_d = case[:6]
    a_op = decode(encode(random_matrix((m, k), SEED)))  # op(A) = A^T, rounded to the type
    b = decode(encode(random_matrix((k, n), SEED + 1)))
    a_stored = a_op.T.copy()  # A, k x m
    with contextlib.ExitStack() as stack:
        a_buf, b_buf = scatter(stack, a_stored, dist_a, encode), scatter(stack, b, dist_b, encode)
        d_buf = scatter(stack, np.full((m, n), np.nan), dist_d, encode)
        matmul_tn(r, case, cuda_type, a_buf.ptr, b_buf.ptr, d_buf.ptr)
        out = gather(r.mpi, d_buf, dist_d, decode)
        expect(np.array_equal(gather(r.mpi, a_buf, dist_a, decode), a_stored)
               and np.array_equal(gather(r.mpi, b_buf, dist_b, decode), b), "the distribution helper is wrong")
    return expect_close(out, a_op @ b, atol, rtol, f"{kind} {type_name}")


def summa(r: Rank, label: str, transa: Any) -> str:
    """C = alpha op(A) B + beta C with gemm on a 2-D block-cyclic grid."""
    _, cuda_type, compute, atol, rtol = next(t for t in SUMMA_TYPES if t[0] == label)
    encode = to_f32 if label == "fp32" else to_f64
    m, n, k, _ = SUMMA_SHAPE
    a_op = random_matrix((m, k), SEED + 10)
    a_stored = a_op if transa == CO.N else a_op.T.copy()
    b, c = random_matrix((k, n), SEED + 11), random_matrix((m, n), SEED + 12)
    dists = summa_dists(r, a_stored.shape)
    with contextlib.ExitStack() as stack:
        a_buf, b_buf = scatter(stack, a_stored, dists[0], encode), scatter(stack, b, dists[1], encode)
        c_buf = scatter(stack, c, dists[2], encode)
        summa_gemm(r, dists, cuda_type, compute, transa, a_buf.ptr, b_buf.ptr, c_buf.ptr)
        out = gather(r.mpi, c_buf, dists[2], to_f64)
    rounded = [to_f64(encode(x)) for x in (a_op, b, c)]
    return expect_close(out, 1.25 * (rounded[0] @ rounded[1]) - 0.5 * rounded[2], atol, rtol, "summa gemm")


# --- cuBLASMp (layer) ------------------------------------------------------------------------------


def layer_matmul(r: Rank, uid: bytes) -> str:
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
        a_buf, b_buf = scatter(stack, a_op.T.copy(), dist_a, to_f32), scatter(stack, b, dist_b, to_f32)
        d_buf = scatter(stack, np.full((m, n), np.nan), dist_d, to_f32)
        row, col = layer_cublasmp.grid(comm, 1, p, GL.ROW_MAJOR), layer_cublasmp.grid(comm, p, 1, GL.COL_MAJOR)
        handle = layer_cublasmp.Handle(r.stream)
        with layer_cublasmp.Matrix(row, a_buf, shape=(k, m), block=(k, m // p)) as a, \
                layer_cublasmp.Matrix(row, b_buf, shape=(k, n), block=(k, n // p)) as bm, \
                layer_cublasmp.Matrix(col, d_buf, shape=(m, n), block=(m // p, n // p)) as d, \
                layer_cublasmp.Matmul(handle, a, bm, d, transa=True) as plan:
            plan.execute(r.stream)
            r.sync()
            out = gather(r.mpi, d_buf, dist_d, to_f64)
            notes.append("direct " + expect_close(out, ref, 1e-4, 1e-5, "layer matmul"))
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
            notes.append("graph " + expect_close(gather(r.mpi, d_buf, dist_d, to_f64), ref, 1e-4, 1e-5,
                                                 "captured matmul"))
        handle.close()
    return "; ".join(notes)


# --- main ------------------------------------------------------------------------------------------


def wheels() -> str:
    out = []
    for lib in ("nccl", "cublasmp"):
        loaded = _loader.load(lib)
        out.append(f"{lib} {_loader.loaded_version(lib)} from {loaded.owner or loaded.path}")
    return "; ".join(out)


def main() -> int:
    faulthandler.enable()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    report = Report(rank, who="rank", tracebacks="RAW_SUITE_TRACEBACKS")
    local_rank = local_gpu(world, report, int(cuda(rt.cudaGetDeviceCount())))
    cuda(rt.cudaSetDevice(local_rank))
    stream = int(cuda(rt.cudaStreamCreate()))

    def new_uid() -> bytes:
        uid: bytes = world.bcast(bytes(nccl.get_unique_id()) if rank == 0 else None, root=0)
        return uid

    comm = nccl.comm_init_rank(size, nccl.UniqueId(new_uid()), rank)
    r = Rank(world, rank, size, comm, cublasmp.create(stream), lambda: cuda(rt.cudaStreamSynchronize(stream)),
             stream=stream)
    report.info("setup", f"{size} ranks, GPU {local_rank}; {wheels()}")
    try:
        report.check("nccl.collectives", functools.partial(nccl_collectives, r))
        report.check("nccl.layer", functools.partial(nccl_layer, r, new_uid()))
        check_all(report, r, list(TP_TYPES), lambda kind, t: tp_matmul(r, kind, t),
                  lambda label, transa: summa(r, label, transa))
        report.check("cublasmp.layer_matmul", functools.partial(layer_matmul, r, new_uid()))
        report.check("process.no_torch_no_cupy", lambda: expect(
            not {"torch", "cupy"} & set(sys.modules), f"imported: {sorted({'torch', 'cupy'} & set(sys.modules))}"))
    finally:
        cuda(rt.cudaDeviceSynchronize())
        r.close()
    return finish(world, report)


if __name__ == "__main__":
    sys.exit(main())
