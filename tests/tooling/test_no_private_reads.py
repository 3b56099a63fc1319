"""No private reads across modules: a module touches only its own private names, and the scripts
around the package (benchmarks, examples, GPU suites) touch none of mpbind's.

A private name is ``_name`` (one leading underscore; not a dunder ``__name__``, nor a sunder
``_name_``: ctypes' ``_fields_`` and enum's ``_value_`` are those libraries' public protocols).
The check reads every ``x._name`` (read, write or delete; also ``getattr``/``setattr``/``hasattr``/
``delattr``/``object.__setattr__`` with a literal name) and decides from the source alone whose
``x`` is. In the package's sources (every ``.py`` under ``src/mpbind``) it is allowed when ``x`` is:

- ``self`` or ``cls`` inside a class body, ``super()``, or ``type(self)``: the object's own code;
- a class defined in the same module (``Box._of(...)``: a module's factory calling its own class's
  private constructor; Python's underscore makes a name private to its module, and the module that
  defines a class owns its private members);
- a name the enclosing functions know to be such a class's instance: a parameter or variable
  annotated with it (``other: Box``, ``"Box"``, ``Box | None``, ``Optional[Box]``), or a variable
  assigned ``Box(...)``, ``cls(...)``, ``type(self)(...)`` or ``X.__new__(...)``;
- an mpbind module that is private infrastructure, used as a module: ``mpbind._core`` and its
  submodules, ``mpbind._infra.*`` (what ``from mpbind._infra.args import _name`` may import too,
  tests/tooling/test_import_graph.py), or a private module reached as an attribute
  (``mpbind._core``, ``bindings._status``);
- a third-party object listed in ``THIRD_PARTY`` with the reason, by file and expression.

Anything else is refused: an object of another module (``plan._core``, ``comm._core``), a public
module's private name (``cublasmp._CUDA_TYPES``, ``nvshmem._device()``), and a variable whose class
the source does not say (annotate it, or give the owner a public name). A facade's object handed to
the core goes through ``mpbind._infra.owned.core_of``, which reads ``_core`` where ``Owned`` declares it.

The scripts around the package (``benchmarks/*.py``, ``examples/*.py``, ``tests/gpu/*.py``,
``tests/faults/*.py``) follow the same rule for their own classes, read no private attribute of
anything of mpbind's (modules included: ``_core._testing`` is refused), import no private name of
mpbind, and import a private module of mpbind only where ``READER_PRIVATE_MODULES`` lists it for
them, with the reason; a listed module must exist. Nothing on a CPU machine runs them, so this is
what keeps a rename inside the package from breaking them unseen.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "mpbind"
READER_GLOBS = ("benchmarks/*.py", "examples/*.py", "tests/gpu/*.py", "tests/faults/*.py")

# Private names of other libraries read on purpose: (file, expression) -> why. An entry that no longer
# occurs fails (test_every_listed_third_party_read_still_occurs), so the list only shrinks.
THIRD_PARTY: dict[tuple[str, str], str] = {
    ("src/mpbind/_infra/loader.py", "lib._handle"):
        "ctypes.CDLL's dlopen handle (ctypes has no public accessor): the one handle every symbol is looked up on",
    ("src/mpbind/_infra/loader.py", "dl._handle_uint"):
        "cuda.pathfinder's LoadedDL field holding the dlopen handle as an int (its only form of it)",
    ("src/mpbind/cufftmp.py", "MPI._addressof"):
        "mpi4py's documented way to an MPI_Comm's address, which cuFFTMp's attach takes",
    ("src/mpbind/torch/_ops.py", "torch._C"): "PyTorch's C module, for the query below",
    ("src/mpbind/torch/_ops.py", "torch._C._cuda_getCurrentRawStream"):
        "the current stream's handle as an int, without making a Stream object per call; no public form",
    ("src/mpbind/torch/_library.py", "torch._C"): "PyTorch's C module, for the queries and the guard below",
    ("src/mpbind/torch/_library.py", "torch._C._is_torch_function_mode_enabled"):
        "whether a torch-function mode is active, which a direct call (no dispatcher) would bypass; no public form",
    ("src/mpbind/torch/_library.py", "torch._C._len_torch_dispatch_stack"):
        "whether a dispatch mode is active, which a direct call (no dispatcher) would bypass; no public form",
    ("src/mpbind/torch/_library.py", "torch._C._are_functorch_transforms_active"):
        "whether vmap or a functorch transform is active, which a direct call would bypass; no public form",
    ("src/mpbind/torch/_library.py", "torch._C._is_tracing"):
        "whether torch.jit.trace is recording, which a direct call would bypass: what the public "
        "torch.jit.is_tracing returns outside TorchScript, without its Python frame (~0.2 us per eager call)",
    ("src/mpbind/torch/_library.py", "torch._C._AutoDispatchBelowAutograd"):
        "the guard an autograd kernel redispatches under (what torch.library's own autograd kernels use)",
    ("benchmarks/nccl_allreduce.py", "torch.cuda._sleep"):
        "PyTorch's spin kernel, which holds the stream while the host queues the timed calls (no public form)",
    ("src/mpbind/kernels/__init__.py", "ctypes._SimpleCData"):
        "the base class of ctypes' scalar types: how a ctypes kernel argument is recognised",
    ("benchmarks/_tp.py", "torch._scaled_mm"): "PyTorch's FP8 GEMM, the reference of the FP8 layers",
    ("tests/gpu/tp_layers_suite.py", "torch._scaled_mm"): "PyTorch's FP8 GEMM, the reference of the FP8 layers",
    ("tests/gpu/torch_fft_suite.py", "torch._dynamo"):
        "torch._dynamo.explain: the graph-break count of a function, which torch.compile has no public form of",
    ("tests/gpu/test_torch_matmul_gpu.py", "torch._dynamo"):
        "torch._dynamo.explain: the graph-break count of a function, which torch.compile has no public form of",
    ("examples/tp_mlp.py", "torch._dynamo"):
        "torch._dynamo.explain: the graph-break count of a function, which torch.compile has no public form of",
    ("benchmarks/nvshmem_latency.py", "uid._data"):
        "nvshmem4py's unique id bytes, broadcast as nvshmem.core.init does",
    ("benchmarks/nvshmem_latency.py", "nb_internal._inspect_function_pointer"):
        "nvshmem4py's table of the functions it bound: that it uses the same library copy as mpbind",
}

# Private modules of mpbind the scripts around the package import: module -> (file globs, why).
READER_PRIVATE_MODULES: dict[str, tuple[tuple[str, ...], str]] = {
    "mpbind._core": (READER_GLOBS, "the core's registries (queued, alive, registrations) and hot calls, "
                                   "checked and measured without the facades in between"),
    "mpbind._core._testing": (("tests/gpu/*.py",), "the core's test hooks (its collective fence, the cost of a "
                                                   "symmetric array's description): GPU checks of the core"),
    "mpbind._infra.loader": (READER_GLOBS, "the loaded library's path and version, for reports and skips"),
    "mpbind._infra.info": (READER_GLOBS, "the GPU count, without a CUDA binding of the script's own"),
    "mpbind._infra.placement": (("tests/gpu/*.py",), "GPU checks of the placement check itself"),
    "mpbind.torch._ops": (("tests/gpu/*.py",), "GPU checks of when an eager call may skip the dispatcher"),
    "mpbind.torch._native": (("tests/gpu/*.py",), "GPU checks of the gate that runs the C++ kernels eagerly"),
    "mpbind.torch._nccl": (("tests/gpu/*.py",), "GPU checks that the collectives' functions ask that gate"),
    "mpbind._infra.families": (("tests/gpu/*.py",), "GPU checks of the wheel-family check itself"),
    "mpbind.bindings._coverage": (("tests/gpu/*.py",), "the coverage table the NCCL GPU test walks"),
    "mpbind.kernels._build": (("benchmarks/*.py",), "the NVRTC/nvJitLink toolchain a kernel benchmark reports"),
}

# Infrastructure: its modules' names (private ones included) are for the whole package.
INFRASTRUCTURE = ("mpbind._core", "mpbind._infra")
CHECKERS = ("getattr", "setattr", "hasattr", "delattr")
CORE_SUBMODULE = re.compile(r'def_submodule\(\s*"(\w+)"')


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not (len(name) > 2 and name.endswith("_"))


def package_modules(src: Path = SRC) -> set[str]:
    """Every module of mpbind: its Python and Cython sources, and the core's submodules."""
    modules = set()
    for path in src.rglob("*"):
        if path.suffix in (".py", ".pyx"):
            parts = path.relative_to(src.parent).with_suffix("").parts
            modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    if (src / "_core").is_dir():
        modules.add("mpbind._core")
        for cpp in (src / "_core").glob("*.cpp"):
            modules |= {f"mpbind._core.{name}" for name in CORE_SUBMODULE.findall(cpp.read_text())}
    return modules


