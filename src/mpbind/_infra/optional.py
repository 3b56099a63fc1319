"""Optional dependencies (the extras of pyproject.toml): imported when a call needs one, or an error
that names the extra installing it.

Private to mpbind (:mod:`mpbind._infra`): not public API; its names change without notice.
"""

from __future__ import annotations

import sys

from mpbind.errors import MissingDependencyError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from types import ModuleType

# The module each extra provides.
_EXTRAS = {"torch": "torch", "jax": "jax", "mpi4py": "mpi"}


def require(module: str, needed_by: str) -> ModuleType:
    """``import module``, or :class:`MissingDependencyError` saying that `needed_by` needs it and which
    extra installs it. A module that is installed but fails to import raises its own error."""
    try:
        __import__(module)  # not importlib, which importing the layer would load
        return sys.modules[module]
    except ModuleNotFoundError as exc:
        top = module.split(".", 1)[0]
        if exc.name is None or exc.name.split(".", 1)[0] != top:
            raise
        raise MissingDependencyError(top, _EXTRAS[top], needed_by) from None
