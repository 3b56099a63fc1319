"""Pictures of :mod:`mpbind.distributions` values, drawn with matplotlib from the objects themselves: every
element is coloured by the rank that owns it (``Distribution.owners``), so a figure shows what the code
computes, never what someone drew."""

from __future__ import annotations

import hashlib
import io
import itertools
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on a build machine
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from mpbind import distributions as dist  # noqa: E402

REPLICATED = "#bbbbbb"
MAX_CELLS = 4096  # figures are of small examples: one owner look-up per element


def colour(rank: int) -> tuple[float, float, float, float]:
    return to_rgba(plt.get_cmap("tab10")(rank % 10))


def parse(lines: Sequence[str]) -> list[tuple[str, dist.Distribution]]:
    """``label = expression`` per line, the expression evaluated with ``dist`` (mpbind.distributions)."""
    panels = []
    for line in lines:
        if not line.strip():
            continue
        label, sep, expr = line.partition("=")
        if not sep:
            raise ValueError(f"expected 'label = expression', got {line!r}")
        value = eval(expr.strip(), {"dist": dist, "__builtins__": {}})  # the docs' own source, not input
        if not isinstance(value, dist.Distribution):
            raise ValueError(f"{expr.strip()!r} is a {type(value).__name__}, not a distribution")
        panels.append((label.strip(), value))
    return panels


def _owner(d: dist.Distribution, index: tuple[int, ...]) -> int | None:
    owners = d.owners(index)
    return None if len(owners) != 1 else owners[0]


def _draw_2d(ax: plt.Axes, d: dist.Distribution) -> None:
    rows, cols = d.shape
    for i, j in itertools.product(range(rows), range(cols)):
        owner = _owner(d, (i, j))
        face = REPLICATED if owner is None else colour(owner)
        ax.add_patch(plt.Rectangle((j, rows - 1 - i), 1, 1, facecolor=face, edgecolor="white", linewidth=0.8))
        if owner is not None:
            ax.text(j + 0.5, rows - 0.5 - i, str(owner), ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(f"axis 1 ({cols})")
    ax.set_ylabel(f"axis 0 ({rows})")


def _draw_3d(ax: plt.Axes, d: dist.Distribution) -> None:
    import numpy as np

    filled = np.ones(d.shape, dtype=bool)
    colours = np.empty((*d.shape, 4))
    for index in itertools.product(*(range(n) for n in d.shape)):
        owner = _owner(d, index)
        colours[index] = to_rgba(REPLICATED) if owner is None else colour(owner)
    ax.voxels(filled, facecolors=colours, edgecolor=(1, 1, 1, 0.4), linewidth=0.3)
    ax.set_xlabel("axis 0", labelpad=-10)  # no ticks: the labels sit against the box
    ax.set_ylabel("axis 1", labelpad=-10)
    ax.set_zlabel("axis 2", labelpad=-10)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_zticks([])
    ax.set_box_aspect(d.shape)


def draw(panels: list[tuple[str, dist.Distribution]]) -> bytes:
    """One panel per distribution, side by side, and a legend of the ranks; PNG bytes."""
    for label, d in panels:
        cells = 1
        for n in d.shape:
            cells *= n
        if d.ndim not in (2, 3) or cells > MAX_CELLS:
            raise ValueError(f"{label}: draw 2-D or 3-D examples of at most {MAX_CELLS} elements, got {d.shape}")
    fig = plt.figure(figsize=(3.4 * len(panels), 3.6))
    for k, (label, d) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1, projection="3d" if d.ndim == 3 else None)
        (_draw_3d if d.ndim == 3 else _draw_2d)(ax, d)
        ax.set_title(label, fontsize=10)
    nranks = max(d.nranks for _, d in panels)
    handles = [Patch(color=colour(r), label=f"rank {r}") for r in range(nranks)]
    if any(d.replicated for _, d in panels):
        handles.append(Patch(color=REPLICATED, label="every rank"))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.04), ncol=min(len(handles), 6),
               fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.04, right=0.96, top=0.9, bottom=0.08, wspace=0.25)
    buf = io.BytesIO()
    # the tight box takes in the titles, 3-D labels and legend; no metadata: same figure, same bytes
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", pad_inches=0.1, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def write(panels: list[tuple[str, dist.Distribution]], folder: Path, source: str) -> Path:
    """Draw `panels` into `folder` under a name derived from their `source` text; unchanged figures are
    not rewritten."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"dist-{hashlib.sha256(source.encode()).hexdigest()[:16]}.png"
    data = draw(panels)
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)
    return path