@dataclass
class Finding:
    line: int
    column: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.line}: {self.text} ({self.why})"


@dataclass
class _Scope:
    in_class: bool
    own: set[str] = field(default_factory=set)  # names known to be instances of this module's classes


class _Scanner(ast.NodeVisitor):
    """The private reads of one file that no rule above allows."""

    def __init__(self, tree: ast.Module, module: str | None, modules: set[str], reader: bool) -> None:
        self.module, self.modules, self.reader = module, modules, reader
        self.classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self.imported = self._imports(tree)
        self.scopes = [_Scope(in_class=False)]
        self.found: list[Finding] = []

    # --- what names stand for ---

    def _imports(self, tree: ast.Module) -> dict[str, str]:
        """name -> the dotted name it was imported as (`import a.b` binds a; `from a import b` binds a.b)."""
        names: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        names[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:  # mpbind has no relative import
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        return names

    def _own_class(self, annotation: ast.expr | None) -> bool:
        """`annotation` names a class of this module (C, "C", C | None, Optional[C])."""
        if annotation is None:
            return False
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return False
        if isinstance(annotation, ast.Name):
            return annotation.id in self.classes
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            sides = [annotation.left, annotation.right]
            return any(self._own_class(s) for s in sides) and all(
                self._own_class(s) or (isinstance(s, ast.Constant) and s.value is None) for s in sides)
        if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name) \
                and annotation.value.id == "Optional":
            return self._own_class(annotation.slice)
        return False

    def _constructed(self, value: ast.expr) -> bool:
        """`value` makes an instance of this module's class: C(...), cls(...), type(self)(...), X.__new__(...)."""
        if not isinstance(value, ast.Call):
            return False
        f = value.func
        if isinstance(f, ast.Attribute) and f.attr == "__new__":
            return self._is_own_class_expr(f.value) or (
                isinstance(f.value, ast.Name) and f.value.id == "object" and bool(value.args)
                and self._is_own_class_expr(value.args[0]))
        return self._is_own_class_expr(f)

    def _is_own_class_expr(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.classes or (node.id == "cls" and self._in_class())
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
                and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
                and self._in_class())

    def _in_class(self) -> bool:
        return any(s.in_class for s in self.scopes)

    def _own_object(self, name: str) -> bool:
        return any(name in s.own for s in self.scopes)

    # --- scopes ---

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scopes.append(_Scope(in_class=True))
        self.generic_visit(node)
        self.scopes.pop()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        scope = _Scope(in_class=False)
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                    *([a.kwarg] if a.kwarg else [])]:
            if self._own_class(arg.annotation):
                scope.own.add(arg.arg)
        for inner in ast.walk(node):
            if isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name) \
                    and self._own_class(inner.annotation):
                scope.own.add(inner.target.id)
        self.scopes.append(scope)
        for inner in ast.walk(node):  # after the scope is entered: cls(...) needs to know it is in a class
            if isinstance(inner, ast.Assign) and self._constructed(inner.value):
                scope.own |= {t.id for t in inner.targets if isinstance(t, ast.Name)}
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function  # type: ignore[assignment]

    # --- the reads ---

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr):
            self._check(node, node.value, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        checker = isinstance(f, ast.Name) and f.id in CHECKERS
        object_setattr = isinstance(f, ast.Attribute) and f.attr in ("__setattr__", "__delattr__") \
            and isinstance(f.value, ast.Name) and f.value.id == "object"
        if (checker or object_setattr) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and is_private(node.args[1].value):
            self._check(node, node.args[0], node.args[1].value)
        self.generic_visit(node)

    def _check(self, node: ast.expr, receiver: ast.expr, name: str) -> None:
        why = self._refusal(receiver, name)
        if why is not None:
            self.found.append(Finding(node.lineno, node.col_offset, ast.unparse(node), why))

    def _refusal(self, receiver: ast.expr, name: str) -> str | None:
        """Why reading `name` off `receiver` is refused, or None where a rule allows it."""
        if isinstance(receiver, ast.Name):
            if receiver.id in ("self", "cls") and self._in_class():
                return None
            if receiver.id in self.imported:
                return self._module_refusal(self.imported[receiver.id], name)
            if receiver.id in self.classes or self._own_object(receiver.id):
                return None
        if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super" \
                and self._in_class():
            return None
        if self._is_own_class_expr(receiver) and isinstance(receiver, ast.Call):
            return None
        if isinstance(receiver, ast.Attribute) and not self.reader:
            dotted = _dotted(receiver, self.imported)
            if dotted is not None and dotted in self.modules:
                return self._module_refusal(dotted, name)
        return "another object's private attribute"

    def _module_refusal(self, dotted: str, name: str) -> str | None:
        if not (dotted == "mpbind" or dotted.startswith("mpbind.")):
            return "a third-party private name (list it in THIRD_PARTY with the reason)"
        if self.reader:
            return "a private name of mpbind (use its public API, or import a listed private module)"
        if f"{dotted}.{name}" in self.modules:
            return None  # a private module, reached as a module
        if any(dotted == m or dotted.startswith(m + ".") for m in INFRASTRUCTURE):
            return None
        return f"a private name of {dotted} (give it a public name, or move it into mpbind._infra)"


def _dotted(node: ast.expr, imported: dict[str, str]) -> str | None:
    """`a.b.c` as the dotted name it stands for, where `a` was imported."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imported:
        return None
    return ".".join([imported[node.id], *reversed(parts)])


def private_reads(text: str, module: str | None, modules: set[str], *, reader: bool = False) -> list[Finding]:
    """The reads of `text` (the source of `module`, or of a script when `reader`) no rule allows."""
    tree = ast.parse(text)
    scanner = _Scanner(tree, module, modules, reader)
    scanner.visit(tree)
    return sorted(scanner.found, key=lambda f: (f.line, f.column))


def private_imports(text: str, reader_path: str, modules: set[str]) -> list[Finding]:
    """A script's imports of mpbind's private names, and of private modules not listed for it."""
    found = []
    for node in ast.walk(ast.parse(text)):
        used: list[str] = []  # the modules of mpbind the line imports, or imports names from
        if isinstance(node, ast.Import):
            used = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:
                    used.append(full)
                else:
                    used.append(node.module)
                    if node.module.split(".")[0] == "mpbind" and is_private(alias.name):
                        found.append(Finding(node.lineno, 0, ast.unparse(node),
                                             f"imports the private name {alias.name}"))
        for target in dict.fromkeys(used):
            parts = target.split(".")
            if parts[0] != "mpbind" or not any(is_private(p) for p in parts[1:]):
                continue
            globs, _ = READER_PRIVATE_MODULES.get(target, ((), ""))
            if not any(fnmatch.fnmatch(reader_path, g) for g in globs):
                found.append(Finding(node.lineno, 0, ast.unparse(node),
                                     f"imports the private module {target}, not listed for {reader_path}"))
    return found


def _module_of(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _readers() -> Iterator[Path]:
    for pattern in READER_GLOBS:
        yield from sorted(ROOT.glob(pattern))


def _unlisted(path: Path, findings: list[Finding]) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    return [f"{rel}:{f}" for f in findings if (rel, f.text) not in THIRD_PARTY]


@pytest.fixture(scope="module")
def modules() -> set[str]:
    if not SRC.is_dir():
        pytest.skip("the package's sources are not in this checkout")
    return package_modules()


def test_no_module_reads_another_modules_private_names(modules: set[str]) -> None:
    bad = [line for path in sorted(SRC.rglob("*.py"))
           for line in _unlisted(path, private_reads(path.read_text(), _module_of(path), modules))]
    assert not bad, "private reads across modules:\n" + "\n".join(bad)


def test_the_scripts_around_the_package_read_no_private_name_of_mpbind(modules: set[str]) -> None:
    bad = []
    for path in _readers():
        text = path.read_text()
        bad += _unlisted(path, private_reads(text, None, modules, reader=True))
        bad += [f"{path.relative_to(ROOT).as_posix()}:{f}"
                for f in private_imports(text, path.relative_to(ROOT).as_posix(), modules)]
    assert not bad, "private reads in benchmarks, examples or GPU suites:\n" + "\n".join(bad)


def test_every_listed_private_module_exists(modules: set[str]) -> None:
    assert not set(READER_PRIVATE_MODULES) - modules


def test_every_listed_third_party_read_still_occurs(modules: set[str]) -> None:
    seen = set()
    for path in [*SRC.rglob("*.py"), *_readers()]:
        rel = path.relative_to(ROOT).as_posix()
        reader = not path.is_relative_to(SRC)
        module = None if reader else _module_of(path)
        seen |= {(rel, f.text) for f in private_reads(path.read_text(), module, modules, reader=reader)}
    assert not set(THIRD_PARTY) - seen, f"remove from THIRD_PARTY: {sorted(set(THIRD_PARTY) - seen)}"


# --- the check sees what it exists for: sources made up here -------------------------------------------

MODULES = {"mpbind", "mpbind.cublasmp", "mpbind.nvshmem", "mpbind._core", "mpbind._core.nccl",
           "mpbind._core._testing", "mpbind._infra", "mpbind._infra.args", "mpbind._infra.loader", "mpbind.bindings",
           "mpbind.bindings._status", "mpbind.kernels", "mpbind.kernels._build"}


def _texts(findings: list[Finding]) -> list[str]:
    return [f.text for f in findings]


def test_reads_of_other_objects_and_public_modules_privates_are_found() -> None:
    source = (
        "from mpbind import cublasmp, nvshmem\n"
        "import mpbind.cublasmp as cb\n"
        "def plan(p, desc):\n"
        "    x = p._core.exec\n"
        "    desc._core = None\n"
        "    del p._cache\n"
        "    return cublasmp._CUDA_TYPES, nvshmem._device(), cb._scalar, getattr(p, '_rank'), x\n"
        "class Plan:\n"
        "    def run(self, other):\n"
        "        return other._core, self._helper._core\n"
        "def outside(self):\n"
        "    return self._core\n"
    )
    assert _texts(private_reads(source, "mpbind.fft", MODULES)) == [
        "p._core", "desc._core", "p._cache", "cublasmp._CUDA_TYPES", "nvshmem._device", "cb._scalar",
        "getattr(p, '_rank')", "other._core", "self._helper._core", "self._core"]


def test_a_modules_own_classes_and_infrastructure_are_allowed() -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import Optional\n"
        "import mpbind\n"
        "from mpbind import _core\n"
        "from mpbind._infra import args as _args\n"
        "from mpbind.bindings import _status\n"
        "class Box:\n"
        "    _lower: int\n"
        "    @classmethod\n"
        "    def _of(cls, lower: int) -> Box:\n"
        "        box = cls.__new__(cls)\n"
        "        box._lower = lower\n"
        "        return box\n"
        "    def __eq__(self, other: object) -> bool:\n"
        "        return isinstance(other, Box) and self._lower == type(self)._default\n"
        "    def same(self, other: Box | None, third: 'Optional[Box]') -> bool:\n"
        "        made = Box()\n"
        "        fresh: Box = self._copy()\n"
        "        return other._lower == third._lower == made._lower == fresh._lower == super()._x\n"
        "    def _copy(self) -> Box:\n"
        "        return object.__new__(Box)\n"
        "def factory(lower: int) -> Box:\n"
        "    box = Box._of(lower)\n"
        "    setattr(box, '_lower', 1)\n"
        "    _args._private_helper(mpbind._core, _core._testing, _core.nccl._x, _status._CLASSES)\n"
        "    return box\n"
        "class Struct:\n"
        "    _fields_ = []\n"
        "n = len(Struct._fields_)\n"
    )
    # `box` assigned Box._of(...) is not known to be a Box (annotate it); a private name of a private
    # module of the bindings is not infrastructure's
    assert _texts(private_reads(source, "mpbind.distributions", MODULES)) == ["setattr(box, '_lower', 1)",
                                                                              "_status._CLASSES"]


def test_a_scripts_reads_of_mpbind_privates_are_found() -> None:
    source = (
        "import mpbind\n"
        "from mpbind import _core, fft\n"
        "from mpbind.cublasmp import _scalar\n"
        "from mpbind._core import _testing\n"
        "from mpbind.kernels import _build\n"
        "from mpbind._infra import loader as _loader\n"
        "class Probe:\n"
        "    def __init__(self) -> None:\n"
        "        self._n = 0\n"
        "def main(p):\n"
        "    return p._buffer, _core._testing, mpbind._core, fft._planner, _loader.load('nccl').path\n"
    )
    assert _texts(private_reads(source, None, MODULES, reader=True)) == [
        "p._buffer", "_core._testing", "mpbind._core", "fft._planner"]
    imports = private_imports(source, "benchmarks/x.py", MODULES)
    assert _texts(imports) == ["from mpbind.cublasmp import _scalar", "from mpbind._core import _testing"]
    assert _texts(private_imports(source, "tests/gpu/x_suite.py", MODULES)) == [
        "from mpbind.cublasmp import _scalar", "from mpbind.kernels import _build"]


def test_third_party_privates_are_found_unless_listed() -> None:
    source = "import ctypes\nfrom mpi4py import MPI\ndef f(lib):\n    return MPI._addressof(lib), ctypes._SimpleCData\n"
    assert _texts(private_reads(source, "mpbind.cufftmp", MODULES)) == ["MPI._addressof", "ctypes._SimpleCData"]
    assert ("src/mpbind/cufftmp.py", "MPI._addressof") in THIRD_PARTY
