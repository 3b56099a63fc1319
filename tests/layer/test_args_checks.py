"""The argument readers and checked arithmetic of mpbind._infra.args, at the 2**31, 2**63 and 2**64 edges:
a size, count or address computed from a caller's values is refused, naming the quantity, where the
C type it is handed to would wrap it; integers are read through __index__, sequences no further
than their limit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mpbind._infra import args as _args
from mpbind.errors import UsageError

I64 = 2**63 - 1
U64 = 2**64 - 1


class IndexRaises:
    def __index__(self) -> int:
        raise ZeroDivisionError("no")


class IndexLies:
    def __index__(self) -> Any:
        return "7"


@pytest.mark.parametrize(("value", "limit"), [(0, I64), (I64, I64), (U64, U64), (2**31 - 1, _args.INT_MAX)])
def test_checked_passes_the_largest_value_of_the_c_type(value: int, limit: int) -> None:
    assert _args.checked(value, "n", limit) == value


@pytest.mark.parametrize(("value", "limit", "message"), [
    (2**63, I64, r"bytes is 9223372036854775808, more than an int64 holds \(2\*\*63 - 1\)"),
    (2**64, U64, r"more than a size_t holds \(2\*\*64 - 1\)"),
    (2**31, _args.INT_MAX, r"more than an int holds \(2\*\*31 - 1\)"),
    (-1, I64, "negative"),
    pytest.param(10**5000, I64, "a 16610-bit integer", id="huge"),  # Python refuses its decimal text
])
def test_checked_refuses_past_the_edge_naming_the_quantity(value: int, limit: int, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _args.checked(value, "bytes", limit)


def test_product_is_exact_where_the_c_product_would_wrap() -> None:
    assert _args.product((2**31, 2**31, 2), "n", U64) == 2**63
    assert _args.product((2**32 - 1, 2**31 - 1), "n") == (2**32 - 1) * (2**31 - 1)
    with pytest.raises(UsageError, match="elements is 9223372036854775808"):
        _args.product((2**32, 2**31), "elements")  # 2**63: wraps to -2**63 in an int64
    with pytest.raises(UsageError, match="bytes is 18446744073709551616"):
        _args.product((2**32, 2**32), "bytes", U64)  # 2**64: wraps to 0 in a size_t
    assert _args.product((2**40, 0, 2**40), "n") == 0
    assert _args.product((), "n") == 1


@pytest.mark.parametrize(("ptr", "nbytes"), [(0, 0), (1, U64), (U64, 1), (2**63, 2**63), (U64, 0)])
def test_span_takes_ranges_that_end_at_the_end_of_the_address_space(ptr: int, nbytes: int) -> None:
    assert _args.span(ptr, nbytes, "buffer") == (ptr, nbytes)


@pytest.mark.parametrize(("ptr", "nbytes", "message"), [
    (U64, 2, "runs past the end of the address space"),  # ptr + nbytes wraps to 1
    (2**63, 2**63 + 1, "runs past the end"),
    (2**64, 0, "address is 18446744073709551616, more than a size_t"),
    (-1, 8, "address is -1, negative"),
    (0, -1, "size in bytes is -1, negative"),
])
def test_span_refuses_a_wrapping_end(ptr: int, nbytes: int, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _args.span(ptr, nbytes, "buffer")


@pytest.mark.parametrize(("value", "message"), [
    (IndexRaises(), "IndexRaises.__index__ failed: no"),
    (IndexLies(), "IndexLies.__index__ failed"),
    (True, "must be an int, not bool"),
    (np.bool_(True), "must be an int, not bool"),
    (1.0, "must be an int, not float"),
    (np.float64(1), "must be an int, not float64"),
])
def test_index_refuses_what_is_not_an_integer_with_type_error(value: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        _args.index(value, "n")


@pytest.mark.parametrize("value", [np.int8(-3), np.uint64(U64), np.int64(-(2**63)), np.array(5)])
def test_index_takes_numpy_integers_as_python_ints(value: Any) -> None:
    v = _args.index(value, "n")
    assert type(v) is int and v == int(value)


def test_sequence_reads_no_further_than_its_limit() -> None:
    def endless() -> Any:
        n = 0
        while True:
            yield n
            n += 1

    with pytest.raises(UsageError, match="shape has more than 64 entries"):
        _args.sequence(endless(), "shape", 64)
    with pytest.raises(UsageError, match="more than 64"):
        _args.sequence(range(10**18), "shape", 64)
    assert _args.sequence(iter((1, 2)), "shape", 2) == (1, 2)
    for bad in ("12", b"12", 5, None, np.array(5)):  # a 0-d array has __iter__ and refuses it
        with pytest.raises(TypeError, match="shape must be a sequence of ints"):
            _args.sequence(bad, "shape", 64)


def test_module_of_never_assumes_a_str_module() -> None:
    # A class made where the globals have no __name__ has no __module__ at all.
    scope: dict[str, Any] = {"__builtins__": __builtins__}
    exec("Missing = type('Missing', (), {})", scope)  # noqa: S102 - a fixed statement
    Missing = scope["Missing"]

    class Odd:
        pass

    Odd.__module__ = 123  # type: ignore[assignment]
    with pytest.raises(AttributeError):
        Missing.__module__  # noqa: B018
    assert _args.module_of(Missing()) == ""
    assert _args.module_of(Odd()) == ""
    assert _args.module_of(np.zeros(1)) == "numpy"


def test_shown_never_raises() -> None:
    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert _args.shown(BadRepr()) == "<BadRepr>"
    assert _args.shown(-(10**5000)) == "-a 16610-bit integer"
    assert len(_args.shown("x" * 1000)) == 120
