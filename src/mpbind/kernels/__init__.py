"""Kernels that call NVSHMEM, written in CUDA C++ and compiled, loaded and launched from Python.

::

    from mpbind import kernels as nk, nvshmem

    RING = r'''
    #include <nvshmem.h>
    #include <nvshmemx.h>
    extern "C" __global__ void ring(float* dst, const float* src, size_t n, uint64_t* sig) {
        int peer = (nvshmem_my_pe() + 1) % nvshmem_n_pes();
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            nvshmem_float_put_signal_nbi(dst, src, n, sig, 1, NVSHMEM_SIGNAL_SET, peer);
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_EQ, 1);
        }
    }'''
    cubin = nk.compile(RING)                      # NVRTC + nvJitLink, cached on disk; no GPU needed
    with nvshmem.init(mpi_comm=MPI.COMM_WORLD, device=0):
        dst, sig = nvshmem.zeros(1024, "float32"), nvshmem.zeros(1, "uint64")
        with cubin.load() as lib:                 # cuLibraryLoadData + nvshmemx_culibrary_init
            ring = lib.kernel("ring", nk.symmetric("dst", "float32"), nk.pointer("src", "float32"),
                              nk.value("n", "uint64"), nk.symmetric("sig", "uint64"))
            ring.launch(dst, src, 1024, sig, grid=1, block=32, stream=s)

**Building** (:func:`compile`) needs no GPU: NVRTC compiles the source against the NVSHMEM headers
of the installed wheel (and the CUDA headers they include, found by ``cuda.pathfinder``), nvJitLink
links it with NVSHMEM's ``libnvshmem_device.a``, and the linked cubin is cached on disk (see
:mod:`mpbind.kernels._build`). A source that does not compile or link raises
:class:`~mpbind.errors.KernelBuildError` carrying the compiler's or linker's log.

**Loading** (:meth:`Cubin.load`) needs the NVSHMEM runtime (``mpbind.nvshmem.init``): the cubin is
loaded as a ``CUlibrary`` (cuda-core's ``ObjectCode``) and registered with
``nvshmemx_culibrary_init``, so that its copy of NVSHMEM's device state is filled in.
``Library.close()`` (or leaving ``with``) synchronises the device, unregisters it
(``nvshmemx_culibrary_finalize``) and unloads it; close it before ``nvshmem.finalize()``. A library
dropped unclosed is never released by the garbage collector (its kernels may still run, and NVSHMEM
keeps a pointer into it): it warns ``ResourceWarning`` and stays loaded until :func:`drain` (the process's
``mpbind.drain()``, which runs every queued release newest first) or ``nvshmem.finalize()``, which unloads
it before NVSHMEM goes.

**Launching**: a kernel's parameters are declared (:func:`value`, :func:`pointer`,
:func:`symmetric`) and every launch checks its arguments against them before anything reaches
CUDA: a value must fit its C type, a pointer must be a device address or array (of the declared
dtype), and a symmetric one must lie in NVSHMEM's symmetric heap. :meth:`Kernel.launch` is a plain
launch on any stream; :meth:`Kernel.launch_collective` is NVSHMEM's collective launch (every CTA
co-resident), needed by kernels that synchronise across PEs: through
``nvshmemx_collective_launch`` where the flat bindings have it, otherwise a cooperative launch of at
most the co-resident grid (what ``nvshmemx_collective_launch`` itself does). The checks depend only
on what every PE has alike (the declared parameters, the arguments of a symmetric program, the PE
count), so a refused launch is refused on every PE and no PE waits for one that never launched.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mpbind import drain
from mpbind._infra import args as _args
from mpbind._infra import cuda as _cuda
from mpbind._infra.owned import Owned
from mpbind.errors import LibraryNotFoundError, UsageError
from mpbind.kernels import _build as _kernel_build

__all__ = [
    "Cubin",
    "Kernel",
    "Library",
    "Param",
    "compile",
    "drain",
    "pointer",
    "symmetric",
    "value",
]

# --- building ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cubin:
    """A linked cubin: NVSHMEM's device library is in it. Made by :func:`compile`; no GPU needed."""

    code: bytes
    name: str
    arch: str
    #: The ``__global__`` functions it defines (mangled names for C++ kernels; use ``extern "C"``).
    kernels: tuple[str, ...]
    #: Its global variables (``nvshmemi_device_state_d`` where it calls NVSHMEM).
    variables: tuple[str, ...]
    #: The cache key (hex), and whether this cubin came from the cache.
    key: str
    cached: bool
    #: Warnings of the compiler and the linker (empty for a cached cubin).
    log: str

    def __post_init__(self) -> None:
        # compile() makes them; one made by hand (a cubin built elsewhere) must hold what load() reads.
        if not isinstance(self.code, bytes) or not self.code:
            raise TypeError(f"code must be the cubin's bytes, not {type(self.code).__name__}")
        for name in ("name", "arch", "key", "log"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, not {type(getattr(self, name)).__name__}")
        for name in ("kernels", "variables"):
            names = getattr(self, name)
            if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"{name} must be a tuple of symbol names (str)")
        if not isinstance(self.cached, bool):
            raise TypeError(f"cached must be a bool, not {type(self.cached).__name__}")

    @property
    def uses_nvshmem(self) -> bool:
        """Whether it holds NVSHMEM's device state, which ``nvshmemx_culibrary_init`` fills in."""
        return "nvshmemi_device_state_d" in self.variables

    def load(self) -> Library:
        """Load it on the current device and register it with NVSHMEM (needs the runtime)."""
        return Library._load(self)

    def __repr__(self) -> str:
        return (f"<Cubin {self.name} {self.arch} {len(self.code)} bytes kernels={list(self.kernels)}"
                f"{' cached' if self.cached else ''}>")


