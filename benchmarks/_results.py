"""How every benchmark reports: a Markdown table on stdout, a CSV and, where matplotlib is
installed, a PNG plot (otherwise ``python benchmarks/plot.py RESULT.csv`` draws it later)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; floats with three significant decimals."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def plot(png: Path, title: str, x_label: str, panels: Sequence[tuple[str, dict[str, tuple[list[float], list[float]]]]],
         *, log_x: bool = True, log_y: bool = True, columns: int | None = None) -> bool:
    """One panel per (y label, {series: (xs, ys)}), `columns` to a row (default: all in one row); False
    (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    across = columns or len(panels)
    down = -(-len(panels) // across)
    fig, axes = plt.subplots(down, across, figsize=(6 * across, 4.5 * down), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (y_label, series) in zip(axes.flat, panels, strict=False):
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
        if log_x:
            ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small" if len(series) <= 8 else "xx-small")
    fig.suptitle(title)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return True


def report(csv_path: Path, rows: Sequence[dict[str, Any]], title: str, x: str,
           panels: Sequence[tuple[str, Sequence[str], str]]) -> None:
    """Rows of one measurement each (dicts with the same keys, `x` among them): the table on stdout,
    the CSV at `csv_path` and its plot beside it (``.png``), one panel per (y label, series, column
    suffix): series ``name`` is column ``name + suffix``."""
    header = list(rows[0])
    cells = [[r[h] for h in header] for r in rows]
    print(table(header, cells))
    write_csv(csv_path, header, cells)
    xs = [float(r[x]) for r in rows]
    drawn = plot(csv_path.with_suffix(".png"), title, x, [
        (label, {name: (xs, [r[name + suffix] for r in rows]) for name in names}) for label, names, suffix in panels])
    print(f"wrote {csv_path}" + (" and .png" if drawn else " (no matplotlib: no plot)"))
