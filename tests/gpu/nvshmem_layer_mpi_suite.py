"""Multi-PE checks of mpbind.nvshmem (the Pythonic layer), received values compared with NumPy.

    mpirun -np N python tests/gpu/nvshmem_layer_mpi_suite.py [--init uid|mpi] [--timeout S]

All PEs share GPU 0; work runs on a non-blocking CuPy stream. Each PE prints one line per
check (``PASS``/``FAIL``/``SKIP``/``INFO name [pe k]: ...``, as nvshmem_mpi_suite.py does) and
closes with ``pe=<k> passed=<p> failed=<f> skipped=<s> xfailed=<x>``; the exit status is 1 when
anything failed. In NVSHMEM's limited multi-PE-per-GPU mode (several PEs on one GPU without
CUDA MPS) team creation, team barriers and collectives are skipped, with the reason.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Before anything loads CUDA or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from array_checks import expect_equal  # noqa: E402
from mpi4py import MPI  # noqa: E402
from suite_report import Report, Skip, add_timeout, expect, watched  # noqa: E402

from mpbind import _core  # noqa: E402
from mpbind import nvshmem as nv  # noqa: E402
from mpbind.errors import NVSHMEMError, UsageError  # noqa: E402

DEVICE = 0
COUNT = 1000
SENTINEL = -7
LIMITED_MPG_REASON = ("not supported by NVSHMEM in limited MPG mode (several PEs on one GPU without "
                      "CUDA MPS): libnvshmem_host would exit the process")
NUMPY_REDUCE: dict[str, Any] = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}
REDUCE_CASES = ([(op, t) for t in ("float32", "float64", "int32", "int64") for op in ("sum", "prod", "min", "max")]
                + [(op, t) for t in ("int32", "uint64") for op in ("and", "or", "xor")])


def expect_usage_error(fn: Callable[[], object], match: str) -> None:
    try:
        fn()
    except UsageError as exc:
        expect(match in str(exc), f"UsageError {exc!r} does not mention {match!r}")
    else:
        raise AssertionError(f"no UsageError (expected one mentioning {match!r})")


def pattern(pe: int, count: int = COUNT, dtype: Any = np.int32) -> np.ndarray:
    return (pe * 1000 + np.arange(count)).astype(dtype)


@dataclass
class Ctx:
    comm: Any
    rt: Any
    pe: int
    npes: int
    stream: Any
    limited: bool

    @property
    def right(self) -> int:
        return (self.pe + 1) % self.npes

    @property
    def left(self) -> int:
        return (self.pe - 1) % self.npes

    def full_mode_only(self) -> None:
        if self.limited:
            raise Skip(LIMITED_MPG_REASON)

    def settle(self) -> None:
        """Every PE's writes done and visible before the next step."""
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()
        self.comm.Barrier()


def view(arr: Any) -> Any:
    """A CuPy view through DLPack (no copy)."""
    return cp.from_dlpack(arr)


# --- checks ----------------------------------------------------------------------------------


def check_runtime(c: Ctx, init: str) -> str:
    expect(c.rt.my_pe == c.pe and nv.my_pe() == c.pe, f"my_pe {c.rt.my_pe}, MPI rank {c.pe}")
    expect(c.rt.n_pes == c.npes and nv.n_pes() == c.npes, f"n_pes {c.rt.n_pes}, MPI size {c.npes}")
    again = nv.init(mpi_comm=c.comm, bootstrap=init, device=DEVICE)
    expect(again.serial == c.rt.serial and nv.runtime().serial == c.rt.serial, "init() again: another runtime")
    expect_usage_error(lambda: nv.init(mpi_comm=c.comm, bootstrap=init, device=DEVICE + 5), "device=5")
    expect(nv.is_initialized() and not nv.is_finalized(), "is_initialized/is_finalized")
    return f"init_status {c.rt.init_status}, limited_mpg={c.rt.limited_mpg}"


