"""mpbind's one exception hierarchy.

    MpbindError
    ├─ LibraryNotFoundError   (also ImportError)
    │  └─ LibraryConflictError  the process holds another wheel family's copy of the library
    ├─ MissingDependencyError (also ImportError): an optional package; names the extra to install
    ├─ FunctionNotFoundError  (also NotImplementedError)
    ├─ LibraryError           (also RuntimeError): .library .function .status
    │  ├─ NCCLError      ─ one subclass per ncclResult_t value
    │  ├─ NVSHMEMError   ─ …
    │  ├─ CuBLASMpError  ─ …
    │  ├─ CuFFTMpError   ─ …
    │  └─ CudaError      a CUDA runtime or driver call of the layer (a copy, a wait, a device query)
    ├─ WaitTimeoutError       (also TimeoutError): a wait of the layer ran past its deadline
    ├─ CommunicatorAbortedError  a communicator failed and was aborted or revoked
    │  └─ CollectiveTimeoutError (also TimeoutError): an operation on it ran past its deadline
    └─ UsageError             (also ValueError): misuse caught before any C call
       ├─ PlacementError      processes placed on GPUs where the library cannot initialise
       └─ NVSHMEMNotInitializedError  an NVSHMEM call that needs the runtime, before init

The per-status subclasses are generated into mpbind.bindings._status and re-exported here on first
use (importing this module stays cheap). They derive from MpbindError, LibraryError and the four
library classes, which mpbind._error_bases defines and this module re-exports: the generated module
imports those, never this one, so neither module imports the other.
"""

from __future__ import annotations

# Re-exported: `X as X` says so to linters and type checkers.
from mpbind._error_bases import LIBRARY_ERRORS as LIBRARY_ERRORS
from mpbind._error_bases import CuBLASMpError as CuBLASMpError
from mpbind._error_bases import CuFFTMpError as CuFFTMpError
from mpbind._error_bases import LibraryError as LibraryError
from mpbind._error_bases import MpbindError as MpbindError
from mpbind._error_bases import NCCLError as NCCLError
from mpbind._error_bases import NVSHMEMError as NVSHMEMError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import time)
if TYPE_CHECKING:
    from typing import Any


class LibraryNotFoundError(MpbindError, ImportError):
    """A shared library could not be loaded; the message lists what was tried."""


class LibraryConflictError(LibraryNotFoundError):
    """The process already holds a copy of the library from the other wheel family (CUDA 12 or 13),
    loaded by another package, and mpbind's own copy is of this one: two copies of one library in a
    process (or one built for the other CUDA line) would mix their state. For NVSHMEM also a second
    copy of the same family (``same_family``), which an override would load beside the first. Raised before mpbind loads
    or calls either. ``library``; ``path`` and ``wheel`` (mpbind's copy and the wheel that installed
    it); ``loaded_path`` and ``loaded_wheel`` (the copy already in the process)."""

    def __init__(self, library: str, path: str, wheel: str, loaded_path: str, loaded_wheel: str,
                 env_var: str = "", same_family: bool = False) -> None:
        use = f" or set {env_var}={loaded_path} to use the loaded copy" if env_var else ""
        if same_family:  # one runtime per copy: NVSHMEM's dependents bind to the copy loaded first
            why = (f"another file{f' (named by {env_var})' if env_var else ''}. The libraries that use "
                   f"{library} (cuFFTMp, cuBLASMp) bind to the copy loaded first, and each copy keeps its own "
                   f"runtime, so memory of one is not symmetric for the other. Load one copy: unset {env_var} "
                   f"or set {env_var}={loaded_path}, or import mpbind before the other package")
        else:
            why = (f"of the other wheel family. Use one family in a process: install the mpbind extra of the "
                   f"loaded one{use}")
        # ImportError's own `path` is the file that failed to import: mpbind's copy
        super().__init__(
            f"cannot load {library}: this process already holds {loaded_path} ({loaded_wheel}), loaded by "
            f"another package, and mpbind's copy is {path} ({wheel}), {why}", path=path)
        self.library = library
        self.wheel = wheel
        self.loaded_path = loaded_path
        self.loaded_wheel = loaded_wheel
        self.env_var = env_var
        self.same_family = same_family

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.library, self.path, self.wheel, self.loaded_path, self.loaded_wheel,
                             self.env_var, self.same_family))


class MissingDependencyError(MpbindError, ImportError):
    """An optional package a call needs is not installed; the message names the extra that installs it
    (``pip install 'mpbind[torch]'``). ``name`` is the missing module, ``extra`` the extra."""

    def __init__(self, module: str, extra: str, needed_by: str) -> None:
        self.extra = extra
        self.needed_by = needed_by
        super().__init__(f"{needed_by} needs {module}, which is not installed: pip install 'mpbind[{extra}]'",
                         name=module)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.extra, self.needed_by))


class FunctionNotFoundError(MpbindError, NotImplementedError):
    """The loaded library lacks a function the pinned headers declare."""

    def __init__(
        self,
        function: str,
        library_path: str,
        loaded_version: str | None,
        first_version: str | None,
        library: str = "",
    ) -> None:
        self.function = function
        self.library = library
        self.library_path = library_path
        self.loaded_version = loaded_version
        self.first_version = first_version
        since = ""
        if first_version:
            since = (f"; it first appeared in {first_version.replace('<=', 'version ')} or earlier"
                     if first_version.startswith("<=") else f"; it first appeared in {first_version}")
        super().__init__(
            f"{function} is not exported by {library_path} "
            f"(version {loaded_version or 'unknown'}){since}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.function, self.library_path, self.loaded_version,
                             self.first_version, self.library))


