"""A tensor-parallel MLP block, ``y = GELU(x W1 + b1) W2 + b2``, on every visible GPU (one process
each), checked against the same block on one GPU, with the time of each layer.

    torchrun --standalone --nproc-per-node N examples/tp_mlp.py [--tokens 8192] [--hidden 4096] [--ffn 16384]
    mpirun --allow-run-as-root --bind-to none -np N -x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 \\
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python examples/tp_mlp.py
    python examples/tp_mlp.py                 (one rank: local GEMMs)
    python examples/tp_mlp.py --compile       (also the block as mpbind.torch operators, compiled)

``examples/demo.py`` runs it on every GPU when more than one is visible. Nothing is downloaded;
torchrun meets on the loopback interface.

The layout is Megatron's sequence-parallel MLP. Each of N ranks holds tokens/N rows of x, the
ffn/N output features of W1 (its columns; rows of torch's ``Linear`` weight) and the same ffn/N
input features of W2 (its rows):

* layer 1, AllGather+GEMM: each rank gathers every token of x while it multiplies by its columns
  of W1; b1 and GELU (tanh) are cuBLASMp's fused epilogue. h: every token x ffn/N features.
* layer 2, GEMM+ReduceScatter: each rank multiplies its h by its rows of W2; the partial sums are
  reduced and scattered by token while they are computed. y: tokens/N x hidden, laid out as x.
  b2 is added once after it (in torch): every rank's partial product would carry it otherwise.

Both layers are ``mpbind.matmul.plan`` plans built from distributions; the plans choose the
algorithms (the example checks they chose these). cuBLASMp is column-major, so a row-major torch
tensor ``t`` enters as ``t.T``: layer 1 computes ``h^T = W1^T x^T`` (A = W1 rows, transposed),
layer 2 ``y^T = W2^T h^T``.

Every rank makes the same global x, W1, W2 (seeded), runs the block, and compares its rows of y
with the one-GPU block on its own GPU (``torch.nn.functional.linear`` and ``gelu``), relative
error ``max|y - y_ref| / max|y_ref|`` at most 1e-2 in bf16. Prints ``tp_mlp rank=<k> ok`` (or
``FAILED``) per rank, and on rank 0 the time per layer on N GPUs and on one; exit status 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOLERANCE = 1e-2


def distributions(nranks: int, tokens: int, hidden: int, ffn: int) -> dict[str, dict[str, Any]]:
    """The global (stored, column-major) matrices of both layers and how they are spread:
    layer 1 ``h^T (ffn x tokens) = W1^T x^T``, layer 2 ``y^T (hidden x tokens) = W2^T h^T``."""
    from mpbind import distributions as dist

    return {
        "layer1": dict(a_dist=dist.by_columns((hidden, ffn), nranks),  # W1: hidden x ffn, its columns
                       b_dist=dist.by_columns((hidden, tokens), nranks),  # x^T: its tokens
                       d_dist=dist.by_rows((ffn, tokens), nranks)),  # h^T: its features, every token
        "layer2": dict(a_dist=dist.by_rows((ffn, hidden), nranks),  # W2: ffn x hidden, its rows
                       b_dist=dist.by_rows((ffn, tokens), nranks),  # h^T: its features
                       d_dist=dist.by_columns((hidden, tokens), nranks)),  # y^T: its tokens
    }


EXPECTED = {"layer1": "allgather_gemm", "layer2": "gemm_reducescatter"}


def _launcher() -> tuple[str, int, int, int]:
    """(how the ranks were started, rank, size, local rank) from the launcher's environment."""
    env = os.environ
    if "OMPI_COMM_WORLD_SIZE" in env or "PMIX_RANK" in env or "PMI_SIZE" in env:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        local = world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        return "mpirun", world.Get_rank(), world.Get_size(), local
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))
    return "one process", 0, 1, 0


