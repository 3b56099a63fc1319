"""Tensor-parallel layers through mpbind's planned matmuls (cuBLASMp AllGather+GEMM and
GEMM+ReduceScatter) against NCCL + torch.matmul, the local GEMM alone, and PyTorch's fused
symmetric-memory ops, with the plan's communication settings explored. Two GPUs, one rank each:

    timeout 600 mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 \\
        -x NVSHMEM_DISABLE_NVLS=1 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x LD_PRELOAD -x PYTHONPATH \\
        -x MPBIND_CUBLASMP_PATH python benchmarks/tp_collective_matmul.py [--out DIR]

(``LD_PRELOAD`` names an NCCL of 2.29.2 or newer, which cuBLASMp needs, so that torch.distributed
uses the same one; the header line says which NCCL each side loaded.) About 1-2 minutes on two H200s.

Cases, M tokens over all ranks (each rank holds M/P of them), P ranks:

* all-gather+GEMM, ``all_gather(x) @ w.T``: M = 1024, 4096, 16384, K = 8192, N = 28672 (N/P per rank);
* GEMM+reduce-scatter, ``reduce_scatter(h @ w.T)``: same M, K = 28672 (K/P per rank), N = 8192;
* both in bf16 and FP8 (e4m3 x e4m3 with per-tensor scales, bf16 out, against ``torch._scaled_mm``);
* all-gather+GEMM at the JAX Pallas collective-matmul guide's shape: fp16, 1024 rows per GPU,
  K = 4096, N = 4096 per GPU (two H100s there: NCCL + cuBLAS 147 us, Pallas' kernel 102 us).

Per case: the plan with cuBLASMp's defaults and with the fastest of the settings explored (algorithm
hint x SMs for communication x, for a reduction, the type partial products travel in; every
setting's result checked first; all of them in ``tp_collective_matmul_settings.csv``); for
all-gather+GEMM also with x in registered NCCL memory; NCCL ``all_gather_into_tensor`` + ``torch.matmul``
(or ``matmul`` + ``reduce_scatter_tensor``); this rank's GEMM alone (communication fully hidden);
``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` (bf16/fp16).
Times are CUDA-event medians of ``--iters`` calls, the ranks aligned by a barrier before each (the
slowest rank's median). Rank 0 prints Markdown tables and writes ``tp_collective_matmul.csv`` and
``.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
import _tp  # noqa: E402  (sets NVLink multicast off before torch starts)
import torch  # noqa: E402

HEADER = ["case", "dtype", "M", "K", "N", "plan default (us)", "plan best (us)", "best settings",
          "best, B registered (us)", "NCCL + torch (us)", "local GEMM (us)", "torch fused (us)", "fastest / local",
          "fastest / NCCL + torch"]


def cases(tokens: list[int], dtypes: list[str], p: int) -> list[tuple[str, str, int, int, int]]:
    out = []
    for dtype in dtypes:
        out += [("ag", dtype, m, 8192, 28672) for m in tokens]
        out += [("rs", dtype, m, 28672, 8192) for m in tokens]
    out.append(("ag (Pallas guide)", "fp16", 1024 * p, 4096, 4096 * p))
    return out


def measure(ranks: _tp.Ranks, case: tuple[str, str, int, int, int], a: argparse.Namespace,
            settings_rows: list[list[Any]]) -> list[Any]:
    name, dtype, m, k, n = case
    lay = _tp.layer(ranks, name[:2], dtype, m, k, n)
    want = lay.reference()
    found = _tp.explore(lay, want, a.iters, a.warmup, a.search_iters)
    settings_rows += [[name, dtype, m, setting, outcome] for setting, outcome in found.tried]
    unfused = _tp.anchor_us(lay, lay.unfused, want, a.iters, a.warmup)
    local = _tp.event_us(ranks, lay.local_gemm(), a.iters, a.warmup)
    fused = _tp.anchor_us(lay, lay.torch_fused, want, a.iters, a.warmup)
    registered = found.registered_us
    fastest = min(found.best_us, registered) if isinstance(registered, float) else found.best_us
    ratio = (lambda x: fastest / x if isinstance(x, float) else "")  # noqa: E731
    row = [name, dtype, m, k, n, found.default_us, found.best_us, _tp.describe(found.best),
           "" if registered is None else registered, unfused, local, fused, ratio(local), ratio(unfused)]
    del lay, want
    torch.cuda.empty_cache()
    return row


def verdicts(rows: list[list[Any]]) -> list[str]:
    """The issue's targets, read off this run."""
    out = []

    def find(case: str, dtype: str, m: int | None = None) -> list[Any] | None:
        hits = [r for r in rows if r[0] == case and r[1] == dtype and (m is None or r[2] == m)]
        return hits[0] if hits else None

    for case, dtype, column, limit, what in (("ag", "bf16", 12, 1.05, "all-gather+GEMM hides its communication"),
                                             ("rs", "bf16", 12, 1.15, "GEMM+reduce-scatter within 1.15x of its GEMM"),
                                             ("ag (Pallas guide)", "fp16", 13, 0.8,
                                              "Pallas shape: all-gather+GEMM <= 0.8x NCCL + torch")):
        row = find(case, dtype, 16384 if case in ("ag", "rs") else None)
        if row is None or not isinstance(row[column], float):
            out.append(f"- {what}: not measured")
            continue
        met = "met" if row[column] <= limit else "MISSED"
        out.append(f"- {what} (M = {row[2]}): {row[column]:.3f} (target <= {limit}): {met}")
    return out


