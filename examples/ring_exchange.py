"""A ring exchange from inside a kernel: every PE puts a block into the next PE's symmetric buffer
with a signal, then waits for the block of the previous PE, and checks it.

The kernel is CUDA C++ that calls NVSHMEM's device API, compiled, linked, loaded and launched with
``mpbind.kernels``. Two PEs, one per GPU::

    mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python examples/ring_exchange.py

Three PEs sharing one GPU (under CUDA MPS: ``nvidia-cuda-mps-control -d`` first)::

    mpirun --allow-run-as-root --oversubscribe -np 3 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x CUDA_MPS_PIPE_DIRECTORY python examples/ring_exchange.py --one-gpu

Each PE prints ``ring_exchange pe=<k> bytes=<n> ok``; the exit status is 1 when a check failed.
``benchmarks/nvshmem_ring_exchange.py`` times the same kernel against nvshmem4py's Numba version.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

# The kernel: the CTAs split the block; each puts its slice with a signal that adds 1 (so the
# receiver knows every slice arrived once the signal reaches the CTA count), then waits for the
# slices of the previous PE. `done` counts the exchanges that happened before (the signal only
# grows), `iters` exchanges run back to back (for timing).
SOURCE = r"""
#include <nvshmem.h>
#include <nvshmemx.h>

extern "C" __global__ void ring_exchange(char* dst, const char* src, unsigned long long nbytes,
                                         uint64_t* signal, unsigned long long done, int iters) {
    const int next = (nvshmem_my_pe() + 1) % nvshmem_n_pes();
    const unsigned long long per = (nbytes + gridDim.x - 1) / gridDim.x;
    const unsigned long long begin = min(nbytes, blockIdx.x * per);
    const unsigned long long end = min(nbytes, begin + per);
    for (int it = 0; it < iters; ++it) {
        if (end > begin) {
            nvshmemx_putmem_signal_nbi_block(dst + begin, src + begin, end - begin, signal, 1,
                                             NVSHMEM_SIGNAL_ADD, next);
        } else if (threadIdx.x == 0) {
            nvshmemx_signal_op(signal, 1, NVSHMEM_SIGNAL_ADD, next);
        }
        if (threadIdx.x == 0) {
            nvshmem_signal_wait_until(signal, NVSHMEM_CMP_GE, (done + it + 1) * gridDim.x);
        }
        __syncthreads();
    }
}
"""

#: How many CTAs share a block: one per 512 KiB, at most 32.
MAX_CTAS = 32
BYTES_PER_CTA = 512 * 1024


def ctas_for(nbytes: int) -> int:
    return max(1, min(MAX_CTAS, math.ceil(nbytes / BYTES_PER_CTA)))


def build(arch: str | None = None) -> Any:
    """The linked cubin (no GPU needed)."""
    from mpbind import kernels as nk

    return nk.compile(SOURCE, name="ring_exchange", arch=arch)


def pattern(pe: int, nbytes: int) -> Any:
    """What PE `pe` sends: bytes that differ between PEs and along the block."""
    import torch

    return ((torch.arange(nbytes, dtype=torch.int64, device="cuda") * 7 + pe * 31) % 251).to(torch.uint8)


class RingExchange:
    """Symmetric buffers of one block size and the loaded kernel; `run` exchanges, `check` verifies."""

    def __init__(self, library: Any, nbytes: int) -> None:
        import torch

        from mpbind import kernels as nk
        from mpbind import nvshmem

        self.nbytes = nbytes
        self.pe, self.n_pes = nvshmem.my_pe(), nvshmem.n_pes()
        self.src = nvshmem.empty(nbytes, "uint8")
        self.dst = nvshmem.zeros(nbytes, "uint8")
        self.signal = nvshmem.zeros(1, "uint64")
        torch.from_dlpack(self.src).copy_(pattern(self.pe, nbytes))
        self.kernel = library.kernel(
            "ring_exchange", nk.symmetric("dst", "uint8"), nk.pointer("src", "uint8"), nk.value("nbytes", "uint64"),
            nk.symmetric("signal", "uint64"), nk.value("done", "uint64"), nk.value("iters", "int32"))
        # Each CTA waits for every CTA of the previous PE: all of them must be resident at once, so
        # no more than the co-resident grid (a part of the GPU where PEs share it under MPS; 32 CTAs
        # of 8 PEs there hung). The same on every PE, so every PE splits the block alike.
        self.ctas = min(ctas_for(nbytes), self.kernel.max_collective_grid(512))
        self.done = 0
        torch.cuda.synchronize()
        nvshmem.barrier_all()

    def run(self, iters: int = 1, stream: Any = None) -> None:
        self.kernel.launch(self.dst, self.src, self.nbytes, self.signal, self.done, iters,
                           grid=self.ctas, block=512, stream=stream)
        self.done += iters

    def check(self) -> None:
        import torch

        want = pattern((self.pe - 1) % self.n_pes, self.nbytes)
        got = torch.from_dlpack(self.dst)
        if not torch.equal(got, want):
            bad = int((got != want).sum())
            raise AssertionError(f"pe {self.pe}: {bad} of {self.nbytes} bytes differ from PE "
                                 f"{(self.pe - 1) % self.n_pes}'s block")

    def close(self) -> None:
        for a in (self.src, self.dst, self.signal):
            a.free()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0 (several PEs share it)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64 * 1024, 16 * 1024 * 1024])
    a = ap.parse_args()
    import _pes

    import mpbind

    mpbind.load_libraries("nvshmem")  # before torch maps its own NVSHMEM: ours is then the one copy in the process
    import torch

    from mpbind import nvshmem

    comm, device = _pes.start(a.one_gpu)
    cubin = build() if comm.Get_rank() == 0 else None  # one compile; the others read the cache
    comm.Barrier()
    cubin = cubin or build()
    failed = 0
    with nvshmem.init(mpi_comm=comm, device=device) as rt, cubin.load() as library:
        stream = torch.cuda.Stream()
        for nbytes in a.sizes:
            ring = RingExchange(library, nbytes)
            try:
                ring.run(stream=stream)
                stream.synchronize()
                ring.check()
                print(f"ring_exchange pe={rt.my_pe} bytes={nbytes} ok", flush=True)
            except AssertionError as exc:
                failed += 1
                print(f"ring_exchange pe={rt.my_pe} bytes={nbytes} FAILED: {exc}", flush=True)
            finally:
                nvshmem.barrier_all(stream)
                stream.synchronize()
                ring.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
