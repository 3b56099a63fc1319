"""src/mpbind has no import circle: the import graph of its modules, Python and Cython, is acyclic.

An edge is an import of one of the package's modules, at module level or inside a function: a lazy
import moves when the cost is paid, not which module needs which. A ``.pyx``'s ``cimport`` is an edge
too (the module imports the functions it cimports at run time), and so is what an ``include``d
``.pxi`` imports. Not edges: a ``.pxd``'s cimports, which name the C types its declarations use and
import nothing at run time (``_internal/<lib>.pxd`` declares its function pointers with
``cy<lib>.pxd``'s types, and ``cy<lib>.pyx`` calls them); imports under ``if TYPE_CHECKING:``, which
never run; and an import of a package the importer is in (``import mpbind`` in ``mpbind._infra.info``):
Python initialises that package before the importer whatever the importer names, and a package
finding its submodules on first access is how it offers them, not a circle. The graph is of import
statements: a module imported by a name computed at run time (``importlib.import_module``) is not seen.
"""

from __future__ import annotations

import graphlib
import io
import re
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
SOURCES = (".py", ".pyx")
INCLUDE = re.compile(r'^\s*include\s+"([^"]+)"', re.M)


def _module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _logical_lines(text: str) -> list[tuple[int, list[str]]]:
    """Each logical line as (indentation, tokens), comments and strings' contents aside. Cython
    tokenizes as Python does for everything an import line holds."""
    lines: list[tuple[int, list[str]]] = []
    tokens: list[str] = []
    indent = 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            continue
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if tokens:
                lines.append((indent, tokens))
            tokens = []
            continue
        if not tokens:
            indent = tok.start[1]
        tokens.append(tok.string)
    return lines


def _imported(tokens: list[str], importer: str, is_package: bool) -> list[str]:
    """The modules an import line names, resolved against the importer ("" for a name that may be a
    module or an attribute: both candidates are returned, the caller keeps the known ones)."""
    if tokens[0] in ("import", "cimport"):
        names = " ".join(tokens[1:]).replace(" . ", ".").split(",")
        return [name.split(" as ")[0].strip() for name in names]
    if tokens[0] != "from" or not ({"import", "cimport"} & set(tokens)):
        return []
    at = next(i for i, t in enumerate(tokens) if t in ("import", "cimport"))
    source = "".join(tokens[1:at])
    if source.startswith("."):
        level = len(source) - len(source.lstrip("."))
        base = importer.split(".")[: None if is_package else -1]
        base = base[: len(base) - (level - 1)]
        source = ".".join([*base, source.lstrip(".")]).rstrip(".")
    names = [t for t in tokens[at + 1:] if t not in ("(", ")", ",", "*")]
    # `a as b`: keep a
    kept = [name for i, name in enumerate(names) if name != "as" and (i == 0 or names[i - 1] != "as")]
    return [source, *(f"{source}.{name}" for name in kept)]


def import_graph(src: Path, package: str = "mpbind") -> dict[str, set[str]]:
    """module -> the package's modules it imports, from the sources under src/<package>."""
    files: dict[str, list[Path]] = {}
    for path in sorted((src / package).rglob("*")):
        if path.suffix in SOURCES:
            files.setdefault(_module_name(path, src), []).append(path)
    graph: dict[str, set[str]] = {}
    for module, paths in files.items():
        is_package = paths[0].stem == "__init__"
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        edges: set[str] = set()
        for path in paths:
            text = path.read_text()
            text += "".join("\n" + (path.parent / inc).read_text() for inc in INCLUDE.findall(text))
            skip_deeper_than: int | None = None
            for indent, tokens in _logical_lines(text):
                if skip_deeper_than is not None and indent > skip_deeper_than:
                    continue
                skip_deeper_than = None
                if tokens[:2] == ["if", "TYPE_CHECKING"]:
                    skip_deeper_than = indent
                    continue
                candidates = _imported(tokens, module, is_package)
                known = [name for name in candidates if name in files]
                # `from a import b`: b when it is a module, else a
                edges.update(known[1:] if tokens[0] == "from" and known[1:] else known)
        graph[module] = edges - ancestors - {module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    if not (SRC / "mpbind").is_dir():
        pytest.skip("the package's sources are not in this checkout")
    return import_graph(SRC)


def test_the_package_has_no_import_circle(graph: dict[str, set[str]]) -> None:
    cycle = _cycle(graph)
    assert not cycle, "import circle: " + " -> ".join(cycle)


def test_the_graph_holds_lazy_imports_and_cimports(graph: dict[str, set[str]]) -> None:
    # a function-level import (errors' per-status classes), a cimport and a TYPE_CHECKING-only import
    assert "mpbind.bindings._status" in graph["mpbind.errors"]
    assert "mpbind.bindings._common" in graph["mpbind.bindings.nccl"]
    assert "mpbind.errors" not in graph["mpbind"]


def test_a_lazy_circle_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from __future__ import annotations\n\nfrom pkg.sub import b\n")
    (pkg / "sub" / "b.pyx").write_text('include "c.pxi"\n')
    (pkg / "sub" / "c.pxi").write_text("cdef f():\n    from ..a import (\n        x,\n    )\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert set(_cycle(graph)) == {"pkg.a", "pkg.sub.b"}
