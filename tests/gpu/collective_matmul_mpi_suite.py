"""The collective matmul (mpbind.collective_matmul) on every PE under mpirun: fp16 and bf16, several
shapes, both buffer parities, checked against the unsharded product; refusals on every PE alike.

    mpirun -np 2 python tests/gpu/collective_matmul_mpi_suite.py [--method host|kernel]
    mpirun -np 3 -x CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=33 python tests/gpu/collective_matmul_mpi_suite.py --one-gpu
        # three PEs on GPU 0 (an MPS daemon running): NVSHMEM's full multi-PE-per-GPU mode

Prints ``PASS``/``FAIL``/``SKIP name [pe k]`` lines and ``pe=<k> passed=<p> failed=<f> skipped=<s>``.
"""

from __future__ import annotations

import sys
from typing import Any

import mpbind

mpbind.load_libraries("nvshmem")  # before torch maps its own NVSHMEM: ours is then the one copy in the process
import torch  # noqa: E402
from kernel_suite import load_example, main, refused  # noqa: E402
from suite_report import Report  # noqa: E402

from mpbind import nvshmem  # noqa: E402
from mpbind.collective_matmul import AllGatherMatmul  # noqa: E402

SHAPES = ((256, 512, 384), (1024, 4096, 4096), (2, 64, 8))


def run(report: Report, a: Any) -> None:
    r = report.check
    method, ex = a.method, load_example("collective_matmul")
    pe, n_pes = nvshmem.my_pe(), nvshmem.n_pes()
    # With PEs sharing a GPU under an MPS thread limit, cuBLAS gets some small fp16/bf16 GEMMs wrong by
    # itself (AllGatherMatmul's docstring): there the ring is checked with a float32 GEMM, and the default
    # GEMM once, at a shape cuBLAS gets right.
    shared = nvshmem._pes_sharing_this_gpu() > 1
    if nvshmem.runtime().limited_mpg:  # no MPS thread limit: the plan's agreement (fcollect) is refused alike
        r("refuse.limited_mpg", lambda: refused(lambda: AllGatherMatmul(64, 128, 32, "float16", method=method),
                                                "limited multi-PE-per-GPU mode"))
        nvshmem.barrier_all()
        r("barrier.after_refusals", lambda: None)
        return
    cases = [(dtype, shape, exact_gemm if shared else None) for dtype in (torch.float16, torch.bfloat16)
             for shape in SHAPES]
    if shared:
        cases.append((torch.float16, (1024, 4096, 4096), None))
    for dtype, (m, k, n), gemm in cases:
        def case(m: int = m, k: int = k, n: int = n, dtype: Any = dtype, gemm: Any = gemm) -> str:
            x, w, gathered = ex.operands(pe, n_pes, m, k, n, dtype)
            with AllGatherMatmul(m, k, n, dtype, method=method, gemm=gemm) as agmm:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())  # x and w were made on the default stream
                with torch.cuda.stream(stream):
                    outs = [agmm(x, w) for _ in range(3)]  # parities 1, 0, 1
                stream.synchronize()
                errs = [ex.check(out, gathered, w) for out in outs]
            return f"max relative error {max(errs):.2e}"
        kind = "" if gemm is None else ".float32_gemm"
        r(f"{method}.{str(dtype).split('.')[-1]}.{m}x{k}x{n}{kind}", case)

    x, w, _ = ex.operands(pe, n_pes, 64, 128, 32, torch.float16)
    with AllGatherMatmul(64, 128, 32, "float16", method=method, gemm=exact_gemm if shared else None) as agmm:
        r("refuse.x_shape", lambda: refused(lambda: agmm(x[:32], w), "x must be [64, 128]"))
        r("refuse.w_dtype", lambda: refused(lambda: agmm(x, w.to(torch.bfloat16)), "w"))
        r("refuse.out_shape", lambda: refused(lambda: agmm(x, w, out=torch.empty(64, 32, dtype=torch.float16,
                                                                                  device="cuda")), "out must be"))
        r("refuse.x_not_contiguous", lambda: refused(lambda: agmm(x.t().contiguous().t(), w), "x"))
        r("after_refusals.still_works", lambda: ex.check(agmm(x, w), torch.cat(
            [ex.operands(p, n_pes, 64, 128, 32, torch.float16)[0] for p in range(n_pes)]), w) and None)
    # Arguments that differ between PEs, or that one PE refuses: the same error on every PE.
    r("refuse.n_differs", lambda: refused(lambda: AllGatherMatmul(64, 128, 32 + 32 * (pe == n_pes - 1), "float16"),
                                          "same arguments on every PE"))
    r("refuse.odd_m_on_one_pe", lambda: refused(lambda: AllGatherMatmul(64 + (pe == 0), 128, 32, "float16"),
                                                "refused on PE 0"))
    nvshmem.barrier_all()
    r("barrier.after_refusals", lambda: None)


def exact_gemm(a: Any, b: Any, out: Any) -> None:
    """``out = a @ b`` computed in float32 (the GEMM the suite trusts on a GPU shared under MPS)."""
    out.copy_(torch.matmul(a.float(), b.float()))


def arguments(ap: Any) -> None:
    ap.add_argument("--method", choices=("host", "kernel"), default="host")


if __name__ == "__main__":
    sys.exit(main(__doc__ or "", run, arguments))
