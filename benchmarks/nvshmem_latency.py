"""NVSHMEM ``put`` + ``quiet`` on a stream through mpbind's layer, mpbind's flat binding and
nvshmem4py's, in one run on the same libnvshmem_host.

    mpirun -np 2 python benchmarks/nvshmem_latency.py [--placement per-gpu|shared] [--min 8]
        [--max 1073741824] [--calls 1000] [--iters 50] [--batches 5] [--out DIR]

Each PE puts to the next one (``(pe + 1) % n_pes``). ``--placement per-gpu`` (the default when there
are as many GPUs as PEs) puts one PE on each GPU; ``shared`` puts every PE on GPU 0 (NVSHMEM's
limited multi-PE-per-GPU mode without MPS, where RMA still works).

For each message size (bytes, from ``--min`` to ``--max``, x4 steps), interleaved batch by batch
so that the three see the same machine state:

* host time per call: ``perf_counter_ns`` around one ``put`` + ``quiet`` pair, nothing
  synchronised in the loop, the median over every pair (fewer pairs at large sizes);
* bandwidth: CUDA events around ``--iters`` back-to-back pairs on the stream, bytes / time, the
  median over batches;
* round trip: a pair and the stream's synchronisation, host time until the put is complete.

The layer is called as a user writes it: ``nvshmem.put(dst, src, peer, stream)`` and
``nvshmem.quiet(stream)`` with symmetric arrays and a CuPy stream; the flat calls and nvshmem4py's
(``nvshmem.bindings``, 0.4.1) get pointers and the stream handle. nvshmem4py resolves its symbols in
the library already in the process; the script checks that both bindings call the same
``nvshmemx_putmem_on_stream`` (else it measures nvshmem4py in a second phase on its own library).
After mpbind's runtime is finalized, nvshmem4py's own Python layer (``nvshmem.core.put`` and
``quiet`` on its arrays and a cuda.core stream, after its own ``nvshmem.core.init``) is timed the same
way (host time per pair): the like-for-like figure for mpbind's layer (``layer_over_nvshmem4py_layer``).
``my_pe()`` is timed too (ns per call). PE 0 prints the table and writes ``nvshmem_put.csv`` (and
``.png`` where matplotlib is installed) under ``--out``; the ratios of the other PEs are printed.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before anything loads CUDA, NCCL or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
from _pe_placement import add_placement_argument, placement_and_device  # noqa: E402
from _timing import host_times, ns_per_call  # noqa: E402

from mpbind import nvshmem  # noqa: E402
from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.bindings import nvshmem as nv  # noqa: E402

VARIANTS = ("layer", "flat", "nvshmem4py")


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


def init_nvshmem4py(nb: Any, comm: Any) -> None:
    """nvshmem4py's own unique-id initialisation, as nvshmem.core.init does it."""
    uid = nb.uniqueid()
    if comm.Get_rank() == 0:
        nb.get_uniqueid(uid.ptr)
    comm.Bcast(uid._data.view(np.int8), root=0)
    attr = nb.InitAttr()
    nb.set_attr_uniqueid_args(comm.Get_rank(), comm.Get_size(), uid.ptr, attr.ptr)
    nb.hostlib_init_attr(nb.Flags.INIT_WITH_UNIQUEID, attr.ptr)


# --- what is measured -------------------------------------------------------------------------


class Buffers:
    """dst and src of one size: symmetric arrays (the layer) and their pointers (the flat calls)."""

    def __init__(self, nbytes: int, pe: int, alloc: Callable[[int], Any] | None = None) -> None:
        self.nbytes = nbytes
        if alloc is None:
            self.dst_array, self.src_array = nvshmem.empty(nbytes, "uint8"), nvshmem.empty(nbytes, "uint8")
            self.dst, self.src = self.dst_array.ptr, self.src_array.ptr
        else:  # nvshmem4py on its own library copy
            self.dst_array = self.src_array = None
            self.dst, self.src = alloc(nbytes), alloc(nbytes)
        cp.cuda.runtime.memset(self.src, pe + 1, nbytes)


def pair_calls(variant: str, b: Buffers, peer: int, stream: Any, nb: Any) -> Callable[[], None]:
    """One put + quiet of `variant`, as a caller of that binding writes it."""
    handle = int(stream.ptr)
    if variant == "layer":
        put, quiet, dst, src = nvshmem.put, nvshmem.quiet, b.dst_array, b.src_array

        def layer() -> None:
            put(dst, src, peer, stream)
            quiet(stream)

        return layer
    binding = nv if variant == "flat" else nb
    putmem, quiet_on = binding.putmem_on_stream, binding.quiet_on_stream
    dptr, sptr, n = b.dst, b.src, b.nbytes

    def flat() -> None:
        putmem(dptr, sptr, n, peer, handle)
        quiet_on(handle)

    return flat


def calls_for(nbytes: int, calls: int) -> int:
    """Fewer pairs where the queued GPU work (~nbytes / 50 GB/s each) would exceed ~0.5 s."""
    return max(20, min(calls, int(0.5 / max(nbytes / 50e9, 1e-6))))


