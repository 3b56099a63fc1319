"""Multi-PE checks of NVSHMEM through the flat bindings (``--api flat``, ``mpbind.bindings.nvshmem``)
and through the Pythonic layer (``--api layer``, ``mpbind.nvshmem``), every received value compared
with NumPy.

    mpirun -np N python tests/gpu/nvshmem_suite.py [--api flat|layer] [--init uid|mpi] [--timeout S]
    mpirun -np N python tests/gpu/nvshmem_suite.py --api flat --reinit [--second-init]

All PEs share GPU 0. Symmetric memory is viewed through CuPy; work is enqueued on a non-blocking
CuPy stream. Each PE reports one line per check and a summary (tests/gpu/runner.py).

Several PEs on one GPU without CUDA MPS run in NVSHMEM's "limited MPG" mode
(``init_status() == InitStatus.LIMITED_MPG``), where libnvshmem_host *exits the process* from team
creation, team barriers, broadcast, fcollect, alltoall, reductions and
``signal_wait_until_on_stream``. Those checks are skipped in that mode, with the reason (the layer
refuses its reductions there with UsageError, which is checked); they run with one PE, under MPS, or
on several GPUs.

``--reinit`` (flat) initialises, finalises and reports ``init_status()`` afterwards (NVSHMEM allows
one initialisation per process); ``--second-init`` then also tries a second initialisation in the
same process and reports what happened without judging it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# Before anything loads CUDA, NCCL or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from array_checks import expect_equal  # noqa: E402
from mpi4py import MPI  # noqa: E402
from runner import (  # noqa: E402
    Check,
    Checks,
    KnownLimitation,
    Report,
    Skip,
    expect,
    expect_raises,
    main,
    nvshmem_status,
)

from mpbind import _core  # noqa: E402
from mpbind import nvshmem as nv  # noqa: E402
from mpbind._core import _testing as core_testing  # noqa: E402
from mpbind.bindings import nvshmem as flat  # noqa: E402
from mpbind.errors import NVSHMEMError, NVSHMEMNotInitializedError, UsageError  # noqa: E402

DEVICE = 0
BUF_BYTES = 64 * 1024  # each of the flat checks' shared source and destination buffers
COUNT = 1000  # elements per RMA / reduction check: small, and exact in every dtype
NBYTES = COUNT * 4  # an int32/float32 payload
SENTINEL = -7

# (operation, NumPy dtype) of the reductions; the flat bindings name the types as NVSHMEM does.
REDUCE_CASES: list[tuple[str, str]] = (
    [(op, t) for t in ("float32", "float64", "int32", "int64") for op in ("sum", "prod", "min", "max")]
    + [(op, t) for t in ("int32", "uint64") for op in ("and", "or", "xor")]
)
NVSHMEM_TYPE = {"float32": "float", "float64": "double"}  # the others are their NumPy names
NUMPY_REDUCE: dict[str, Any] = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}

LIMITED_MPG_REASON = ("not supported by NVSHMEM in limited MPG mode (several PEs on one GPU without "
                      "CUDA MPS): libnvshmem_host would exit the process")
HOST_AMO_REASON = ("libnvshmem_host does not implement host-initiated atomics: the call prints "
                   "'not implemented' and leaves the target unchanged")


# --- what both APIs' checks share -----------------------------------------------------------------------


def pattern(pe: int, count: int = COUNT, dtype: Any = np.int32) -> np.ndarray:
    """Values that say which PE wrote them, exact in every dtype used here."""
    return (pe * 1000 + np.arange(count)).astype(dtype)


def reduce_input(op: str, dtype: str, pe: int, count: int = COUNT) -> np.ndarray:
    """Per-PE inputs whose reduction is exact in `dtype`."""
    dt = np.dtype(dtype)
    i = np.arange(count)
    if op == "sum":
        return ((pe + 1) * 3 + i % 17 - 8).astype(dt)
    if op == "prod":  # factors in {-3..3} \ {0}: at most 3**4 in magnitude on 4 PEs
        magnitude = 1 + (i + pe) % 3
        sign = np.where((i + 2 * pe) % 5 == 0, -1, 1) if dt.kind != "u" else 1
        return (magnitude * sign).astype(dt)
    if op in ("min", "max"):
        return ((i * 7 + pe * 13) % 29 - 14).astype(dt)
    rng = np.random.default_rng(1000 * pe + len(op))
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)


def reduced(op: str, dtype: str, npes: int) -> np.ndarray:
    """What reducing every PE's `reduce_input` with `op` gives."""
    inputs = [reduce_input(op, dtype, p) for p in range(npes)]
    return NUMPY_REDUCE[op].reduce(np.stack(inputs), axis=0).astype(dtype)


@dataclass
class Ctx:
    comm: Any
    pe: int
    npes: int
    stream: Any
    limited: bool  # NVSHMEM's limited MPG mode on some PE: every PE skips the same checks
    init: str = "uid"
    second_init: bool = False  # --reinit: also try a second initialisation
    rt: Any = None  # the layer's runtime
    src: int = 0  # the flat checks' symmetric buffers: BUF_BYTES each
    dst: int = 0
    sig: int = 0  # 8 uint64 signal words
    counter: int = 0  # 8 uint64 words for atomics

    @property
    def s(self) -> int:
        return int(self.stream.ptr)

    @property
    def right(self) -> int:
        return (self.pe + 1) % self.npes

    @property
    def left(self) -> int:
        return (self.pe - 1) % self.npes

    def full_mode_only(self) -> None:
        if self.limited:
            raise Skip(LIMITED_MPG_REASON)

    @contextmanager
    def step(self, **initial: np.ndarray) -> Iterator[None]:
        """Lay out this PE's flat buffers (src=..., dst=..., sig=..., counter=...), make every PE's
        layout visible before any PE starts, and keep PEs in step when the check ends."""
        for name, values in initial.items():
            write(getattr(self, name), values)
        cp.cuda.runtime.deviceSynchronize()
        self.comm.Barrier()
        try:
            yield
        finally:
            self.stream.synchronize()
            cp.cuda.runtime.deviceSynchronize()
            self.comm.Barrier()

    def sync_stream(self) -> None:
        self.stream.synchronize()

    def settle(self) -> None:
        """Every PE's writes done and visible before the next step."""
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()
        self.comm.Barrier()


