"""Kernels that call NVSHMEM, on every PE under mpirun.

    mpirun -np 2 python tests/gpu/nvshmem_kernels_suite.py --checks kernels             # a PE per GPU
    mpirun -np 3 python tests/gpu/nvshmem_kernels_suite.py --checks kernels --one-gpu   # 3 PEs on GPU 0 (MPS)
    mpirun -np 2 python tests/gpu/nvshmem_kernels_suite.py --checks collective_matmul [--method host|kernel]

``--checks kernels`` (mpbind.kernels): the ring exchange of examples/ring_exchange.py (8 B,
64 KiB, 16 MiB), a collectively launched kernel with a device-side barrier, and the refusals that
must come before any launch, identically on every PE (the PEs then still meet in a barrier).

``--checks collective_matmul`` (mpbind.collective): fp16 and bf16, several shapes, both
buffer parities, checked against the unsharded product; refusals on every PE alike. With PEs on
one GPU, run under an MPS daemon (NVSHMEM's full multi-PE-per-GPU mode), each PE with its share of
the SMs (``-x CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=33`` for three).

Each PE reports one line per check and a summary (tests/gpu/runner.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mpbind

mpbind.load_libraries("nvshmem")  # before torch maps its own NVSHMEM: ours is then the one copy in the process
import torch  # noqa: E402
from runner import Check, Checks, Report, expect, expect_raises, load_example, main  # noqa: E402

import mpbind.torch as mpt  # noqa: E402
from mpbind import _core, nvshmem  # noqa: E402
from mpbind import kernels as nk  # noqa: E402
from mpbind.bindings import nvshmem as flat_nvshmem  # noqa: E402
from mpbind.collective import AllGatherMatmul  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402


@dataclass
class Ctx:
    comm: Any
    method: str  # the collective matmul's: host or kernel


def refused(fn: Callable[[], object], match: str) -> str:
    """`fn()` raises UsageError mentioning `match`; its message, shortened, as the check's note."""
    return expect_raises(UsageError, fn, "the call", match)[:120]


# --- kernels that call NVSHMEM ------------------------------------------------------------------------------

KERNELS = Checks()

# Appended to the example's source, so that one compile serves every check.
BARRIER = r"""
extern "C" __global__ void barrier_then_mark(int* mark) {
    if (blockIdx.x == 0) nvshmemx_barrier_all_block();
    if (threadIdx.x == 0) mark[blockIdx.x] = nvshmem_my_pe() + 1;
}
"""


