"""Multi-PE checks of cuFFTMp through the flat bindings (``--api flat``, ``mpbind.bindings.cufftmp``)
and through the Pythonic layer (``--api layer``, ``mpbind.cufftmp``), every result compared with NumPy.

    mpirun -np N python tests/gpu/cufftmp_suite.py [--api flat|layer] [--init nvshmem|library] [--timeout S]

All PEs share GPU 0 and build the same seeded global array; each checks its own part of the
distributed result against ``numpy.fft`` on the global array, and checks that the buffer the
library wrote no longer holds its input (a distributed FFT that hands its input back unchanged is
the failure to look for). Each PE reports one line per check and a summary (tests/gpu/runner.py).
Library calls are made by every PE in the same order, and assertions run after a case's collective
calls, so a failed check does not leave other PEs waiting.

Layouts (cuFFTMp's built-in slabs, row-major, global shape X x Y x Z):

* ``CUFFT_XT_FORMAT_INPLACE`` (the input of a forward transform): X-slabs. PE k owns planes
  ``x0:x1`` of ``X``, the first ``X % N`` PEs one plane more, stored as ``(x1-x0, Y, Z)``; for
  R2C/D2Z the real Z is padded to ``2*(Z//2+1)`` (in-place layout).
* ``CUFFT_XT_FORMAT_INPLACE_SHUFFLED`` (the output of a forward transform): Y-slabs, stored as
  ``(X, y1-y0, Z)``, or ``(X, y1-y0, Z//2+1)`` complex for R2C/D2Z.
* ``cufftXtSetDistribution`` boxes: ``[lower, upper)`` global corners and the local strides in
  elements; forward goes from the input box to the output box, inverse back.
* ``cufftXtMemcpy`` copies the local part between host and device without redistributing.

NVSHMEM is initialised once, before any cuFFTMp call: through MPI with the flat NVSHMEM bindings
(``--init nvshmem``, the default, and always for the layer), or, for the flat checks, by cuFFTMp
itself (``--init library``), which initialises it when the first plan is made with
``CommType.MPI`` and finalises it when that plan is destroyed; a plan made first is then kept for
the whole run. Symmetric buffers (for ``cufftExec*``/``Plan.exec`` on raw pointers and for the
reshape API) come from the flat ``nvshmem.malloc``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

# Before anything loads CUDA, NCCL or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from array_checks import expect_changed, expect_close, expect_equal  # noqa: E402
from mpi4py import MPI  # noqa: E402
from runner import (  # noqa: E402
    Check,
    Checks,
    Report,
    Skip,
    expect,
    expect_raises,
    main,
    nvshmem_status,
    nvshmem_teardown,
)

from mpbind import _core, cufftmp  # noqa: E402
from mpbind._core import _testing as core_testing  # noqa: E402
from mpbind.bindings import cufftmp as cf  # noqa: E402
from mpbind.bindings import nvshmem as nv  # noqa: E402
from mpbind.errors import CuFFTMpError, UsageError  # noqa: E402

T = TypeVar("T")
Verify = Callable[[], str | None]
Box = tuple[list[int], list[int], list[int]]  # lower, upper, strides (elements)

DEVICE = 0
FLAT_SEED = 20240917
LAYER_SEED = 20250211
# Relative to the largest magnitude expected, by precision or dtype.
RTOL = {"single": 1e-4, "double": 1e-10, "complex64": 1e-4, "complex128": 1e-10, "float32": 1e-4, "float64": 1e-10}


# --- what both APIs' checks share -----------------------------------------------------------------------


def view(addr: int, shape: int | tuple[int, ...], dtype: Any) -> Any:
    """A CuPy array of `shape` (or `shape` elements) over device memory at `addr` (not owned)."""
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    count = int(np.prod(dims))
    mem = cp.cuda.UnownedMemory(addr, max(count, 1) * dt.itemsize, None, DEVICE)
    return cp.ndarray(dims, dt, cp.cuda.MemoryPointer(mem, 0))


def write(addr: int, values: np.ndarray) -> None:
    view(addr, values.size, values.dtype).set(np.ascontiguousarray(values).ravel())


def read(addr: int, count: int, dtype: Any) -> np.ndarray:
    result: np.ndarray = view(addr, count, dtype).get()
    return result


def split(n: int, parts: int, k: int) -> tuple[int, int]:
    """cuFFTMp's slab split: the first n % parts parts get one more."""
    base, extra = divmod(n, parts)
    start = k * base + min(k, extra)
    return start, start + base + (1 if k < extra else 0)


