"""Multi-PE checks of the flat NVSHMEM bindings, every received value compared with NumPy.

    mpirun -np N python tests/gpu/nvshmem_mpi_suite.py [--init uid|mpi] [--timeout S]
    mpirun -np N python tests/gpu/nvshmem_mpi_suite.py --reinit [--second-init]

All PEs share GPU 0. Symmetric memory is viewed through CuPy; work is enqueued on a
non-blocking CuPy stream. Each PE prints one line per check

    PASS name [pe k]            the check held (a note may follow a colon)
    FAIL name [pe k]: reason    it did not
    SKIP name [pe k]: reason    it could not run here (the reason says why)
    XFAIL name [pe k]: reason   a documented limitation of the library, seen as documented
    INFO name [pe k]: text      a recorded fact, not a check

and closes with ``pe=<k> passed=<p> failed=<f> skipped=<s> xfailed=<x>``; the exit status is
1 when anything failed.

Several PEs on one GPU without CUDA MPS run in NVSHMEM's "limited MPG" mode
(``init_status() == InitStatus.LIMITED_MPG``), where libnvshmem_host *exits the process*
from team creation, team barriers, broadcast, fcollect, alltoall, reductions and
``signal_wait_until_on_stream``. Those checks are skipped in that mode, with the reason; they
run with one PE, under MPS, or on several GPUs.

``--reinit`` initialises, finalises and reports ``init_status()`` afterwards (NVSHMEM allows one
initialisation per process); ``--second-init`` then also tries a second initialisation in the
same process and reports what happened without judging it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
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
from suite_report import KnownLimitation, Report, Skip, add_timeout, expect, watched  # noqa: E402

from mpbind.bindings import nvshmem as nv  # noqa: E402
from mpbind.errors import NVSHMEMError, NVSHMEMNotInitializedError  # noqa: E402

DEVICE = 0
BUF_BYTES = 64 * 1024  # each of the shared source and destination buffers
COUNT = 1000  # elements per RMA / reduction check: small, and exact in every dtype
NBYTES = COUNT * 4  # an int32/float32 payload
SENTINEL = -7

NUMPY_TYPES: dict[str, Any] = {
    "float": np.float32,
    "double": np.float64,
    "int32": np.int32,
    "int64": np.int64,
    "uint64": np.uint64,
}
ARITH_OPS = ("sum", "prod", "min", "max")
BITWISE_OPS = ("and", "or", "xor")
REDUCE_CASES: list[tuple[str, str]] = (
    [(op, t) for t in ("float", "double", "int32", "int64") for op in ARITH_OPS]
    + [(op, t) for t in ("int32", "uint64") for op in BITWISE_OPS]
)
NUMPY_REDUCE: dict[str, Any] = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}

LIMITED_MPG_REASON = ("not supported by NVSHMEM in limited MPG mode (several PEs on one GPU without "
                      "CUDA MPS): libnvshmem_host would exit the process")
HOST_AMO_REASON = ("libnvshmem_host does not implement host-initiated atomics: the call prints "
                   "'not implemented' and leaves the target unchanged")


# --- symmetric memory through CuPy ------------------------------------------------------------


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


def pattern(pe: int, count: int = COUNT, dtype: Any = np.int32) -> np.ndarray:
    """Values that say which PE wrote them, exact in every dtype used here."""
    return (pe * 1000 + np.arange(count)).astype(dtype)


@dataclass
class Ctx:
    comm: Any
    pe: int
    npes: int
    stream: Any
    limited: bool
    src: int = 0  # BUF_BYTES of symmetric memory each
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
        """Lay out this PE's buffers (src=..., dst=..., sig=..., counter=...), make every PE's
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


# --- initialisation ---------------------------------------------------------------------------


def select_device() -> None:
    cp.cuda.Device(DEVICE).use()
    cp.cuda.runtime.free(0)  # create the primary context before NVSHMEM looks for it


def init_nvshmem(method: str, comm: Any, report: Report) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    attr = nv.InitAttr()
    if method == "uid":
        uid = nv.get_uniqueid() if rank == 0 else None
        uid = comm.bcast(uid, root=0)  # a UniqueId pickles
        expect(isinstance(uid, nv.UniqueId), f"bcast returned {type(uid).__name__}")
        expect(nv.UniqueId(bytes(uid)) == uid, "UniqueId(bytes(uid)) != uid")
        nv.set_attr_uniqueid_args(rank, size, uid, attr)
        nv.init_attr(nv.InitFlags.WITH_UNIQUEID, attr)
    else:
        nv.set_attr_mpi_comm_args(comm, attr)
        nv.init_attr(nv.InitFlags.WITH_MPI_COMM, attr)
    report.passed += 1
    report.line("PASS", f"init.{method}")


