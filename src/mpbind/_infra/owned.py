"""What every object of the Pythonic layer shares: it owns one object of the core (``_core``),
whose release it exposes as ``close()`` (idempotent), ``closed``, ``serial`` and ``with``.

What happens to the core object when it is dropped unclosed, and what releases it, is its row of
the lifetime table (``mpbind._core.lifetimes()``, listed in docs/DESIGN.md). A facade never
reimplements these: it adds its own queries and operations only. Objects a caller passes in
(a matmul descriptor, an array) stay the caller's unless a parameter says otherwise.

A plan made of several owned objects holds them in the core's ``Composite`` (its row of the same
table): ``close()`` closes them newest first, once.

Owning objects are not copied: ``copy.copy``, ``copy.deepcopy`` and pickling raise ``TypeError``
(:class:`Uncopyable`). A shallow copy would share the handle, so that closing one closes both; a
deep copy or a pickle cannot make a second library resource.

Private to mpbind (:mod:`mpbind._infra`): not public API; its names change without notice.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from typing import Any, TypeVar

    _O = TypeVar("_O", bound="Owned")


class Uncopyable:
    """Refuses ``copy.copy``, ``copy.deepcopy`` and pickling with a TypeError naming the class: an
    object owning a library resource is passed around itself."""

    __slots__ = ()

    def _refuse_copy(self) -> TypeError:
        return TypeError(f"cannot copy {type(self).__name__}: it owns a library resource (closing a copy would "
                         "close the original); pass the object itself")

    def __copy__(self) -> Any:
        raise self._refuse_copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        raise self._refuse_copy()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise self._refuse_copy()

    def __reduce__(self) -> Any:
        raise self._refuse_copy()


class Owned(Uncopyable):
    __slots__ = ()
    _core: Any

    @classmethod
    def _over(cls: type[_O], core: Any) -> _O:
        """An instance over an existing core object, without running ``__init__``."""
        self = cls.__new__(cls)
        self._core = core
        return self

    def close(self) -> None:
        """Release it (after what depends on it); collective where the library's release is. Idempotent."""
        self._core.close()

    @property
    def closed(self) -> bool:
        return bool(self._core.closed)

    @property
    def serial(self) -> int:
        """Creation order in this process; queued releases run newest first."""
        return int(self._core.serial)

    # Identity, as object's, but spelled out: torch.compile takes an object as a constant (mpbind.torch
    # registers the classes its operators take) only when its class defines equality and hashing.
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return object.__hash__(self)

    def __enter__(self: _O) -> _O:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _described(self) -> str:
        """What only the facade knows (a shape, a dtype), shown before the core object's repr."""
        return ""

    def __repr__(self) -> str:
        described = self._described()
        if not described:
            return repr(self._core)
        return f"<{type(self).__name__} {described}: {self._core!r}>"


def core_of(obj: Owned) -> Any:
    """The core object `obj` owns. How one part of mpbind hands another part's object to the core
    (a cuBLASMp grid over a communicator, a matmul plan over a matmul descriptor, an FFT plan's calls)
    without reading the owner's private attribute: ``_core`` is :class:`Owned`'s, defined here."""
    return obj._core