@KERNELS.cases
def kernel_checks(c: Ctx) -> Iterator[Check]:
    comm, ring_mod = c.comm, load_example("ring_exchange")
    stream = torch.cuda.Stream()
    source = ring_mod.SOURCE + BARRIER
    cubin = nk.compile(source, name="kernels_suite") if comm.Get_rank() == 0 else None
    comm.Barrier()
    cubin = cubin or nk.compile(source, name="kernels_suite")
    yield "build.cached_on_other_pes", lambda: f"cached={cubin.cached}, {len(cubin.code)} bytes, {cubin.arch}"
    library = cubin.load()
    yield "load.registered", lambda: expect(library.handle != 0, "no CUlibrary") or f"kernels {cubin.kernels}"

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
        yield f"ring.{nbytes}B", ring_case

    dst = nvshmem.zeros(16, "uint8")
    sig = nvshmem.zeros(1, "uint64")
    local = torch.zeros(16, dtype=torch.uint8, device="cuda")
    params = (nk.symmetric("dst", "uint8"), nk.pointer("src", "uint8"), nk.value("nbytes", "uint64"),
              nk.symmetric("signal", "uint64"), nk.value("done", "uint64"), nk.value("iters", "int32"))
    kernel = library.kernel("ring_exchange", *params)
    yield ("refuse.local_memory_as_symmetric",
           lambda: refused(lambda: kernel.launch(local, local, 16, sig, 0, 1, grid=1, block=32, stream=stream),
                           "not in NVSHMEM's symmetric heap"))
    yield ("refuse.peer_view_as_symmetric",
           lambda: refused(lambda: kernel.launch(dst.peer(nvshmem.my_pe()), local, 16, sig, 0, 1, grid=1, block=32),
                           "PeerArray"))
    yield ("refuse.wrong_dtype",
           lambda: refused(lambda: kernel.launch(dst, local.view(torch.int8), 16, sig, 0, 1, grid=1, block=32),
                           "declared uint8"))
    wrong_pes = library.kernel("ring_exchange", *params, n_pes=nvshmem.n_pes() + 1)
    yield "refuse.pe_count", lambda: refused(lambda: wrong_pes.launch(dst, local, 16, sig, 0, 1, grid=1, block=32),
                                             "written for")
    yield ("refuse.declaration_sizes",
           lambda: refused(lambda: library.kernel("ring_exchange", *params[:-1], nk.value("iters", "int64")), "bytes"))
    yield "refuse.unknown_kernel", lambda: refused(lambda: library.kernel("nowhere"), "has no kernel")

    marks = torch.zeros(1024, dtype=torch.int32, device="cuda")
    barrier = library.kernel("barrier_then_mark", nk.pointer("mark", "int32"), collective=True)
    yield ("refuse.plain_launch_of_a_collective_kernel",
           lambda: refused(lambda: barrier.launch(marks, grid=1, block=64), "launch_collective"))
    yield ("refuse.collective_grid_too_large",
           lambda: refused(lambda: barrier.launch_collective(marks, grid=10**6, block=64), "resident"))

    def collective() -> str:
        grid = barrier.launch_collective(marks, block=64, grid=4, stream=stream)
        stream.synchronize()
        got = marks[:4].tolist()
        expect(got == [nvshmem.my_pe() + 1] * 4, f"marks {got}")
        return f"grid {grid}, largest {barrier.max_collective_grid(64)}, via " + (
            "nvshmemx_collective_launch" if hasattr(flat_nvshmem, "collective_launch") else "a cooperative launch")
    yield "collective.barrier_kernel", collective
    yield "collective.grid_0_is_the_largest", lambda: str(barrier.launch_collective(marks, block=64, stream=stream))
    stream.synchronize()

    def dropped() -> str:
        again = cubin.load()
        serial = again.serial
        expect(("nvshmem.KernelLibrary", serial) in _core.alive(), "not a row of the core's table")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            del again
            gc.collect()
        expect(any(issubclass(w.category, ResourceWarning) for w in seen), "no ResourceWarning")
        expect(("nvshmem.KernelLibrary", serial) in mpbind.queued(), f"not in the core's queue: {mpbind.queued()}")
        expect(nk.drain() == 1, "drain() released nothing")  # the process drain: every PE calls it here
        return "warned, queued in the core, released by drain()"
    yield "lifetime.dropped_library", dropped

    def dropped_then_process_drain() -> str:
        again = cubin.load()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            del again
            gc.collect()
        ran = mpbind.drain()  # collective (every PE calls it): unloads the kernel library first
        expect(ran >= 1 and mpbind.queued() == [], f"mpbind.drain() ran {ran} releases and left {mpbind.queued()}")
        return f"mpbind.drain() ran {ran}"
    yield "lifetime.dropped_library_process_drain", dropped_then_process_drain

    library.close()
    yield ("lifetime.closed_library",
           lambda: refused(lambda: kernel.launch(dst, local, 16, sig, 0, 1, grid=1, block=32), "closed"))
    nvshmem.barrier_all()  # every PE got here: no refusal left a PE waiting
    yield "barrier.after_refusals", lambda: None
    dst.free()
    sig.free()


# --- the collective matmul ----------------------------------------------------------------------------------

COLLECTIVE_MATMUL = Checks()
SHAPES = ((256, 512, 384), (1024, 4096, 4096), (2, 64, 8), (255, 512, 384), (1, 64, 8))  # odd m: uneven halves