def agreed_limited(comm: Any, limited: bool) -> bool:
    """Whether any PE runs in limited MPG mode: every PE must skip the same checks, or the others
    would wait in a collective."""
    return bool(comm.allreduce(limited, op=MPI.LOR))


# --- the flat bindings: symmetric memory at raw addresses, viewed through CuPy --------------------------

FLAT = Checks()


def view(addr: int, count: int, dtype: Any) -> Any:
    """A CuPy array over `count` elements of device memory at `addr` (not owned)."""
    dt = np.dtype(dtype)
    mem = cp.cuda.UnownedMemory(addr, count * dt.itemsize, None, DEVICE)
    return cp.ndarray((count,), dt, cp.cuda.MemoryPointer(mem, 0))


def write(addr: int, values: np.ndarray) -> None:
    view(addr, values.size, values.dtype).set(values)


def read(addr: int, count: int, dtype: Any) -> np.ndarray:
    result: np.ndarray = view(addr, count, dtype).get()
    return result


def select_device() -> None:
    cp.cuda.Device(DEVICE).use()
    cp.cuda.runtime.free(0)  # create the primary context before NVSHMEM looks for it


def init_flat(method: str, comm: Any, report: Report) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    attr = flat.InitAttr()
    if method == "uid":
        uid = flat.get_uniqueid() if rank == 0 else None
        uid = comm.bcast(uid, root=0)  # a UniqueId pickles
        expect(isinstance(uid, flat.UniqueId), f"bcast returned {type(uid).__name__}")
        expect(flat.UniqueId(bytes(uid)) == uid, "UniqueId(bytes(uid)) != uid")
        flat.set_attr_uniqueid_args(rank, size, uid, attr)
        flat.init_attr(flat.InitFlags.WITH_UNIQUEID, attr)
    else:
        flat.set_attr_mpi_comm_args(comm, attr)
        flat.init_attr(flat.InitFlags.WITH_MPI_COMM, attr)
    report.passes(f"init.{method}")


@FLAT("identity")
def check_identity(c: Ctx) -> str:
    expect(flat.my_pe() == c.pe, f"my_pe() = {flat.my_pe()}, MPI rank {c.pe}")
    expect(flat.n_pes() == c.npes, f"n_pes() = {flat.n_pes()}, MPI size {c.npes}")
    world = flat.Team.WORLD
    expect(flat.team_my_pe(world) == c.pe, f"team_my_pe(WORLD) = {flat.team_my_pe(world)}")
    expect(flat.team_n_pes(world) == c.npes, f"team_n_pes(WORLD) = {flat.team_n_pes(world)}")
    return f"pe {c.pe} of {c.npes}"


@FLAT("versions")
def check_versions(c: Ctx) -> str:
    major, minor = flat.info_get_version()
    expect(major >= 1 and minor >= 0, f"info_get_version() = {(major, minor)}")
    vmajor, vminor, vpatch = flat.vendor_get_version_info()
    expect(vmajor >= 3 and vminor >= 0 and vpatch >= 0,
           f"vendor_get_version_info() = {(vmajor, vminor, vpatch)}")
    return f"OpenSHMEM {major}.{minor}, NVSHMEM {vmajor}.{vminor}.{vpatch}"


@FLAT("heap.malloc")
def check_malloc(c: Ctx) -> str:
    addr = flat.malloc(4096)
    try:
        expect(addr != 0, "malloc(4096) returned NULL")
        values = pattern(c.pe, 1024)
        write(addr, values)
        expect_equal(read(addr, 1024, np.int32), values, "read back")
    finally:
        flat.free(addr)
    return f"{addr:#x}"


@FLAT("heap.calloc_zeroed")
def check_calloc(c: Ctx) -> str:
    # Dirty a block first and free it: calloc then likely reuses it, so zeros mean something.
    dirty = flat.malloc(4096)
    write(dirty, np.full(1024, -1, np.int32))
    cp.cuda.runtime.deviceSynchronize()
    flat.free(dirty)
    addr = flat.calloc(1024, 4)
    try:
        expect(addr != 0, "calloc(1024, 4) returned NULL")
        expect_equal(read(addr, 1024, np.int32), np.zeros(1024, np.int32), "calloc contents")
    finally:
        flat.free(addr)
    return "reused the dirtied block" if addr == dirty else "fresh block"


@FLAT("heap.align")
def check_align(c: Ctx) -> str:
    notes = []
    for alignment, size in ((4096, 1000), (1 << 16, 100)):
        addr = flat.align(alignment, size)
        try:
            expect(addr != 0, f"align({alignment}, {size}) returned NULL")
            expect(addr % alignment == 0, f"align({alignment}, {size}) = {addr:#x}")
        finally:
            flat.free(addr)
        notes.append(f"{addr:#x}")
    return ", ".join(notes)