def _communicator(how: str) -> Any:
    from mpbind import nccl

    if how == "mpirun":
        from mpi4py import MPI

        return nccl.Communicator.from_mpi(MPI.COMM_WORLD)
    if how == "torchrun":
        import torch.distributed as td

        td.init_process_group("gloo")  # only to share NCCL's unique id, over the loopback interface
        return nccl.Communicator.from_torch()
    return nccl.Communicator.init(1, 0, nccl.get_unique_id())


def per_call_ms(fn: Callable[[], object], iters: int, warmup: int) -> float:
    """Milliseconds per call of `fn`, `iters` calls back to back between two CUDA events, after
    `warmup` calls (the ranks keep each other in step through the collectives)."""
    import torch

    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192, help="rows of x (all ranks together)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384, help="columns of W1, rows of W2")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--explain", action="store_true", help="print each plan's explain() on rank 0")
    ap.add_argument("--csv", type=Path, help="also write the table here (rank 0)")
    ap.add_argument("--compile", action="store_true",
                    help="also run the block as mpbind.torch operators: eager, torch.compile(fullgraph=True) and "
                         "mode='reduce-overhead' (CUDA graphs), forward and backward")
    a = ap.parse_args()
    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        os.environ.setdefault(name, value)
    how, rank, size, local = _launcher()
    if a.tokens % size or a.ffn % size:
        print(f"tp_mlp: --tokens {a.tokens} and --ffn {a.ffn} must be multiples of the {size} ranks", file=sys.stderr)
        return 2

    import torch
    import torch.nn.functional as F

    from mpbind import cublasmp, matmul
    from mpbind._infra import loader as _loader

    torch.cuda.set_device(local)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)  # torch and the plans share one stream
    dt = torch.bfloat16
    T, H, FF = a.tokens, a.hidden, a.ffn
    t, f = T // size, FF // size
    rows, feats = slice(rank * t, (rank + 1) * t), slice(rank * f, (rank + 1) * f)

    def seeded(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> Any:
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(shape, generator=g, device="cuda") * scale).to(dt)

    # The same global block on every rank (torch's Linear weights: out_features x in_features).
    x, w1, b1 = seeded((T, H), 1), seeded((FF, H), 2, H**-0.5), seeded((FF,), 3, 0.1)
    w2, b2 = seeded((H, FF), 4, FF**-0.5), seeded((H,), 5, 0.1)
    x_mine, w1_mine, b1_mine = x[rows].contiguous(), w1[feats].contiguous(), b1[feats].contiguous()
    w2_mine = w2[:, feats].contiguous()
    h_mine = torch.empty((T, f), dtype=dt, device="cuda")
    y_mine = torch.empty((t, H), dtype=dt, device="cuda")

    failed = 0
    comm = _communicator(how)
    layouts = distributions(size, T, H, FF)
    with cublasmp.Handle(stream) as handle:
        layer1 = matmul.plan(comm, w1_mine.T, x_mine.T, h_mine.T, transa=True, epilogue="gelu_bias",
                                      bias=b1_mine, handle=handle, **layouts["layer1"])
        layer2 = matmul.plan(comm, w2_mine.T, h_mine.T, y_mine.T, transa=True, handle=handle,
                                      **layouts["layer2"])
        with layer1, layer2:
            for name, planned in (("layer1", layer1), ("layer2", layer2)):
                if size > 1 and planned.algorithm != EXPECTED[name]:
                    raise AssertionError(f"{name} planned {planned.algorithm}:\n{planned.explain()}")
                if a.explain and rank == 0:
                    print(f"--- {name}\n{planned.explain()}")

            def second() -> None:
                layer2.execute()
                y_mine.add_(b2)

            def block() -> None:
                layer1.execute()
                second()

            block()
            torch.cuda.synchronize()
            want = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
            err = float((y_mine.float() - want[rows].float()).abs().max() / want[rows].float().abs().max())
            ok = err <= TOLERANCE
            if not ok:
                failed += 1
            print(f"tp_mlp rank={rank} {'ok' if ok else 'FAILED'} max|y - y_1gpu| / max|y_1gpu| = {err:.2e}"
                  f"{'' if ok else f' > {TOLERANCE}'}", flush=True)

            times = {"layer 1: GELU(x W1 + b1), AllGather+GEMM": per_call_ms(layer1.execute, a.iters, a.warmup),
                     "layer 2: h W2 + b2, GEMM+ReduceScatter": per_call_ms(second, a.iters, a.warmup),
                     "block": per_call_ms(block, a.iters, a.warmup)}
            h_full = F.linear(x, w1, b1)
            one = [per_call_ms(lambda: F.gelu(F.linear(x, w1, b1), approximate="tanh"), a.iters, a.warmup),
                   per_call_ms(lambda: F.linear(h_full, w2, b2), a.iters, a.warmup),
                   per_call_ms(lambda: F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2),
                               a.iters, a.warmup)]
            torch.cuda.synchronize()
    if a.compile:
        ref = want[rows].float()
        failed += compiled_block(comm, rank, (x_mine, w1_mine, b1_mine, w2_mine, b2), ref, a.iters, a.warmup)
    comm.close()
    if how == "torchrun":
        import torch.distributed as td

        td.destroy_process_group()

    if rank == 0:
        flop = 2.0 * T * H * FF
        print(f"tp_mlp: {size} rank{'s' if size > 1 else ''} ({how}) on {torch.cuda.get_device_name()}, bf16, "
              f"tokens {T}, hidden {H}, ffn {FF}; cuBLASMp {_loader.loaded_version('cublasmp')}, "
              f"NCCL {_loader.loaded_version('nccl')}")
        gpus = f"{size} GPU{'s' if size > 1 else ''}"
        print(f"| layer | planned, {gpus} (ms) | torch, 1 GPU (ms) | speed-up | planned, {gpus} TFLOP/s |")
        print("|---|---|---|---|---|")
        rows = [(name, ms, one_ms, layers * flop / ms / 1e9)
                for (name, ms), one_ms, layers in zip(times.items(), one, (1, 1, 2), strict=True)]
        for name, ms, one_ms, tflops in rows:
            print(f"| {name} | {ms:.3f} | {one_ms:.3f} | {one_ms / ms:.2f}x | {tflops:.0f} |")
        print(f"(mean of {a.iters} calls back to back after {a.warmup}; the 1-GPU block runs on rank 0's GPU)")
        if a.csv is not None:
            a.csv.parent.mkdir(parents=True, exist_ok=True)
            with a.csv.open("w", newline="") as f:
                out = csv.writer(f)
                out.writerow(["layer", "ranks", "ms", "1 GPU ms", "TFLOP/s"])
                out.writerows([name, size, ms, one_ms, tflops] for name, ms, one_ms, tflops in rows)
    return 1 if failed else 0