def compile(source: str, *, name: str = "nvshmem_kernels", arch: str | None = None,
            defines: Sequence[str | tuple[str, str]] = (), include_dirs: Sequence[str] = (),
            link_options: Sequence[str] = (), cache: bool = True, **program_options: Any) -> Cubin:
    """Compile CUDA C++ `source` that includes ``<nvshmem.h>``/``<nvshmemx.h>`` and link it with
    NVSHMEM's device library, for `arch` (``"sm_90"``; by default the current device's, or
    ``sm_90`` where there is no GPU).

    `defines` are ``"NAME"``, ``"NAME=VALUE"`` or ``(name, value)``; `include_dirs` come before
    NVSHMEM's and CUDA's; further keyword arguments are fields of cuda-core's ``ProgramOptions``
    (``std="c++20"``, ``lineinfo=True``, ...). The cubin is cached on disk (``MPBIND_KERNEL_CACHE``,
    default ``~/.cache/mpbind/kernels``) by source, options, architecture, NVSHMEM version and
    compiler versions; ``cache=False`` builds anew. Raises :class:`~mpbind.errors.KernelBuildError`
    with the log when the source does not compile or link. Compiling NVSHMEM's inlined device code
    takes about a minute; a cached cubin is read in milliseconds.
    """
    if not isinstance(source, str) or not source.strip():
        raise UsageError("source must be CUDA C++ source text")
    if not isinstance(name, str) or not name:
        raise UsageError("name must be a non-empty string")
    if arch is not None and not isinstance(arch, str):
        raise TypeError(f"arch must be a str such as 'sm_90', not {type(arch).__name__}")
    # Read no further than any build has options: a mistyped range is refused, not listed.
    macros = _args.sequence(defines, "defines", _MAX_OPTIONS, "macros")
    for d in macros:
        if not (isinstance(d, str) or isinstance(d, tuple) and len(d) == 2 and all(isinstance(x, str) for x in d)):
            raise TypeError(f"defines are 'NAME', 'NAME=VALUE' or (name, value) strings, not {_args.shown(d)}")
    dirs = [str(d) for d in _args.sequence(include_dirs, "include_dirs", _MAX_OPTIONS, "paths")]
    links = _args.sequence(link_options, "link_options", _MAX_OPTIONS, "strings")
    if not all(isinstance(o, str) for o in links):
        raise TypeError("link_options must be strings")
    arch = arch if arch is not None else (_kernel_build.current_arch() or _kernel_build.DEFAULT_ARCH)
    built = _kernel_build.build(source, name, arch, list(macros), dirs, list(links), program_options, bool(cache))
    kernels, variables = _kernel_build.kernel_symbols(built.cubin)
    return Cubin(built.cubin, name, arch, kernels, variables, built.key, built.cached, built.log)


