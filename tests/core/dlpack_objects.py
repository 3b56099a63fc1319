"""Objects that export DLPack exactly as a test wants (any dtype code, device, strides, flags), and a
type with DLPack's C exchange API, built with ctypes: inputs for the core's coercion, never
dereferenced (their data pointers are made up)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

KDL_CPU, KDL_CUDA, KDL_CUDA_MANAGED = 1, 2, 13
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2

# Stand-ins for raw cudaStream_t handles: the core takes a handle other than 0, 1 and 2 only where
# it points at readable, pointer-aligned memory (as a stream CUDA made does). These do, for the
# life of the process; nothing reads them but that check.
_STREAM_MEMORY = (ctypes.c_uint64 * 64)()
STREAMS = tuple(ctypes.addressof(_STREAM_MEMORY) + 64 * i for i in range(8))


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_TO_TENSOR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensor))


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p),
                ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", _TO_TENSOR), ("current_work_stream", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# Capsule names must outlive their capsules.
_VERSIONED, _LEGACY, _EXCHANGE = b"dltensor_versioned", b"dltensor", b"dlpack_exchange_api"


def _ints(values: Sequence[int]) -> Any:
    return (ctypes.c_int64 * max(len(values), 1))(*values)


class Exported:
    """An array that exports DLPack capsules over a tensor description of the test's choosing.

    ``legacy``: unversioned capsules; ``old_protocol``: ``__dlpack__()`` takes no keyword (as before
    the array API's max_version); ``strides=None`` leaves DLTensor.strides NULL (DLPack < 1.2).
    Lies a hostile producer tells: ``ndim`` claims another number of dimensions than the shape
    array holds; ``null_shape`` leaves DLTensor.shape NULL."""

    def __init__(self, shape: Sequence[int], code: int = 2, bits: int = 32, lanes: int = 1, *,
                 strides: Sequence[int] | None = (), data: int = 0x7F0000001000,
                 device: tuple[int, int] = (KDL_CUDA, 0),
                 flags: int = 0, byte_offset: int = 0, legacy: bool = False, old_protocol: bool = False,
                 version: int = 1, ndim: int | None = None, null_shape: bool = False) -> None:
        if strides == ():
            acc, computed = 1, []
            for extent in reversed(shape):
                computed.append(acc)
                acc *= max(extent, 1)
            strides = tuple(reversed(computed))
        self._shape = _ints(shape)
        self._strides = None if strides is None else _ints(strides)
        tensor = DLTensor(data, DLDevice(*device), len(shape) if ndim is None else ndim, DLDataType(code, bits, lanes),
                          None if null_shape else ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
                          None if self._strides is None else ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)),
                          byte_offset)
        self.legacy, self.old_protocol, self.device = legacy, old_protocol, device
        self.managed: Any = (DLManagedTensor(tensor, None, None) if legacy else
                             DLManagedTensorVersioned(DLPackVersion(version, 3), None, None, flags, tensor))
        self.tensor = tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        if self.old_protocol and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument")
        # No capsule destructor: the structure lives as long as this object.
        name = _LEGACY if self.legacy else _VERSIONED
        return _capsule_new(ctypes.addressof(self.managed), name, None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class ExchangeTensor:
    """A type with DLPack's C exchange API (as PyTorch >= 2.11 has): the core fills a DLTensor
    through ``dltensor_from_py_object_no_sync`` without calling any Python method of the object."""

    calls = 0

    def __init__(self, shape: Sequence[int], code: int = 2, bits: int = 32, *, device: tuple[int, int] = (KDL_CUDA, 0),
                 fail: bool = False, fill_nothing: bool = False, **tensor: Any) -> None:
        """``tensor``: Exported's other keywords (strides, data, byte_offset and the lies ndim,
        null_shape); ``fill_nothing``: report success without filling the DLTensor."""
        self.exported = Exported(shape, code, bits, device=device, **tensor)
        self.fail, self.fill_nothing = fail, fill_nothing


def _fill(obj: int, out: Any) -> int:
    tensor = ctypes.cast(obj, ctypes.py_object).value
    ExchangeTensor.calls += 1
    if tensor.fail:  # (an exception set here would not survive ctypes' return from the callback)
        return -1
    if not tensor.fill_nothing:
        out[0] = tensor.exported.tensor
    return 0


_fill_c = _TO_TENSOR(_fill)
_api = DLPackExchangeAPI(1, 3, None, None, None, None, _fill_c, None)
ExchangeTensor.__dlpack_c_exchange_api__ = _capsule_new(ctypes.addressof(_api), _EXCHANGE, None)  # type: ignore[attr-defined]


_ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                             ctypes.c_void_p)
_SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
_TO_OBJECT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
_STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class Made:
    """A tensor :class:`ProducingTensor`'s producer made: the description it handed out."""

    def __init__(self, exported: Exported) -> None:
        t = exported.tensor
        self.exported = exported
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.dtype = (t.dtype.code, t.dtype.bits)
        self.device = (t.device.device_type, t.device.device_id)
        self.data = t.data


