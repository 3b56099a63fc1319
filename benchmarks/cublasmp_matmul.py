"""cuBLASMp matmul through mpbind against torch.matmul, one rank on one GPU, in the same run.

    python benchmarks/cublasmp_matmul.py [--size 8192] [--iters 20] [--warmup 5]
                                         [--small 256] [--calls 1000] [--json]

Two figures, each next to torch.matmul on the same data and stream:

* throughput: a bf16 ``size^3`` matmul with fp32 compute, TFLOP/s from the median of
  ``iters`` CUDA-event timings after ``warmup`` runs;
* host time: the wall time of one ``cublasmp.matmul`` call through the binding for a
  ``small^3`` bf16 matmul (``perf_counter`` around the call, median of ``calls`` calls,
  nothing synchronised inside the loop), against one ``torch.matmul`` call.

cuBLASMp runs TN (A stored ``k x m`` column-major, which is torch's row-major ``m x k``), so
both libraries multiply the same ``m x k`` and ``k x n`` operands.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.bindings import cublasmp, nccl  # noqa: E402

MDA = cublasmp.MatmulDescriptorAttribute


@dataclass
class Problem:
    """Everything one cublasmp.matmul call needs, kept alive together."""

    m: int
    n: int
    k: int
    a: Any  # torch tensors: A storage (m, k) = column-major k x m; B row-major k x n (for torch)
    b: Any
    d: Any  # D storage (n, m) = column-major m x n
    b_storage: Any  # B storage (n, k) = column-major k x n
    host: Any  # host workspace (numpy)
    alpha: ctypes.c_float
    beta: ctypes.c_float
    args: tuple[Any, ...]  # the full argument tuple of cublasmp.matmul


def make_problem(stack: contextlib.ExitStack, handle: cublasmp.Handle, grid: cublasmp.Grid, size: int,
                 seed: int) -> Problem:
    m = n = k = size
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((m, k), generator=gen, device="cuda").to(torch.bfloat16)
    b_rowmajor = torch.randn((k, n), generator=gen, device="cuda").to(torch.bfloat16)
    b = b_rowmajor.t().contiguous()  # column-major k x n
    d = torch.empty((n, m), dtype=torch.bfloat16, device="cuda")  # column-major m x n
    bf16 = cublasmp.CudaDataType.R_16BF

    def desc(rows: int, cols: int) -> cublasmp.MatrixDescriptor:
        handle_ = cublasmp.matrix_descriptor_create(rows, cols, rows, cols, 0, 0,
                                                    cublasmp.numroc(rows, rows, 0, 0, 1), bf16, grid)
        stack.callback(cublasmp.matrix_descriptor_destroy, handle_)
        return handle_

    desc_a, desc_b, desc_d = desc(k, m), desc(k, n), desc(m, n)
    mm = cublasmp.matmul_descriptor_create(cublasmp.CublasComputeType.COMPUTE_32F)
    stack.callback(cublasmp.matmul_descriptor_destroy, mm)
    cublasmp.matmul_descriptor_set(mm, MDA.TRANSA, cublasmp.CublasOperation.T)
    cublasmp.matmul_descriptor_set(mm, MDA.TRANSB, cublasmp.CublasOperation.N)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    head = (handle, mm, m, n, k, ctypes.addressof(alpha), a.data_ptr(), 1, 1, desc_a, b.data_ptr(), 1, 1, desc_b,
            ctypes.addressof(beta), 0, 1, 1, cublasmp.MatrixDescriptor(0), d.data_ptr(), 1, 1, desc_d)
    device_bytes, host_bytes = cublasmp.matmul_buffer_size(*head)
    work = 0
    if device_bytes:
        work = cublasmp.malloc(grid, device_bytes)

        def release() -> None:
            torch.cuda.synchronize()
            cublasmp.free(grid, work)

        stack.callback(release)
    host = np.zeros(max(1, host_bytes), dtype=np.uint8)
    args = (*head, work, device_bytes, int(host.ctypes.data), host_bytes)
    return Problem(m, n, k, a, b_rowmajor, d, b, host, alpha, beta, args)


def event_times_ms(fn: Callable[[], object], iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


def host_times_us(fn: Callable[[], object], calls: int, warmup: int, sync_every: int = 0) -> list[float]:
    """Wall time of each of `calls` calls of `fn`, in µs; with `sync_every`, the GPU catches up
    every that many calls (untimed), so that a long queue never makes a call wait."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    clock = time.perf_counter
    for _ in range(calls):
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1e6)
        if sync_every and len(times) % sync_every == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8192, help="m = n = k of the throughput matmul")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--small", type=int, default=256, help="m = n = k of the host-time matmul")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)  # torch.matmul and cuBLASMp run on the same stream
    comm = nccl.comm_init_rank(1, nccl.get_unique_id(), 0)
    handle = cublasmp.create(int(stream.cuda_stream))
    grid = cublasmp.grid_create(1, 1, cublasmp.GridLayout.COL_MAJOR, comm)
    rows: dict[str, dict[str, float]] = {}
    try:
        with contextlib.ExitStack() as stack:
            big = make_problem(stack, handle, grid, a.size, seed=0)
            flop = 2.0 * big.m * big.n * big.k
            mp_ms = statistics.median(event_times_ms(lambda: cublasmp.matmul(*big.args), a.iters, a.warmup))
            torch_ms = statistics.median(event_times_ms(lambda: torch.matmul(big.a, big.b), a.iters, a.warmup))
            # The two agree (a spot check, not a test): D^T stored row-major is torch's m x n result.
            check = torch.matmul(big.a[:256], big.b[:, :256]).float()
            diff = float((big.d.t()[:256, :256].float() - check).abs().max())
            rows[f"bf16 {a.size}^3 matmul"] = {"mpbind_tflops": flop / mp_ms / 1e9,
                                               "torch_tflops": flop / torch_ms / 1e9,
                                               "mpbind_ms": mp_ms, "torch_ms": torch_ms, "max_abs_diff": diff}
        with contextlib.ExitStack() as stack:
            small = make_problem(stack, handle, grid, a.small, seed=1)
            mp_us = statistics.median(host_times_us(lambda: cublasmp.matmul(*small.args), a.calls, 20))
            torch_us = statistics.median(host_times_us(lambda: torch.matmul(small.a, small.b), a.calls, 20))
            rows[f"host time per call, bf16 {a.small}^3"] = {"mpbind_us": mp_us, "torch_us": torch_us}
    finally:
        torch.cuda.synchronize()
        cublasmp.grid_destroy(grid)
        cublasmp.destroy(handle)
        nccl.comm_finalize(comm)
        nccl.comm_destroy(comm)

    info = {"gpu": torch.cuda.get_device_name(0), "cublasmp": _loader.loaded_version("cublasmp"),
            "nccl": _loader.loaded_version("nccl"), "torch": torch.__version__}
    if a.json:
        print(json.dumps({"info": info, "results": rows}, indent=1))
        return 0
    print(f"{info['gpu']}: cuBLASMp {info['cublasmp']}, NCCL {info['nccl']}, torch {info['torch']}; "
          f"1 rank, 1 x 1 grid")
    thr = rows[f"bf16 {a.size}^3 matmul"]
    host = rows[f"host time per call, bf16 {a.small}^3"]
    print(f"{'':40s} {'mpbind cuBLASMp':>16s} {'torch.matmul':>14s} {'ratio':>7s}")
    print(f"{f'bf16 {a.size}^3, fp32 compute (TFLOP/s)':40s} {thr['mpbind_tflops']:16.1f} "
          f"{thr['torch_tflops']:14.1f} {thr['mpbind_tflops'] / thr['torch_tflops']:7.3f}")
    print(f"{'  median time (ms)':40s} {thr['mpbind_ms']:16.3f} {thr['torch_ms']:14.3f}")
    print(f"{f'host time of one call, {a.small}^3 (us)':40s} {host['mpbind_us']:16.2f} "
          f"{host['torch_us']:14.2f} {host['mpbind_us'] / host['torch_us']:7.3f}")
    print(f"(median of {a.iters} timed runs after {a.warmup} warm-up; host time: median of {a.calls} calls; "
          f"spot-check max |D - torch| = {thr['max_abs_diff']:.3g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