def op_block(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, comm: Any) -> Any:
    """The block as Megatron's sequence-parallel MLP written with mpbind.torch's operators: gather the
    tokens, GEMM + GELU on this rank's features, GEMM, reduce-scatter the partial sums by token."""
    import torch.nn.functional as F

    import mpbind.torch as mpt

    h = F.gelu(F.linear(mpt.all_gather(x, comm), w1, b1), approximate="tanh")
    return mpt.reduce_scatter(F.linear(h, w2), comm) + b2


def compiled_block(comm: Any, rank: int, mine: tuple[Any, ...], ref: Any, iters: int, warmup: int) -> int:
    """Run :func:`op_block` eager, compiled (``fullgraph=True``, no graph break) and compiled with
    CUDA graphs; check each against the one-GPU block and the compiled gradients against eager's
    (inductor fuses the bias and GELU, so results agree within TOLERANCE, not bitwise); time them.
    Returns the number of failed checks on this rank."""
    import torch

    leaves = [t.detach().clone().requires_grad_(True) for t in mine]
    explained = torch._dynamo.explain(op_block)(*leaves, comm)
    failed = int(explained.graph_break_count != 0)
    torch.compiler.reset()
    modes: dict[str, Any] = {"eager": op_block}
    for mode in ("default", "reduce-overhead"):
        modes[f"compiled ({mode})"] = torch.compile(op_block, fullgraph=True, mode=mode)
    grads: dict[str, list[Any]] = {}
    times: dict[str, tuple[float, float]] = {}
    for name, fn in modes.items():
        for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
            for t in leaves:
                t.grad = None
            y = fn(*leaves, comm)
            y.float().square().mean().backward()
        torch.cuda.synchronize()
        err = float((y.detach().float() - ref).abs().max() / ref.abs().max())
        grads[name] = [t.grad.float() for t in leaves]
        gerr = max(float((g - e).abs().max() / e.abs().max().clamp_min(1e-30))
                   for g, e in zip(grads[name], grads["eager"], strict=True))
        ok = err <= TOLERANCE and gerr <= TOLERANCE
        failed += int(not ok)
        print(f"tp_mlp rank={rank} ops {name}: {'ok' if ok else 'FAILED'} |y - y_1gpu| {err:.2e}, "
              f"|grad - grad_eager| {gerr:.2e}, graph breaks {explained.graph_break_count}", flush=True)

        def step(fn: Any = fn) -> None:
            for t in leaves:
                t.grad = None
            fn(*leaves, comm).float().square().mean().backward()

        with torch.no_grad():
            forward_ms = per_call_ms(lambda fn=fn: fn(*leaves, comm), iters, warmup)
        times[name] = (forward_ms, per_call_ms(step, iters, warmup))
    if rank == 0:
        print("| mpbind.torch block | forward (ms) | forward + backward (ms) |")
        print("|---|---|---|")
        for name, (fwd, both) in times.items():
            print(f"| {name} | {fwd:.3f} | {both:.3f} |")
    return failed