def check_world_team(c: Ctx) -> None:
    world = c.rt.team_world
    expect(world.predefined and world.handle == 0, f"{world!r}")
    expect(world.my_pe == c.pe and world.n_pes == c.npes, f"world team {world.my_pe}/{world.n_pes}")
    expect(world.translate_pe(c.pe, c.rt.team_world) == c.pe, "translate_pe within world")
    world.close()
    expect(world.closed, "closing a predefined team")
    expect(c.rt.team_world.n_pes == c.npes, "the world team after closing one handle")


def check_split_strided(c: Ctx) -> str:
    c.full_mode_only()
    world = c.rt.team_world
    size = (c.npes + 1) // 2
    # nvshmem_malloc is collective over all PEs: allocate before, free after, on every PE.
    src, dst = nv.empty(COUNT, "int32"), nv.zeros(COUNT, "int32")
    view(src).set(pattern(c.pe))
    c.settle()
    team = world.split_strided(0, 2, size)
    try:
        if c.pe % 2:
            c.comm.Barrier()  # the members' reduction and destroy
            expect(team is None, f"odd pe got {team!r}, expected None")
            return "not a member"
        if team is None:
            c.comm.Barrier()
            raise AssertionError("an even pe got None")
        try:
            my, n = team.my_pe, team.n_pes
            back = [team.translate_pe(i, world) for i in range(size)]
            nv.barrier(team, c.stream)
            nv.reduce("sum", dst, src, team=team, stream=c.stream)
            c.stream.synchronize()
            got = view(dst).get()
        finally:
            team.destroy()
            c.comm.Barrier()
    finally:
        c.settle()
        dst.free()
        src.free()
    expect(team.closed, "destroy() did not close the team")
    expect(my == c.pe // 2 and n == size, f"team my_pe/n_pes = {my}/{n}")
    expect(back == list(range(0, c.npes, 2)), f"translate_pe to world = {back}")
    expect_equal(got, np.add.reduce(np.stack([pattern(p) for p in range(0, c.npes, 2)])), "sum over even PEs")
    return f"{size} PEs"


def check_empty_zeros(c: Ctx) -> str:
    z = nv.zeros((10, 100), "float64")
    e = nv.empty(COUNT, "int32", alignment=1 << 16)
    try:
        expect(z.shape == (10, 100) and z.dtype == "float64" and z.nbytes == 8000, f"{z!r}")
        expect(e.ptr % (1 << 16) == 0, f"aligned ptr {e.ptr:#x}")
        cai = z.__cuda_array_interface__
        expect(cai["version"] == 3 and cai["data"][0] == z.ptr and cai["shape"] == (10, 100), f"{cai}")
        expect_equal(cp.asarray(z).get(), np.zeros((10, 100)), "zeros")
        expect(z.__dlpack_device__() == (2, DEVICE), f"{z.__dlpack_device__()}")
        found = _core.nvshmem.containing(z.ptr + 800, 80)
        expect(found is not None and found["ptr"] == z.ptr, f"containing: {found}")
    finally:
        e.free()
        z.free()
        c.comm.Barrier()
    return f"{z!r}"


def check_zero_copy(c: Ctx) -> str:
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"PyTorch is not importable: {exc}") from None
    arr = nv.zeros(COUNT, "float32")
    try:
        cupy_view = cp.from_dlpack(arr)
        cai_view = cp.asarray(arr)
        torch_view = torch.from_dlpack(arr)
        torch_cai = torch.as_tensor(arr, device="cuda")
        ptrs = {cupy_view.data.ptr, cai_view.data.ptr, torch_view.data_ptr(), torch_cai.data_ptr()}
        expect(ptrs == {arr.ptr}, f"views at {sorted(hex(p) for p in ptrs)}, array at {arr.ptr:#x}")
        cupy_view[:] = cp.asarray(pattern(c.pe, dtype=np.float32))
        cp.cuda.runtime.deviceSynchronize()
        expect_equal(torch_view.cpu().numpy(), pattern(c.pe, dtype=np.float32), "CuPy write read by torch")
        torch_view.mul_(2)
        torch.cuda.synchronize()
        expect_equal(cupy_view.get(), 2 * pattern(c.pe, dtype=np.float32), "torch write read by CuPy")
        # a bfloat16 array has no __cuda_array_interface__: DLPack carries it
        bf = nv.zeros(16, "bfloat16")
        try:
            expect(not hasattr(bf, "__cuda_array_interface__"), "bfloat16 exposes __cuda_array_interface__")
            t = torch.from_dlpack(bf)
            expect(t.dtype == torch.bfloat16 and t.data_ptr() == bf.ptr, f"{t.dtype} at {t.data_ptr():#x}")
            del t
        finally:
            bf.free()
        del cupy_view, cai_view, torch_view, torch_cai
    finally:
        arr.free()
        c.comm.Barrier()
    return "CuPy (DLPack, CAI) and torch (DLPack, CAI) share the pointer"


