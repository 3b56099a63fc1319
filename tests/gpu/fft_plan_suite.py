"""Planned distributed FFTs and reshapes (``mpbind.fft``) on several PEs, checked against NumPy.

    mpirun -np N python tests/gpu/fft_plan_suite.py [--one-gpu] [--timeout S] [--only PREFIX] [--torch]

One PE per GPU (PE k on GPU k % count), or every PE on GPU 0 with ``--one-gpu`` (under CUDA MPS for
more than one PE). Every PE builds the same seeded global array and checks its own piece of every
result against ``numpy.fft`` of the global array: relative error (max |got - want| / max |want|)
<= 1e-5 in single and <= 1e-12 in double precision, and no output equal to its input (at most 5 %
of the words unchanged). Reshapes are checked element by element.

Cases: C2C, R2C and C2R in single and double precision; 3-D uniform, 50x62x36, 50x62x35 (odd last
axis for R2C/C2R) and 51x63x36 with the output back on X-slabs (the case nvmath-python 1.0 gets
wrong); Y-slabs -> X-slabs, pencils, arbitrary boxes, Z-slabs of the halved axis; 2-D C2C and R2C.
Each plan runs forward and back (C2C inverse; R2C then the mirrored C2R plan) and again on new
data. The input arrives as a CuPy array (copied into the plan's buffer), a CuPy view of an
``mpbind.nvshmem`` allocation (transformed in place, copy-free: the result's pointer is checked),
the plan's own buffer (``input_view``), or an object with ``__dlpack__`` only; with ``--torch``,
only PyTorch tensors (copied in, or views of an ``mpbind.nvshmem`` allocation), torch imported
first. Results into ``out=``, after a copy in and after an in-place transform, on the slab and
the box path. Reshapes of 1-byte to 16-byte elements between slabs, pencils and boxes, 1-D to 3-D.
Refusals (execute's, and a plan that one rank refuses or passes other values to) raise on every PE.
Lifetimes: close, use after close, a dropped plan drained.

Each PE reports one line per check and a summary (tests/gpu/runner.py). Every PE makes the same
library calls in the same order; checks run after a case's collective calls.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import sys
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from array_checks import expect_changed, expect_close, expect_equal  # noqa: E402
from mpi4py import MPI  # noqa: E402
from runner import Check, Checks, Report, expect, expect_raises, main, nvshmem_session  # noqa: E402

import mpbind  # noqa: E402
from mpbind import _core, fft, nvshmem  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

SEED = 20260214
RTOL = {"complex64": 1e-5, "float32": 1e-5, "complex128": 1e-12, "float64": 1e-12}
REAL = {"complex64": "float32", "complex128": "float64"}
COMPLEX = {"float32": "complex64", "float64": "complex128"}


# --- helpers ------------------------------------------------------------------------------------------


def seeded(name: str, shape: tuple[int, ...], dtype: Any, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode()), salt])
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)
    return rng.standard_normal(shape).astype(dt)


def cut(g: np.ndarray, box: dist.Box) -> np.ndarray:
    return np.ascontiguousarray(g[tuple(slice(lo, up) for lo, up in zip(box.lower, box.upper, strict=True))])


class DLPackOnly:
    """An array that offers nothing but DLPack (no __cuda_array_interface__, no CuPy/torch attributes)."""

    def __init__(self, a: Any) -> None:
        self._a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()


@dataclass
class Ctx:
    comm: Any
    pe: int
    npes: int
    device: int
    stream: Any
    only: str | None = None  # run the checks whose name starts with this
    torch: bool = False  # only the PyTorch-tensor cases

    def sync(self) -> None:
        self.stream.synchronize()

    def host(self, view: Any) -> np.ndarray:
        """A DeviceView (or any device array) copied to the host after the plan's stream ran."""
        self.sync()
        with self.stream:
            return cp.asnumpy(cp.asarray(view))


