"""The distributed C2C FFT inside ``jax.jit`` (``mpbind.jax.fft``) against the eager plan
(``FFTPlan.execute`` with an input and an output array: the same copy in, transform and copy out)
on the same pieces, in one run.

    mpirun -np N python benchmarks/jax_fft.py [--sizes 64,128,256] [--iters 50] [--one-gpu] [--out DIR]

Per cube n^3 (complex64), on every PE:

* ``eager_ms``, ``jit_ms`` and ``jit_events_ms``: time per transform in a stream of ``--iters``
  back-to-back calls (host clock from the first call to the last result, divided by the calls): the
  GPU's time once the host keeps ahead of it. ``jit``: a plan on the default stream (the launch points
  it at XLA's stream, cufftSetStream, and back); ``jit_events``: a plan on a stream of its own (joined
  to XLA's by an event each way); ``eager``: the latter's ``execute``. ``ratio``, ``ratio_events``:
  jit / eager (target <= 1.15);
* ``zero_copy_ms``: the events plan transforming its own NVSHMEM buffer in place (``execute()``: no
  copy in or out), what a zero-copy path would take; ``copy_share``: 1 - zero_copy / eager, the share
  of the eager (and jitted) call's time that the two copies take (a zero-copy path needs XLA's
  operands in NVSHMEM symmetric memory, which XLA's allocator cannot give);
* ``jit_host_us``: host time of one jitted call of the events plan (dispatch only; median);
* ``plan_MiB``: the plan's NVSHMEM buffer, which both use; ``xla_temp_B``: the scratch XLA allocates
  for the jitted call (``memory_analysis``: 0 means nothing per call beyond the output).

PE 0 prints the table (the slowest PE's times) and writes ``jax_fft.csv`` and ``.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("XLA_PYTHON_CLIENT_PREALLOCATE", "false")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402

import mpbind.jax as mpj  # noqa: E402
from mpbind import fft, nvshmem  # noqa: E402


def per_call(run: Any, done: Any, iters: int, comm: Any) -> float:
    """ms per call of `iters` back-to-back calls of `run`, `done` waiting for the last."""
    for _ in range(3):
        done(run())
    comm.Barrier()
    t0 = time.perf_counter()
    out = None
    for _ in range(iters):
        out = run()
    done(out)
    return (time.perf_counter() - t0) * 1e3 / iters


def measure(comm: Any, device: Any, n: int, iters: int) -> dict[str, Any]:
    own = cp.cuda.Stream(non_blocking=True)
    p = fft.plan(comm, (n, n, n), "complex64")  # on the default stream: launched on XLA's (cufftSetStream)
    q = fft.plan(comm, (n, n, n), "complex64", stream=own)  # its own stream: joined to XLA's by events
    try:
        rng = np.random.default_rng(n)
        host = (rng.standard_normal(p.input_shape) + 1j * rng.standard_normal(p.input_shape)).astype(np.complex64)
        x_cp = cp.asarray(host)
        out_cp = cp.empty(p.output_shape, dtype=cp.complex64)
        eager = per_call(lambda: q.execute(x_cp, out=out_cp), lambda _: cp.cuda.runtime.deviceSynchronize(), iters,
                         comm)
        zero_copy = per_call(lambda: q.execute(), lambda _: cp.cuda.runtime.deviceSynchronize(), iters, comm)
        x = jax.device_put(host, device)
        step = jax.jit(lambda v: mpj.fft(v, p))
        stepq = jax.jit(lambda v: mpj.fft(v, q))
        jit = per_call(lambda: step(x), lambda r: r.block_until_ready(), iters, comm)
        jit_events = per_call(lambda: stepq(x), lambda r: r.block_until_ready(), iters, comm)
        expect = cp.asnumpy(out_cp)
        for got in (np.asarray(step(x)), np.asarray(stepq(x))):
            assert np.allclose(got, expect, rtol=1e-4, atol=1e-4 * float(np.abs(expect).max())), "jit and eager differ"
        host_us = []
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            r = stepq(x)
            host_us.append((time.perf_counter_ns() - t0) / 1e3)
            r.block_until_ready()
        analysis = stepq.lower(x).compile().memory_analysis()
        temp = int(getattr(analysis, "temp_size_in_bytes", -1)) if analysis is not None else -1
        return {"n": n, "eager_ms": eager, "jit_ms": jit, "jit_events_ms": jit_events, "zero_copy_ms": zero_copy,
                "ratio": jit / eager, "ratio_events": jit_events / eager, "copy_share": 1 - zero_copy / eager,
                "jit_host_us": float(statistics.median(host_us)),
                "plan_MiB": p.buffer_bytes / 2**20, "xla_temp_B": temp}
    finally:
        cp.cuda.runtime.deviceSynchronize()
        comm.Barrier()
        q.close()
        p.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,128,256", help="cube edges, comma-separated")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0")
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    pe, npes = comm.Get_rank(), comm.Get_size()
    gpus = jax.devices("gpu")
    index = 0 if a.one_gpu else pe % len(gpus)
    cp.cuda.Device(index).use()
    nvshmem.init(mpi_comm=comm, device=index)
    try:
        rows = []
        for n in (int(s) for s in a.sizes.split(",")):
            mine = measure(comm, gpus[index], n, a.iters)
            every = comm.gather(mine, root=0)
            if pe == 0:
                slowest = dict(mine)
                for k in ("eager_ms", "jit_ms", "jit_events_ms", "zero_copy_ms", "jit_host_us"):
                    slowest[k] = max(r[k] for r in every)
                slowest["ratio"] = slowest["jit_ms"] / slowest["eager_ms"]
                slowest["ratio_events"] = slowest["jit_events_ms"] / slowest["eager_ms"]
                slowest["copy_share"] = 1 - slowest["zero_copy_ms"] / slowest["eager_ms"]
                rows.append(slowest)
        if pe == 0:
            print(f"jax {jax.__version__}; {npes} PE(s){' sharing one GPU' if a.one_gpu else ''}; complex64 C2C")
            _results.report(a.out / "jax_fft.csv", rows, f"C2C complex64, {npes} PE(s)", "n",
                            [("ms per transform", ["eager_ms", "jit_ms", "jit_events_ms", "zero_copy_ms"], ""),
                             ("jit / eager", ["ratio", "ratio_events"], "")])
    finally:
        nvshmem.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