def status_name(value: int) -> str:
    try:
        return f"{nv.InitStatus(value).name}({value})"
    except ValueError:
        return str(value)


# --- checks -----------------------------------------------------------------------------------


def check_identity(c: Ctx) -> str:
    expect(nv.my_pe() == c.pe, f"my_pe() = {nv.my_pe()}, MPI rank {c.pe}")
    expect(nv.n_pes() == c.npes, f"n_pes() = {nv.n_pes()}, MPI size {c.npes}")
    world = nv.Team.WORLD
    expect(nv.team_my_pe(world) == c.pe, f"team_my_pe(WORLD) = {nv.team_my_pe(world)}")
    expect(nv.team_n_pes(world) == c.npes, f"team_n_pes(WORLD) = {nv.team_n_pes(world)}")
    return f"pe {c.pe} of {c.npes}"


def check_versions(c: Ctx) -> str:
    major, minor = nv.info_get_version()
    expect(major >= 1 and minor >= 0, f"info_get_version() = {(major, minor)}")
    vmajor, vminor, vpatch = nv.vendor_get_version_info()
    expect(vmajor >= 3 and vminor >= 0 and vpatch >= 0,
           f"vendor_get_version_info() = {(vmajor, vminor, vpatch)}")
    return f"OpenSHMEM {major}.{minor}, NVSHMEM {vmajor}.{vminor}.{vpatch}"


def check_malloc(c: Ctx) -> str:
    addr = nv.malloc(4096)
    try:
        expect(addr != 0, "malloc(4096) returned NULL")
        values = pattern(c.pe, 1024)
        write(addr, values)
        expect_equal(read(addr, 1024, np.int32), values, "read back")
    finally:
        nv.free(addr)
    return f"{addr:#x}"


def check_calloc(c: Ctx) -> str:
    # Dirty a block first and free it: calloc then likely reuses it, so zeros mean something.
    dirty = nv.malloc(4096)
    write(dirty, np.full(1024, -1, np.int32))
    cp.cuda.runtime.deviceSynchronize()
    nv.free(dirty)
    addr = nv.calloc(1024, 4)
    try:
        expect(addr != 0, "calloc(1024, 4) returned NULL")
        expect_equal(read(addr, 1024, np.int32), np.zeros(1024, np.int32), "calloc contents")
    finally:
        nv.free(addr)
    return "reused the dirtied block" if addr == dirty else "fresh block"


def check_align(c: Ctx) -> str:
    notes = []
    for alignment, size in ((4096, 1000), (1 << 16, 100)):
        addr = nv.align(alignment, size)
        try:
            expect(addr != 0, f"align({alignment}, {size}) returned NULL")
            expect(addr % alignment == 0, f"align({alignment}, {size}) = {addr:#x}")
        finally:
            nv.free(addr)
        notes.append(f"{addr:#x}")
    return ", ".join(notes)


def check_malloc_zero(c: Ctx) -> str:
    addr = nv.malloc(0)  # NULL is the answer for zero bytes, not an error
    expect(not addr, f"malloc(0) = {addr!r}")
    return "NULL"


def check_ptr_self(c: Ctx) -> str:
    local = nv.ptr(c.dst, c.pe)
    expect(local != 0, "ptr(addr, my_pe) is NULL")
    return "equals the symmetric address" if local == c.dst else f"{local:#x} for {c.dst:#x}"


def record_ptr_peers(c: Ctx, report: Report) -> None:
    peers = {p: nv.ptr(c.dst, p) for p in range(c.npes) if p != c.pe}
    text = ", ".join(f"pe {p}: {a:#x}" if a else f"pe {p}: NULL" for p, a in peers.items())
    report.info("heap.ptr_peers", text or "no peers")


# RMA around a ring: each PE writes into its right neighbour / reads from it.


def check_putmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        nv.putmem(c.dst, c.src, NBYTES, c.right)
        nv.quiet()
        nv.barrier_all()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


