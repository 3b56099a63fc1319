"""The ring exchange of examples/ring_exchange.py (put a block to the next PE with a signal, wait for
the previous PE's) from inside a kernel: the CUDA C++ kernel through mpbind.kernels against
the same kernel written with nvshmem4py 0.4.1's Numba-CUDA device API. Each runs in its own job
(both initialise NVSHMEM); the second run merges the two into one table, CSV and plot.

On two GPUs (one PE per GPU; nvshmem4py 0.4.1 installed beside mpbind)::

    for impl in mpbind nvshmem4py; do
      mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
          -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x PYTHONPATH \\
          python benchmarks/nvshmem_ring_exchange.py --impl $impl [--iters 200] [--out DIR]
    done

Per block size (8 B, 64 KiB, 16 MiB; the CTAs of examples/ring_exchange.py): the result of one
exchange is checked first; then ``--iters`` exchanges run back to back inside one launch, timed with
CUDA events (device time per exchange), and single-exchange launches are timed from the host to the
end of the stream (launch + exchange), medians over ``--batches``. The nvshmem4py run takes the CTA
counts of the mpbind run before it (its CSV under ``--out``), so both split each block alike. PE 0 writes
``ring_exchange_<impl>.csv`` under ``--out``, and ``ring_exchange.csv``/``.png`` once both exist.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import mpbind  # noqa: E402

mpbind.load_libraries("nvshmem")  # before torch maps its own NVSHMEM: ours is then the one copy in the process
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402

SIZES = (8, 64 * 1024, 16 * 1024 * 1024)
HEADER = ["impl", "bytes", "ctas", "device_us_per_exchange", "launch_us_per_exchange", "GB/s"]


def _example() -> Any:
    path = Path(__file__).resolve().parents[1] / "examples" / "ring_exchange.py"
    spec = importlib.util.spec_from_file_location("ring_exchange", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(run: Any, iters: int, batches: int, comm: Any, stream: Any) -> tuple[float, float]:
    """(device µs per exchange inside one launch, host µs per single-exchange launch to completion)."""
    device, launch = [], []
    for _ in range(batches):
        stream.synchronize()
        comm.Barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        run(iters)
        end.record(stream)
        end.synchronize()
        device.append(start.elapsed_time(end) * 1e3 / iters)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(10):
            run(1)
        stream.synchronize()
        launch.append((time.perf_counter() - t0) * 1e6 / 10)
    return statistics.median(device), statistics.median(launch)


def with_mpbind(ex: Any, a: argparse.Namespace, comm: Any) -> list[list[Any]]:
    from mpbind import nvshmem

    rows = []
    cubin = ex.build() if comm.Get_rank() == 0 else None
    comm.Barrier()
    cubin = cubin or ex.build()
    device = comm.Get_rank() % torch.cuda.device_count()
    with nvshmem.init(mpi_comm=comm, device=device), cubin.load() as library:
        stream = torch.cuda.Stream()
        for nbytes in SIZES:
            ring = ex.RingExchange(library, nbytes)
            ring.run(stream=stream)
            stream.synchronize()
            ring.check()
            dev_us, launch_us = timed(lambda n, r=ring: r.run(n, stream=stream), a.iters, a.batches, comm, stream)
            rows.append(["mpbind", nbytes, ring.ctas, dev_us, launch_us, nbytes / dev_us / 1e3])
            nvshmem.barrier_all()
            ring.close()
    return rows


def _numba_on_new_numpy() -> None:
    """numba-cuda 0.x still calls ``numpy.row_stack``, which NumPy 2.5 removed (it was an alias of
    ``vstack`` since NumPy 1.x): give it back before numba-cuda is imported."""
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # type: ignore[attr-defined]


def _headers_of_the_loaded_nvshmem(cuda: Any) -> None:
    """nvshmem4py's Numba bindings compile NVSHMEM's device headers from the first NVSHMEM that
    cuda-pathfinder finds, which may be another copy than the host library in use (PyTorch's, in
    an environment that has both): compile against the headers mpbind's kernels use, those of the
    host library loaded."""
    from mpbind.kernels import _build as _kernel_build

    include = _kernel_build.toolchain().nvshmem_include
    rest = cuda.config.CUDA_NVRTC_EXTRA_SEARCH_PATHS.split(":")[1:]
    cuda.config.CUDA_NVRTC_EXTRA_SEARCH_PATHS = ":".join([str(include), *rest])


def mpbind_ctas(out: Path) -> dict[int, int]:
    """The CTAs of mpbind's run per block size (its CSV under `out`, when it ran first), so that the
    two kernels split each block alike: mpbind's takes fewer than ``ctas_for`` where the PEs sharing
    a GPU leave less room for a resident grid."""
    path = out / "ring_exchange_mpbind.csv"
    return {int(r[1]): int(r[2]) for r in _results.read_csv(path)[1]} if path.is_file() else {}


def with_nvshmem4py(ex: Any, a: argparse.Namespace, comm: Any) -> list[list[Any]]:
    _numba_on_new_numpy()
    import cupy as cp
    import nvshmem.core as nvs
    import nvshmem.core.device.numba as nvd
    from cuda.core import Device
    from numba import cuda

    _headers_of_the_loaded_nvshmem(cuda)

    add, ge = int(nvs.SignalOp.SIGNAL_ADD), int(nvs.ComparisonType.CMP_GE)

    @cuda.jit
    def ring_exchange(dst: Any, src: Any, signal: Any, done: Any, iters: Any) -> None:
        nxt = (nvd.my_pe() + 1) % nvd.n_pes()
        nbytes = dst.size
        per = (nbytes + cuda.gridDim.x - 1) // cuda.gridDim.x
        begin = min(nbytes, cuda.blockIdx.x * per)
        end = min(nbytes, begin + per)
        for it in range(iters):
            if end > begin:
                nvd.put_signal_nbi_block(dst[begin:end], src[begin:end], signal, 1, add, nxt)
            elif cuda.threadIdx.x == 0:
                nvd.signal_op(signal, 1, add, nxt)
            if cuda.threadIdx.x == 0:
                nvd.signal_wait(signal, ge, (done + it + 1) * cuda.gridDim.x)
            cuda.syncthreads()

    rows = []
    same_ctas = mpbind_ctas(a.out)
    dev = Device(comm.Get_rank() % torch.cuda.device_count())
    dev.set_current()
    torch.cuda.set_device(dev.device_id)
    nvs.init(device=dev, mpi_comm=comm, initializer_method="mpi")
    pe, npes = nvs.my_pe(), nvs.n_pes()
    stream = torch.cuda.Stream()
    nb_stream = cuda.external_stream(stream.cuda_stream)
    for nbytes in SIZES:
        src, dst, signal = nvs.array((nbytes,), dtype="uint8"), nvs.array((nbytes,), dtype="uint8"), \
            nvs.array((1,), dtype="uint64")
        dst[:] = 0
        signal[:] = 0
        cp.asarray(src)[:] = cp.asarray(ex.pattern(pe, nbytes))
        ctas, state = same_ctas.get(nbytes, ex.ctas_for(nbytes)), {"done": 0}
        cp.cuda.Device().synchronize()
        comm.Barrier()

        def run(iters: int, dst: Any = dst, src: Any = src, signal: Any = signal, ctas: int = ctas,
                state: dict[str, int] = state) -> None:
            ring_exchange[ctas, 512, nb_stream](dst, src, signal, state["done"], iters)
            state["done"] += iters

        run(1)
        stream.synchronize()
        want = ex.pattern((pe - 1) % npes, nbytes)
        if not torch.equal(torch.as_tensor(cp.asarray(dst), device="cuda"), want):
            raise AssertionError(f"nvshmem4py ring exchange of {nbytes} bytes: wrong block on PE {pe}")
        dev_us, launch_us = timed(run, a.iters, a.batches, comm, stream)
        rows.append(["nvshmem4py", nbytes, ctas, dev_us, launch_us, nbytes / dev_us / 1e3])
        comm.Barrier()
        for arr in (src, dst, signal):
            nvs.free_array(arr)
    nvs.finalize()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=("mpbind", "nvshmem4py"), required=True)
    ap.add_argument("--iters", type=int, default=200, help="exchanges inside one launch (device time)")
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    torch.cuda.set_device(comm.Get_rank() % torch.cuda.device_count())
    ex = _example()
    rows = (with_mpbind if a.impl == "mpbind" else with_nvshmem4py)(ex, a, comm)
    if comm.Get_rank() != 0:
        return 0
    _results.write_csv(a.out / f"ring_exchange_{a.impl}.csv", HEADER, rows)
    print(_results.table(HEADER, rows))
    parts = [a.out / f"ring_exchange_{impl}.csv" for impl in ("mpbind", "nvshmem4py")]
    if all(p.is_file() for p in parts):
        merged = [row for p in parts for row in _results.read_csv(p)[1]]
        _results.write_csv(a.out / "ring_exchange.csv", HEADER, merged)
        series: dict[str, tuple[list[float], list[float]]] = {}
        launches: dict[str, tuple[list[float], list[float]]] = {}
        for impl, nbytes, _ctas, dev_us, launch_us, _bw in merged:
            for target, value in ((series, dev_us), (launches, launch_us)):
                xs, ys = target.setdefault(impl, ([], []))
                xs.append(float(nbytes))
                ys.append(float(value))
        _results.plot(a.out / "ring_exchange.png", "ring exchange from a kernel, one PE per GPU", "bytes",
                      [("device us per exchange", series), ("launch + exchange (us)", launches)])
        print(_results.table(HEADER, merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