class UsageError(MpbindError, ValueError):
    """Bad input or misuse, caught before any library call."""


class WaitTimeoutError(MpbindError, TimeoutError):
    """A wait of the layer ran past its deadline: a communicator's initialisation, split, shrink or
    finalize waiting for the other ranks, NVSHMEM's initialisation, a wait for this PE's collectives
    on streams. The deadline is the call's (or its communicator's) ``timeout=``, else
    ``MPBIND_TIMEOUT`` seconds, else 600. ``operation`` names the wait, ``timeout`` is the deadline in
    seconds and ``detail`` says what was waited for (which ranks never arrived, when that is known)."""

    def __init__(self, operation: str, timeout: float, detail: str = "") -> None:
        self.operation = operation
        self.timeout = timeout
        self.detail = detail
        super().__init__(f"{operation} did not complete within {timeout:g} s" + (f": {detail}" if detail else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.operation, self.timeout, self.detail))


class CommunicatorAbortedError(MpbindError):
    """A communicator failed (an error NCCL reported, an operation past its deadline, a wait given up,
    ``revoke()``) and was aborted or revoked: every later call on it, and on the grids, plans and
    registrations that depend on it, raises this error; ``shrink()`` (after a revoke) and ``close()``
    still work. ``communicator`` describes it, ``rank`` is this process's rank in it, ``operation``
    and ``sequence`` name the operation that failed (its number in the flight record,
    ``recent_operations()``; 0 when none did) and ``reason`` says what happened."""

    def __init__(self, communicator: str, rank: int, operation: str, sequence: int, reason: str) -> None:
        self.communicator = communicator
        self.rank = rank
        self.operation = operation
        self.sequence = sequence
        self.reason = reason
        at = f" (at {operation} #{sequence})" if sequence else (f" (in {operation})" if operation else "")
        super().__init__(f"{communicator} failed on rank {rank}{at}: {reason}. Every later call on it and on what "
                         f"depends on it raises this error; close() it, or shrink() it after a revoke")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.communicator, self.rank, self.operation, self.sequence, self.reason))


class CollectiveTimeoutError(CommunicatorAbortedError, TimeoutError):
    """An operation on a communicator ran past its deadline (seen by the watchdog, or by a wait of the
    layer) and the communicator was aborted or revoked; as :class:`CommunicatorAbortedError`."""


class PlacementError(UsageError):
    """The processes are placed on GPUs in a way the library cannot initialise with (it would hang or
    exit the process), found before its initialisation; every process raises it with the same message."""


class NVSHMEMNotInitializedError(UsageError):
    """An NVSHMEM function that needs an initialised runtime was called before (or after) it was,
    which the library answers by ending the process. Decided from the library's own
    ``nvshmemx_init_status()``, so a runtime initialised by another library (cuFFTMp) counts.
    ``function`` is the C function, ``needed`` and ``status`` the init statuses it needs and found."""

    def __init__(self, function: str, needed: int, status: int) -> None:
        self.function = function
        self.needed = needed
        self.status = status
        todo = ("call init again, with a CUDA device current, to finish the initialisation" if int(status) == 1
                else "call mpbind.nvshmem.init() (or the flat init functions) first")
        super().__init__(f"{function} needs an initialised NVSHMEM runtime (init status {_status_name(needed)}); "
                         f"it is {_status_name(status)}: {todo}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.function, self.needed, self.status))


def _status_name(status: int) -> str:
    name = getattr(status, "name", None)
    return f"{name} ({int(status)})" if name else str(int(status))


_BASE_NAMES = [
    "MpbindError",
    "LibraryNotFoundError",
    "LibraryConflictError",
    "MissingDependencyError",
    "FunctionNotFoundError",
    "UsageError",
    "WaitTimeoutError",
    "CommunicatorAbortedError",
    "CollectiveTimeoutError",
    "PlacementError",
    "NVSHMEMNotInitializedError",
    "LibraryError",
    "NCCLError",
    "NVSHMEMError",
    "CuBLASMpError",
    "CuFFTMpError",
    "LIBRARY_ERRORS",
]


def __getattr__(name: str) -> Any:
    # The per-status subclasses live in the generated mpbind.bindings._status, loaded
    # on the first lookup of one of them (or of __all__). Dunder lookups (`from
    # mpbind.errors import X` asks for __path__) do not load it.
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from mpbind.bindings import _status

    if name == "__all__":
        return _BASE_NAMES + list(_status.__all__)
    if name in _status.__all__:
        return getattr(_status, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    from mpbind.bindings import _status

    return sorted(set(globals()) | set(_status.__all__))


class CudaError(LibraryError):
    """A CUDA runtime or driver call the layer makes itself (a small copy, a wait, a device query or
    setting) failed. ``function`` names the call, ``status`` is CUDA's code, ``status_name`` its
    name (``cudaErrorInvalidValue``, ``CUDA_ERROR_INVALID_DEVICE``) and ``description`` CUDA's text."""

    library = "cuda"


class KernelBuildError(MpbindError):
    """Device code failed to compile (NVRTC) or link (nvJitLink). ``stage`` is ``"compile"`` or
    ``"link"``, ``name`` the program's name, ``arch`` its architecture and ``log`` the compiler's or
    linker's own log, which the message ends with."""

    def __init__(self, stage: str, name: str, arch: str, log: str) -> None:
        self.stage = stage
        self.name = name
        self.arch = arch
        self.log = log
        what = "compiling" if stage == "compile" else "linking"
        super().__init__(f"{what} {name} for {arch} failed:\n{log}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.stage, self.name, self.arch, self.log))


_BASE_NAMES += ["KernelBuildError", "CudaError"]