@COLLECTIVE_MATMUL.cases
def collective_matmul_checks(c: Ctx) -> Iterator[Check]:
    method, ex = c.method, load_example("collective_matmul")
    pe, n_pes = nvshmem.my_pe(), nvshmem.n_pes()
    # With PEs sharing a GPU under an MPS thread limit, cuBLAS gets some small fp16/bf16 GEMMs wrong by
    # itself (AllGatherMatmul's docstring): there the ring is checked with a float32 GEMM, and the default
    # GEMM once, at a shape cuBLAS gets right.
    shared = nvshmem.pes_sharing_this_gpu() > 1
    if nvshmem.runtime().limited_mpg:  # no MPS thread limit: the plan's agreement (fcollect) is refused alike
        yield "refuse.limited_mpg", lambda: refused(lambda: AllGatherMatmul(64, 128, 32, "float16", method=method),
                                                    "limited multi-PE-per-GPU mode")
        nvshmem.barrier_all()
        yield "barrier.after_refusals", lambda: None
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
        yield f"{method}.{str(dtype).split('.')[-1]}.{m}x{k}x{n}{kind}", case

    x, w, _ = ex.operands(pe, n_pes, 64, 128, 32, torch.float16)
    with AllGatherMatmul(64, 128, 32, "float16", method=method, gemm=exact_gemm if shared else None) as agmm:
        yield "refuse.x_shape", lambda: refused(lambda: agmm(x[:32], w), "x must be [64, 128]")
        yield "refuse.w_dtype", lambda: refused(lambda: agmm(x, w.to(torch.bfloat16)), "w")
        yield "refuse.out_shape", lambda: refused(lambda: agmm(x, w, out=torch.empty(64, 32, dtype=torch.float16,
                                                                                      device="cuda")), "out must be")
        yield "refuse.x_not_contiguous", lambda: refused(lambda: agmm(x.t().contiguous().t(), w), "x")
        yield "after_refusals.still_works", lambda: ex.check(agmm(x, w), torch.cat(
            [ex.operands(p, n_pes, 64, 128, 32, torch.float16)[0] for p in range(n_pes)]), w) and None
    with AllGatherMatmul(64, 128, 32, "float16", method=method, gemm=exact_gemm if shared else None) as agmm:
        def operator() -> str:
            """mpbind.torch.all_gather_matmul, eager and compiled (fullgraph), gives the plan's own result;
            a capture is refused before anything is queued."""
            ref = agmm(x, w).clone()
            eager = mpt.all_gather_matmul(x, w, agmm)
            step = torch.compile(lambda a, b: mpt.all_gather_matmul(a, b, agmm), fullgraph=True, backend="aot_eager")
            compiled = step(x, w)
            torch.cuda.synchronize()
            expect(torch.equal(eager, ref) and torch.equal(compiled, ref), "the operator differs from the plan")
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                text = expect_raises(UsageError, lambda: _captured(graph, x, w, agmm), "a capture", "CUDA graph")
            mpt.forget(agmm)
            return f"eager and compiled equal the plan's; {text[:60]}"

        yield "torch_operator.eager_compiled_refused_in_capture", operator
    # Arguments that differ between PEs, or that one PE refuses: the same error on every PE.
    yield "refuse.n_differs", lambda: refused(
        lambda: AllGatherMatmul(64, 128, 32 + 32 * (pe == n_pes - 1), "float16"), "same arguments on every PE")
    yield "refuse.m_differs", lambda: refused(lambda: AllGatherMatmul(64 + (pe == 0), 128, 32, "float16"),
                                              "same arguments on every PE")
    yield "refuse.bad_m_on_one_pe", lambda: refused(lambda: AllGatherMatmul(64 - 64 * (pe == 0), 128, 32, "float16"),
                                                    "refused on PE 0")
    nvshmem.barrier_all()
    yield "barrier.after_refusals", lambda: None


def _captured(graph: Any, x: Any, w: Any, agmm: Any) -> None:
    with torch.cuda.graph(graph):
        mpt.all_gather_matmul(x, w, agmm)


def exact_gemm(a: Any, b: Any, out: Any) -> None:
    """``out = a @ b`` computed in float32 (the GEMM the suite trusts on a GPU shared under MPS)."""
    out.copy_(torch.matmul(a.float(), b.float()))


# --- the run ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    """NVSHMEM on this PE's GPU (the examples' PE placement, NVLink multicast off), finalised after."""
    comm, device = load_example("_pes").start(args.one_gpu)
    with nvshmem.init(mpi_comm=comm, device=device):
        yield Ctx(comm, args.method)


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--checks", choices=("kernels", "collective_matmul"), default="kernels")
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0 (several PEs share it)")
    ap.add_argument("--method", choices=("host", "kernel"), default="host", help="the collective matmul's")


if __name__ == "__main__":
    sys.exit(main(__doc__, started, lambda args: COLLECTIVE_MATMUL if args.checks == "collective_matmul" else KERNELS,
                  arguments=arguments, timeout=540.0))
