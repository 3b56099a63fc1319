"""mpbind's torch FFT and reshape operators (``mpbind.torch.fft``, ``reshape``) on several PEs,
checked against ``torch.fft`` of the global array on one GPU.

    mpirun -np N python tests/gpu/torch_fft_suite.py [--one-gpu] [--timeout S]

PyTorch is imported first, as a user's program does. Every PE builds the same seeded global array.
Checks: the C2C forward and inverse operators against ``torch.fft.fftn`` (and N x the input); their
gradient (a weighted loss of the spectrum) against autograd through ``torch.fft.fftn`` of the global
array, each PE's piece; ``torch.autograd.gradcheck`` in double precision on one PE (on several, each
PE's perturbations would move the others' outputs); a loss compiled with ``torch.compile(fullgraph=True)``
(no graph break) against eager, forward and gradient; the operator captured in a CUDA graph and
replayed on new data; R2C and C2R plans' operators and their gradients (through the plan of the
other kind) against autograd through ``torch.fft.rfftn`` and ``irfftn``; a reshape there and back with
its gradient (the reshape back).
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
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402 - first, as a user's program
from mpi4py import MPI  # noqa: E402
from runner import Checks, Report, expect, expect_raises, main, nvshmem_session  # noqa: E402

import mpbind.torch as mpt  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind import fft  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

SHAPE = (16, 12, 8)
RTOL = {torch.complex64: 2e-5, torch.complex128: 1e-12, torch.float32: 2e-5}


@dataclass
class Ctx:
    comm: Any
    pe: int
    npes: int

    def sync(self) -> None:
        torch.cuda.synchronize()
        self.comm.Barrier()


def seeded(shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(1234 + salt)
    if dtype.is_complex:
        real = torch.float64 if dtype == torch.complex128 else torch.float32
        return torch.complex(torch.randn(shape, generator=g, device="cuda", dtype=real),
                             torch.randn(shape, generator=g, device="cuda", dtype=real))
    return torch.randn(shape, generator=g, device="cuda", dtype=dtype)


def cut(g: torch.Tensor, box: Any) -> torch.Tensor:
    return g[tuple(slice(lo, up) for lo, up in zip(box.lower, box.upper, strict=True))].contiguous()


def close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str) -> float:
    expect(tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    scale = float(want.abs().max()) or 1.0
    err = float((got.to(want.dtype) - want).abs().max()) / scale
    expect(err <= rtol, f"{what}: max |got - want| / max |want| = {err:.2e} > {rtol:g}")
    return err


@contextlib.contextmanager
def plan(c: Ctx, dtype: str, kind: str | None = None, stream: Any = None) -> Iterator[fft.FFTPlan]:
    """A plan on `stream` (default: torch's current one, where the operator then queues directly)."""
    p = fft.plan(c.comm, SHAPE, dtype, kind, stream=torch.cuda.current_stream() if stream is None else stream)
    try:
        yield p
    finally:
        c.sync()
        p.close()


CHECKS = Checks()


@CHECKS("fft.c2c.forward_inverse")
def forward_inverse(c: Ctx) -> str:
    with plan(c, "complex64") as p:
        notes = []
        for salt in (0, 1):  # the plan runs again on new data
            g = seeded(SHAPE, torch.complex64, salt)
            x = cut(g, p.input_box)
            y = mpt.fft(x, p)
            back = mpt.fft(y, p, "inverse")
            err = close(y, cut(torch.fft.fftn(g), p.output_box), RTOL[torch.complex64], "forward")
            err_back = close(back, x * g.numel(), RTOL[torch.complex64], "inverse")
            notes.append(f"{err:.1e}/{err_back:.1e}")
        return f"in {p.input_shape} out {p.output_shape}; rel. err fwd/back {' '.join(notes)}"


def weighted_loss(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (y.abs().square() * w).sum()


@CHECKS("fft.c2c.gradient_against_one_gpu")
def gradient(c: Ctx) -> str:
    notes = []
    for dtype, name in ((torch.complex64, "complex64"), (torch.complex128, "complex128")):
        with plan(c, name) as p:
            g = seeded(SHAPE, dtype, 2).requires_grad_(True)
            w = seeded(SHAPE, torch.float64 if dtype == torch.complex128 else torch.float32, 3).abs()
            weighted_loss(torch.fft.fftn(g), w).backward()  # the one-GPU reference
            x = cut(g.detach(), p.input_box).requires_grad_(True)
            weighted_loss(mpt.fft(x, p), cut(w, p.output_box)).backward()  # each PE's part of the same loss
            notes.append(f"{name} {close(x.grad, cut(g.grad, p.input_box), RTOL[dtype] * 10, name):.1e}")
    return "rel. err " + ", ".join(notes)


@CHECKS("fft.c2c.gradcheck")
def gradcheck(c: Ctx) -> str:
    if c.npes != 1:
        # Every PE perturbs its own element at once, so one PE's finite differences see the others'.
        return "one PE only (the gradient against one GPU covers several)"
    small = fft.plan(c.comm, (4, 3, 2), "complex128", stream=torch.cuda.current_stream())
    try:
        t = seeded(small.input_shape, torch.complex128, 5).requires_grad_(True)
        expect(torch.autograd.gradcheck(lambda v: mpt.fft(v, small), (t,)), "gradcheck forward")
        expect(torch.autograd.gradcheck(lambda v: mpt.fft(v, small, "inverse"), (t,)), "gradcheck inverse")
    finally:
        c.sync()
        small.close()
    return "forward and inverse, complex128 4x3x2"


@CHECKS("fft.c2c.compiled_loss")
def compiled(c: Ctx) -> str:
    with plan(c, "complex64") as p:
        g = seeded(SHAPE, torch.complex64, 6)
        w = cut(seeded(SHAPE, torch.float32, 7).abs(), p.output_box)

        def loss(x: torch.Tensor, plan_: fft.FFTPlan) -> torch.Tensor:
            return weighted_loss(mpt.fft(x * 0.5, plan_), w)

        x = cut(g, p.input_box).requires_grad_(True)
        eager = loss(x, p)
        eager.backward()
        want = x.grad.clone()
        x.grad = None
        explained = torch._dynamo.explain(loss)(x, p)
        expect(explained.graph_break_count == 0, f"{explained.graph_break_count} graph breaks")
        torch.compiler.reset()
        got = torch.compile(loss, fullgraph=True)(x, p)
        got.backward()
        e1 = close(got.detach().reshape(1), eager.detach().reshape(1), 1e-4, "compiled loss")
        e2 = close(x.grad, want, 1e-4, "compiled gradient")
        return f"0 graph breaks; rel. err loss {e1:.1e}, gradient {e2:.1e}"


@CHECKS("fft.c2c.cuda_graph")
def cuda_graph(c: Ctx) -> str:
    # A plan on a stream of its own (the default stream cannot join a capture): the operator orders it
    # after the capturing stream and joins it back, so its work is part of the graph.
    with plan(c, "complex64", stream=torch.cuda.Stream()) as p:
        static = torch.zeros(p.input_shape, dtype=torch.complex64, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            mpt.fft(static, p)  # warm up off the capture
        torch.cuda.current_stream().wait_stream(side)
        c.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mpt.fft(static, p)
        errs = []
        for salt in (8, 9):
            g = seeded(SHAPE, torch.complex64, salt)
            static.copy_(cut(g, p.input_box))
            c.sync()
            graph.replay()
            c.sync()
            errs.append(close(out, cut(torch.fft.fftn(g), p.output_box), RTOL[torch.complex64], f"replay {salt}"))
        return "replays " + ", ".join(f"{e:.1e}" for e in errs)


@CHECKS("fft.r2c_c2r.gradients_against_one_gpu")
def r2c_c2r(c: Ctx) -> str:
    # Each through the plan of the other kind; against autograd through torch.fft.rfftn / irfftn.
    with plan(c, "float32") as p, plan(c, "complex64", "c2r") as q:
        g = seeded(SHAPE, torch.float32, 10).requires_grad_(True)
        w = seeded(p.shape[:-1] + (p.shape[-1] // 2 + 1,), torch.float32, 11).abs()
        x = cut(g.detach(), p.input_box).requires_grad_(True)
        y = mpt.fft(x, p, reverse=q)
        err = close(y, cut(torch.fft.rfftn(g.detach()), p.output_box), RTOL[torch.float32], "r2c")
        weighted_loss(torch.fft.rfftn(g), w).backward()
        weighted_loss(y, cut(w, p.output_box)).backward()
        gerr = close(x.grad, cut(g.grad, p.input_box), 1e-4, "r2c gradient")
        expect_raises(UsageError, lambda: mpt.fft(x, p).abs().sum().backward(), "no reverse plan", "reverse=")

        spectrum = torch.fft.rfftn(seeded(SHAPE, torch.float32, 12))  # Hermitian where it must be
        z = cut(spectrum, q.input_box).requires_grad_(True)
        zg = spectrum.clone().requires_grad_(True)
        r = mpt.fft(z, q, reverse=p)  # INVERSE, unnormalised
        cerr = close(r, cut(torch.fft.irfftn(spectrum, s=SHAPE, norm="forward"), q.output_box), 1e-4, "c2r")
        v = seeded(SHAPE, torch.float32, 13)
        (torch.fft.irfftn(zg, s=SHAPE, norm="forward") * v).sum().backward()
        (r * cut(v, q.output_box)).sum().backward()
        cgerr = close(z.grad, cut(zg.grad, q.input_box), 1e-4, "c2r gradient")
        return f"rel. err r2c {err:.1e}, its gradient {gerr:.1e}; c2r {cerr:.1e}, its gradient {cgerr:.1e}"


@CHECKS("reshape.there_and_back")
def reshape(c: Ctx) -> str:
    n = c.npes
    by_x, by_y = dist.Split(SHAPE, n, 0), dist.Split(SHAPE, n, 1)
    there = fft.plan_reshape(c.comm, by_x, by_y, "float32")
    back = fft.plan_reshape(c.comm, by_y, by_x, "float32")
    mine_x, mine_y = by_x.box(c.pe), by_y.box(c.pe)
    try:
        g = seeded(SHAPE, torch.float32, 11)
        w = seeded(SHAPE, torch.float32, 12)
        x = cut(g, mine_x).requires_grad_(True)
        y = mpt.reshape(x, there, reverse=back)
        expect(torch.equal(y, cut(g, mine_y)), "reshaped piece")
        (y * cut(w, mine_y)).sum().backward()
        expect(torch.equal(x.grad, cut(w, mine_x)), "its gradient: the weights moved back")
        expect_raises(UsageError, lambda: mpt.reshape(x, there).sum().backward(), "no reverse plan", "reverse=")
    finally:
        c.sync()
        there.close()
        back.close()
    return f"{there.input_shape} -> {there.output_shape} and back, gradient exact"


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    comm = MPI.COMM_WORLD
    pe = comm.Get_rank()
    device = 0 if args.one_gpu else pe % torch.cuda.device_count()
    torch.cuda.set_device(device)
    c = Ctx(comm, pe, comm.Get_size())
    report.info("torch", torch.__version__)
    with nvshmem_session(report, comm, device, c.sync):
        yield c


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0")


if __name__ == "__main__":
    sys.exit(main(__doc__, started, CHECKS, arguments=arguments, timeout=400.0))
