"""The core's coercion of arrays and streams (src/mpbind/_core/arrays.cpp) from every source kind,
without a GPU: made-up pointers are never dereferenced, host arrays are described (and refused
where device memory is needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpbind import _core
from mpbind._infra import interop as _interop
from mpbind.errors import UsageError

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_objects import (  # noqa: E402
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    KDL_CPU,
    KDL_CUDA,
    KDL_CUDA_MANAGED,
    STREAMS,
    ExchangeTensor,
    Exported,
    InterfaceArray,
    RaisingInterface,
)

FIELDS = ("ptr", "shape", "strides", "dtype", "device", "readonly", "contiguous", "source")


def info(obj: Any, **kwargs: Any) -> dict[str, Any]:
    return dict(zip(FIELDS, _core.array_info(obj, **kwargs), strict=True))


def device_array(obj: Any, what: str = "x", **kwargs: Any) -> dict[str, Any]:
    return dict(zip(FIELDS, _core.device_array(obj, what, **kwargs), strict=True))


# --- element types --------------------------------------------------------------------------------

DLPACK_TYPES = [((0, 8), "int8"), ((0, 16), "int16"), ((0, 32), "int32"), ((0, 64), "int64"), ((1, 8), "uint8"),
                ((1, 16), "uint16"), ((1, 32), "uint32"), ((1, 64), "uint64"), ((2, 16), "float16"),
                ((2, 32), "float32"), ((2, 64), "float64"), ((4, 16), "bfloat16"), ((5, 64), "complex64"),
                ((5, 128), "complex128"), ((6, 8), "bool"), ((10, 8), "float8_e4m3fn"), ((12, 8), "float8_e5m2")]


@pytest.mark.parametrize(("code_bits", "name"), DLPACK_TYPES, ids=[n for _, n in DLPACK_TYPES])
def test_dlpack_type_codes(code_bits: tuple[int, int], name: str) -> None:
    code, bits = code_bits
    assert info(Exported((3,), code, bits))["dtype"] == name
    assert _interop.dlpack_code(name) == (code, bits)
    assert _interop.itemsize(name) == bits // 8


@pytest.mark.parametrize(("code", "bits", "lanes"), [(17, 4, 2), (8, 8, 1), (2, 32, 4), (3, 64, 1), (2, 128, 1)],
                         ids=["fp4x2", "e4m3", "float4-vector", "opaque", "float128"])
def test_dlpack_types_we_do_not_take(code: int, bits: int, lanes: int) -> None:
    expected = rf"sendbuf: unsupported DLPack dtype \(code={code}, bits={bits}, lanes={lanes}\)"
    with pytest.raises(UsageError, match=expected):
        _core.array_info(Exported((3,), code, bits, lanes), "sendbuf")


@pytest.mark.parametrize(("spec", "name"), [
    ("float32", "float32"), ("torch.bfloat16", "bfloat16"), ("half", "float16"), ("bf16", "bfloat16"),
    ("float8_e4m3", "float8_e4m3fn"), ("cdouble", "complex128"), (np.float16, "float16"),
    (np.dtype("int64"), "int64"), (np.complex64, "complex64"), (np.bool_, "bool"), (float, "float64"),
    (int, "int64"), (bool, "bool"), (complex, "complex128"),
])
def test_dtype_names(spec: Any, name: str) -> None:
    assert _interop.dtype_name(spec) == name


@pytest.mark.parametrize("spec", ["float128", "complex256", "f4", None, 3, object(), np.longdouble])
def test_unsupported_dtypes(spec: Any) -> None:
    with pytest.raises(UsageError, match="unsupported dtype"):
        _interop.dtype_name(spec)


def test_typestrs() -> None:
    assert _interop.typestr("float32") == "<f4" and _interop.typestr("bool") == "|b1"
    assert _interop.typestr("bfloat16") is None and _interop.typestr("float8_e5m2") is None


# --- DLPack ---------------------------------------------------------------------------------------


def test_dlpack_device_strides_and_offset() -> None:
    d = info(Exported((4, 3), device=(KDL_CUDA, 3), byte_offset=16, data=0x1000))
    assert (d["ptr"], d["shape"], d["strides"], d["device"], d["source"]) == (0x1010, (4, 3), (3, 1), 3, "dlpack")
    assert info(Exported((2,), device=(KDL_CUDA_MANAGED, 1)))["device"] == 1
    host = info(Exported((2,), device=(KDL_CPU, 0)))
    assert host["device"] == -1
    with pytest.raises(UsageError, match="x must be in GPU memory"):
        device_array(Exported((2,), device=(KDL_CPU, 0)))


def test_dlpack_capsule_kinds() -> None:
    assert info(Exported((5,), legacy=True))["shape"] == (5,)
    assert info(Exported((5,), old_protocol=True))["shape"] == (5,)  # no max_version keyword
    null_strides = info(Exported((2, 3), strides=None))  # before DLPack 1.2: compact row-major
    assert null_strides["strides"] == (3, 1) and null_strides["contiguous"]
    with pytest.raises(UsageError, match="DLPack version 2"):
        _core.array_info(Exported((2,), version=2))


def test_dlpack_flags() -> None:
    ro = Exported((4,), flags=FLAG_READ_ONLY)
    assert info(ro)["readonly"]
    assert device_array(ro)["readonly"]
    with pytest.raises(UsageError, match="recvbuf is read-only"):
        device_array(ro, "recvbuf", writable=True)
    with pytest.raises(UsageError, match="exported a copy"):
        _core.array_info(Exported((4,), flags=FLAG_IS_COPIED), "src")


def test_numpy_through_dlpack() -> None:
    a = np.zeros((2, 5), np.float64)[:, ::2]
    d = info(a)
    assert (d["device"], d["strides"], d["dtype"], d["contiguous"]) == (-1, (5, 2), "float64", False)
    frozen = np.zeros(3, np.int32)
    frozen.flags.writeable = False
    assert info(frozen)["readonly"]


# --- contiguity -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "strides", "contiguous"), [
    ((4, 0), (1, 1), True),      # PyTorch's strides of an empty (4, 0)
    ((4, 0), (0, 1), True),      # JAX's
    ((0, 4), (4, 1), True),
    ((4, 0, 3), (3, 3, 1), True),
    ((4, 1), (1, 99), True),     # a size-1 extent's stride is ignored
    ((1, 4), (7, 1), True),
    ((4, 3), (1, 4), False),     # column-major
    ((4, 3), (6, 2), False),     # every other element
    ((), (), True),
])
def test_contiguity_rule(shape: tuple[int, ...], strides: tuple[int, ...], contiguous: bool) -> None:
    d = info(Exported(shape, 4, 16, strides=strides))
    assert d["contiguous"] is contiguous
    assert _interop.array_info(Exported(shape, 4, 16, strides=strides)).c_contiguous is contiguous
    if contiguous:
        assert device_array(Exported(shape, 4, 16, strides=strides))["shape"] == shape
    else:
        with pytest.raises(UsageError, match=r"sendbuf must be C-contiguous \(shape"):
            device_array(Exported(shape, 4, 16, strides=strides), "sendbuf")
        device_array(Exported(shape, 4, 16, strides=strides), contiguous=False)


def test_empty_arrays_of_any_shape() -> None:
    for shape in [(0,), (4, 0), (0, 4), (2, 0, 3), (0, 0)]:
        for code, bits in [(4, 16), (2, 32), (10, 8)]:
            d = device_array(Exported(shape, code, bits, strides=(1,) * len(shape), data=0))
            assert d["shape"] == shape and d["contiguous"]
    assert device_array(InterfaceArray((4, 0), ptr=0))["shape"] == (4, 0)


# --- __cuda_array_interface__ ------------------------------------------------------------------


def test_interface_versions_strides_and_flags() -> None:
    for version in (2, 3, None):
        d = info(InterfaceArray((4, 3), version=version))
        assert (d["shape"], d["strides"], d["dtype"], d["source"]) == ((4, 3), (3, 1), "float32", "interface")
    t = info(InterfaceArray((4, 3), strides=(4, 16)))
    assert t["strides"] == (1, 4) and not t["contiguous"]
    assert info(InterfaceArray((4,), readonly=True))["readonly"]
    assert info(InterfaceArray((2,), "|b1"))["dtype"] == "bool"
    assert info(InterfaceArray((2,), "<c8"))["dtype"] == "complex64"
    with pytest.raises(UsageError, match="itemsize"):
        _core.array_info(InterfaceArray((4,), strides=(3,)))
    for bad in (">f4", "<f16", "|V2", "<m8"):
        with pytest.raises(UsageError, match="unsupported __cuda_array_interface__ typestr"):
            _core.array_info(InterfaceArray((4,), bad))


def test_interface_device() -> None:
    class Device:
        def __init__(self, **kw: int) -> None:
            self.__dict__.update(kw)

    torch_like = InterfaceArray((2,))
    torch_like.device = Device(index=2)  # type: ignore[attr-defined]
    cupy_like = InterfaceArray((2,))
    cupy_like.device = Device(id=1)  # type: ignore[attr-defined]
    assert info(torch_like)["device"] == 2 and info(cupy_like)["device"] == 1
    assert info(InterfaceArray((2,)))["device"] == 0  # says nothing: device 0


def test_interface_falls_back_to_dlpack() -> None:
    fp8 = RaisingInterface((8,), 10, 8)  # like a float8 tensor: the interface raises KeyError
    d = info(fp8)
    assert (d["dtype"], d["source"]) == ("float8_e4m3fn", "dlpack")

    class Opaque(Exported):  # bfloat16 with ml_dtypes: the interface says "<V2"
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<V2", "data": (1, False), "version": 3}

    assert info(Opaque((3,), 4, 16))["dtype"] == "bfloat16"

    class Broken:
        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            raise KeyError("no typestr")

    with pytest.raises(UsageError, match="recvbuf: cannot import Broken through __cuda_array_interface__"):
        _core.array_info(Broken(), "recvbuf")


def test_not_an_array() -> None:
    with pytest.raises(TypeError, match="dest: expected an array with __cuda_array_interface__ or __dlpack__, not obj"):
        _core.array_info(object(), "dest")
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        _interop.array_info(object())
    with pytest.raises(TypeError, match="not a tuple"):
        _core.array_info((1, 2, "float32"), "src")


# --- DLPack's C exchange API ---------------------------------------------------------------------


def test_exchange_api() -> None:
    before = ExchangeTensor.calls
    t = ExchangeTensor((4, 0), 4, 16)
    d = info(t)
    assert (d["shape"], d["dtype"], d["contiguous"], d["source"], d["readonly"]) == ((4, 0), "bfloat16", True,
                                                                                        "exchange", False)
    assert ExchangeTensor.calls == before + 1
    assert info(ExchangeTensor((8,), 10, 8))["dtype"] == "float8_e4m3fn"
    with pytest.raises(UsageError, match="GPU memory"):
        device_array(ExchangeTensor((2,), device=(KDL_CPU, 0)))
    with pytest.raises(UsageError, match="sendbuf: cannot import ExchangeTensor through DLPack"):
        _core.array_info(ExchangeTensor((2,), fail=True), "sendbuf")


# --- (ptr, count, dtype) tuples ------------------------------------------------------------------


def test_tuples() -> None:
    d = info((0x10, 6, "bfloat16"), tuples=True)
    assert (d["ptr"], d["shape"], d["dtype"], d["device"], d["source"]) == (0x10, (6,), "bfloat16", -2, "tuple")
    assert info((0x10, 0, np.float16), tuples=True)["shape"] == (0,)
    with pytest.raises(TypeError, match=r"sendbuf given as a tuple must be \(ptr, count, dtype\)"):
        _core.array_info((1, 2), "sendbuf", tuples=True)
    with pytest.raises(TypeError, match="sendbuf: ptr and count must be ints"):
        _core.array_info((1.0, 2, "float32"), "sendbuf", tuples=True)
    with pytest.raises(UsageError, match="count must be >= 0"):
        _core.array_info((1, -2, "float32"), "sendbuf", tuples=True)
    with pytest.raises(UsageError, match="ptr must be an address"):
        _core.array_info((-1, 2, "float32"), "sendbuf", tuples=True)
    with pytest.raises(UsageError, match="unsupported dtype"):
        _core.array_info((1, 2, "float128"), "sendbuf", tuples=True)


# --- the attribute paths (PyTorch before the exchange API, CuPy) -------------------------------------


class CupyLike:
    """What the core reads of a CuPy array: data.ptr, data.device_id, shape, strides (bytes), dtype."""

    class MemoryPointer:
        def __init__(self, ptr: int, device_id: int) -> None:
            self.ptr, self.device_id = ptr, device_id

    def __init__(self, shape: tuple[int, ...], dtype: Any, strides: tuple[int, ...], ptr: int = 0x2000) -> None:
        self.shape, self.dtype, self.strides = shape, np.dtype(dtype), strides
        self.data = self.MemoryPointer(ptr, 1)


def test_cupy_attributes() -> None:
    d = info(CupyLike((4, 3), np.float32, (12, 4)), source="cupy")
    assert (d["ptr"], d["shape"], d["strides"], d["device"], d["dtype"], d["contiguous"]) == (
        0x2000, (4, 3), (3, 1), 1, "float32", True)
    assert not info(CupyLike((4, 3), np.int64, (8, 32)), source="cupy")["contiguous"]


# --- PyTorch (CPU tensors; skipped without torch) ----------------------------------------------------


def test_torch_tensors_every_path() -> None:
    torch = pytest.importorskip("torch")
    cases = [torch.zeros(4, 3), torch.zeros(4, 0, dtype=torch.bfloat16), torch.zeros(5, dtype=torch.int64)[::2],
             torch.zeros(3, 4).T, torch.zeros(2, dtype=torch.complex64), torch.zeros(3, dtype=torch.bool)]
    has_exchange = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    for t in cases:
        expected = (t.data_ptr(), tuple(t.shape), str(t.dtype).removeprefix("torch."), -1)
        auto = info(t)
        assert auto["source"] == ("exchange" if has_exchange else "torch")
        for source in ("torch", "dlpack", "interface") + (("exchange",) if has_exchange else ()):
            d = info(t, source=source)
            assert (d["ptr"], d["shape"], d["dtype"], d["device"]) == expected, (source, t)
            assert d["contiguous"] == t.is_contiguous(), (source, t)
            if t.numel() > 1:
                assert d["strides"] == tuple(t.stride()), (source, t)
    for fp8 in ("float8_e4m3fn", "float8_e5m2"):
        t = torch.zeros(4, dtype=getattr(torch, fp8))
        assert info(t)["dtype"] == fp8
        assert info(t, source="torch")["dtype"] == fp8
    with pytest.raises(UsageError, match="sendbuf must be in GPU memory"):
        _core.device_array(torch.zeros(2), "sendbuf")


def test_torch_dtype_objects() -> None:
    torch = pytest.importorskip("torch")
    assert _interop.dtype_name(torch.bfloat16) == "bfloat16"
    assert _interop.dtype_name(torch.float8_e4m3fn) == "float8_e4m3fn"
    assert info((1, 2, torch.float16), tuples=True)["dtype"] == "float16"


# --- streams (the kinds test_core.py covers, and what it does not) -----------------------------------


def test_streams_beyond_the_basic_kinds() -> None:
    class Instance:  # the attribute on the instance, not on its type
        def __init__(self) -> None:
            self.ptr = STREAMS[0]

    assert _interop.stream_handle(Instance()) == STREAMS[0]
    with pytest.raises(TypeError, match="stream"):
        _interop.stream_handle(True)
    for bad in (-1, 2**64):
        with pytest.raises(UsageError, match="cudaStream_t"):
            _interop.stream_handle(bad)


def test_cupy_streams_are_read_by_their_ptr() -> None:
    # CuPy 14's streams: Python classes of cupy.cuda.stream (tp_name is the bare class name) whose
    # instances hold .ptr; __cuda_stream__() gives the same handle, a Python call slower.
    class _BaseStream:
        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

        def __cuda_stream__(self) -> tuple[int, int]:
            raise AssertionError("a CuPy stream is read by its .ptr, not through __cuda_stream__()")

    class Stream(_BaseStream):
        pass

    for cls in (_BaseStream, Stream):
        cls.__module__, cls.__qualname__ = "cupy.cuda.stream", cls.__name__
    assert _interop.stream_handle(Stream(STREAMS[1])) == STREAMS[1]
    assert _interop.stream_handle(_BaseStream(STREAMS[2])) == STREAMS[2]


def test_forcing_a_path_of_our_own_types_is_refused() -> None:
    for source in ("symmetric", "peer", "buffer"):
        with pytest.raises(UsageError, match=f"is not read as {source}"):
            _core.array_info(InterfaceArray((2,)), source=source)
    with pytest.raises(UsageError, match="no DLPack C exchange API"):
        _core.array_info(InterfaceArray((2,)), source="exchange")


def test_timing_hooks_refuse_what_they_cannot_time() -> None:
    with pytest.raises(UsageError, match="not a SymmetricArray"):
        _core._testing.symmetric_parts_ns((0x1000, 4, "float32"), 10)
    with pytest.raises(UsageError, match="put or quiet"):
        _core._testing.nvshmem_plan_ns("get", (), 10)
    with pytest.raises(UsageError, match="not initialised"):
        _core._testing.nvshmem_plan_ns("quiet", (0,), 10)


def test_a_look_alike_of_our_arrays_is_not_one() -> None:
    # SymmetricArray and PeerArray are the core's types, recognised by C++ type, never by name.
    for name in ("SymmetricArray", "PeerArray"):
        fake = type(name, (), {"__module__": "mpbind.nvshmem", "__qualname__": name,
                               "__slots__": ("_core", "_base", "_address", "_shape", "_dtype", "_device")})()
        with pytest.raises(UsageError, match="is not read as"):
            _core.array_info(fake, source="peer" if name == "PeerArray" else "symmetric")
        with pytest.raises(TypeError):
            _core.array_info(fake)


def test_our_arrays_cannot_be_subclassed_or_made_directly() -> None:
    cls = _core.nvshmem.SymmetricArray
    with pytest.raises(TypeError):
        type("Sub", (cls,), {})
    with pytest.raises(TypeError, match="empty"):
        cls()
    with pytest.raises(TypeError, match="peer"):
        _core.nvshmem.PeerArray()
    unmade = cls.__new__(cls)  # a not-made instance is refused, never read
    with pytest.raises(TypeError, match="not made by mpbind.nvshmem"):
        _core.array_info(unmade)
    with pytest.raises(TypeError, match="SymmetricMemory"):
        _core.nvshmem.symmetric_array(object(), (4,), "float32", 0)


def test_an_array_info_is_taken_as_it_is_and_cut_into_blocks() -> None:
    # memory the package describes itself (mpbind.jax.matmul_plan's pieces): checked, never re-read
    owner = object()
    info = _interop.ArrayInfo(0x10000, (6, 4), (1, 6), "float32", 0, False, owner)
    assert _interop.device_array(info, "a", dtype="float32", contiguous=False) is info
    block = info[1:3, 2:4]
    assert (block.ptr, block.shape, block.strides, block.owner) == (0x10000 + (1 + 2 * 6) * 4, (2, 2), (1, 6), owner)
    with pytest.raises(UsageError, match="a must be float64, not float32"):
        _interop.device_array(info, "a", dtype="float64", contiguous=False)
    with pytest.raises(UsageError, match="C-contiguous"):
        _interop.device_array(info, "a")
    with pytest.raises(UsageError, match="writable"):
        _interop.device_array(_interop.ArrayInfo(1, (2,), (1,), "int8", 0, True, None), "a", writable=True)
    with pytest.raises(UsageError, match="host memory"):
        _interop.device_array(_interop.ArrayInfo(1, (2,), (1,), "int8", -1, False, None), "a")
    with pytest.raises(TypeError, match="info.r0:r1, c0:c1."):
        info[::2, 0:1]