_MAX_OPTIONS = 4096  # defines, include directories, link options of one build

# --- parameters --------------------------------------------------------------------------------

# C types of value parameters: our names and the C spellings people write in kernel signatures.
_CTYPES: dict[str, type[Any]] = {
    "bool": ctypes.c_bool,
    "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float, "float64": ctypes.c_double,
}
_C_SPELLINGS = {
    "int": "int32", "unsigned": "uint32", "unsigned int": "uint32", "long long": "int64",
    "unsigned long long": "uint64", "size_t": "uint64", "ptrdiff_t": "int64", "float": "float32",
    "double": "float64", "char": "int8", "short": "int16", "unsigned short": "uint16",
    **{f"{t}_t": t for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")},
}
_INT_RANGES = {f"{s}int{b}": ((0, 2**b - 1) if s else (-(2 ** (b - 1)), 2 ** (b - 1) - 1))
               for s in ("", "u") for b in (8, 16, 32, 64)}
_FLOAT32_MAX = 3.4028234663852886e38

Kind = Literal["value", "pointer", "symmetric"]


@dataclass(frozen=True)
class Param:
    """One declared kernel parameter: a plain value of a C type, a device pointer, or a pointer into
    NVSHMEM's symmetric heap. `dtype` is a value's C type, or a pointer's element type (None: any)."""

    name: str
    kind: Kind
    dtype: str | None = None

    def __post_init__(self) -> None:
        # value(), pointer() and symmetric() make them; one made by hand is checked alike.
        name = _param_name(self.name)
        what = f"parameter {name!r}"
        if self.kind == "value":
            dtype = _ctype_name(self.dtype, what)  # type: ignore[arg-type]  # None is refused
        elif self.kind in ("pointer", "symmetric"):
            dtype = _element_type(self.dtype, what)
        else:
            raise UsageError(f"{what}: kind must be 'value', 'pointer' or 'symmetric', got {self.kind!r}")
        object.__setattr__(self, "dtype", dtype)

    @property
    def nbytes(self) -> int:
        """Its size in the kernel's parameter buffer."""
        return ctypes.sizeof(_CTYPES[self.dtype]) if self.kind == "value" and self.dtype else 8


def _ctype_name(ctype: str, what: str) -> str:
    if not isinstance(ctype, str):
        raise TypeError(f"{what}: a C type is a string such as 'uint64' or 'size_t', not {type(ctype).__name__}")
    key = " ".join(ctype.split())
    key = _C_SPELLINGS.get(key, key)
    if key not in _CTYPES:
        raise UsageError(f"{what}: unknown C type {ctype!r}; one of {', '.join(_CTYPES)} (or their C spellings)")
    return key


def _element_type(dtype: Any, what: str) -> str | None:
    if dtype is None:
        return None
    from mpbind._infra.interop import dtype_name

    try:
        return dtype_name(dtype)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what}: {exc}") from None


