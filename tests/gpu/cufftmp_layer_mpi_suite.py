"""Multi-PE checks of the Pythonic cuFFTMp layer (``mpbind.cufftmp``), results compared with NumPy.

    mpirun -np N python tests/gpu/cufftmp_layer_mpi_suite.py [--timeout S]

All PEs share GPU 0 and build the same seeded global array; each checks its own part of the
distributed result against ``numpy.fft`` on the global array, and that the buffer the library
wrote no longer holds its input. NVSHMEM is initialised through MPI before any cuFFTMp call;
symmetric buffers for ``Plan.exec`` and ``Reshape.exec`` come from the flat ``nvshmem.malloc``.
Each PE prints one line per check

    PASS name [pe k]            the check held (a note may follow a colon)
    FAIL name [pe k]: reason    it did not
    INFO name [pe k]: text      a recorded fact, not a check

and closes with ``pe=<k> passed=<p> failed=<f> skipped=<s>``; the exit status is 1 when
anything failed. Library calls are made by every PE in the same order, and assertions run
after a case's collective calls, so a failed check does not leave other PEs waiting.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import warnings
import zlib
from dataclasses import dataclass
from typing import Any

# Before anything loads CUDA, NCCL or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from array_checks import expect_changed, expect_close, expect_equal  # noqa: E402
from mpi4py import MPI  # noqa: E402
from suite_report import Report, add_timeout, expect, expect_raises, nvshmem_teardown, watched  # noqa: E402

from mpbind import _core, cufftmp  # noqa: E402
from mpbind.bindings import nvshmem as nv  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

DEVICE = 0
SEED = 20250211
RTOL = {"complex64": 1e-4, "complex128": 1e-10, "float32": 1e-4, "float64": 1e-10}


def split(n: int, parts: int, k: int) -> tuple[int, int]:
    base, extra = divmod(n, parts)
    start = k * base + min(k, extra)
    return start, start + base + (1 if k < extra else 0)


def seeded(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
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

    def sync(self) -> None:
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()

    def ready(self) -> None:
        self.sync()
        self.comm.Barrier()

    def symmetric(self, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> tuple[int, Any]:
        """nvshmem.malloc of the largest size any PE asks for, and a CuPy view of ``shape``."""
        nbytes = int(self.comm.allreduce(max(nbytes, 1), op=MPI.MAX))
        addr = nv.malloc(nbytes)
        expect(addr != 0, f"nvshmem.malloc({nbytes}) returned NULL")
        return addr, view(addr, shape, dtype)

    def free(self, addr: int) -> None:
        self.sync()
        self.comm.Barrier()
        nv.free(addr)


def view(addr: int, shape: tuple[int, ...], dtype: Any) -> Any:
    dt = np.dtype(dtype)
    count = int(np.prod(shape))
    mem = cp.cuda.UnownedMemory(addr, max(count, 1) * dt.itemsize, None, DEVICE)
    return cp.ndarray(shape, dt, cp.cuda.MemoryPointer(mem, 0))


# --- cases ------------------------------------------------------------------------------------


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
    g = seeded(name, shape, dtype)
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
        fenced = c.stream.ptr in _core._testing.fence_streams()
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
    expect(not _core._testing.fence_streams(), "closing the plan did not wait for the fence")
    expect(local == (in_shape, out_shape), f"local_shapes {local}")
    expect_changed(local_in, fwd, "forward output")
    err_fwd = expect_close(fwd, want_fwd, RTOL[np.dtype(dtype).name], f"forward, Y-slab {y0}:{y1}")
    expect_changed(fwd_as_input, back, "inverse output")
    err_back = expect_close(back, want_back, RTOL[np.dtype(dtype).name], "inverse of forward (x X*Y*Z)")
    return (f"{fft_type.name} {nx}x{ny}x{nz} on {c.npes} PE(s); rel. err forward {err_fwd:.1e}, "
            f"round trip {err_back:.1e}; refused: {len(errors)} bad calls")


def case_slab_descriptor(c: Ctx, name: str, fft_type: cufftmp.Type, dtype: Any,
                         shape: tuple[int, int, int]) -> str:
    """Step-by-step Plan + Descriptor: copy_from_host, exec_descriptor forward/inverse, copy_to_host."""
    nx, ny, nz = shape
    g = seeded(name, shape, dtype)
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


def case_reshape(c: Ctx, name: str, dtype: Any, shape: tuple[int, int, int]) -> str:
    """Reshape.create X-slabs -> Y-slabs, exec on CuPy views of NVSHMEM buffers, element by element."""
    nx, ny, nz = shape
    dt = np.dtype(dtype)
    g = (np.arange(int(np.prod(shape))).reshape(shape) if dt.kind in "iu" else seeded(name, shape, dt)).astype(dt)
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
    g = seeded("r2c", shape, np.float32)
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


def run_suite(c: Ctx, report: Report) -> None:
    r = report.check
    r("plan.lifecycle", lambda: case_plan_lifecycle(c))
    r("plan.refusals", lambda: case_refusals(c))
    r("slab.c2c.exec", lambda: case_slab_exec(c, "slab.c2c.exec", cufftmp.Type.C2C, np.complex64, (16, 12, 8)))
    r("slab.z2z.exec", lambda: case_slab_exec(c, "slab.z2z.exec", cufftmp.Type.Z2Z, np.complex128, (12, 16, 8)))
    r("slab.r2c_c2r.exec", lambda: case_r2c_plans(c))
    r("slab.c2c.descriptor",
      lambda: case_slab_descriptor(c, "slab.c2c.descriptor", cufftmp.Type.C2C, np.complex64, (16, 12, 8)))
    r("reshape.xslab_to_yslab.complex64", lambda: case_reshape(c, "reshape.c64", np.complex64, (16, 12, 8)))
    r("reshape.xslab_to_yslab.int32", lambda: case_reshape(c, "reshape.i32", np.int32, (12, 16, 4)))
    r("teardown.dropped_plan_drained", lambda: case_dropped_plan(c))


def run(comm: Any, report: Report) -> None:
    cp.cuda.Device(DEVICE).use()
    cp.cuda.runtime.free(0)  # the primary context, before NVSHMEM looks for it
    stream = cp.cuda.Stream(non_blocking=True)
    c = Ctx(comm=comm, pe=comm.Get_rank(), npes=comm.Get_size(), stream=stream)
    attr = nv.InitAttr()
    nv.set_attr_mpi_comm_args(c.comm, attr)
    nv.init_attr(nv.InitFlags.WITH_MPI_COMM, attr)
    report.passed += 1
    report.line("PASS", "init.nvshmem_with_mpi_comm")
    try:
        run_suite(c, report)
    finally:
        nvshmem_teardown(report, comm, c.sync, nv.finalize)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_timeout(ap, 150.0)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    report = Report(comm.Get_rank(), tracebacks="CUFFTMP_SUITE_TRACEBACKS")
    return watched(report, args.timeout, lambda: run(comm, report), elapsed=True)


if __name__ == "__main__":
    sys.exit(main())