class ProducingTensor(ExchangeTensor):
    """An :class:`ExchangeTensor` whose type also makes tensors (an allocator, a way back to Python, a
    current stream), as a framework does for a kernel called directly: ``asked`` records each
    prototype, ``made`` what went back to Python. ``lie`` makes the allocator hand out another
    tensor than asked for ("shape", "dtype", "device", "strides", "ndim", "null": no data) or fail
    ("fail", through SetError)."""

    lie = ""
    requires_grad = False  # read as torch.Tensor's is
    asked: list[tuple[tuple[int, ...], tuple[int, int], tuple[int, int]]] = []
    made: list[Made] = []
    _kept: list[Exported] = []


def _allocate(proto: Any, out: Any, error_ctx: int, set_error: int) -> int:
    p = proto[0]
    shape = tuple(p.shape[i] for i in range(p.ndim))
    ProducingTensor.asked.append((shape, (p.dtype.code, p.dtype.bits), (p.device.device_type, p.device.device_id)))
    lie = ProducingTensor.lie
    if lie == "fail":
        _SET_ERROR(set_error)(error_ctx, b"MemoryError", b"out of device memory")
        return -1
    kw: dict[str, Any] = {"device": (p.device.device_type, p.device.device_id)}
    if lie == "shape":
        shape = (*shape[:-1], shape[-1] + 1) if shape else (2,)
    if lie == "device":
        kw["device"] = (KDL_CUDA, p.device.device_id + 1)
    if lie == "strides" and shape:
        kw["strides"] = (2,) * len(shape)
    if lie == "ndim":
        kw["ndim"] = p.ndim + 1
    if lie == "null":
        kw["data"] = 0
    made = Exported(shape, p.dtype.code, 16 if lie == "dtype" else p.dtype.bits, **kw)
    ProducingTensor._kept.append(made)
    out[0] = ctypes.addressof(made.managed)
    return 0


def _to_object(managed: int, out: Any) -> int:
    exported = next(e for e in ProducingTensor._kept if ctypes.addressof(e.managed) == managed)
    obj = Made(exported)
    ProducingTensor.made.append(obj)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))  # a new reference, as the exchange hands one back
    out[0] = id(obj)
    return 0


def _stream(device_type: int, device_id: int, out: Any) -> int:
    out[0] = STREAMS[device_id % len(STREAMS)]
    return 0


_producer_c = (_ALLOCATE(_allocate), _TO_OBJECT(_to_object), _STREAM(_stream))
_producer_api = DLPackExchangeAPI(1, 3, None, ctypes.cast(_producer_c[0], ctypes.c_void_p), None,
                                  ctypes.cast(_producer_c[1], ctypes.c_void_p), _fill_c,
                                  ctypes.cast(_producer_c[2], ctypes.c_void_p))
ProducingTensor.__dlpack_c_exchange_api__ = _capsule_new(  # type: ignore[attr-defined]
    ctypes.addressof(_producer_api), _EXCHANGE, None)


class InterfaceArray:
    """An array described by ``__cuda_array_interface__`` (v3 unless ``version`` says otherwise)."""

    def __init__(self, shape: tuple[int, ...], typestr: str = "<f4", strides: tuple[int, ...] | None = None,
                 ptr: int = 0x7F0000000000, readonly: bool = False, version: int | None = 3) -> None:
        cai: dict[str, Any] = {"shape": shape, "typestr": typestr, "data": (ptr, readonly), "strides": strides}
        if version is not None:
            cai["version"] = version
        self.__cuda_array_interface__ = cai


class RaisingInterface(Exported):
    """Like a float8 PyTorch tensor: its ``__cuda_array_interface__`` raises, its DLPack works."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise KeyError("torch.float8_e4m3fn")