@FLAT("heap.malloc_zero")
def check_malloc_zero(c: Ctx) -> str:
    addr = flat.malloc(0)  # NULL is the answer for zero bytes, not an error
    expect(not addr, f"malloc(0) = {addr!r}")
    return "NULL"


@FLAT("heap.ptr_self")
def check_ptr_self(c: Ctx) -> str:
    local = flat.ptr(c.dst, c.pe)
    expect(local != 0, "ptr(addr, my_pe) is NULL")
    return "equals the symmetric address" if local == c.dst else f"{local:#x} for {c.dst:#x}"


@FLAT.info("heap.ptr_peers")
def record_ptr_peers(c: Ctx) -> str:
    peers = {p: flat.ptr(c.dst, p) for p in range(c.npes) if p != c.pe}
    text = ", ".join(f"pe {p}: {a:#x}" if a else f"pe {p}: NULL" for p, a in peers.items())
    return text or "no peers"


# RMA around a ring: each PE writes into its right neighbour / reads from it.


@FLAT("rma.putmem")
def check_putmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        flat.putmem(c.dst, c.src, NBYTES, c.right)
        flat.quiet()
        flat.barrier_all()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


@FLAT("rma.getmem")
def check_getmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        flat.getmem(c.dst, c.src, NBYTES, c.right)
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.right), f"data from pe {c.right}")


@FLAT.each(("rma.float_put", "typed"), ("rma.put_family_name", "family_name"),
           ("rma.put_family_numpy", "family_numpy"))
def check_put_variants(c: Ctx, how: str) -> None:
    with c.step(src=pattern(c.pe, dtype=np.float32), dst=np.full(COUNT, SENTINEL, np.float32)):
        if how == "typed":
            flat.float_put(c.dst, c.src, COUNT, c.right)
        elif how == "family_name":
            flat.put("float", c.dst, c.src, COUNT, c.right)
        else:
            flat.put(np.float32, c.dst, c.src, COUNT, c.right)
        flat.quiet()
        flat.barrier_all()
        got = read(c.dst, COUNT, np.float32)
    expect_equal(got, pattern(c.left, dtype=np.float32), f"data from pe {c.left}")


@FLAT.each(("rma.double_get", "typed"), ("rma.get_family_numpy", "family"))
def check_get_variants(c: Ctx, how: str) -> None:
    with c.step(src=pattern(c.pe, dtype=np.float64), dst=np.full(COUNT, SENTINEL, np.float64)):
        if how == "typed":
            flat.double_get(c.dst, c.src, COUNT, c.right)
        else:
            flat.get(np.dtype(np.float64), c.dst, c.src, COUNT, c.right)
        got = read(c.dst, COUNT, np.float64)
    expect_equal(got, pattern(c.right, dtype=np.float64), f"data from pe {c.right}")


@FLAT("rma.p_g")
def check_p_g(c: Ctx) -> None:
    with c.step(dst=np.full(8, SENTINEL, np.int64)):
        flat.int_p(c.dst, 1000 + c.pe, c.right)  # word 0: int
        flat.p("double", c.dst + 8, 0.5 + c.pe, c.right)  # word 1: double
        flat.p(np.int64, c.dst + 16, -(2**40) - c.pe, c.right)  # word 2: int64
        flat.quiet()
        flat.barrier_all()
        mine = flat.int_g(c.dst, c.pe)
        theirs = flat.int_g(c.dst, c.right)
        as_double = flat.g("double", c.dst + 8, c.pe)
        as_int64 = flat.g(np.int64, c.dst + 16, c.right)
    expect(mine == 1000 + c.left, f"int_g(self) = {mine}, expected {1000 + c.left}")
    expect(theirs == 1000 + c.pe, f"int_g(right) = {theirs}, expected {1000 + c.pe}")
    expect(as_double == 0.5 + c.left, f"g('double', self) = {as_double!r}, expected {0.5 + c.left}")
    expect(as_int64 == -(2**40) - c.pe, f"g(int64, right) = {as_int64!r}, expected {-(2**40) - c.pe}")


@FLAT("rma.nbi_quiet")
def check_nbi(c: Ctx) -> None:
    half = COUNT // 2
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        # First half: put into the right neighbour. Second half: get from it.
        flat.putmem_nbi(c.dst, c.src, half * 4, c.right)
        flat.getmem_nbi(c.dst + half * 4, c.src + half * 4, (COUNT - half) * 4, c.right)
        flat.quiet()
        flat.barrier_all()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got[:half], pattern(c.left)[:half], f"put half from pe {c.left}")
    expect_equal(got[half:], pattern(c.right)[half:], f"get half from pe {c.right}")


@FLAT("rma.fence_sync_all")
def check_fence(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        flat.putmem(c.dst, c.src, NBYTES // 2, c.right)
        flat.fence()
        flat.putmem(c.dst + NBYTES // 2, c.src + NBYTES // 2, NBYTES // 2, c.right)
        flat.quiet()
        flat.sync_all()
        flat.barrier_all()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


# On-stream RMA.


@FLAT("stream.putmem")
def check_stream_putmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        flat.putmem_on_stream(c.dst, c.src, NBYTES, c.right, c.s)
        flat.quiet_on_stream(c.s)
        flat.barrier_all_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


@FLAT("stream.getmem")
def check_stream_getmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        flat.getmem_on_stream(c.dst, c.src, NBYTES, c.right, c.s)
        flat.quiet_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.right), f"data from pe {c.right}")


@FLAT.each(("stream.float_put", "typed"), ("stream.put_family", "family"))
def check_stream_put_variants(c: Ctx, how: str) -> None:
    with c.step(src=pattern(c.pe, dtype=np.float32), dst=np.full(COUNT, SENTINEL, np.float32)):
        if how == "typed":
            flat.float_put_on_stream(c.dst, c.src, COUNT, c.right, c.s)
        else:
            flat.put_on_stream("float", c.dst, c.src, COUNT, c.right, c.s)
        flat.quiet_on_stream(c.s)
        flat.sync_all_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.float32)
    expect_equal(got, pattern(c.left, dtype=np.float32), f"data from pe {c.left}")


