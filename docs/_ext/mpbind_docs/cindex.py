"""The C-name → Python-name index of every bound function, from the package's own audit
(``mpbind.bindings._coverage``, generated from codegen/ir: the Python name of each C function and the
first library release that exports it, from codegen/symbols through codegen/since.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mpbind.bindings import _coverage

LIBRARY_TITLES = {"nccl": "NCCL", "nvshmem": "NVSHMEM", "cublasmp": "cuBLASMp", "cufftmp": "cuFFTMp"}


@dataclass(frozen=True)
class Entry:
    library: str
    c_name: str
    python_name: str
    since: str
    callers: tuple[str, ...] = ()  # a private entry point: the public functions that call it

    @property
    def private(self) -> bool:
        return self.python_name.startswith("_")

    @property
    def targets(self) -> tuple[str, ...]:
        """The dotted names of the API entries the index links to: the function's own, or for a private
        entry point (a versioned symbol a header's inline function calls) those of its public callers."""
        names = self.callers if self.private else (self.python_name,)
        return tuple(f"mpbind.bindings.{self.library}.{n}" for n in names)


def entries() -> list[Entry]:
    """Every bound C function of every library, in the audit's order (by library, then C name)."""
    out = []
    for library, rows in _coverage.COVERAGE.items():
        since = _coverage.SINCE.get(library, {})
        python = {c: p for c, p, _ in rows if p is not None}
        calls = _coverage.CALLS.get(library, {})  # public C function -> the exported symbol it calls
        for c_name, python_name, _reason in rows:
            if python_name is not None:
                callers = tuple(sorted(python[c] for c, symbol in calls.items() if symbol == c_name and c in python))
                out.append(Entry(library, c_name, python_name, since.get(c_name, ""), callers))
    return out


def _since(text: str) -> str:
    # "<=2.13.4": already exported by the oldest release the record holds
    return f"{text[2:]} or earlier" if text.startswith("<=") else text or "—"


def render(rows: list[Entry]) -> str:
    counts = ", ".join(f"{LIBRARY_TITLES[lib]} {sum(e.library == lib for e in rows)}" for lib in LIBRARY_TITLES)
    out = ["C name to Python name\n=====================\n",
           f"Every C function the flat bindings bind ({len(rows)}: {counts}), its Python name (a link to its "
           "API entry) and the first library release that exports it (\"or earlier\": already in the oldest "
           "release the project's record holds). A call to a function the loaded release lacks raises "
           "``FunctionNotFoundError`` naming that release. ``python -m mpbind coverage --json`` also lists "
           "the functions left out, with the reason.\n"]
    out += _audit()
    for library, title in LIBRARY_TITLES.items():
        mine = [e for e in rows if e.library == library]
        pinned = _coverage.PINNED.get(library, "")
        out.append(f"{title}\n{'-' * len(title)}\n")
        out.append(f"``mpbind.bindings.{library}``, generated from {title} {pinned}.\n")
        out.append(".. list-table::\n   :header-rows: 1\n   :widths: 45 40 15\n\n"
                   "   * - C name\n     - Python name\n     - since\n")
        for e in mine:
            if e.private:
                links = ", ".join(f":py:func:`~{t}`" for t in e.targets)
                python = f"``{e.python_name}``, the entry point of {links}"
            else:
                python = f":py:func:`~{e.targets[0]}`"
            out.append(f"   * - .. _c-{e.c_name}:\n\n       ``{e.c_name}``\n     - {python}\n     - {_since(e.since)}")
        out.append("")
    return "\n".join(out)


def _audit() -> list[str]:
    """The coverage audit's totals (``python -m mpbind coverage``): bound and excluded, by library."""
    out = [".. list-table:: The pinned releases: every C function the headers declare, bound or excluded "
           "(the reasons: ``python -m mpbind coverage``)\n   :header-rows: 1\n",
           "   * - library\n     - pinned\n     - bound\n     - excluded"]
    for library, title in LIBRARY_TITLES.items():
        rows = _coverage.COVERAGE.get(library, [])
        bound = sum(p is not None for _, p, _ in rows)
        out.append(f"   * - {title}\n     - {_coverage.PINNED.get(library, '')}\n     - {bound}\n"
                   f"     - {len(rows) - bound}")
    return [*out, ""]


def write(outdir: Path) -> list[Entry]:
    """Write ``c-index.rst``; returns the entries (the build checks their links)."""
    rows = entries()
    path = outdir / "c-index.rst"
    text = render(rows)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return rows
