"""Square matmuls (8192^3, 16384^3, bf16) split over two GPUs through mpbind's planned matmuls
(cuBLASMp AllGather+GEMM and GEMM+ReduceScatter), against torch.matmul of the whole product on one GPU:

    timeout 600 mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 \\
        -x NVSHMEM_DISABLE_NVLS=1 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x LD_PRELOAD -x PYTHONPATH \\
        -x MPBIND_CUBLASMP_PATH python benchmarks/tp_square_matmul.py [--sizes 8192,16384] [--out DIR]

About a minute on two H200s. The layouts are ``tp_collective_matmul.py``'s with M = K = N = size;
each plan runs with cuBLASMp's defaults and with the fastest of the communication settings
explored (every result checked against NCCL + torch first). TFLOP/s = 2 size^3 / time, times the
CUDA-event median of ``--iters`` calls with the ranks aligned before each; one GPU: torch.matmul of
the two size x size matrices on each GPU at once, the slower one's median. Rank 0 prints a Markdown
table and writes ``tp_square_matmul.csv`` and ``.png`` under ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
import _tp  # noqa: E402  (sets NVLink multicast off before torch starts)
import torch  # noqa: E402

HEADER = ["size", "algorithm", "plan default TFLOP/s", "plan best TFLOP/s", "best settings", "1 GPU TFLOP/s",
          "best / 1 GPU"]


def one_gpu_us(ranks: _tp.Ranks, size: int, iters: int, warmup: int) -> float:
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn((size, size), generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn((size, size), generator=g, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(a)
    return _tp.event_us(ranks, lambda: torch.matmul(a, b, out=out), iters, warmup)


def main() -> int:
    ap = _tp.arguments(__doc__)
    ap.add_argument("--sizes", default="8192,16384")
    a = ap.parse_args()
    ranks = _tp.start(port=29542)
    rows: list[list[Any]] = []
    for size in (int(s) for s in a.sizes.split(",")):
        flop = 2.0 * size**3

        def tflops(us: float, flop: float = flop) -> float:
            return flop / us / 1e6

        single = tflops(one_gpu_us(ranks, size, a.iters, a.warmup))
        torch.cuda.empty_cache()
        for op, name in (("ag", "AllGather+GEMM"), ("rs", "GEMM+ReduceScatter")):
            lay = _tp.layer(ranks, op, "bf16", size, size, size)
            found = _tp.explore(lay, lay.reference(), a.iters, a.warmup, a.search_iters)
            best = tflops(found.best_us)
            rows.append([size, name, tflops(found.default_us), best, _tp.describe(found.best), single, best / single])
            del lay
            torch.cuda.empty_cache()
        if ranks.rank == 0:
            print(f"measured {size}^3", flush=True)
    title = _tp.finish(ranks, HEADER, rows)
    if title is None:
        return 0
    for row in rows:
        if row[0] == 16384 and row[1] == "AllGather+GEMM":
            print(f"- 16384^3 AllGather+GEMM: {row[6]:.2f}x one GPU (target >= 1.9): "
                  f"{'met' if row[6] >= 1.9 else 'MISSED'}")
    _results.write_csv(a.out / "tp_square_matmul.csv", HEADER, rows)
    series: dict[str, tuple[list[float], list[float]]] = {}
    for row in rows:
        for label, col in ((f"{row[1]} default", 2), (f"{row[1]} best", 3), ("torch.matmul, 1 GPU", 5)):
            xs, ys = series.setdefault(label, ([], []))
            if row[0] not in xs:
                xs.append(row[0])
                ys.append(row[col])
    if _results.plot(a.out / "tp_square_matmul.png", title[:110], "size (m = n = k)", [("TFLOP/s", series)],
                     log_y=False):
        print(f"wrote {a.out / 'tp_square_matmul.png'}")
    print(f"wrote {a.out / 'tp_square_matmul.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
