"""Kernels that call NVSHMEM, on every PE under mpirun: the ring exchange of examples/ring_exchange.py
(8 B, 64 KiB, 16 MiB), a collectively launched kernel with a device-side barrier, and the refusals
that must come before any launch, identically on every PE (the PEs then still meet in a barrier).

    mpirun -np 2 python tests/gpu/nvshmem_kernels_mpi_suite.py             # one PE per GPU
    mpirun -np 3 python tests/gpu/nvshmem_kernels_mpi_suite.py --one-gpu   # three PEs on GPU 0 (MPS)

Prints ``PASS``/``FAIL``/``SKIP name [pe k]`` lines and ``pe=<k> passed=<p> failed=<f> skipped=<s>``.
"""

from __future__ import annotations

import gc
import sys
import warnings
from typing import Any

import mpbind

mpbind.load_libraries("nvshmem")  # before torch maps its own NVSHMEM: ours is then the one copy in the process
import torch  # noqa: E402
from kernel_suite import load_example, main, refused  # noqa: E402
from suite_report import Report, expect  # noqa: E402

from mpbind import nvshmem  # noqa: E402
from mpbind import nvshmem_kernels as nk  # noqa: E402

# Appended to the example's source, so that one compile serves every check.
BARRIER = r"""
extern "C" __global__ void barrier_then_mark(int* mark) {
    if (blockIdx.x == 0) nvshmemx_barrier_all_block();
    if (threadIdx.x == 0) mark[blockIdx.x] = nvshmem_my_pe() + 1;
}
"""


def run(report: Report, a: Any) -> None:
    r = report.check
    comm, ring_mod = a.comm, load_example("ring_exchange")
    stream = torch.cuda.Stream()
    source = ring_mod.SOURCE + BARRIER
    cubin = nk.compile(source, name="kernels_suite") if comm.Get_rank() == 0 else None
    comm.Barrier()
    cubin = cubin or nk.compile(source, name="kernels_suite")
    r("build.cached_on_other_pes", lambda: f"cached={cubin.cached}, {len(cubin.code)} bytes, {cubin.arch}")
    library = cubin.load()
    r("load.registered", lambda: expect(library.handle != 0, "no CUlibrary") or f"kernels {cubin.kernels}")

    for nbytes in (8, 64 * 1024, 16 * 1024 * 1024):
        def ring_case(nbytes: int = nbytes) -> str:
            ring = ring_mod.RingExchange(library, nbytes)
            try:
                for _ in range(3):  # the signal only grows: later exchanges wait for their own round
                    ring.run(stream=stream)
                stream.synchronize()
                ring.check()
            finally:
                nvshmem.barrier_all()
                ring.close()
            return f"{ring.ctas} CTAs"
        r(f"ring.{nbytes}B", ring_case)

    dst = nvshmem.zeros(16, "uint8")
    sig = nvshmem.zeros(1, "uint64")
    local = torch.zeros(16, dtype=torch.uint8, device="cuda")
    params = (nk.symmetric("dst", "uint8"), nk.pointer("src", "uint8"), nk.value("nbytes", "uint64"),
              nk.symmetric("signal", "uint64"), nk.value("done", "uint64"), nk.value("iters", "int32"))
    kernel = library.kernel("ring_exchange", *params)
    r("refuse.local_memory_as_symmetric",
      lambda: refused(lambda: kernel.launch(local, local, 16, sig, 0, 1, grid=1, block=32, stream=stream),
                      "not in NVSHMEM's symmetric heap"))
    r("refuse.peer_view_as_symmetric",
      lambda: refused(lambda: kernel.launch(dst.peer(nvshmem.my_pe()), local, 16, sig, 0, 1, grid=1, block=32),
                      "PeerArray"))
    r("refuse.wrong_dtype",
      lambda: refused(lambda: kernel.launch(dst, local.view(torch.int8), 16, sig, 0, 1, grid=1, block=32),
                      "declared uint8"))
    wrong_pes = library.kernel("ring_exchange", *params, n_pes=nvshmem.n_pes() + 1)
    r("refuse.pe_count", lambda: refused(lambda: wrong_pes.launch(dst, local, 16, sig, 0, 1, grid=1, block=32),
                                         "written for"))
    r("refuse.declaration_sizes",
      lambda: refused(lambda: library.kernel("ring_exchange", *params[:-1], nk.value("iters", "int64")), "bytes"))
    r("refuse.unknown_kernel", lambda: refused(lambda: library.kernel("nowhere"), "has no kernel"))

    marks = torch.zeros(1024, dtype=torch.int32, device="cuda")
    barrier = library.kernel("barrier_then_mark", nk.pointer("mark", "int32"), collective=True)
    r("refuse.plain_launch_of_a_collective_kernel",
      lambda: refused(lambda: barrier.launch(marks, grid=1, block=64), "launch_collective"))
    r("refuse.collective_grid_too_large",
      lambda: refused(lambda: barrier.launch_collective(marks, grid=10**6, block=64), "resident"))

    def collective() -> str:
        grid = barrier.launch_collective(marks, block=64, grid=4, stream=stream)
        stream.synchronize()
        got = marks[:4].tolist()
        expect(got == [nvshmem.my_pe() + 1] * 4, f"marks {got}")
        return f"grid {grid}, largest {barrier.max_collective_grid(64)}, via " + (
            "nvshmemx_collective_launch" if nk._flat_collective_launch() else "a cooperative launch")
    r("collective.barrier_kernel", collective)
    r("collective.grid_0_is_the_largest", lambda: str(barrier.launch_collective(marks, block=64, stream=stream)))
    stream.synchronize()

    def dropped() -> str:
        again = cubin.load()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            del again
            gc.collect()
        expect(any(issubclass(w.category, ResourceWarning) for w in seen), "no ResourceWarning")
        expect(nk.drain() == 1, "drain() released nothing")
        return "warned, released by drain()"
    r("lifetime.dropped_library", dropped)

    def dropped_then_process_drain() -> str:
        again = cubin.load()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            del again
            gc.collect()
        ran = mpbind.drain()  # collective (every PE calls it): unloads the kernel library first
        expect(ran >= 1 and nk.drain() == 0, f"mpbind.drain() ran {ran} releases and left the library parked")
        return f"mpbind.drain() ran {ran}"
    r("lifetime.dropped_library_process_drain", dropped_then_process_drain)

    library.close()
    r("lifetime.closed_library", lambda: refused(lambda: kernel.launch(dst, local, 16, sig, 0, 1, grid=1, block=32),
                                                 "closed"))
    nvshmem.barrier_all()  # every PE got here: no refusal left a PE waiting
    r("barrier.after_refusals", lambda: None)
    dst.free()
    sig.free()


if __name__ == "__main__":
    sys.exit(main(__doc__ or "", run))