def check_put_get_ring(c: Ctx) -> None:
    src, dst = nv.empty(COUNT, "int32"), nv.empty(COUNT, "int32")
    local = cp.full(COUNT, SENTINEL, np.int32)
    try:
        view(src).set(pattern(c.pe))
        view(dst).set(np.full(COUNT, SENTINEL, np.int32))
        c.settle()
        nv.put(dst, src, c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        nv.barrier_all(stream=c.stream)
        c.stream.synchronize()
        expect_equal(view(dst).get(), pattern(c.left), f"put from pe {c.left}")
        c.settle()
        nv.get(local, src, c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        c.stream.synchronize()
        expect_equal(local.get(), pattern(c.right), f"get from pe {c.right}")
        c.settle()
        # a CuPy view of symmetric memory is symmetric too; half of it, into the second half
        half = COUNT // 2
        nv.put(view(dst)[half:], view(src)[:half], c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        nv.sync_all(stream=c.stream)
        c.stream.synchronize()
        expect_equal(view(dst).get()[half:], pattern(c.left)[:half], "put through CuPy views")
        expect_usage_error(lambda: nv.put(dst, local[:10], c.right), "elements")
        expect_usage_error(lambda: nv.put(local, src, c.right), "not NVSHMEM symmetric memory")
        expect_usage_error(lambda: nv.put(dst, src, c.npes), "PE number")
    finally:
        c.settle()
        dst.free()
        src.free()


def check_kept_description(c: Ctx) -> str:
    """The core describes a symmetric array on its first hot call and keeps the description; it is
    used only while the array's slots hold what it was made from, and the allocation is checked
    open at every call."""
    shape, n = (4, 8), 32
    src, dst = nv.empty(shape, "float32"), nv.zeros(shape, "float32")
    try:
        view(src).set(pattern(c.pe, n, np.float32).reshape(shape))
        c.settle()
        expect(getattr(dst, "_description", None) is None, "a description before the first call")
        for _ in range(3):  # described, then kept
            nv.put(dst, src, c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        nv.barrier_all(stream=c.stream)
        c.stream.synchronize()
        expect_equal(view(dst).get(), pattern(c.left, n, np.float32).reshape(shape), "put with kept descriptions")
        expect(type(dst._description).__name__ == "PyCapsule", "no description kept")
        # Nothing public changes these slots; were they changed, the kept description is not used.
        dst._shape = (16,)
        expect_usage_error(lambda: nv.put(dst, src, c.right), "dest has 16 elements, src 32")
        dst._dtype = "int32"
        dst._shape = shape
        expect_usage_error(lambda: nv.put(dst, src, c.right), "dtype int32")
        dst._dtype = "float32"
        parts = _core._testing.symmetric_parts_ns(dst, 20_000)
        c.settle()
    finally:
        c.settle()
        dst.free()
        src.free()
    expect_usage_error(lambda: nv.put(dst, cp.zeros(shape, np.float32), c.pe), "closed")
    c.comm.Barrier()
    return f"kept {parts['kept']:.0f} ns, whole description {parts['whole']:.0f} ns"


def reduce_input(op: str, dtype: str, pe: int) -> np.ndarray:
    dt = np.dtype(dtype)
    i = np.arange(COUNT)
    if op == "sum":
        return ((pe + 1) * 3 + i % 17 - 8).astype(dt)
    if op == "prod":
        return ((1 + (i + pe) % 3) * np.where((i + 2 * pe) % 5 == 0, -1, 1)).astype(dt)
    if op in ("min", "max"):
        return ((i * 7 + pe * 13) % 29 - 14).astype(dt)
    info = np.iinfo(dt)
    return np.random.default_rng(1000 * pe + len(op)).integers(info.min, info.max, COUNT, dtype=dt, endpoint=True)


def check_reduce(c: Ctx, op: str, dtype: str) -> None:
    if c.limited:
        src = nv.empty(COUNT, dtype)
        try:
            expect_usage_error(lambda: nv.reduce(op, src, src), "limited")
        finally:
            src.free()
        raise Skip(LIMITED_MPG_REASON + " (reduce() refused it with UsageError)")
    src, dst = nv.empty(COUNT, dtype), nv.zeros(COUNT, dtype)
    try:
        inputs = [reduce_input(op, dtype, p) for p in range(c.npes)]
        view(src).set(inputs[c.pe])
        c.settle()
        nv.reduce(op, dst, src, stream=c.stream)
        c.stream.synchronize()
        got = view(dst).get()
    finally:
        c.settle()
        dst.free()
        src.free()
    expect_equal(got, NUMPY_REDUCE[op].reduce(np.stack(inputs), axis=0).astype(dtype), f"{op} over {c.npes} PEs")


def check_collectives(c: Ctx) -> None:
    c.full_mode_only()
    n = c.npes
    block = 64
    src, out = nv.empty(block * n, "int32"), nv.zeros(block * n, "int32")
    one = nv.empty(block, "int32")
    try:
        root = n - 1
        view(one).set(pattern(c.pe, block))
        c.settle()
        nv.broadcast(_first(out, block), one, root, stream=c.stream)
        c.stream.synchronize()
        c.settle()
        if c.pe != root:
            expect_equal(view(out).get()[:block], pattern(root, block), "broadcast")
        nv.fcollect(out, one, stream=c.stream)
        c.stream.synchronize()
        expect_equal(view(out).get(), np.concatenate([pattern(p, block) for p in range(n)]), "fcollect")
        c.settle()
        view(src).set(np.concatenate([c.pe * 100_000 + j * 1000 + np.arange(block) for j in range(n)]
                                     ).astype(np.int32))
        c.settle()
        nv.alltoall(out, src, stream=c.stream)
        c.stream.synchronize()
        want = np.concatenate([i * 100_000 + c.pe * 1000 + np.arange(block) for i in range(n)]).astype(np.int32)
        expect_equal(view(out).get(), want, "alltoall")
        if n > 1:
            expect_usage_error(lambda: nv.fcollect(one, one), "elements")
    finally:
        c.settle()
        one.free()
        out.free()
        src.free()


def _first(arr: Any, count: int) -> Any:
    """The first `count` elements of a symmetric array, as a CuPy view (still symmetric memory)."""
    return view(arr)[:count]


def check_peer_views(c: Ctx) -> str:
    arr = nv.empty(COUNT, "int32")
    try:
        view(arr).set(pattern(c.pe))
        c.settle()
        seen = []
        for p in range(c.npes):
            peer = arr.peer(p)
            if peer is None:
                continue
            expect(peer.pe == p and peer.shape == arr.shape, f"{peer!r}")
            expect_equal(cp.from_dlpack(peer).get(), pattern(p), f"peer view of pe {p}")
            seen.append(p)
        expect(c.pe in seen, "no view of this PE's own copy")
        expect_usage_error(lambda: arr.peer(c.npes), "PE number")
        expect_usage_error(lambda: nv.put(arr.peer(c.pe), arr, c.pe), "peer view")
    finally:
        c.settle()
        arr.free()
    return f"addressable PEs {seen}"


def check_registration(c: Ctx) -> str:
    nbytes = 1 << 20
    ptr = cp.cuda.runtime.malloc(nbytes)
    try:
        try:
            r1 = nv.register((ptr, nbytes))
        except NVSHMEMError as exc:
            raise Skip(f"nvshmemx_buffer_register is not available here: {exc}") from None
        r2 = c.rt.register(ptr, nbytes)
        mine = [r for r in _core.registrations() if r["library"] == "nvshmem" and r["ptr"] == ptr]
        expect(len(mine) == 1 and mine[0]["references"] == 2, f"after two registrations: {mine}")
        r1.close()
        r1.close()
        mine = [r for r in _core.registrations() if r["library"] == "nvshmem" and r["ptr"] == ptr]
        expect(len(mine) == 1 and mine[0]["references"] == 1, f"after closing one: {mine}")
        r2.close()
        mine = [r for r in _core.registrations() if r["library"] == "nvshmem" and r["ptr"] == ptr]
        expect(mine == [], f"after closing both: {mine}")
        expect(c.rt.registrations() == [], f"{c.rt.registrations()}")
    finally:
        cp.cuda.runtime.free(ptr)
    return "one library registration, two references"


def check_use_after_free(c: Ctx) -> None:
    arr = nv.zeros(16, "int32")
    arr.free()
    arr.free()  # idempotent
    expect(arr.closed, "closed after free()")
    expect_usage_error(lambda: arr.ptr, "closed")
    expect_usage_error(lambda: nv.put(arr, cp.zeros(16, np.int32), c.pe), "closed")
    expect_usage_error(lambda: cp.from_dlpack(arr), "closed")
    c.comm.Barrier()


def check_dropped_drain(c: Ctx) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arr = nv.empty(512, "int8")
        ptr = arr.ptr
        del arr
        gc.collect()
    warned = [w for w in caught if issubclass(w.category, ResourceWarning)]
    expect(len(warned) == 1 and "queued" in str(warned[0].message), f"warnings {[str(w.message) for w in caught]}")
    expect(any(a["ptr"] == ptr for a in c.rt.allocations()), "the dropped array was freed by the GC")
    expect(("nvshmem.SymmetricMemory" in [k for k, _ in _core.queued()]), f"queued: {_core.queued()}")
    c.comm.Barrier()
    ran = c.rt.drain()
    expect(ran == 1, f"drain() ran {ran}")
    expect(all(a["ptr"] != ptr for a in c.rt.allocations()), "still allocated after drain()")
    return "ResourceWarning, queued, freed by drain()"


def queue_dropped_for_finalize(c: Ctx) -> list[Any]:
    """Drop three arrays unfreed (they wait for finalize); the queue order, by size, on every PE."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for n in (1024, 2048, 4096):
            nv.empty(n, "uint8")  # dropped at once
        gc.collect()
    sizes = {a["serial"]: a["nbytes"] for a in c.rt.allocations()}
    return [(kind, sizes.get(serial)) for kind, serial in _core.queued()]


def check_exit_with_live_objects(c: Ctx) -> str:
    if c.pe != 0:
        c.comm.Barrier()
        return "pe 0 runs it"
    code = (
        "import warnings; warnings.simplefilter('ignore', ResourceWarning)\n"
        "import cupy as cp\n"
        "from mpbind import nvshmem as nv\n"
        "from mpbind.bindings import nvshmem as flat\n"
        "rt = nv.init(flat.get_uniqueid(), 0, 1, device=0)\n"
        "a = nv.zeros(1024, 'float32'); cp.from_dlpack(a)[:] = 1\n"
        "nv.empty(64, 'int32')  # dropped: queued\n"
        "t = rt.team_world\n"
        "buf = cp.cuda.runtime.malloc(1 << 16)\n"
        "try:\n"
        "    r = nv.register((buf, 1 << 16))\n"
        "except Exception:  # availability is checked in registration.refcounts\n"
        "    r = None\n"
        "print('exiting', flush=True)\n"
    )
    # A separate single-PE job: none of mpirun's variables, so nothing talks to this job's MPI.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=env)
    finally:
        c.comm.Barrier()
    expect(proc.returncode == 0, f"exit status {proc.returncode}: {proc.stderr[-2000:]}")
    expect("exiting" in proc.stdout, f"stdout {proc.stdout[-500:]!r}")
    expect("Traceback" not in proc.stderr, proc.stderr[-2000:])
    return " ".join(proc.stderr.split())[-300:] or "no output on stderr"


# --- main ------------------------------------------------------------------------------------


def run(args: argparse.Namespace, comm: Any, report: Report) -> None:
    cp.cuda.Device(DEVICE).use()
    rt = nv.init(mpi_comm=comm, bootstrap=args.init, device=DEVICE)
    report.passed += 1
    report.line("PASS", f"init.{args.init}")
    # Every PE must skip the same checks, or the others would wait in a collective.
    limited = bool(comm.allreduce(bool(rt.limited_mpg), op=MPI.LOR))
    c = Ctx(comm=comm, rt=rt, pe=comm.Get_rank(), npes=comm.Get_size(),
            stream=cp.cuda.Stream(non_blocking=True), limited=limited)
    start = time.monotonic()
    r = report.check
    r("runtime", lambda: check_runtime(c, args.init))
    r("team.world", lambda: check_world_team(c))
    r("team.split_strided", lambda: check_split_strided(c))
    r("array.empty_zeros", lambda: check_empty_zeros(c))
    r("array.zero_copy_cupy_torch", lambda: check_zero_copy(c))
    r("rma.put_get_ring", lambda: check_put_get_ring(c))
    r("rma.kept_description", lambda: check_kept_description(c))
    for op, dtype in REDUCE_CASES:
        r(f"coll.reduce.{op}.{dtype}", lambda op=op, dtype=dtype: check_reduce(c, op, dtype))
    r("coll.broadcast_fcollect_alltoall", lambda: check_collectives(c))
    r("array.peer_views", lambda: check_peer_views(c))
    r("registration.refcounts", lambda: check_registration(c))
    r("array.use_after_free", lambda: check_use_after_free(c))
    r("teardown.dropped_warns_and_drains", lambda: check_dropped_drain(c))
    r("teardown.exit_with_live_objects", lambda: check_exit_with_live_objects(c))

    order: list[Any] = []

    def same_queue_everywhere() -> str:
        order.extend(queue_dropped_for_finalize(c))
        everyone = comm.allgather(order)
        expect(order == [("nvshmem.SymmetricMemory", n) for n in (4096, 2048, 1024)], f"queue {order}")
        expect(all(o == order for o in everyone), f"queues differ across PEs: {everyone}")
        return f"{len(order)} queued, newest first"

    r("teardown.queue_order", same_queue_everywhere)
    keep = nv.zeros(16, "int32")  # live at finalize: freed by it

    def finalize() -> None:
        c.settle()
        rt.finalize()
        expect(rt.finalized and nv.is_finalized() and not nv.is_initialized(), "finalized state")
        expect(_core.queued() == [], f"still queued after finalize: {_core.queued()}")
        expect(keep.closed, "a live array survived finalize")
        expect_usage_error(lambda: nv.empty(4), "finalized")
        expect_usage_error(lambda: nv.init(mpi_comm=comm, bootstrap=args.init, device=DEVICE), "finalized")

    r("finalize", finalize)
    report.info("elapsed", f"{time.monotonic() - start:.2f} s after init")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", choices=("uid", "mpi"), default="uid")
    add_timeout(ap, 150.0)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    report = Report(comm.Get_rank(), tracebacks="NVSHMEM_SUITE_TRACEBACKS", xfail_column=True)
    return watched(report, args.timeout, lambda: run(args, comm, report))


if __name__ == "__main__":
    sys.exit(main())
