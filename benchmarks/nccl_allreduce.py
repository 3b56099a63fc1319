"""NCCL ``all_reduce`` through mpbind's layer (without and with the watchdog), the flat binding and
``torch.distributed``, one process per GPU, in one run on the same libnccl.

    mpirun -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
        python benchmarks/nccl_allreduce.py [--min 8] [--max 1073741824] [--calls 1000] [--out DIR]

For each message size (float32, from ``--min`` to ``--max`` bytes, x4 steps), interleaved batch by
batch so that the four see the same machine state:

* host time per call: ``perf_counter_ns`` around one call, nothing synchronised in the loop,
  the median over every call (``--calls`` of them at small sizes, fewer where the GPU time of
  the queued calls would dominate);
* GPU time and bus bandwidth: CUDA events around ``--iters`` back-to-back calls on the current
  stream, queued behind a spin kernel that holds the stream until the host has queued them all (so
  the events time the GPU's work alone, not the host's pace, which at one rank and small sizes is
  the slower of the two), ``bytes * 2 (n - 1) / n / time``, the median over batches.

The layer is called as a user writes it: ``comm.all_reduce(t, t)`` with a torch tensor, on a
communicator without the watchdog (``layer``) and on one it watches (``watched``: ``watchdog=True``,
each call then recorded in the flight record with a CUDA event after it); the flat call gets the
pointer, count and communicator handle; torch.distributed runs ``dist.all_reduce(t)``.
``watched_minus_layer_us`` is the watchdog's host cost per call (budget: 1.0 us: per batch, the
difference of the two medians, then the median over batches) and ``watched_over_layer_gpu`` its GPU
cost (the ratio of GPU times; 1.0: none). Ratios are paired: per batch, then the median. Rank 0
prints the table and writes ``nccl_allreduce.csv`` (and ``.png`` where matplotlib is installed)
under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
from _timing import host_times  # noqa: E402
from _torch_gpu import queued_us  # noqa: E402

from mpbind import nccl  # noqa: E402
from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.bindings import nccl as flat  # noqa: E402

VARIANTS = ("layer", "watched", "flat", "torch")


def loaded_libnccl() -> list[str]:
    """Every libnccl file mapped into this process."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libnccl" in line and "/" in line}
    return sorted(os.path.realpath(p) for p in paths)


def setup(world: Any) -> tuple[nccl.Communicator, nccl.Communicator, int]:
    rank, size = world.Get_rank(), world.Get_size()
    gpus = torch.cuda.device_count()
    if size > gpus:
        raise SystemExit(f"{size} processes but {gpus} GPUs: NCCL allows one rank per GPU")
    torch.cuda.set_device(rank)
    path = world.bcast(tempfile.mktemp(prefix="nccl-bench-rdzv-") if rank == 0 else None)
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=rank, world_size=size,
                            device_id=torch.device("cuda", rank))
    comm = nccl.Communicator.from_mpi(world, watchdog=False)
    watched = nccl.Communicator.from_mpi(world, watchdog=True)
    return comm, watched, rank


def calls_for(nbytes: int, calls: int) -> int:
    """Fewer calls where the queued GPU work (~nbytes / 100 GB/s each) would exceed ~0.5 s."""
    return max(20, min(calls, int(0.5 / max(nbytes / 100e9, 1e-6))))


def device_time(fn: Callable[[], Any], iters: int) -> float:
    """Seconds per call of the GPU's work: CUDA events around `iters` calls queued while a spin kernel
    holds the stream (~40 us of host time per call of room, far more than a call takes)."""
    torch.cuda._sleep(int(iters * 40e-6 * SPIN_HZ))
    return queued_us(fn, iters) / 1e6


SPIN_HZ = 1.98e9  # torch.cuda._sleep counts cycles: an H200's SM clock, the order of any GPU's


