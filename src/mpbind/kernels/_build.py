"""Building device code that calls NVSHMEM: NVRTC, then nvJitLink against ``libnvshmem_device.a``,
cached on disk. Nothing here needs a GPU or a driver (the CPU tests compile and link for real).

How the pieces fit (each choice was checked against the NVSHMEM 3.8 wheel):

* NVRTC compiles with ``-rdc`` and ``NVSHMEM_ENABLE_ALL_DEVICE_INLINING``: without the define the
  signal functions are left to the archive, whose ``uint64_t`` mangles as ``unsigned long`` where
  NVRTC's mangles as ``unsigned long long``, and the link fails on an undefined reference.
* nvJitLink takes the archive as a library input; the ``libnvshmem_device_sm_XX.bc`` files are
  plain LLVM bitcode, which nvJitLink refuses.
* The link goes through ``cuda.bindings.nvjitlink`` itself: cuda-core's ``Linker`` asks the driver
  for its version when its options are made, and a build machine may have no driver.
* NVSHMEM before 3.5 (3.4.5 is the one PyTorch's wheels bring) does not build under NVRTC as its
  headers stand, and gets a prelude (``LEGACY_PRELUDE``) and one option more; 3.5+ builds are
  unchanged. (1) Its NVRTC builds include IBGDA's device transport, whose header needs rdma-core's
  ``<infiniband/mlx5dv.h>`` (few machines have it): the prelude includes NVSHMEM's build options
  once (``#pragma once``) and undefines it, as 3.5+ does for NVRTC itself; the transfers it served go
  through NVSHMEM's proxy, and only ``transfer_device.cuh`` reads the macro, so no structure the
  device library shares changes. (2) Its collectives name ``std::`` type traits, which NVRTC has as
  ``cuda::std::``: the prelude makes ``std`` see those. (3) A constructor in ``nvshmem_tensor.h``
  lacks ``__device__``: NVRTC takes unannotated functions as device functions
  (``device_as_default_execution_space``).
* The cache is cuda-core's ``FileStreamProgramCache`` (atomic files, safe when every PE compiles
  the same kernel at once), keyed by cuda-core's ``make_program_cache_key`` (source, options,
  architecture, NVRTC version) with our digest of what it cannot see: the NVSHMEM version and
  device library, the nvJitLink version, the CUDA headers and the caller's include folders.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpbind._infra import loader as _loader
from mpbind.errors import KernelBuildError, LibraryNotFoundError, MissingDependencyError, UsageError

__all__ = ["Toolchain", "build", "cache_dir", "current_arch", "kernel_symbols", "toolchain"]

#: Defines every build gets: NVSHMEM's device code inlined into the user's module (see above).
DEFINES = ("NVSHMEM_ENABLE_ALL_DEVICE_INLINING",)
#: Put before the source for NVSHMEM before 3.5 (see above); ``#line`` keeps the caller's line numbers.
LEGACY_PRELUDE = """#include <non_abi/nvshmem_build_options.h>
#undef NVSHMEM_IBGDA_SUPPORT
#undef NVSHMEM_IBGDA_SUPPORT_GPUMEM_ONLY
#undef NVSHMEM_GPUNETIO_SUPPORT
#include <cuda/std/type_traits>
namespace std {{ using namespace ::cuda::std; }}
#line 1 "{name}"
"""
#: Where compiled kernels are cached (a folder); the default is the user's cache folder.
CACHE_ENV = "MPBIND_KERNEL_CACHE"
#: An NVSHMEM installation (a folder holding include/ and lib/) to build against.
HOME_ENV = "MPBIND_NVSHMEM_HOME"
#: The architecture used when none is given and no GPU can be asked.
DEFAULT_ARCH = "sm_90"
# Bumped when what a cache entry holds changes meaning.
_FORMAT = b"mpbind-nvshmem-kernel-1"
_ARCH = re.compile(r"^sm_\d+[a-z]?$")


def _require_cuda_core(needed_by: str) -> Any:
    try:
        import cuda.core as core
    except ModuleNotFoundError as exc:
        if exc.name not in ("cuda.core", "cuda"):
            raise
        raise MissingDependencyError("cuda.core", "kernels", needed_by) from None
    return core


# --- the toolchain ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Toolchain:
    """The headers and device library a build uses, and the versions that key its cache entry."""

    nvshmem_home: Path
    cuda_include: Path
    cccl_include: Path
    nvshmem_version: str

    @property
    def nvshmem_include(self) -> Path:
        return self.nvshmem_home / "include"

    @property
    def device_library(self) -> Path:
        return self.nvshmem_home / "lib" / "libnvshmem_device.a"

    @property
    def legacy(self) -> bool:
        """An NVSHMEM before 3.5, whose headers need the legacy prelude under NVRTC (see the module)."""
        known = _loader.version_tuple(self.nvshmem_version)  # major.minor.patch from the header; "?" unread
        return len(known) == 3 and known < (3, 5)

    def include_path(self) -> list[str]:
        return [str(self.nvshmem_include), str(self.cuda_include), str(self.cccl_include)]

    def fingerprint(self) -> bytes:
        """What the cache key must see of the toolchain beyond cuda-core's own key."""
        from cuda.bindings import nvjitlink

        h = hashlib.sha256(_FORMAT)
        h.update(f"nvshmem {self.nvshmem_version}; nvjitlink {nvjitlink.version()}".encode())
        for path in (self.device_library, self.nvshmem_include / "non_abi" / "nvshmem_version.h",
                     self.cuda_include / "cuda_runtime_api.h", self.cccl_include / "cuda" / "std" / "version"):
            h.update(_file_identity(path))
        return h.digest()


