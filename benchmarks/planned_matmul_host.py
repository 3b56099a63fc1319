"""Host time of a planned distributed matmul and the cost of making the first plan, mpbind against
nvmath-python 1.0's distributed ``Matmul``, on two GPUs.

nvmath-python 1.0 pins cuBLASMp 0.9.1, so it runs in processes of its own: the command starts
four ranks in two groups (MPI's MPMD form), mpbind's two and nvmath's two, on the same two GPUs,
one group measuring while the other waits::

    timeout 600 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x LD_PRELOAD -x PYTHONPATH -x MPBIND_CUBLASMP_PATH \\
        -np 2 python benchmarks/planned_matmul_host.py [--out DIR] : \\
        -np 2 env PYTHONPATH="$NVMATH_SITE" LD_LIBRARY_PATH="$NVMATH_LIBS" \\
            python benchmarks/planned_matmul_host.py --nvmath

``NVMATH_SITE`` holds nvmath-python 1.0 and its pins (``stage-wheels.sh anchors``), ``NVMATH_LIBS``
the directory of their cuBLASMp 0.9.1 library; ``LD_PRELOAD`` names an NCCL of 2.29.2 or newer,
which both cuBLASMp versions need. Without the second group, nvmath's column says it did not run.
About 30 s.

Measured on each side, bf16 1024^3 (all-gather+GEMM: A and B split by columns, D by rows, TN,
the layout nvmath infers as AG+GEMM), the slowest rank of each:

* cold plan creation: the process's first plan (grids, workspace, registrations; the libraries
  and the NCCL communicator already loaded and made, and the communicator's first collective,
  where NCCL sets up its connections, timed before it on its own): ``mpbind.matmul.plan`` against
  nvmath's ``Matmul(...)`` + ``plan()``; then a second plan of the same shapes (warm);
* host time per ``execute()``, not captured: the median of ``--calls`` calls, the GPU drained
  before each (outside the timed window), as nvmath's figures were measured; mpbind also captured,
  the same ``cublasMpMatmul`` called through the flat binding (the library's own host time), and a
  plan of the same operands with ``NO_OVERLAP`` (all-gather, then one GEMM) not captured;
* each result checked against torch.matmul on the gathered operands.

Rank 0 prints a Markdown table and writes ``planned_matmul_host.csv`` and ``.png`` under ``--out``.
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

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
import torch  # noqa: E402
from _torch_gpu import mapped_nccl, relative_error  # noqa: E402
from mpi4py import MPI  # noqa: E402

# nvmath-python's processes never import mpbind (its own cuBLASMp must be the only one there):
# mpbind and the helpers built on it are imported in mpbind's processes only.

SIZE = 1024
HEADER = ["what", "mpbind", "nvmath-python 1.0", "mpbind / nvmath", "target"]


def host_us(fn: Callable[[], object], calls: int, warmup: int = 5) -> list[float]:
    """Microseconds of each call's host time, the GPU drained before each (not timed)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return out


def timed_ms(group: Any, make: Callable[[], Any]) -> tuple[Any, float]:
    """(what `make` returned, its wall time in ms on the slowest rank), the ranks aligned first."""
    torch.cuda.synchronize()
    group.Barrier()
    t0 = time.perf_counter()
    made = make()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return made, float(group.allreduce(ms, op=MPI.MAX))


def slowest(group: Any, values: list[float]) -> float:
    return float(group.allreduce(statistics.median(values), op=MPI.MAX))



# --- mpbind --------------------------------------------------------------------------------------------


