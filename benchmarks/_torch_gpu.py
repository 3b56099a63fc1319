"""Helpers of the GPU benchmarks that need no mpbind (nvmath-python's processes in
``planned_matmul_host.py`` import none): the error of a result, CUDA-event timing with the ranks
aligned, torch's NCCL process group, and which NCCL libraries the process mapped."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed


def relative_error(got: Any, want: Any) -> float:
    """max |got - want| / max |want|, in float32."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def event_median_us(fn: Callable[[], object], iters: int, warmup: int, world: Any) -> float:
    """Microseconds of one call on this rank: the median of `iters` CUDA-event timings, the ranks of
    `world` (mpi4py) aligned by a barrier before each, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        torch.cuda.synchronize()
        world.Barrier()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def queued_us(fn: Callable[[], object], iters: int) -> float:
    """Microseconds per call of `iters` calls queued back to back (no wait between them), one CUDA
    event pair around them all on the current stream."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / iters


def start_process_group(rank: int, size: int, port: int) -> None:
    """torch.distributed's NCCL process group on the current GPU, met at 127.0.0.1:`port` (unless
    MASTER_ADDR and MASTER_PORT say otherwise)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    device = torch.device("cuda", torch.cuda.current_device())
    torch.distributed.init_process_group("nccl", rank=rank, world_size=size, device_id=device)


def mapped_nccl() -> str:
    """Every libnccl mapped into this process (LD_PRELOAD puts one in front of torch's own)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line and "libnccl" in line.rsplit("/", 1)[-1]}
    return ", ".join(sorted(paths)) or "none"