def _file_identity(path: Path) -> bytes:
    try:
        st = path.stat()
    except OSError:
        return f"{path}: missing".encode()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()


def _nvshmem_homes() -> list[tuple[str, Path]]:
    """Candidate NVSHMEM installations, best first: the one mpbind's host library comes from wins,
    since ``nvshmemx_culibrary_init`` refuses a device library of another version."""
    found: list[tuple[str, Path]] = []
    if os.environ.get(HOME_ENV):
        found.append((HOME_ENV, Path(os.environ[HOME_ENV])))
    spec = _loader.LIBRARIES["nvshmem"]
    if _loader.is_loaded("nvshmem"):
        found.append(("the loaded libnvshmem_host", Path(_loader.load("nvshmem").path).resolve().parent.parent))
    elif os.environ.get(spec.env_var):
        override = Path(os.environ[spec.env_var])
        found.append((spec.env_var, (override if override.is_dir() else override.parent).resolve().parent))
    try:
        from cuda.pathfinder import locate_nvidia_header_directory

        located = locate_nvidia_header_directory("nvshmem")
    except Exception:  # cuda.pathfinder raises several types when nothing is found
        located = None
    if located is not None:
        found.append((f"cuda.pathfinder ({located.found_via})", Path(located.abs_path).parent))
    return found


def _cuda_header_dir(name: str, probe: str, install: str) -> Path:
    from cuda.pathfinder import locate_nvidia_header_directory

    try:
        located = locate_nvidia_header_directory(name)
    except Exception as exc:  # noqa: BLE001 - reported with what was looked for
        located, reason = None, f": {exc}"
    else:
        reason = ""
    if located is None:
        raise LibraryNotFoundError(
            f"cannot find the CUDA headers ({probe}) that NVSHMEM's device headers include{reason}; {install}")
    return Path(located.abs_path)


def _nvshmem_version(include: Path) -> str:
    text = (include / "non_abi" / "nvshmem_version.h").read_text()
    parts = [re.search(rf"#define\s+NVSHMEM_VENDOR_{p}_VERSION\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


_CUDART_INSTALL = "install a CUDA toolkit (CUDA_HOME) or pip install nvidia-cuda-runtime"


def toolchain() -> Toolchain:
    """Find NVSHMEM's headers and device library and the CUDA headers they include.

    NVSHMEM: ``MPBIND_NVSHMEM_HOME``, then the installation of the host library mpbind loaded (or
    would load, per ``MPBIND_NVSHMEM_PATH``), then ``cuda.pathfinder`` (the nvidia-nvshmem wheel).
    """
    tried = []
    for via, home in _nvshmem_homes():
        if (home / "include" / "nvshmem.h").is_file() and (home / "lib" / "libnvshmem_device.a").is_file():
            return Toolchain(home, _cuda_header_dir("cudart", "cuda_runtime.h", _CUDART_INSTALL),
                             _cuda_header_dir("cccl", "cuda/std/version", "pip install 'mpbind[kernels]'"),
                             _nvshmem_version(home / "include"))
        tried.append(f"{home} (from {via})")
    raise LibraryNotFoundError(
        "cannot find NVSHMEM's device headers and libnvshmem_device.a; tried: "
        + ("; ".join(tried) or "nothing") + f". Install nvidia-nvshmem-cu13 or set {HOME_ENV} to a folder "
        "holding include/nvshmem.h and lib/libnvshmem_device.a")


def current_arch() -> str | None:
    """``sm_XY`` of the current CUDA device, or None without a driver or a GPU."""
    from mpbind._infra import cuda as _cuda

    try:
        major, minor = _cuda.compute_capability(_cuda.current_device())
    except Exception:  # no driver, no device, no cuda-bindings: the caller picks a default
        return None
    return f"sm_{major}{minor}"


def cache_dir() -> Path:
    """``MPBIND_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/mpbind/kernels`` (``~/.cache/mpbind/kernels``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mpbind" / "kernels"


# --- the cubin's symbols ---------------------------------------------------------------------

_STT_OBJECT, _STT_FUNC = 1, 2
_STO_CUDA_ENTRY = 0x10  # st_other of a __global__ function in a CUDA ELF


def kernel_symbols(cubin: bytes) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(kernels, global variables) a linked cubin defines, read from its ELF symbol table."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise UsageError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    kernels, variables = [], []
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != 2 or not entsize:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for i in range(size // entsize):
            st_name, st_info, st_other, st_shndx, _value, _size = struct.unpack_from(
                "<IBBHQQ", cubin, offset + i * entsize)
            if st_shndx == 0:  # undefined
                continue
            start = strtab + st_name
            name = cubin[start:cubin.index(b"\0", start)].decode()
            if st_info & 0xF == _STT_FUNC and st_other & _STO_CUDA_ENTRY:
                kernels.append(name)
            elif st_info & 0xF == _STT_OBJECT:
                variables.append(name)
    return tuple(sorted(kernels)), tuple(sorted(variables))


# --- compile and link ------------------------------------------------------------------------


def _tree_identity(folders: Sequence[str]) -> bytes:
    """Size and time of every file under the caller's include folders: a changed header misses."""
    h = hashlib.sha256()
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                h.update(_file_identity(Path(root) / name))
    return h.digest()


def _nvrtc_log(exc: Exception) -> str:
    text = str(exc).replace("\x00", "")
    marker = "compilation log:"
    return text.split(marker, 1)[1].strip() if marker in text else text


def _link(objects: bytes, name: str, arch: str, library: Path, options: Sequence[str]) -> tuple[bytes, str]:
    from cuda.bindings import nvjitlink

    args = [f"-arch={arch}", *options]
    handle = nvjitlink.create(len(args), args)
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.CUBIN, objects, len(objects), name)
            nvjitlink.add_file(handle, nvjitlink.InputType.LIBRARY, str(library))
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            raise KernelBuildError("link", name, arch, _jitlink_log(handle, nvjitlink.get_error_log_size,
                                                                    nvjitlink.get_error_log) or str(exc)) from None
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin), _jitlink_log(handle, nvjitlink.get_info_log_size, nvjitlink.get_info_log)
    finally:
        nvjitlink.destroy(handle)