class Phases:
    """Host time of the steps of making a plan, by step: the layer's constructors the planner calls,
    wrapped for the duration of a `with` (the benchmark's own instrument; the library is unchanged).
    `Matrix` keeps its identity (its ``__init__`` is wrapped: isinstance checks still hold); the core's
    classes (`Handle`, the plan) are wrapped where the layer finds them, which only a plan made with
    ``handle=None`` may do (nothing then checks an instance against them)."""

    STEPS = (("handle", "mpbind.cublasmp", "Handle"), ("grids", "mpbind.cublasmp", "grid"),
             ("matrices", "mpbind.cublasmp", "Matrix.__init__"),
             ("descriptor", "mpbind.matmul", "_descriptor"), ("plan", "mpbind._core.cublasmp", "MatmulPlan"))

    def __init__(self) -> None:
        self.ms: dict[str, float] = {name: 0.0 for name, _, _ in self.STEPS}
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Phases:
        import importlib

        for name, module, path in self.STEPS:
            owner: Any = importlib.import_module(module)
            *outer, attr = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            original = getattr(owner, attr)

            def timed(*args: Any, _f: Any = original, _n: str = name, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.ms[_n] += (time.perf_counter() - t0) * 1e3
            self._saved.append((owner, attr, original))
            setattr(owner, attr, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)


def flat_call(planned: Any, handle: Any) -> Callable[[], None]:
    """The plan's own ``cublasMpMatmul`` through the flat binding, with the plan's descriptors,
    operands and workspaces: the library's host time per call, which ``execute()`` cannot go below."""
    import ctypes

    from mpbind import _core, cublasmp
    from mpbind.bindings import cublasmp as flat

    mm, p = planned.matmul, planned.plan
    mats = planned.matrices
    compute = int(p.compute_type)
    scalars = [ctypes.create_string_buffer(cublasmp.scalar_bytes(v, compute), 16) for v in (p.alpha, p.beta)]
    device_bytes, host_bytes = mm.workspace_size
    work = _core.cublasmp.shared_workspace(mats["d"].grid, device_bytes).ptr if device_bytes else 0
    host = handle.host_workspace(host_bytes)

    def operand(name: str) -> tuple[int, int, int, int]:
        m = mats.get(name)
        return (0, 1, 1, 0) if m is None else (m.ptr, 1, 1, m.descriptor.ptr)

    args = (handle.ptr, mm.descriptor.ptr, mm.m, mm.n, mm.k, ctypes.addressof(scalars[0]), *operand("a"),
            *operand("b"), ctypes.addressof(scalars[1]), *operand("c"), *operand("d"), work, device_bytes, host,
            host_bytes)
    call = flat.matmul

    def run(_scalars: list[Any] = scalars) -> None:  # the scalars live as long as the call
        call(*args)

    return run


def mpbind_side(group: Any, calls: int) -> dict[str, Any]:
    import _tp

    from mpbind import cublasmp, matmul
    from mpbind._infra import loader as _loader

    _loader.load("cublasmp")  # the library loaded before timing, as nvmath's is at import
    ranks = _tp.start(group, port=29543)
    lay = _tp.layer(ranks, "ag", "bf16", SIZE, SIZE, SIZE)
    want = lay.reference()

    def make() -> matmul.PlannedMatmul:
        return lay.plan(handle=None, stream=ranks.stream)  # a handle of its own, as nvmath makes its own

    # The communicator's first collective sets up NCCL's connections (lazily, since NCCL 2.22); the
    # plan's agreement would be that collective. Timed on its own, so that the cold plan below is the
    # plan's own cost; each side's first execute is timed too, wherever nvmath-python's setup falls.
    probe = torch.zeros(group.Get_size(), dtype=torch.int64, device="cuda")
    _, first_collective_ms = timed_ms(group, lambda: ranks.comm.all_gather(probe[:1], probe, stream=ranks.stream))
    with Phases() as phases:  # where the first plan's time goes (the wrappers cost ~1 µs per step)
        cold, cold_ms = timed_ms(group, make)
    steps = {name: float(group.allreduce(ms, op=MPI.MAX)) for name, ms in phases.ms.items()}
    if cold.algorithm != "allgather_gemm":
        raise AssertionError(cold.explain())
    warm, warm_ms = timed_ms(group, make)
    # The overlapped algorithm does not replay from a graph: the captured figure is NO_OVERLAP's.
    captured_plan = lay.plan(handle=None, stream=ranks.stream, algo_type=cublasmp.MatmulAlgoType.NO_OVERLAP)
    _, first_ms = timed_ms(group, cold.execute)  # the process's first execute
    err = relative_error(lay.result(), want)
    direct = slowest(group, host_us(cold.execute, calls))
    handle = cublasmp.Handle(ranks.stream)  # the flat call's plan: one whose handle this side holds
    floor_plan = lay.plan(handle=handle, stream=ranks.stream)
    library = slowest(group, host_us(flat_call(floor_plan, handle), calls))
    floor_plan.execute()
    torch.cuda.synchronize()
    floor_err = relative_error(lay.result(), want)
    # NO_OVERLAP uncaptured: an all-gather then one GEMM, fewer launches than the overlapped ring;
    # whether the planner should choose it for small problems depends on this figure.
    no_overlap = slowest(group, host_us(captured_plan.execute, calls))
    torch.cuda.synchronize()
    no_overlap_err = relative_error(lay.result(), want)
    captured_plan.capture(ranks.stream)
    captured = slowest(group, host_us(captured_plan.execute, calls))
    torch.cuda.synchronize()
    captured_plan.close()
    floor_plan.close()
    handle.close()
    warm.close()
    cold.close()
    out = {"first_collective_ms": first_collective_ms, "cold_ms": cold_ms, "warm_ms": warm_ms, "execute_us": direct,
           "first_execute_ms": first_ms, "captured_us": captured, "rel_err": err,
           "library_us": library, "library_rel_err": floor_err, "no_overlap_us": no_overlap,
           "no_overlap_rel_err": no_overlap_err,
           "versions": _tp.header(ranks), "cold_steps_ms": steps}
    ranks.close()
    return out


# --- nvmath-python (its own processes) ----------------------------------------------------------------


def nvmath_side(group: Any, calls: int) -> dict[str, Any]:
    """nvmath-python 1.0's distributed Matmul on the same problem, measured the same way."""
    import numpy as np
    import nvmath
    import nvmath.distributed
    from nvmath.bindings import cublasMp
    from nvmath.distributed.distribution import BlockNonCyclic, ProcessGrid
    from nvmath.distributed.linalg.advanced import Matmul, matrix_qualifiers_dtype

    rank, p = group.Get_rank(), group.Get_size()
    device = group.Split_type(MPI.COMM_TYPE_SHARED).Get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(device)
    nvmath.distributed.initialize(device, group, backends=["nccl"])
    version = cublasMp.get_version()  # loads the library before timing
    g = torch.Generator(device="cuda").manual_seed(101 * rank)
    w = (torch.randn((SIZE // p, SIZE), generator=g, device="cuda") * SIZE**-0.5).to(torch.bfloat16)
    x = _nccl_memory((SIZE // p, SIZE))  # as nvmath's own figures were measured: B where it can register it
    x.copy_(torch.randn((SIZE // p, SIZE), generator=g, device="cuda").to(torch.bfloat16))
    qualifiers = np.zeros((3,), dtype=matrix_qualifiers_dtype)
    qualifiers[0]["is_transpose"] = True

    def make() -> Any:
        columns, rows = BlockNonCyclic(ProcessGrid(shape=(1, p))), BlockNonCyclic(ProcessGrid(shape=(p, 1)))
        mm = Matmul(w.T, x.T, distributions=[columns, columns, rows], qualifiers=qualifiers)
        mm.plan()
        return mm

    cold, cold_ms = timed_ms(group, make)
    warm, warm_ms = timed_ms(group, make)
    result, first_ms = timed_ms(group, cold.execute)  # the process's first execute
    gathered = torch.from_numpy(np.concatenate(group.allgather(x.float().cpu().numpy()))).cuda()
    want = w.float() @ gathered.T  # this rank's output features, every token
    err = relative_error(result, want)
    direct = slowest(group, host_us(cold.execute, calls))
    torch.cuda.synchronize()
    warm.free()
    cold.free()
    nvmath.distributed.finalize()
    return {"cold_ms": cold_ms, "warm_ms": warm_ms, "first_execute_ms": first_ms, "execute_us": direct, "rel_err": err,
            "versions": f"nvmath-python {nvmath.__version__}, cuBLASMp {version}; libnccl mapped: {mapped_nccl()}"}


_KEEP: list[Any] = []  # nccl4py buffers under nvmath's B


def _nccl_memory(shape: tuple[int, int]) -> Any:
    """A bf16 tensor on nccl4py's mem_alloc (VMM) memory, which nvmath registers with NCCL for B
    (torch memory when nccl4py has none to give)."""
    nbytes = shape[0] * shape[1] * 2
    try:
        import nccl.core

        buffer = nccl.core.mem_alloc(nbytes, torch.cuda.current_device())
        _KEEP.append(buffer)
        return torch.from_dlpack(buffer).view(torch.uint8)[:nbytes].view(torch.bfloat16).view(shape)
    except Exception:  # noqa: BLE001 - the figure is still nvmath's, on ordinary memory
        return torch.empty(shape, dtype=torch.bfloat16, device="cuda")


# --- the run ---------------------------------------------------------------------------------------------


def wait_quietly(world: Any) -> None:
    """Wait at a barrier without spinning a core (the other group is timing host calls)."""
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(0.01)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvmath", action="store_true", help="this process is one of nvmath-python's ranks")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()
    world = MPI.COMM_WORLD
    flags = world.allgather(a.nvmath)
    group = world.Split(int(a.nvmath), world.Get_rank())
    if a.nvmath:
        try:
            import nvmath.distributed  # noqa: F401 - imported before anyone measures
        except Exception:  # noqa: BLE001 - reported when its turn comes
            pass
    wait_quietly(world)  # every process started and imported
    ours: dict[str, Any] = {}
    theirs: dict[str, Any] = {"unavailable": "not run: start nvmath-python's ranks as the second group (see above)"}
    if not a.nvmath:
        ours = mpbind_side(group, a.calls)
    wait_quietly(world)
    if a.nvmath:
        try:
            theirs = nvmath_side(group, a.calls)
        except Exception as exc:  # noqa: BLE001 - reported next to mpbind's figures
            theirs = {"unavailable": f"{type(exc).__name__}: {exc}"[:300]}
    wait_quietly(world)
    if any(flags):
        first = flags.index(True)
        if world.Get_rank() == first:
            world.send(theirs, dest=0)
        if world.Get_rank() == 0:
            theirs = world.recv(source=first)
    if world.Get_rank() != 0:
        return 0
    rows = report(ours, theirs)
    print(f"mpbind: {ours['versions']}")
    if "cold_steps_ms" in ours:  # the slowest rank per step
        steps = ours["cold_steps_ms"]
        other = ours["cold_ms"] - sum(steps.values())
        print("mpbind's cold plan by step (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in steps.items()) +
              f", the rest {other:.1f}")
    if "library_rel_err" in ours:
        print(f"the flat cublasMpMatmul's result against torch: {ours['library_rel_err']:.2e}")
    if "no_overlap_rel_err" in ours:
        print(f"the NO_OVERLAP plan's result against torch: {ours['no_overlap_rel_err']:.2e}")
    print(f"nvmath: {theirs.get('versions', theirs.get('unavailable'))}")
    print(_results.table(HEADER, rows))
    _results.write_csv(a.out / "planned_matmul_host.csv", HEADER, rows)
    bars: dict[str, tuple[list[float], list[float]]] = {"mpbind": ([], []), "nvmath-python": ([], [])}
    for i, row in enumerate((rows[1], rows[2], rows[4])):  # cold plan, warm plan, execute
        for name, col in (("mpbind", 1), ("nvmath-python", 2)):
            if isinstance(row[col], float):
                bars[name][0].append(i + 1)
                bars[name][1].append(row[col])
    if _results.plot(a.out / "planned_matmul_host.png", "1: cold plan (ms), 2: warm plan (ms), 3: execute (us)",
                     "measure", [("ms / us", bars)], log_x=False):
        print(f"wrote {a.out / 'planned_matmul_host.png'}")
    print(f"wrote {a.out / 'planned_matmul_host.csv'}")
    return 0


def report(ours: dict[str, Any], theirs: dict[str, Any]) -> list[list[Any]]:
    def pair(key: str, target: float | None) -> list[Any]:
        mine, other = ours.get(key, ""), theirs.get(key, theirs.get("unavailable", ""))
        ratio = mine / other if isinstance(mine, float) and isinstance(other, float) else ""
        verdict = "" if target is None or ratio == "" else f"<= {target}: {'met' if ratio <= target else 'MISSED'}"
        return [mine, other, ratio, verdict]

    return [
        ["the NCCL communicator's first collective, before planning (ms)", ours.get("first_collective_ms", ""),
         "", "", ""],
        ["cold plan creation, 2 ranks (ms)", *pair("cold_ms", 0.5)],
        ["warm plan creation, same shapes (ms)", *pair("warm_ms", None)],
        ["the process's first execute(), to its end (ms)", *pair("first_execute_ms", None)],
        [f"host time per execute(), {SIZE}^3 bf16, not captured (us)", *pair("execute_us", 0.2)],
        ["host time per cublasMpMatmul itself, flat binding (us)", ours.get("library_us", ""), "", "", ""],
        ["host time per execute(), NO_OVERLAP plan, not captured (us)", ours.get("no_overlap_us", ""), "", "", ""],
        ["host time per execute(), captured (us)", ours.get("captured_us", ""), "", "", ""],
        ["max |error| / max |torch|", ours.get("rel_err", ""), theirs.get("rel_err", ""), "", "<= 1e-2"],
    ]


if __name__ == "__main__":
    sys.exit(main())
