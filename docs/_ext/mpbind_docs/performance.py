"""The performance page, written from the results kept in benchmarks/results/<machine>/ (one set per
benchmark and machine kind): each CSV as a table, its PNG, and the command that wrote it.

Every CSV there must have an entry in RUNS (what it measures and the command behind it): a result without
one is reported as a build warning, so the page never shows a figure nobody can reproduce.
"""

from __future__ import annotations

import csv
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MACHINES = {
    "h200x1": "One H200",
    "h200x2": "Two H200s (NVLink, NVLS off)",
    "scaling": "Scaling with the GPU count",
}

# The variables every multi-GPU run keeps (NVLink multicast is off on these machines).
ENV = "-x NCCL_NVLS_ENABLE=0 -x NVSHMEM_DISABLE_NVLS=1 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1"


@dataclass(frozen=True)
class Run:
    title: str
    what: str
    command: str


RUNS: dict[str, Run] = {
    "h200x1/nccl_allreduce_watchdog": Run(
        "NCCL all-reduce with and without the watchdog",
        "One rank; the same all-reduce on a communicator without and with ``watchdog=True``: host µs per call "
        "(``watched_minus_layer_us``: the paired difference, budget 1.0) and GPU µs per call, timed with the "
        "stream held until every call is queued (``watched_over_layer_gpu``: 1.0 is no GPU cost). On one rank "
        "an in-place all-reduce moves nothing, so this is the watchdog's own cost.",
        "python benchmarks/nccl_allreduce.py --max 524288 --calls 2000 --batches 9 --out DIR"),
    "h200x1/nvshmem_put_shared": Run(
        "NVSHMEM put + quiet on a stream, two PEs sharing the GPU",
        "Host µs per put+quiet pair through the layer, the flat calls and nvshmem4py 0.4.1 (same "
        "libnvshmem_host), under CUDA MPS; ``nvshmem4py_layer``: nvshmem4py's own Python layer.",
        f"mpirun -np 2 {ENV} python benchmarks/nvshmem_latency.py --placement shared --max 16777216 --out DIR"),
    "h200x1/nvshmem_put_breakdown_per-gpu": Run(
        "Where the layer's put + quiet time goes, one PE",
        "The flat pair, then the layer's steps added one at a time (``flat_ptr``: the CuPy stream read per call; "
        "``core_int``/``core``: the core's C++ with an int and with a CuPy stream; ``layer``: the Python facade).",
        f"mpirun -np 1 {ENV} python benchmarks/nvshmem_put_breakdown.py --out DIR"),
    "h200x1/nvshmem_put_breakdown_shared": Run(
        "Where the layer's put + quiet time goes, two PEs sharing the GPU",
        "As above, two PEs under CUDA MPS.",
        f"mpirun -np 2 {ENV} python benchmarks/nvshmem_put_breakdown.py --placement shared --out DIR"),
    "h200x1/ring_exchange_shared": Run(
        "Ring exchange from a kernel, two PEs sharing the GPU",
        "The kernel of ``examples/ring_exchange.py`` through :mod:`mpbind.kernels` against nvshmem4py 0.4.1's "
        "Numba-CUDA device API, under CUDA MPS: device µs per exchange (200 inside one launch) and one launch "
        "plus one exchange (host time). The script writes ``ring_exchange.csv``; kept here under this name.",
        f"for impl in mpbind nvshmem4py; do mpirun --bind-to none -np 2 {ENV} "
        "python benchmarks/nvshmem_ring_exchange.py --impl $impl --out DIR; done"),
    "h200x1/torch_ops": Run(
        "The torch operators' host time",
        "One float32 all-reduce through :mod:`mpbind.torch` (``op``: the function, which eagerly runs the C++ "
        "kernel without the dispatcher; ``op_inplace``; ``op_dispatch``: the C++ operator ``mpbind::nccl_all_reduce`` "
        "through the dispatcher; ``op_python``: the operator with a Python kernel), the layer call in place "
        "(``layer``) and into a tensor made beforehand (``layer_out``), ``torch.empty_like`` alone, "
        "``torch.distributed`` and torch's functional collective, eager and compiled (``t * 2`` then the "
        "all-reduce): host µs per call, one rank, the variants interleaved; ``op_share`` is ``op - layer_out - "
        "empty_like``, mpbind's part beyond torch's own allocation. Targets, at 8 B: the eager operator within 3 µs "
        "of the layer call (``op`` is 2.71 µs over ``layer_out`` here; 2.61-2.71 at 8 B and 2.32-2.94 at every size "
        "over six runs of this tree, in the rows the machine ran at its usual speed: met; 3.62-4.29 in rows it ran "
        "~1.8x slower throughout, where ``empty_like`` alone takes 3.3-3.7; ``op_share`` 0.30-0.92; "
        "``op_inplace`` is 0.7-0.9 µs over ``layer``), the compiled function at most 0.5x the one with the "
        "functional collective (0.489 here, 0.47-0.49 in all six runs: met; 0.47-0.53 at 4 KiB and 1 MiB, "
        "compiled for dynamic shapes; ``compiled_floor``, the compiled function's own cost, is 0.36-0.43).",
        "python benchmarks/torch_ops.py --calls 9000 --batches 21 --out DIR"),
    "h200x1/jax_fft_1pe": Run(
        "The distributed FFT inside jax.jit against the eager plan, one PE",
        "complex64 C2C of n^3: ms per transform in a stream of back-to-back calls (``jit``: a plan on the default "
        "stream, pointed at XLA's for the call; ``jit_events``: a plan on a stream of its own, joined to XLA's by "
        "events; ``eager``: ``FFTPlan.execute`` with an output array), jit / eager (target <= 1.15), the host time "
        "of one jitted call, the plan's NVSHMEM buffer and XLA's scratch per call. ``zero_copy``: the plan "
        "transforming its own buffer in place, what a path without the copy in and out would take (XLA's "
        "operands would have to be NVSHMEM symmetric memory); ``copy_share``: the share of the call the two "
        "copies take. Small sizes are bound by JAX's dispatch (~70 µs a call on this host).",
        f"mpirun -np 1 {ENV} python benchmarks/jax_fft.py --one-gpu --out DIR"),
    "h200x1/jax_fft_2pe_shared": Run(
        "The distributed FFT inside jax.jit against the eager plan, two PEs sharing the GPU",
        "As above, two PEs under CUDA MPS (the slowest PE's times).",
        f"mpirun -np 2 {ENV} python benchmarks/jax_fft.py --one-gpu --out DIR"),
    "h200x2/nccl_allreduce": Run(
        "NCCL all-reduce: the layer, the flat call and torch.distributed",
        "One process per GPU, all three on the same libnccl, float32: median host µs per call with nothing "
        "synchronised in the loop, bus bandwidth from CUDA events.",
        f"mpirun -np 2 {ENV} python benchmarks/nccl_allreduce.py --out DIR"),
    "h200x2/nvshmem_put_per-gpu": Run(
        "NVSHMEM put + quiet on a stream, one PE per GPU",
        "Host µs per put+quiet pair through the layer, the flat calls and nvshmem4py 0.4.1 (same libnvshmem_host).",
        f"mpirun -np 2 {ENV} python benchmarks/nvshmem_latency.py --placement per-gpu --out DIR"),
    "h200x2/nvshmem_put_shared": Run(
        "NVSHMEM put + quiet on a stream, both PEs on GPU 0",
        "As above, both PEs on one GPU of the two-GPU machine under CUDA MPS.",
        f"mpirun -np 2 {ENV} python benchmarks/nvshmem_latency.py --placement shared --out DIR"),
    "h200x2/ring_exchange": Run(
        "Ring exchange from a kernel, one PE per GPU",
        "The kernel of ``examples/ring_exchange.py`` through :mod:`mpbind.kernels` against nvshmem4py 0.4.1's "
        "Numba-CUDA device API: device µs per exchange (200 inside one launch) and one launch plus one exchange.",
        f"for impl in mpbind nvshmem4py; do mpirun --bind-to none -np 2 {ENV} "
        "python benchmarks/nvshmem_ring_exchange.py --impl $impl --out DIR; done"),
    "h200x2/collective_matmul": Run(
        "The collective matmul ``AllGatherMatmul``",
        "``out = all_gather(x) @ w`` through the NVSHMEM ring (host- and kernel-issued) against NCCL + "
        "``torch.matmul``, cuBLASMp's all-gather+GEMM and torch's ``fused_all_gather_matmul``, fp16: one call "
        "from idle GPUs and 20 back to back; ``part:`` rows time the pieces.",
        f"mpirun --bind-to none -np 2 {ENV} -x LD_PRELOAD -x MPBIND_CUBLASMP_PATH "
        "python benchmarks/collective_matmul.py --iters 20 --warmup 5 --out DIR"),
    "h200x2/fft_distributed": Run(
        "Distributed FFT through ``mpbind.fft``",
        "Complex64 C2C against nvmath-python 1.0's distributed FFT (both on cuFFTMp 12.1.3) and "
        "``torch.fft.fftn`` on one GPU; the exchange as a reshape against NCCL ``all_to_all``; relative errors "
        "against NumPy. One run per mode, then the report merges them (the per-mode CSVs are its input).",
        f'for mode in mpbind nvmath torch; do mpirun -np 2 --bind-to none {ENV} '
        "python benchmarks/fft_distributed.py --mode $mode --out DIR; done\n"
        "python benchmarks/fft_distributed.py --mode report --out DIR"),
    "h200x2/tp_square_matmul": Run(
        "Tensor-parallel square matmuls through ``mpbind.matmul.plan``",
        "8192³ and 16384³ bf16 over two GPUs against one-GPU ``torch.matmul``, TFLOP/s.",
        f"mpirun -np 2 --bind-to none {ENV} -x LD_PRELOAD -x MPBIND_CUBLASMP_PATH "
        "python benchmarks/tp_square_matmul.py --out DIR"),
    "h200x2/tp_collective_matmul": Run(
        "Tensor-parallel all-gather+GEMM and GEMM+reduce-scatter plans",
        "``mpbind.matmul.plan`` against NCCL + torch, the local GEMM alone and torch's fused ops (K = 8192, "
        "N = 28672 for all-gather+GEMM; K = 28672, N = 8192 for GEMM+reduce-scatter), µs; the settings "
        "explored are in ``tp_collective_matmul_settings.csv``.",
        f"mpirun -np 2 --bind-to none {ENV} -x LD_PRELOAD -x MPBIND_CUBLASMP_PATH "
        "python benchmarks/tp_collective_matmul.py --out DIR"),
    "scaling/scaling": Run(
        "Every workload by GPU count",
        "``benchmarks/scaling.py`` runs the workloads above with the same commands on 1, 2, 4 and 8 GPUs (one "
        "process per GPU, as many as the machine has) and, for the NVSHMEM and cuFFTMp workloads, several PEs "
        "per GPU under MPS; ``gpus`` × ``pes_per_gpu`` across. Columns a machine could not run are absent.",
        "LD_PRELOAD=<libnccl> python benchmarks/scaling.py run --gpus 1,2,4,8 --out DIR\n"
        "python benchmarks/scaling.py run --gpus 1 --pes-per-gpu 4,8 --only fft_distributed,poisson3d --out DIR\n"
        "python benchmarks/scaling.py report DIR"),
}

