"""A periodic 3-D Poisson solve on every visible GPU: ``lap(u) = f`` on [0, 2 pi)^3, spectrally.

Forward R2C of f (X-slabs in, Y-slabs of the Hermitian half out), divide by -|k|^2 (the mean of u set
to 0), inverse C2R back to X-slabs: two ``mpbind.fft`` plans, the second running in place on the
first one's buffer. Checked against the same solve with ``numpy.fft`` on one device (the host) and
against the exact solution of the right-hand side used; prints the time per solve.

One process per GPU::

    mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python examples/poisson3d.py [--n 256] [--dtype float32]

Several PEs on one GPU (CUDA MPS for more than one)::

    mpirun --allow-run-as-root --oversubscribe -np 3 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x CUDA_MPS_PIPE_DIRECTORY python examples/poisson3d.py --one-gpu

Prints ``poisson3d pe=<k> ok ...`` per PE and, on PE 0, the time per solve; exit status 1 when a
result is off. CuPy holds the arrays (PyTorch would bring its own cuFFT into the process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402

TOLERANCE = {"float32": 1e-5, "float64": 1e-12}  # relative to the largest |u|


def exact(x: Any, y: Any, z: Any, xp: Any) -> tuple[Any, Any]:
    """(u, f = lap u) of a mean-free u built from a few Fourier modes."""
    u = xp.sin(x) * xp.cos(2 * y) * xp.sin(3 * z) + xp.cos(4 * x) * xp.sin(y) + 0.5 * xp.cos(z)
    f = -14 * xp.sin(x) * xp.cos(2 * y) * xp.sin(3 * z) - 17 * xp.cos(4 * x) * xp.sin(y) - 0.5 * xp.cos(z)
    return u, f


def grid(shape: tuple[int, ...], box: Any, xp: Any, dtype: str) -> tuple[Any, Any, Any]:
    """The coordinates of `box`'s points of the periodic grid of `shape` on [0, 2 pi)^3."""
    axes = [xp.arange(lo, up, dtype=dtype) * (2 * np.pi / n) for lo, up, n in zip(box.lower, box.upper, shape,
                                                                                       strict=True)]
    return xp.meshgrid(*axes, indexing="ij")