@FLAT("stream.putmem_nbi")
def check_stream_nbi(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        flat.putmem_nbi_on_stream(c.dst, c.src, NBYTES, c.right, c.s)
        flat.quiet_on_stream(c.s)
        flat.barrier_all_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


# Signals.


@FLAT("signal.put_signal_wait_until")
def check_put_signal_wait(c: Ctx) -> None:
    c.full_mode_only()
    zeros = np.zeros(8, np.uint64)
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32), sig=zeros):
        flat.putmem_signal_on_stream(c.dst, c.src, NBYTES, c.sig, 1, flat.SignalOp.SET, c.right, c.s)
        flat.signal_wait_until_on_stream(c.sig, flat.CmpType.EQ, 1, c.s)
        c.sync_stream()  # the signal arrived, so the data before it did too
        got = read(c.dst, COUNT, np.int32)
        fetched = flat.signal_fetch(c.sig)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")
    expect(fetched == 1, f"signal_fetch = {fetched}, expected 1")


@FLAT("signal.put_signal_set_add")
def check_put_signal(c: Ctx) -> str:
    zeros = np.zeros(8, np.uint64)
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32), sig=zeros):
        flat.putmem_signal_on_stream(c.dst, c.src, NBYTES, c.sig, 7, flat.SignalOp.SET, c.right, c.s)
        flat.quiet_on_stream(c.s)
        c.sync_stream()
        flat.barrier_all()
        got = read(c.dst, COUNT, np.int32)
        after_set = flat.signal_fetch(c.sig)
        c.comm.Barrier()  # everyone has read the SET value before anyone adds
        flat.signal_op_on_stream(c.sig, 5, flat.SignalOp.ADD, c.right, c.s)
        flat.quiet_on_stream(c.s)
        c.sync_stream()
        flat.barrier_all()
        after_add = flat.signal_fetch(c.sig)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")
    expect(after_set == 7, f"signal_fetch after SIGNAL_SET 7 = {after_set}")
    expect(after_add == 12, f"signal_fetch after SIGNAL_ADD 5 = {after_add}, expected 12")
    return "completion by quiet_on_stream + barrier_all (no wait_until)"


# Atomics: every PE adds onto PE 0's counters.


@FLAT.each(("amo.int_atomic_fetch_add", "int_fetch_add"), ("amo.atomic_fetch_add_family", "family_fetch_add"),
           ("amo.uint64_atomic_add", "add"))
def check_atomic(c: Ctx, how: str) -> str:
    zeros = np.zeros(8, np.uint64)
    with c.step(counter=zeros):
        if how == "int_fetch_add":
            old = flat.int_atomic_fetch_add(c.counter, 1, 0)
            inc = 1
        elif how == "family_fetch_add":
            old = flat.atomic_fetch_add("int64", c.counter, 1, 0)
            inc = 1
        else:
            flat.uint64_atomic_add(c.counter, c.pe + 1, 0)
            old, inc = None, c.pe + 1
        flat.barrier_all()
        word = read(c.counter, 1, np.int32 if how == "int_fetch_add" else np.uint64)[0]
    total = c.comm.bcast(int(word) if c.pe == 0 else None, root=0)
    olds = c.comm.allgather(old)
    expected = c.comm.allreduce(inc)
    if total == 0 and all(not o for o in olds):
        raise KnownLimitation(HOST_AMO_REASON)
    expect(total == expected, f"pe 0's counter = {total}, expected {expected}")
    if how != "add":
        expect(sorted(int(o) for o in olds) == list(range(c.npes)),
               f"fetched values {olds}, expected a permutation of 0..{c.npes - 1}")
    return f"counter {total}"


# Collectives on a stream, on TEAM_WORLD.


@FLAT("coll.team_barriers")
def check_team_barriers(c: Ctx) -> None:
    c.full_mode_only()
    world = flat.Team.WORLD
    with c.step():
        flat.barrier(world)
        flat.barrier_on_stream(world, c.s)
        flat.team_sync_on_stream(world, c.s)
        c.sync_stream()


