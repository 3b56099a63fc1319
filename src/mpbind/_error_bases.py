"""The bases of the generated per-status exception classes: MpbindError, LibraryError and one
class per library. They are mpbind.errors' own (it re-exports them, and their ``__module__`` says so);
they live here so that the generated classes (mpbind.bindings._status) derive from them without
importing mpbind.errors, which re-exports the generated classes in turn.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import time)
if TYPE_CHECKING:
    from typing import Any


class MpbindError(Exception):
    """Base of every exception mpbind raises."""


class LibraryError(MpbindError, RuntimeError):
    """A library call returned an error status.

    Attributes: library, function (the C function), status (int), status_name,
    description (the library's string for the status) and last_error (its
    last-error message, where it has one).
    """

    library: str = ""
    #: Set on generated per-status subclasses.
    status_code: int | None = None

    def __init__(
        self,
        function: str,
        status: int,
        status_name: str | None = None,
        description: str | None = None,
        last_error: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.function = function
        self.status: int = int(status)
        self.status_name = status_name
        self.description = description
        self.last_error = last_error
        self.hint = hint
        name = status_name or "unknown status"
        msg = f"{function} failed: {name} ({self.status})"
        if description:
            msg += f": {description}"
        if last_error and last_error != description:
            msg += f" [last error: {last_error}]"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.function, self.status, self.status_name, self.description,
                             self.last_error, self.hint))


class NCCLError(LibraryError):
    """An NCCL call failed."""

    library = "nccl"


class NVSHMEMError(LibraryError):
    """An NVSHMEM call failed."""

    library = "nvshmem"


class CuBLASMpError(LibraryError):
    """A cuBLASMp call failed."""

    library = "cublasmp"


class CuFFTMpError(LibraryError):
    """A cuFFTMp call failed."""

    library = "cufftmp"


LIBRARY_ERRORS: dict[str, type[LibraryError]] = {
    "nccl": NCCLError,
    "nvshmem": NVSHMEMError,
    "cublasmp": CuBLASMpError,
    "cufftmp": CuFFTMpError,
}

# Raised, printed and pickled under the public name.
for _cls in (MpbindError, LibraryError, *LIBRARY_ERRORS.values()):
    _cls.__module__ = "mpbind.errors"
