"""A collective matmul: ``out = all_gather(x, rows) @ w`` with the gather overlapped with the GEMMs
(NVSHMEM puts with signals around a bidirectional ring; the GEMMs are ``torch.matmul``), checked
against the unsharded product.

Two PEs, one per GPU::

    mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python examples/collective_matmul.py [--method host|kernel]

Several PEs on one GPU (``--one-gpu``) need NVSHMEM's full multi-PE-per-GPU mode: CUDA MPS with an
active-thread limit per client (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, passed with ``mpirun -x``).

Every PE makes the same x of every PE (seeded by the PE number), so that it can compute the
unsharded product itself. Prints ``collective_matmul pe=<k> <dtype> <method> ok max_err=<e>``;
exit status 1 when a result is off. ``benchmarks/collective_matmul.py`` times it against NCCL
all-gather + ``torch.matmul``, cuBLASMp and PyTorch's fused all-gather matmul.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def operands(pe: int, n_pes: int, m: int, k: int, n: int, dtype: Any) -> tuple[Any, Any, Any]:
    """(x of this PE, w of this PE, the gathered x): the same on every PE for a given seed."""
    import torch

    def rows(p: int) -> Any:
        g = torch.Generator(device="cuda").manual_seed(1000 + p)
        return torch.randn(m, k, generator=g, device="cuda", dtype=torch.float32).to(dtype)

    g = torch.Generator(device="cuda").manual_seed(7 + pe)
    w = (torch.randn(k, n, generator=g, device="cuda", dtype=torch.float32) / k**0.5).to(dtype)
    gathered = torch.cat([rows(p) for p in range(n_pes)])
    return rows(pe), w, gathered


def check(out: Any, gathered: Any, w: Any) -> float:
    """The largest error against the float32 product of the unsharded x, relative to its largest value;
    AssertionError above what the dtype's rounding explains."""
    want = gathered.float() @ w.float()
    err = float((out.float() - want).abs().max() / want.abs().max())
    limit = 2e-2 if out.dtype.itemsize == 2 else 1e-4
    if not err < limit:
        raise AssertionError(f"relative error {err:.3g} > {limit} against the unsharded product")
    return err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0")
    ap.add_argument("--method", choices=("host", "kernel"), default="host")
    ap.add_argument("--m", type=int, default=1024, help="rows of x per PE")
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096, help="columns of w per PE")
    a = ap.parse_args()
    import _pes

    import mpbind

    mpbind.load_libraries("nvshmem")  # before torch maps its own NVSHMEM: ours is then the one copy in the process
    import torch

    from mpbind import nvshmem
    from mpbind.collective import AllGatherMatmul

    comm, device = _pes.start(a.one_gpu)
    failed = 0
    with nvshmem.init(mpi_comm=comm, device=device) as rt:
        for dtype in (torch.float16, torch.bfloat16):
            x, w, gathered = operands(rt.my_pe, rt.n_pes, a.m, a.k, a.n, dtype)
            with AllGatherMatmul(a.m, a.k, a.n, dtype, method=a.method) as agmm:
                for _ in range(3):  # both buffer parities, and a call after them
                    out = agmm(x, w)
                torch.cuda.synchronize()
                try:
                    err = check(out, gathered, w)
                    print(f"collective_matmul pe={rt.my_pe} {agmm.dtype} {a.method} ok max_err={err:.2e}", flush=True)
                except AssertionError as exc:
                    failed += 1
                    print(f"collective_matmul pe={rt.my_pe} {agmm.dtype} {a.method} FAILED: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
