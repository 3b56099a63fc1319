"""The periodic 3-D Poisson solve of ``poisson3d.py`` as one ``jax.jit`` function: ``lap(u) = f`` on
[0, 2 pi)^3, spectrally, on every visible GPU.

The whole step (the forward R2C of f, the division by -|k|^2, the inverse C2R) is one jitted
function of this rank's X-slab of f, calling ``mpbind.jax.fft`` on two ``mpbind.fft`` plans made
beforehand on every rank. Checked against the same solve with ``numpy.fft`` on the host, against the
exact solution, and against the eager plans (the steps of ``poisson3d.py``, through CuPy); prints
the time per solve of both.

    mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python examples/poisson3d_jax.py [--n 128] [--dtype float64]

Several PEs on one GPU (CUDA MPS for more than one): add ``--one-gpu`` and ``-x CUDA_MPS_PIPE_DIRECTORY``.
Prints ``poisson3d_jax pe=<k> ok ...`` per PE; exit status 1 when a result is off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("XLA_PYTHON_CLIENT_PREALLOCATE", "false")):  # several processes may share a GPU
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
from poisson3d import TOLERANCE, exact, grid, inverse_laplacian, numpy_solve  # noqa: E402


def whole(shape: tuple[int, ...]) -> Any:
    """A box covering the whole grid (what ``grid`` takes)."""
    return type("Box", (), {"lower": (0,) * len(shape), "upper": shape})()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=96, help="grid points per axis (the grid is n^3)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0")
    ap.add_argument("--iters", type=int, default=20, help="timed solves (after 3 warm-ups)")
    a = ap.parse_args()

    import cupy as cp
    import jax
    from mpi4py import MPI

    jax.config.update("jax_enable_x64", True)
    import mpbind.jax as mpj
    from mpbind import fft, nvshmem

    comm = MPI.COMM_WORLD
    pe, npes = comm.Get_rank(), comm.Get_size()
    gpus = jax.devices("gpu")
    device = 0 if a.one_gpu else pe % len(gpus)
    cp.cuda.Device(device).use()
    nvshmem.init(mpi_comm=comm, device=device)
    shape = (a.n, a.n, a.n)
    cdtype = {"float32": "complex64", "float64": "complex128"}[a.dtype]
    forward = fft.plan(comm, shape, a.dtype)  # R2C: X-slabs -> Y-slabs of the half
    inverse = fft.plan(comm, shape, cdtype, "c2r", input=forward.spec.output, output=forward.spec.input)
    ok = True
    try:
        x, y, z = grid(shape, forward.input_box, np, a.dtype)
        u_exact, f_host = exact(x, y, z, np)
        scale_host = inverse_laplacian(shape, forward.output_box, np, a.dtype)
        f = jax.device_put(np.ascontiguousarray(f_host), gpus[device])
        scale = jax.device_put(scale_host, gpus[device])

        @jax.jit
        def solve(rhs: Any, k2: Any) -> Any:  # the whole step: R2C, scale, C2R
            return mpj.fft(mpj.fft(rhs, forward) * k2, inverse)

        u = np.asarray(solve(f, scale))
        peak = float(np.abs(u_exact).max()) or 1.0
        err_exact = float(np.abs(u - u_exact).max()) / peak
        gx, gy, gz = grid(shape, whole(shape), np, "float64")
        reference = numpy_solve(exact(gx, gy, gz, np)[1])
        box = forward.input_box
        mine = reference[box.lower[0]:box.upper[0]]
        err_numpy = float(np.abs(u - mine).max()) / (float(np.abs(mine).max()) or 1.0)

        # The eager plans, as poisson3d.py runs them (through CuPy, on the plans' stream).
        f_cp, scale_cp = cp.asarray(f_host), cp.asarray(scale_host)

        def eager() -> Any:
            half = forward.execute(f_cp)
            spectrum = cp.asarray(half)
            spectrum *= scale_cp
            return inverse.execute(half)

        u_eager = cp.asnumpy(cp.asarray(eager()))
        err_eager = float(np.abs(u - u_eager).max()) / peak
        limit = TOLERANCE[a.dtype] * 10 if a.dtype == "float32" else 1e-9
        ok = err_exact <= limit and err_numpy <= TOLERANCE[a.dtype] and err_eager <= TOLERANCE[a.dtype]
        print(f"poisson3d_jax pe={pe} {'ok' if ok else 'MISMATCH'} {a.dtype} {a.n}^3 slab {forward.input_shape}: "
              f"rel. err vs numpy.fft {err_numpy:.2e}, vs exact {err_exact:.2e}, vs the eager plans {err_eager:.2e}",
              flush=True)

        def timed(step: Any, sync: Any) -> float:
            for _ in range(3):
                sync(step())
            times = []
            for _ in range(a.iters):
                comm.Barrier()
                t0 = time.perf_counter()
                sync(step())
                times.append((time.perf_counter() - t0) * 1e3)
            return float(statistics.median(times))

        jitted = timed(lambda: solve(f, scale), lambda r: r.block_until_ready())
        eagerly = timed(eager, lambda r: cp.cuda.runtime.deviceSynchronize())
        every = comm.gather((jitted, eagerly), root=0)
        if pe == 0:
            j, e = max(t[0] for t in every), max(t[1] for t in every)
            print(f"poisson3d_jax: {a.n}^3 {a.dtype} on {npes} PE(s): {j:.3f} ms per jitted solve, {e:.3f} ms eager "
                  f"(median of {a.iters}, host to result, slowest PE)", flush=True)
    finally:
        cp.cuda.runtime.deviceSynchronize()
        comm.Barrier()
        inverse.close()
        forward.close()
        nvshmem.finalize()
    everyone = comm.allreduce(int(ok), op=MPI.MIN)
    return 0 if everyone else 1


if __name__ == "__main__":
    sys.exit(main())
