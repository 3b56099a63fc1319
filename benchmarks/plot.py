"""Draw the PNG of a benchmark's CSV (for runs on a machine without matplotlib).

    python benchmarks/plot.py RESULT.csv [--x bytes]

Columns ``<series>_<metric>`` become one panel per metric with one line per series, against the
``--x`` column; the PNG is written next to the CSV.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402

# metric suffix -> panel label; columns with other suffixes (ratios) are not drawn
METRICS = {"host_us": "host time per call (µs)", "busbw_GBps": "bus bandwidth (GB/s)", "ms": "time (ms)",
           "us": "time (µs)", "tflops": "TFLOP/s", "GBps": "GB/s"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path)
    ap.add_argument("--x", default="bytes")
    a = ap.parse_args()
    header, rows = _results.read_csv(a.csv)
    xs = [float(r[header.index(a.x)]) for r in rows]
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for i, col in enumerate(header):
        for suffix, label in METRICS.items():
            if col.endswith("_" + suffix):
                series = col[: -len(suffix) - 1]
                panels.setdefault(label, {})[series] = (xs, [float(r[i]) for r in rows])
                break
    png = a.csv.with_suffix(".png")
    if not _results.plot(png, a.csv.stem, a.x, list(panels.items())):
        raise SystemExit("matplotlib is not installed")
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