def check_getmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        nv.getmem(c.dst, c.src, NBYTES, c.right)
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.right), f"data from pe {c.right}")


def check_put_variants(c: Ctx, how: str) -> None:
    with c.step(src=pattern(c.pe, dtype=np.float32), dst=np.full(COUNT, SENTINEL, np.float32)):
        if how == "typed":
            nv.float_put(c.dst, c.src, COUNT, c.right)
        elif how == "family_name":
            nv.put("float", c.dst, c.src, COUNT, c.right)
        else:
            nv.put(np.float32, c.dst, c.src, COUNT, c.right)
        nv.quiet()
        nv.barrier_all()
        got = read(c.dst, COUNT, np.float32)
    expect_equal(got, pattern(c.left, dtype=np.float32), f"data from pe {c.left}")


def check_get_variants(c: Ctx, how: str) -> None:
    with c.step(src=pattern(c.pe, dtype=np.float64), dst=np.full(COUNT, SENTINEL, np.float64)):
        if how == "typed":
            nv.double_get(c.dst, c.src, COUNT, c.right)
        else:
            nv.get(np.dtype(np.float64), c.dst, c.src, COUNT, c.right)
        got = read(c.dst, COUNT, np.float64)
    expect_equal(got, pattern(c.right, dtype=np.float64), f"data from pe {c.right}")


def check_p_g(c: Ctx) -> None:
    with c.step(dst=np.full(8, SENTINEL, np.int64)):
        nv.int_p(c.dst, 1000 + c.pe, c.right)  # word 0: int
        nv.p("double", c.dst + 8, 0.5 + c.pe, c.right)  # word 1: double
        nv.p(np.int64, c.dst + 16, -(2**40) - c.pe, c.right)  # word 2: int64
        nv.quiet()
        nv.barrier_all()
        mine = nv.int_g(c.dst, c.pe)
        theirs = nv.int_g(c.dst, c.right)
        as_double = nv.g("double", c.dst + 8, c.pe)
        as_int64 = nv.g(np.int64, c.dst + 16, c.right)
    expect(mine == 1000 + c.left, f"int_g(self) = {mine}, expected {1000 + c.left}")
    expect(theirs == 1000 + c.pe, f"int_g(right) = {theirs}, expected {1000 + c.pe}")
    expect(as_double == 0.5 + c.left, f"g('double', self) = {as_double!r}, expected {0.5 + c.left}")
    expect(as_int64 == -(2**40) - c.pe, f"g(int64, right) = {as_int64!r}, expected {-(2**40) - c.pe}")


def check_nbi(c: Ctx) -> None:
    half = COUNT // 2
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        # First half: put into the right neighbour. Second half: get from it.
        nv.putmem_nbi(c.dst, c.src, half * 4, c.right)
        nv.getmem_nbi(c.dst + half * 4, c.src + half * 4, (COUNT - half) * 4, c.right)
        nv.quiet()
        nv.barrier_all()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got[:half], pattern(c.left)[:half], f"put half from pe {c.left}")
    expect_equal(got[half:], pattern(c.right)[half:], f"get half from pe {c.right}")


def check_fence(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        nv.putmem(c.dst, c.src, NBYTES // 2, c.right)
        nv.fence()
        nv.putmem(c.dst + NBYTES // 2, c.src + NBYTES // 2, NBYTES // 2, c.right)
        nv.quiet()
        nv.sync_all()
        nv.barrier_all()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


# On-stream RMA.


def check_stream_putmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        nv.putmem_on_stream(c.dst, c.src, NBYTES, c.right, c.s)
        nv.quiet_on_stream(c.s)
        nv.barrier_all_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


def check_stream_getmem(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        nv.getmem_on_stream(c.dst, c.src, NBYTES, c.right, c.s)
        nv.quiet_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.right), f"data from pe {c.right}")


def check_stream_put_variants(c: Ctx, how: str) -> None:
    with c.step(src=pattern(c.pe, dtype=np.float32), dst=np.full(COUNT, SENTINEL, np.float32)):
        if how == "typed":
            nv.float_put_on_stream(c.dst, c.src, COUNT, c.right, c.s)
        else:
            nv.put_on_stream("float", c.dst, c.src, COUNT, c.right, c.s)
        nv.quiet_on_stream(c.s)
        nv.sync_all_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.float32)
    expect_equal(got, pattern(c.left, dtype=np.float32), f"data from pe {c.left}")


def check_stream_nbi(c: Ctx) -> None:
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32)):
        nv.putmem_nbi_on_stream(c.dst, c.src, NBYTES, c.right, c.s)
        nv.quiet_on_stream(c.s)
        nv.barrier_all_on_stream(c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")


# Signals.


def check_put_signal_wait(c: Ctx) -> None:
    c.full_mode_only()
    zeros = np.zeros(8, np.uint64)
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32), sig=zeros):
        nv.putmem_signal_on_stream(c.dst, c.src, NBYTES, c.sig, 1, nv.SignalOp.SET, c.right, c.s)
        nv.signal_wait_until_on_stream(c.sig, nv.CmpType.EQ, 1, c.s)
        c.sync_stream()  # the signal arrived, so the data before it did too
        got = read(c.dst, COUNT, np.int32)
        fetched = nv.signal_fetch(c.sig)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")
    expect(fetched == 1, f"signal_fetch = {fetched}, expected 1")


