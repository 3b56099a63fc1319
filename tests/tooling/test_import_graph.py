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
The C++ core ``mpbind._core`` is a module of the graph too: its edges are the modules its sources
import by literal name (``nb::module_::import_("mpbind.errors")``); an import of one of its submodules
(``mpbind._core.nccl``) is an edge to it.

The edges follow the layers of docs/DESIGN.md's picture (``ALLOWED``): the library facades
(``nccl``, ``nvshmem``, ``cublasmp``, ``cufftmp``, ``bootstrap``) and the generated bindings never
import a distributed feature (``fft``, ``matmul``, ``collective``, ``kernels``), nor does the private
infrastructure (``mpbind._infra``); the features build on the facades, the core, the distributions and
the infrastructure.

Private names: ``from <module of mpbind> import _name``, where ``_name`` is not a module, is refused
in the package's sources unless the module is in ``mpbind._infra`` (infrastructure exists to be shared
inside the package; a facade's or a feature's private names are its own). Importing a private module
(``from mpbind._infra import args as _args``, ``from mpbind.fft import _planner``) is not such an
import. Reads of private attributes off an imported module (``module._name``) are not imports: they
are checked by tests/tooling/test_no_private_reads.py, with reads off other objects.
"""

from __future__ import annotations

import graphlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
SOURCES = (".py", ".pyx")
INCLUDE = re.compile(r'^\s*include\s+"([^"]+)"', re.M)
# Modules built from C++ (the folder of their sources), and how those sources import Python modules.
EXTENSIONS = {"_core": "*.cpp"}
CPP_IMPORT = re.compile(r'import_\(\s*"([\w.]+)"\s*\)')

# The layers of docs/DESIGN.md's picture, and which layers each may import (its own included).
FACADES = ("nccl", "nvshmem", "cublasmp", "cufftmp", "bootstrap")
FEATURES = ("fft", "matmul", "collective", "kernels")
FRAMEWORKS = ("torch", "jax")
ALLOWED: dict[str, frozenset[str]] = {
    "package": frozenset({"infra", "core", "base", "bindings"}),
    "framework": frozenset({"framework", "feature", "distributions", "facade", "control", "core", "infra", "bindings",
                            "base"}),
    "feature": frozenset({"feature", "distributions", "facade", "control", "core", "infra", "bindings", "base"}),
    "distributions": frozenset({"infra", "base"}),
    "facade": frozenset({"facade", "distributions", "control", "core", "infra", "bindings", "base"}),
    "control": frozenset({"control", "core", "infra", "bindings", "base"}),
    "core": frozenset({"bindings", "base"}),
    "infra": frozenset({"infra", "core", "bindings", "base"}),
    "bindings": frozenset({"bindings", "infra", "base"}),
    "base": frozenset({"base", "bindings"}),
}
# Private names imported across modules that the process group's agreement replaces; an entry that
# no longer occurs fails (test_every_known_private_import_still_occurs), so the list only shrinks.
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


def layer(module: str) -> str:
    """The layer of a module of mpbind (docs/DESIGN.md's picture)."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in ("", "__main__"):
        return "package"
    if top in FRAMEWORKS:
        return "framework"
    if top in FEATURES:
        return "feature"
    if top in FACADES:
        return "facade"
    if top == "distributions":
        return "distributions"
    if top == "process_group":
        return "control"
    if top == "_core":
        return "core"
    if top == "_infra":
        return "infra"
    if top == "bindings":
        return "bindings"
    if top in ("errors", "_error_bases", "typing"):
        return "base"
    raise AssertionError(f"{module} is in no layer of the picture: add it to one (and to docs/DESIGN.md)")


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


def _sources(src: Path, package: str) -> dict[str, list[Path]]:
    files: dict[str, list[Path]] = {}
    for path in sorted((src / package).rglob("*")):
        if path.suffix in SOURCES:
            files.setdefault(_module_name(path, src), []).append(path)
    return files


def _import_lines(src: Path, package: str) -> Iterator[tuple[str, list[str], bool]]:
    """(importing module, tokens of one import line that runs, whether the module is a package) for
    every Python and Cython source of the package (an included ``.pxi`` counts as its includer's)."""
    for module, paths in _sources(src, package).items():
        is_package = paths[0].stem == "__init__"
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
                if tokens[0] in ("import", "cimport", "from"):
                    yield module, tokens, is_package


def _extension_of(name: str, extensions: set[str]) -> str | None:
    return next((ext for ext in extensions if name == ext or name.startswith(ext + ".")), None)


def import_graph(src: Path, package: str = "mpbind") -> dict[str, set[str]]:
    """module -> the package's modules it imports, from the sources under src/<package>."""
    files = set(_sources(src, package))
    extensions = {f"{package}.{folder}" for folder in EXTENSIONS if (src / package / folder).is_dir()}
    graph: dict[str, set[str]] = {module: set() for module in files | extensions}
    for module, tokens, is_package in _import_lines(src, package):
        candidates = _imported(tokens, module, is_package)
        known = [name for name in candidates if name in files]
        # `from a import b`: b when it is a module, else a
        edges = set(known[1:] if tokens[0] == "from" and known[1:] else known)
        # an extension module or one of its submodules (mpbind._core.nccl): the extension
        edges |= {ext for name in candidates[:1] if (ext := _extension_of(name, extensions))}
        graph[module] |= edges
    for ext in extensions:
        folder, pattern = ext.split(".")[-1], EXTENSIONS[ext.split(".")[-1]]
        for path in sorted((src / package / folder).glob(pattern)):
            named = CPP_IMPORT.findall(path.read_text())
            graph[ext] |= {_owner_module(name, files) for name in named if name.startswith(package + ".")}
    for module in graph:
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        graph[module] -= ancestors | {module}
    return graph


def _owner_module(name: str, files: set[str]) -> str:
    """The longest known module `name` starts with (a C++ import names a module)."""
    while name not in files and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def private_name_imports(src: Path, package: str = "mpbind") -> set[tuple[str, str, str]]:
    """(importer, module, name) for every ``from <module> import _name`` of a private name that is not
    a module, where <module> is one of the package's and not in ``<package>._infra``."""
    files = set(_sources(src, package))
    found: set[tuple[str, str, str]] = set()
    for module, tokens, is_package in _import_lines(src, package):
        if tokens[0] != "from":
            continue
        source, *imported = _imported(tokens, module, is_package)
        if not (source == package or source.startswith(package + ".")) or source.startswith(f"{package}._infra"):
            continue
        for full in imported:
            name = full.rsplit(".", 1)[1]
            if name.startswith("_") and not name.startswith("__") and full not in files and full != f"{package}._core":
                found.add((module, source, name))
    return found


def forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    """Every edge that follows no arrow of the picture, as 'importer (layer) -> imported (layer)'."""
    return sorted(f"{a} ({layer(a)}) -> {b} ({layer(b)})" for a, bs in graph.items() for b in bs
                  if layer(b) not in ALLOWED[layer(a)])


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


def test_every_module_is_in_a_layer_and_every_edge_follows_an_arrow(graph: dict[str, set[str]]) -> None:
    bad = forbidden_edges(graph)
    assert not bad, "imports against the layers of docs/DESIGN.md:\n" + "\n".join(bad)


def test_no_facade_nor_infrastructure_imports_a_feature(graph: dict[str, set[str]]) -> None:
    # what the table above says, spelled out: the rule the layout exists for
    below = [m for m in graph if layer(m) in ("facade", "bindings", "infra", "core", "base", "distributions")]
    assert {"mpbind.nccl", "mpbind.cublasmp", "mpbind._infra.loader", "mpbind._core"} <= set(below)
    reaching = {m: sorted(b for b in graph[m] if layer(b) == "feature") for m in below}
    assert not {m: f for m, f in reaching.items() if f}


def test_the_core_and_its_submodules_are_one_module(graph: dict[str, set[str]]) -> None:
    assert "mpbind._core" in graph["mpbind.nccl"]  # `from mpbind._core import nccl as _core_nccl`
    assert "mpbind.errors" in graph["mpbind._core"]  # nb::module_::import_("mpbind.errors")


def test_no_private_name_is_imported_across_modules() -> None:
    if not (SRC / "mpbind").is_dir():
        pytest.skip("the package's sources are not in this checkout")
    found = private_name_imports(SRC) - KNOWN_PRIVATE_IMPORTS
    assert not found, "private names imported from another module: " + ", ".join(
        f"{importer} imports {name} from {module}" for importer, module, name in sorted(found))


def test_every_known_private_import_still_occurs() -> None:
    if not (SRC / "mpbind").is_dir():
        pytest.skip("the package's sources are not in this checkout")
    gone = KNOWN_PRIVATE_IMPORTS - private_name_imports(SRC)
    assert not gone, f"remove from KNOWN_PRIVATE_IMPORTS: {sorted(gone)}"


def _fabricated(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "mpbind"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return tmp_path


def test_a_facade_importing_a_feature_is_found(tmp_path: Path) -> None:
    src = _fabricated(tmp_path, {
        "matmul/__init__.py": "from mpbind import cublasmp\n",
        "cublasmp.py": "def plan():\n    from mpbind.matmul import plan\n    return plan\n",
        "_infra/__init__.py": "", "_infra/args.py": "import mpbind.fft\n", "fft.py": "",
        "_core/core.cpp": 'nb::module_::import_("mpbind.fft");\n',
    })
    graph = import_graph(src)
    assert graph["mpbind._core"] == {"mpbind.fft"}
    assert forbidden_edges(graph) == ["mpbind._core (core) -> mpbind.fft (feature)",
                                      "mpbind._infra.args (infra) -> mpbind.fft (feature)",
                                      "mpbind.cublasmp (facade) -> mpbind.matmul (feature)"]
    assert set(_cycle(graph)) == {"mpbind.cublasmp", "mpbind.matmul"}


def test_a_private_name_import_is_found(tmp_path: Path) -> None:
    src = _fabricated(tmp_path, {
        "fft/__init__.py": "from mpbind.fft import _planner\nfrom mpbind.fft._planner import plan_fft\n"
                           "from mpbind._infra.args import _C_TYPES\n",
        "fft/_planner.py": "", "_infra/__init__.py": "", "_infra/args.py": "",
        "matmul.py": "def f():\n    from mpbind.fft._planner import (\n        _shape as shape,\n    )\n"
                     "    from .cublasmp import _CUDA_TYPES\n",
        "cublasmp.py": "",
    })
    assert private_name_imports(src) == {("mpbind.matmul", "mpbind.fft._planner", "_shape"),
                                         ("mpbind.matmul", "mpbind.cublasmp", "_CUDA_TYPES")}


def test_docs_design_states_the_same_layers() -> None:
    design = SRC.parent / "docs" / "DESIGN.md"
    if not design.is_file():
        pytest.skip("docs/DESIGN.md is not in this checkout")
    section = design.read_text().split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    names = {"package": "package", "framework ops": "framework", "features": "feature",
             "distributions": "distributions", "facades": "facade", "control plane": "control", "core": "core",
             "infrastructure": "infra", "bindings": "bindings", "base": "base"}
    documented = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in names:
            allowed = {names[w.split(" (")[0].strip()] for w in cells[2].split(",")}
            documented[names[cells[0]]] = frozenset(allowed | {names[cells[0]]})
    assert documented == {k: v | {k} for k, v in ALLOWED.items()}
