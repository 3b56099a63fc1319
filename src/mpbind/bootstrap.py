"""Share a library's unique id from one rank with every rank.

NCCL (``ncclGetUniqueId``) and NVSHMEM (``nvshmemx_get_uniqueid``) both bootstrap from
128 opaque bytes that one rank creates and all ranks must receive. ``share_unique_id``
does that over a :class:`~mpbind.process_group.ProcessGroup` (an mpi4py communicator, a
``torch.distributed`` process group, ...) or any broadcast callable, and returns the library's
``UniqueId`` on every rank::

    uid = share_unique_id("nccl", MPI.COMM_WORLD)                   # mpi4py
    uid = share_unique_id("nvshmem", torch.distributed.group.WORLD)  # torch.distributed
    uid = share_unique_id("nccl", my_bcast, rank=rank)               # my_bcast(data, root) -> bytes
"""

from __future__ import annotations

import importlib

from mpbind._infra import args as _args
from mpbind.errors import UsageError
from mpbind.process_group import CallableProcessGroup, ProcessGroup, process_group

__all__ = ["share_unique_id"]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from typing import Any

# library -> (bindings module, function creating the id)
_CREATORS = {"nccl": ("mpbind.bindings.nccl", "get_unique_id"), "nvshmem": ("mpbind.bindings.nvshmem", "get_uniqueid")}


def share_unique_id(library: str, via: Any, *, root: int = 0, rank: int | None = None) -> Any:
    """Create `library`'s unique id on rank `root` and return it on every rank.

    `via` is a :class:`~mpbind.process_group.ProcessGroup` or anything
    :func:`~mpbind.process_group.process_group` takes (an mpi4py communicator, a torch.distributed
    process group or the torch.distributed module, ...), or a callable
    ``broadcast(data, root) -> bytes`` that returns root's ``data`` on every rank (it receives None on
    the other ranks); with a callable, pass this process's `rank`.
    Collective: every rank must call it with the same `library`, `via` and `root`.
    """
    if not isinstance(library, str) or library not in _CREATORS:
        raise UsageError(f"share_unique_id: unknown library {_args.shown(library)}; use one of {', '.join(_CREATORS)}")
    root = _args.integer(root, "share_unique_id: root", minimum=0, maximum=_args.INT_MAX)
    if rank is not None:
        rank = _args.integer(rank, "share_unique_id: rank", minimum=0, maximum=_args.INT_MAX)
    module_name, creator = _CREATORS[library]
    module = importlib.import_module(module_name)
    group = _group(via, rank)

    data = bytes(getattr(module, creator)()) if group.rank == root else None
    received = group.broadcast_bytes(data, root)
    expected = len(module.UniqueId())
    if len(received) != expected:
        raise UsageError(f"share_unique_id: received {len(received)} bytes; a {library} unique id has {expected}")
    return module.UniqueId(received)


def _group(via: Any, rank: int | None) -> ProcessGroup:
    """`via` as a process group: a broadcast callable (with this process's `rank`), or what
    process_group() takes."""
    if callable(via) and not isinstance(via, (type, ProcessGroup)):  # no communicator or group is callable
        if rank is None:
            raise UsageError("share_unique_id: with a broadcast callable, pass this process's rank=")
        return CallableProcessGroup(rank, None, broadcast=via)
    try:
        return process_group(via, what="share_unique_id: via")
    except TypeError as exc:  # share_unique_id has refused an unknown via with UsageError from the start
        raise UsageError(str(exc)) from None
