"""The Pythonic NCCL and cuBLASMp layer on 2 or 4 ranks, one GPU each, every result checked.

    mpirun -np N python tests/gpu/layer_multirank.py

Collectives of ``mpbind.nccl.Communicator`` against NumPy, windows, rank-consistent teardown of
communicators dropped in a different order on each rank, and a 2-D block-cyclic matmul built only
from ``mpbind.cublasmp`` (cached grids, ``Matrix``, ``Matmul``) against torch.matmul. Output
lines and the summary (``rank=<r> passed=<p> failed=<f> skipped=<s>``) follow
``cublasmp_multirank.py``, whose reporting and distribution helpers this suite shares.
"""

from __future__ import annotations

import faulthandler
import functools
import gc
import sys
import warnings
from typing import Any

import numpy as np
import torch
from cublasmp_cases import grid_position
from cublasmp_multirank import Dist, expect_close, gather, random_matrix
from mpi4py import MPI
from rank_per_gpu import rank_per_gpu
from suite_report import Report, Skip

from mpbind import cublasmp, nccl

SEED = 97


def collectives(comm: nccl.Communicator, world: Any) -> str:
    r, p = comm.rank, comm.size
    x = torch.arange(12, dtype=torch.float32, device="cuda") + 100 * r
    out = torch.empty_like(x)
    comm.all_reduce(x, out)
    gathered = torch.empty(12 * p, device="cuda")
    comm.all_gather(x, gathered)
    rs = torch.empty(12 // p if 12 % p == 0 else 0, device="cuda")
    if rs.numel():
        comm.reduce_scatter(x, rs, op="max")
    a2a = torch.empty_like(x)
    comm.all_to_all(x, a2a)
    ring = torch.empty_like(x)
    with nccl.group():
        comm.send(x, peer=(r + 1) % p)
        comm.recv(ring, peer=(r - 1) % p)
    bcast = torch.empty_like(x)
    comm.broadcast(x, bcast, root=p - 1)
    torch.cuda.synchronize()
    base = np.arange(12, dtype=np.float32)
    every = [base + 100 * q for q in range(p)]
    np.testing.assert_array_equal(out.cpu().numpy(), sum(every))
    np.testing.assert_array_equal(gathered.cpu().numpy(), np.concatenate(every))
    if rs.numel():
        n = 12 // p
        np.testing.assert_array_equal(rs.cpu().numpy(), every[-1][r * n:(r + 1) * n])
    block = 12 // p
    expect_a2a = np.concatenate([every[q][r * block:(r + 1) * block] for q in range(p)]) if 12 % p == 0 else None
    if expect_a2a is not None:
        np.testing.assert_array_equal(a2a.cpu().numpy(), expect_a2a)
    np.testing.assert_array_equal(ring.cpu().numpy(), every[(r - 1) % p])
    np.testing.assert_array_equal(bcast.cpu().numpy(), every[-1])
    return f"{p} ranks"


def windows(comm: nccl.Communicator) -> str:
    buf = nccl.mem_alloc(1 << 21)
    try:
        w1 = comm.register_window(buf)
    except Exception as exc:  # noqa: BLE001 - the system may not offer symmetric windows
        raise Skip(f"ncclCommWindowRegister: {exc}") from None
    w2 = comm.register_window(buf)  # no second collective call: every rank does the same
    assert w1.handle == w2.handle and w1.references == 2
    w1.close()
    w2.close()  # the last reference: collective deregistration on every rank
    assert not comm.registrations()
    buf.close()
    return "one window, two references"


def teardown_order(comm: nccl.Communicator) -> str:
    subs = [comm.split(color=0, key=comm.rank) for _ in range(3)]
    serials = [s.serial for s in subs if s is not None]
    order = list(range(3)) if comm.rank % 2 == 0 else [2, 0, 1]  # dropped differently on each rank
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for i in order:
            subs[i] = None  # type: ignore[call-overload]
        gc.collect()
    queued = [s for kind, s in nccl.queued() if kind == "nccl.Communicator"]
    assert queued == sorted(serials, reverse=True), (queued, serials)
    ran = nccl.drain()  # the same order on every rank: no hang
    assert ran >= 3 and not nccl.queued()
    return f"{ran} released newest first"


def matmul_2d(comm: nccl.Communicator, handle: cublasmp.Handle, dtype: Any, atol: float, rtol: float) -> str:
    p = comm.size
    if p % 2:
        raise Skip(f"a 2-D grid needs an even number of ranks, not {p}")
    nprow, npcol = 2, p // 2
    grid = cublasmp.grid(comm, nprow, npcol)
    assert cublasmp.grid(comm, nprow, npcol).handle == grid.handle  # cached
    prow, pcol = grid_position(comm.rank, nprow, npcol, cublasmp.GridLayout.COL_MAJOR)
    m, n, k, mb = 96, 80, 64, 16
    a_g, b_g = random_matrix((m, k), SEED), random_matrix((k, n), SEED + 1)
    da, db, dd = (Dist(r, c, mb, mb, nprow, npcol, prow, pcol) for r, c in ((m, k), (k, n), (m, n)))

    def local(global_: Any, dist: Dist) -> Any:
        part = global_[dist.local_rows()][:, dist.local_cols()]
        return part.t().contiguous().to(device="cuda", dtype=dtype).t()  # column-major (lr x lc) view

    a, b = local(a_g, da), local(b_g, db)
    d = torch.zeros((len(dd.local_cols()), len(dd.local_rows())), device="cuda", dtype=dtype).t()
    ma = cublasmp.Matrix(grid, a, shape=(m, k), block=(mb, mb))
    mb_ = cublasmp.Matrix(grid, b, shape=(k, n), block=(mb, mb))
    md = cublasmp.Matrix(grid, d, shape=(m, n), block=(mb, mb))
    with cublasmp.Matmul(handle, ma, mb_, md) as plan:
        plan.execute()
    torch.cuda.synchronize()
    out = gather(MPI.COMM_WORLD, d.t(), dd)
    return expect_close(out, a_g.to(dtype).double() @ b_g.to(dtype).double(), atol, rtol, "D")


def close_order(comm_factory: Any) -> str:
    comm = comm_factory()
    grid = cublasmp.grid(comm, comm.size, 1)
    ws = cublasmp.Workspace(grid, 1 << 20)
    ws.serve([cublasmp.grid(comm, 1, comm.size)])
    comm.close()  # the workspace, then the grids, then the communicator: on every rank
    assert ws.closed and grid.closed
    return "workspace, grids, communicator"


def main() -> int:
    faulthandler.enable()
    report = Report(MPI.COMM_WORLD.Get_rank(), who="rank", tracebacks="CUBLASMP_SUITE_TRACEBACKS")
    with rank_per_gpu(report) as (world, comm, _, handle):
        report.check("nccl.collectives", functools.partial(collectives, comm, world))
        report.check("nccl.windows", functools.partial(windows, comm))
        report.check("nccl.teardown_order", functools.partial(teardown_order, comm))
        report.check("cublasmp.matmul_2d.fp32", functools.partial(matmul_2d, comm, handle, torch.float32, 1e-4, 1e-5))
        report.check("cublasmp.matmul_2d.fp64",
                     functools.partial(matmul_2d, comm, handle, torch.float64, 1e-11, 1e-11))
        report.check("cublasmp.close_order", functools.partial(close_order, lambda: nccl.Communicator.from_mpi(world)))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
