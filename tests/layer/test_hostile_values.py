"""Values a new user (or a fuzzer) passes in one slot of a call whose other arguments are valid: each
is refused at once with a TypeError or UsageError naming the argument, never an IndexError,
AttributeError, MemoryError or a hang. Per-rank work from a caller's integer is capped, and a
mistyped rank count is refused before anything per rank is built."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mpbind import bootstrap, fft, process_group
from mpbind import collective as collective_matmul
from mpbind.errors import UsageError


class IndexRaises:
    def __index__(self) -> int:
        raise ZeroDivisionError("no")


def _no_module_instance() -> Any:
    scope: dict[str, Any] = {"__builtins__": __builtins__}
    exec("Anon = type('Anon', (), {})", scope)  # noqa: S102 - a class with no __module__ at all
    return scope["Anon"]()


class OddModule:
    pass


OddModule.__module__ = 7  # type: ignore[assignment]


# --- fft.DeviceView ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "error", "message"), [
    ((np.int64(4), (1,)), TypeError, "shape must be a sequence of extents, not int64"),
    ((4, (1,)), TypeError, "shape must be a sequence of extents, not int"),
    (("44", (1,)), TypeError, "shape must be a sequence of extents, not str"),
    (((4.0,), (1,)), TypeError, r"shape\[0\] must be an int, not float"),
    (((4, True), (1, 1)), TypeError, r"shape\[1\] must be an int, not bool"),
    (((4, -1), (1, 1)), UsageError, r"shape\[1\] must be in \[0, 2\*\*63 - 1\]"),
    (((4,), (1.5,)), TypeError, r"strides\[0\] must be an int, not float"),
    (((4,), np.int64(1)), TypeError, "strides must be a sequence of ints, not int64"),
    (((4, 4), (1,)), UsageError, r"one stride per extent"),
    ((range(10**12), (1,)), UsageError, "shape has more than 64 entries"),
    (((2**62, 4), (4, 1)), UsageError, "byte size is"),
    (((IndexRaises(),), (1,)), TypeError, r"shape\[0\] must be an int; IndexRaises.__index__ failed"),
])
def test_device_view_refuses_bad_shapes_and_strides_at_construction(args: tuple[Any, Any], error: type[Exception],
                                                                    message: str) -> None:
    shape, strides = args
    with pytest.raises(error, match=message):
        fft.DeviceView(0x1000, shape, strides, "float32", 0, 0, None)


@pytest.mark.parametrize(("field", "value", "error", "message"), [
    ("ptr", -1, UsageError, "ptr must be in"),
    ("ptr", 2**64, UsageError, "ptr must be in"),
    ("ptr", 2**64 - 8, UsageError, "runs past the end of the address space"),  # 64 bytes from there wrap
    ("ptr", 1.0, TypeError, "ptr must be an int"),
    ("dtype", "float128", UsageError, "unsupported dtype"),
    ("device", "0", TypeError, "device must be an int"),
    ("device", -3, UsageError, "device must be in"),
    ("room", -1, UsageError, "room must be in"),
    ("strides", (-1024, 1), UsageError, "reaches below address 0"),  # 3 rows of 4 KiB back from 0x1000
])
def test_device_view_checks_every_field(field: str, value: Any, error: type[Exception], message: str) -> None:
    fields: dict[str, Any] = {"ptr": 0x1000, "shape": (4, 4), "strides": (4, 1), "dtype": "float32", "device": 0,
                              "room": 0, "owner": None}
    fields[field] = value
    with pytest.raises(error, match=message):
        fft.DeviceView(**fields)


def test_device_view_takes_numpy_integers_and_other_layouts() -> None:
    v = fft.DeviceView(np.uint64(0x1000), (np.int64(4), 3), (np.int32(3), 1), np.dtype("complex64"), np.int8(0),
                       np.int64(96), None)
    assert (v.ptr, v.shape, v.strides, v.dtype, v.device, v.room) == (0x1000, (4, 3), (3, 1), "complex64", 0, 96)
    assert all(type(x) is int for x in (v.ptr, *v.shape, *v.strides, v.device, v.room))
    assert v.__cuda_array_interface__["shape"] == (4, 3) and v.contiguous
    empty = fft.DeviceView(0, (0, 2**40), (2**40, 1), "uint8", 0, 0, None)  # no element: any address
    assert empty.size == 0
    backwards = fft.DeviceView(0x1000, (4,), (-1,), "float32", 0, 0, None)  # reaches 12 bytes below ptr
    assert backwards.__cuda_array_interface__["strides"] == (-4,)


# --- an object's class and module -------------------------------------------------------------------


@pytest.mark.parametrize("obj", [_no_module_instance(), OddModule()], ids=["no __module__", "int __module__"])
def test_helpers_reading_an_object_class_never_assume_its_module(obj: Any) -> None:
    assert process_group._torch_group(obj) == (None, None)
    with pytest.raises(TypeError, match="via must be"):
        process_group.process_group(obj)
    with pytest.raises(UsageError, match="share_unique_id: via must be"):
        bootstrap.share_unique_id("nccl", obj)
    with pytest.raises(UsageError, match="AllGatherMatmul needs arrays of a framework with from_dlpack"):
        collective_matmul._framework(obj)


def test_a_framework_is_found_among_loaded_modules_only() -> None:
    class Foreign:
        pass

    Foreign.__module__ = "antigravity"  # importing it would open a web browser
    with pytest.raises(UsageError, match="from_dlpack"):
        collective_matmul._framework(Foreign())
    import sys

    assert "antigravity" not in sys.modules
    assert collective_matmul._framework(np.zeros(2)) is np


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"root": True}, TypeError, "root must be an int, not bool"),
    ({"root": -1}, UsageError, "root must be in"),
    ({"root": 2**31}, UsageError, "root must be in"),
    ({"rank": 1.0}, TypeError, "rank must be an int"),
    ({"rank": IndexRaises()}, TypeError, "__index__ failed"),
])
def test_share_unique_id_checks_root_and_rank(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        bootstrap.share_unique_id("nccl", lambda data, root: b"\0" * 128, **{"rank": 0, **kwargs})
    with pytest.raises(UsageError, match="unknown library"):
        bootstrap.share_unique_id(["nccl"], lambda data, root: b"")  # type: ignore[arg-type]
