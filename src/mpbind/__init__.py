"""mpbind: Python bindings for NCCL, NVSHMEM, cuBLASMp and cuFFTMp.

Importing :mod:`mpbind` is cheap: it loads no shared library and imports no
compiled module. The public modules (``_PUBLIC_MODULES``: ``mpbind.bindings``,
``mpbind.errors``, ``mpbind.nccl``, ..., ``mpbind.fft``, ``mpbind.matmul``) are
imported on first attribute access, and each library is loaded on its first call.

The process-wide view of the objects the Pythonic layer owns lives here:
:func:`drain` runs the collective releases of objects dropped without ``close()``,
:func:`queued` lists them, :func:`registrations` lists the live buffer
registrations of every library. They import the C++ core on first call.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from typing import Any

    from mpbind import bindings as bindings
    from mpbind import errors as errors

    __version__: str

__all__ = ["__version__", "drain", "load_libraries", "queued", "registrations", "show_config"]

#: Every public module, relative to ``mpbind``, listed once: ``mpbind.<name>`` imports a top-level
#: one on first access (and ``dir(mpbind)`` shows it), the docs list them, the fuzz sweep calls what
#: they export, and a test checks that every other module is private. Layers in order: the generated
#: flat bindings, the error hierarchy and the types the layer's signatures use, the library facades,
#: then the distributed features and the distributions they take.
_PUBLIC_MODULES: tuple[str, ...] = (
    "bindings", "bindings.nccl", "bindings.nvshmem", "bindings.cublasmp", "bindings.cufftmp",
    "errors", "typing",
    "nccl", "nvshmem", "cublasmp", "cufftmp", "bootstrap", "process_group",
    "distributions", "fft", "matmul", "collective", "kernels", "torch", "jax",
)
# Public modules that import an optional package (module: package); without it, reaching one raises
# MissingDependencyError naming the extra.
_OPTIONAL_MODULES: dict[str, str] = {"torch": "torch", "jax": "jax"}
_SUBMODULES = frozenset(name for name in _PUBLIC_MODULES if "." not in name)


def show_config() -> None:
    """Print the libraries mpbind finds, their versions and binding coverage, and the GPU."""
    from mpbind._infra.info import show_config as _show_config

    _show_config()


def load_libraries(*names: str) -> dict[str, str]:
    """Load the named libraries now (of ``"nccl"``, ``"nvshmem"``, ``"cublasmp"``, ``"cufftmp"``)
    instead of on their first call, and return ``{name: path}`` of the copies loaded.

    Call it before importing a package that brings its own copy of a library: PyTorch maps its own
    NVSHMEM when it is imported, and the libraries that use NVSHMEM bind to whichever copy the
    process loaded first. Loading mpbind's first makes it the one copy; with another copy already
    mapped, the loader uses that one, or raises ``LibraryConflictError`` where it cannot (another
    wheel family, or ``MPBIND_NVSHMEM_PATH`` naming another file)."""
    from mpbind._infra import loader as _loader

    if not names:
        raise TypeError("name the libraries to load, e.g. load_libraries('nvshmem')")
    unknown = [n for n in names if not isinstance(n, str) or n not in _loader.LIBRARIES]
    if unknown:
        raise ValueError(f"unknown libraries {unknown}; mpbind loads {sorted(_loader.LIBRARIES)}")
    return {name: _loader.load(name).path for name in names}


def drain() -> int:
    """Collect garbage, then run every queued release, newest first (reverse creation order, the same
    on every rank whatever order objects were dropped in): the collective releases, and kernel
    libraries (:mod:`mpbind.kernels`) dropped without ``close()``, unloaded while NVSHMEM is
    still up. Collective: call it on every rank. Returns how many ran."""
    from mpbind import _core

    return int(_core.drain())


def queued() -> list[tuple[str, int]]:
    """What waits for :func:`drain`: ``(kind, serial)``, newest first."""
    from mpbind import _core

    return list(_core.queued())


def registrations() -> list[dict[str, Any]]:
    """Every live buffer registration in this process (NCCL, NVSHMEM, cuBLASMp): library, kind,
    owner serial, ptr, size, references, handle, serial."""
    from mpbind import _core

    return list(_core.registrations())


def _get_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return "0.0.0+unknown"
    try:
        return version("mpbind")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = _get_version()
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        qualname = f"{__name__}.{name}"
        try:
            __import__(qualname)  # not importlib: importing mpbind stays cheap
            module = sys.modules[qualname]
        except ModuleNotFoundError as exc:
            if exc.name != qualname:
                raise
            raise AttributeError(
                f"module {__name__!r} has no attribute {name!r} "
                f"({qualname} is not available in this version)"
            ) from None
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES | {"__version__"})
