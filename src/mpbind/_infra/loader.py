"""Finds and opens each library once; the generated bindings dlsym on that handle only.

Search order: the library's override variable (MPBIND_<LIB>_PATH, a file or a
folder holding the library), then cuda.pathfinder (the nvidia-* wheels of either
family, CUDA 13 or 12, then the system). Nothing is loaded at import; the first
call into a library loads it. Symbols are never looked up with RTLD_DEFAULT, which
could bind a foreign copy of the library already in the process.

Each loaded library records the wheel that installed it (`owner`: distribution,
version, family), told from the installed distributions' file lists. A process
that already holds the other family's copy of a library (another package loaded
it) gets LibraryConflictError before mpbind opens its own.

Private to mpbind (:mod:`mpbind._infra`): not public API; its names change without notice.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import threading
from dataclasses import dataclass

from mpbind._infra import families as _families
from mpbind._infra.families import Owner
from mpbind.errors import FunctionNotFoundError, LibraryConflictError, LibraryNotFoundError


@dataclass(frozen=True)
class LibrarySpec:
    name: str           # mpbind's name for it
    pathfinder: str     # cuda.pathfinder's name
    sonames: tuple[str, ...]
    env_var: str
    wheels: tuple[str, ...]  # its nvidia-* wheel of each family, in _families.FAMILIES order
    deepbind: bool = False  # cuda.pathfinder opens libcufftMp with RTLD_DEEPBIND
    # Libraries to load first, so that this one binds to the process's copy of them
    # (libcufftMp needs the one libnvshmem_host the NVSHMEM bindings use).
    depends: tuple[str, ...] = ()
    # Minimum versions of those libraries, and the NVIDIA driver library it links against.
    min_versions: tuple[tuple[str, str], ...] = ()
    needs_driver: bool = False
    # A process-wide runtime (NVSHMEM): a second copy beside one already mapped is refused, as the
    # libraries that depend on it bind to the first.
    one_copy: bool = False


@dataclass(frozen=True)
class LoadedLibrary:
    name: str
    path: str
    handle: int
    found_via: str

    @property
    def owner(self) -> Owner | None:
        """The wheel that installed it (None: not from an nvidia-* wheel). Read from the wheels' file
        lists on first use (tens of ms), which only reports and conflict messages need; kept in the
        instance dict (functools.cached_property would import functools with the loader)."""
        try:
            return self.__dict__["_owner"]  # type: ignore[no-any-return]
        except KeyError:
            owner = self.__dict__["_owner"] = _families.owner(self.path)
            return owner


def _wheels(name: str) -> tuple[str, ...]:
    return tuple(f"nvidia-{name}-{family}" for family in _families.FAMILIES)


LIBRARIES: dict[str, LibrarySpec] = {
    "nccl": LibrarySpec("nccl", "nccl", ("libnccl.so.2",), "MPBIND_NCCL_PATH", _wheels("nccl")),
    "nvshmem": LibrarySpec("nvshmem", "nvshmem_host", ("libnvshmem_host.so.3",), "MPBIND_NVSHMEM_PATH",
                           _wheels("nvshmem"), one_copy=True),
    "cublasmp": LibrarySpec("cublasmp", "cublasmp", ("libcublasmp.so.0",), "MPBIND_CUBLASMP_PATH",
                            _wheels("cublasmp"), depends=("nccl",), min_versions=(("nccl", "2.29.2"),),
                            needs_driver=True),
    # libcufftMp.so.12 is cuFFTMp 12 (the cu13 wheel), libcufftMp.so.11 cuFFTMp 11.4 (the cu12 wheel)
    "cufftmp": LibrarySpec("cufftmp", "cufftMp", ("libcufftMp.so.12", "libcufftMp.so.11"),
                           "MPBIND_CUFFTMP_PATH", _wheels("cufftmp"), deepbind=True, depends=("nvshmem",)),
}

_lock = threading.Lock()
_loaded: dict[str, LoadedLibrary] = {}


def _spec(name: str) -> LibrarySpec:
    try:
        return LIBRARIES[name]
    except KeyError:
        raise LibraryNotFoundError(f"mpbind does not know a library called {name!r}") from None


def _override_candidates(spec: LibrarySpec, value: str) -> list[str]:
    return [os.path.join(value, s) for s in spec.sonames] if os.path.isdir(value) else [value]


def _open_override(spec: LibrarySpec, value: str) -> LoadedLibrary:
    candidates = _override_candidates(spec, value)
    tried = []
    mode = os.RTLD_NOW | os.RTLD_GLOBAL | (os.RTLD_DEEPBIND if spec.deepbind else 0)
    for path in candidates:
        try:
            lib = ctypes.CDLL(path, mode=mode)
        except OSError as exc:
            tried.append(f"{path}: {exc}")
            continue
        return LoadedLibrary(spec.name, os.path.abspath(path), int(lib._handle), spec.env_var)
    raise LibraryNotFoundError(
        f"cannot load {spec.name} from {spec.env_var}={value!r}; tried:\n  " + "\n  ".join(tried)
    )


def _open_pathfinder(spec: LibrarySpec) -> LoadedLibrary:
    from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib

    try:
        dl = load_nvidia_dynamic_lib(spec.pathfinder)
    except DynamicLibNotFoundError as exc:
        raise LibraryNotFoundError(
            f"cannot find {spec.name} ({' or '.join(spec.sonames)}). Tried: {spec.env_var} (unset), "
            f"then cuda.pathfinder: {exc}. Install its nvidia-* wheel "
            f"or set {spec.env_var} to the library file or its folder."
        ) from exc
    except (OSError, RuntimeError) as exc:  # cuda.pathfinder reports a failed dlopen as RuntimeError
        raise LibraryNotFoundError(f"{spec.name} was found but could not be loaded: {exc}") from exc
    return LoadedLibrary(spec.name, dl.abs_path or spec.sonames[0], int(dl._handle_uint), dl.found_via)


def load(name: str) -> LoadedLibrary:
    """Open library `name` once (thread-safe) and return its path and dlopen handle."""
    found = _loaded.get(name)
    if found is not None:
        return found
    spec = _spec(name)
    for dep in spec.depends:
        load(dep)
    for dep, minimum in spec.min_versions:
        have = loaded_version(dep)
        if have is not None and version_tuple(have) < version_tuple(minimum):
            raise LibraryNotFoundError(
                f"{spec.name} needs {dep} >= {minimum}, but the process has {dep} {have} "
                f"({load(dep).path}); install a newer one or point {LIBRARIES[dep].env_var} at it "
                f"(or LD_PRELOAD it, so that every library in the process uses it)"
            )
    with _lock:
        found = _loaded.get(name)
        if found is None:
            override = os.environ.get(spec.env_var)
            _refuse_a_conflicting_copy(spec, override)
            try:
                found = _open_override(spec, override) if override else _open_pathfinder(spec)
            except LibraryNotFoundError as exc:
                if spec.needs_driver and "libcuda.so.1" in str(exc):
                    raise LibraryNotFoundError(
                        f"{spec.name} links against libcuda.so.1, the NVIDIA driver's library, and this "
                        f"machine has none (no NVIDIA driver installed): {spec.name} can only be loaded "
                        f"where a GPU driver is. ({exc})"
                    ) from exc
                raise
            _loaded[name] = found
    return found


def _own_copy(spec: LibrarySpec, override: str | None) -> str | None:
    """The file mpbind would load: the override's, else the one a wheel of this environment installed."""
    if override:
        return next((c for c in _override_candidates(spec, override) if os.path.isfile(c)), None)
    return _families.installed_file(spec.wheels, spec.sonames)


