"""Distributed 3-D C2C complex64 FFTs through ``mpbind.fft`` on two GPUs against ``torch.fft.fftn`` on
one GPU and nvmath-python 1.0's distributed FFT; the transform's split between local FFTs and the
exchange (timed as an ``mpbind.fft`` reshape of the same size) and that exchange against NCCL's
``all_to_all`` of the same bytes; host time per execute against nvmath-python's and the flat exec.

Three runs on two GPUs (each library in its own process: torch's cuFFT and nvmath's
cuBLASMp/NCCL pins must not meet mpbind's cuFFTMp), then a merge::

    X="-x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
       -x NVSHMEM_SYMMETRIC_SIZE=34359738368 -x PYTHONPATH -x LD_LIBRARY_PATH"
    mpirun --allow-run-as-root --bind-to none -np 2 $X python benchmarks/fft_distributed.py --mode mpbind --out DIR
    mpirun --allow-run-as-root --bind-to none -np 2 $X python benchmarks/fft_distributed.py --mode nvmath --out DIR
    mpirun --allow-run-as-root --bind-to none -np 2 $X python benchmarks/fft_distributed.py --mode torch --out DIR
    python benchmarks/fft_distributed.py --mode report --out DIR

(nvmath-python 1.0 installed on its own library path, with the cuBLASMp/NCCL versions it pins.)

Each figure is the median over ``--iters`` CUDA-event timings of one call on the plan's stream, after
``--warmup`` calls, the ranks aligned by a barrier before each; between timed calls the data is
rescaled outside the window so that it stays finite. Host time per call: ``perf_counter`` around the
call with the stream drained outside the window, median of ``--host-calls``, at the first size.
Series: ``Y-slabs`` (X-slabs in, Y-slabs out: cuFFTMp's own layout) and ``X-slabs`` (back on X-slabs,
what nvmath-python calls redistributed). Before timing, every implementation's result at 64^3,
50x62x36 and 51x63x36 is checked against ``numpy.fft.fftn`` on every rank. Where PEs share a GPU (under
MPS), NCCL's ``all_to_all`` is not run: NCCL needs a GPU per rank. Each mode writes
``fft_distributed.<mode>.csv`` under ``--out``; ``report`` prints the table, the ratios against the
targets, and writes ``fft_distributed.csv`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402

CHECK_SHAPES = ((64, 64, 64), (50, 62, 36), (51, 63, 36))
HEADER = ["mode", "size", "series", "metric", "value"]
Row = tuple[str, int, str, str, float]


def slab(n: int, rank: int, nranks: int) -> tuple[int, int]:
    q, r = divmod(n, nranks)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def median_ms(fn: Callable[[], Any], between: Callable[[], Any], iters: int, warmup: int, comm: Any,
              stream: Any, events: Callable[[], tuple[Any, Any, Callable[[Any, Any], float]]]) -> float:
    """Median GPU milliseconds of `fn` on `stream` (CUDA events), ranks aligned before each call."""
    for _ in range(warmup):
        fn()
        between()
    times = []
    for _ in range(iters):
        stream.synchronize()
        comm.Barrier()
        start, end, elapsed = events()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(elapsed(start, end))
        between()
    return statistics.median(times)


def host_us(fn: Callable[[], Any], stream: Any, calls: int) -> float:
    out = []
    for _ in range(calls):
        stream.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    stream.synchronize()
    return statistics.median(out)


# --- mpbind ---------------------------------------------------------------------------------------------------


def run_mpbind(a: argparse.Namespace, comm: Any) -> list[Row]:
    import cupy as cp

    from mpbind import distributions as dist
    from mpbind import fft, nccl, nvshmem
    from mpbind.bindings import cufftmp as flat
    from mpbind.bindings import nvshmem as flat_nvshmem

    rank, nranks = comm.Get_rank(), comm.Get_size()
    device = rank % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    nvshmem.init(mpi_comm=comm, device=device)
    stream = cp.cuda.Stream(non_blocking=True)

    def events() -> tuple[Any, Any, Callable[[Any, Any], float]]:
        return cp.cuda.Event(), cp.cuda.Event(), cp.cuda.get_elapsed_time

    rows: list[Row] = []
    for shape in CHECK_SHAPES:  # correctness first, in both output distributions
        g = (np.random.default_rng(7).standard_normal(shape) + 1j * np.random.default_rng(8).standard_normal(shape))
        g = g.astype(np.complex64)
        want = np.fft.fftn(g.astype(np.complex128))
        for series, output in (("Y-slabs", None), ("X-slabs", dist.Split(shape, nranks, 0))):
            with fft.plan(comm, shape, "complex64", output=output, stream=stream) as p:
                with stream:
                    y = p.execute(cp.asarray(g[slab(shape[0], rank, nranks)[0]:slab(shape[0], rank, nranks)[1]]))
                    got = cp.asnumpy(cp.asarray(y))
                b = p.output_box
                err = rel_err(got, want[b.lower[0]:b.upper[0], b.lower[1]:b.upper[1]])
                print(f"[rank {rank}] mpbind {series} {shape}: rel. err {err:.2e} ({p.algorithm})", flush=True)
                rows.append(("mpbind", shape[0], series, f"relerr_{'x'.join(map(str, shape))}", err))
    # NCCL's all_to_all, the exchange's anchor, needs a GPU per rank: not run where PEs share one (MPS)
    shares_gpu = flat_nvshmem.team_n_pes(flat_nvshmem.Team.SAME_GPU) > 1  # alike on every PE
    comm_nccl = None if shares_gpu else nccl.Communicator.from_mpi(comm)
    if shares_gpu and rank == 0:
        print("PEs share a GPU: NCCL all_to_all not run (NCCL needs one rank per GPU)", flush=True)
    try:
        for i, n in enumerate(a.sizes):
            shape = (n, n, n)
            scale = np.float32(n ** -1.5)
            for series, output in (("Y-slabs", None), ("X-slabs", dist.Split(shape, nranks, 0))):
                p = fft.plan(comm, shape, "complex64", output=output, stream=stream)
                try:
                    with stream:
                        view = cp.asarray(p.input_view())
                        view[...] = cp.random.standard_normal(view.shape, dtype=cp.float32)
                        own = p.descriptor  # the plan's buffer, whole
                        buf = cp.asarray(fft.DeviceView(int(own.data), (int(own.nbytes) // 8,), (1,), "complex64",
                                                        device, 0, None))

                    def rescale(buf: Any = buf, s: Any = scale) -> None:
                        with stream:
                            buf *= s

                    def rescale_n3(buf: Any = buf, s: Any = scale * scale) -> None:  # N^-3 after a round trip
                        with stream:
                            buf *= s

                    fwd = median_ms(lambda p=p: p.execute(), rescale, a.iters, a.warmup, comm, stream, events)
                    both = median_ms(lambda p=p: (p.execute(), p.execute(direction=fft.INVERSE)), rescale_n3,
                                     a.iters, a.warmup, comm, stream, events)
                    rows += [("mpbind", n, series, "gpu_ms_forward", fwd),
                             ("mpbind", n, series, "gpu_ms_fwd_inv", both)]
                    cplan = p.cufftmp_plan
                    if p.algorithm == "slabs":
                        handle, ptr = cplan.handle, int(p.descriptor.data)

                        def flat_call(h: int = handle, q: int = ptr) -> None:
                            flat.exec_c2c(h, q, q, fft.FORWARD)
                    else:
                        handle, desc = cplan.handle, p.descriptor.ptr

                        def flat_call(h: int = handle, q: int = desc) -> None:
                            flat.xt_exec_descriptor_c2c(h, q, q, fft.FORWARD)
                    rows.append(("mpbind", n, series, "gpu_ms_forward_flat",
                                 median_ms(flat_call, rescale, a.iters, a.warmup, comm, stream, events)))
                    if i == 0:
                        rows.append(("mpbind", n, series, "host_us_execute",
                                     host_us(lambda p=p: p.execute(), stream, a.host_calls)))
                        rescale()
                        rows.append(("mpbind", n, series, "host_us_flat", host_us(flat_call, stream, a.host_calls)))
                        rescale()
                finally:
                    stream.synchronize()
                    p.close()
            # The exchange alone: a reshape of the same complex64 array, X-slabs -> Y-slabs, in place buffers.
            r = fft.plan_reshape(comm, dist.Split(shape, nranks, 0), dist.Split(shape, nranks, 1), "complex64",
                                 stream=stream)
            try:
                rows.append(("mpbind", n, "exchange", "gpu_ms_reshape",
                             median_ms(lambda r=r: r.execute(), lambda: None, a.iters, a.warmup, comm, stream,
                                       events)))
                rows.append(("mpbind", n, "exchange", "gpu_ms_reshape_nosync",
                             median_ms(lambda r=r: r.execute(sync=False), lambda: None, a.iters, a.warmup, comm,
                                       stream, events)))
            finally:
                stream.synchronize()
                r.close()
            if comm_nccl is not None:
                rows.append(("mpbind", n, "exchange", "gpu_ms_nccl_all_to_all",
                             nccl_all_to_all_ms(comm_nccl, n * n * n // nranks, a, comm, stream, events)))
                cp.get_default_memory_pool().free_all_blocks()
            if rank == 0:
                print(f"mpbind {n}^3 done", flush=True)
    finally:
        if comm_nccl is not None:
            comm_nccl.close()
        nvshmem.finalize()
    return rows


def nccl_all_to_all_ms(comm_nccl: Any, elements: int, a: argparse.Namespace, comm: Any, stream: Any,
                       events: Callable[[], tuple[Any, Any, Callable[[Any, Any], float]]]) -> float:
    """GPU ms of NCCL's all_to_all of `elements` complex64 per rank (one rank's slab, an even split)."""
    import cupy as cp

    with stream:
        send = cp.zeros(2 * elements, cp.float32)
        recv = cp.empty(2 * elements, cp.float32)
    stream.synchronize()
    return median_ms(lambda: comm_nccl.all_to_all(send, recv, stream), lambda: None, a.iters, a.warmup, comm,
                     stream, events)


# --- nvmath-python ----------------------------------------------------------------------------------------------


def run_nvmath(a: argparse.Namespace, comm: Any) -> list[Row]:
    import cupy as cp
    import nvmath
    import nvmath.distributed
    from nvmath.distributed.distribution import Slab

    rank, nranks = comm.Get_rank(), comm.Get_size()
    device = rank % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    nvmath.distributed.initialize(device, comm, backends=["nvshmem"])
    fftmod = nvmath.distributed.fft
    stream = cp.cuda.get_current_stream()

    def events() -> tuple[Any, Any, Callable[[Any, Any], float]]:
        return cp.cuda.Event(), cp.cuda.Event(), cp.cuda.get_elapsed_time

    rows: list[Row] = []
    for shape in CHECK_SHAPES:
        g = (np.random.default_rng(7).standard_normal(shape) + 1j * np.random.default_rng(8).standard_normal(shape))
        g = g.astype(np.complex64)
        want = np.fft.fftn(g.astype(np.complex128))
        x0, x1 = slab(shape[0], rank, nranks)
        for series, redistribute in (("Y-slabs", False), ("X-slabs", True)):
            op = fftmod.allocate_operand((x1 - x0, *shape[1:]), cp, input_dtype=cp.complex64, distribution=Slab.X)
            op[:] = cp.asarray(g[x0:x1])
            stream.synchronize()
            try:
                with fftmod.FFT(op, distribution=Slab.X, options={"redistribute": redistribute}) as f:
                    f.plan()
                    got = cp.asnumpy(f.execute())
                if redistribute:
                    ref = want[x0:x1]
                else:
                    y0, y1 = slab(shape[1], rank, nranks)
                    ref = want[:, y0:y1]
                err = rel_err(got, ref) if got.shape == ref.shape else float("inf")
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                print(f"[rank {rank}] nvmath {series} {shape}: {type(exc).__name__}: {exc}", flush=True)
                err = float("nan")
            finally:
                nvmath.distributed.free_symmetric_memory(op)
            print(f"[rank {rank}] nvmath {series} {shape}: rel. err {err:.2e}", flush=True)
            rows.append(("nvmath", shape[0], series, f"relerr_{'x'.join(map(str, shape))}", err))
    for i, n in enumerate(a.sizes):
        x0, x1 = slab(n, rank, nranks)
        for series, redistribute in (("Y-slabs", False), ("X-slabs", True)):
            op = fftmod.allocate_operand((x1 - x0, n, n), cp, input_dtype=cp.complex64, distribution=Slab.X)
            op[:] = cp.random.standard_normal(op.shape, dtype=cp.float32)
            stream.synchronize()
            scale = np.float32(n ** -1.5)
            try:
                f = fftmod.FFT(op, distribution=Slab.X, options={"redistribute": redistribute})
                f.plan()
                holder: dict[str, Any] = {}

                def call(f: Any = f, h: dict[str, Any] = holder) -> None:
                    h["b"] = f.execute()

                def rescale(h: dict[str, Any] = holder, s: Any = scale) -> None:
                    h["b"] *= s

                call()
                rows.append(("nvmath", n, series, "gpu_ms_forward",
                             median_ms(call, rescale, a.iters, a.warmup, comm, stream, events)))
                if i == 0:
                    rows.append(("nvmath", n, series, "host_us_execute", host_us(call, stream, a.host_calls)))
                    rescale()
                f.free()
            except Exception as exc:  # noqa: BLE001
                print(f"[rank {rank}] nvmath {series} {n}^3: {type(exc).__name__}: {exc}", flush=True)
            finally:
                nvmath.distributed.free_symmetric_memory(op)
                cp.get_default_memory_pool().free_all_blocks()
            comm.Barrier()
    nvmath.distributed.finalize()
    return rows


# --- torch.fft on one GPU -------------------------------------------------------------------------------------


def run_torch(a: argparse.Namespace, comm: Any) -> list[Row]:
    import torch

    rank = comm.Get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    def events() -> tuple[Any, Any, Callable[[Any, Any], float]]:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return s, e, lambda x, y: x.elapsed_time(y)

    stream = torch.cuda.current_stream()  # torch's events record on torch's streams only
    rows: list[Row] = []
    for i, n in enumerate(a.sizes):
        x = torch.randn(n, n, n, dtype=torch.complex64, device="cuda")

        def forward(x: Any = x) -> Any:
            return torch.fft.fftn(x)

        def round_trip(x: Any = x) -> Any:
            return torch.fft.ifftn(torch.fft.fftn(x))

        fwd = median_ms(forward, lambda: None, a.iters, a.warmup, comm, stream, events)
        both = median_ms(round_trip, lambda: None, a.iters, a.warmup, comm, stream, events)
        rows += [("torch", n, "one GPU", "gpu_ms_forward", fwd), ("torch", n, "one GPU", "gpu_ms_fwd_inv", both)]
        if i == 0:
            rows.append(("torch", n, "one GPU", "host_us_execute", host_us(forward, stream, a.host_calls)))
        x = forward = round_trip = None
        torch.cuda.empty_cache()
    return rows if rank == 0 else []


# --- report ---------------------------------------------------------------------------------------------------


def report(out: Path) -> int:
    rows: list[list[str]] = []
    for mode in ("mpbind", "nvmath", "torch"):
        path = out / f"fft_distributed.{mode}.csv"
        if path.exists():
            rows += _results.read_csv(path)[1]
        else:
            print(f"({path.name} missing: that run was not made)")
    if not rows:
        return 1
    # Every rank's row: the slowest rank's figure is the transform's.
    worst: dict[tuple[str, int, str, str], float] = {}
    for mode, size, series, metric, value in rows:
        key = (mode, int(size), series, metric)
        v = float(value)
        worst[key] = max(worst.get(key, v), v)
    table = sorted(worst.items())
    _results.write_csv(out / "fft_distributed.csv", HEADER, [(*k, v) for k, v in table])
    print(_results.table(HEADER[1:] + ["mode"], [(k[1], k[2], k[3], v, k[0]) for k, v in table]))
    sizes = sorted({k[1] for k in worst if k[3] == "gpu_ms_forward"})

    def get(mode: str, size: int, series: str, metric: str) -> float | None:
        return worst.get((mode, size, series, metric))

    print("\ntargets:")
    for n in sizes:
        for series in ("Y-slabs", "X-slabs"):
            ours, theirs = get("mpbind", n, series, "gpu_ms_forward"), get("nvmath", n, series, "gpu_ms_forward")
            if ours and theirs:
                print(f"  {n}^3 {series}: mpbind / nvmath execute time = {ours / theirs:.3f} (target <= 1.05)")
        ex, a2a = get("mpbind", n, "exchange", "gpu_ms_reshape"), get("mpbind", n, "exchange",
                                                                         "gpu_ms_nccl_all_to_all")
        fwd = get("mpbind", n, "Y-slabs", "gpu_ms_forward")
        if ex and a2a:
            print(f"  {n}^3 exchange (reshape) / NCCL all_to_all = {ex / a2a:.3f} (target <= 1.25 at 1024^3)")
        if ex and fwd:
            print(f"  {n}^3 Y-slabs forward {fwd:.3f} ms = exchange {ex:.3f} ms + local FFTs {max(fwd - ex, 0):.3f} ms")
    for series in ("Y-slabs", "X-slabs"):
        n = sizes[0] if sizes else 0
        ours, theirs = get("mpbind", n, series, "host_us_execute"), get("nvmath", n, series, "host_us_execute")
        flat = get("mpbind", n, series, "host_us_flat")
        if ours and theirs:
            print(f"  host per execute {series}: mpbind {ours:.1f} us / nvmath {theirs:.1f} us = {ours / theirs:.2f} "
                  "(target <= 0.5)")
        if ours and flat:
            print(f"  host per execute {series}: mpbind {ours:.1f} us vs flat exec {flat:.1f} us: "
                  f"+{ours - flat:.1f} us (target <= +2)")
    series_plot: dict[str, tuple[list[float], list[float]]] = {}
    for (mode, size, series, metric), v in table:
        if metric == "gpu_ms_forward":
            xs, ys = series_plot.setdefault(f"{mode} {series}", ([], []))
            xs.append(size)
            ys.append(v)
    exchange: dict[str, tuple[list[float], list[float]]] = {}
    for (_, size, series, metric), v in table:
        if series == "exchange":
            xs, ys = exchange.setdefault(metric.removeprefix("gpu_ms_"), ([], []))
            xs.append(size)
            ys.append(v)
    drawn = _results.plot(out / "fft_distributed.png", "3-D C2C complex64, 2 x H200", "N (N^3 points)",
                          [("ms per forward execute", series_plot), ("ms per exchange", exchange)])
    print(f"\nwrote {out / 'fft_distributed.csv'}" + (f" and {out / 'fft_distributed.png'}" if drawn else ""))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("mpbind", "nvmath", "torch", "report"), default="mpbind")
    ap.add_argument("--sizes", default="256,512,1024", help="N of the N^3 transforms")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--host-calls", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()
    a.sizes = [int(s) for s in a.sizes.split(",") if s]
    if a.mode == "report":
        return report(a.out)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    run = {"mpbind": run_mpbind, "nvmath": run_nvmath, "torch": run_torch}[a.mode]
    rows = run(a, comm)
    every = comm.gather(rows, root=0)
    if comm.Get_rank() == 0:
        path = a.out / f"fft_distributed.{a.mode}.csv"
        _results.write_csv(path, HEADER, [r for part in every for r in part])
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