def enqueue_times(fn: Callable[[], None], n: int, stream: Any) -> list[float]:
    out = host_times(fn, n)
    stream.synchronize()  # drain outside the timed calls
    return out


def device_time(fn: Callable[[], None], iters: int, stream: Any) -> float:
    """Seconds per pair from CUDA events around `iters` pairs on `stream`."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(iters):
        fn()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / iters


def measure(variants: list[str], b: Buffers, comm: Any, stream: Any, nb: Any, a: argparse.Namespace) -> dict[str, Any]:
    pe, npes = comm.Get_rank(), comm.Get_size()
    peer = (pe + 1) % npes
    fns = {v: pair_calls(v, b, peer, stream, nb) for v in variants}
    for fn in fns.values():  # warm up: first calls resolve symbols and create internal resources
        enqueue_times(fn, 20, stream)
    host: dict[str, list[float]] = {v: [] for v in variants}
    dev: dict[str, list[float]] = {v: [] for v in variants}
    rtt: dict[str, list[float]] = {v: [] for v in variants}
    per_batch = max(1, calls_for(b.nbytes, a.calls) // a.batches)
    iters = max(2, min(a.iters, calls_for(b.nbytes, a.iters)))
    for batch in range(a.batches):
        order = variants[batch % len(variants):] + variants[:batch % len(variants)]
        for name in order:
            comm.Barrier()
            host[name] += enqueue_times(fns[name], per_batch, stream)
            comm.Barrier()
            dev[name].append(device_time(fns[name], iters, stream))
            comm.Barrier()
            # round trip: a pair and the stream's synchronisation, until the put is complete
            rtt[name] += host_times(fns[name], max(2, per_batch // 10), then=stream.synchronize)
    row: dict[str, Any] = {"bytes": b.nbytes}
    for name in variants:
        row[f"{name}_host_us"] = statistics.median(host[name])
        row[f"{name}_rtt_us"] = statistics.median(rtt[name])
        row[f"{name}_GBps"] = b.nbytes / statistics.median(dev[name]) / 1e9
    add_ratios(row)
    return row


def add_ratios(row: dict[str, Any]) -> None:
    if "layer_host_us" in row and "flat_host_us" in row:
        row["layer_minus_flat_us"] = row["layer_host_us"] - row["flat_host_us"]
    if "layer_host_us" in row and "nvshmem4py_host_us" in row:
        row["layer_over_nvshmem4py_host"] = row["layer_host_us"] / row["nvshmem4py_host_us"]


def nvshmem4py_layer(comm: Any, device: int, sizes: list[int], a: argparse.Namespace) -> dict[int, float] | str:
    """Host µs per ``nvshmem.core.put`` + ``quiet`` pair of nvshmem4py's own layer, per size, in its
    own initialisation (after mpbind's runtime is finalized), or why it could not run."""
    try:
        import nvshmem.core as nvs
        from cuda.core import Device
    except ImportError as exc:
        return f"nvshmem.core not importable ({exc})"
    dev = Device(device)
    dev.set_current()
    nvs.init(device=dev, mpi_comm=comm, initializer_method="mpi")
    stream = dev.create_stream()
    peer = (comm.Get_rank() + 1) % comm.Get_size()
    out: dict[int, float] = {}
    try:
        for nbytes in sizes:
            dst, src = nvs.array((nbytes,), dtype="uint8"), nvs.array((nbytes,), dtype="uint8")

            def pair(dst: Any = dst, src: Any = src) -> None:
                nvs.put(dst, src, remote_pe=peer, stream=stream)
                nvs.quiet(stream=stream)

            host_times(pair, 20, then=stream.sync)  # warm up
            comm.Barrier()
            times = host_times(pair, calls_for(nbytes, a.calls))
            stream.sync()
            out[nbytes] = statistics.median(times)
            comm.Barrier()
            nvs.free_array(dst)
            nvs.free_array(src)
    finally:
        nvs.finalize()
    return out


def my_pe_ns(nb: Any, calls: int) -> dict[str, float]:
    out = {"layer": ns_per_call(nvshmem.my_pe, calls), "flat": ns_per_call(nv.my_pe, calls)}
    if nb is not None:
        out["nvshmem4py"] = ns_per_call(nb.my_pe, calls)
    out["empty call"] = ns_per_call(lambda: None, calls)
    return out


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_placement_argument(ap)
    ap.add_argument("--min", type=int, default=8)
    ap.add_argument("--max", type=int, default=1 << 30)
    ap.add_argument("--calls", type=int, default=1000, help="put+quiet pairs timed per size (host time)")
    ap.add_argument("--iters", type=int, default=50, help="pairs between two CUDA events (bandwidth)")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--my-pe-calls", type=int, default=200_000)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    pe, npes = comm.Get_rank(), comm.Get_size()
    placement, device = placement_and_device(a.placement, pe, npes, cp.cuda.runtime.getDeviceCount())
    # Two buffers of the largest size, with room for NVSHMEM's own allocations.
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(2 * a.max + (256 << 20)))
    cp.cuda.Device(device).use()
    cp.cuda.runtime.free(0)  # the primary context, before NVSHMEM looks for it

    rt = nvshmem.init(mpi_comm=comm, bootstrap="uid", device=device)
    mp_path = os.path.realpath(_loader.load("nvshmem").path)
    missing = ""
    try:
        nb: Any = importlib.import_module("nvshmem.bindings")
        nb_internal: Any = importlib.import_module("nvshmem.bindings._internal.nvshmem")
    except ImportError as exc:
        nb = nb_internal = None
        missing = f"nvshmem4py not importable ({exc}); pip install nvshmem4py-cu13==0.4.1"
    same = False
    where = {"mpbind": mp_path}
    if nb is not None:
        pairs = [(mpbind_symbol(c), int(nb_internal._inspect_function_pointer(f"__{c}")))
                 for c in ("nvshmem_my_pe", "nvshmemx_putmem_on_stream", "nvshmemx_quiet_on_stream")]
        same = all(m == n != 0 for m, n in pairs)
        where["nvshmem4py"] = library_of(pairs[0][1])

    stream = cp.cuda.Stream(non_blocking=True)
    variants = ["layer", "flat"] + (["nvshmem4py"] if nb is not None and same else [])
    sizes = []
    s = a.min
    while s <= a.max:
        sizes.append(s)
        s *= 4
    rows = []
    for nbytes in sizes:
        b = Buffers(nbytes, pe)
        cp.cuda.runtime.deviceSynchronize()
        comm.Barrier()
        rows.append(measure(variants, b, comm, stream, nb, a))
        b.dst_array.free()
        b.src_array.free()
    pe_ns = my_pe_ns(nb if same else None, a.my_pe_calls)
    rt.finalize()

    if nb is not None and not same:  # a second library copy: nvshmem4py on its own, after ours is finalized
        init_nvshmem4py(nb, comm)
        for row, nbytes in zip(rows, sizes, strict=True):
            b = Buffers(nbytes, pe, alloc=nb.malloc)
            comm.Barrier()
            row.update({k: v for k, v in measure(["nvshmem4py"], b, comm, stream, nb, a).items()
                        if k.startswith("nvshmem4py")})
            add_ratios(row)
            nb.free(b.dst)
            nb.free(b.src)
        pe_ns["nvshmem4py"] = ns_per_call(nb.my_pe, a.my_pe_calls)
        nb.hostlib_finalize()

    theirs = nvshmem4py_layer(comm, device, sizes, a) if nb is not None else "nvshmem4py not importable"
    if isinstance(theirs, dict):
        for row in rows:
            row["nvshmem4py_layer_host_us"] = theirs[row["bytes"]]
            row["layer_over_nvshmem4py_layer"] = row["layer_host_us"] / row["nvshmem4py_layer_host_us"]
    elif pe == 0:
        print(f"#   nvshmem4py's layer: not measured: {theirs}")

    everyone = comm.gather((rows, pe_ns), root=0)
    if pe != 0:
        return 0
    version = ".".join(str(v) for v in nv.vendor_get_version_info())
    nb_version = None if nb is None else getattr(importlib.import_module("nvshmem"), "__version__", "?")
    on = "PE k on GPU k" if placement == "per-gpu" else "every PE on GPU 0"
    print(f"# NVSHMEM {version}, {npes} PEs, placement {placement} ({on}); nvshmem4py {nb_version}")
    for name, path in where.items():
        print(f"#   {name} calls {path}")
    if missing:
        print(f"#   {missing}")
    elif nb is not None and not same:
        print("#   the two bindings use different library copies: nvshmem4py measured in a second phase")
    print("# my_pe() ns per call, PE 0: " + ", ".join(f"{k} {v:.1f}" for k, v in everyone[0][1].items()))
    header = list(rows[0])
    print(_results.table(header, [[r[h] for h in header] for r in rows]))
    for k, (other, _) in enumerate(everyone[1:], start=1):
        ratios = [f"{r.get('layer_over_nvshmem4py_host', float('nan')):.2f}" for r in other]
        print(f"# PE {k}: layer/nvshmem4py host time per size: {', '.join(ratios)}")
    csv = a.out / f"nvshmem_put_{placement}.csv"
    _results.write_csv(csv, header, [[r[h] for h in header] for r in rows])
    xs = [float(r["bytes"]) for r in rows]
    names = [v for v in VARIANTS if f"{v}_host_us" in rows[0]]
    drawn = _results.plot(csv.with_suffix(".png"), f"NVSHMEM put+quiet on stream, {npes} PEs ({placement})",
                          "bytes", [
                              ("host time per put+quiet (µs)", {v: (xs, [r[f"{v}_host_us"] for r in rows])
                                                                for v in names}),
                              ("bandwidth (GB/s)", {v: (xs, [r[f"{v}_GBps"] for r in rows]) for v in names}),
                          ])
    print(f"wrote {csv}" + (" and .png" if drawn else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