# CSVs that are the inputs or the detail of a result above, shown only as links from it.
PARTS = {"h200x2/fft_distributed.mpbind": "h200x2/fft_distributed",
         "h200x2/fft_distributed.nvmath": "h200x2/fft_distributed",
         "h200x2/tp_collective_matmul_settings": "h200x2/tp_collective_matmul"}

MAX_ROWS = 40


def results(root: Path) -> list[tuple[str, Path]]:
    """(key, CSV) of every result shown: ``<machine>/<stem>``; the scaling runs' per-workload CSVs are
    the report's inputs (scaling.csv holds their figures)."""
    out = []
    for machine in MACHINES:
        for path in sorted((root / machine).glob("*.csv")):
            out.append((f"{machine}/{path.stem}", path))
    return out


def _read(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def _cell(text: str) -> str:
    try:
        v = float(text)
    except ValueError:
        return text.replace("|", "\\|") or "—"
    if v.is_integer() and abs(v) < 1e15 and "." not in text:
        return text
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """An RST list-table (cells may hold any text)."""
    out = [".. list-table::", "   :header-rows: 1", ""]
    for row in [header, *rows]:
        first = True
        for c in row:
            text = _cell(c) if row is not header else c
            text = text.replace("*", "\\*").replace("`", "\\`") or "—"
            out.append(f"   {'* -' if first else '  -'} {text}")
            first = False
    return [*out, ""]


def _pivot(header: list[str], rows: list[list[str]], keys: list[str], across: Callable[[list[str]], str]
           ) -> tuple[list[str], list[list[str]]]:
    """A long CSV (one value per row) as a table: one row per `keys`, one column per `across(row)`."""
    ki = [header.index(k) for k in keys]
    vi = header.index("value")
    columns: list[str] = []
    table: dict[tuple[str, ...], dict[str, str]] = {}
    for r in rows:
        col = across(r)
        if col not in columns:
            columns.append(col)
        table.setdefault(tuple(r[i] for i in ki), {})[col] = r[vi]
    return [*keys, *columns], [[*k, *(v.get(c, "") for c in columns)] for k, v in table.items()]


def _shape(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    if header == ["mode", "size", "series", "metric", "value"]:
        return _pivot(header, rows, ["metric", "series", "mode"], lambda r: f"{r[1]}³")
    if header == ["workload", "figure", "gpus", "pes_per_gpu", "value"]:
        return _pivot(header, rows, ["workload", "figure"],
                      lambda r: f"{r[2]} GPU" + (f" × {r[3]} PEs" if r[3] != "1" else ""))
    return header, rows


def render(root: Path, images: Path, rel_images: str, warn: Callable[[str], None]) -> str:
    """The page body (RST); the PNGs are copied under `images` (`rel_images` from the page)."""
    out: list[str] = []
    found = results(root)
    keys = {k for k, _ in found}
    for key in sorted(keys - RUNS.keys() - PARTS.keys()):
        warn(f"benchmarks/results/{key}.csv has no entry in docs/_ext/mpbind_docs/performance.py RUNS "
             "(what it measures and the command behind it)")
    for key in sorted(RUNS.keys() - keys):
        warn(f"docs/_ext/mpbind_docs/performance.py RUNS has {key}, but benchmarks/results/{key}.csv is gone")
    for machine, title in MACHINES.items():
        mine = [(k, p) for k, p in found if k.startswith(machine + "/") and k in RUNS]
        if not mine:
            continue
        out += [title, "-" * len(title), ""]
        for key, path in mine:
            run = RUNS[key]
            out += [run.title, "~" * len(run.title), "", run.what, "", ".. code-block:: shell", ""]
            out += [f"   {line}" for line in run.command.splitlines()] + [""]
            header, rows = _shape(*_read(path))
            shown = rows[:MAX_ROWS]
            out += _table(header, shown)
            rel = f"benchmarks/results/{key}.csv"
            more = f" (the first {MAX_ROWS} of {len(rows)} rows)" if len(rows) > MAX_ROWS else ""
            parts = [f"``benchmarks/results/{p}.csv``" for p, owner in PARTS.items() if owner == key
                     and (root / f"{p}.csv").exists()]
            out += [f"From ``{rel}``{more}." + (f" Also: {', '.join(parts)}." if parts else ""), ""]
            png = path.with_suffix(".png")
            if png.exists():
                name = key.replace("/", "-") + ".png"
                images.mkdir(parents=True, exist_ok=True)
                target = images / name
                if not target.exists() or target.read_bytes() != png.read_bytes():
                    shutil.copyfile(png, target)
                out += [f".. image:: {rel_images}/{name}", f"   :alt: {run.title}", ""]
    return "\n".join(out)