def measure(comm: nccl.Communicator, watched: nccl.Communicator, nbytes: int, args: argparse.Namespace,
            world: Any) -> dict[str, Any]:
    n = nbytes // 4
    t = torch.ones(n, dtype=torch.float32, device="cuda")
    handle = comm.ptr
    stream = torch.cuda.current_stream().cuda_stream
    fns: dict[str, Callable[[], Any]] = {
        "layer": lambda: comm.all_reduce(t, t),
        "watched": lambda: watched.all_reduce(t, t),
        "flat": lambda: flat.all_reduce(t.data_ptr(), t.data_ptr(), n, flat.DataType.FLOAT32, flat.RedOp.SUM,
                                        handle, stream),
        "torch": lambda: dist.all_reduce(t),
    }
    for fn in fns.values():  # warm up (and check every path agrees on the result below)
        fn()
    torch.cuda.synchronize()
    t.fill_(1.0)
    for name in VARIANTS:
        fns[name]()
    torch.cuda.synchronize()
    expected = float(comm.size ** len(VARIANTS))
    if n and not bool(torch.all(t == expected)):
        raise SystemExit(f"wrong all_reduce result at {nbytes} B: {t[:4].tolist()} != {expected}")
    world.Barrier()
    host: dict[str, list[float]] = {v: [] for v in VARIANTS}
    batch_host: dict[str, list[float]] = {v: [] for v in VARIANTS}  # each batch's median
    dev: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_batch = max(1, calls_for(nbytes, args.calls) // args.batches)
    iters = max(2, min(args.iters, calls_for(nbytes, args.iters)))
    for b in range(args.batches):
        k = b % len(VARIANTS)
        order = VARIANTS[k:] + VARIANTS[:k]
        for name in order:
            t.zero_()
            torch.cuda.synchronize()
            world.Barrier()
            times = host_times(fns[name], per_batch)
            host[name] += times
            batch_host[name].append(statistics.median(times))
            torch.cuda.synchronize()
            world.Barrier()
            dev[name].append(device_time(fns[name], iters))
    row: dict[str, Any] = {"bytes": nbytes}
    factor = 2 * (comm.size - 1) / comm.size
    for name in VARIANTS:
        row[f"{name}_host_us"] = statistics.median(host[name])
        row[f"{name}_busbw_GBps"] = nbytes * factor / statistics.median(dev[name]) / 1e9
    row["layer_minus_flat_us"] = row["layer_host_us"] - row["flat_host_us"]
    for name in VARIANTS:
        row[f"{name}_gpu_us"] = statistics.median(dev[name]) * 1e6
    row["watched_minus_layer_us"] = statistics.median(
        [w - lay for w, lay in zip(batch_host["watched"], batch_host["layer"], strict=True)])
    row["watched_over_layer_gpu"] = statistics.median(
        [dw / dl for dl, dw in zip(dev["layer"], dev["watched"], strict=True)])
    row["layer_over_torch_host"] = row["layer_host_us"] / row["torch_host_us"]
    ratios = [dl / dt for dl, dt in zip(dev["torch"], dev["layer"], strict=True)]  # busbw ratio, paired
    row["layer_over_torch_busbw"] = statistics.median(ratios)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min", type=int, default=8)
    ap.add_argument("--max", type=int, default=1 << 30)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    comm, watched, rank = setup(world)
    sizes = []
    s = args.min
    while s <= args.max:
        sizes.append(s)
        s *= 4
    rows = [measure(comm, watched, nbytes, args, world) for nbytes in sizes]
    libs = loaded_libnccl()
    if rank == 0:
        print(f"# {comm.size} ranks; libnccl mapped: {libs}; mpbind loaded {_loader.load('nccl').path} "
              f"(NCCL {flat.get_version()}); torch reports NCCL {torch.cuda.nccl.version()}")
        _results.report(args.out / "nccl_allreduce.csv", rows, f"all_reduce float32, {comm.size} GPUs", "bytes", [
            ("host time per call (µs)", VARIANTS, "_host_us"), ("GPU time per call (µs)", VARIANTS, "_gpu_us")])
    if watched.failed:
        raise SystemExit(f"the watchdog failed the watched communicator: {watched.recent_operations()[-3:]}")
    watched.close()
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