def _param_name(name: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise UsageError(f"a parameter name must be an identifier, not {name!r}")
    return name


def value(name: str, ctype: str) -> Param:
    """A parameter passed by value: ``int32``, ``uint64``, ``float32``, ... or ``int``, ``size_t``, ..."""
    return Param(name, "value", ctype)


def pointer(name: str, dtype: Any = None) -> Param:
    """A device pointer: an address (int), or a device array (of `dtype` when given)."""
    return Param(name, "pointer", dtype)


def symmetric(name: str, dtype: Any = None) -> Param:
    """A pointer into NVSHMEM's symmetric heap (the target of remote puts, gets, signals and
    atomics): a :class:`~mpbind.nvshmem.SymmetricArray`, or an array or address inside one."""
    return Param(name, "symmetric", dtype)


# --- arguments (checked before any launch) -----------------------------------------------------

Heap = Callable[[int, int], bool]


def _runtime_heap(ptr: int, nbytes: int) -> bool:
    from mpbind import _core

    return _core.nvshmem.containing(ptr, nbytes) is not None


def _is_int(obj: Any) -> bool:
    """An integer (int, NumPy integer scalar), not a bool, and not an array: PyTorch tensors define
    ``__index__`` too (raising for more than one element), and an array argument is a pointer."""
    return not isinstance(obj, bool) and hasattr(type(obj), "__index__") and not _args.exports_array(obj)


def _span(obj: Any, what: str) -> tuple[int, int, str | None, bool]:
    """(address, bytes, dtype or None, known symmetric) of a pointer argument."""
    from mpbind.nvshmem import PeerArray, SymmetricArray

    if _is_int(obj):
        address = _args.index(obj, what)
        if not 0 <= address < 2**64:
            raise UsageError(f"{what}: an address is in [0, 2**64), got {_args.show(address)}")
        return address, 1, None, False
    if isinstance(obj, SymmetricArray):
        return obj.ptr, obj.nbytes, obj.dtype, True  # .ptr: UsageError once freed
    if isinstance(obj, PeerArray):
        raise UsageError(f"{what}: a PeerArray is another PE's copy, not symmetric memory of this PE; "
                         "pass the SymmetricArray itself (its .base)")
    from mpbind._infra.interop import array_info

    info = array_info(obj, what)
    if info.device == -1:
        raise UsageError(f"{what}: host memory; a kernel needs device memory")
    address, nbytes = _args.span(info.ptr, max(info.nbytes, 1), what)  # a wrapped end would pass the heap check
    return address, nbytes, info.dtype, False


def _argument(param: Param, obj: Any, heap: Heap) -> Any:
    """What cuda-core passes for `obj`: a ctypes scalar for a value, an int address for a pointer."""
    what = f"argument {param.name!r}"
    if param.kind == "value":
        assert param.dtype is not None
        if param.dtype.startswith("float"):
            if isinstance(obj, bool) or not isinstance(obj, (int, float)) and not hasattr(type(obj), "__float__"):
                raise TypeError(f"{what} is a {param.dtype}, not {type(obj).__name__}")
            try:
                x = float(obj)
            except OverflowError:
                raise UsageError(f"{what} does not fit {param.dtype}: {_args.shown(obj)}") from None
            except Exception as exc:  # noqa: BLE001 - the caller's __float__ failed: not a number
                raise TypeError(f"{what} is a {param.dtype}; {type(obj).__name__}.__float__ failed: {exc}") from None
            if param.dtype == "float32" and math.isfinite(x) and abs(x) > _FLOAT32_MAX:
                raise UsageError(f"{what} does not fit float32: {x!r} (it would become inf)")
            return _CTYPES[param.dtype](x)
        if param.dtype == "bool":
            if not isinstance(obj, bool):
                raise TypeError(f"{what} is a bool, not {type(obj).__name__}")
            return ctypes.c_bool(obj)
        if not _is_int(obj):
            raise TypeError(f"{what} is an {param.dtype}, not {type(obj).__name__}")
        lo, hi = _INT_RANGES[param.dtype]
        v = _args.index(obj, what)
        if not lo <= v <= hi:
            raise UsageError(f"{what} does not fit {param.dtype} ([{lo}, {hi}]): {_args.show(v)}")
        return _CTYPES[param.dtype](v)
    address, nbytes, dtype, known_symmetric = _span(obj, what)
    if param.dtype is not None and dtype is not None and dtype != param.dtype:
        raise UsageError(f"{what} is declared {param.dtype}, got an array of {dtype}")
    if param.kind == "symmetric" and not known_symmetric and not heap(address, nbytes):
        raise UsageError(
            f"{what} is declared symmetric, but [{address:#x}, +{nbytes}) is not in NVSHMEM's symmetric heap: "
            "allocate it with mpbind.nvshmem.empty() or zeros() (every PE alike)")
    return address


def _prepare(params: Sequence[Param], args: Sequence[Any], heap: Heap = _runtime_heap) -> list[Any]:
    """Check `args` against `params` and convert them for the launch (no CUDA call). `heap(ptr,
    nbytes)` says whether a range is symmetric (the runtime's allocation map by default)."""
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise TypeError(f"the kernel takes {len(params)} arguments ({names}), got {len(args)}")
    return [_argument(p, a, heap) for p, a in zip(params, args, strict=True)]


# CUDA's limits on every device: a grid's x, y, z; a block's x, y, z and its threads.
_MAX_DIMS = {"grid": (2**31 - 1, 65535, 65535), "block": (1024, 1024, 64)}
_MAX_THREADS = 1024


def _dims(dims: Any, what: str) -> tuple[int, int, int]:
    parts = (dims,) if _is_int(dims) else tuple(dims) if isinstance(dims, (tuple, list)) else None
    if parts is None or not 1 <= len(parts) <= 3 or not all(_is_int(d) for d in parts):
        raise TypeError(f"{what} is an int or a tuple of up to 3 ints, not {_args.shown(dims)}")
    out = tuple(_args.index(d, what) for d in parts) + (1,) * (3 - len(parts))
    if any(d < 1 for d in out):
        raise UsageError(f"{what} must be positive, got {_args.shown(dims)}")
    limits = _MAX_DIMS.get(what, _MAX_DIMS["grid"])
    if any(d > hi for d, hi in zip(out, limits, strict=True)) or (what == "block" and math.prod(out) > _MAX_THREADS):
        raise UsageError(f"{what} {out} is beyond CUDA's limits ({what} at most {limits}"
                         + (f", {_MAX_THREADS} threads" if what == "block" else "") + ")")
    return out  # type: ignore[return-value]


# --- loaded libraries --------------------------------------------------------------------------


def _unloader(device: int, handle: int) -> Callable[[bool], None]:
    """What the core's release of a library calls once, before it drops the loaded code (which
    unloads the CUlibrary): no kernel of it may still run, and NVSHMEM forgets it."""

    def unload(registered: bool) -> None:
        from cuda.core import Device

        Device(device).sync()
        if registered and _nvshmem_alive():
            from mpbind.bindings import nvshmem as flat

            flat.culibrary_finalize(handle)

    return unload


def _nvshmem_alive() -> bool:
    from mpbind import nvshmem

    return nvshmem.is_initialized()


def _current_device() -> int:
    from mpbind import nvshmem

    if nvshmem.is_initialized():
        return nvshmem.device()
    return _cuda.current_device()


class Library(Owned):
    """A :class:`Cubin` loaded on a device and registered with NVSHMEM. ``close()`` (or ``with``)
    synchronises the device, unregisters it and unloads it; kernels taken from it stop working. Its
    lifetime is the core's ``nvshmem.KernelLibrary`` row: ``nvshmem.finalize()`` closes it first, and
    dropped unclosed it is queued until ``mpbind.drain()``."""

    __slots__ = ("_core", "_cubin")
    _cubin: Cubin

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("kernel libraries come from Cubin.load()")

    @classmethod
    def _load(cls, cubin: Cubin) -> Library:
        if cubin.uses_nvshmem and not _nvshmem_alive():
            raise UsageError(f"{cubin.name} calls NVSHMEM: initialise it (mpbind.nvshmem.init) before load()")
        from cuda.core import Device, ObjectCode
        from cuda.pathfinder import DynamicLibNotFoundError

        try:
            device = _current_device()
            Device(device).set_current()
        except DynamicLibNotFoundError as exc:  # no NVIDIA driver on this machine
            raise LibraryNotFoundError(f"loading {cubin.name} needs the NVIDIA driver: {exc}") from None
        objects = ObjectCode.from_cubin(cubin.code, name=cubin.name)
        handle = int(objects.handle)  # cuLibraryLoadData
        if cubin.uses_nvshmem:
            from mpbind.bindings import nvshmem as flat

            flat.culibrary_init(handle)
        from mpbind import _core

        state = _core.nvshmem.load_library(objects, handle, device, cubin.name, cubin.uses_nvshmem,
                                           _unloader(device, handle))
        self = cls._over(state)
        self._cubin = cubin
        return self

    @property
    def cubin(self) -> Cubin:
        return self._cubin

    @property
    def device(self) -> int:
        return int(self._core.device)

    @property
    def handle(self) -> int:
        """The ``CUlibrary``; ``UsageError`` once closed."""
        return int(self._core.handle)

    def kernel(self, name: str, *params: Param, collective: bool = False, n_pes: int | None = None) -> Kernel:
        """The kernel `name` with its declared parameters, in order.

        ``collective=True`` says it synchronises across PEs (NVSHMEM barriers, collectives, or
        waits on other PEs' CTAs): it is then launched only with :meth:`Kernel.launch_collective`.
        ``n_pes`` is the PE count it is written for, where it has one; a launch on a runtime of
        another size is refused.
        """
        if name not in self._cubin.kernels:
            raise UsageError(f"{self._cubin.name} has no kernel {name!r}; it has {list(self._cubin.kernels)} "
                             "(declare kernels extern \"C\" to keep their names)")
        for p in params:
            if not isinstance(p, Param):
                raise TypeError(f"parameters are declared with value(), pointer() or symmetric(), not {p!r}")
        if len({p.name for p in params}) != len(params):
            raise UsageError(f"parameter names repeat: {[p.name for p in params]}")
        if n_pes is not None and (not _is_int(n_pes) or not 1 <= _args.index(n_pes, "n_pes") <= _args.INT_MAX):
            raise UsageError(f"n_pes must be a positive int or None, not {_args.shown(n_pes)}")
        kernel = self._core.code.get_kernel(name)  # UsageError once closed
        sizes = [size for _offset, size in kernel.arguments_info]
        declared = [p.nbytes for p in params]
        if sizes != declared:
            raise UsageError(f"{name} takes {len(sizes)} parameters of {sizes} bytes; the declaration "
                             f"({', '.join(f'{p.kind} {p.name}' for p in params)}) has {declared}")
        return Kernel._new(self, kernel, name, tuple(params), collective, n_pes)

    def _described(self) -> str:
        return f"{self._cubin.name} {self._cubin.arch}"


# --- launching ---------------------------------------------------------------------------------


def _stream(stream: Any) -> Any:
    from cuda.core import Stream

    from mpbind._infra.interop import stream_handle

    return Stream.from_handle(stream_handle(stream))


def _flat_collective_launch() -> Any:
    """``nvshmemx_collective_launch`` of the flat bindings, where they bind it."""
    from mpbind.bindings import nvshmem as flat

    return getattr(flat, "collective_launch", None)


class Kernel:
    """A kernel of a :class:`Library` with its declared parameters; it keeps the library alive."""

    __slots__ = ("_library", "_kernel", "_name", "_params", "_collective", "_n_pes", "_grid_limits")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("kernels come from Library.kernel()")

    @classmethod
    def _new(cls, library: Library, kernel: Any, name: str, params: tuple[Param, ...], collective: bool,
             n_pes: int | None) -> Kernel:
        self = cls.__new__(cls)
        self._library = library
        self._kernel = kernel
        self._name = name
        self._params = params
        self._collective = collective
        self._n_pes = n_pes
        # (threads per CTA, shared bytes) -> max_collective_grid: fixed while the library is loaded,
        # and NVSHMEM runs once per process; read on every collective launch
        self._grid_limits: dict[tuple[int, int], int] = {}
        return self

    @property
    def name(self) -> str:
        return self._name

    @property
    def params(self) -> tuple[Param, ...]:
        return self._params

    @property
    def collective(self) -> bool:
        return self._collective

    @property
    def handle(self) -> int:
        """The ``CUkernel``."""
        self._library.handle  # noqa: B018 - UsageError once the library is closed
        return int(self._kernel.handle)

    def _checked(self, args: Sequence[Any]) -> list[Any]:
        self._library.handle  # noqa: B018 - UsageError once the library is closed
        if self._n_pes is not None:
            from mpbind import nvshmem

            have = nvshmem.n_pes()
            if have != self._n_pes:
                raise UsageError(f"{self._name} is written for {self._n_pes} PEs; this runtime has {have}")
        return _prepare(self._params, args)

    def launch(self, *args: Any, grid: Any, block: Any, shared_mem: int = 0, stream: Any = None) -> None:
        """Launch on `stream` (any stream; None: the default stream) after checking the arguments."""
        if self._collective:
            raise UsageError(f"{self._name} is declared collective (it synchronises across PEs): launch it with "
                             "launch_collective(), on every PE")
        from cuda.core import LaunchConfig, launch

        values = self._checked(args)
        config = LaunchConfig(grid=_dims(grid, "grid"), block=_dims(block, "block"),
                              shmem_size=_shared(shared_mem))
        launch(_stream(stream), config, self._kernel, *values)

    def max_collective_grid(self, block: Any, shared_mem: int = 0) -> int:
        """The most CTAs a collective launch may have: all of them co-resident on the device, with
        the device's room divided among the PEs that share it (under MPS each of their launches
        must fit beside the others', or the first spins in its barrier and the rest never start).
        Divided even where an MPS thread limit already shrank the SMs this PE sees: the limit caps
        how many SMs a PE uses, it does not keep the PEs off each other's (eight PEs at 12 % each,
        each launching all the room it saw, hung)."""
        threads = math.prod(_dims(block, "block"))
        per_sm = self._kernel.occupancy.max_active_blocks_per_multiprocessor(threads, _shared(shared_mem))
        room = int(per_sm) * _cuda.multiprocessor_count(self._library.device)
        from mpbind import nvshmem

        return room // nvshmem.pes_sharing_this_gpu()

    def launch_collective(self, *args: Any, block: Any, grid: Any = 0, shared_mem: int = 0,
                          stream: Any = None) -> tuple[int, int, int]:
        """NVSHMEM's collective launch on every PE (collective: call it on all of them), after the
        checks. ``grid=0`` takes the largest co-resident grid; a larger grid is refused (it would
        never start). Returns the grid launched."""
        values = self._checked(args)
        block3 = _dims(block, "block")
        key = (math.prod(block3), _shared(shared_mem))
        limit = self._grid_limits.get(key)
        if limit is None:
            limit = self._grid_limits[key] = self.max_collective_grid(block3, shared_mem)
        grid3 = (limit, 1, 1) if _is_int(grid) and _args.index(grid, "grid") == 0 else _dims(grid, "grid")
        if limit < 1 or math.prod(grid3) > limit:
            raise UsageError(f"a collective launch of {self._name} with {math.prod(grid3)} CTAs of {block3} "
                             f"cannot have every CTA resident at once (at most {limit} on this device)")
        shared = _shared(shared_mem)
        flat_launch = _flat_collective_launch()
        if flat_launch is not None:
            argv, keep = _argv(values)
            flat_launch(int(self._kernel.handle), grid3, block3, ctypes.addressof(argv), shared, _stream_int(stream))
            del keep  # the argument copies live until the call returned
        else:
            from cuda.core import LaunchConfig, launch

            config = LaunchConfig(grid=grid3, block=block3, shmem_size=shared, is_cooperative=True)
            launch(_stream(stream), config, self._kernel, *values)
        return grid3

    def __repr__(self) -> str:
        params = ", ".join(f"{p.kind} {p.name}" + (f": {p.dtype}" if p.dtype else "") for p in self._params)
        return f"<Kernel {self._name}({params}){' collective' if self._collective else ''}>"


def _stream_int(stream: Any) -> int:
    from mpbind._infra.interop import stream_handle

    return stream_handle(stream)


def _shared(shared_mem: Any) -> int:
    # A launch takes it as an unsigned int.
    if not _is_int(shared_mem) or not 0 <= _args.index(shared_mem, "shared_mem") <= 2**32 - 1:
        raise UsageError(f"shared_mem is a number of bytes in [0, 2**32 - 1], not {_args.shown(shared_mem)}")
    return _args.index(shared_mem, "shared_mem")


def _argv(values: Sequence[Any]) -> tuple[Any, list[Any]]:
    """The ``void**`` a C launch takes: one pointer per argument, to a copy of its value."""
    holders = [v if isinstance(v, ctypes._SimpleCData) else ctypes.c_uint64(v) for v in values]
    argv = (ctypes.c_void_p * max(len(holders), 1))(*[ctypes.addressof(h) for h in holders])
    return argv, holders