def seeded(name: str, shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


@dataclass
class Ctx:
    comm: Any
    pe: int
    npes: int
    stream: Any

    @property
    def s(self) -> int:
        return int(self.stream.ptr)

    def sync(self) -> None:
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()

    def ready(self) -> None:
        """Every PE's buffers are written before any PE starts a distributed operation."""
        self.sync()
        self.comm.Barrier()

    def malloc(self, nbytes: int) -> int:
        """nvshmem.malloc of the largest size any PE asks for (a collective, symmetric call)."""
        nbytes = int(self.comm.allreduce(max(nbytes, 1), op=MPI.MAX))
        addr = nv.malloc(nbytes)
        expect(addr != 0, f"nvshmem.malloc({nbytes}) returned NULL")
        return addr

    def symmetric(self, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> tuple[int, Any]:
        """A symmetric buffer (:meth:`malloc`) and a CuPy view of ``shape``."""
        addr = self.malloc(nbytes)
        return addr, view(addr, shape, dtype)

    def free(self, addr: int) -> None:
        self.sync()
        self.comm.Barrier()
        nv.free(addr)

    def setup(self, fn: Callable[[], T]) -> T:
        """Run a collective setup step on every PE and agree on its outcome, so that all PEs
        skip together when the library refuses it (a CuFFTMpError) and fail together otherwise."""
        result: T | None = None
        error: Exception | None = None
        try:
            result = fn()
        except Exception as exc:  # judged below, once every PE has answered
            error = exc
        outcome = None if error is None else (isinstance(error, CuFFTMpError), f"{type(error).__name__}: {error}")
        outcomes = self.comm.allgather(outcome)
        if error is not None and not isinstance(error, CuFFTMpError):
            raise error
        for pe, other in enumerate(outcomes):
            if other is not None:
                refused, text = other
                if refused:
                    raise Skip(f"the loaded cuFFTMp refused the setup on pe {pe}: {text}")
                raise AssertionError(f"setup failed on pe {pe}: {text}")
        return cast(T, result)


# --- the flat bindings: plans and descriptors as handles, raw pointers ------------------------------------

FLAT = Checks()


def host_buffer(nbytes: int, values: np.ndarray | None = None) -> np.ndarray:
    """A host byte buffer of `nbytes` (what the descriptor holds), starting with `values`."""
    buf = np.zeros(nbytes, np.uint8)
    if values is not None:
        raw = np.ascontiguousarray(values).view(np.uint8).ravel()
        expect(raw.size <= nbytes, f"local data of {raw.size} bytes exceeds the descriptor's {nbytes}")
        buf[:raw.size] = raw
    return buf


def from_host(buf: np.ndarray, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    count = int(np.prod(shape))
    values: np.ndarray = buf[:count * np.dtype(dtype).itemsize].view(dtype).reshape(shape).copy()
    return values


def make_box(lower: list[int], upper: list[int]) -> Box:
    _lx, ly, lz = (u - lo for lo, u in zip(lower, upper, strict=True))
    return list(lower), list(upper), [ly * lz, lz, 1]


def box_shape(box: Box) -> tuple[int, int, int]:
    lower, upper, _ = box
    return upper[0] - lower[0], upper[1] - lower[1], upper[2] - lower[2]


def box_slice(box: Box) -> tuple[slice, slice, slice]:
    lower, upper, _ = box
    return slice(lower[0], upper[0]), slice(lower[1], upper[1]), slice(lower[2], upper[2])


def pencil_grid(npes: int) -> tuple[int, int]:
    """(Px, Py) with Px * Py == npes, as square as possible, Px >= Py."""
    py = int(np.sqrt(npes))
    while npes % py:
        py -= 1
    return npes // py, py


@dataclass(frozen=True)
class Spec:
    """One 3-D transform: complex-to-complex or real-to-complex, single or double precision."""

    kind: str  # "c2c" or "r2c"
    precision: str  # "single" or "double"
    shape: tuple[int, int, int]

    @property
    def real(self) -> Any:
        return np.float32 if self.precision == "single" else np.float64

    @property
    def complex(self) -> Any:
        return np.complex64 if self.precision == "single" else np.complex128

    @property
    def rtol(self) -> float:
        return RTOL[self.precision]

    @property
    def forward_type(self) -> cf.Type:
        if self.kind == "c2c":
            return cf.Type.C2C if self.precision == "single" else cf.Type.Z2Z
        return cf.Type.R2C if self.precision == "single" else cf.Type.D2Z

    @property
    def inverse_type(self) -> cf.Type:
        if self.kind == "c2c":
            return self.forward_type
        return cf.Type.C2R if self.precision == "single" else cf.Type.Z2D

    @property
    def label(self) -> str:
        return f"{self.forward_type.name}/{self.inverse_type.name} {'x'.join(map(str, self.shape))}"

    @property
    def input_dtype(self) -> Any:
        return self.complex if self.kind == "c2c" else self.real

    @property
    def nz_in(self) -> int:
        """The stored length of Z in the input layout (padded in place for R2C)."""
        nz = self.shape[2]
        return nz if self.kind == "c2c" else 2 * (nz // 2 + 1)

    @property
    def nz_out(self) -> int:
        nz = self.shape[2]
        return nz if self.kind == "c2c" else nz // 2 + 1

    def global_input(self, name: str) -> np.ndarray:
        return seeded(name, self.shape, self.input_dtype, FLAT_SEED)

    def forward_ref(self, g: np.ndarray) -> np.ndarray:
        if self.kind == "c2c":
            return np.fft.fftn(g.astype(np.complex128))
        return np.fft.rfftn(g.astype(np.float64))

    def pad(self, local: np.ndarray) -> np.ndarray:
        """The local input as stored: the in-place R2C layout pads Z to 2*(Z//2+1) reals."""
        if self.kind == "c2c":
            return np.ascontiguousarray(local)
        out = np.zeros(local.shape[:2] + (self.nz_in,), local.dtype)
        out[..., :local.shape[2]] = local
        return out

    def unpad(self, stored: np.ndarray) -> np.ndarray:
        return stored if self.kind == "c2c" else stored[..., :self.shape[2]]

    def exec_forward_raw(self, plan: int, idata: int, odata: int) -> None:
        if self.kind == "c2c":
            fn = cf.exec_c2c if self.precision == "single" else cf.exec_z2z
            fn(plan, idata, odata, cf.FORWARD)
        else:
            (cf.exec_r2c if self.precision == "single" else cf.exec_d2z)(plan, idata, odata)

    def exec_inverse_raw(self, plan: int, idata: int, odata: int) -> None:
        if self.kind == "c2c":
            fn = cf.exec_c2c if self.precision == "single" else cf.exec_z2z
            fn(plan, idata, odata, cf.INVERSE)
        else:
            (cf.exec_c2r if self.precision == "single" else cf.exec_z2d)(plan, idata, odata)


class Resources:
    """What one case allocated, released collectively (in the order the samples use) before any
    of the case's assertions run, so that no PE is left waiting in a collective free."""

    def __init__(self, c: Ctx) -> None:
        self.c = c
        self.plans: list[int] = []
        self.descs: list[int] = []
        self.buffers: list[int] = []
        self.reshapes: list[Any] = []

    def plan(self) -> int:
        plan = cf.create()
        self.plans.append(plan)
        return plan

    def xt_malloc(self, plan: int, fmt: cf.SubFormat) -> int:
        desc = cf.xt_malloc(plan, fmt)
        expect(desc != 0, "xt_malloc returned NULL")
        self.descs.append(desc)
        return desc

    def symmetric(self, nbytes: int) -> int:
        addr = self.c.malloc(nbytes)
        self.buffers.append(addr)
        return addr

    def reshape(self) -> Any:
        handle = cf.mp_create_reshape()
        self.reshapes.append(handle)
        return handle

    def release(self) -> list[str]:
        errors: list[str] = []

        def attempt(what: str, fn: Callable[[Any], None], arg: Any) -> None:
            try:
                fn(arg)
            except Exception as exc:
                errors.append(f"{what}: {type(exc).__name__}: {exc}")

        try:
            self.c.sync()
        except Exception as exc:
            errors.append(f"synchronize: {type(exc).__name__}: {exc}")
        self.c.comm.Barrier()
        for desc in reversed(self.descs):
            attempt("xt_free", cf.xt_free, desc)
        for addr in reversed(self.buffers):
            attempt("nvshmem.free", nv.free, addr)
        for handle in reversed(self.reshapes):
            attempt("mp_destroy_reshape", cf.mp_destroy_reshape, handle)
        for plan in reversed(self.plans):
            attempt("destroy", cf.destroy, plan)
        self.descs, self.buffers, self.reshapes, self.plans = [], [], [], []
        self.c.comm.Barrier()
        return errors


def run_case(c: Ctx, body: Callable[[Resources], Verify]) -> str | None:
    """Run `body` (every library call), release what it allocated, then run its checks."""
    res = Resources(c)
    try:
        verify = body(res)
    finally:
        errors = res.release()
    expect(not errors, "cleanup failed: " + "; ".join(errors))
    return verify()


@dataclass(frozen=True)
class Local:
    """The local part of a descriptor's cudaXtDesc."""

    data: int
    nbytes: int
    ngpus: int
    subformat: int


def local_of(desc: int) -> Local:
    lib = cf.LibXtDesc.from_ptr(desc)
    xt = cf.XtDesc.from_ptr(lib.descriptor)
    return Local(xt.data[0], xt.size[0], xt.nGPUs, lib.subFormat)


def subformat_name(value: int) -> str:
    try:
        return cf.SubFormat(value).name
    except ValueError:
        return str(value)


# --- cases: built-in slabs --------------------------------------------------------------------


def slab_boxes(c: Ctx, spec: Spec) -> tuple[Box, Box]:
    """This PE's X-slab (input, padded Z for R2C) and Y-slab (output) as boxes."""
    nx, ny, nz = spec.shape
    x0, x1 = split(nx, c.npes, c.pe)
    y0, y1 = split(ny, c.npes, c.pe)
    return make_box([x0, 0, 0], [x1, ny, nz]), make_box([0, y0, 0], [nx, y1, spec.nz_out])


def make_slab_plans(c: Ctx, res: Resources, spec: Spec, how: str, raw: bool) -> tuple[int, int]:
    """A forward and an inverse plan (the same plan for C2C) on the built-in slabs."""
    nx, ny, nz = spec.shape

    def one(kind: cf.Type) -> int:
        plan = res.plan()
        if how == "mp_make_plan3d":
            cf.set_stream(plan, c.s)
            if raw:
                cf.xt_set_subformat_default(plan, cf.SubFormat.XT_FORMAT_INPLACE,
                                            cf.SubFormat.XT_FORMAT_INPLACE_SHUFFLED)
            work = cf.mp_make_plan3d(plan, nx, ny, nz, kind, c.comm, cf.CommType.MPI)
        else:
            if how == "comm_none":
                cf.mp_attach_comm(plan, cf.CommType.NONE, None)
            else:
                cf.mp_attach_comm(plan, cf.CommType.MPI, c.comm)
            cf.set_stream(plan, c.s)
            if raw:
                cf.xt_set_subformat_default(plan, cf.SubFormat.XT_FORMAT_INPLACE,
                                            cf.SubFormat.XT_FORMAT_INPLACE_SHUFFLED)
            work = cf.make_plan3d(plan, nx, ny, nz, kind)
        expect(isinstance(work, int) and work >= 0, f"work size {work!r}")
        return plan

    forward = one(spec.forward_type)
    inverse = forward if spec.kind == "c2c" else one(spec.inverse_type)
    return forward, inverse


def case_slab_descriptor(c: Ctx, name: str, spec: Spec, how: str) -> str | None:
    """xt_malloc(INPLACE) + xt_memcpy + xt_exec_descriptor forward, then inverse."""
    g = spec.global_input(name)
    in_box, out_box = slab_boxes(c, spec)
    local_in = spec.pad(g[box_slice(in_box)])
    want_fwd = spec.forward_ref(g)[box_slice(out_box)]
    want_back = g[box_slice(in_box)].astype(np.complex128) * g.size
    out_shape = box_shape(out_box)

    def body(res: Resources) -> Verify:
        fwd_plan, inv_plan = c.setup(lambda: make_slab_plans(c, res, spec, how, raw=False))
        desc = c.setup(lambda: res.xt_malloc(fwd_plan, cf.SubFormat.XT_FORMAT_INPLACE))
        loc = local_of(desc)
        host_in = host_buffer(loc.nbytes, local_in)  # referenced until the copy returns
        cf.xt_memcpy(fwd_plan, desc, host_in.ctypes.data, cf.CopyType.HOST_TO_DEVICE)
        c.sync()
        on_device = read(loc.data, local_in.size, spec.input_dtype).reshape(local_in.shape)
        c.ready()
        cf.xt_exec_descriptor(fwd_plan, desc, desc, cf.FORWARD)
        c.sync()
        fmt_fwd = local_of(desc).subformat
        fwd = read(loc.data, int(np.prod(out_shape)), spec.complex).reshape(out_shape)
        host_fwd = host_buffer(loc.nbytes)
        cf.xt_memcpy(fwd_plan, host_fwd.ctypes.data, desc, cf.CopyType.DEVICE_TO_HOST)
        c.sync()
        c.ready()
        cf.xt_exec_descriptor(inv_plan, desc, desc, cf.INVERSE)
        c.sync()
        fmt_inv = local_of(desc).subformat
        host_back = host_buffer(loc.nbytes)
        cf.xt_memcpy(inv_plan, host_back.ctypes.data, desc, cf.CopyType.DEVICE_TO_HOST)
        c.sync()

        def verify() -> str:
            formats = f"subFormat after forward {subformat_name(fmt_fwd)}, after inverse {subformat_name(fmt_inv)}"
            expect(loc.ngpus == 1, f"descriptor nGPUs = {loc.ngpus}, expected 1 (one local GPU per PE)")
            expect(loc.nbytes >= max(local_in.nbytes, fwd.nbytes),
                   f"descriptor holds {loc.nbytes} bytes; the local input needs {local_in.nbytes}, "
                   f"the local output {fwd.nbytes}")
            expect_equal(on_device, local_in, "xt_memcpy HOST_TO_DEVICE (the local X-slab, not redistributed)")
            expect_changed(local_in, fwd, f"forward output ({formats})")
            err_fwd = expect_close(fwd, want_fwd, spec.rtol,
                                   f"forward, Y-slab {out_box[0]}..{out_box[1]} ({formats})")
            expect_equal(from_host(host_fwd, out_shape, spec.complex), fwd,
                         "xt_memcpy DEVICE_TO_HOST after forward (the local Y-slab)")
            back = spec.unpad(from_host(host_back, local_in.shape, spec.input_dtype))
            # The buffer before the inverse (the forward output), read in the input layout.
            before_inv = spec.unpad(from_host(host_fwd, local_in.shape, spec.input_dtype))
            expect_changed(before_inv, back, "inverse output")
            err_back = expect_close(back, want_back, spec.rtol, "inverse of forward (x X*Y*Z)")
            return (f"{spec.label} on {c.npes} PE(s), X-slab {in_box[0][0]}:{in_box[1][0]} -> Y-slab "
                    f"{out_box[0][1]}:{out_box[1][1]}; rel. err forward {err_fwd:.1e}, round trip {err_back:.1e}; "
                    f"{formats}")

        return verify

    return run_case(c, body)


def case_slab_raw(c: Ctx, name: str, spec: Spec) -> str | None:
    """cufftExec* on an nvshmem.malloc buffer, with xt_set_subformat_default(INPLACE, SHUFFLED)."""
    g = spec.global_input(name)
    in_box, out_box = slab_boxes(c, spec)
    local_in = spec.pad(g[box_slice(in_box)])
    want_fwd = spec.forward_ref(g)[box_slice(out_box)]
    want_back = g[box_slice(in_box)].astype(np.complex128) * g.size
    out_shape = box_shape(out_box)
    out_bytes = int(np.prod(out_shape)) * np.dtype(spec.complex).itemsize

    def body(res: Resources) -> Verify:
        fwd_plan, inv_plan = c.setup(lambda: make_slab_plans(c, res, spec, "attach", raw=True))
        buf = c.setup(lambda: res.symmetric(max(local_in.nbytes, out_bytes)))
        write(buf, local_in)
        c.ready()
        spec.exec_forward_raw(fwd_plan, buf, buf)
        c.sync()
        fwd = read(buf, int(np.prod(out_shape)), spec.complex).reshape(out_shape)
        fwd_as_input = read(buf, local_in.size, spec.input_dtype).reshape(local_in.shape)
        c.ready()
        spec.exec_inverse_raw(inv_plan, buf, buf)
        c.sync()
        back_raw = read(buf, local_in.size, spec.input_dtype).reshape(local_in.shape)

        def verify() -> str:
            expect_changed(local_in, fwd, "forward output")
            err_fwd = expect_close(fwd, want_fwd, spec.rtol, f"forward, Y-slab {out_box[0]}..{out_box[1]}")
            expect_changed(spec.unpad(fwd_as_input), spec.unpad(back_raw), "inverse output")
            err_back = expect_close(spec.unpad(back_raw), want_back, spec.rtol, "inverse of forward (x X*Y*Z)")
            return (f"{spec.label} on {c.npes} PE(s); rel. err forward {err_fwd:.1e}, "
                    f"round trip {err_back:.1e}")

        return verify

    return run_case(c, body)


# --- cases: boxes (pencils) -------------------------------------------------------------------


def pencil_boxes(c: Ctx, shape: tuple[int, int, int]) -> tuple[Box, Box]:
    """Input: pencils along Z (X split Px ways, Y split Py ways). Output: pencils along X
    (Y split Px ways, Z split Py ways). With 2 PEs that is X-slabs to Y-slabs."""
    nx, ny, nz = shape
    px, py = pencil_grid(c.npes)
    i, j = divmod(c.pe, py)
    x0, x1 = split(nx, px, i)
    y0, y1 = split(ny, py, j)
    oy0, oy1 = split(ny, px, i)
    oz0, oz1 = split(nz, py, j)
    return make_box([x0, y0, 0], [x1, y1, nz]), make_box([0, oy0, oz0], [nx, oy1, oz1])


def case_box(c: Ctx, name: str, spec: Spec, how: str) -> str | None:
    """C2C/Z2Z with cufftXtSetDistribution boxes, through descriptors, forward and inverse."""
    nx, ny, nz = spec.shape
    g = spec.global_input(name)
    in_box, out_box = pencil_boxes(c, spec.shape)
    local_in = np.ascontiguousarray(g[box_slice(in_box)])
    want_fwd = spec.forward_ref(g)[box_slice(out_box)]
    want_back = local_in.astype(np.complex128) * g.size
    out_shape = box_shape(out_box)

    def make_plan(res: Resources) -> int:
        plan = res.plan()
        (lo_in, up_in, st_in), (lo_out, up_out, st_out) = in_box, out_box
        if how == "make_plan_decomposition":
            cf.set_stream(plan, c.s)
            cf.mp_make_plan_decomposition(plan, 3, [nx, ny, nz], lo_in, up_in, st_in, lo_out, up_out, st_out,
                                          spec.forward_type, c.comm, cf.CommType.MPI)
        else:  # the order of the cuFFTMp pencil sample
            cf.mp_attach_comm(plan, cf.CommType.MPI, c.comm)
            cf.set_stream(plan, c.s)
            cf.xt_set_distribution(plan, 3, lo_in, up_in, lo_out, up_out, st_in, st_out)
            cf.make_plan3d(plan, nx, ny, nz, spec.forward_type)
        return plan

    def body(res: Resources) -> Verify:
        plan = c.setup(lambda: make_plan(res))
        desc = c.setup(lambda: res.xt_malloc(plan, cf.SubFormat.XT_FORMAT_DISTRIBUTED_INPUT))
        loc = local_of(desc)
        host_in = host_buffer(loc.nbytes, local_in)  # referenced until the copy returns
        cf.xt_memcpy(plan, desc, host_in.ctypes.data, cf.CopyType.HOST_TO_DEVICE)
        c.sync()
        on_device = read(loc.data, local_in.size, spec.complex).reshape(local_in.shape)
        c.ready()
        cf.xt_exec_descriptor(plan, desc, desc, cf.FORWARD)
        c.sync()
        fmt_fwd = local_of(desc).subformat
        fwd = read(loc.data, int(np.prod(out_shape)), spec.complex).reshape(out_shape)
        host_fwd = host_buffer(loc.nbytes)
        cf.xt_memcpy(plan, host_fwd.ctypes.data, desc, cf.CopyType.DEVICE_TO_HOST)
        c.sync()
        c.ready()
        cf.xt_exec_descriptor(plan, desc, desc, cf.INVERSE)
        c.sync()
        host_back = host_buffer(loc.nbytes)
        cf.xt_memcpy(plan, host_back.ctypes.data, desc, cf.CopyType.DEVICE_TO_HOST)
        c.sync()

        def verify() -> str:
            boxes = f"in {in_box[0]}..{in_box[1]}, out {out_box[0]}..{out_box[1]}"
            expect(loc.nbytes >= max(local_in.nbytes, fwd.nbytes),
                   f"descriptor holds {loc.nbytes} bytes; the input box needs {local_in.nbytes}, "
                   f"the output box {fwd.nbytes}")
            expect_equal(on_device, local_in, "xt_memcpy HOST_TO_DEVICE (the local input box)")
            expect_changed(local_in, fwd, f"forward output (subFormat {subformat_name(fmt_fwd)})")
            err_fwd = expect_close(fwd, want_fwd, spec.rtol, f"forward, output box ({boxes})")
            expect_equal(from_host(host_fwd, out_shape, spec.complex), fwd,
                         "xt_memcpy DEVICE_TO_HOST after forward (the local output box)")
            back = from_host(host_back, local_in.shape, spec.complex)
            expect_changed(from_host(host_fwd, local_in.shape, spec.complex), back, "inverse output")
            err_back = expect_close(back, want_back, spec.rtol, "inverse of forward (x X*Y*Z)")
            return (f"{spec.label} on {c.npes} PE(s), grid {pencil_grid(c.npes)}, {boxes}; rel. err forward "
                    f"{err_fwd:.1e}, round trip {err_back:.1e}")

        return verify

    return run_case(c, body)


# --- cases: the reshape API -------------------------------------------------------------------


def case_reshape(c: Ctx, name: str, shape: tuple[int, int, int], dtype: Any, boxes: tuple[Box, Box]) -> str | None:
    """mp_make_reshape + mp_exec_reshape_async between two box layouts, checked element by element."""
    dt = np.dtype(dtype)
    if dt.kind == "c":
        g = seeded(name, shape, dt, FLAT_SEED)
    else:  # distinct values: each element names its global position
        g = np.arange(int(np.prod(shape)), dtype=dt).reshape(shape)
    in_box, out_box = boxes
    local_in = np.ascontiguousarray(g[box_slice(in_box)])
    want = g[box_slice(out_box)]
    out_shape = box_shape(out_box)
    sentinel = np.full(int(np.prod(out_shape)), -7, dt)

    def make(res: Resources) -> tuple[Any, int]:
        handle = res.reshape()
        cf.mp_make_reshape(handle, dt.itemsize, 3, in_box[0], in_box[1], in_box[2],
                           out_box[0], out_box[1], out_box[2], c.comm, cf.CommType.MPI)
        return handle, int(cf.mp_get_reshape_size(handle))

    def body(res: Resources) -> Verify:
        handle, work_bytes = c.setup(lambda: make(res))
        nbytes = max(local_in.nbytes, sentinel.nbytes)
        src = res.symmetric(nbytes)
        dst = res.symmetric(nbytes)
        any_work = int(c.comm.allreduce(work_bytes, op=MPI.MAX))
        work = res.symmetric(any_work) if any_work else 0
        write(src, local_in)
        write(dst, sentinel)
        c.ready()  # every destination holds its sentinel before any PE writes into it
        cf.mp_exec_reshape_async(handle, dst, src, work, c.s)
        c.sync()
        got = read(dst, sentinel.size, dt).reshape(out_shape)
        src_after = read(src, local_in.size, dt).reshape(local_in.shape)

        def verify() -> str:
            expect_equal(got, want, f"reshape output box {out_box[0]}..{out_box[1]}")
            expect_equal(src_after, local_in, "reshape input left as it was")
            return (f"{dt.name} {'x'.join(map(str, shape))} on {c.npes} PE(s): in {in_box[0]}..{in_box[1]} -> "
                    f"out {out_box[0]}..{out_box[1]}, workspace {work_bytes} bytes")

        return verify

    return run_case(c, body)


def xslab_to_yslab(c: Ctx, shape: tuple[int, int, int]) -> tuple[Box, Box]:
    nx, ny, nz = shape
    x0, x1 = split(nx, c.npes, c.pe)
    y0, y1 = split(ny, c.npes, c.pe)
    return make_box([x0, 0, 0], [x1, ny, nz]), make_box([0, y0, 0], [nx, y1, nz])


@FLAT.cases
def flat_cases(c: Ctx) -> Iterator[Check]:
    c2c = Spec("c2c", "single", (16, 12, 8))
    z2z = Spec("c2c", "double", (12, 16, 8))
    for name, spec, how in (("slab.c2c.descriptor", c2c, "mp_make_plan3d"), ("slab.z2z.descriptor", z2z, "attach"),
                            ("slab.r2c_c2r.descriptor", Spec("r2c", "single", (16, 12, 8)), "attach"),
                            ("slab.d2z_z2d.descriptor", Spec("r2c", "double", (8, 12, 16)), "mp_make_plan3d"),
                            ("slab.c2c.comm_none", Spec("c2c", "single", (8, 8, 4)), "comm_none")):
        yield name, lambda name=name, spec=spec, how=how: case_slab_descriptor(c, name, spec, how)
    yield "slab.c2c.exec_nvshmem", \
        lambda: case_slab_raw(c, "slab.c2c.exec_nvshmem", Spec("c2c", "single", (16, 16, 16)))
    yield "slab.d2z_z2d.exec_nvshmem", \
        lambda: case_slab_raw(c, "slab.d2z_z2d.exec_nvshmem", Spec("r2c", "double", (12, 8, 16)))

    yield "box.c2c.set_distribution", lambda: case_box(c, "box.c2c.set_distribution", c2c, "set_distribution")
    yield "box.z2z.make_plan_decomposition", \
        lambda: case_box(c, "box.z2z.make_plan_decomposition", z2z, "make_plan_decomposition")

    shape = (16, 12, 8)
    yield "reshape.xslab_to_yslab.complex64", \
        lambda: case_reshape(c, "reshape.xslab_to_yslab.complex64", shape, np.complex64, xslab_to_yslab(c, shape))
    yield "reshape.pencils.int32", \
        lambda: case_reshape(c, "reshape.pencils.int32", shape, np.int32, pencil_boxes(c, shape))


def init_flat(init: str, c: Ctx, report: Report, resources: Resources) -> None:
    if init == "nvshmem":
        attr = nv.InitAttr()
        nv.set_attr_mpi_comm_args(c.comm, attr)
        nv.init_attr(nv.InitFlags.WITH_MPI_COMM, attr)
        report.passes("init.nvshmem_with_mpi_comm")
        return
    # cuFFTMp initialises NVSHMEM when a plan is made with CommType.MPI and finalises it when
    # that plan is destroyed: keep the first plan for the whole run.
    before = int(nv.init_status())
    plan = resources.plan()
    cf.mp_attach_comm(plan, cf.CommType.MPI, c.comm)
    cf.make_plan3d(plan, 8, 8, 4, cf.Type.C2C)
    after = int(nv.init_status())
    expect(after in (nv.InitStatus.IS_INITIALIZED, nv.InitStatus.LIMITED_MPG, nv.InitStatus.FULL_MPG),
           f"init_status() after the first plan = {nvshmem_status(after)} (before: {nvshmem_status(before)})")
    report.passes("init.by_cufftmp_plan", f"init_status {nvshmem_status(before)} -> {nvshmem_status(after)}")
    # The flat bindings' init check asks the library, so a runtime cuFFTMp initialised counts.
    report.check("init.flat_calls_after_cufftmp_init",
                 lambda: expect(nv.team_my_pe(nv.Team.WORLD) == c.pe, "team_my_pe(WORLD) != this PE"))


# --- the Pythonic layer: Plan, Descriptor and Reshape objects ----------------------------------------------

LAYER = Checks()


def case_plan_lifecycle(c: Ctx) -> str:
    shape = (8, 8, 4)
    plan = cufftmp.Plan.create_3d(c.comm, shape, cufftmp.Type.C2C, stream=c.stream)
    facts = (plan.fft_type, plan.shape, plan.work_size, plan.local_shapes(cufftmp.FORWARD), repr(plan),
             plan.closed, plan.handle)
    plan.close()
    closed_after = plan.closed
    plan.close()  # idempotent
    with cufftmp.Plan() as unattached:  # never attached: a local release
        expect(unattached.fft_type is None, f"an unmade plan has fft_type {unattached.fft_type}")
    expect(unattached.closed, "the with-block did not close the plan")
    fft_type, got_shape, work, local, text, was_closed, handle = facts
    x0, x1 = split(8, c.npes, c.pe)
    y0, y1 = split(8, c.npes, c.pe)
    expect(fft_type == cufftmp.Type.C2C, f"fft_type {fft_type}")
    expect(got_shape == shape, f"shape {got_shape}")
    expect(isinstance(work, int) and work >= 0, f"work_size {work!r}")
    expect(local == ((x1 - x0, 8, 4), (8, y1 - y0, 4)), f"local_shapes {local}")
    expect("C2C" in text and "comm=MPI" in text, f"repr {text}")
    expect(not was_closed and closed_after, "closed before/after close()")
    expect(isinstance(handle, int), f"handle {handle!r}")
    for what, fn in (("handle", lambda: plan.handle), ("exec", lambda: plan.exec(1, direction=cufftmp.FORWARD)),
                     ("malloc", lambda: plan.malloc()), ("set_stream", lambda: plan.set_stream(None)),
                     ("local_shapes", lambda: plan.local_shapes(cufftmp.FORWARD))):
        msg = expect_raises(UsageError, fn, f"{what} after close")
        expect("closed" in msg, f"{what} after close: {msg}")
    return f"work size {work} bytes, {text}"


def case_slab_exec(c: Ctx, name: str, fft_type: cufftmp.Type, dtype: Any, shape: tuple[int, int, int]) -> str:
    """Plan.create_3d + Plan.exec in place on an NVSHMEM buffer viewed by CuPy, forward then inverse."""
    nx, ny, nz = shape
    g = seeded(name, shape, dtype, LAYER_SEED)
    x0, x1 = split(nx, c.npes, c.pe)
    y0, y1 = split(ny, c.npes, c.pe)
    local_in = np.ascontiguousarray(g[x0:x1])
    want_fwd = np.fft.fftn(g.astype(np.complex128))[:, y0:y1]
    want_back = local_in.astype(np.complex128) * g.size
    in_shape, out_shape = (x1 - x0, ny, nz), (nx, y1 - y0, nz)
    count = max(int(np.prod(in_shape)), int(np.prod(out_shape)))
    plan = cufftmp.Plan.create_3d(c.comm, shape, fft_type, stream=c.stream)
    addr, buf = c.symmetric(count * np.dtype(dtype).itemsize, dtype, (count,))
    errors: list[str] = []
    try:
        local = plan.local_shapes(cufftmp.FORWARD)
        # Refused before any library call, on this PE only (no collective is entered).
        wrong_dtype = np.float32 if np.dtype(dtype) == np.complex64 else np.complex64
        errors.append(expect_raises(UsageError, lambda: plan.exec(view(addr, (count,), wrong_dtype),
                                                                  direction=cufftmp.FORWARD), "wrong dtype"))
        errors.append(expect_raises(UsageError, lambda: plan.exec(buf[:1], direction=cufftmp.FORWARD),
                                    "too small"))
        errors.append(expect_raises(UsageError, lambda: plan.exec(buf), "no direction for C2C"))
        errors.append(expect_raises(UsageError, lambda: plan.exec(buf, direction=0), "direction 0"))
        buf[:local_in.size] = cp.asarray(local_in.ravel())
        c.ready()
        plan.exec(buf, direction=cufftmp.FORWARD)
        # cuFFTMp queued NVSHMEM collectives on the plan's stream: the next host-side one waits for them
        fenced = c.stream.ptr in core_testing.fence_streams()
        c.sync()
        fwd = cp.asnumpy(buf[:int(np.prod(out_shape))]).reshape(out_shape)
        fwd_as_input = cp.asnumpy(buf[:local_in.size]).reshape(in_shape)
        c.ready()
        plan.exec(buf, direction=cufftmp.INVERSE)
        c.sync()
        back = cp.asnumpy(buf[:local_in.size]).reshape(in_shape)
    finally:
        c.free(addr)
        plan.close()
    expect(fenced, "the exec's stream is not in the collective fence")
    expect(not core_testing.fence_streams(), "closing the plan did not wait for the fence")
    expect(local == (in_shape, out_shape), f"local_shapes {local}")
    expect_changed(local_in, fwd, "forward output")
    err_fwd = expect_close(fwd, want_fwd, RTOL[np.dtype(dtype).name], f"forward, Y-slab {y0}:{y1}")
    expect_changed(fwd_as_input, back, "inverse output")
    err_back = expect_close(back, want_back, RTOL[np.dtype(dtype).name], "inverse of forward (x X*Y*Z)")
    return (f"{fft_type.name} {nx}x{ny}x{nz} on {c.npes} PE(s); rel. err forward {err_fwd:.1e}, "
            f"round trip {err_back:.1e}; refused: {len(errors)} bad calls")


def layer_slab_descriptor(c: Ctx, name: str, fft_type: cufftmp.Type, dtype: Any,
                          shape: tuple[int, int, int]) -> str:
    """Step-by-step Plan + Descriptor: copy_from_host, exec_descriptor forward/inverse, copy_to_host."""
    nx, ny, nz = shape
    g = seeded(name, shape, dtype, LAYER_SEED)
    x0, x1 = split(nx, c.npes, c.pe)
    y0, y1 = split(ny, c.npes, c.pe)
    local_in = np.ascontiguousarray(g[x0:x1])
    want_fwd = np.fft.fftn(g.astype(np.complex128))[:, y0:y1]
    want_back = local_in.astype(np.complex128) * g.size
    out_shape = (nx, y1 - y0, nz)
    plan = cufftmp.Plan()
    plan.attach_comm(c.comm)
    plan.set_stream(c.stream)
    work = plan.make_plan_3d(nx, ny, nz, fft_type)
    desc = plan.malloc(cufftmp.SubFormat.XT_FORMAT_INPLACE)
    try:
        nbytes = desc.nbytes
        host = np.zeros(nbytes, np.uint8)
        host[:local_in.nbytes] = local_in.view(np.uint8).ravel()
        too_small = expect_raises(UsageError, lambda: desc.copy_from_host(host[:1]), "small host buffer")
        desc.copy_from_host(host)
        c.sync()
        on_device = cp.asnumpy(view(desc.data, local_in.shape, dtype))
        c.ready()
        plan.exec_descriptor(desc, direction=cufftmp.FORWARD)
        c.sync()
        fmt_fwd = desc.subformat
        fwd = desc.copy_to_host()[:int(np.prod(out_shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(out_shape)
        c.ready()
        plan.exec_descriptor(desc, desc, cufftmp.INVERSE)
        c.sync()
        out = np.empty(nbytes, np.uint8)
        back = desc.copy_to_host(out)[:local_in.nbytes].view(dtype).reshape(local_in.shape)
    finally:
        c.ready()
        plan.close()  # frees the descriptor first
    expect(desc.closed, "closing the plan did not free its descriptor")
    expect_raises(UsageError, lambda: desc.data, "descriptor data after close")
    expect_raises(UsageError, lambda: desc.copy_to_host(), "descriptor copy after close")
    expect(nbytes >= max(local_in.nbytes, int(np.prod(out_shape)) * np.dtype(dtype).itemsize),
           f"descriptor part of {nbytes} bytes")
    expect("bytes" in too_small, too_small)
    expect_equal(on_device, local_in, "copy_from_host (the local X-slab)")
    expect_changed(local_in, fwd, "forward output")
    err_fwd = expect_close(fwd, want_fwd, RTOL[np.dtype(dtype).name], f"forward, Y-slab {y0}:{y1}")
    err_back = expect_close(back, want_back, RTOL[np.dtype(dtype).name], "inverse of forward (x X*Y*Z)")
    return (f"{fft_type.name} {nx}x{ny}x{nz} on {c.npes} PE(s), work {work} B, subformat after forward "
            f"{getattr(fmt_fwd, 'name', fmt_fwd)}; rel. err forward {err_fwd:.1e}, round trip {err_back:.1e}")


def layer_reshape(c: Ctx, name: str, dtype: Any, shape: tuple[int, int, int]) -> str:
    """Reshape.create X-slabs -> Y-slabs, exec on CuPy views of NVSHMEM buffers, element by element."""
    nx, ny, nz = shape
    dt = np.dtype(dtype)
    g = (np.arange(int(np.prod(shape))).reshape(shape) if dt.kind in "iu"
         else seeded(name, shape, dt, LAYER_SEED)).astype(dt)
    x0, x1 = split(nx, c.npes, c.pe)
    y0, y1 = split(ny, c.npes, c.pe)
    in_box = ([x0, 0, 0], [x1, ny, nz])
    out_box = ([0, y0, 0], [nx, y1, nz])
    local_in = np.ascontiguousarray(g[x0:x1])
    want = g[:, y0:y1]
    reshape = cufftmp.Reshape.create(c.comm, dt, in_box, out_box)
    work_bytes = reshape.workspace_size
    src_addr, src = c.symmetric(local_in.nbytes, dt, local_in.shape)
    dst_addr, dst = c.symmetric(want.nbytes, dt, want.shape)
    any_work = int(c.comm.allreduce(work_bytes, op=MPI.MAX))
    work_addr, work = c.symmetric(any_work, np.uint8, (any_work,)) if any_work else (0, None)
    try:
        src[...] = cp.asarray(local_in)
        dst[...] = cp.asarray(np.full(want.shape, -7, dt))
        refused = expect_raises(UsageError, lambda: reshape.exec(dst[:0], src, work, c.stream), "small output")
        c.ready()
        reshape.exec(dst, src, work, stream=c.stream)
        c.sync()
        got = cp.asnumpy(dst)
        src_after = cp.asnumpy(src)
    finally:
        c.ready()
        if work_addr:
            nv.free(work_addr)
        nv.free(dst_addr)
        nv.free(src_addr)
        reshape.close()
    reshape.close()
    expect(reshape.closed, "reshape not closed")
    expect_raises(UsageError, lambda: reshape.workspace_size, "workspace_size after close")
    expect_raises(UsageError, lambda: reshape.exec(1, 1, 0), "exec after close")
    expect("bytes" in refused, refused)
    expect_equal(got, want, f"reshape output box {out_box}")
    expect_equal(src_after, local_in, "reshape input left as it was")
    return f"{dt.name} {nx}x{ny}x{nz} on {c.npes} PE(s), workspace {work_bytes} bytes"


def case_dropped_plan(c: Ctx) -> str:
    """A Plan (and a Descriptor) dropped unclosed: ResourceWarning, queued, released by drain()."""
    before = _core.queued()
    plan = cufftmp.Plan.create_3d(c.comm, (8, 8, 4), cufftmp.Type.C2C, stream=c.stream)
    desc = plan.malloc()
    plan_serial, desc_serial = plan.serial, desc.serial
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del desc, plan
        gc.collect()
    queued = _core.queued()
    c.sync()
    c.comm.Barrier()
    ran = _core.drain()
    after = _core.queued()
    kinds = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    expect(before == [], f"queue not empty before: {before}")
    # Dropped together: the descriptor (newer) and its plan both wait, and drain() runs both.
    expect(("cufftmp.Plan", plan_serial) in queued, f"queued {queued} lacks the plan {plan_serial}")
    expect(("cufftmp.Descriptor", desc_serial) in queued, f"queued {queued} lacks the descriptor {desc_serial}")
    expect(any("cufftmp.Plan" in k for k in kinds), f"no ResourceWarning for the plan: {kinds}")
    expect(ran == 2, f"drain() ran {ran} releases, expected 2")
    expect(after == [], f"queue after drain: {after}")
    return f"queued {queued}, drain ran {ran}"


def case_refusals(c: Ctx) -> str:
    """Misuse refused with UsageError/TypeError before the library (no collective entered)."""
    notes = []
    notes.append(expect_raises(UsageError, lambda: cufftmp.Plan.create_3d(c.comm, (8, 0, 4), cufftmp.Type.C2C),
                               "zero extent"))
    notes.append(expect_raises(UsageError, lambda: cufftmp.Plan.create_3d(c.comm, (8, 8, 4), 7), "unknown type"))
    notes.append(expect_raises(TypeError, lambda: cufftmp.Plan.create_3d("world", (8, 8, 4), cufftmp.Type.C2C),
                               "bad communicator"))
    plan = cufftmp.Plan()  # no communicator: released locally by close()
    try:
        notes.append(expect_raises(UsageError, lambda: plan.exec(1, direction=cufftmp.FORWARD), "unmade exec"))
        notes.append(expect_raises(UsageError, lambda: plan.malloc(), "unmade malloc"))
        notes.append(expect_raises(UsageError, lambda: plan.set_distribution([0, 0], [1, 1, 1], [0, 0, 0],
                                                                             [1, 1, 1]), "ragged box"))
        notes.append(expect_raises(UsageError, lambda: plan.set_subformat_default(9, 0), "bad subformat"))
    finally:
        plan.close()
    return f"{len(notes)} refusals"


def case_r2c_plans(c: Ctx) -> str:
    """R2C and C2R plans (Plan.create_3d) through exec: FORWARD-only / INVERSE-only, in place."""
    shape = (8, 12, 8)
    nx, ny, nz = shape
    g = seeded("r2c", shape, np.float32, LAYER_SEED)
    x0, x1 = split(nx, c.npes, c.pe)
    y0, y1 = split(ny, c.npes, c.pe)
    nzp, nzc = 2 * (nz // 2 + 1), nz // 2 + 1
    padded = np.zeros((x1 - x0, ny, nzp), np.float32)
    padded[..., :nz] = g[x0:x1]
    want_fwd = np.fft.rfftn(g.astype(np.float64))[:, y0:y1]
    fwd_plan = cufftmp.Plan.create_3d(c.comm, shape, cufftmp.Type.R2C, stream=c.stream)
    inv_plan = cufftmp.Plan.create_3d(c.comm, shape, cufftmp.Type.C2R, stream=c.stream)
    count_real = max(padded.size, 2 * nx * (y1 - y0) * nzc)
    addr, real = c.symmetric(count_real * 4, np.float32, (count_real,))
    try:
        wrong = expect_raises(UsageError, lambda: fwd_plan.exec(real, direction=cufftmp.INVERSE), "R2C inverse")
        expect(fwd_plan.local_shapes(cufftmp.FORWARD) == (padded.shape, (nx, y1 - y0, nzc)),
               f"R2C local_shapes {fwd_plan.local_shapes(cufftmp.FORWARD)}")
        real[:padded.size] = cp.asarray(padded.ravel())
        c.ready()
        fwd_plan.exec(real)  # direction implied
        c.sync()
        fwd = cp.asnumpy(view(addr, (nx, y1 - y0, nzc), np.complex64))
        c.ready()
        inv_plan.exec(view(addr, (count_real // 2,), np.complex64))
        c.sync()
        back = cp.asnumpy(real[:padded.size]).reshape(padded.shape)[..., :nz]
    finally:
        c.free(addr)
        inv_plan.close()
        fwd_plan.close()
    expect("FORWARD" in wrong, wrong)
    err_fwd = expect_close(fwd, want_fwd, 1e-4, "R2C forward")
    err_back = expect_close(back, g[x0:x1].astype(np.float64) * g.size, 1e-4, "C2R of R2C (x X*Y*Z)")
    return f"R2C/C2R {nx}x{ny}x{nz}; rel. err forward {err_fwd:.1e}, round trip {err_back:.1e}"


@LAYER.cases
def layer_cases(c: Ctx) -> Iterator[Check]:
    yield "plan.lifecycle", lambda: case_plan_lifecycle(c)
    yield "plan.refusals", lambda: case_refusals(c)
    yield "slab.c2c.exec", lambda: case_slab_exec(c, "slab.c2c.exec", cufftmp.Type.C2C, np.complex64, (16, 12, 8))
    yield "slab.z2z.exec", lambda: case_slab_exec(c, "slab.z2z.exec", cufftmp.Type.Z2Z, np.complex128, (12, 16, 8))
    yield "slab.r2c_c2r.exec", lambda: case_r2c_plans(c)
    yield "slab.c2c.descriptor", \
        lambda: layer_slab_descriptor(c, "slab.c2c.descriptor", cufftmp.Type.C2C, np.complex64, (16, 12, 8))
    yield "reshape.xslab_to_yslab.complex64", lambda: layer_reshape(c, "reshape.c64", np.complex64, (16, 12, 8))
    yield "reshape.xslab_to_yslab.int32", lambda: layer_reshape(c, "reshape.i32", np.int32, (12, 16, 4))
    yield "teardown.dropped_plan_drained", lambda: case_dropped_plan(c)


# --- the run ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    """NVSHMEM initialised (by this script through MPI, or by cuFFTMp's first plan); after the
    checks, NVSHMEM finalised (the layer also checks that nothing was left queued), or that first
    plan destroyed."""
    comm = MPI.COMM_WORLD
    cp.cuda.Device(DEVICE).use()
    cp.cuda.runtime.free(0)  # create the primary context before NVSHMEM looks for it
    stream = cp.cuda.Stream(non_blocking=True)
    c = Ctx(comm=comm, pe=comm.Get_rank(), npes=comm.Get_size(), stream=stream)
    keeper = Resources(c)
    init_flat("nvshmem" if args.api == "layer" else args.init, c, report, keeper)
    report.info("versions", f"cuFFTMp {cf.get_version()} (bindings for {cf.VERSION}), NVSHMEM "
                + ".".join(map(str, nv.vendor_get_version_info())))
    report.info("init_status", nvshmem_status(int(nv.init_status())))
    try:
        yield c
    finally:
        if args.api == "layer":
            nvshmem_teardown(report, comm, c.sync, nv.finalize)
        else:
            c.sync()
            comm.Barrier()
            if args.init == "library":
                errors = keeper.release()
                report.check("teardown.destroy_first_plan", lambda: expect(not errors, "; ".join(errors)))
            else:
                report.check("teardown.nvshmem_finalize", nv.finalize)
            report.info("init_status_after_teardown", nvshmem_status(int(nv.init_status())))


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--api", choices=("flat", "layer"), default="flat",
                    help="the flat bindings (mpbind.bindings.cufftmp) or the layer (mpbind.cufftmp)")
    ap.add_argument("--init", choices=("nvshmem", "library"), default="nvshmem",
                    help="flat: initialise NVSHMEM here through MPI, or let cuFFTMp do it")


if __name__ == "__main__":
    sys.exit(main(__doc__, started, lambda args: LAYER if args.api == "layer" else FLAT, arguments=arguments,
                  timeout=150.0))
