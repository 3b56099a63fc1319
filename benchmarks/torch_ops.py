"""The same NCCL all-reduce through mpbind's torch operator, the layer, ``torch.distributed`` and
torch's functional collective, eager and inside ``torch.compile(fullgraph=True)``, one process per
GPU, in one run.

    python benchmarks/torch_ops.py [--sizes 8,4096,1048576] [--calls 2000] [--out DIR]      (one rank)
    mpirun -np 2 -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
        python benchmarks/torch_ops.py

Host time per call (``perf_counter_ns`` around one call, nothing synchronised in the loop, the
median over every call; the variants interleaved batch by batch) of a float32 sum:

* ``layer``: ``comm.all_reduce(t, t)``, the direct call in place; ``layer_out``: ``comm.all_reduce(t,
  out)`` into a tensor made beforehand (what an out-of-place operator is measured against);
* ``op``: ``mpbind.torch.all_reduce(t, comm)`` (a new tensor: eagerly, the C++ operator's kernel called
  without the dispatcher), ``op_inplace``: ``all_reduce_``, ``op_dispatch``: the C++ operator
  ``mpbind::nccl_all_reduce`` through the dispatcher (what compiled code calls), ``op_python``:
  ``torch.ops.mpbind.all_reduce`` (the operator with a Python kernel, through the dispatcher);
* ``empty_like``: ``torch.empty_like(t)`` alone (what torch takes to make, hand back and later free a
  new CUDA tensor: the part of an out-of-place operator that ``layer_out`` does not pay);
* ``torch``: ``torch.distributed.all_reduce(t)`` (in place);
* ``funcol``: ``wait_tensor(all_reduce(t, "sum", group))`` of ``torch.distributed._functional_collectives``;
* ``compiled_op`` and ``compiled_funcol``: the same function, ``t * 2`` then the all-reduce, compiled
  (inductor, ``fullgraph=True``) once with ``mpbind.torch.all_reduce`` and once with the functional
  collective; ``compiled_python_op``: with the Python-kernel operator; ``eager_op``: the function
  uncompiled; ``compiled_floor``: ``t * 2`` alone, compiled (what a compiled function costs without a
  collective).

Targets: ``op`` within 3 µs of ``layer_out``; ``compiled_op`` at most 0.5x ``compiled_funcol``.
``op_share_us`` is ``op - layer_out - empty_like``: what mpbind's path adds beyond what torch itself
takes to make and free a new tensor (which any out-of-place operator pays, and which varies most from
host to host).
Rank 0 prints the table and writes ``torch_ops.csv`` and ``torch_ops.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
from _timing import host_times  # noqa: E402
from _torch_gpu import mapped_nccl, start_process_group  # noqa: E402

import mpbind.torch as mpt  # noqa: E402
from mpbind import nccl  # noqa: E402

VARIANTS = ("layer", "layer_out", "op", "op_inplace", "op_dispatch", "op_python", "empty_like", "torch", "funcol",
            "eager_op", "compiled_op", "compiled_python_op", "compiled_funcol", "compiled_floor")


def launched() -> tuple[int, int]:
    """(rank, size) from mpirun's environment, or one rank."""
    env = os.environ
    return int(env.get("OMPI_COMM_WORLD_RANK", "0")), int(env.get("OMPI_COMM_WORLD_SIZE", "1"))


