"""Argument checks of the layer's public calls, made before any library call: a wrong argument raises
``TypeError`` (wrong kind) or :class:`~mpbind.errors.UsageError` (wrong value) naming it.

Sizes, counts and addresses the layer computes from a caller's values (an element count, a byte
size, a pitch, a workspace size, an end address) go through :func:`checked` (or :func:`product`,
:func:`span`) before they reach C: Python ints never wrap, but the ``int``, ``int64_t`` or
``size_t`` they are handed to would, and the library would then take a small number for a huge one.

Private to mpbind (:mod:`mpbind._infra`): not public API; its names change without notice.
"""

from __future__ import annotations

import itertools
import operator

from mpbind.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, TypeVar

    _T = TypeVar("_T")

#: The largest values of the C types sizes are handed to: ``int``, ``int64_t`` (``long long``), ``size_t``.
INT_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SIZE_MAX = 2**64 - 1
_C_TYPES = {INT_MAX: "an int", INT64_MAX: "an int64", SIZE_MAX: "a size_t"}

#: The most ranks a value built one entry per rank takes (a distribution's counts or boxes, a plan's
#: pieces): far above any job (the largest run on 10**5 GPUs), low enough that a mistyped count is
#: refused at once instead of growing memory until the machine gives out.
MAX_RANKS = 2**20
#: The most axes a shape, box or index has: NumPy's own limit.
MAX_NDIM = 64


def index(value: Any, name: str) -> int:
    """`value` as an int through its ``__index__`` (any integer type, not a bool). An ``__index__`` that
    raises or returns something else is the caller's object failing to be an integer: TypeError."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    try:
        return operator.index(value)
    except Exception as exc:  # noqa: BLE001 - whatever a foreign __index__ raises, it is not an integer
        raise TypeError(f"{name} must be an int; {type(value).__name__}.__index__ failed: {exc}") from None


def integer(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int (any integer type with ``__index__``, not a bool), within the bounds given."""
    v = index(value, name)
    if minimum is not None and maximum is not None and not minimum <= v <= maximum:
        raise UsageError(f"{name} must be in [{show(minimum)}, {show(maximum)}], got {show(v)}")
    if minimum is not None and v < minimum:
        raise UsageError(f"{name} must be >= {show(minimum)}, got {show(v)}")
    if maximum is not None and v > maximum:
        raise UsageError(f"{name} must be <= {show(maximum)}, got {show(v)}")
    return v


def sequence(values: Any, name: str, limit: int, what: str = "ints") -> tuple[Any, ...]:
    """`values` (any iterable but a str or bytes) as a tuple of at most `limit` items. No more than
    ``limit + 1`` items are read: a ``range`` or a generator from a mistyped count is refused before
    it is materialised."""
    if isinstance(values, (str, bytes, bytearray)) or not hasattr(type(values), "__iter__"):
        raise TypeError(f"{name} must be a sequence of {what}, not {type(values).__name__}")
    try:
        items = tuple(itertools.islice(values, limit + 1))
    except Exception as exc:  # noqa: BLE001 - a foreign __iter__ that fails (a 0-d array): not a sequence
        raise TypeError(f"{name} must be a sequence of {what}; iterating its {type(values).__name__} failed: "
                        f"{exc}") from None
    if len(items) > limit:
        raise UsageError(f"{name} has more than {limit} entries")
    return items


def checked(value: int, what: str, limit: int = INT64_MAX) -> int:
    """`value`, a size, count or address computed from a caller's values, refused (UsageError naming
    `what`) when it is negative or beyond `limit`: the largest value of the C type it is handed to."""
    if value < 0:
        raise UsageError(f"{what} is {show(value)}, negative")
    if value > limit:
        ctype = _C_TYPES.get(limit)
        holds = f"more than {ctype} holds ({show(limit)})" if ctype else f"more than {show(limit)}"
        raise UsageError(f"{what} is {show(value)}, {holds}")
    return value


def product(factors: Iterable[int], what: str, limit: int = INT64_MAX) -> int:
    """The product of `factors` (extents, an item size), checked as :func:`checked` checks it."""
    n = 1
    for f in factors:
        n *= f
    return checked(n, what, limit)


def span(ptr: int, nbytes: int, what: str) -> tuple[int, int]:
    """(`ptr`, `nbytes`) of memory ``[ptr, ptr + nbytes)``, refused when the pointer is not an address
    or the range runs past the end of the address space (a wrapped end would pass a bounds check)."""
    checked(ptr, f"{what}'s address", SIZE_MAX)
    checked(nbytes, f"{what}'s size in bytes", SIZE_MAX)
    if ptr + nbytes > SIZE_MAX + 1:
        raise UsageError(f"{what} [{ptr:#x}, +{nbytes}) runs past the end of the address space")
    return ptr, nbytes


def shown(value: Any, limit: int = 120) -> str:
    """repr(value) for a message, shortened; never raising (a huge int, a broken ``__repr__``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return show(value)
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - the caller's object: its type names it
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def module_of(obj: Any) -> str:
    """The module name of `obj`'s class, or "" where it has none: a class may lack ``__module__``, or
    hold anything there."""
    try:
        name = type(obj).__module__
    except Exception:  # noqa: BLE001 - a metaclass's own __module__ may raise anything
        return ""
    return name if isinstance(name, str) else ""


def exports_array(obj: Any) -> bool:
    """Whether `obj` offers ``__cuda_array_interface__`` or DLPack. Asked of its type: PyTorch's
    interface property raises (KeyError) for the dtypes it cannot describe, float8 among them."""
    kind = type(obj)
    return hasattr(kind, "__dlpack__") or hasattr(kind, "__cuda_array_interface__")


def show(v: int) -> str:
    """`v` for a message: a C type's limit as people write it (2**63 - 1), a huge number by its size
    (Python refuses the decimal text of one beyond ``sys.get_int_max_str_digits()``), others as they are."""
    for bits in (31, 32, 63, 64):
        if v == 2**bits - 1:
            return f"2**{bits} - 1"
        if v == -(2**bits):
            return f"-2**{bits}"
    if abs(v) >= 2**256:
        return f"{'-' if v < 0 else ''}a {abs(v).bit_length()}-bit integer"
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
