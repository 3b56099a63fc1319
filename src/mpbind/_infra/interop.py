"""Arrays and streams from other libraries, as the Pythonic layer takes them.

The coercion itself lives in the core (``mpbind._core.array_info``, C++), where the hot calls
(collectives, RMA, FFT and matmul execution) run it without coming back to Python. This module
gives the layer's other paths (registration, matrices) the same answers as Python values.

Arrays: PyTorch tensors (DLPack's C exchange API where the tensor type has it), CuPy arrays,
anything with ``__cuda_array_interface__`` or ``__dlpack__`` (bfloat16 and float8 tensors that the
interface cannot describe go through DLPack), our own symmetric arrays and buffers. Element types
are named by strings (``"float32"``, ``"bfloat16"``, ...), so that no framework is required: NumPy
is imported only when a NumPy object is given.

Streams: ``None`` (the default stream), an int, or an object with ``__cuda_stream__``,
``.cuda_stream`` (PyTorch) or ``.ptr`` (CuPy).

Private to mpbind (:mod:`mpbind._infra`): not public API; its names change without notice.
"""

from __future__ import annotations

from mpbind import _core
from mpbind._infra import args as _args
from mpbind.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ArrayInfo", "array_info", "c_strides", "device_array", "device_span", "dlpack_code", "dtype_name",
           "itemsize", "stream_handle", "typestr"]


def dtype_name(dtype: Any) -> str:
    """Our name of `dtype`: a str, a NumPy dtype or type, or a framework dtype (``torch.bfloat16``)."""
    return str(_core.dtype_info(dtype)[0])


def itemsize(dtype: Any) -> int:
    """Bytes per element of `dtype`."""
    return int(_core.dtype_info(dtype)[1])


def dlpack_code(dtype: Any) -> tuple[int, int]:
    """The DLPack (type code, bits) of `dtype`."""
    info = _core.dtype_info(dtype)
    return int(info[2]), int(info[3])


def typestr(dtype: Any) -> str | None:
    """The ``__cuda_array_interface__`` typestr of `dtype`, or None where NumPy has none (bfloat16, float8)."""
    value = _core.dtype_info(dtype)[4]
    return None if value is None else str(value)


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """The core's rule: a zero-size extent makes any array contiguous; extents of 1 ignore their stride."""
    if 0 in shape:
        return True
    expected = 1
    for extent, stride in zip(shape, strides, strict=True):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


class ArrayInfo:
    """Where an array's elements are: pointer, shape, strides in elements, dtype, device."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "readonly", "owner")
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int
    readonly: bool
    owner: Any

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, device: int,
                 readonly: bool, owner: Any) -> None:
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device = device  # CUDA device ordinal; -1 for host memory, -2 where not known
        self.readonly = readonly
        self.owner = owner  # keeps the memory alive

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def c_contiguous(self) -> bool:
        return _contiguous(self.shape[::-1], self.strides[::-1])

    @property
    def f_contiguous(self) -> bool:
        return _contiguous(self.shape, self.strides)

    def __getitem__(self, key: tuple[slice, slice]) -> ArrayInfo:
        """A 2-D block ``[r0:r1, c0:c1]`` of the same memory (unit steps): what a replicated operand's
        piece is cut as."""
        if len(self.shape) != 2 or not isinstance(key, tuple) or len(key) != 2 or \
                not all(isinstance(k, slice) and k.step in (None, 1) for k in key):
            raise TypeError("an ArrayInfo is cut as info[r0:r1, c0:c1] of a 2-D array")
        (r0, r1, _), (c0, c1, _) = (k.indices(n) for k, n in zip(key, self.shape, strict=True))
        rows, cols = max(0, r1 - r0), max(0, c1 - c0)
        ptr = self.ptr + (r0 * self.strides[0] + c0 * self.strides[1]) * self.itemsize
        return ArrayInfo(ptr, (rows, cols), self.strides, self.dtype, self.device, self.readonly, self.owner)

    def __repr__(self) -> str:
        return (f"ArrayInfo(ptr={self.ptr:#x}, shape={self.shape}, strides={self.strides}, dtype={self.dtype!r}, "
                f"device={self.device}, readonly={self.readonly})")


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides, in elements, of a C-contiguous array of `shape`."""
    strides = []
    acc = 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= extent
    return tuple(reversed(strides))


def _info(described: tuple[Any, ...], owner: Any) -> ArrayInfo:
    ptr, shape, strides, dtype, device, readonly = described[:6]
    return ArrayInfo(ptr, shape, strides, dtype, device, readonly, owner)


def array_info(obj: Any, what: str = "array") -> ArrayInfo:
    """Describe a device (or host) array as the hot calls do (see the module documentation)."""
    if isinstance(obj, ArrayInfo):
        return obj
    return _info(_core.array_info(obj, what), obj)


def device_array(obj: Any, what: str, *, dtype: str | None = None, writable: bool = False,
                 contiguous: bool = True) -> ArrayInfo:
    """`array_info(obj)` checked to be a CUDA array (of `dtype`, C-contiguous, writable, as asked).
    An ArrayInfo (memory described by the package itself) is checked as it is."""
    if isinstance(obj, ArrayInfo):
        if obj.device < 0:
            raise UsageError(f"{what} must be a CUDA array; it is in host memory")
        if dtype is not None and dtype_name(dtype) != obj.dtype:
            raise UsageError(f"{what} must be {dtype_name(dtype)}, not {obj.dtype}")
        if writable and obj.readonly:
            raise UsageError(f"{what} must be writable")
        if contiguous and not obj.c_contiguous:
            raise UsageError(f"{what} must be C-contiguous")
        return obj
    return _info(_core.device_array(obj, what, dtype, writable, contiguous), obj)


def device_span(obj: Any) -> tuple[int, int, Any]:
    """(pointer, bytes, owner) of a buffer: ``(ptr, nbytes)``, an object with ``ptr`` and
    ``nbytes`` (our buffers), or a C-contiguous device array. The range must lie in the address
    space (an end past it would wrap to a small address)."""
    if isinstance(obj, tuple):
        if len(obj) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in obj):
            raise TypeError("a buffer given as a tuple must be (ptr: int, nbytes: int)")
        return (*_args.span(int(obj[0]), int(obj[1]), "buffer"), None)
    ptr = getattr(obj, "ptr", None)
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(ptr, int) and isinstance(nbytes, int) and not hasattr(type(obj), "__cuda_array_interface__"):
        return (*_args.span(int(ptr), int(nbytes), "buffer"), obj)
    info = device_array(obj, "buffer")
    return info.ptr, info.nbytes, obj


def stream_handle(stream: Any) -> int:
    """The cudaStream_t of `stream` (see the module documentation)."""
    return int(_core.stream_handle(stream))
