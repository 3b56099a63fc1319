"""Share a library's unique id from one rank with every rank.

NCCL (``ncclGetUniqueId``) and NVSHMEM (``nvshmemx_get_uniqueid``) both bootstrap from
128 opaque bytes that one rank creates and all ranks must receive. ``share_unique_id``
does that over an mpi4py communicator, a ``torch.distributed`` process group, or any
broadcast callable, and returns the library's ``UniqueId`` on every rank::

    uid = share_unique_id("nccl", MPI.COMM_WORLD)                   # mpi4py
    uid = share_unique_id("nvshmem", torch.distributed.group.WORLD)  # torch.distributed
    uid = share_unique_id("nccl", my_bcast, rank=rank)               # my_bcast(data, root) -> bytes
"""

from __future__ import annotations

import importlib

from mpbind._infra import args as _args
from mpbind.errors import UsageError

__all__ = ["allgatherer", "share_unique_id"]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Broadcast = Callable[[bytes | None, int], bytes]

# library -> (bindings module, function creating the id)
_CREATORS = {"nccl": ("mpbind.bindings.nccl", "get_unique_id"), "nvshmem": ("mpbind.bindings.nvshmem", "get_uniqueid")}


def share_unique_id(library: str, via: Any, *, root: int = 0, rank: int | None = None) -> Any:
    """Create `library`'s unique id on rank `root` and return it on every rank.

    `via` is an mpi4py communicator, a torch.distributed process group (or the
    torch.distributed module for the default group), or a callable
    ``broadcast(data, root) -> bytes`` that returns root's ``data`` on every rank (it
    receives None on the other ranks); with a callable, pass this process's `rank`.
    Collective: every rank must call it with the same `library`, `via` and `root`.
    """
    if not isinstance(library, str) or library not in _CREATORS:
        raise UsageError(f"share_unique_id: unknown library {_args.shown(library)}; use one of {', '.join(_CREATORS)}")
    root = _args.integer(root, "share_unique_id: root", minimum=0, maximum=_args.INT_MAX)
    if rank is not None:
        rank = _args.integer(rank, "share_unique_id: rank", minimum=0, maximum=_args.INT_MAX)
    module_name, creator = _CREATORS[library]
    module = importlib.import_module(module_name)
    broadcast, my_rank = _broadcaster(via, rank)

    data = bytes(getattr(module, creator)()) if my_rank == root else None
    received = broadcast(data, root)
    if not isinstance(received, (bytes, bytearray, memoryview)):
        raise UsageError(f"share_unique_id: the broadcast returned {type(received).__name__}, not bytes")
    received = bytes(received)
    expected = len(module.UniqueId())
    if len(received) != expected:
        raise UsageError(f"share_unique_id: received {len(received)} bytes; a {library} unique id has {expected}")
    return module.UniqueId(received)


def _broadcaster(via: Any, rank: int | None) -> tuple[Broadcast, int]:
    """A bytes broadcast over `via`, and this process's rank in it."""
    if hasattr(via, "Get_rank") and hasattr(via, "bcast"):  # an mpi4py communicator
        return (lambda data, root: via.bcast(data, root=root)), int(via.Get_rank())
    dist, group = _torch_group(via)
    if dist is not None:
        def torch_broadcast(data: bytes | None, root: int) -> bytes:
            box = [data]
            dist.broadcast_object_list(box, src=dist.get_global_rank(group, root) if group is not None else root,
                                       group=group)
            return box[0]  # type: ignore[return-value]

        return torch_broadcast, int(dist.get_rank(group))
    if callable(via):
        if rank is None:
            raise UsageError("share_unique_id: with a broadcast callable, pass this process's rank=")
        return via, rank
    raise UsageError(
        "share_unique_id: via must be an mpi4py communicator, a torch.distributed process group, "
        f"or a broadcast callable, not {type(via).__name__}"
    )


def allgatherer(via: Any) -> Callable[[Any], list[Any]]:
    """An allgather of one picklable object per rank over `via` (an mpi4py communicator, a
    torch.distributed process group or the torch.distributed module, or a callable
    ``allgather(obj) -> list`` returning every rank's object in rank order). Collective."""
    if hasattr(via, "Get_rank") and hasattr(via, "allgather"):  # an mpi4py communicator
        return lambda obj: list(via.allgather(obj))
    dist, group = _torch_group(via)
    if dist is not None:
        def torch_allgather(obj: Any) -> list[Any]:
            out: list[Any] = [None] * int(dist.get_world_size(group))
            dist.all_gather_object(out, obj, group=group)
            return out

        return torch_allgather
    if callable(via):
        return lambda obj: list(via(obj))
    raise TypeError("via must be an mpi4py communicator, a torch.distributed process group, or an allgather "
                    f"callable, not {type(via).__name__}")


def _torch_group(via: Any) -> tuple[Any, Any]:
    """(torch.distributed, group or None) when `via` is torch.distributed or one of its groups."""
    if not (getattr(via, "__name__", "") == "torch.distributed" or _args.module_of(via).startswith("torch")):
        return None, None
    import torch.distributed as dist

    if via is dist:
        return dist, None
    if isinstance(via, dist.ProcessGroup):
        return dist, via
    return None, None
