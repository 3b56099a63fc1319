"""Docstrings of the flat bindings: every function and class of each stub (what an IDE shows on hover)
names what it binds and links to the library's documentation, with the release that added it where
the symbol record has one; the Cython functions carry the same text (what help() shows)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]


@pytest.mark.parametrize("name", LIBRARIES)
def test_every_stub_function_and_class_has_a_docstring_with_the_link(generator: Callable[[str], ModuleType],
                                                                     generate: ModuleType, name: str) -> None:
    emit_docs = generator("emit_docs")
    lib = generate.load_library(name)
    tree = ast.parse((REPO / "src" / "mpbind" / "bindings" / f"{name}.pyi").read_text())
    url = emit_docs.DOC_URLS[name]
    by_python = {f.python: f for f in lib.bound}
    checked = 0
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name == "__dir__":
            continue
        doc = ast.get_docstring(node)
        assert doc, f"{name}.{node.name} has no docstring"
        assert url in doc, f"{name}.{node.name}: no link"
        f = by_python.get(node.name)
        if f is not None:
            assert f"Binds {f.name}" in doc
            if f.since and f.inline_body is None:
                assert f.since.lstrip("<=") in doc
        checked += 1
    assert checked >= len(lib.bound)


def test_the_cython_function_carries_the_stub_docstring(generator: Callable[[str], ModuleType],
                                                        generate: ModuleType) -> None:
    lib = generate.load_library("nccl")
    f = lib.function("ncclCommShrink")
    pl = generator("plan").plan(lib, f)
    doc = "\n".join(generator("emit_docs").function_doc(lib, f, pl.return_type))
    assert doc.startswith("Binds ncclCommShrink.\n")
    assert "Returns Comm." in doc and "Added in NCCL 2.27.3." in doc
    stub = ast.parse((REPO / "src" / "mpbind" / "bindings" / "nccl.pyi").read_text())
    node = next(n for n in stub.body if isinstance(n, ast.FunctionDef) and n.name == f.python)
    assert ast.get_docstring(node) == doc
    pyx = (REPO / "src" / "mpbind" / "bindings" / "nccl.pyx").read_text()
    assert '"""' + doc.replace("\n", "\n    ").replace("\n    \n", "\n\n") + '"""' in pyx