def variants(comm: nccl.Communicator, t: Any) -> dict[str, Callable[[], Any]]:
    group = dist.group.WORLD
    out = torch.empty_like(t)
    name = mpt.name_of(comm)
    dispatched, launch = torch.ops.mpbind.nccl_all_reduce.default, comm.launch_id

    def with_op(x: Any) -> Any:
        return mpt.all_reduce(x * 2, comm)

    def with_funcol(x: Any) -> Any:
        return funcol.wait_tensor(funcol.all_reduce(x * 2, "sum", group))

    compiled_op = torch.compile(with_op, fullgraph=True)
    compiled_python_op = torch.compile(lambda x: torch.ops.mpbind.all_reduce(x * 2, name, "sum"), fullgraph=True)
    compiled_funcol = torch.compile(with_funcol, fullgraph=True)
    compiled_floor = torch.compile(lambda x: x * 2, fullgraph=True)
    return {
        "layer": lambda: comm.all_reduce(t, t),
        "layer_out": lambda: (comm.all_reduce(t, out), out)[1],  # the output returned to be checked
        "op": lambda: mpt.all_reduce(t, comm),
        "op_inplace": lambda: mpt.all_reduce_(t, comm),
        "op_dispatch": lambda: dispatched(t, launch, 0),
        "op_python": lambda: torch.ops.mpbind.all_reduce(t, name, "sum"),
        "empty_like": lambda: torch.empty_like(t),
        "torch": lambda: dist.all_reduce(t),
        "funcol": lambda: funcol.wait_tensor(funcol.all_reduce(t, "sum", group)),
        "eager_op": lambda: with_op(t),
        "compiled_op": lambda: compiled_op(t),
        "compiled_python_op": lambda: compiled_python_op(t),
        "compiled_funcol": lambda: compiled_funcol(t),
        "compiled_floor": lambda: compiled_floor(t),
    }


def measure(comm: nccl.Communicator, nbytes: int, calls: int, batches: int) -> dict[str, Any]:
    t = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    fns = variants(comm, t)
    size = comm.size
    for name, fn in fns.items():  # check each against the sum it must give (the first call compiles)
        t.fill_(1.0)
        out = fn()
        torch.cuda.synchronize()
        if name == "empty_like":
            continue
        got = t if out is None or name in ("layer", "op_inplace", "torch") else out
        want = float(2 * size if name.startswith(("eager", "compiled")) else size)
        if not bool(torch.all(got == want)):
            raise SystemExit(f"{name}: wrong all-reduce at {nbytes} B: {got[:4].tolist()} != {want}")
        for _ in range(3):
            fn()
    host: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_batch = max(1, calls // batches)
    for b in range(batches):
        k = b % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            t.fill_(0.0)
            torch.cuda.synchronize()
            comm.all_reduce(t, t)  # the ranks start each batch together
            torch.cuda.synchronize()
            host[name] += host_times(fns[name], per_batch)
            torch.cuda.synchronize()
    row: dict[str, Any] = {"bytes": nbytes}
    for name in VARIANTS:
        row[f"{name}_us"] = statistics.median(host[name])
    row["op_minus_layer_out_us"] = row["op_us"] - row["layer_out_us"]
    row["op_share_us"] = row["op_minus_layer_out_us"] - row["empty_like_us"]
    row["compiled_op_over_compiled_funcol"] = row["compiled_op_us"] / row["compiled_funcol_us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,4096,1048576", help="message sizes in bytes, comma-separated")
    ap.add_argument("--calls", type=int, default=2000, help="calls timed per variant and size")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = ap.parse_args()
    rank, size = launched()
    if size > torch.cuda.device_count():
        raise SystemExit(f"{size} processes but {torch.cuda.device_count()} GPUs: NCCL allows one rank per GPU")
    torch.cuda.set_device(rank)
    start_process_group(rank, size, 29517)
    comm = nccl.Communicator.from_torch()
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(s < 4 or s % 4 for s in sizes):
        raise SystemExit("--sizes: multiples of 4 bytes (float32)")
    rows = [measure(comm, nbytes, args.calls, args.batches) for nbytes in sizes]
    if rank == 0:
        print(f"# {size} rank(s), {torch.cuda.get_device_name()}; torch {torch.__version__}; NCCL mapped: "
              f"{mapped_nccl()}; host µs per call, median of {args.calls}")
        _results.report(args.out / "torch_ops.csv", rows, f"all_reduce float32, {size} rank(s)", "bytes",
                        [("host time per call (µs)", VARIANTS, "_us")])
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