def grid2(n: int) -> tuple[int, int]:
    a = int(math.isqrt(n))
    while n % a:
        a -= 1
    return (n // a, a)


def skewed(extent: int, n: int) -> tuple[int, ...]:
    """Uneven counts, more on the last ranks (not cuFFTMp's split): a box layout."""
    if n == 1:
        return (extent,)
    small = max(1, extent // (2 * n))
    return (*([small] * (n - 1)), extent - small * (n - 1))


# --- giving a plan its input ---------------------------------------------------------------------------------


@dataclass
class Given:
    x: Any          # what execute gets (None: the plan's buffer)
    keep: list[Any]  # symmetric arrays to free after the case
    symmetric_ptr: int = 0


def give(c: Ctx, p: fft.FFTPlan, local: np.ndarray, how: str, direction: int = fft.FORWARD) -> Given:
    """This rank's input `local` handed over `how`: cupy (copied in), symmetric (in place), own (the
    plan's buffer), dlpack (copied in, through DLPack only)."""
    with c.stream:
        if how == "cupy":
            x = cp.asarray(local)
            c.sync()
            return Given(x, [])
        if how == "dlpack":
            x = cp.asarray(local)
            c.sync()
            return Given(DLPackOnly(x), [])
        if how == "own":
            cp.asarray(p.input_view(direction))[...] = cp.asarray(local)
            c.sync()
            return Given(None, [])
        if how == "torch":
            import torch

            t = torch.as_tensor(local, device=f"cuda:{c.device}")
            torch.cuda.synchronize()
            return Given(t, [])
        if how in ("symmetric", "torch_symmetric"):
            itemsize = np.dtype(local.dtype).itemsize
            sym = nvshmem.zeros(-(-p.buffer_bytes // itemsize), local.dtype)  # the same size on every PE
            side = p.spec.input_side(c.pe) if direction == fft.FORWARD or p.kind != "c2c" else \
                p.spec.output_side(c.pe)
            count = math.prod(side.storage)
            inside = tuple(slice(0, n) for n in local.shape)
            if how == "torch_symmetric":
                import torch

                stored = torch.from_dlpack(sym)[:count].view(side.storage)
                stored[inside] = torch.as_tensor(local, device=stored.device)
                torch.cuda.synchronize()
            else:
                stored = cp.asarray(sym)[:count].reshape(side.storage)
                stored[inside] = cp.asarray(local)
            c.sync()
            return Given(stored, [sym], int(sym.ptr))
    raise AssertionError(how)


def release(c: Ctx, given: Given) -> None:
    c.sync()
    for sym in given.keep:
        sym.free()  # collective: every PE frees its counterpart


# --- FFT cases -------------------------------------------------------------------------------------------------


@dataclass
class FFTCase:
    name: str
    shape: tuple[int, ...]
    dtype: str           # the input dtype of the forward plan (real for R2C)
    input: Callable[[int], dist.Distribution | None]
    output: Callable[[int], dist.Distribution | None]
    how: str             # cupy, symmetric, own, dlpack, torch, torch_symmetric
    algorithm: str | None = None  # expected


def none(n: int) -> None:
    return None


def there_and_back(c: Ctx, p: fft.FFTPlan, local: np.ndarray, how: str,
                   back: Callable[[Any], Any]) -> tuple[np.ndarray, np.ndarray]:
    """(forward result, `back` of it) on the host, `local` handed to `p` `how`; a symmetric input must
    come back transformed in place."""
    given = give(c, p, local, how)
    try:
        y = p.execute(given.x)
        fwd = c.host(y)
        if given.symmetric_ptr:
            expect(y.ptr == given.symmetric_ptr, "the symmetric input was not transformed in place")
        inv = c.host(back(y))
    finally:
        release(c, given)
    return fwd, inv


def case_c2c(c: Ctx, k: FFTCase) -> str:
    shape, dtype, n = k.shape, k.dtype, c.npes
    p = fft.plan(c.comm, shape, dtype, input=k.input(n), output=k.output(n), stream=c.stream)
    notes = []
    try:
        expect(k.algorithm is None or p.algorithm == k.algorithm, f"algorithm {p.algorithm}, expected {k.algorithm}")
        for salt in (0, 1):  # the plan runs again on new data
            g = seeded(k.name, shape, dtype, salt)
            want = np.fft.fftn(g.astype(np.complex128))
            local = cut(g, p.input_box)
            fwd, inv = there_and_back(c, p, local, k.how, lambda y: p.execute(y, direction=fft.INVERSE))
            expect(p.output_shape == fwd.shape, f"output_shape {p.output_shape} != result {fwd.shape}")
            err = expect_close(fwd, cut(want, p.output_box), RTOL[dtype], f"forward (data {salt})")
            expect_changed(local, fwd, "forward output")
            err_back = expect_close(inv, local.astype(np.complex128) * g.size, RTOL[dtype], f"inverse (data {salt})")
            notes.append(f"{err:.1e}/{err_back:.1e}")
    finally:
        c.sync()
        p.close()
    return f"{p.algorithm}, {k.how}, in {p.input_shape} out {p.output_shape}; rel. err fwd/back {' '.join(notes)}"


def case_r2c(c: Ctx, k: FFTCase) -> str:
    shape, dtype, n = k.shape, k.dtype, c.npes
    cdtype = COMPLEX[dtype]
    p = fft.plan(c.comm, shape, dtype, input=k.input(n), output=k.output(n), stream=c.stream)
    q = fft.plan(c.comm, shape, cdtype, "c2r", input=p.spec.output, output=p.spec.input, stream=c.stream)
    notes = []
    try:
        expect(k.algorithm is None or p.algorithm == k.algorithm, f"algorithm {p.algorithm}, expected {k.algorithm}")
        expect(q.algorithm == p.algorithm, f"the mirrored C2R plan runs {q.algorithm}, the R2C {p.algorithm}")
        expect((q.input_shape, q.output_shape) == (p.output_shape, p.input_shape), "C2R pieces are not the mirror")
        for salt in (0, 1):
            g = seeded(k.name, shape, dtype, salt)
            want = np.fft.rfftn(g.astype(np.float64))
            local = cut(g, p.input_box)
            fwd, inv = there_and_back(c, p, local, k.how, q.execute)  # the R2C's result straight into the C2R
            expect(fwd.dtype == np.dtype(cdtype) and inv.dtype == np.dtype(dtype), f"dtypes {fwd.dtype} {inv.dtype}")
            err = expect_close(fwd, cut(want, p.output_box), RTOL[cdtype], f"R2C (data {salt})")
            expect_changed(local.astype(cdtype), fwd, "R2C output")
            err_back = expect_close(inv, local.astype(np.float64) * g.size, RTOL[dtype], f"C2R of R2C (data {salt})")
            # And C2R alone, from the exact half-spectrum.
            half = cut(want, q.input_box).astype(cdtype)
            h = give(c, q, half, "cupy")
            try:
                alone = c.host(q.execute(h.x))
            finally:
                release(c, h)
            err_alone = expect_close(alone, local.astype(np.float64) * g.size, RTOL[dtype], f"C2R alone (data {salt})")
            notes.append(f"{err:.1e}/{err_back:.1e}/{err_alone:.1e}")
    finally:
        c.sync()
        q.close()
        p.close()
    return (f"{p.algorithm}, {k.how}, real {p.input_shape} -> half {p.output_shape}; rel. err R2C/roundtrip/C2R "
            f"{' '.join(notes)}")


def torch_cases(n: int) -> list[FFTCase]:
    """PyTorch tensors as inputs: copied in, and in place through a view of an mpbind.nvshmem array."""
    uneven, odd, bad = (50, 62, 36), (50, 62, 35), (51, 63, 36)
    return [FFTCase("torch.c2c.c64.50x62x36", uneven, "complex64", none, none, "torch", None),
            FFTCase("torch.c2c.c128.51x63x36.x_to_x.copied", bad, "complex128", none,
                    lambda n: dist.Split(bad, n, 0), "torch", None),
            FFTCase("torch.c2c.c128.51x63x36.x_to_x", bad, "complex128", none, lambda n: dist.Split(bad, n, 0),
                    "torch_symmetric", None),
            FFTCase("torch.r2c.f32.50x62x35.odd", odd, "float32", none, none, "torch_symmetric", None),
            FFTCase("torch.r2c.f64.50x62x35.z_slabs", odd, "float64", none, lambda n: dist.Split((50, 62, 18), n, 2),
                    "torch", None)]


def fft_cases(n: int) -> list[FFTCase]:
    u = (4 * n, 4 * n, 8)
    uneven = (50, 62, 36)
    odd = (50, 62, 35)
    bad = (51, 63, 36)
    g = grid2(n)
    cases = []
    for dtype in ("complex64", "complex128"):
        t = "c64" if dtype == "complex64" else "c128"
        cases += [
            FFTCase(f"c2c.{t}.uniform", u, dtype, none, none, "cupy", "slabs"),
            FFTCase(f"c2c.{t}.50x62x36", uneven, dtype, none, none, "symmetric", "slabs"),
            FFTCase(f"c2c.{t}.51x63x36.x_to_x", bad, dtype, none, lambda n: dist.Split(bad, n, 0), "cupy", "boxes"),
            FFTCase(f"c2c.{t}.51x63x36.x_to_x.in_place", bad, dtype, none, lambda n: dist.Split(bad, n, 0),
                    "symmetric", "boxes"),
            FFTCase(f"c2c.{t}.50x62x36.y_to_x", uneven, dtype, lambda n: dist.Split(uneven, n, 1),
                    lambda n: dist.Split(uneven, n, 0), "own", "slabs"),
            FFTCase(f"c2c.{t}.50x62x36.pencils", uneven, dtype, lambda n: dist.Pencils(uneven, g, (0, 1)),
                    lambda n: dist.Pencils(uneven, g, (0, 2)), "dlpack", "boxes"),
            FFTCase(f"c2c.{t}.50x62x36.boxes", uneven, dtype,
                    lambda n: dist.Split(uneven, n, 0, skewed(50, n)),
                    lambda n: dist.Split(uneven, n, 2, skewed(36, n)), "own", "boxes"),
            FFTCase(f"c2c.{t}.2d.50x62", (50, 62), dtype, none, none, "cupy", "slabs"),
            FFTCase(f"c2c.{t}.2d.51x63.x_to_x", (51, 63), dtype, none, lambda n: dist.Split((51, 63), n, 0),
                    "symmetric", "boxes"),
        ]
    for dtype in ("float32", "float64"):
        t = "f32" if dtype == "float32" else "f64"
        cases += [
            FFTCase(f"r2c.{t}.uniform", u, dtype, none, none, "cupy", "slabs"),
            FFTCase(f"r2c.{t}.50x62x36", uneven, dtype, none, none, "symmetric", "slabs"),
            FFTCase(f"r2c.{t}.50x62x35.odd", odd, dtype, none, none, "own", "slabs"),
            FFTCase(f"r2c.{t}.50x62x35.odd.packed_input", odd, dtype, none, none, "cupy", "slabs"),
            FFTCase(f"r2c.{t}.51x63x36.x_to_x", bad, dtype, none, lambda n: dist.Split((51, 63, 19), n, 0), "cupy",
                    "boxes"),
            FFTCase(f"r2c.{t}.50x62x35.z_slabs", odd, dtype, none, lambda n: dist.Split((50, 62, 18), n, 2),
                    "symmetric", "boxes"),
            FFTCase(f"r2c.{t}.50x62x35.pencils", odd, dtype, lambda n: dist.Pencils(odd, g, (0, 1)),
                    lambda n: dist.Pencils((50, 62, 18), g, (0, 2)), "dlpack", "boxes"),
            FFTCase(f"r2c.{t}.2d.50x35", (50, 35), dtype, none, none, "cupy", "boxes"),
        ]
    if n == 1:  # one rank: every distribution is the whole array, so cuFFTMp's slabs are every pair
        for k in cases:
            k.algorithm = None
    return cases


# --- reshape cases --------------------------------------------------------------------------------------------


@dataclass
class ReshapeCase:
    name: str
    shape: tuple[int, ...]
    dtype: str
    input: Callable[[int], dist.Distribution]
    output: Callable[[int], dist.Distribution]
    how: str  # cupy, symmetric, own, out


def case_reshape(c: Ctx, k: ReshapeCase) -> str:
    n = c.npes
    src, dst = k.input(n), k.output(n)
    r = fft.plan_reshape(c.comm, src, dst, k.dtype, stream=c.stream)
    try:
        for salt in (0, 1):
            g = seeded(k.name, k.shape, k.dtype, salt)
            local = cut(g, src.box(c.pe))
            want = cut(g, dst.box(c.pe))
            keep: list[Any] = []
            out = None
            with c.stream:
                if k.how == "own":
                    cp.asarray(r.input_view())[...] = cp.asarray(local)
                    x = None
                elif k.how == "symmetric":
                    a = nvshmem.zeros(r.spec.max_input_bytes, "uint8")
                    b = nvshmem.zeros(r.spec.max_output_bytes, "uint8")
                    keep = [a, b]
                    x = cp.asarray(a)[:local.nbytes].view(k.dtype).reshape(local.shape)
                    x[...] = cp.asarray(local)
                    out = cp.asarray(b)[:want.nbytes].view(k.dtype).reshape(want.shape)
                else:
                    x = cp.asarray(local)
                    if k.how == "out":
                        out = cp.zeros(want.shape, k.dtype)
            c.sync()
            try:
                got_obj = r.execute(x, out=out)
                got = c.host(got_obj)
                if k.how == "symmetric":
                    expect(got_obj is out, "out was not returned")
                    same = cp.asarray(out).data.ptr == int(keep[1].ptr)
                    expect(same, "the symmetric output was not written in place")
                after = c.host(x) if x is not None else None
            finally:
                c.sync()
                for s in reversed(keep):
                    s.free()
            expect_equal(got, want, f"reshape output (data {salt})")
            if after is not None:
                expect_equal(after, local, "reshape input left as it was")
    finally:
        c.sync()
        r.close()
    how = r.spec.explain().splitlines()[-1]
    return f"{k.how}: {k.dtype} in {src.local_shape(c.pe)} -> out {dst.local_shape(c.pe)}; {how}"


def reshape_cases(n: int) -> list[ReshapeCase]:
    s3 = (50, 62, 36)
    g = grid2(n)
    return [
        ReshapeCase("reshape.c64.x_to_y", s3, "complex64", lambda n: dist.Split(s3, n, 0),
                    lambda n: dist.Split(s3, n, 1), "cupy"),
        ReshapeCase("reshape.c128.x_to_pencils", s3, "complex128", lambda n: dist.Split(s3, n, 0),
                    lambda n: dist.Pencils(s3, g, (1, 2)), "symmetric"),
        ReshapeCase("reshape.f32.boxes", s3, "float32", lambda n: dist.Split(s3, n, 2, skewed(36, n)),
                    lambda n: dist.Split(s3, n, 0, skewed(50, n)[::-1]), "own"),
        ReshapeCase("reshape.i8.x_to_y", (12, 20, 16), "int8", lambda n: dist.Split((12, 20, 16), n, 0),
                    lambda n: dist.Split((12, 20, 16), n, 1), "out"),
        ReshapeCase("reshape.i16.last_axis", (9, 40), "int16", lambda n: dist.Split((9, 40), n, 0),
                    lambda n: dist.Split((9, 40), n, 1, even_counts(40, n)), "cupy"),
        ReshapeCase("reshape.f64.2d", (33, 17), "float64", lambda n: dist.Split((33, 17), n, 1),
                    lambda n: dist.Split((33, 17), n, 0), "symmetric"),
        ReshapeCase("reshape.i32.1d", (1001,), "int32", lambda n: dist.Split((1001,), n, 0),
                    lambda n: dist.Split((1001,), n, 0, skewed(1001, n)), "cupy"),
    ]


def even_counts(extent: int, n: int) -> tuple[int, ...]:
    base = (extent // n) // 2 * 2
    return (*([base] * (n - 1)), extent - base * (n - 1))


# --- refusals, agreement, lifetimes ---------------------------------------------------------------------------


def case_execute_refusals(c: Ctx) -> str:
    """Arrays that disagree with the plan are refused before any library call (on every PE alike)."""
    shape = (50, 62, 36)
    p = fft.plan(c.comm, shape, "complex64", stream=c.stream)
    r = fft.plan(c.comm, shape, "float32", stream=c.stream)
    notes: list[str] = []
    try:
        with c.stream:
            good = cp.zeros(p.input_shape, cp.complex64)
            notes.append(expect_raises(UsageError, lambda: p.execute(good.astype(cp.complex128)), "dtype"))
            notes.append(expect_raises(UsageError, lambda: p.execute(good[:, :, :-1]), "shape"))
            wide = cp.zeros((p.input_shape[0], p.input_shape[1], 2 * p.input_shape[2]), cp.complex64)
            notes.append(expect_raises(UsageError, lambda: p.execute(wide[:, :, ::2]), "non-contiguous"))
            notes.append(expect_raises(UsageError, lambda: p.execute(cp.asnumpy(good)), "host array"))
            notes.append(expect_raises(UsageError, lambda: p.execute(good, direction=0), "direction"))
            notes.append(expect_raises(UsageError, lambda: r.execute(cp.zeros(r.input_shape, cp.complex64)),
                                       "R2C with a complex input"))
            notes.append(expect_raises(UsageError, lambda: r.execute(direction=fft.INVERSE), "R2C inverse"))
            notes.append(expect_raises(UsageError, lambda: p.execute(good, out=cp.zeros(p.output_shape, cp.float32)),
                                       "out dtype"))
            if cp.cuda.runtime.getDeviceCount() > 1:
                other = (c.device + 1) % cp.cuda.runtime.getDeviceCount()
                with cp.cuda.Device(other):
                    elsewhere = cp.zeros(p.input_shape, cp.complex64)
                notes.append(expect_raises(UsageError, lambda: p.execute(elsewhere), "another device"))
        # The plans still work after the refusals (nothing collective was entered).
        with c.stream:
            y = p.execute(good)
        expect(c.host(y).shape == p.output_shape, "plan unusable after refusals")
    finally:
        c.sync()
        r.close()
        p.close()
    expect(any("complex128" in m for m in notes) and any("C-contiguous" in m for m in notes), f"messages {notes}")
    return f"{len(notes)} refusals, e.g. {notes[0]!r}"


def case_plan_agreement(c: Ctx) -> str:
    """A plan one PE refuses, or passes other values to, is refused on every PE (no one goes on)."""
    shape = (8 * c.npes, 8 * c.npes, 8)
    if c.npes == 1:
        msg = expect_raises(UsageError, lambda: fft.plan(c.comm, shape, "complex64", "r2c"), "own refusal")
        return f"one PE: {msg}"
    dtype = "complex64" if c.pe == 0 else "float32"  # PE 0's r2c gets a complex dtype: PE 0 refuses
    first = expect_raises(UsageError, lambda: fft.plan(c.comm, shape, dtype, "r2c"), "refused by PE 0")
    expect("refused on rank 0" in first and "real input" in first, first)  # the same message on every PE
    out = dist.Split(shape, c.npes, 2) if c.pe == c.npes - 1 else None  # the last PE asks for another output
    second = expect_raises(UsageError, lambda: fft.plan(c.comm, shape, "complex64", output=out), "other values")
    expect(f"rank {c.npes - 1} passed others than rank 0" in second, second)
    third = expect_raises(UsageError, lambda: fft.plan_reshape(
        c.comm, dist.Split(shape, c.npes, 0), dist.Split(shape, c.npes, 1 if c.pe else 2), "float32"), "reshape")
    expect("passed others than rank 0" in third, third)
    # Nothing was made: a good plan now works.
    with fft.plan(c.comm, shape, "complex64", stream=c.stream) as p:
        with c.stream:
            y = p.execute(cp.ones(p.input_shape, cp.complex64))
        expect(c.host(y).shape == p.output_shape, "the good plan after the refusals")
    return f"PE {c.pe}: {first!r}; {second!r}"


def case_out(c: Ctx) -> str:
    """`out=`: the result copied out of the plan's buffer (unpadded from an R2C's slabs), for the slab and the
    box path, forward and back; and a closed box plan refused before its descriptor is touched."""
    n = c.npes
    shape = (50, 62, 35)
    half = (50, 62, 35 // 2 + 1)
    notes = []
    for output in (None, dist.Split(half, n, 2)):
        p = fft.plan(c.comm, shape, "float32", output=output, stream=c.stream)
        q = fft.plan(c.comm, shape, "complex64", "c2r", input=p.spec.output, output=p.spec.input, stream=c.stream)
        try:
            g = seeded(f"out.{p.algorithm}", shape, "float32", 0)
            local = cut(g, p.input_box)
            with c.stream:
                x = cp.asarray(local)
                y = cp.zeros(p.output_shape, cp.complex64)
                back = cp.zeros(q.output_shape, cp.float32)
                expect(p.execute(x, out=y) is y, "execute(out=) did not return out")
                expect(q.execute(y, out=back) is back, "the C2R execute(out=) did not return out")
            want = np.fft.rfftn(g.astype(np.float64))
            err = expect_close(c.host(y), cut(want, p.output_box), RTOL["complex64"], f"R2C into out ({p.algorithm})")
            err_back = expect_close(c.host(back), local.astype(np.float64) * g.size, RTOL["float32"],
                                    f"C2R into out ({p.algorithm})")
            notes.append(f"{p.algorithm} {err:.1e}/{err_back:.1e}")
        finally:
            c.sync()
            q.close()
            p.close()
        msg = expect_raises(UsageError, lambda p=p: p.execute(), f"execute of a closed {p.algorithm} plan")
        expect("fft.FFTPlan is closed" in msg, msg)
    return f"rel. err R2C/C2R into out: {', '.join(notes)}"


def case_in_place_out(c: Ctx) -> str:
    """`out=` after an in-place transform: a symmetric input transformed where it is (forward), then the
    result copied into `out`; and the inverse from a CuPy array (copied in) into `out`, for the slab and
    the box path of one C2C plan."""
    n = c.npes
    shape = (51, 63, 36)
    notes = []
    for output in (None, dist.Split(shape, n, 0)):
        p = fft.plan(c.comm, shape, "complex64", output=output, stream=c.stream)
        given = None
        try:
            g = seeded(f"in_place_out.{p.algorithm}", shape, "complex64", 0)
            local = cut(g, p.input_box)
            given = give(c, p, local, "symmetric")
            with c.stream:
                y = cp.zeros(p.output_shape, cp.complex64)
                back = cp.zeros(p.input_shape, cp.complex64)
                expect(p.execute(given.x, out=y) is y, "execute(x, out=) did not return out")
                expect(p.execute(y, direction=fft.INVERSE, out=back) is back, "the inverse did not return out")
            want = np.fft.fftn(g.astype(np.complex128))
            err = expect_close(c.host(y), cut(want, p.output_box), RTOL["complex64"], f"C2C into out ({p.algorithm})")
            # The symmetric input was transformed where it is: it holds the result too.
            with c.stream:
                stored = cp.asarray(given.keep[0])[:math.prod(p.output_shape)].reshape(p.output_shape)
            in_place = expect_close(c.host(stored), cut(want, p.output_box), RTOL["complex64"],
                                    f"the symmetric input after the transform ({p.algorithm})")
            err_back = expect_close(c.host(back), local.astype(np.complex128) * g.size, RTOL["complex64"],
                                    f"inverse into out ({p.algorithm})")
            notes.append(f"{p.algorithm} {err:.1e}/{in_place:.1e}/{err_back:.1e}")
        finally:
            c.sync()
            if given is not None:
                release(c, given)
            p.close()
    return f"rel. err C2C into out/in place/inverse into out: {', '.join(notes)}"


def case_lifetimes(c: Ctx) -> str:
    shape = (8 * c.npes, 8, 8)
    p = fft.plan(c.comm, shape, "complex64", stream=c.stream)
    text = repr(p)
    p.close()
    p.close()  # idempotent
    msg = expect_raises(UsageError, lambda: p.execute(), "execute after close")
    expect("closed" in msg, msg)
    before = _core.queued()
    q = fft.plan(c.comm, shape, "complex64", stream=c.stream)
    r = fft.plan_reshape(c.comm, dist.Split(shape, c.npes, 0), dist.Split(shape, c.npes, 1), "float32",
                         stream=c.stream)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del q, r
        gc.collect()
    queued = _core.queued()
    c.sync()
    c.comm.Barrier()
    ran = mpbind.drain()
    kinds = sorted({k for k, _ in queued})
    expect(before == [], f"queue not empty before: {before}")
    expect({"cufftmp.Plan", "cufftmp.Descriptor", "cufftmp.Reshape", "nvshmem.SymmetricMemory"} <= set(kinds),
           f"queued kinds {kinds}")
    expect(any(issubclass(w.category, ResourceWarning) for w in caught), "no ResourceWarning")
    expect(_core.queued() == [], f"queue after drain: {_core.queued()}")
    return f"{text}; dropped plans queued {kinds}, drain ran {ran}"


# --- running --------------------------------------------------------------------------------------------------


CHECKS = Checks()


@CHECKS.cases
def every_case(c: Ctx) -> Iterator[Check]:
    """Every case (with --only, those whose name starts with it)."""
    for name, thunk in all_cases(c):
        if c.only is None or name.startswith(c.only):
            yield name, thunk


def all_cases(c: Ctx) -> Iterator[Check]:
    if c.torch:
        for k in torch_cases(c.npes):
            run = case_c2c if ".c2c." in k.name else case_r2c
            yield k.name, lambda k=k, run=run: run(c, k)
        return

    yield "refusals.execute", lambda: case_execute_refusals(c)
    yield "refusals.plan_agreement", lambda: case_plan_agreement(c)
    for k in fft_cases(c.npes):
        run = case_c2c if k.name.startswith("c2c") else case_r2c
        yield k.name, lambda k=k, run=run: run(c, k)
    for k in reshape_cases(c.npes):
        yield k.name, lambda k=k: case_reshape(c, k)
    yield "out", lambda: case_out(c)
    yield "out.in_place", lambda: case_in_place_out(c)
    yield "lifetimes", lambda: case_lifetimes(c)


def one_nvshmem_copy() -> str:
    """Where torch mapped an NVSHMEM of its own and MPBIND_NVSHMEM_PATH names another file, the loader
    refuses to load a second copy (cuFFTMp would bind to torch's, and our symmetric memory would not be
    symmetric for it); the suite then goes on with the mapped copy, as a user's program would."""
    from mpbind._infra import families as _families
    from mpbind._infra import loader as _loader
    from mpbind.errors import LibraryConflictError

    mapped = _families.mapped_copies(("libnvshmem_host.so.3",))
    override = os.environ.get("MPBIND_NVSHMEM_PATH")
    if not mapped or not override or _loader.is_loaded("nvshmem"):
        return f"torch mapped {mapped or 'no NVSHMEM'}; override {override or 'unset'}"
    try:
        lib = _loader.load("nvshmem")
    except LibraryConflictError as exc:
        if not exc.same_family or exc.loaded_path != mapped[0]:
            raise
        del os.environ["MPBIND_NVSHMEM_PATH"]
        return f"refused a second copy beside {mapped[0]}; going on with it"
    if not _families.same_file(lib.path, mapped[0]):
        raise AssertionError(f"a second NVSHMEM copy loaded: {lib.path} beside {mapped[0]}")
    return f"the override names the mapped copy {lib.path}"


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    """NVSHMEM on this PE's GPU; after the checks, nothing queued and NVSHMEM finalised."""
    if args.torch:
        import torch  # noqa: F401 - before anything loads cuFFTMp, as a user's program would
    comm = MPI.COMM_WORLD
    pe = comm.Get_rank()
    device = 0 if args.one_gpu else pe % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    cp.cuda.runtime.free(0)
    c = Ctx(comm, pe, comm.Get_size(), device, cp.cuda.Stream(non_blocking=True), args.only, args.torch)
    if args.torch:
        report.check("torch.one_nvshmem_copy", one_nvshmem_copy)
    with nvshmem_session(report, comm, device, c.sync):
        yield c


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0")
    ap.add_argument("--only", default=None, help="run the checks whose name starts with this")
    ap.add_argument("--torch", action="store_true",
                    help="only the PyTorch-tensor cases, with torch imported first (as a user's program does): "
                         "torch brings its own cuFFT into the process beside cuFFTMp")


if __name__ == "__main__":
    sys.exit(main(__doc__, started, CHECKS, arguments=arguments, timeout=540.0))
