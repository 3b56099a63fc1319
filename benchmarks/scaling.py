"""The scaling tables: the same workloads on 1, 2, 4 and 8 GPUs, one process per GPU, one table per
workload with the GPU counts across.

    python benchmarks/scaling.py run [--gpus 1,2,4,8] [--pes-per-gpu 1,4,8] [--only NAME,...] [--out DIR]
        [--timeout S] [--dry-run]
    python benchmarks/scaling.py report [DIR]

``run`` starts each workload with ``mpirun -np N`` for each N of ``--gpus`` up to the GPUs this
machine has (the others are reported as not run), with NVLink multicast off
(``NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, passed with
``-x``), passing on ``LD_PRELOAD``, ``PYTHONPATH`` and the ``MPBIND_*`` library paths where set
(cuBLASMp needs NCCL 2.29.2 or newer: preload it). Each run has a time limit; its output goes to
``DIR/<workload>/np<N>/`` (``log.txt``, the workload's CSV). ``report`` reads those CSVs and prints a
Markdown table per workload (its headline figures down, GPU counts across), and writes
``DIR/scaling.csv`` and ``DIR/scaling.png``.

``--pes-per-gpu`` above 1 also runs the NVSHMEM and cuFFTMp workloads (``fft_distributed``,
``poisson3d``; NCCL and cuBLASMp need a GPU per rank) with that many processes on each GPU, under
the CUDA MPS daemon that must already be running (``nvidia-cuda-mps-control -d``), each process given
an equal share of the GPU (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: NVSHMEM's full multi-PE-per-GPU
mode) and of its memory (``NVSHMEM_SYMMETRIC_SIZE``). Those runs exercise the code paths of 4 and 8
ranks where fewer GPUs are lent; their times are not scaling figures (the PEs share one GPU's SMs).
They go to ``np<N>x<K>/`` and into columns of their own (``1 GPU x 4 PEs``), left out of the plot.

The workloads are the project's own benchmarks and examples, run as their docstrings say:
``nccl_allreduce`` (host time at 8 B, bus bandwidth at 2 MiB, 128 MiB and 512 MiB: the layer with
torch tensors, the flat call, ``torch.distributed``), ``tp_square_matmul`` (8192^3 and 16384^3 bf16
TFLOP/s against one GPU), ``tp_collective_matmul`` (the tensor-parallel all-gather+GEMM and
GEMM+reduce-scatter plans against NCCL + torch, µs), ``tp_mlp`` (the tensor-parallel MLP block, ms per layer),
``fft_distributed`` (3-D C2C through ``mpbind.fft``, GPU ms per forward transform), ``poisson3d``
(ms per solve at 256^3) and ``collective_matmul`` (the NVSHMEM ring, NCCL + torch and cuBLASMp at
both shapes).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
PASSED_ON = ("LD_PRELOAD", "PYTHONPATH", "MPBIND_NCCL_PATH", "MPBIND_NVSHMEM_PATH", "MPBIND_CUBLASMP_PATH",
             "MPBIND_CUFFTMP_PATH", "NVSHMEM_SYMMETRIC_SIZE")
Rows = list[dict[str, str]]


@dataclass(frozen=True)
class Workload:
    name: str
    argv: tuple[str, ...]  # after the Python interpreter; "{out}" is the run's folder
    csv: str  # what the run writes under its folder
    figures: Callable[[Rows], dict[str, float]]  # the headline figures, from the CSV's rows
    env: tuple[tuple[str, str], ...] = ()  # what its docstring's command sets (with -x NAME=VALUE)
    shares_gpu: bool = False  # NVSHMEM/cuFFTMp only: several PEs may share a GPU (under MPS)


def _num(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return math.nan


def _nccl(rows: Rows) -> dict[str, float]:
    out: dict[str, float] = {}
    by_size = {int(float(r["bytes"])): r for r in rows}
    if 8 in by_size:
        for v in ("layer", "flat", "torch"):
            out[f"host µs per call at 8 B, {v}"] = _num(by_size[8][f"{v}_host_us"])
    for size, label in ((2 << 20, "2 MiB"), (128 << 20, "128 MiB"), (512 << 20, "512 MiB")):
        if size in by_size:
            for v in ("layer", "torch"):
                busbw = _num(by_size[size][f"{v}_busbw_GBps"])
                out[f"bus GB/s at {label}, {v}"] = busbw if busbw > 0 else math.nan  # 0 on one rank: no bus
    return out


def _square(rows: Rows) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        out[f"{r['size']}^3 {r['algorithm']}, TFLOP/s"] = _num(r["plan best TFLOP/s"])
        out[f"{r['size']}^3 one GPU, TFLOP/s"] = _num(r["1 GPU TFLOP/s"])
    return out


def _tp(rows: Rows) -> dict[str, float]:
    out: dict[str, float] = {}
    kinds = {"ag": "all-gather+GEMM", "rs": "GEMM+reduce-scatter"}
    for r in rows:
        head, _, rest = r["case"].partition(" ")  # "ag", "rs", "ag (Pallas guide)"
        what = f"{kinds.get(head, head)}{' ' + rest if rest else ''} {r['dtype']} M={r['M']}"
        out[f"{what}, plan µs"] = _num(r["plan best (us)"])
        out[f"{what}, NCCL + torch µs"] = _num(r["NCCL + torch (us)"])
    return out


def _mlp(rows: Rows) -> dict[str, float]:
    return {f"{r['layer']}, ms": _num(r["ms"]) for r in rows}


def _fft(rows: Rows) -> dict[str, float]:
    return {f"{r['size']}^3 C2C forward ({r['series']}), GPU ms": _num(r["value"]) for r in rows
            if r["metric"] == "gpu_ms_forward"}


def _poisson(rows: Rows) -> dict[str, float]:
    return {f"{r['n']}^3 {r['dtype']} solve, ms": _num(r["ms_per_solve"]) for r in rows}


def _collective(rows: Rows) -> dict[str, float]:
    keep = ("nccl+torch.matmul", "mpbind host", "cublasmp ag+gemm")
    return {f"{r['shape (m/GPU x K x n/GPU)']} {r['implementation']}, µs": _num(r["us"]) for r in rows
            if r["implementation"] in keep}


WORKLOADS = (
    Workload("nccl_allreduce", ("benchmarks/nccl_allreduce.py", "--calls", "300", "--out", "{out}"),
             "nccl_allreduce.csv", _nccl),
    Workload("tp_square_matmul", ("benchmarks/tp_square_matmul.py", "--out", "{out}"), "tp_square_matmul.csv",
             _square),
    Workload("tp_collective_matmul", ("benchmarks/tp_collective_matmul.py", "--out", "{out}"),
             "tp_collective_matmul.csv", _tp),
    Workload("tp_mlp", ("examples/tp_mlp.py", "--csv", "{out}/tp_mlp.csv"), "tp_mlp.csv", _mlp),
    Workload("fft_distributed", ("benchmarks/fft_distributed.py", "--mode", "mpbind", "--out", "{out}"),
             "fft_distributed.mpbind.csv", _fft, env=(("NVSHMEM_SYMMETRIC_SIZE", str(32 << 30)),), shares_gpu=True),
    Workload("poisson3d", ("examples/poisson3d.py", "--n", "256", "--csv", "{out}/poisson3d.csv"), "poisson3d.csv",
             _poisson, shares_gpu=True),
    Workload("collective_matmul", ("benchmarks/collective_matmul.py", "--iters", "20", "--out", "{out}"),
             "collective_matmul.csv", _collective),
)
BY_NAME = {w.name: w for w in WORKLOADS}
SHARED_HEAP_BYTES = 120 << 30  # of an H200's 141 GB: what the PEs sharing one GPU split between them


@dataclass(frozen=True, order=True)
class Placement:
    """`gpus` GPUs with `per_gpu` processes on each."""

    gpus: int
    per_gpu: int = 1

    @property
    def nprocs(self) -> int:
        return self.gpus * self.per_gpu

    @property
    def folder(self) -> str:
        return f"np{self.gpus}" if self.per_gpu == 1 else f"np{self.gpus}x{self.per_gpu}"

    @property
    def label(self) -> str:
        gpus = f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        return gpus if self.per_gpu == 1 else f"{gpus} x {self.per_gpu} PEs"

    @classmethod
    def of_folder(cls, name: str) -> Placement | None:
        gpus, _, per_gpu = name.removeprefix("np").partition("x")
        try:
            return cls(int(gpus), int(per_gpu or 1)) if name.startswith("np") else None
        except ValueError:
            return None


def visible_gpus() -> int:
    """GPUs this machine has (``nvidia-smi -L``), 0 without a driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def mps_running() -> bool:
    """Whether a CUDA MPS control daemon answers (``CUDA_MPS_PIPE_DIRECTORY`` or its default)."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return False
    try:
        return subprocess.run([control], input="get_server_list\n", capture_output=True, text=True, timeout=30,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def command(w: Workload, where: Placement, out: Path, env: dict[str, str]) -> list[str]:
    """The mpirun command line of one run of `w` placed as `where`, writing under `out`."""
    own = dict(w.env)
    if where.per_gpu > 1:  # an equal share of the GPU's SMs and memory for each PE on it
        own["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // where.per_gpu)
        if "NVSHMEM_SYMMETRIC_SIZE" in own:
            own["NVSHMEM_SYMMETRIC_SIZE"] = str(min(int(own["NVSHMEM_SYMMETRIC_SIZE"]),
                                                    SHARED_HEAP_BYTES // where.per_gpu))
    cmd = ["mpirun"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--bind-to", "none", *(["--oversubscribe"] if where.per_gpu > 1 else []), "-np", str(where.nprocs)]
    for name in (*MULTICAST_OFF, *PASSED_ON, *(("CUDA_MPS_PIPE_DIRECTORY",) if where.per_gpu > 1 else ())):
        if name in env and name not in own:
            cmd += ["-x", name]
    for name, value in own.items():
        cmd += ["-x", f"{name}={value}"]
    return cmd + [sys.executable, *(arg.replace("{out}", str(out)) for arg in w.argv)]


def placements(w: Workload, gpus: Sequence[int], per_gpu: Sequence[int]) -> list[Placement]:
    """The runs of `w`: one process per GPU at every count, more where the workload can share a GPU."""
    return [Placement(n, k) for n in gpus for k in per_gpu if k == 1 or w.shares_gpu]


def run(workloads: Sequence[Workload], gpus: Sequence[int], per_gpu: Sequence[int], out: Path, timeout: float,
        dry_run: bool) -> int:
    have = visible_gpus()
    env = {**MULTICAST_OFF, **os.environ}  # multicast off unless the caller set these
    mps = dry_run or max(per_gpu) == 1 or mps_running()
    failed = 0
    for w in workloads:
        for where in placements(w, gpus, per_gpu):
            folder = out / w.name / where.folder
            if not dry_run and (where.gpus > have or (where.per_gpu > 1 and not mps)):
                why = f"{have} visible" if where.gpus > have else "no MPS daemon: start nvidia-cuda-mps-control -d"
                print(f"{w.name} on {where.label}: not run ({why})", flush=True)
                continue
            cmd = command(w, where, folder, env)
            if dry_run:
                print(" ".join(cmd))
                continue
            folder.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            with (folder / "log.txt").open("w") as log:
                try:
                    rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        timeout=timeout, check=False).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            made = (folder / w.csv).exists()
            failed += rc != 0 or not made
            print(f"{w.name} on {where.label}: rc={rc} in {time.monotonic() - start:.0f} s"
                  f"{'' if made else f', no {w.csv}'} (log: {folder / 'log.txt'})", flush=True)
    return 1 if failed else 0


Found = dict[str, dict[str, dict[Placement, float]]]


def collect(out: Path, workloads: Sequence[Workload]) -> Found:
    """{workload: {figure: {placement: value}}} from the runs found under `out`."""
    found: Found = {}
    for w in workloads:
        for folder in sorted((out / w.name).glob("np*")):
            n = Placement.of_folder(folder.name)
            path = folder / w.csv
            if n is None or not path.exists():
                continue
            with path.open(newline="") as f:
                rows = list(csv.DictReader(f))
            for figure, value in w.figures(rows).items():
                found.setdefault(w.name, {}).setdefault(figure, {})[n] = value
    return found


def _cell(value: float | None) -> float | str:
    if value is None:
        return "not run"
    return "n/a" if math.isnan(value) else value


def tables(found: Found) -> str:
    """One Markdown table per workload: its figures down, placements across ("not run" where no run gave
    the figure, "n/a" where it has no meaning there, as bus bandwidth on one GPU)."""
    parts = []
    for name, figures in found.items():
        counts = sorted({n for by_n in figures.values() for n in by_n})
        header = ["figure", *(n.label for n in counts)]
        rows = [[figure, *(_cell(by_n.get(n)) for n in counts)] for figure, by_n in figures.items()]
        parts.append(f"### {name}\n\n{_results.table(header, rows)}")
    return "\n\n".join(parts)


def report(out: Path, workloads: Sequence[Workload]) -> int:
    found = collect(out, workloads)
    if not found:
        print(f"no runs under {out}")
        return 1
    print(tables(found))
    flat = [(name, figure, n.gpus, n.per_gpu, value) for name, figures in found.items()
            for figure, by_n in figures.items() for n, value in sorted(by_n.items())]
    _results.write_csv(out / "scaling.csv", ["workload", "figure", "gpus", "pes_per_gpu", "value"], flat)
    panels = []  # one process per GPU only: shared GPUs check the code paths of more ranks, they do not scale
    for name, figures in found.items():
        series = {figure: sorted((n.gpus, v) for n, v in by_n.items() if n.per_gpu == 1)
                  for figure, by_n in figures.items()}
        panels.append((name, {f: ([float(n) for n, _ in s], [v for _, v in s]) for f, s in series.items() if s}))
    drawn = _results.plot(out / "scaling.png", "scaling with the GPU count", "GPUs", panels, columns=3)
    print(f"wrote {out / 'scaling.csv'}" + (" and .png" if drawn else " (no matplotlib: no plot)"))
    return 0


def counts(ap: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """The sorted counts of a comma-separated option (the parser's error otherwise)."""
    try:
        values = sorted({int(n) for n in text.split(",") if n})
    except ValueError:
        ap.error(f"{option} takes comma-separated counts, not {text!r}")
    if not values or values[0] < 1:
        ap.error(f"{option} needs counts of at least 1")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="run the workloads under mpirun")
    r.add_argument("--gpus", default="1,2,4,8", help="GPU counts, comma-separated")
    r.add_argument("--pes-per-gpu", default="1", help="processes per GPU, comma-separated (above 1: NVSHMEM and "
                   "cuFFTMp workloads only, under MPS)")
    r.add_argument("--only", default="", help=f"workloads, comma-separated (of {', '.join(BY_NAME)})")
    r.add_argument("--out", type=Path, default=Path("benchmark-results/scaling"))
    r.add_argument("--timeout", type=float, default=600, help="seconds per run")
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    p = sub.add_parser("report", help="the tables from what ran")
    p.add_argument("out", type=Path, nargs="?", default=Path("benchmark-results/scaling"))
    a = ap.parse_args(argv)
    if a.what == "report":
        return report(a.out, WORKLOADS)
    names = [n for n in a.only.split(",") if n] or list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {', '.join(BY_NAME)}")
    gpus, per_gpu = counts(ap, "--gpus", a.gpus), counts(ap, "--pes-per-gpu", a.pes_per_gpu)
    return run([BY_NAME[n] for n in names], gpus, per_gpu, a.out, a.timeout, a.dry_run)


if __name__ == "__main__":
    sys.exit(main())
