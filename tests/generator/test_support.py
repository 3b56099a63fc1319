"""Hand-written support code (src/mpbind/bindings/_support/<lib>.pxi): no Cython in the specs, an include in
the generated module, and each static inline function defined with the parameters its stub shows."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
CODEGEN = REPO / "codegen"
BINDINGS = REPO / "src" / "mpbind" / "bindings"  # the support files beside the modules that include them
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]


def _arguments(function: str) -> tuple[list[str], list[str]]:
    """(names, defaults) of the parameters of a one-line `def`."""
    node = ast.parse(function).body[0]
    assert isinstance(node, ast.FunctionDef)
    return [a.arg for a in node.args.args], [ast.unparse(d) for d in node.args.defaults]


@pytest.mark.parametrize("lib", LIBRARIES)
def test_the_spec_carries_no_cython_code(lib: str) -> None:
    path = CODEGEN / "specs" / f"{lib}.toml"
    if not path.is_file():
        pytest.skip("the generator is not in this checkout")
    spec = tomllib.loads(path.read_text())
    assert "inline_support" not in spec
    for name, inline in spec.get("inline", {}).items():
        assert set(inline) <= {"uses", "python", "signature"}, f"[inline.{name}] has {sorted(inline)}"


@pytest.mark.parametrize("lib", LIBRARIES)
def test_support_file_defines_each_inline_function_as_its_stub_shows(generate: ModuleType, lib: str) -> None:
    library = generate.load_library(lib)
    inline = [f for f in library.bound if f.inline_body is not None]
    if not library.support:
        assert inline == []
        return
    text = (BINDINGS / library.support).read_text()
    defs = {m.group(1): m.group(0) for m in re.finditer(r"^def (\w+)\(.*\):$", text, re.M)}
    for f in inline:
        assert f.python in defs, f"src/mpbind/bindings/{library.support} does not define {f.python} ({f.name})"
        got = _arguments(defs[f.python] + " ...")
        want = _arguments(f"def {f.python}{f.inline_body.signature}: ...")
        assert got == want, f"{f.python}: {defs[f.python]} does not take {f.inline_body.signature}"


@pytest.mark.parametrize("lib", LIBRARIES)
def test_generated_module_includes_its_support_file(generate: ModuleType, lib: str) -> None:
    library = generate.load_library(lib)
    pyx = (BINDINGS / f"{lib}.pyx").read_text()
    includes = re.findall(r'^include "(.*)"$', pyx, re.M)
    assert includes == ([library.support] if library.support else [])
    if library.support:
        assert (BINDINGS / library.support).is_file()


@pytest.mark.parametrize("lib", LIBRARIES)
def test_support_file_defines_the_helpers_its_roles_call(
        generate: ModuleType, generator: Callable[[str], ModuleType], lib: str) -> None:
    """A role converting through support code (the collective launch's kernel, dim3 and kernel
    arguments) needs its helpers in the support file of every library that uses it."""
    roles = generator("roles")
    library = generate.load_library(lib)
    needed = {h: f"{f.name}.{p.name}" for f in library.bound for p in f.params
              for h in getattr(roles.bind(library, f, p), "helpers", ())}
    if not needed:
        return
    text = (BINDINGS / library.support).read_text() if library.support else ""
    defined = set(re.findall(r"^cdef [^(]*?\b(\w+)\(", text, re.M))
    assert {h: where for h, where in needed.items() if h not in defined} == {}
