"""mpbind: Python bindings for NCCL, NVSHMEM, cuBLASMp and cuFFTMp.

Importing :mod:`mpbind` is cheap: it loads no shared library and imports no
compiled module. Submodules (``mpbind.bindings``, ``mpbind.errors``,
``mpbind.nccl``, ...) are imported on first attribute access, and each library
is loaded on its first call.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpbind import bindings as bindings
    from mpbind import errors as errors

    __version__: str

__all__ = ["__version__", "show_config"]

_SUBMODULES = frozenset(
    {"bindings", "errors", "nccl", "nvshmem", "cublasmp", "cufftmp", "bootstrap"}
)


def show_config() -> None:
    """Print the libraries mpbind finds, their versions and binding coverage, and the GPU."""
    from mpbind._info import show_config as _show_config

    _show_config()


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
            module = importlib.import_module(qualname)
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
