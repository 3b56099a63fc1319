"""Names for the mpbind objects that mpbind's torch operators take.

An operator's schema holds tensors, numbers and strings, so a communicator or a plan travels through
a traced program as a name: ``"Communicator#12"`` (its class and its ``serial``, unique in the
process). :func:`name_of` registers an object on first use and returns its name; the operators'
kernels call :func:`lookup` at run time. The registry holds each object until it is closed (closed
ones are dropped as new ones register) or :func:`forget` drops it, as ``torch.distributed`` holds a
process group under its name until it is destroyed.

The functions of :mod:`mpbind.torch` take an object or its name: :func:`object_of` resolves either, and
:func:`resolved`, :func:`launched` and :func:`plan_name` give what a traced program keeps of it, as
constants to the compiler.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import torch

from mpbind.errors import UsageError
from mpbind.nccl import Communicator

_T = TypeVar("_T")

_lock = threading.Lock()
_by_name: dict[str, Any] = {}


def _name(obj: Any) -> str:
    serial = getattr(obj, "serial", None)
    if not isinstance(serial, int) or isinstance(serial, bool):
        raise TypeError(f"{type(obj).__name__} is not an mpbind object with a serial number")
    return f"{type(obj).__name__}#{serial}"


def name_of(obj: Any) -> str:
    """The name the operators know `obj` by, registering it on first use. UsageError once it is closed."""
    if getattr(obj, "closed", False):
        raise UsageError(f"{type(obj).__name__} is closed")
    name = _name(obj)
    with _lock:
        held = _by_name.get(name)
        if held is None:
            for stale in [k for k, v in _by_name.items() if getattr(v, "closed", False)]:
                del _by_name[stale]
            _by_name[name] = obj
        elif held is not obj:
            raise UsageError(f"another object is registered as {name!r}")
    return name


def lookup(name: str, kind: type[_T]) -> _T:
    """The registered object called `name`, which must be a `kind`: UsageError naming it otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"an mpbind object's name must be a str, not {type(name).__name__}")
    with _lock:
        obj = _by_name.get(name)
    if obj is None:
        raise UsageError(f"no mpbind object is registered as {name!r} (mpbind.torch.name_of registers one)")
    if not isinstance(obj, kind):
        raise UsageError(f"{name!r} is a {type(obj).__name__}, not a {kind.__name__}")
    if getattr(obj, "closed", False):
        raise UsageError(f"{name!r} is closed")
    return obj


def forget(obj_or_name: Any) -> bool:
    """Drop an object (or a name) from the registry; whether it was there."""
    name = obj_or_name if isinstance(obj_or_name, str) else _name(obj_or_name)
    with _lock:
        return _by_name.pop(name, None) is not None


def registered() -> list[str]:
    """The names registered now, in registration order."""
    with _lock:
        return list(_by_name)


def object_of(obj: Any, kind: type, what: str) -> Any:
    """`obj` itself, or the registered object it names, which must be a `kind` (`what` names it)."""
    found = lookup(obj, kind) if isinstance(obj, str) else obj
    if not isinstance(found, kind):
        raise TypeError(f"{what} must be an {kind.__module__}.{kind.__name__} or its registered name, not "
                        f"{type(obj).__name__}")
    return found


def communicator_of(comm: Any) -> Communicator:
    """The Communicator `comm` is, or names (the layer refuses a closed one)."""
    return object_of(comm, Communicator, "comm")


# What a traced program takes from an object, as constants to the compiler (an object is guarded by
# identity: another one recompiles).


@torch.compiler.assume_constant_result
def resolved(comm: Any) -> tuple[str, int]:
    """(registry name, size) of a Communicator or of a registered name, for the Python operators."""
    c = communicator_of(comm)
    return name_of(c), c.size


@torch.compiler.assume_constant_result
def launched(comm: Any) -> tuple[int, int]:
    """(launch id, size) of a Communicator or of a registered name, for the C++ operators."""
    c = communicator_of(comm)
    return c.launch_id, c.size


@torch.compiler.assume_constant_result
def plan_name(plan: Any, kind: type) -> tuple[str, str]:
    """(registry name, kind of transform or "") of a plan of class `kind`, or of its name."""
    p = object_of(plan, kind, "plan")
    return name_of(p), getattr(p, "kind", "")