def _refuse_a_conflicting_copy(spec: LibrarySpec, override: str | None) -> None:
    """LibraryConflictError when the process already maps a copy of the library from the other wheel
    family than mpbind's own copy, or (for a one-copy library: NVSHMEM) another file than the one an
    override names. Otherwise copies of unknown origin and of the same family are left to the search,
    as before (cuda.pathfinder uses a copy already loaded)."""
    copies = _families.mapped_copies(spec.sonames)
    if not copies:
        return
    ours = _own_copy(spec, override)
    if ours is None:
        return
    mine = _families.owner(ours)
    for path in copies:
        if _families.same_file(path, ours):
            continue
        theirs = _families.owner(path)
        if mine is not None and mine.family is not None and theirs is not None and theirs.family is not None \
                and theirs.family != mine.family:
            raise LibraryConflictError(spec.name, ours, _described(mine), path, _described(theirs), spec.env_var)
        if spec.one_copy and override:
            # Without an override the search takes the mapped copy; with one, a second copy would load.
            raise LibraryConflictError(spec.name, ours, _described(mine), path, _described(theirs), spec.env_var,
                                       same_family=True)


def _described(owner: Owner | None) -> str:
    if owner is None:
        return "not from an nvidia-* wheel"
    return f"{owner}, family {owner.family}" if owner.family else str(owner)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"3.4.5"`` as ``(3, 4, 5)``, for comparing versions (parts that are not numbers are left out)."""
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def is_loaded(name: str) -> bool:
    return name in _loaded


def format_version(name: str, code: int | tuple[int, ...]) -> str:
    """Turn a library's version code (an int, or a (major, minor, patch) tuple) into 'major.minor.patch'."""
    if isinstance(code, tuple):
        return ".".join(str(c) for c in code)
    if name == "nccl":
        # NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after.
        if code >= 10000:
            return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    if name == "cublasmp":
        # CUBLASMP_VERSION: major*10000 + minor*100 + patch (1000 is 0.10.0).
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    if name == "cufftmp":
        # CUFFT_VERSION: major*1000 + minor*100 + patch (12103 is 12.1.3).
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return str(code)


def loaded_version(name: str) -> str | None:
    """The version of the loaded library `name`, or None if unknown or not loadable."""
    try:
        internal = importlib.import_module(f"mpbind.bindings._internal.{name}")
    except ImportError:
        return None
    try:
        code = internal.library_version_code()
    except Exception:
        return None
    return None if code is None else format_version(name, code)


def function_not_found(name: str, function: str, since: str | None) -> FunctionNotFoundError:
    lib = load(name)
    return FunctionNotFoundError(function, lib.path, loaded_version(name), since, library=name)