def main() -> int:
    ap = _tp.arguments(__doc__)
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--dtypes", default="bf16,fp8")
    a = ap.parse_args()
    ranks = _tp.start(port=29541)
    rows: list[list[Any]] = []
    settings_rows: list[list[Any]] = []
    for case in cases([int(t) for t in a.tokens.split(",")], a.dtypes.split(","), ranks.size):
        rows.append(measure(ranks, case, a, settings_rows))
        if ranks.rank == 0:
            print(f"measured {case[0]} {case[1]} M={case[2]}", flush=True)
    title = _tp.finish(ranks, HEADER, rows)
    if title is None:
        return 0
    print("\n".join(verdicts(rows)))
    best = {}
    for case, dtype, m, setting, outcome in settings_rows:
        if isinstance(outcome, float):
            best.setdefault((case, dtype, m), []).append((outcome, setting))
    print("\nFastest settings per case (us):")
    print(_results.table(["case", "dtype", "M", "1st", "2nd", "3rd"],
                         [[*key, *(f"{us:.0f}: {s}" for us, s in sorted(v)[:3])] for key, v in best.items()]))
    _results.write_csv(a.out / "tp_collective_matmul.csv", HEADER, rows)
    _results.write_csv(a.out / "tp_collective_matmul_settings.csv", ["case", "dtype", "M", "settings", "us"],
                       settings_rows)
    panels = []
    for case in ("ag", "rs"):
        for dtype in a.dtypes.split(","):
            series: dict[str, tuple[list[float], list[float]]] = {}
            for row in (r for r in rows if r[0] == case and r[1] == dtype):
                for label, col in (("plan default", 5), ("plan best", 6), ("NCCL + torch", 9), ("local GEMM", 10),
                                   ("torch fused", 11)):
                    if isinstance(row[col], float):
                        xs, ys = series.setdefault(label, ([], []))
                        xs.append(row[2])
                        ys.append(row[col])
            if series:
                panels.append((f"{case} {dtype}: time (us)", series))
    if _results.plot(a.out / "tp_collective_matmul.png", title[:110], "M (tokens)", panels):
        print(f"wrote {a.out / 'tp_collective_matmul.png'}")
    print(f"wrote {a.out / 'tp_collective_matmul.csv'}, {a.out / 'tp_collective_matmul_settings.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
