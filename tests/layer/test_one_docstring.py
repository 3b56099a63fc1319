"""Each public call's signature and docstring live in one place, from which its stub comes: the core's
`m.def` where the core's function is the public one (mpbind.nvshmem's hot calls and arrays), the Python
wrapper where one is (mpbind.nccl.Communicator's methods, cuBLASMp's and cuFFTMp's facades). A core
function or method that a documented Python wrapper of the same name calls carries no docstring."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import pytest

from mpbind import _core, cublasmp, cufftmp, nccl, nvshmem

# The facade classes whose core class has another name: {facade: core class}.
CORE_CLASS = {cublasmp.Matrix: _core.cublasmp.MatrixDescriptor, cublasmp.Matmul: _core.cublasmp.MatmulPlan}
# Documented once in mpbind._infra.owned.Owned for every facade (forwarding to the core's protocol).
OWNED_PROTOCOL = {"close", "closed", "serial", "__enter__", "__exit__", "__repr__"}


def _core_doc(obj: Any) -> str | None:
    """The docstring the core gave `obj` (a nanobind function, method or property), or None."""
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    signatures = getattr(obj, "__nb_signature__", None)
    if signatures is None:
        return None
    docs = [s[1] for s in signatures if s[1]]
    return "\n".join(docs) or None


def _python_doc(obj: Any) -> str | None:
    """The docstring of a function, method or property written in Python, or None."""
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if not inspect.isfunction(obj):
        return None
    return inspect.getdoc(obj)


def _twice(module: ModuleType, core: ModuleType) -> list[str]:
    """Names documented both by a Python wrapper of `module` and by the core function it wraps."""
    found = []
    for name in getattr(module, "__all__", []):
        value = getattr(module, name)
        if _python_doc(value) and _core_doc(getattr(core, name, None)):
            found.append(f"{module.__name__}.{name}")
        if not (isinstance(value, type) and value.__module__ == module.__name__):
            continue  # a class of the core itself: documented there only
        core_cls = CORE_CLASS.get(value, getattr(core, name, None))
        if not isinstance(core_cls, type):
            continue
        for attr, member in vars(value).items():
            if attr in OWNED_PROTOCOL or not _python_doc(member):
                continue
            if _core_doc(inspect.getattr_static(core_cls, attr, None)):
                found.append(f"{module.__name__}.{name}.{attr} (and {core_cls.__name__}.{attr})")
    return found


@pytest.mark.parametrize(("module", "core"), [(nccl, _core.nccl), (nvshmem, _core.nvshmem),
                                              (cublasmp, _core.cublasmp)], ids=["nccl", "nvshmem", "cublasmp"])
def test_no_public_call_is_documented_twice(module: ModuleType, core: ModuleType) -> None:
    assert _twice(module, core) == []


def test_no_cufftmp_call_is_documented_twice() -> None:
    assert _twice(cufftmp, _core.cufftmp) == []


def test_the_check_sees_a_call_documented_twice() -> None:
    # Before the NCCL hot calls lost their C++ docstrings, all_reduce was documented in both places.
    class Facade:
        def all_reduce(self) -> None:
            """ncclAllReduce."""

    module = ModuleType("mpbind.fake")
    module.__all__ = ["Facade"]  # type: ignore[attr-defined]
    module.Facade = Facade  # type: ignore[attr-defined]
    Facade.__module__ = "mpbind.fake"
    core = ModuleType("core")
    core.Facade = _core.nvshmem.Runtime  # type: ignore[attr-defined]  # a core class with documented methods
    Facade.finalize = lambda self: None  # type: ignore[attr-defined]
    Facade.finalize.__doc__ = "Finalize."  # type: ignore[attr-defined]
    assert _twice(module, core) == ["mpbind.fake.Facade.finalize (and Runtime.finalize)"]


def test_the_core_is_the_one_home_of_nvshmem_s_hot_calls() -> None:
    for name in ("put", "get", "quiet", "barrier_all", "sync_all", "barrier", "broadcast", "fcollect", "alltoall",
                 "reduce"):
        call = getattr(nvshmem, name)
        assert call is getattr(_core.nvshmem, name), name
        assert _core_doc(call), name
    assert nvshmem.SymmetricArray is _core.nvshmem.SymmetricArray
    assert _core_doc(inspect.getattr_static(nvshmem.SymmetricArray, "peer"))