def check_put_signal(c: Ctx) -> str:
    zeros = np.zeros(8, np.uint64)
    with c.step(src=pattern(c.pe), dst=np.full(COUNT, SENTINEL, np.int32), sig=zeros):
        nv.putmem_signal_on_stream(c.dst, c.src, NBYTES, c.sig, 7, nv.SignalOp.SET, c.right, c.s)
        nv.quiet_on_stream(c.s)
        c.sync_stream()
        nv.barrier_all()
        got = read(c.dst, COUNT, np.int32)
        after_set = nv.signal_fetch(c.sig)
        c.comm.Barrier()  # everyone has read the SET value before anyone adds
        nv.signal_op_on_stream(c.sig, 5, nv.SignalOp.ADD, c.right, c.s)
        nv.quiet_on_stream(c.s)
        c.sync_stream()
        nv.barrier_all()
        after_add = nv.signal_fetch(c.sig)
    expect_equal(got, pattern(c.left), f"data from pe {c.left}")
    expect(after_set == 7, f"signal_fetch after SIGNAL_SET 7 = {after_set}")
    expect(after_add == 12, f"signal_fetch after SIGNAL_ADD 5 = {after_add}, expected 12")
    return "completion by quiet_on_stream + barrier_all (no wait_until)"


# Atomics: every PE adds onto PE 0's counters.


def check_atomic(c: Ctx, how: str) -> str:
    zeros = np.zeros(8, np.uint64)
    with c.step(counter=zeros):
        if how == "int_fetch_add":
            old = nv.int_atomic_fetch_add(c.counter, 1, 0)
            inc = 1
        elif how == "family_fetch_add":
            old = nv.atomic_fetch_add("int64", c.counter, 1, 0)
            inc = 1
        else:
            nv.uint64_atomic_add(c.counter, c.pe + 1, 0)
            old, inc = None, c.pe + 1
        nv.barrier_all()
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


def check_team_barriers(c: Ctx) -> None:
    c.full_mode_only()
    world = nv.Team.WORLD
    with c.step():
        nv.barrier(world)
        nv.barrier_on_stream(world, c.s)
        nv.team_sync_on_stream(world, c.s)
        c.sync_stream()


