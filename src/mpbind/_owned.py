"""What every object of the Pythonic layer shares: it owns one object of the core (``_core``),
whose release it exposes as ``close()`` (idempotent), ``closed``, ``serial`` and ``with``."""

from __future__ import annotations

from typing import Any, TypeVar

_O = TypeVar("_O", bound="Owned")


class Owned:
    __slots__ = ()
    _core: Any

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

    def __enter__(self: _O) -> _O:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._core)