def check_broadcast(c: Ctx, root: int) -> str:
    c.full_mode_only()
    src = pattern(root) if c.pe == root else np.full(COUNT, -1, np.int32)
    with c.step(src=src, dst=np.full(COUNT, SENTINEL, np.int32)):
        flat.broadcastmem_on_stream(flat.Team.WORLD, c.dst, c.src, NBYTES, root, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    if c.pe != root:
        expect_equal(got, pattern(root), f"broadcast from pe {root}")
        return ""
    if np.array_equal(got, pattern(root)):
        return "the root's dest was written too"
    expect_equal(got, np.full(COUNT, SENTINEL, np.int32), "the root's dest")
    return "the root's dest was left as it was"


@FLAT.cases
def broadcasts(c: Ctx) -> Iterator[Check]:
    """From PE 0, and from the last PE where there are several."""
    for root in (0, c.npes - 1) if c.npes > 1 else (0,):
        yield f"coll.broadcast.root{root}", functools.partial(check_broadcast, c, root)


@FLAT("coll.fcollect")
def check_fcollect(c: Ctx) -> None:
    c.full_mode_only()
    with c.step(src=pattern(c.pe), dst=np.full(COUNT * c.npes, SENTINEL, np.int32)):
        flat.fcollectmem_on_stream(flat.Team.WORLD, c.dst, c.src, NBYTES, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT * c.npes, np.int32)
    expect_equal(got, np.concatenate([pattern(p) for p in range(c.npes)]), "gathered blocks")


@FLAT("coll.alltoall")
def check_alltoall(c: Ctx) -> None:
    c.full_mode_only()
    block = 256

    def blocks_of(sender: int) -> np.ndarray:  # block j goes from `sender` to pe j
        return np.concatenate([sender * 100_000 + j * 1000 + np.arange(block) for j in range(c.npes)]
                              ).astype(np.int32)

    with c.step(src=blocks_of(c.pe), dst=np.full(block * c.npes, SENTINEL, np.int32)):
        flat.alltoallmem_on_stream(flat.Team.WORLD, c.dst, c.src, block * 4, c.s)
        c.sync_stream()
        got = read(c.dst, block * c.npes, np.int32)
    want = np.concatenate([blocks_of(i)[c.pe * block:(c.pe + 1) * block] for i in range(c.npes)])
    expect_equal(got, want, "exchanged blocks")


@FLAT.each(*[(f"coll.reduce.{op}.{NVSHMEM_TYPE.get(dtype, dtype)}.{how}", op, dtype, how)
             for op, dtype in REDUCE_CASES for how in ("typed", "family")])
def check_reduce(c: Ctx, op: str, dtype: str, how: str) -> None:
    c.full_mode_only()
    dt = np.dtype(dtype)
    want = reduced(op, dtype, c.npes)
    world = flat.Team.WORLD
    with c.step(src=reduce_input(op, dtype, c.pe), dst=np.zeros(COUNT, dt)):
        if how == "typed":
            typed = getattr(flat, f"{NVSHMEM_TYPE.get(dtype, dtype)}_{op}_reduce_on_stream")
            typed(world, c.dst, c.src, COUNT, c.s)
        else:  # the family, given a NumPy dtype
            getattr(flat, f"{op}_reduce_on_stream")(dt, world, c.dst, c.src, COUNT, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, dt)
    expect_equal(got, want, f"{op} over {c.npes} PEs")


# Teams.


@FLAT.info("team.predefined")
def record_predefined_teams(c: Ctx) -> str:
    parts = []
    for team in (flat.Team.WORLD, flat.Team.SHARED, flat.Team.NODE):
        parts.append(f"{team.name}: {flat.team_my_pe(team)}/{flat.team_n_pes(team)}")
    return ", ".join(parts)


@FLAT("team.split_strided")
def check_split_strided(c: Ctx) -> str:
    c.full_mode_only()
    world = flat.Team.WORLD
    size = (c.npes + 1) // 2  # the even PEs
    member = c.pe % 2 == 0
    with c.step():
        team = flat.team_split_strided(world, 0, 2, size, None, 0)
    if not member:
        translated = flat.team_translate_pe(world, c.pe, team)
        c.comm.Barrier()  # the members' reduction and destroy
        expect(team == flat.Team.INVALID, f"odd pe got team {team}, expected Team.INVALID")
        expect(translated == -1, f"team_translate_pe into Team.INVALID = {translated}, expected -1")
        return "not a member"
    if team == flat.Team.INVALID:
        c.comm.Barrier()  # where the others wait for the members
        raise AssertionError("an even pe got Team.INVALID")
    try:
        # A reduction on the sub-team only (its members call it; the others wait below). Every
        # member makes every collective call before any assertion, so none is left waiting.
        inputs = {p: reduce_input("sum", "int32", p) for p in range(0, c.npes, 2)}
        write(c.src, inputs[c.pe])
        write(c.dst, np.zeros(COUNT, np.int32))
        cp.cuda.runtime.deviceSynchronize()
        flat.barrier_on_stream(team, c.s)
        flat.int32_sum_reduce_on_stream(team, c.dst, c.src, COUNT, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
        my_pe, n_pes = flat.team_my_pe(team), flat.team_n_pes(team)
        back = [flat.team_translate_pe(team, i, world) for i in range(size)]
        forward = flat.team_translate_pe(world, c.pe, team)
    finally:
        flat.team_destroy(team)
        c.comm.Barrier()
    expect(my_pe == c.pe // 2, f"team_my_pe = {my_pe}, expected {c.pe // 2}")
    expect(n_pes == size, f"team_n_pes = {n_pes}, expected {size}")
    expect(back == list(range(0, c.npes, 2)), f"team_translate_pe(team, i, WORLD) = {back}")
    expect(forward == c.pe // 2, f"team_translate_pe(WORLD, {c.pe}, team) = {forward}")
    expect_equal(got, np.add.reduce(np.stack(list(inputs.values())), axis=0).astype(np.int32),
                 "sum over the even PEs")
    return f"team {int(team)}: {size} PEs"


@FLAT("team.split_2d")
def check_split_2d(c: Ctx) -> str:
    c.full_mode_only()
    world = flat.Team.WORLD
    xrange = 2 if c.npes > 1 else 1
    row, col = divmod(c.pe, xrange)
    with c.step():
        xteam, yteam = flat.team_split_2d(world, xrange, None, 0, None, 0)
    try:
        got = {"x": (flat.team_my_pe(xteam), flat.team_n_pes(xteam)),
               "y": (flat.team_my_pe(yteam), flat.team_n_pes(yteam)),
               "x0": flat.team_translate_pe(xteam, 0, world), "y0": flat.team_translate_pe(yteam, 0, world)}
    finally:
        for team in (yteam, xteam):
            if team != flat.Team.INVALID:
                flat.team_destroy(team)
        c.comm.Barrier()
    want = {"x": (col, min(xrange, c.npes - row * xrange)), "y": (row, len(range(col, c.npes, xrange))),
            "x0": row * xrange, "y0": col}
    expect(got == want, f"(my_pe, n_pes) and first members {got}, expected {want}")
    return f"row {row} of x-team {int(xteam)}, column {col} of y-team {int(yteam)}"

# --- the Pythonic layer: SymmetricArray objects ---------------------------------------------------------

LAYER = Checks()


def as_cupy(arr: Any) -> Any:
    """A CuPy view through DLPack (no copy)."""
    return cp.from_dlpack(arr)


def expect_usage_error(fn: Callable[[], object], match: str) -> None:
    expect_raises(UsageError, fn, "the call", match)


@LAYER("runtime")
def check_runtime(c: Ctx) -> str:
    expect(c.rt.my_pe == c.pe and nv.my_pe() == c.pe, f"my_pe {c.rt.my_pe}, MPI rank {c.pe}")
    expect(c.rt.n_pes == c.npes and nv.n_pes() == c.npes, f"n_pes {c.rt.n_pes}, MPI size {c.npes}")
    again = nv.init(mpi_comm=c.comm, bootstrap=c.init, device=DEVICE)
    expect(again.serial == c.rt.serial and nv.runtime().serial == c.rt.serial, "init() again: another runtime")
    expect_usage_error(lambda: nv.init(mpi_comm=c.comm, bootstrap=c.init, device=DEVICE + 5), "device=5")
    expect(nv.is_initialized() and not nv.is_finalized(), "is_initialized/is_finalized")
    return f"init_status {c.rt.init_status}, limited_mpg={c.rt.limited_mpg}"


@LAYER("team.world")
def check_world_team(c: Ctx) -> None:
    world = c.rt.team_world
    expect(world.predefined and world.handle == 0, f"{world!r}")
    expect(world.my_pe == c.pe and world.n_pes == c.npes, f"world team {world.my_pe}/{world.n_pes}")
    expect(world.translate_pe(c.pe, c.rt.team_world) == c.pe, "translate_pe within world")
    world.close()
    expect(world.closed, "closing a predefined team")
    expect(c.rt.team_world.n_pes == c.npes, "the world team after closing one handle")


@LAYER("team.split_strided")
def layer_split_strided(c: Ctx) -> str:
    c.full_mode_only()
    world = c.rt.team_world
    size = (c.npes + 1) // 2
    # nvshmem_malloc is collective over all PEs: allocate before, free after, on every PE.
    src, dst = nv.empty(COUNT, "int32"), nv.zeros(COUNT, "int32")
    as_cupy(src).set(pattern(c.pe))
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
            got = as_cupy(dst).get()
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


@LAYER("array.empty_zeros")
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


@LAYER("array.zero_copy_cupy_torch")
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


@LAYER("rma.put_get_ring")
def check_put_get_ring(c: Ctx) -> None:
    src, dst = nv.empty(COUNT, "int32"), nv.empty(COUNT, "int32")
    local = cp.full(COUNT, SENTINEL, np.int32)
    try:
        as_cupy(src).set(pattern(c.pe))
        as_cupy(dst).set(np.full(COUNT, SENTINEL, np.int32))
        c.settle()
        nv.put(dst, src, c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        nv.barrier_all(stream=c.stream)
        c.stream.synchronize()
        expect_equal(as_cupy(dst).get(), pattern(c.left), f"put from pe {c.left}")
        c.settle()
        nv.get(local, src, c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        c.stream.synchronize()
        expect_equal(local.get(), pattern(c.right), f"get from pe {c.right}")
        c.settle()
        # a CuPy view of symmetric memory is symmetric too; half of it, into the second half
        half = COUNT // 2
        nv.put(as_cupy(dst)[half:], as_cupy(src)[:half], c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        nv.sync_all(stream=c.stream)
        c.stream.synchronize()
        expect_equal(as_cupy(dst).get()[half:], pattern(c.left)[:half], "put through CuPy views")
        expect_usage_error(lambda: nv.put(dst, local[:10], c.right), "elements")
        expect_usage_error(lambda: nv.put(local, src, c.right), "not NVSHMEM symmetric memory")
        expect_usage_error(lambda: nv.put(dst, src, c.npes), "PE number")
    finally:
        c.settle()
        dst.free()
        src.free()


@LAYER("rma.kept_description")
def check_kept_description(c: Ctx) -> str:
    """A symmetric array is the core's own type: it holds its description (made and checked once, when the
    array was made), which a hot call copies, checking the allocation open; nothing of it can be rewritten
    from Python, and a look-alike of another module is not taken for one."""
    shape, n = (4, 8), 32
    src, dst = nv.empty(shape, "float32"), nv.zeros(shape, "float32")
    try:
        as_cupy(src).set(pattern(c.pe, n, np.float32).reshape(shape))
        c.settle()
        expect(type(dst) is nv.SymmetricArray and type(dst).__module__ == "mpbind._core.nvshmem", "not the core's type")
        for _ in range(3):
            nv.put(dst, src, c.right, stream=c.stream)
        nv.quiet(stream=c.stream)
        nv.barrier_all(stream=c.stream)
        c.stream.synchronize()
        expect_equal(as_cupy(dst).get(), pattern(c.left, n, np.float32).reshape(shape), "put with kept descriptions")
        for name in ("shape", "_shape", "_description", "_core"):
            try:
                setattr(dst, name, (16,))
            except AttributeError:
                continue
            raise AssertionError(f"SymmetricArray.{name} could be set")
        fake = type("SymmetricArray", (), {"__module__": "mpbind.nvshmem", "ptr": dst.ptr, "shape": shape})()
        try:
            nv.put(fake, src, c.right)
        except TypeError:
            pass
        else:
            raise AssertionError("a look-alike of SymmetricArray was taken for one")
        parts = core_testing.symmetric_parts_ns(dst, 20_000)
        c.settle()
    finally:
        c.settle()
        dst.free()
        src.free()
    expect_usage_error(lambda: nv.put(dst, cp.zeros(shape, np.float32), c.pe), "closed")
    c.comm.Barrier()
    return f"kept {parts['kept']:.0f} ns, whole description {parts['whole']:.0f} ns"


@LAYER.each(*[(f"coll.reduce.{op}.{dtype}", op, dtype) for op, dtype in REDUCE_CASES])
def layer_reduce(c: Ctx, op: str, dtype: str) -> None:
    if c.limited:
        src = nv.empty(COUNT, dtype)
        try:
            expect_usage_error(lambda: nv.reduce(op, src, src), "limited")
        finally:
            src.free()
        raise Skip(LIMITED_MPG_REASON + " (reduce() refused it with UsageError)")
    src, dst = nv.empty(COUNT, dtype), nv.zeros(COUNT, dtype)
    try:
        as_cupy(src).set(reduce_input(op, dtype, c.pe))
        c.settle()
        nv.reduce(op, dst, src, stream=c.stream)
        c.stream.synchronize()
        got = as_cupy(dst).get()
    finally:
        c.settle()
        dst.free()
        src.free()
    expect_equal(got, reduced(op, dtype, c.npes), f"{op} over {c.npes} PEs")


@LAYER("coll.broadcast_fcollect_alltoall")
def check_collectives(c: Ctx) -> None:
    c.full_mode_only()
    n = c.npes
    block = 64
    src, out = nv.empty(block * n, "int32"), nv.zeros(block * n, "int32")
    one = nv.empty(block, "int32")
    try:
        root = n - 1
        as_cupy(one).set(pattern(c.pe, block))
        c.settle()
        nv.broadcast(first(out, block), one, root, stream=c.stream)
        c.stream.synchronize()
        c.settle()
        if c.pe != root:
            expect_equal(as_cupy(out).get()[:block], pattern(root, block), "broadcast")
        nv.fcollect(out, one, stream=c.stream)
        c.stream.synchronize()
        expect_equal(as_cupy(out).get(), np.concatenate([pattern(p, block) for p in range(n)]), "fcollect")
        c.settle()
        as_cupy(src).set(np.concatenate([c.pe * 100_000 + j * 1000 + np.arange(block) for j in range(n)]
                                     ).astype(np.int32))
        c.settle()
        nv.alltoall(out, src, stream=c.stream)
        c.stream.synchronize()
        want = np.concatenate([i * 100_000 + c.pe * 1000 + np.arange(block) for i in range(n)]).astype(np.int32)
        expect_equal(as_cupy(out).get(), want, "alltoall")
        if n > 1:
            expect_usage_error(lambda: nv.fcollect(one, one), "elements")
    finally:
        c.settle()
        one.free()
        out.free()
        src.free()


def first(arr: Any, count: int) -> Any:
    """The first `count` elements of a symmetric array, as a CuPy view (still symmetric memory)."""
    return as_cupy(arr)[:count]


@LAYER("array.peer_views")
def check_peer_views(c: Ctx) -> str:
    arr = nv.empty(COUNT, "int32")
    try:
        as_cupy(arr).set(pattern(c.pe))
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


@LAYER("registration.refcounts")
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


@LAYER("array.use_after_free")
def check_use_after_free(c: Ctx) -> None:
    arr = nv.zeros(16, "int32")
    arr.free()
    arr.free()  # idempotent
    expect(arr.closed, "closed after free()")
    expect_usage_error(lambda: arr.ptr, "closed")
    expect_usage_error(lambda: nv.put(arr, cp.zeros(16, np.int32), c.pe), "closed")
    expect_usage_error(lambda: cp.from_dlpack(arr), "closed")
    c.comm.Barrier()


@LAYER("teardown.dropped_warns_and_drains")
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


@LAYER("teardown.exit_with_live_objects")
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


def queue_dropped_for_finalize(c: Ctx) -> list[Any]:
    """Drop three arrays unfreed (they wait for finalize); the queue order, by size, on every PE."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for n in (1024, 2048, 4096):
            nv.empty(n, "uint8")  # dropped at once
        gc.collect()
    sizes = {a["serial"]: a["nbytes"] for a in c.rt.allocations()}
    return [(kind, sizes.get(serial)) for kind, serial in _core.queued()]


@LAYER.cases
def teardown(c: Ctx) -> Iterator[Check]:
    """Arrays dropped for finalize queue alike on every PE; finalize frees them and a live array."""
    order: list[Any] = []

    def same_queue_everywhere() -> str:
        order.extend(queue_dropped_for_finalize(c))
        everyone = c.comm.allgather(order)
        expect(order == [("nvshmem.SymmetricMemory", n) for n in (4096, 2048, 1024)], f"queue {order}")
        expect(all(o == order for o in everyone), f"queues differ across PEs: {everyone}")
        return f"{len(order)} queued, newest first"

    yield "teardown.queue_order", same_queue_everywhere
    keep = nv.zeros(16, "int32")  # live at finalize: freed by it

    def finalize() -> None:
        c.settle()
        c.rt.finalize()
        expect(c.rt.finalized and nv.is_finalized() and not nv.is_initialized(), "finalized state")
        expect(_core.queued() == [], f"still queued after finalize: {_core.queued()}")
        expect(keep.closed, "a live array survived finalize")
        expect_usage_error(lambda: nv.empty(4), "finalized")
        expect_usage_error(lambda: nv.init(mpi_comm=c.comm, bootstrap=c.init, device=DEVICE), "finalized")

    yield "finalize", finalize


# --- the flat bindings' initialisation, once and again ------------------------------------------------

REINIT = Checks()


@REINIT("reinit.first_init_usable")
def first_use(c: Ctx) -> str:
    status = int(flat.init_status())
    expect(status in (flat.InitStatus.IS_INITIALIZED, flat.InitStatus.LIMITED_MPG,
                      flat.InitStatus.FULL_MPG), f"init_status() = {nvshmem_status(status)}")
    expect(flat.my_pe() == c.pe, "my_pe() != MPI rank")
    addr = flat.malloc(4096)
    flat.barrier_all()
    flat.free(addr)
    return nvshmem_status(status)


@REINIT("reinit.finalize")
def finalize_once(c: Ctx) -> None:
    flat.finalize()


@REINIT.info("reinit.init_status_after_finalize")
def status_after_finalize(c: Ctx) -> str:
    return nvshmem_status(int(flat.init_status()))


@REINIT("reinit.refused_after_finalize")
def refused_after_finalize(c: Ctx) -> None:
    # The flat bindings' init check reads the library's status on every call: a finalised
    # runtime is refused (the library would end the process).
    try:
        flat.quiet()
    except NVSHMEMNotInitializedError:
        return
    raise AssertionError("nvshmem.quiet() after finalize did not raise NVSHMEMNotInitializedError")


@REINIT.info("reinit.second_init")
def second_init(c: Ctx) -> str:
    """What a second initialisation in the process does, reported without judging it."""
    if not c.second_init:
        return "not attempted (NVSHMEM documents one initialisation per process; pass --second-init to try)"
    c.comm.Barrier()
    try:
        attr = flat.InitAttr()
        if c.init == "uid":
            uid = c.comm.bcast(flat.get_uniqueid() if c.pe == 0 else None, root=0)
            flat.set_attr_uniqueid_args(c.pe, c.npes, uid, attr)
            flat.init_attr(flat.InitFlags.WITH_UNIQUEID, attr)
        else:
            flat.set_attr_mpi_comm_args(c.comm, attr)
            flat.init_attr(flat.InitFlags.WITH_MPI_COMM, attr)
        status = nvshmem_status(int(flat.init_status()))
        addr = flat.malloc(4096)
        flat.barrier_all()
        flat.free(addr)
        flat.finalize()
        return f"worked (init_status was {status}); finalized again"
    except NVSHMEMError as exc:
        return f"raised {type(exc).__name__}: {exc}"


# --- the run ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    """NVSHMEM initialised for the chosen API; after the checks, the flat run frees its buffers and
    finalises (the layer's checks end with finalize themselves)."""
    comm = MPI.COMM_WORLD
    pe, npes = comm.Get_rank(), comm.Get_size()
    if args.api == "layer":
        cp.cuda.Device(DEVICE).use()
        rt = nv.init(mpi_comm=comm, bootstrap=args.init, device=DEVICE)
        report.passes(f"init.{args.init}")
        yield Ctx(comm, pe, npes, cp.cuda.Stream(non_blocking=True), agreed_limited(comm, bool(rt.limited_mpg)),
                  init=args.init, rt=rt)
        return
    select_device()
    init_flat(args.init, comm, report)
    if args.reinit:
        yield Ctx(comm, pe, npes, None, False, init=args.init, second_init=args.second_init)
        return
    status = int(flat.init_status())
    report.info("init_status", nvshmem_status(status))
    stream = cp.cuda.Stream(non_blocking=True)
    c = Ctx(comm, pe, npes, stream, agreed_limited(comm, status == flat.InitStatus.LIMITED_MPG), init=args.init)
    c.src, c.dst = flat.malloc(BUF_BYTES), flat.malloc(BUF_BYTES)
    c.sig, c.counter = flat.calloc(8, 8), flat.calloc(8, 8)
    try:
        yield c
    finally:
        stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()
        comm.Barrier()

        def free_all() -> None:
            for addr in (c.counter, c.sig, c.dst, c.src):
                flat.free(addr)

        report.check("heap.free", free_all)
        report.check("finalize", flat.finalize)
        report.info("init_status_after_finalize", nvshmem_status(int(flat.init_status())))


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--api", choices=("flat", "layer"), default="flat",
                    help="the flat bindings (mpbind.bindings.nvshmem) or the layer (mpbind.nvshmem)")
    ap.add_argument("--init", choices=("uid", "mpi"), default="uid")
    ap.add_argument("--reinit", action="store_true", help="flat: initialise, finalise, report init_status")
    ap.add_argument("--second-init", action="store_true", help="with --reinit: also try a second init")


def chosen(args: argparse.Namespace) -> Checks:
    return LAYER if args.api == "layer" else REINIT if args.reinit else FLAT


if __name__ == "__main__":
    sys.exit(main(__doc__, started, chosen, arguments=arguments,
                  timeout=lambda args: 150.0 if args.api == "layer" else 90.0))
