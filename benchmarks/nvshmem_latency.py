"""Host-side latency of NVSHMEM on-stream RMA through mpbind and through nvshmem4py, in one run.

    mpirun -np 2 python benchmarks/nvshmem_latency.py [--nbytes B] [--iters N] [--repeat R] [--json]

Both PEs share GPU 0; each targets the other. Measured per binding, interleaved batch by batch:

- ``my_pe()``: ns per call (the median over R batches of N calls);
- enqueue: ``putmem_on_stream`` + ``quiet_on_stream``, host time per pair without any
  synchronisation (the median over R batches of N pairs; the stream is drained between batches);
- round trip: ``putmem_on_stream`` + ``quiet_on_stream`` + ``cudaStreamSynchronize`` of B bytes,
  host time per iteration until the put is complete (the median of R x N samples).

nvshmem4py (``pip install nvshmem4py-cu13``) resolves its symbols in the library already in the
process, so mpbind initialises NVSHMEM once and both bindings call the same libnvshmem_host; the
script checks that both see the same function addresses and says which file they come from. If
they did not, it would measure mpbind, finalise, then initialise nvshmem4py on its own library.
Without nvshmem4py only mpbind's column is printed.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# Before anything loads CUDA, NCCL or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpbind import _loader  # noqa: E402
from mpbind.bindings import nvshmem as nv  # noqa: E402

DEVICE = 0


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_of(address: int) -> str:
    """The file of the shared object that holds `address` (dladdr)."""
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not address or not libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return "?"
    return os.path.realpath(info.dli_fname.decode())


def mpbind_symbol(name: str) -> int:
    lib = ctypes.CDLL(_loader.load("nvshmem").path)  # the same handle: dlopen counts references
    return int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0)


class Binding:
    """The three calls measured, from one binding."""

    def __init__(self, name: str, my_pe: Callable[[], int], put: Callable[..., Any],
                 quiet: Callable[[int], Any]) -> None:
        self.name, self.my_pe, self.put, self.quiet = name, my_pe, put, quiet


def mpbind_binding() -> Binding:
    return Binding("mpbind", nv.my_pe, nv.putmem_on_stream, nv.quiet_on_stream)


def nvshmem4py_binding(nb: Any) -> Binding:
    return Binding("nvshmem4py", nb.my_pe, nb.putmem_on_stream, nb.quiet_on_stream)


def init_mpbind(comm: Any) -> None:
    attr = nv.InitAttr()
    uid = comm.bcast(nv.get_uniqueid() if comm.Get_rank() == 0 else None, root=0)
    nv.set_attr_uniqueid_args(comm.Get_rank(), comm.Get_size(), uid, attr)
    nv.init_attr(nv.InitFlags.WITH_UNIQUEID, attr)


def init_nvshmem4py(nb: Any, comm: Any) -> None:
    """nvshmem4py's own unique-id initialisation, as nvshmem.core.init does it."""
    uid = nb.uniqueid()
    if comm.Get_rank() == 0:
        nb.get_uniqueid(uid.ptr)
    comm.Bcast(uid._data.view(np.int8), root=0)
    attr = nb.InitAttr()
    nb.set_attr_uniqueid_args(comm.Get_rank(), comm.Get_size(), uid.ptr, attr.ptr)
    nb.hostlib_init_attr(nb.Flags.INIT_WITH_UNIQUEID, attr.ptr)


# --- measurements -----------------------------------------------------------------------------


