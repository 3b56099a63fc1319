"""Where the layer's NVSHMEM ``put`` + ``quiet`` host time goes: the flat pair, then the layer's
steps added one at a time, interleaved in one run on the same library.

    mpirun -np N python benchmarks/nvshmem_put_breakdown.py [--placement per-gpu|shared]
        [--sizes 8,65536,1048576] [--pairs 200] [--batches 20] [--out DIR]

Each PE puts to the next one. The variants, each a put and a quiet as its caller writes them:

* ``flat``: ``bindings.nvshmem.putmem_on_stream(ptr, ptr, n, pe, handle)`` and
  ``quiet_on_stream(handle)``, the stream handle an int read once;
* ``flat_ptr``: the same, reading the CuPy stream's ``.ptr`` at each call (what a CuPy user of the
  flat bindings writes);
* ``core_int``: the layer's C++ (``mpbind._core.nvshmem.put(dst, src, pe, handle)`` and
  ``quiet(handle)``) on symmetric arrays, the stream an int;
* ``core``: the same with the CuPy stream;
* ``layer``: ``mpbind.nvshmem.put(dst, src, pe, stream)`` and ``quiet(stream)``, called as a user
  writes them. They are the core's functions themselves now (there is no Python facade frame any
  more), so ``layer`` and ``core`` differ only by the name looked up: kept so that runs before and
  after that change compare.

Each pair is timed in two parts (the put, then the quiet), ``perf_counter_ns`` around each; the stream
is synchronised after every ``--pairs`` pairs, outside the timed calls, so that a full launch queue
never blocks a call. Batches rotate the variants' order. The table gives, per size and variant, the
median put, quiet and pair host time and the median over batches of the pair's difference from
``flat`` in the same batch (paired). PE 0 prints it and writes ``nvshmem_put_breakdown.csv`` (and
``.png``) under ``--out``. The core's own cost per call without the library call is not timed here:
that needs the core's test hooks, which the benchmarks do not use (``core_int`` minus ``flat`` bounds it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before anything loads CUDA or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import cupy as cp  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
from _pe_placement import add_placement_argument, placement_and_device  # noqa: E402

from mpbind import _core, nvshmem  # noqa: E402
from mpbind.bindings import nvshmem as nv  # noqa: E402

VARIANTS = ("flat", "flat_ptr", "core_int", "core", "layer")
Pair = tuple[Callable[[], None], Callable[[], None]]


def pairs_for(dst: Any, src: Any, peer: int, stream: Any) -> dict[str, Pair]:
    """(put, quiet) of each variant, as closures over what its caller holds."""
    handle = int(stream.ptr)
    dptr, sptr, n = dst.ptr, src.ptr, dst.nbytes
    putmem, quiet_on = nv.putmem_on_stream, nv.quiet_on_stream
    core = _core.nvshmem
    return {
        "flat": (lambda: putmem(dptr, sptr, n, peer, handle), lambda: quiet_on(handle)),
        "flat_ptr": (lambda: putmem(dptr, sptr, n, peer, stream.ptr), lambda: quiet_on(stream.ptr)),
        "core_int": (lambda: core.put(dst, src, peer, handle), lambda: core.quiet(handle)),
        "core": (lambda: core.put(dst, src, peer, stream), lambda: core.quiet(stream)),
        "layer": (lambda: nvshmem.put(dst, src, peer, stream), lambda: nvshmem.quiet(stream)),
    }


def timed_pairs(pair: Pair, n: int, stream: Any) -> tuple[list[float], list[float]]:
    """Microseconds of the put and of the quiet of `n` pairs; the stream drained afterwards."""
    put, quiet = pair
    clock = time.perf_counter_ns
    puts, quiets = [], []
    for _ in range(n):
        t0 = clock()
        put()
        t1 = clock()
        quiet()
        t2 = clock()
        puts.append((t1 - t0) / 1e3)
        quiets.append((t2 - t1) / 1e3)
    stream.synchronize()
    return puts, quiets


def measure(nbytes: int, comm: Any, stream: Any, a: argparse.Namespace) -> list[dict[str, Any]]:
    pe, npes = comm.Get_rank(), comm.Get_size()
    dst, src = nvshmem.empty(nbytes, "uint8"), nvshmem.empty(nbytes, "uint8")
    cp.cuda.runtime.memset(src.ptr, pe + 1, nbytes)
    cp.cuda.runtime.deviceSynchronize()
    pairs = pairs_for(dst, src, (pe + 1) % npes, stream)
    for pair in pairs.values():  # warm up: first calls resolve symbols and create internal resources
        timed_pairs(pair, 20, stream)
    puts: dict[str, list[float]] = {v: [] for v in VARIANTS}
    quiets: dict[str, list[float]] = {v: [] for v in VARIANTS}
    batch_pair: dict[str, list[float]] = {v: [] for v in VARIANTS}  # each batch's median pair time
    for batch in range(a.batches):
        order = VARIANTS[batch % len(VARIANTS):] + VARIANTS[:batch % len(VARIANTS)]
        for name in order:
            comm.Barrier()
            p, q = timed_pairs(pairs[name], a.pairs, stream)
            puts[name] += p
            quiets[name] += q
            batch_pair[name].append(statistics.median(x + y for x, y in zip(p, q, strict=True)))
    comm.Barrier()
    dst.free()
    src.free()
    rows = []
    for name in VARIANTS:
        pair = [x + y for x, y in zip(puts[name], quiets[name], strict=True)]
        minus_flat = [x - f for x, f in zip(batch_pair[name], batch_pair["flat"], strict=True)]
        rows.append({"bytes": nbytes, "variant": name, "put_us": statistics.median(puts[name]),
                     "quiet_us": statistics.median(quiets[name]), "pair_us": statistics.median(pair),
                     "minus_flat_us": statistics.median(minus_flat)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_placement_argument(ap)
    ap.add_argument("--sizes", default="8,65536,1048576", help="message sizes in bytes, comma-separated")
    ap.add_argument("--pairs", type=int, default=200, help="pairs per batch, between two synchronisations")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    pe, npes = comm.Get_rank(), comm.Get_size()
    placement, device = placement_and_device(a.placement, pe, npes, cp.cuda.runtime.getDeviceCount())
    sizes = [int(s) for s in a.sizes.split(",")]
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(2 * max(sizes) + (256 << 20)))
    cp.cuda.Device(device).use()
    cp.cuda.runtime.free(0)  # the primary context, before NVSHMEM looks for it
    rt = nvshmem.init(mpi_comm=comm, bootstrap="uid", device=device)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = [row for nbytes in sizes for row in measure(nbytes, comm, stream, a)]
    rt.finalize()

    everyone = comm.gather(rows, root=0)
    if pe != 0:
        return 0
    version = ".".join(str(v) for v in nv.vendor_get_version_info())
    print(f"# NVSHMEM {version}, {npes} PEs, placement {placement}; {a.batches} batches of {a.pairs} pairs")
    header = list(rows[0])
    print(_results.table(header, [[r[h] for h in header] for r in rows]))
    for k, other in enumerate(everyone[1:], start=1):
        print(f"# PE {k}: pair minus flat (µs), per size and variant: " +
              ", ".join(f"{r['bytes']}/{r['variant']} {r['minus_flat_us']:.2f}" for r in other))
    csv = a.out / f"nvshmem_put_breakdown_{placement}.csv"
    _results.write_csv(csv, header, [[r[h] for h in header] for r in rows])
    xs = sorted({float(r["bytes"]) for r in rows})
    series = {v: (xs, [r["pair_us"] for r in rows if r["variant"] == v]) for v in VARIANTS}
    drawn = _results.plot(csv.with_suffix(".png"), f"NVSHMEM put+quiet host time by step, {npes} PEs ({placement})",
                          "bytes", [("host time per put+quiet (µs)", series)], log_y=False)
    print(f"wrote {csv}" + (" and .png" if drawn else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
