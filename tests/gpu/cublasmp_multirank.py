"""Multi-rank checks of the flat cuBLASMp bindings, every result compared with torch.

    mpirun -np N python tests/gpu/cublasmp_multirank.py

One rank per GPU (NCCL allows no more): rank r uses local GPU ``local_rank``. All ranks build
the same seeded global matrices, hand cuBLASMp their local parts, gather the distributed result
over MPI and compare it with ``torch.matmul`` of the gathered global operands (float64). Each
rank prints one line per check

    PASS name [rank k]            the check held (a note may follow a colon)
    FAIL name [rank k]: reason    it did not
    SKIP name [rank k]: reason    it cannot run here
    INFO name [rank k]: text      a recorded fact

and closes with ``rank=<k> passed=<p> failed=<f> skipped=<s>``; the exit status is 1 when
anything failed.

Layouts and the library calls: ``cublasmp_cases.py`` (shared with ``raw_multirank.py``).
"""

from __future__ import annotations

import faulthandler
import os
import sys
from typing import Any

# Before anything loads CUDA or NCCL in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402
from cublasmp_cases import (  # noqa: E402
    CO,
    SEED,
    SUMMA_SHAPE,
    SUMMA_TYPES,
    Dist,
    Env,
    TpCase,
    check_all,
    gather_parts,
    matmul_tn,
    summa_dists,
    summa_gemm,
    tp_case,
)
from mpi4py import MPI  # noqa: E402
from rank_per_gpu import finish, local_gpu  # noqa: E402
from suite_report import Report  # noqa: E402

from mpbind.bindings import cublasmp, nccl  # noqa: E402


def scatter(global_: Any, dist: Dist, dtype: Any) -> Any:
    """This rank's local part of `global_` as column-major device storage (shape ``(lc, lr)``)."""
    rows, cols = dist.local_rows(), dist.local_cols()
    assert len(rows) == cublasmp.numroc(dist.rows, dist.mb, dist.prow, 0, dist.nprow)
    assert len(cols) == cublasmp.numroc(dist.cols, dist.nb, dist.pcol, 0, dist.npcol)
    local = global_[rows][:, cols]
    return local.t().contiguous().to(device="cuda", dtype=dtype)


def gather(comm: Any, local_buf: Any, dist: Dist) -> Any:
    """The global float64 matrix assembled from every rank's column-major local part."""
    return torch.from_numpy(gather_parts(comm, local_buf.t().to(torch.float64).cpu().numpy(), dist))


def random_matrix(shape: tuple[int, int], seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1


def expect_close(out: Any, ref: Any, atol: float, rtol: float, what: str) -> str:
    if torch.isnan(out).any():
        raise AssertionError(f"{what}: the gathered result has elements nobody wrote")
    err = (out - ref).abs()
    if bool((err > atol + rtol * ref.abs()).any()):
        raise AssertionError(f"{what}: max |error| {float(err.max()):.3g} > atol {atol:g} + rtol {rtol:g} * |ref|")
    return f"max |error| {float(err.max()):.2e}"


TYPES: dict[str, tuple[Any, cublasmp.CudaDataType, float, float]] = {
    # torch dtype, CUDA data type, atol, rtol (D rounded to the data type, fp32 accumulation)
    "bf16": (torch.bfloat16, cublasmp.CudaDataType.R_16BF, 3e-2, 1e-2),
    "fp16": (torch.float16, cublasmp.CudaDataType.R_16F, 8e-3, 2e-3),
}
SUMMA_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def tp_matmul(env: Env, kind: str, type_name: str) -> str:
    """AllGather+GEMM (kind 'ag') or GEMM+ReduceScatter (kind 'rs'), TN, through cublasMpMatmul."""
    dtype, cuda_type, atol, rtol = TYPES[type_name]
    case: TpCase = tp_case(env, kind)
    m, n, k, dist_a, dist_b, dist_d = case[:6]
    a_op = random_matrix((m, k), SEED).to(dtype).to(torch.float64)  # op(A) = A^T, rounded
    b = random_matrix((k, n), SEED + 1).to(dtype).to(torch.float64)
    a_stored = a_op.t()  # A, k x m
    a_buf = scatter(a_stored, dist_a, dtype)
    b_buf = scatter(b, dist_b, dtype)
    d_buf = scatter(torch.full((m, n), float("nan"), dtype=torch.float64), dist_d, dtype)
    matmul_tn(env, case, cuda_type, a_buf.data_ptr(), b_buf.data_ptr(), d_buf.data_ptr())
    out = gather(env.mpi, d_buf, dist_d)
    got_a = gather(env.mpi, a_buf, dist_a)
    got_b = gather(env.mpi, b_buf, dist_b)
    if not (torch.equal(got_a, a_stored) and torch.equal(got_b, b)):
        raise AssertionError("the gathered operands differ from the global ones (distribution helper)")
    ref = torch.matmul(got_a.t(), got_b)
    return expect_close(out, ref, atol, rtol, f"{kind} {type_name}")


def summa(env: Env, label: str, transa: cublasmp.CublasOperation) -> str:
    """C = alpha op(A) B + beta C with gemm on a 2-D block-cyclic grid."""
    _, cuda_type, compute, atol, rtol = next(t for t in SUMMA_TYPES if t[0] == label)
    dtype = SUMMA_DTYPES[label]
    m, n, k, _ = SUMMA_SHAPE
    a_op = random_matrix((m, k), SEED + 10)
    a_stored = a_op if transa == CO.N else a_op.t()
    b = random_matrix((k, n), SEED + 11)
    c = random_matrix((m, n), SEED + 12)
    dists = summa_dists(env, tuple(a_stored.shape))
    dist_a, dist_b, dist_c = dists[:3]
    a_buf, b_buf, c_buf = scatter(a_stored, dist_a, dtype), scatter(b, dist_b, dtype), scatter(c, dist_c, dtype)
    summa_gemm(env, dists, cuda_type, compute, transa, a_buf.data_ptr(), b_buf.data_ptr(), c_buf.data_ptr())
    out = gather(env.mpi, c_buf, dist_c)
    got_a = gather(env.mpi, a_buf, dist_a)
    got_b = gather(env.mpi, b_buf, dist_b)
    a_ref = got_a if transa == CO.N else got_a.t()
    ref = 1.25 * torch.matmul(a_ref, got_b) - 0.5 * c.to(dtype).to(torch.float64)
    return expect_close(out, ref, atol, rtol, "summa gemm")


# --- main ----------------------------------------------------------------------------------


def main() -> int:
    faulthandler.enable()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    report = Report(rank, who="rank", tracebacks="CUBLASMP_SUITE_TRACEBACKS")
    local_rank = local_gpu(world, report, torch.cuda.device_count())
    torch.cuda.set_device(local_rank)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    uid = nccl.UniqueId(world.bcast(bytes(nccl.get_unique_id()) if rank == 0 else None, root=0))
    comm = nccl.comm_init_rank(size, uid, rank)
    handle = cublasmp.create(int(stream.cuda_stream))
    env = Env(world, rank, size, comm, handle, stream.synchronize)
    report.line("INFO", "setup", f"{size} ranks, GPU {local_rank}, cuBLASMp {cublasmp.get_version()}, "
                                 f"NCCL {nccl.get_version()}")
    try:
        check_all(report, env, list(TYPES), lambda kind, t: tp_matmul(env, kind, t),
                  lambda label, transa: summa(env, label, transa))
    finally:
        torch.cuda.synchronize()
        env.close()
    return finish(world, report)


if __name__ == "__main__":
    sys.exit(main())
