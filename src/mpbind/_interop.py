"""Arrays and streams from other libraries, as the Pythonic layer takes them.

Arrays: anything with ``__cuda_array_interface__`` (CuPy, PyTorch, Numba, JAX) or
``__dlpack__`` (the same, plus bfloat16 and float8 tensors that the interface cannot
describe), or one of our own buffers (``ptr`` and ``nbytes``). Element types are named
by strings (``"float32"``, ``"bfloat16"``, ...), so that no framework is required.

Streams: ``None`` (the default stream), an int, or an object with ``__cuda_stream__``,
``.cuda_stream`` (PyTorch) or ``.ptr`` (CuPy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpbind import _core
from mpbind.errors import UsageError

__all__ = ["ArrayInfo", "array_info", "c_strides", "device_span", "dtype_name", "itemsize", "stream_handle"]

# DLPack type codes (dlpack.h, DLDataTypeCode) with bit widths -> our names.
_DLPACK_NAMES: dict[tuple[int, int], str] = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
    (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
    (4, 16): "bfloat16",
    (5, 64): "complex64", (5, 128): "complex128",
    (6, 8): "bool",
    (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2",
}
_NAME_TO_DLPACK: dict[str, tuple[int, int]] = {v: k for k, v in _DLPACK_NAMES.items()}
_ITEMSIZE: dict[str, int] = {name: bits // 8 for (_, bits), name in _DLPACK_NAMES.items()}
_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged
_DLPACK_CPU = (1, 3)  # kDLCPU, kDLCUDAHost


def dtype_name(dtype: Any) -> str:
    """Our name of `dtype`: a str, a NumPy dtype or type, or a framework dtype (``torch.bfloat16``)."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif isinstance(dtype, (np.dtype, type)):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = getattr(dtype, "__name__", str(dtype))
    else:
        name = str(dtype).rsplit(".", 1)[-1]  # torch.float32, jnp.bfloat16
    aliases = {"half": "float16", "float": "float32", "double": "float64", "cfloat": "complex64",
               "cdouble": "complex128", "bf16": "bfloat16", "float8_e4m3": "float8_e4m3fn"}
    name = aliases.get(name, name)
    if name not in _ITEMSIZE:
        raise UsageError(f"unsupported dtype {dtype!r} (supported: {', '.join(sorted(_ITEMSIZE))})")
    return name


def itemsize(dtype: Any) -> int:
    """Bytes per element of `dtype`."""
    return _ITEMSIZE[dtype_name(dtype)]


def dlpack_code(dtype: Any) -> tuple[int, int]:
    """The DLPack (type code, bits) of `dtype`."""
    return _NAME_TO_DLPACK[dtype_name(dtype)]


@dataclass(frozen=True)
class ArrayInfo:
    """Where an array's elements are: pointer, shape, strides in elements, dtype, device."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int  # CUDA device ordinal, or -1 for host memory
    readonly: bool
    owner: Any  # keeps the memory alive

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def c_contiguous(self) -> bool:
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True

    @property
    def f_contiguous(self) -> bool:
        expected = 1
        for extent, stride in zip(self.shape, self.strides, strict=True):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides, in elements, of a C-contiguous array of `shape`."""
    strides = []
    acc = 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= extent
    return tuple(reversed(strides))


