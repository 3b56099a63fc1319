"""The per-type functions of NVSHMEM's families live in private modules by API family, which the public
module re-exports: each compiles on its own (one module of every function took the compiler minutes and
gigabytes), and every name stays importable from mpbind.bindings.nvshmem."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

# The largest module the split may leave: what one compiler process builds in a few hundred MB.
MOST_FUNCTIONS = 300


@pytest.fixture(scope="module")
def nvshmem(generate: ModuleType) -> Any:
    return generate.load_library("nvshmem")


def test_every_family_member_is_in_exactly_one_private_module(generator: Callable[[str], ModuleType],
                                                               nvshmem: Any) -> None:
    private = generator("emit_python").private_modules(nvshmem)
    placed = [f.name for _, functions in private.values() for f in functions]
    members = {c for fam in nvshmem.families for c in fam.members.values()}
    assert len(placed) == len(set(placed))
    assert set(placed) == members
    assert all(name.startswith("_nvshmem_") for name in private)
    assert max(len(functions) for _, functions in private.values()) <= MOST_FUNCTIONS


def test_the_public_module_reexports_each_private_function_and_defines_the_rest(
        generator: Callable[[str], ModuleType], nvshmem: Any) -> None:
    emit_python = generator("emit_python")
    modules = emit_python.python_modules(nvshmem)
    public = modules["nvshmem"]
    for name, (_, functions) in emit_python.private_modules(nvshmem).items():
        block = public[public.index(f'_reexport("mpbind.bindings.{name}", ('):]
        block = block[:block.index("))")]
        assert re.findall(r'"(\w+)",', block) == [f.python for f in functions]
        for f in functions:
            assert f"\ndef {f.python}(" in modules[name]
            assert f"\ndef {f.python}(" not in public
    # the functions of no family stay in the public module
    assert "\ndef malloc(" in public and "\ndef team_my_pe(" in public


def test_libraries_without_families_have_one_module(generator: Callable[[str], ModuleType],
                                                    generate: ModuleType) -> None:
    for lib in ("nccl", "cublasmp", "cufftmp"):
        assert list(generator("emit_python").python_modules(generate.load_library(lib))) == [lib]


def test_a_family_no_module_takes_is_an_error(generator: Callable[[str], ModuleType], nvshmem: Any) -> None:
    emit_python = generator("emit_python")
    family = dataclasses.replace(nvshmem.families[0], python="frobnicate", members={"int": "nvshmem_int_frobnicate"})
    lib = dataclasses.replace(nvshmem, families=(*nvshmem.families, family))
    with pytest.raises(ValueError, match="frobnicate"):
        emit_python.private_modules(lib)
