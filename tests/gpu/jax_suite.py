"""mpbind's JAX functions (``mpbind.jax``) inside ``jax.jit`` on several PEs, checked against NumPy
of the global array and against the eager ``mpbind.fft`` plans.

    mpirun -np N python tests/gpu/jax_suite.py [--one-gpu] [--timeout S]

Every PE builds the same seeded global array. Checks: the four NCCL collectives on a one-rank
communicator of each PE (NCCL takes one rank per GPU; each PE's own communicator) with their
gradients; the C2C FFT forward and inverse, R2C and C2R, on an uneven shape, against ``numpy.fft``
and against the eager plan's ``execute``; ``jax.grad`` of an FFT-based loss against the gradient of
the same loss through ``jnp.fft`` of the global array (each PE's piece), and, on one PE, against
finite differences in double precision; ``jax.vmap``; a reshape there and back with its gradient;
the planned matmuls of a tensor-parallel MLP on each PE's one-rank communicator against NumPy and
the eager plan.
XLA's command buffers are whatever ``XLA_FLAGS`` says (the GPU tests run the suite with and
without them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("XLA_PYTHON_CLIENT_PREALLOCATE", "false")):  # several processes share a GPU
    os.environ.setdefault(_name, _value)

import jax  # noqa: E402 - first, as a user's program
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402
from runner import Checks, Report, expect, expect_raises, main, nvshmem_session  # noqa: E402

import mpbind.jax as mpj  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind import fft, nccl  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

jax.config.update("jax_enable_x64", True)

SHAPE = (51, 63, 36)  # uneven over any number of PEs
RTOL = {"complex64": 3e-5, "complex128": 1e-11, "float32": 3e-5, "float64": 1e-11}


@dataclass
class Ctx:
    comm: Any
    pe: int
    npes: int
    device: Any

    def sync(self) -> None:
        (jax.device_put(0.0, self.device) + 0).block_until_ready()
        self.comm.Barrier()

    def put(self, a: np.ndarray) -> Any:
        return jax.device_put(np.ascontiguousarray(a), self.device)


def seeded(shape: tuple[int, ...], dtype: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1234 + salt)
    real = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        return (real + 1j * rng.standard_normal(shape)).astype(dtype)
    return real.astype(dtype)


def cut(g: np.ndarray, box: Any) -> np.ndarray:
    return np.ascontiguousarray(g[tuple(slice(lo, up) for lo, up in zip(box.lower, box.upper, strict=True))])


def close(got: Any, want: np.ndarray, rtol: float, what: str) -> float:
    got = np.asarray(got)
    expect(got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}")
    scale = float(np.abs(want).max()) or 1.0
    err = float(np.abs(got.astype(want.dtype) - want).max()) / scale
    expect(err <= rtol, f"{what}: max |got - want| / max |want| = {err:.2e} > {rtol:g}")
    return err


@contextlib.contextmanager
def plans(c: Ctx, *made: Any) -> Iterator[None]:
    try:
        yield
    finally:
        c.sync()
        for p in made:
            p.close()


CHECKS = Checks()


@CHECKS("collectives.one_rank_communicator")
def collectives(c: Ctx) -> str:
    comm = nccl.Communicator.init(1, 0, nccl.get_unique_id())  # this PE's own: one rank per GPU per communicator
    try:
        x = c.put(seeded((6, 5), "float32", 0))
        z = c.put(seeded((4,), "complex64", 1))
        f = jax.jit(lambda v, w: (mpj.all_reduce(v, comm), mpj.all_reduce(v, comm, "max"), mpj.all_gather(v, comm),
                                  mpj.reduce_scatter(v, comm, "avg"), mpj.all_to_all(v, comm),
                                  mpj.all_reduce(w, comm, "avg")))
        outs = f(x, z)
        for name, got in zip(("all_reduce", "max", "all_gather", "reduce_scatter", "all_to_all"), outs[:5],
                             strict=True):
            expect(np.array_equal(np.asarray(got), np.asarray(x)), f"{name} on one rank is the identity")
        expect(np.array_equal(np.asarray(outs[5]), np.asarray(z)), "complex avg on one rank")
        w = c.put(seeded((6, 5), "float32", 2))
        grad = jax.jit(jax.grad(lambda v: (mpj.all_gather(v, comm) * w).sum()))(x)
        expect(np.array_equal(np.asarray(grad), np.asarray(w)), "all_gather's gradient (a reduce-scatter)")
        expect_raises(UsageError, lambda: mpj.reduce_scatter(c.put(np.ones((3,), np.float32)), comm, "bogus"),
                      "bad reduction", "op must be")
        return "all_reduce, all_gather, reduce_scatter, all_to_all (+ complex avg, gradient) inside jit"
    finally:
        c.sync()
        comm.close()


@CHECKS("fft.c2c.against_numpy_and_eager")
def c2c(c: Ctx) -> str:
    notes = []
    import cupy as cp

    own = cp.cuda.Stream(non_blocking=True)
    for dtype, stream in (("complex64", None), ("complex128", own)):  # launched on XLA's stream / joined by events
        p = fft.plan(c.comm, SHAPE, dtype, stream=stream)
        with plans(c, p):
            g = seeded(SHAPE, dtype, 3)
            x = c.put(cut(g, p.input_box))
            # a plan may be an argument of a jitted function (static: hashed by identity)
            step = jax.jit(lambda v, q: mpj.fft(v, q))
            back = jax.jit(lambda v, q: mpj.fft(v, q, "inverse"))
            y = step(x, p)
            err = close(y, cut(np.fft.fftn(g), p.output_box), RTOL[dtype], f"{dtype} forward")
            err_back = close(back(y, p), cut(g, p.input_box) * g.size, RTOL[dtype], f"{dtype} inverse")
            eager = _eager(p, np.asarray(x))
            expect(np.allclose(np.asarray(y), eager, rtol=RTOL[dtype], atol=RTOL[dtype] * float(np.abs(eager).max())),
                   f"{dtype}: jitted and eager plan differ")
            y2 = step(c.put(cut(seeded(SHAPE, dtype, 4), p.input_box)), p)  # the plan runs again on new data
            close(y2, cut(np.fft.fftn(seeded(SHAPE, dtype, 4)), p.output_box), RTOL[dtype], f"{dtype} again")
            notes.append(f"{dtype} {err:.1e}/{err_back:.1e}")
    return f"{SHAPE}: rel. err fwd/inverse {', '.join(notes)}"


def _eager(p: fft.FFTPlan, host: np.ndarray) -> np.ndarray:
    """The eager plan's result for this rank's piece `host` (through CuPy, as a user's eager code)."""
    import cupy as cp

    y = p.execute(cp.asarray(host))
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(cp.asarray(y))


@CHECKS("fft.r2c_c2r.against_numpy")
def r2c_c2r(c: Ctx) -> str:
    notes = []
    for real, cplx in (("float32", "complex64"), ("float64", "complex128")):
        fwd = fft.plan(c.comm, SHAPE, real)
        inv = fft.plan(c.comm, SHAPE, cplx, "c2r", input=fwd.spec.output, output=fwd.spec.input)
        with plans(c, inv, fwd):
            g = seeded(SHAPE, real, 5)
            x = c.put(cut(g, fwd.input_box))
            k = jax.jit(lambda v, a, b: mpj.fft(v, a, reverse=b))(x, fwd, inv)
            err = close(k, cut(np.fft.rfftn(g), fwd.output_box), RTOL[cplx], f"{real} r2c")
            u = jax.jit(lambda v, a, b: mpj.fft(v, a, reverse=b))(k, inv, fwd)
            err_back = close(u, cut(g, fwd.input_box) * g.size, RTOL[real], f"{real} c2r")
            notes.append(f"{real} {err:.1e}/{err_back:.1e}")
    return f"{SHAPE}: rel. err r2c/c2r {', '.join(notes)}"


def _loss_c2c(y: Any, w: Any) -> Any:
    return (jnp.abs(y) ** 2 * w).sum()


@CHECKS("fft.gradients_against_one_gpu")
def gradients(c: Ctx) -> str:
    notes = []
    p = fft.plan(c.comm, SHAPE, "complex128")
    fwd = fft.plan(c.comm, SHAPE, "float64")
    inv = fft.plan(c.comm, SHAPE, "complex128", "c2r", input=fwd.spec.output, output=fwd.spec.input)
    with plans(c, inv, fwd, p):
        g = seeded(SHAPE, "complex128", 6)
        w = np.abs(seeded(SHAPE, "float64", 7))
        ref = np.asarray(jax.grad(lambda v: _loss_c2c(jnp.fft.fftn(v), w))(jnp.asarray(g)))
        got = jax.jit(jax.grad(lambda v: _loss_c2c(mpj.fft(v, p), c.put(cut(w, p.output_box)))))(
            c.put(cut(g, p.input_box)))
        notes.append(f"c2c {close(got, cut(ref, p.input_box), 1e-10, 'c2c gradient'):.1e}")
        r = seeded(SHAPE, "float64", 8)
        wh = np.abs(seeded(fwd.spec.shape[:-1] + (SHAPE[-1] // 2 + 1,), "float64", 9))
        ref = np.asarray(jax.grad(lambda v: _loss_c2c(jnp.fft.rfftn(v), wh))(jnp.asarray(r)))
        got = jax.jit(jax.grad(lambda v: _loss_c2c(mpj.fft(v, fwd, reverse=inv), c.put(cut(wh, fwd.output_box)))))(
            c.put(cut(r, fwd.input_box)))
        notes.append(f"r2c {close(got, cut(ref, fwd.input_box), 1e-10, 'r2c gradient'):.1e}")
        h = np.fft.rfftn(seeded(SHAPE, "float64", 10))
        wr = seeded(SHAPE, "float64", 11)
        got = jax.jit(jax.grad(lambda v: (mpj.fft(v, inv, reverse=fwd) * c.put(cut(wr, inv.output_box))).sum()))(
            c.put(cut(h, inv.input_box)))
        ref = np.asarray(jax.grad(lambda v: (jnp.fft.irfftn(v, s=SHAPE) * np.prod(SHAPE) * wr).sum())(jnp.asarray(h)))
        notes.append(f"c2r {close(got, cut(ref, inv.input_box), 1e-10, 'c2r gradient'):.1e}")
    return "rel. err " + ", ".join(notes)


@CHECKS("fft.finite_differences")
def finite_differences(c: Ctx) -> str:
    if c.npes != 1:
        return "one PE only (each PE's perturbations would move the others' outputs)"
    from jax.test_util import check_grads

    small = (4, 3, 5)
    p = fft.plan(c.comm, small, "complex128")
    fwd = fft.plan(c.comm, small, "float64")
    inv = fft.plan(c.comm, small, "complex128", "c2r", input=fwd.spec.output, output=fwd.spec.input)
    with plans(c, inv, fwd, p):
        x = c.put(seeded(small, "complex128", 12))
        check_grads(jax.jit(lambda v: mpj.fft(v, p)), (x,), order=1, modes=["rev"], eps=1e-6)
        check_grads(jax.jit(lambda v: mpj.fft(v, p, "inverse")), (x,), order=1, modes=["rev"], eps=1e-6)
        check_grads(jax.jit(lambda v: mpj.fft(v, fwd, reverse=inv)), (c.put(seeded(small, "float64", 13)),), order=1,
                    modes=["rev"], eps=1e-6)
        k = c.put(np.fft.rfftn(seeded(small, "float64", 14)))
        check_grads(jax.jit(lambda v: mpj.fft(v, inv, reverse=fwd)), (k,), order=1, modes=["rev"], eps=1e-6)
    return "c2c forward and inverse, r2c, c2r: float64/complex128 4x3x5"


@CHECKS("fft.vmap")
def vmapped(c: Ctx) -> str:
    p = fft.plan(c.comm, SHAPE, "complex64")
    with plans(c, p):
        a, b = (cut(seeded(SHAPE, "complex64", s), p.input_box) for s in (15, 16))
        got = jax.jit(jax.vmap(lambda v: mpj.fft(v, p)))(c.put(np.stack([a, b])))
        one = jax.jit(lambda v: mpj.fft(v, p))
        for i, piece in enumerate((a, b)):
            close(got[i], np.asarray(one(c.put(piece))), 1e-6, f"vmap element {i}")
    return "a batch of 2 one call at a time, as two calls"


@CHECKS("reshape.there_and_back")
def reshape(c: Ctx) -> str:
    n = c.npes
    g = seeded(SHAPE, "float32", 17)
    there = fft.plan_reshape(c.comm, dist.Split(SHAPE, n, 0), dist.Split(SHAPE, n, 1), "float32")
    back = fft.plan_reshape(c.comm, dist.Split(SHAPE, n, 1), dist.Split(SHAPE, n, 0), "float32")
    with plans(c, back, there):
        mine_x = dist.Split(SHAPE, n, 0).box(c.pe)
        mine_y = dist.Split(SHAPE, n, 1).box(c.pe)
        y = jax.jit(lambda v: mpj.reshape(v, there, reverse=back))(c.put(cut(g, mine_x)))
        expect(np.array_equal(np.asarray(y), cut(g, mine_y)), "reshaped piece")
        w = c.put(cut(seeded(SHAPE, "float32", 18), mine_y))
        grad = jax.jit(jax.grad(lambda v: (mpj.reshape(v, there, reverse=back) * w).sum()))(c.put(cut(g, mine_x)))
        expect(np.array_equal(np.asarray(grad), cut(seeded(SHAPE, "float32", 18), mine_x)), "gradient: weights back")
        expect_raises(UsageError, lambda: mpj.reshape(c.put(np.ones((3,), np.float32)), there), "wrong piece",
                      "must be")
    return f"{there.input_shape} -> {there.output_shape} and back, gradient exact"


@CHECKS("matmul.one_rank_communicator")
def planned_matmul(c: Ctx) -> str:
    """The tensor-parallel MLP's two planned products (AllGather+GEMM and GEMM+ReduceScatter layouts)
    on this PE's own one-rank communicator, with JAX's row-major pieces (torch Linear weights:
    out x in): h = x W1^T, y = h W2^T (+ C), against NumPy and the eager plan on the same data."""
    import cupy as cp

    comm = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    T, H, F = 40, 24, 56
    x, w1, w2, cc = (seeded(shape, "float32", 30 + i) for i, shape in enumerate(((T, H), (F, H), (H, F), (T, H))))
    try:
        p1 = mpj.matmul_plan(comm, w1, x, jax.ShapeDtypeStruct((T, F), jnp.float32), transa=True,
                             a_dist=dist.by_columns((H, F), 1), b_dist=dist.by_columns((H, T), 1),
                             d_dist=dist.by_rows((F, T), 1))
        layer2 = dict(transa=True, a_dist=dist.by_rows((F, H), 1), b_dist=dist.by_rows((F, T), 1),
                      d_dist=dist.by_columns((H, T), 1))
        p2 = mpj.matmul_plan(comm, w2, jax.ShapeDtypeStruct((T, F), jnp.float32), cc, **layer2)
        p2c = mpj.matmul_plan(comm, w2, jax.ShapeDtypeStruct((T, F), jnp.float32), cc, c=cc,
                              c_dist=layer2["d_dist"], beta=1.0, **layer2)
        with plans(c, p1, p2, p2c):
            pieces = {n: (tuple(shape), dtype) for n, (shape, dtype) in p1.launch_pieces().items()}
            expect(pieces == {"a": ((H, F), "float32"), "b": ((H, T), "float32"), "d": ((F, T), "float32")},
                   f"launch pieces {pieces}")
            step = jax.jit(lambda xx, a1, a2, cin: (mpj.matmul(a1, xx, p1),
                                                     mpj.matmul(a2, mpj.matmul(a1, xx, p1), p2),
                                                     mpj.matmul(a2, mpj.matmul(a1, xx, p1), p2c, c=cin)))
            h, y, yc = step(c.put(x), c.put(w1), c.put(w2), c.put(cc))
            h_ref = x.astype(np.float64) @ w1.T.astype(np.float64)
            y_ref = h_ref @ w2.T.astype(np.float64)
            err = max(close(h, h_ref, 1e-4, "h = x W1^T"), close(y, y_ref, 1e-4, "y = h W2^T"),
                      close(yc, y_ref + cc, 1e-4, "y + C"))
            # the eager plan on the same arrays (cupy, column-major views): the same cuBLASMp call
            xs, w1s, hs = cp.asarray(x), cp.asarray(w1), cp.empty((T, F), cp.float32)
            p1.execute(a=w1s.T, b=xs.T, d=hs.T)
            cp.cuda.Device().synchronize()
            expect(np.array_equal(cp.asnumpy(hs), np.asarray(h)), "jitted h equals the eager plan's, bitwise")
            expect_raises(UsageError, lambda: mpj.matmul(c.put(x), c.put(w1), p1), "pieces swapped", "must be")
            expect_raises(UsageError, lambda: mpj.matmul(c.put(w2), c.put(h_ref.astype(np.float32)), p2c),
                          "c missing", "with c")
        expect_raises(Exception, lambda: step(c.put(x), c.put(w1), c.put(w2), c.put(cc))[0].block_until_ready(),
                      "a closed plan's launch", "closed")
        return f"AllGather+GEMM and GEMM+ReduceScatter layouts, + C, inside jit: max rel. err {err:.1e}, eager bitwise"
    finally:
        c.sync()
        comm.close()


@CHECKS("errors.closed_plan_and_communicator")
def closed(c: Ctx) -> str:
    p = fft.plan(c.comm, SHAPE, "complex64")
    x = c.put(cut(seeded(SHAPE, "complex64", 19), p.input_box))
    step = jax.jit(lambda v: mpj.fft(v, p))
    step(x).block_until_ready()
    c.sync()
    p.close()
    text = expect_raises(Exception, lambda: step(x).block_until_ready(), "a closed plan's launch", "closed")
    comm = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    total = jax.jit(lambda v: mpj.all_reduce(v, comm))
    total(x).block_until_ready()
    comm.close()
    text2 = expect_raises(Exception, lambda: total(x).block_until_ready(), "a closed communicator's launch", "closed")
    return f"{text.splitlines()[0][:90]} / {text2.splitlines()[0][:90]}"


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    comm = MPI.COMM_WORLD
    pe = comm.Get_rank()
    gpus = jax.devices("gpu")
    device = 0 if args.one_gpu else pe % len(gpus)
    c = Ctx(comm, pe, comm.Get_size(), gpus[device])
    report.info("jax", f"{jax.__version__}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    expect(mpj.available(), "this mpbind has the XLA FFI handlers")
    import cupy as cp

    cp.cuda.Device(device).use()
    with nvshmem_session(report, comm, device, c.sync):
        yield c


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0")


if __name__ == "__main__":
    sys.exit(main(__doc__, started, CHECKS, arguments=arguments, timeout=400.0))
