"""The values the fuzzer passes: plain bad values, more kinds of numbers and text, and hostile array
and stream objects whose protocol lies.

Each value is written as source text that evaluates, in this module, to a fresh value (fresh: a
call may keep or mutate what it is given); the text is what the records name. Array and stream
objects come from the helpers below (``cai``, ``dl``, ``tup``, ``stream``, ...), which build
what a foreign library could hand over, including what no library should: a DLPack capsule whose
``ndim`` is 2**31-1 over a one-element shape, extents whose product overflows int64, a data pointer
that wraps with its byte offset. Their pointers are made up: nothing dereferences them unless an
intake lets them through.

A value is *malformed* when every array or stream intake must refuse it; a call that takes one in an
intake slot and returns has accepted it (see fuzz_deep.py). Well-formed objects among them describe
zero elements (or host memory), so that one reaching a library on a GPU touches no memory. A value is
*address-like* when it converts to an int in [1, 2**63): where a raw pointer or handle is taken (the
flat bindings, a struct's ``from_ptr``) it looks valid, and what it points at is the library's to
check (docs/how-it-works.md, Bad input): those slots do not get it.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from dlpack_objects import KDL_CPU, KDL_CUDA, ExchangeTensor, Exported  # noqa: E402

PTR = 0x7F0000001000  # a made-up device address
MISSING = object()    # cai(field=MISSING): the field is left out


class Raised(Exception):
    """What a hostile object's protocol raises. An intake may pass it on: it is the object's own error."""


def _give(value: Any) -> Any:
    """`value`, or raise it when it is an exception: what one field of a hostile protocol does."""
    if isinstance(value, BaseException):
        raise value
    return value


# --- __cuda_array_interface__ ------------------------------------------------------------------

class _Interface:
    def __init__(self, cai: Any) -> None:
        self.__cuda_array_interface__ = cai


class _RaisingInterface:
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise Raised("__cuda_array_interface__")


def cai(**fields: Any) -> Any:
    """An object with ``__cuda_array_interface__``: four float32 at PTR, with `fields` changed."""
    d: dict[str, Any] = {"version": 3, "shape": (4,), "typestr": "<f4", "data": (PTR, False), "strides": None}
    d.update(fields)
    return _Interface({k: v for k, v in d.items() if v is not MISSING})


class _InterfaceDevice(_Interface):
    def __init__(self, cai: Any, device: Any, **attributes: Any) -> None:
        super().__init__(cai)
        self.lie = device
        if attributes:
            self.device = type("Device", (), attributes)()

    def __dlpack_device__(self) -> Any:
        return _give(self.lie)


def cai_device(shape: tuple[int, ...], device: Any, **attributes: Any) -> Any:
    """cai(shape=`shape`) whose ``__dlpack_device__`` returns `device` (or raises it), and with
    `attributes` its ``.device`` has (``index``, ``id``), where the core looks for its device."""
    return _InterfaceDevice(cai(shape=shape).__cuda_array_interface__, device, **attributes)


def cai_is(value: Any) -> Any:
    """An object whose ``__cuda_array_interface__`` is `value` (not a dict)."""
    return _Interface(value)


def cai_raises() -> Any:
    return _RaisingInterface()


# --- DLPack ------------------------------------------------------------------------------------

def dl(shape: tuple[int, ...] = (4,), *, ndim: int | None = None, null_shape: bool = False,
       exchange: bool = False, **kw: Any) -> Any:
    """An array exporting a hand-built DLPack capsule: `shape` and `kw` as tests/core/dlpack_objects'
    Exported takes them (strides, code, bits, lanes, data, device, flags, byte_offset, legacy,
    version), then `ndim` set apart from the shape's length (a lie: the shape buffer keeps its
    length) and the shape pointer NULL with `null_shape`. `exchange`: through DLPack's C exchange
    API instead of a capsule."""
    kw.setdefault("data", PTR)
    if exchange:
        obj: Any = ExchangeTensor(shape, kw.get("code", 2), kw.get("bits", 32), device=kw.get("device", (KDL_CUDA, 0)))
        tensor = obj.exported.tensor  # what the exchange fills in
        tensor.data = kw["data"]
    else:
        obj = Exported(shape, **kw)
        tensor = obj.managed.dl_tensor  # what the capsule points at
    if ndim is not None:
        tensor.ndim = ndim
    if null_shape:
        tensor.shape = None
    return obj


class _Dlpack:
    """``__dlpack__`` returns `result` (or raises it)."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def __dlpack__(self, **kwargs: Any) -> Any:
        return _give(self.result)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, 0)