def check_broadcast(c: Ctx, root: int) -> str:
    c.full_mode_only()
    src = pattern(root) if c.pe == root else np.full(COUNT, -1, np.int32)
    with c.step(src=src, dst=np.full(COUNT, SENTINEL, np.int32)):
        nv.broadcastmem_on_stream(nv.Team.WORLD, c.dst, c.src, NBYTES, root, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
    if c.pe != root:
        expect_equal(got, pattern(root), f"broadcast from pe {root}")
        return ""
    if np.array_equal(got, pattern(root)):
        return "the root's dest was written too"
    expect_equal(got, np.full(COUNT, SENTINEL, np.int32), "the root's dest")
    return "the root's dest was left as it was"


def check_fcollect(c: Ctx) -> None:
    c.full_mode_only()
    with c.step(src=pattern(c.pe), dst=np.full(COUNT * c.npes, SENTINEL, np.int32)):
        nv.fcollectmem_on_stream(nv.Team.WORLD, c.dst, c.src, NBYTES, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT * c.npes, np.int32)
    expect_equal(got, np.concatenate([pattern(p) for p in range(c.npes)]), "gathered blocks")


def check_alltoall(c: Ctx) -> None:
    c.full_mode_only()
    block = 256

    def blocks_of(sender: int) -> np.ndarray:  # block j goes from `sender` to pe j
        return np.concatenate([sender * 100_000 + j * 1000 + np.arange(block) for j in range(c.npes)]
                              ).astype(np.int32)

    with c.step(src=blocks_of(c.pe), dst=np.full(block * c.npes, SENTINEL, np.int32)):
        nv.alltoallmem_on_stream(nv.Team.WORLD, c.dst, c.src, block * 4, c.s)
        c.sync_stream()
        got = read(c.dst, block * c.npes, np.int32)
    want = np.concatenate([blocks_of(i)[c.pe * block:(c.pe + 1) * block] for i in range(c.npes)])
    expect_equal(got, want, "exchanged blocks")


def reduce_input(op: str, tname: str, pe: int, count: int = COUNT) -> np.ndarray:
    """Per-PE inputs whose reduction is exact in `tname`."""
    dt = np.dtype(NUMPY_TYPES[tname])
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


def check_reduce(c: Ctx, op: str, tname: str, how: str) -> None:
    c.full_mode_only()
    dt = np.dtype(NUMPY_TYPES[tname])
    inputs = [reduce_input(op, tname, p) for p in range(c.npes)]
    want = NUMPY_REDUCE[op].reduce(np.stack(inputs), axis=0).astype(dt)
    world = nv.Team.WORLD
    with c.step(src=inputs[c.pe], dst=np.zeros(COUNT, dt)):
        if how == "typed":
            getattr(nv, f"{tname}_{op}_reduce_on_stream")(world, c.dst, c.src, COUNT, c.s)
        else:  # the family, given a NumPy dtype
            getattr(nv, f"{op}_reduce_on_stream")(dt, world, c.dst, c.src, COUNT, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, dt)
    expect_equal(got, want, f"{op} over {c.npes} PEs")


# Teams.


def record_predefined_teams(c: Ctx, report: Report) -> None:
    parts = []
    for team in (nv.Team.WORLD, nv.Team.SHARED, nv.Team.NODE):
        parts.append(f"{team.name}: {nv.team_my_pe(team)}/{nv.team_n_pes(team)}")
    report.info("team.predefined", ", ".join(parts))


def check_split_strided(c: Ctx) -> str:
    c.full_mode_only()
    world = nv.Team.WORLD
    size = (c.npes + 1) // 2  # the even PEs
    member = c.pe % 2 == 0
    with c.step():
        team = nv.team_split_strided(world, 0, 2, size, None, 0)
    if not member:
        translated = nv.team_translate_pe(world, c.pe, team)
        c.comm.Barrier()  # the members' reduction and destroy
        expect(team == nv.Team.INVALID, f"odd pe got team {team}, expected Team.INVALID")
        expect(translated == -1, f"team_translate_pe into Team.INVALID = {translated}, expected -1")
        return "not a member"
    if team == nv.Team.INVALID:
        c.comm.Barrier()  # where the others wait for the members
        raise AssertionError("an even pe got Team.INVALID")
    try:
        # A reduction on the sub-team only (its members call it; the others wait below). Every
        # member makes every collective call before any assertion, so none is left waiting.
        inputs = {p: reduce_input("sum", "int32", p) for p in range(0, c.npes, 2)}
        write(c.src, inputs[c.pe])
        write(c.dst, np.zeros(COUNT, np.int32))
        cp.cuda.runtime.deviceSynchronize()
        nv.barrier_on_stream(team, c.s)
        nv.int32_sum_reduce_on_stream(team, c.dst, c.src, COUNT, c.s)
        c.sync_stream()
        got = read(c.dst, COUNT, np.int32)
        my_pe, n_pes = nv.team_my_pe(team), nv.team_n_pes(team)
        back = [nv.team_translate_pe(team, i, world) for i in range(size)]
        forward = nv.team_translate_pe(world, c.pe, team)
    finally:
        nv.team_destroy(team)
        c.comm.Barrier()
    expect(my_pe == c.pe // 2, f"team_my_pe = {my_pe}, expected {c.pe // 2}")
    expect(n_pes == size, f"team_n_pes = {n_pes}, expected {size}")
    expect(back == list(range(0, c.npes, 2)), f"team_translate_pe(team, i, WORLD) = {back}")
    expect(forward == c.pe // 2, f"team_translate_pe(WORLD, {c.pe}, team) = {forward}")
    expect_equal(got, np.add.reduce(np.stack(list(inputs.values())), axis=0).astype(np.int32),
                 "sum over the even PEs")
    return f"team {int(team)}: {size} PEs"


def check_split_2d(c: Ctx) -> str:
    c.full_mode_only()
    world = nv.Team.WORLD
    xrange = 2 if c.npes > 1 else 1
    row, col = divmod(c.pe, xrange)
    with c.step():
        xteam, yteam = nv.team_split_2d(world, xrange, None, 0, None, 0)
    try:
        got = {"x": (nv.team_my_pe(xteam), nv.team_n_pes(xteam)),
               "y": (nv.team_my_pe(yteam), nv.team_n_pes(yteam)),
               "x0": nv.team_translate_pe(xteam, 0, world), "y0": nv.team_translate_pe(yteam, 0, world)}
    finally:
        for team in (yteam, xteam):
            if team != nv.Team.INVALID:
                nv.team_destroy(team)
        c.comm.Barrier()
    want = {"x": (col, min(xrange, c.npes - row * xrange)), "y": (row, len(range(col, c.npes, xrange))),
            "x0": row * xrange, "y0": col}
    expect(got == want, f"(my_pe, n_pes) and first members {got}, expected {want}")
    return f"row {row} of x-team {int(xteam)}, column {col} of y-team {int(yteam)}"


# --- the two modes ----------------------------------------------------------------------------


def run_suite(c: Ctx, report: Report) -> None:
    r = report.check
    r("identity", lambda: check_identity(c))
    r("versions", lambda: check_versions(c))
    r("heap.malloc", lambda: check_malloc(c))
    r("heap.calloc_zeroed", lambda: check_calloc(c))
    r("heap.align", lambda: check_align(c))
    r("heap.malloc_zero", lambda: check_malloc_zero(c))
    r("heap.ptr_self", lambda: check_ptr_self(c))
    record_ptr_peers(c, report)

    r("rma.putmem", lambda: check_putmem(c))
    r("rma.getmem", lambda: check_getmem(c))
    r("rma.float_put", lambda: check_put_variants(c, "typed"))
    r("rma.put_family_name", lambda: check_put_variants(c, "family_name"))
    r("rma.put_family_numpy", lambda: check_put_variants(c, "family_numpy"))
    r("rma.double_get", lambda: check_get_variants(c, "typed"))
    r("rma.get_family_numpy", lambda: check_get_variants(c, "family"))
    r("rma.p_g", lambda: check_p_g(c))
    r("rma.nbi_quiet", lambda: check_nbi(c))
    r("rma.fence_sync_all", lambda: check_fence(c))

    r("stream.putmem", lambda: check_stream_putmem(c))
    r("stream.getmem", lambda: check_stream_getmem(c))
    r("stream.float_put", lambda: check_stream_put_variants(c, "typed"))
    r("stream.put_family", lambda: check_stream_put_variants(c, "family"))
    r("stream.putmem_nbi", lambda: check_stream_nbi(c))

    r("signal.put_signal_wait_until", lambda: check_put_signal_wait(c))
    r("signal.put_signal_set_add", lambda: check_put_signal(c))

    r("amo.int_atomic_fetch_add", lambda: check_atomic(c, "int_fetch_add"))
    r("amo.atomic_fetch_add_family", lambda: check_atomic(c, "family_fetch_add"))
    r("amo.uint64_atomic_add", lambda: check_atomic(c, "add"))

    r("coll.team_barriers", lambda: check_team_barriers(c))
    r("coll.broadcast.root0", lambda: check_broadcast(c, 0))
    if c.npes > 1:
        r(f"coll.broadcast.root{c.npes - 1}", lambda: check_broadcast(c, c.npes - 1))
    r("coll.fcollect", lambda: check_fcollect(c))
    r("coll.alltoall", lambda: check_alltoall(c))
    for op, tname in REDUCE_CASES:
        for how in ("typed", "family"):
            r(f"coll.reduce.{op}.{tname}.{how}",
              lambda op=op, tname=tname, how=how: check_reduce(c, op, tname, how))

    record_predefined_teams(c, report)
    r("team.split_strided", lambda: check_split_strided(c))
    r("team.split_2d", lambda: check_split_2d(c))


def main_suite(args: argparse.Namespace, comm: Any, report: Report) -> None:
    init_nvshmem(args.init, comm, report)
    status = int(nv.init_status())
    report.info("init_status", status_name(status))
    # Every PE must skip the same checks, or the others would wait in a collective.
    limited = bool(comm.allreduce(status == nv.InitStatus.LIMITED_MPG, op=MPI.LOR))
    stream = cp.cuda.Stream(non_blocking=True)
    c = Ctx(comm=comm, pe=comm.Get_rank(), npes=comm.Get_size(), stream=stream, limited=limited)
    c.src, c.dst = nv.malloc(BUF_BYTES), nv.malloc(BUF_BYTES)
    c.sig, c.counter = nv.calloc(8, 8), nv.calloc(8, 8)
    start = time.monotonic()
    try:
        run_suite(c, report)
    finally:
        stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()
        comm.Barrier()

        def free_all() -> None:
            for addr in (c.counter, c.sig, c.dst, c.src):
                nv.free(addr)

        report.check("heap.free", free_all)
        report.check("finalize", nv.finalize)
        report.info("init_status_after_finalize", status_name(int(nv.init_status())))
        report.info("elapsed", f"{time.monotonic() - start:.2f} s after init")


def main_reinit(args: argparse.Namespace, comm: Any, report: Report) -> None:
    init_nvshmem(args.init, comm, report)

    def first_use() -> str:
        status = int(nv.init_status())
        expect(status in (nv.InitStatus.IS_INITIALIZED, nv.InitStatus.LIMITED_MPG,
                          nv.InitStatus.FULL_MPG), f"init_status() = {status_name(status)}")
        expect(nv.my_pe() == comm.Get_rank(), "my_pe() != MPI rank")
        addr = nv.malloc(4096)
        nv.barrier_all()
        nv.free(addr)
        return status_name(status)

    report.check("reinit.first_init_usable", first_use)
    report.check("reinit.finalize", nv.finalize)
    report.info("reinit.init_status_after_finalize", status_name(int(nv.init_status())))

    def refused_after_finalize() -> None:
        # The flat bindings' init check reads the library's status on every call: a finalised
        # runtime is refused (the library would end the process).
        try:
            nv.quiet()
        except NVSHMEMNotInitializedError:
            return
        raise AssertionError("nvshmem.quiet() after finalize did not raise NVSHMEMNotInitializedError")

    report.check("reinit.refused_after_finalize", refused_after_finalize)
    if not args.second_init:
        report.info("reinit.second_init", "not attempted (NVSHMEM documents one initialisation per "
                    "process; pass --second-init to try)")
        return
    comm.Barrier()
    try:
        attr = nv.InitAttr()
        if args.init == "uid":
            uid = comm.bcast(nv.get_uniqueid() if comm.Get_rank() == 0 else None, root=0)
            nv.set_attr_uniqueid_args(comm.Get_rank(), comm.Get_size(), uid, attr)
            nv.init_attr(nv.InitFlags.WITH_UNIQUEID, attr)
        else:
            nv.set_attr_mpi_comm_args(comm, attr)
            nv.init_attr(nv.InitFlags.WITH_MPI_COMM, attr)
        status = status_name(int(nv.init_status()))
        addr = nv.malloc(4096)
        nv.barrier_all()
        nv.free(addr)
        nv.finalize()
        report.info("reinit.second_init", f"worked (init_status was {status}); finalized again")
    except NVSHMEMError as exc:
        report.info("reinit.second_init", f"raised {type(exc).__name__}: {exc}")


def run(args: argparse.Namespace, comm: Any, report: Report) -> None:
    select_device()
    if args.reinit:
        main_reinit(args, comm, report)
    else:
        main_suite(args, comm, report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", choices=("uid", "mpi"), default="uid")
    ap.add_argument("--reinit", action="store_true", help="initialise, finalise, report init_status")
    ap.add_argument("--second-init", action="store_true", help="with --reinit: also try a second init")
    add_timeout(ap, 90.0)
    args = ap.parse_args()

    comm = MPI.COMM_WORLD
    report = Report(comm.Get_rank(), tracebacks="NVSHMEM_SUITE_TRACEBACKS", xfail_column=True)
    return watched(report, args.timeout, lambda: run(args, comm, report))


if __name__ == "__main__":
    sys.exit(main())