def inverse_laplacian(shape: tuple[int, ...], box: Any, xp: Any, dtype: str) -> Any:
    """-1 / (|k|^2 N) on `box` of the halved spectrum (0 at k = 0: u has mean 0); N normalises the C2R."""
    nx, ny, nz = shape
    kx = np.fft.fftfreq(nx, 1 / nx)[box.lower[0]:box.upper[0]]
    ky = np.fft.fftfreq(ny, 1 / ny)[box.lower[1]:box.upper[1]]
    kz = np.arange(nz // 2 + 1)[box.lower[2]:box.upper[2]]
    k2 = kx[:, None, None] ** 2 + ky[None, :, None] ** 2 + kz[None, None, :] ** 2
    with np.errstate(divide="ignore"):
        scale = np.where(k2 == 0, 0.0, -1.0 / (k2 * (nx * ny * nz)))
    return xp.asarray(scale.astype(dtype))


def numpy_solve(f: np.ndarray) -> np.ndarray:
    """The same solve on one device, in NumPy."""
    half = (*f.shape[:-1], f.shape[-1] // 2 + 1)
    scale = inverse_laplacian(f.shape, _Box((0, 0, 0), half), np, "float64")
    axes = tuple(range(f.ndim))  # NumPy 2 deprecates s= without axes=
    return np.fft.irfftn(np.fft.rfftn(f.astype(np.float64)) * scale * f.size, s=f.shape, axes=axes)


class _Box:
    def __init__(self, lower: tuple[int, ...], upper: tuple[int, ...]) -> None:
        self.lower, self.upper = lower, upper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=128, help="grid points per axis (the grid is n^3)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0")
    ap.add_argument("--iters", type=int, default=20, help="timed solves (after 3 warm-ups)")
    ap.add_argument("--csv", type=Path, help="also write the time per solve here (PE 0)")
    ap.add_argument("--reference-max-n", type=int, default=256,
                    help="largest n checked against numpy.fft of the whole array on every PE")
    a = ap.parse_args()

    import cupy as cp
    from mpi4py import MPI

    from mpbind import fft, nvshmem
    from mpbind.bindings import nvshmem as flat_nvshmem

    comm = MPI.COMM_WORLD
    pe, npes = comm.Get_rank(), comm.Get_size()
    device = 0 if a.one_gpu else pe % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    nvshmem.init(mpi_comm=comm, device=device)
    shape = (a.n, a.n, a.n)
    cdtype = {"float32": "complex64", "float64": "complex128"}[a.dtype]
    stream = cp.cuda.Stream(non_blocking=True)
    forward = fft.plan(comm, shape, a.dtype, stream=stream)  # R2C: X-slabs -> Y-slabs of the half
    inverse = fft.plan(comm, shape, cdtype, "c2r", input=forward.spec.output, output=forward.spec.input,
                       stream=stream)
    ok = True
    try:
        with stream:
            x, y, z = grid(shape, forward.input_box, cp, a.dtype)
            u_exact, f = exact(x, y, z, cp)
            f = cp.ascontiguousarray(f)
            scale = inverse_laplacian(shape, forward.output_box, cp, a.dtype)

        def solve() -> Any:
            half = forward.execute(f)  # f is copied into the plan's buffer and left as it was
            with stream:
                spectrum = cp.asarray(half)
                spectrum *= scale
            return inverse.execute(half)  # in place in the forward plan's buffer

        u = solve()
        stream.synchronize()
        with stream:
            got = cp.asnumpy(cp.asarray(u))
        want = cp.asnumpy(u_exact)
        peak = float(np.abs(want).max()) or 1.0
        err_exact = float(np.abs(got - want).max()) / peak
        err_numpy = float("nan")
        if a.n <= a.reference_max_n:
            gx, gy, gz = grid(shape, _Box((0, 0, 0), shape), np, "float64")
            reference = numpy_solve(exact(gx, gy, gz, np)[1])
            box = forward.input_box
            mine = reference[box.lower[0]:box.upper[0]]
            err_numpy = float(np.abs(got - mine).max()) / (float(np.abs(mine).max()) or 1.0)
        limit = TOLERANCE[a.dtype] * 10 if a.dtype == "float32" else 1e-9  # against the exact u: its rounding
        ok = err_exact <= limit and (err_numpy != err_numpy or err_numpy <= TOLERANCE[a.dtype])
        print(f"poisson3d pe={pe} {'ok' if ok else 'MISMATCH'} {a.dtype} {a.n}^3 slab {forward.input_shape}: "
              f"rel. err vs numpy.fft {err_numpy:.2e}, vs exact {err_exact:.2e} ({forward.algorithm})", flush=True)

        for _ in range(3):
            solve()
        times = []
        start, end = cp.cuda.Event(), cp.cuda.Event()
        for _ in range(a.iters):
            stream.synchronize()
            comm.Barrier()
            start.record(stream)
            solve()
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        every = comm.gather(statistics.median(times), root=0)
        gpus = npes // flat_nvshmem.team_n_pes(flat_nvshmem.Team.SAME_GPU)  # PEs may share one (MPS)
        if pe == 0:
            print(f"poisson3d: {a.n}^3 {a.dtype} on {npes} PE(s), {gpus} GPU(s): "
                  f"{max(every):.3f} ms per solve (median of {a.iters}, slowest PE; R2C + scale + C2R)", flush=True)
            if a.csv is not None:
                a.csv.parent.mkdir(parents=True, exist_ok=True)
                a.csv.write_text(f"n,dtype,pes,one_gpu,ms_per_solve\n{a.n},{a.dtype},{npes},{int(a.one_gpu)},{max(every)}\n")
    finally:
        stream.synchronize()
        inverse.close()
        forward.close()
        nvshmem.finalize()
    everyone = comm.allreduce(int(ok), op=MPI.MIN)
    return 0 if everyone else 1


if __name__ == "__main__":
    sys.exit(main())