def dl_returns(result: Any) -> Any:
    return _Dlpack(result)


class _LyingDevice(Exported):
    """An empty float32 array at PTR whose ``__dlpack_device__`` returns `lie` (or raises it): its
    capsule says the truth, which is what counts."""

    def __init__(self, lie: Any) -> None:
        super().__init__((0,), data=PTR)
        self.lie = lie

    def __dlpack_device__(self) -> Any:
        return _give(self.lie)


def dl_device(lie: Any) -> Any:
    return _LyingDevice(lie)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAMES: dict[bytes, bytes] = {}  # capsule names must outlive their capsules
_BYTES = (ctypes.c_char * 256)()  # what a wrongly named capsule points at


def capsule(name: bytes) -> Any:
    """A capsule named `name` over 256 zero bytes."""
    return _capsule_new(ctypes.addressof(_BYTES), _NAMES.setdefault(name, name), None)


# --- (ptr, count, dtype) -----------------------------------------------------------------------

def tup(count: Any = 4, ptr: Any = PTR, dtype: Any = "float32") -> tuple[Any, Any, Any]:
    return (ptr, count, dtype)


# --- streams -----------------------------------------------------------------------------------

class _Stream:
    """``__cuda_stream__()`` returns `result` (or raises it)."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def __cuda_stream__(self) -> Any:
        return _give(self.result)


def stream(result: Any = (0, 0)) -> Any:
    """A ``__cuda_stream__`` object; stream() is the default stream, given through the protocol."""
    return _Stream(result)


class _NotCallable:
    __cuda_stream__ = (0, 0)


def stream_attr(name: str, value: Any) -> Any:
    """An object whose `name` (``cuda_stream`` as PyTorch's, ``ptr`` as CuPy's) is `value`."""
    return type("LyingStream", (), {name: value})()


# --- objects that claim to be PyTorch's, CuPy's or mpbind's --------------------------------------
# The core recognises PyTorch and CuPy by the names in a type's MRO; a class can take those names.

def _method(value: Any) -> Callable[..., Any]:
    def method(self: Any, *args: Any) -> Any:
        return _give(value)
    return method


def torch_tensor(**fields: Any) -> Any:
    """Claims to be a torch.Tensor: four float32 on device 0 at PTR, with `fields` (attributes, and
    the results of data_ptr(), stride() and get_device()) changed."""
    f: dict[str, Any] = {"dtype": "float32", "shape": (4,), "stride": (1,), "data_ptr": PTR, "get_device": 0}
    f.update(fields)
    attrs = {k: _method(v) if k in ("stride", "data_ptr", "get_device") else v for k, v in f.items()}
    return type("torch._C.TensorBase", (), attrs)()


def cupy_array(**fields: Any) -> Any:
    """Claims to be a cupy.ndarray: four float32 on device 0 at PTR, with `fields` changed (ptr and
    device_id are its .data's)."""
    f: dict[str, Any] = {"dtype": "float32", "shape": (4,), "strides": (4,), "ptr": PTR, "device_id": 0}
    f.update(fields)
    data = type("MemoryPointer", (), {"ptr": f.pop("ptr"), "device_id": f.pop("device_id")})()
    return type("cupy._core.core.ndarray", (), {**f, "data": data})()


def torch_stream(cuda_stream: Any) -> Any:
    return type("torch._C._CudaStreamBase", (), {"cuda_stream": cuda_stream})()


def cupy_stream(ptr: Any) -> Any:
    return type("cupy.cuda.stream._BaseStream", (), {"ptr": ptr})()


def fake_mpbind(qualname: str, **slots: Any) -> Any:
    """An instance of a class that claims to be mpbind.nvshmem.`qualname`, its slots set to `slots`."""
    cls = type(qualname, (), {"__slots__": tuple(slots), "__module__": "mpbind.nvshmem", "__qualname__": qualname})
    obj = cls()
    for k, v in slots.items():
        setattr(obj, k, v)
    return obj


# --- integers that are not ints ------------------------------------------------------------------

class Kind(enum.IntEnum):
    ONE = 1


class Index:
    """``__index__`` returns `value` (or raises it)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __index__(self) -> Any:
        return _give(self.value)


class Fickle:
    """``__index__`` says 4 the first time and 2**62 after: a check and a use that read it apart see
    different values."""

    def __init__(self) -> None:
        self.calls = 0

    def __index__(self) -> int:
        self.calls += 1
        return 4 if self.calls == 1 else 2**62


class _NoModuleType(type):
    @property  # type: ignore[misc]
    def __module__(cls) -> str:
        raise AttributeError("__module__")


class NoModule(metaclass=_NoModuleType):
    """An object whose class has no ``__module__``: code naming its class must not assume one."""


# --- the lists ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Value:
    source: str
    group: str
    malformed: bool = False   # every array or stream intake must refuse it
    slow: bool = False        # may make a call work long or allocate much: not in the sample
    sentinel: bool = False    # tried in every intake slot by the sample

    def make(self) -> Any:
        return eval(_CODE[self.source], NAMESPACE)  # our own table

    @functools.cached_property
    def address_like(self) -> bool:
        v = self.make()
        if isinstance(v, bool) or not hasattr(type(v), "__index__"):
            return False
        try:
            return 0 < operator.index(v) < 2**63
        except Exception:
            return False


# The values of the first sweep, kept first (the sample rotates through the list from there).
PLAIN = ("None", '"x"', "-1", "2**70", "1.5", "[]", "object()", 'b"\\0"*8', "True")

NUMBERS = ('float("nan")', 'float("inf")', '-float("inf")', "2**63", "-2**63", "2**63-1", "2**64-1", "2**64",
           "-2**63-1", "0.0", "-0.0", "2**31", "2**40")
NUMPY = ("np.int8(-1)", "np.int16(2)", "np.int32(-1)", "np.int64(4)", "np.int64(-2**63)", "np.uint8(255)",
         "np.uint16(1)", "np.uint32(2**32-1)", "np.uint64(2**64-1)", "np.float16(1)", 'np.float32("nan")',
         "np.float64(1.5)", "np.complex64(1)", "np.complex128(1j)", "np.bool_(True)", "np.bool_(False)",
         'np.str_("float32")', "np.dtype('float32')")
INDEX = ("False", "Kind.ONE", "Index(Raised('__index__'))", 'Index("4")', "Index(2**64)", "Index(-1)", "Fickle()",
         "NoModule()")
TEXT = ('""', '"float32"', '"sum"', 'b""', "bytearray(8)", 'memoryview(b"\\0"*8)', '"\\0"', '"x"*10000')
CONTAINERS = ("()", "{}", "(-1,)", "(2**62, 4)", "(1,)*65", "(1.5,)", '("x",)', "(None,)", "[0]*100000",
              "iter((4, 4))", "range(4)")
HOST_ARRAYS = ("np.zeros((), np.float32)", "np.zeros(0, np.float32)", "np.zeros((4, 4), np.float32)[:, ::2]",
               "np.zeros((1,)*64, np.float32)", "np.zeros(4, np.float32)")

# Counts that fit in 64 bits but make a call allocate or loop per unit until it is stopped (a rank
# count of 2**40 must be refused before anything is built per rank): each such call takes the
# timeout, or fills the memory limit, so the sample leaves them out.
SLOW = frozenset({"2**31", "2**40", "2**63-1", "np.uint32(2**32-1)", "Fickle()"})

# Array objects that every intake must refuse: (source, tried in every intake slot by the sample).
MALFORMED_ARRAYS = (
    ("cai(shape=(-1,))", False), ("cai(shape=(2**63,))", False), ("cai(shape=(2**62, 4))", True),
    ("cai(shape=(2**32, 2**32))", False), ("cai(shape=(1,)*65)", False), ("cai(strides=(3,))", False),
    ("cai(strides=(2**62,))", True), ("cai(strides=(4, 4))", False), ("cai(data=(2**64 - 8, False))", True),
    ("cai(data=(2**64, False))", False), ("cai(data=(-1, False))", False), ("cai(data=(0, False))", False),
    ('cai(shape="x")', False), ("cai(shape=None)", False), ("cai(shape=(4.5,))", False),
    ("cai(shape=(True,))", False), ("cai(typestr=4)", False), ('cai(typestr="")', False),
    ('cai(typestr="<q16")', False), ('cai(typestr="|b1x")', False), ('cai(data="x")', False),
    ("cai(data=(None, False))", False), ("cai(data=(PTR,))", False), ("cai(data=(1.5, False))", False),
    ('cai(strides="x")', False), ("cai(strides=(4.5,))", False), ("cai(mask=object())", False),
    ("cai(shape=MISSING)", False), ("cai(data=MISSING)", False), ("cai(typestr=MISSING)", False),
    ("cai_is([])", False), ("cai_is(None)", False), ("cai_raises()", False),
    ("dl(ndim=65)", True), ("dl(ndim=2**31-1)", True), ("dl(ndim=2**31-1, legacy=True)", True),
    ("dl(ndim=-1)", False), ("dl((1,)*65)", True), ("dl(null_shape=True)", True),
    ("dl(null_shape=True, legacy=True)", False), ("dl((-1,))", True), ("dl((-1,), legacy=True)", False),
    ("dl((2**62, 4))", True), ("dl((2**32, 2**32), legacy=True)", False), ("dl((2**63-1,))", False),
    ("dl(strides=(2**62,))", True), ("dl((4, 4), strides=(2**62, 1))", False), ("dl(strides=(-2**63,))", False),
    ("dl(byte_offset=2**64 - 8)", True), ("dl(data=2**64 - 8)", True), ("dl(data=0)", False),
    ("dl((), data=0)", False), ("dl(device=(4, 0))", False),
    ("dl(code=99)", False), ("dl(bits=0)", False), ("dl(bits=7)", False), ("dl(lanes=2)", False),
    ("dl(lanes=0)", False), ("dl(device=(KDL_CUDA, -1))", False),
    ("dl(version=2)", False), ("dl(version=0)", False), ("dl(flags=2)", False),
    ("dl(ndim=2**31-1, exchange=True)", True), ("dl((-1,), exchange=True)", False),
    ("dl((2**62, 4), exchange=True)", False),
    ("dl_returns(Raised('__dlpack__'))", False), ('dl_returns(BufferError("no export"))', False),
    ("dl_returns(None)", False), ("dl_returns(5)", False), ('dl_returns(capsule(b"dltensor_x"))', False),
    ('dl_returns(capsule(b"used_dltensor"))', False), ('dl_returns(capsule(b"used_dltensor_versioned"))', False),
    ("tup(-1)", False), ("tup(2**63)", True), ("tup(2**62)", True), ("tup(2**61, dtype='float64')", False),
    ("tup(4, 2**64 - 8)", True), ("tup(4, -1)", False), ('tup(4, "x")', False), ("tup(4.5)", False),
    ('tup(4, PTR, "nope")', False), ("tup(Index(2**63))", False), ("tup(True)", False), ("(PTR, 4)", False),
    ("torch_tensor(shape=(-1,))", False), ("torch_tensor(shape=(2**62, 4), stride=(4, 1))", True),
    ("torch_tensor(stride=(1, 1))", False), ("torch_tensor(stride=(2**62,))", False),
    ("torch_tensor(data_ptr=-1)", False), ("torch_tensor(data_ptr=2**64 - 8)", False),
    ("torch_tensor(data_ptr=Raised('data_ptr'))", False), ('torch_tensor(get_device="x")', False),
    ("torch_tensor(get_device=2**40)", False), ('torch_tensor(dtype="nope")', False),
    ("torch_tensor(shape=(1,)*65, stride=(1,)*65)", False),
    ("cupy_array(shape=(-1,))", False), ("cupy_array(strides=(3,))", False),
    ("cupy_array(shape=(2**62, 4), strides=(16, 4))", False), ("cupy_array(ptr=2**64)", False),
    ("cupy_array(ptr=Index(4))", False), ("cupy_array(device_id=-5)", False),
    ("fake_mpbind('SymmetricArray', _core=object(), _shape=(4,), _dtype='float32', _device=0, "
     "_description=capsule(b'mpbind.SymmetricArray.description'))", False),
    ("fake_mpbind('PeerArray', _base=object(), _address=PTR, _pe=0, _shape=(4,), _dtype='float32', _device=0)",
     False),
)
# Well-formed but unusual: they may be refused or described, as long as nothing crashes. Zero
# elements or host memory, so that no library on a GPU touches their made-up memory.
ODD_ARRAYS = ("cai(shape=(0,))", "cai(shape=(0, 2**62), strides=(4, 4))", "cai(shape=(), data=(0, False))",
              "cai(version=2, shape=(0,))", 'cai(version="3", shape=(0,))', "cai(shape=(0,), data=(PTR, True))",
              "dl((0,))", "dl((0,), legacy=True, strides=None)", "dl((0,), device=(KDL_CPU, 0))",
              "dl((0,), device=(4, 0))", "dl((0,), flags=1)", "dl((0,), old_protocol=True, legacy=True)",
              "dl((0, 4), strides=(2**62, 1))", "dl((0,), code=6, bits=8)",
              "dl((0,), device=(KDL_CUDA, 2**31-1))", "cai_device((0,), (KDL_CUDA, 2**40))",
              "cai_device((0,), Raised('__dlpack_device__'))", "cai_device((0,), None, index=2**40)", "tup(0)",
              "dl_device(Raised('__dlpack_device__'))", 'dl_device(("x",))',
              "torch_tensor(shape=(0,))", "cupy_array(shape=(0,))")
MALFORMED_STREAMS = ("stream(Raised('__cuda_stream__'))", 'stream("x")', "stream((1, 5))", "stream((0, -1))",
                     "stream((0, 2**64))", "stream((0,))", "stream((0, 1.5))", "stream((0, True))", "_NotCallable()",
                     "stream_attr('cuda_stream', -1)", 'stream_attr("cuda_stream", "x")',
                     "stream_attr('ptr', 2**64)", "stream_attr('ptr', Index(5))", "torch_stream(-1)",
                     'torch_stream("x")', "cupy_stream(2**64)", "cupy_stream(Raised('ptr'))",
                     "stream((0, 2**31))", "cupy_stream(2**63)")


def _values() -> dict[str, Value]:
    groups: list[tuple[str, tuple[str, ...]]] = [
        ("plain", PLAIN), ("number", NUMBERS), ("numpy", NUMPY), ("index", INDEX), ("text", TEXT),
        ("container", CONTAINERS), ("host array", HOST_ARRAYS), ("odd array", ODD_ARRAYS)]
    out = {s: Value(s, g, slow=s in SLOW) for g, sources in groups for s in sources}
    out.update({s: Value(s, "malformed array", malformed=True, sentinel=sentinel) for s, sentinel in MALFORMED_ARRAYS})
    out.update({s: Value(s, "malformed stream", malformed=True) for s in MALFORMED_STREAMS})
    return out


# What value sources see (and recipes, fuzz_deep.py): this module's helpers, NumPy and DLPack's
# device codes.
NAMESPACE: dict[str, Any] = {**globals(), "np": np, "KDL_CPU": KDL_CPU}
VALUES: dict[str, Value] = _values()
_CODE = {s: compile(s, "<value>", "eval") for s in VALUES}


def make(source: str) -> Any:
    return VALUES[source].make()


def takes_addresses(module: str, name: str) -> bool:
    """Whether a callable takes raw pointers or handles as ints: the flat bindings, structs' from_ptr."""
    return module.startswith("mpbind.bindings") or name == "from_ptr"


def values_for(module: str, name: str, sources: tuple[str, ...] | list[str]) -> list[str]:
    """`sources` less the address-like values where the callable takes raw addresses."""
    if not takes_addresses(module, name):
        return list(sources)
    return [s for s in sources if not VALUES[s].address_like]