#: Seconds the whole multi-GPU run may take (set-up, both layers, the checks): past it, it is ended.
LAUNCH_TIMEOUT = 900.0


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End `proc`'s session, the launcher and every rank it started: SIGTERM, up to 10 s for the
    launcher to stop, then SIGKILL to whatever is left (a rank that ignored SIGTERM outlives its launcher)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_bounded(cmd: list[str], env: dict[str, str], timeout: float) -> int:
    """Run `cmd` in a session of its own for at most `timeout` seconds: its exit status, or 124 once
    the session was ended for running past it. Ctrl-C ends the session too and is raised again."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{Path(cmd[-1]).name if cmd else 'the run'}: no result after {timeout:.0f} s; ended",
              file=sys.stderr, flush=True)
        _end(proc)
        return 124
    except KeyboardInterrupt:
        _end(proc)
        raise


def launch(nprocs: int, *args: str, timeout: float = LAUNCH_TIMEOUT) -> int:
    """Run this example with one process per GPU on `nprocs` GPUs (torchrun on the loopback
    interface), at most `timeout` seconds, and return its exit status (124: it ran past that)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
           str(Path(__file__).resolve()), *args]
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return run_bounded(cmd, env, timeout)


def on_every_gpu(count: int) -> bool:
    """The demo's step: the block on every visible GPU when there are several; True when it passed
    or was skipped (saying why)."""
    if count < 2:
        print(f"skipped: tensor-parallel MLP (examples/tp_mlp.py) needs more than one GPU; {count} visible")
        return True
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipped: tensor-parallel MLP (examples/tp_mlp.py) needs torch (pip install 'mpbind[torch]')")
        return True
    from mpbind._infra import loader as _loader
    from mpbind.errors import LibraryNotFoundError

    try:
        _loader.load("cublasmp")
    except LibraryNotFoundError as exc:
        print(f"skipped: tensor-parallel MLP (examples/tp_mlp.py) needs cuBLASMp: {exc}")
        return True
    print(f"tensor-parallel MLP on {count} GPUs (examples/tp_mlp.py, one process per GPU):", flush=True)
    return launch(count) == 0


if __name__ == "__main__":
    sys.exit(main())