def _from_cai(obj: Any, cai: dict[str, Any]) -> ArrayInfo:
    shape = tuple(int(s) for s in cai["shape"])
    try:
        dt = np.dtype(cai["typestr"])
    except TypeError:
        raise UsageError(f"unsupported __cuda_array_interface__ typestr {cai['typestr']!r}") from None
    name = dtype_name(dt)
    ptr, readonly = cai["data"]
    raw = cai.get("strides")
    if raw is None:
        strides = c_strides(shape)
    else:
        if any(s % dt.itemsize for s in raw):
            raise UsageError(f"array strides {tuple(raw)} are not multiples of its itemsize {dt.itemsize}")
        strides = tuple(int(s) // dt.itemsize for s in raw)
    device = -1 if ptr == 0 and not shape else _device_of(obj)
    return ArrayInfo(int(ptr), shape, strides, name, device, bool(readonly), obj)


def _device_of(obj: Any) -> int:
    dev = getattr(obj, "device", None)
    index = getattr(dev, "index", None)  # torch.device
    if isinstance(index, int):
        return index
    ident = getattr(dev, "id", None)  # cupy.cuda.Device
    if isinstance(ident, int):
        return ident
    if hasattr(obj, "__dlpack_device__"):
        try:
            kind, ordinal = obj.__dlpack_device__()
            if int(kind) in _DLPACK_CUDA:
                return int(ordinal)
        except Exception:  # noqa: BLE001 - a device query must not mask the array itself
            pass
    return 0


def array_info(obj: Any) -> ArrayInfo:
    """Describe a device (or host) array through ``__cuda_array_interface__`` or DLPack."""
    if isinstance(obj, ArrayInfo):
        return obj
    cai = None
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        pass
    except TypeError:
        cai = None  # e.g. a bfloat16 torch tensor: fall back to DLPack
    # A void typestr ("<V2": PyTorch's bfloat16) does not say what the elements are; DLPack does.
    if cai is not None and not (str(cai.get("typestr", "")).lstrip("<>|=").startswith("V")
                                and hasattr(obj, "__dlpack__")):
        return _from_cai(obj, cai)
    if hasattr(obj, "__dlpack__"):
        try:
            ptr, shape, strides, code, bits, lanes, dev_type, dev_id = _core.dlpack_info(obj)
        except TypeError as exc:
            raise UsageError(f"cannot import {type(obj).__name__} through DLPack: {exc}") from None
        if lanes != 1 or (code, bits) not in _DLPACK_NAMES:
            raise UsageError(f"unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes})")
        device = dev_id if dev_type in _DLPACK_CUDA else -1
        return ArrayInfo(int(ptr), tuple(shape), tuple(strides), _DLPACK_NAMES[(code, bits)], device, False, obj)
    raise TypeError(
        f"expected an array with __cuda_array_interface__ or __dlpack__, not {type(obj).__name__}"
    )


def device_array(obj: Any, what: str, *, dtype: str | None = None, writable: bool = False,
                 contiguous: bool = True) -> ArrayInfo:
    """`array_info(obj)` checked to be a CUDA array (C-contiguous, of `dtype`, writable, as asked)."""
    info = array_info(obj)
    if info.device < 0:
        raise UsageError(f"{what} must be in GPU memory (got a host array)")
    if dtype is not None and info.dtype != dtype:
        raise UsageError(f"{what} has dtype {info.dtype}, expected {dtype}")
    if contiguous and not info.c_contiguous:
        raise UsageError(f"{what} must be C-contiguous (shape {info.shape}, strides {info.strides} elements)")
    if writable and info.readonly:
        raise UsageError(f"{what} is read-only")
    return info


def device_span(obj: Any) -> tuple[int, int, Any]:
    """(pointer, bytes, owner) of a buffer: ``(ptr, nbytes)``, an object with ``ptr`` and
    ``nbytes`` (our buffers), or a C-contiguous device array."""
    if isinstance(obj, tuple):
        if len(obj) != 2 or not all(isinstance(v, int) for v in obj):
            raise TypeError("a buffer given as a tuple must be (ptr: int, nbytes: int)")
        return obj[0], obj[1], None
    ptr = getattr(obj, "ptr", None)
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(ptr, int) and isinstance(nbytes, int) and not hasattr(obj, "__cuda_array_interface__"):
        return ptr, nbytes, obj
    info = device_array(obj, "buffer")
    return info.ptr, info.nbytes, obj


def stream_handle(stream: Any) -> int:
    """The cudaStream_t of `stream` (see the module documentation)."""
    return int(_core.stream_handle(stream))
