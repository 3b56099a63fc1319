"""Argument checks of the layer's public calls, made before any library call: a wrong argument raises
``TypeError`` (wrong kind) or :class:`~mpbind.errors.UsageError` (wrong value) naming it."""

from __future__ import annotations

import operator

from mpbind.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from typing import Any, TypeVar

    _T = TypeVar("_T")


def integer(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int (any integer type with ``__index__``, not a bool), within the bounds given."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    v = operator.index(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        if minimum is not None and maximum is not None:
            raise UsageError(f"{name} must be in [{_bound(minimum)}, {_bound(maximum)}], got {v}")
        bound = f">= {_bound(minimum)}" if minimum is not None else f"<= {_bound(maximum)}"
        raise UsageError(f"{name} must be {bound}, got {v}")
    return v


def exports_array(obj: Any) -> bool:
    """Whether `obj` offers ``__cuda_array_interface__`` or DLPack. Asked of its type: PyTorch's
    interface property raises (KeyError) for the dtypes it cannot describe, float8 among them."""
    kind = type(obj)
    return hasattr(kind, "__dlpack__") or hasattr(kind, "__cuda_array_interface__")


def _bound(v: int | None) -> str:
    """A C type's limit as people write it (2**63 - 1), other numbers as they are."""
    for bits in (31, 32, 63, 64):
        if v == 2**bits - 1:
            return f"2**{bits} - 1"
        if v == -(2**bits):
            return f"-2**{bits}"
    return str(v)


def instance(value: Any, name: str, cls: type[_T], what: str) -> _T:
    """`value`, checked to be a `cls` (`what` names it in the message)."""
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}")
    return value


def boolean(value: Any, name: str) -> bool:
    """`value`, checked to be a bool (an int or None is refused: it is too often a misplaced argument)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def agreement_digest(*values: Any) -> int:
    """A 64-bit digest of `values` for ranks to compare (their reprs are alike on every rank that
    passed the same values)."""
    import hashlib  # here: only plans that agree across ranks need it

    return int.from_bytes(hashlib.blake2b(repr(values).encode(), digest_size=8).digest(), "little", signed=True)