def ns_per_call(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def enqueue_us(b: Binding, dst: int, src: int, nbytes: int, peer: int, stream: Any, pairs: int) -> float:
    put, quiet, s = b.put, b.quiet, int(stream.ptr)
    t0 = time.perf_counter_ns()
    for _ in range(pairs):
        put(dst, src, nbytes, peer, s)
        quiet(s)
    elapsed = time.perf_counter_ns() - t0
    stream.synchronize()  # drain outside the timed loop
    return elapsed / pairs / 1e3


def round_trip_us(b: Binding, dst: int, src: int, nbytes: int, peer: int, stream: Any, iters: int) -> list[float]:
    put, quiet, s = b.put, b.quiet, int(stream.ptr)
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        put(dst, src, nbytes, peer, s)
        quiet(s)
        stream.synchronize()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return samples


def measure(bindings: list[Binding], comm: Any, dst: int, src: int,
            a: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Medians per binding; batches alternate between bindings so drift hits both alike."""
    pe, npes = comm.Get_rank(), comm.Get_size()
    peer = (pe + 1) % npes
    stream = cp.cuda.Stream(non_blocking=True)
    my_pe: dict[str, list[float]] = {b.name: [] for b in bindings}
    enq: dict[str, list[float]] = {b.name: [] for b in bindings}
    rtt: dict[str, list[float]] = {b.name: [] for b in bindings}
    for b in bindings:  # warm up: first calls resolve symbols and create internal resources
        ns_per_call(b.my_pe, 1000)
        enqueue_us(b, dst, src, a.nbytes, peer, stream, 50)
        round_trip_us(b, dst, src, a.nbytes, peer, stream, 50)
    empty = [ns_per_call(lambda: None, a.calls) for _ in range(a.repeat)]
    for r in range(a.repeat):
        order = bindings if r % 2 == 0 else bindings[::-1]
        for b in order:
            my_pe[b.name].append(ns_per_call(b.my_pe, a.calls))
        comm.Barrier()
        for b in order:
            enq[b.name].append(enqueue_us(b, dst, src, a.nbytes, peer, stream, a.iters))
        comm.Barrier()
        for b in order:
            rtt[b.name].extend(round_trip_us(b, dst, src, a.nbytes, peer, stream, a.iters))
    stream.synchronize()
    comm.Barrier()
    result = {b.name: {"my_pe_ns": statistics.median(my_pe[b.name]),
                       "enqueue_us": statistics.median(enq[b.name]),
                       "round_trip_us": statistics.median(rtt[b.name])} for b in bindings}
    result["empty call"] = {"my_pe_ns": statistics.median(empty)}
    return result


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nbytes", type=int, default=4096, help="bytes per put (default 4 KB)")
    ap.add_argument("--iters", type=int, default=200, help="pairs / round trips per batch")
    ap.add_argument("--calls", type=int, default=200_000, help="my_pe() calls per batch")
    ap.add_argument("--repeat", type=int, default=15, help="batches per binding")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    pe, npes = comm.Get_rank(), comm.Get_size()
    if npes < 2 and pe == 0:
        print("note: run under `mpirun -np 2`; with one PE each put targets itself", file=sys.stderr)
    cp.cuda.Device(DEVICE).use()
    cp.cuda.runtime.free(0)  # the primary context, before NVSHMEM looks for it

    init_mpbind(comm)
    mp_path = _loader.load("nvshmem").path
    missing = ""
    try:
        nb: Any = importlib.import_module("nvshmem.bindings")
        nb_internal: Any = importlib.import_module("nvshmem.bindings._internal.nvshmem")
    except ImportError as exc:
        nb = nb_internal = None
        missing = f"nvshmem4py not importable ({exc}); pip install nvshmem4py-cu13"
    same = False
    where: dict[str, str] = {"mpbind": os.path.realpath(mp_path)}
    if nb is not None:
        pairs = [(mpbind_symbol(c), int(nb_internal._inspect_function_pointer(f"__{c}")))
                 for c in ("nvshmem_my_pe", "nvshmemx_putmem_on_stream", "nvshmemx_quiet_on_stream")]
        same = all(m == n != 0 for m, n in pairs)
        where["nvshmem4py"] = library_of(pairs[0][1])

    src, dst = nv.malloc(a.nbytes), nv.malloc(a.nbytes)
    cp.cuda.runtime.memset(src, pe + 1, a.nbytes)
    cp.cuda.runtime.deviceSynchronize()
    comm.Barrier()
    bindings = [mpbind_binding()] + ([nvshmem4py_binding(nb)] if nb is not None and same else [])
    result = measure(bindings, comm, dst, src, a)
    nv.free(src)
    nv.free(dst)
    nv.finalize()

    if nb is not None and not same:  # a second library copy: initialise it on its own
        init_nvshmem4py(nb, comm)
        src, dst = nb.malloc(a.nbytes), nb.malloc(a.nbytes)
        comm.Barrier()
        result.update({k: v for k, v in measure([nvshmem4py_binding(nb)], comm, dst, src, a).items()
                       if k == "nvshmem4py"})
        nb.free(src)
        nb.free(dst)
        nb.hostlib_finalize()

    results = comm.gather(result, root=0)
    if pe != 0:
        return 0
    version = ".".join(str(v) for v in nv.vendor_get_version_info())
    meta = {"nvshmem": version, "pes": npes, "nbytes": a.nbytes, "iters": a.iters, "calls": a.calls,
            "repeat": a.repeat, "libraries": where, "one_library_shared": same,
            "nvshmem4py": None if nb is None else getattr(importlib.import_module("nvshmem"), "__version__", "?")}
    if a.json:
        print(json.dumps({"meta": meta, "per_pe": results}, indent=1))
        return 0
    print(f"NVSHMEM {version}, {npes} PEs on GPU {DEVICE}; {a.nbytes} B puts; medians of {a.repeat} batches")
    for name, path in where.items():
        print(f"  {name:10s} calls {path}")
    if nb is None:
        print(f"  {missing}")
    elif not same:
        print("  the two bindings use different library copies: measured in two phases")
    metrics = [("my_pe()", "my_pe_ns", "ns/call"), ("put+quiet enqueue", "enqueue_us", "us/pair"),
               (f"{a.nbytes} B put+quiet+sync", "round_trip_us", "us/iter")]
    header = f"{'metric':34s} {'pe':>2s} {'mpbind':>10s} {'nvshmem4py':>11s} {'ratio':>6s}"
    print(header)
    print("-" * len(header))
    for label, key, unit in metrics:
        for k, per_pe in enumerate(results):
            ours = per_pe["mpbind"][key]
            theirs = per_pe.get("nvshmem4py", {}).get(key)
            ratio = f"{ours / theirs:6.2f}" if theirs else "     -"
            theirs_text = f"{theirs:11.2f}" if theirs else f"{'-':>11s}"
            print(f"{label + ' (' + unit + ')':34s} {k:2d} {ours:10.2f} {theirs_text} {ratio}")
    print(f"ratio = mpbind / nvshmem4py; an empty Python call takes {results[0]['empty call']['my_pe_ns']:.1f} ns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