def _jitlink_log(handle: int, size_of: Any, read: Any) -> str:
    n = size_of(handle)
    if n <= 1:
        return ""
    buf = bytearray(n)
    read(handle, buf)
    return buf.decode(errors="replace").rstrip("\x00").strip()


@dataclass(frozen=True)
class Built:
    cubin: bytes
    key: str
    cached: bool
    log: str


def build(source: str, name: str, arch: str, defines: Sequence[str | tuple[str, str]], include_dirs: Sequence[str],
          link_options: Sequence[str], program_options: dict[str, Any], cache: bool) -> Built:
    """Compile `source` with NVRTC and link it against NVSHMEM's device library (see the module)."""
    core = _require_cuda_core("compiling NVSHMEM kernels")
    program_options = dict(program_options)
    if not _ARCH.match(arch):
        raise UsageError(f"arch must be like 'sm_90', not {arch!r}")
    tools = toolchain()
    fixed = {"name", "arch", "include_path", "define_macro", "relocatable_device_code",
             "device_as_default_execution_space"}
    clash = sorted(fixed & set(program_options))
    if clash:
        raise UsageError(f"{', '.join(clash)}: set by the build itself (use name=, arch=, defines=, include_dirs=)")
    try:
        options = core.ProgramOptions(
            name=name, arch=arch, std=program_options.pop("std", "c++17"),
            include_path=[*include_dirs, *tools.include_path()], relocatable_device_code=True,
            **({"device_as_default_execution_space": True} if tools.legacy else {}),
            define_macro=[*DEFINES, *defines], **program_options)
    except TypeError as exc:
        raise UsageError(f"not a cuda.core ProgramOptions field: {exc}") from None

    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

    digest = hashlib.sha256(tools.fingerprint() + _tree_identity(include_dirs))
    digest.update(repr(list(link_options)).encode())
    if tools.legacy:
        shown = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
        source = LEGACY_PRELUDE.format(name=shown) + source
    key = make_program_cache_key(code=source, code_type="c++", options=options, target_type="cubin",
                                 extra_digest=digest.digest())
    store = FileStreamProgramCache(cache_dir()) if cache else None
    if store is not None:
        hit = store.get(key)
        if hit is not None:
            return Built(bytes(hit), key.hex(), True, "")

    log_sink: list[str] = []

    class _Log:
        def write(self, text: str) -> None:
            log_sink.append(text)

    try:
        objects = core.Program(source, "c++", options).compile("cubin", logs=_Log())
    except Exception as exc:
        if type(exc).__name__ != "NVRTCError":
            raise
        raise KernelBuildError("compile", name, arch, _nvrtc_log(exc)) from None
    cubin, link_log = _link(bytes(objects.code), name, arch, tools.device_library, link_options)
    if store is not None:
        store[key] = cubin
    return Built(cubin, key.hex(), False, "\n".join(s for s in ("".join(log_sink).strip(), link_log) if s))
