"""NCCL, the Pythonic way: communicators that own their resources.

    from mpbind import nccl
    with nccl.Communicator.from_mpi(MPI.COMM_WORLD) as comm:
        comm.all_reduce(x, x)                    # CuPy, PyTorch, JAX, DLPack arrays
        comm.all_reduce((ptr, n, "float32"), (ptr, n, "float32"), op="max", stream=s)
        win = comm.register_window(nccl.mem_alloc(1 << 20))

Destroying a communicator is collective. ``close()`` (or leaving the ``with`` block) on
every rank releases, in order, what depends on it (cuBLASMp grids, windows,
registrations), then finalizes and destroys it. A communicator dropped without
``close()`` warns (``ResourceWarning``) and waits for :func:`mpbind.drain` on every rank:
the garbage collector never runs collective code. Registrations are reference-counted: the
same ``(communicator, pointer, size)`` registered twice is one NCCL registration, released
when its last :class:`Registration` closes. The flat C API is :mod:`mpbind.bindings.nccl`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

# drain, queued, registrations: process-wide (mpbind.drain() ...), kept here as aliases.
from mpbind import _args, _core, _interop, drain, queued, registrations
from mpbind._core import nccl as _core_nccl
from mpbind._optional import require
from mpbind._owned import Owned
from mpbind._typing import Buffer as BufferLike
from mpbind._typing import Operand, Stream
from mpbind.bindings import nccl as _flat
from mpbind.bindings.nccl import Config, DataType, RedOp, UniqueId, get_unique_id, get_version
from mpbind.errors import UsageError

__all__ = [
    "Buffer", "Communicator", "Config", "DataType", "RedOp", "Registration", "UniqueId", "drain",
    "get_unique_id", "get_version", "group", "mem_alloc", "queued", "registrations",
]

Buffer = _core.nccl.Buffer
Registration = _core.Registration

_DTYPES: dict[str, DataType] = {
    "int8": DataType.INT8, "uint8": DataType.UINT8, "int32": DataType.INT32, "uint32": DataType.UINT32,
    "int64": DataType.INT64, "uint64": DataType.UINT64, "float16": DataType.FLOAT16,
    "float32": DataType.FLOAT32, "float64": DataType.FLOAT64, "bfloat16": DataType.BFLOAT16,
    "float8_e4m3fn": DataType.FLOAT8E4M3, "float8_e5m2": DataType.FLOAT8E5M2,
}
_MAX_SIZE = 2**64 - 1  # size_t
_MAX_INT = 2**31 - 1  # C int
_OPS: dict[str, RedOp] = {"sum": RedOp.SUM, "prod": RedOp.PROD, "max": RedOp.MAX, "min": RedOp.MIN,
                          "avg": RedOp.AVG}


def mem_alloc(nbytes: int) -> Buffer:
    """``ncclMemAlloc``: memory suited to registration and windows; freed when released or collected."""
    return _core.nccl.mem_alloc(_args.integer(nbytes, "nbytes", minimum=1, maximum=_MAX_SIZE))


@contextlib.contextmanager
def group() -> Iterator[None]:
    """``ncclGroupStart()`` ... ``ncclGroupEnd()`` around the block (also when it raises)."""
    _flat.group_start()
    try:
        yield
    finally:
        _flat.group_end()


def _op(op: str | int) -> int:
    if isinstance(op, str):
        try:
            return int(_OPS[op.lower()])
        except KeyError:
            raise UsageError(f"unknown reduction {op!r} (use one of {', '.join(_OPS)} or a RedOp)") from None
    return _args.integer(op, "op", minimum=0, maximum=_MAX_INT)


def _config(config: Config | None) -> Config | None:
    return None if config is None else _args.instance(config, "config", Config, "an mpbind.nccl.Config or None")


class _Operand:
    """A device buffer for a collective: pointer, element count, element type."""

    __slots__ = ("ptr", "count", "dtype", "owner")

    def __init__(self, obj: Any, what: str, device: int, writable: bool) -> None:
        if isinstance(obj, tuple):
            if len(obj) != 3:
                raise TypeError(f"{what} given as a tuple must be (ptr, count, dtype)")
            ptr, count, dtype = obj
            if not isinstance(ptr, int) or not isinstance(count, int):
                raise TypeError(f"{what}: ptr and count must be ints")
            if count < 0:
                raise UsageError(f"{what}: count must be >= 0, got {count}")
            self.ptr, self.count, self.dtype, self.owner = ptr, count, _interop.dtype_name(dtype), None
        else:
            info = _interop.device_array(obj, what, writable=writable)
            if info.device != device:
                raise UsageError(f"{what} is on device {info.device} but the communicator uses device {device}")
            self.ptr, self.count, self.dtype, self.owner = info.ptr, info.size, info.dtype, obj
        if self.dtype not in _DTYPES:
            raise UsageError(f"{what}: NCCL has no {self.dtype} type")

    @property
    def nccl_dtype(self) -> int:
        return int(_DTYPES[self.dtype])


class Communicator(Owned):
    """An NCCL communicator (``ncclComm_t``) and everything that depends on it.

    Create with :meth:`init`, :meth:`from_mpi` or :meth:`from_torch` (collective). Buffers are
    arrays with ``__cuda_array_interface__``/DLPack or ``(ptr, count, dtype)`` tuples; streams are
    ints, ``__cuda_stream__`` objects, CuPy or PyTorch streams, or None (the default stream).
    ``close()`` (or ``destroy()``) releases what depends on it, then finalizes and destroys it
    (collective). :attr:`ptr` is the ``ncclComm_t`` for the flat bindings.
    """

    __slots__ = ("_core", "__weakref__")
    _core: _core_nccl.Communicator

    def __init__(self, core: Any) -> None:
        if not isinstance(core, _core.nccl.Communicator):
            raise TypeError("create communicators with Communicator.init(), from_mpi() or from_torch()")
        self._core = core

    # --- creation ---------------------------------------------------------

    @classmethod
    def init(cls, nranks: int, rank: int, unique_id: UniqueId | bytes, config: Config | None = None) -> Communicator:
        """``ncclCommInitRankConfig`` (collective over the `nranks` ranks sharing `unique_id`)."""
        nranks = _args.integer(nranks, "nranks", minimum=1, maximum=_MAX_INT)
        rank = _args.integer(rank, "rank", minimum=0, maximum=nranks - 1)
        if not isinstance(unique_id, (UniqueId, bytes, bytearray, memoryview)):
            raise TypeError(f"unique_id must be an mpbind.nccl.UniqueId or 128 bytes, not {type(unique_id).__name__}")
        return cls(_core.nccl.Communicator.init(nranks, rank, unique_id, _config(config)))

    @classmethod
    def from_mpi(cls, comm: Any, config: Config | None = None) -> Communicator:
        """One NCCL rank per rank of the mpi4py communicator `comm` (its unique id sent over MPI)."""
        from mpbind.bootstrap import share_unique_id

        if not (hasattr(comm, "Get_rank") and hasattr(comm, "Get_size") and hasattr(comm, "bcast")):
            raise TypeError(f"comm must be an mpi4py communicator, not {type(comm).__name__}")
        _config(config)
        uid = share_unique_id("nccl", comm)
        return cls.init(int(comm.Get_size()), int(comm.Get_rank()), uid, config)

    @classmethod
    def from_torch(cls, group: Any = None, config: Config | None = None) -> Communicator:
        """One NCCL rank per rank of a torch.distributed process group (None: the default group)."""
        dist = require("torch.distributed", "Communicator.from_torch")
        from mpbind.bootstrap import share_unique_id

        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, not {type(group).__name__}")
        _config(config)
        via = dist if group is None else group
        uid = share_unique_id("nccl", via)
        return cls.init(int(dist.get_world_size(group)), int(dist.get_rank(group)), uid, config)

    def split(self, color: int, key: int, config: Config | None = None) -> Communicator | None:
        """``ncclCommSplit`` (collective); None on ranks passing ``color=-1``."""
        color = _args.integer(color, "color", minimum=-1, maximum=_MAX_INT)
        key = _args.integer(key, "key", minimum=-_MAX_INT - 1, maximum=_MAX_INT)
        core = self._core.split(color, key, _config(config))
        return None if core is None else Communicator(core)

    def shrink(self, exclude_ranks: Sequence[int], config: Config | None = None, flags: int = 0) -> Communicator:
        """``ncclCommShrink`` (collective over the remaining ranks)."""
        if isinstance(exclude_ranks, (str, bytes)) or not isinstance(exclude_ranks, Sequence):
            raise TypeError(f"exclude_ranks must be a sequence of ranks, not {type(exclude_ranks).__name__}")
        ranks = [_args.integer(r, "exclude_ranks[]") for r in exclude_ranks]
        flags = _args.integer(flags, "flags", minimum=0, maximum=_MAX_INT)
        return Communicator(self._core.shrink(ranks, _config(config), flags))

    # --- properties and lifetime -------------------------------------------

    @property
    def rank(self) -> int:
        return int(self._core.rank)

    @property
    def size(self) -> int:
        return int(self._core.size)

    @property
    def device(self) -> int:
        return int(self._core.device)

    @property
    def ptr(self) -> _flat.Comm:
        """The ``ncclComm_t`` (an int) for :mod:`mpbind.bindings.nccl`; ``UsageError`` once closed."""
        return cast("_flat.Comm", self._core.ptr)

    handle = ptr  # its earlier name

    def finalize(self) -> None:
        """Drain what is queued under this communicator, then ``ncclCommFinalize`` (collective)."""
        self._core.finalize()

    def destroy(self) -> None:
        """Same as ``close()``."""
        self.close()

    def abort(self) -> None:
        """``ncclCommAbort`` (local): dependents are dropped without further NCCL calls."""
        self._core.abort()

    def drain(self) -> int:
        """Run the queued collective releases under this communicator (collective)."""
        return int(self._core.drain())

    # --- registration ------------------------------------------------------

    def register(self, buffer: BufferLike) -> Registration:
        """``ncclCommRegister`` of `buffer` (an array, :class:`Buffer` or ``(ptr, nbytes)``), refcounted."""
        ptr, nbytes, owner = _interop.device_span(buffer)
        return self._core.register(ptr, nbytes, owner)

    def register_window(self, buffer: BufferLike, flags: int = 0) -> Registration:
        """``ncclCommWindowRegister`` (collective), refcounted; ``.handle`` is the ``ncclWindow_t``."""
        flags = _args.integer(flags, "flags", minimum=0, maximum=_MAX_INT)
        ptr, nbytes, owner = _interop.device_span(buffer)
        return self._core.register_window(ptr, nbytes, flags, owner)

    def registrations(self) -> list[dict[str, Any]]:
        """Live registrations and windows on this communicator."""
        return list(self._core.registrations())

    # --- collectives ---------------------------------------------------------

    def _pair(self, send: Operand, recv: Operand, send_per_recv: float) -> tuple[_Operand, _Operand]:
        dev = self.device
        s = _Operand(send, "sendbuf", dev, writable=False)
        r = _Operand(recv, "recvbuf", dev, writable=True)
        if s.dtype != r.dtype:
            raise UsageError(f"sendbuf is {s.dtype} but recvbuf is {r.dtype}")
        if s.count != r.count * send_per_recv:
            raise UsageError(
                f"sendbuf has {s.count} elements and recvbuf {r.count}; expected sendbuf = "
                f"{send_per_recv:g} x recvbuf for this collective on {self.size} ranks"
            )
        return s, r

    def all_reduce(self, sendbuf: Operand, recvbuf: Operand, op: str | RedOp | int = "sum",
                   stream: Stream = None) -> None:
        """``ncclAllReduce``; `sendbuf` may be `recvbuf` (in place)."""
        s, r = self._pair(sendbuf, recvbuf, 1)
        _flat.all_reduce(s.ptr, r.ptr, r.count, r.nccl_dtype, _op(op), self.ptr, _interop.stream_handle(stream))

    def reduce(self, sendbuf: Operand, recvbuf: Operand, root: int, op: str | RedOp | int = "sum",
               stream: Stream = None) -> None:
        """``ncclReduce`` to `root`."""
        s, r = self._pair(sendbuf, recvbuf, 1)
        self._check_rank(root, "root")
        _flat.reduce(s.ptr, r.ptr, r.count, r.nccl_dtype, _op(op), root, self.ptr,
                     _interop.stream_handle(stream))

    def broadcast(self, sendbuf: Operand, recvbuf: Operand, root: int, stream: Stream = None) -> None:
        """``ncclBroadcast`` from `root`."""
        s, r = self._pair(sendbuf, recvbuf, 1)
        self._check_rank(root, "root")
        _flat.broadcast(s.ptr, r.ptr, r.count, r.nccl_dtype, root, self.ptr, _interop.stream_handle(stream))

    def all_gather(self, sendbuf: Operand, recvbuf: Operand, stream: Stream = None) -> None:
        """``ncclAllGather``: `recvbuf` holds ``size`` x `sendbuf`."""
        s, r = self._pair(sendbuf, recvbuf, 1 / self.size)
        _flat.all_gather(s.ptr, r.ptr, s.count, s.nccl_dtype, self.ptr, _interop.stream_handle(stream))

    def reduce_scatter(self, sendbuf: Operand, recvbuf: Operand, op: str | RedOp | int = "sum",
                       stream: Stream = None) -> None:
        """``ncclReduceScatter``: `sendbuf` holds ``size`` x `recvbuf`."""
        s, r = self._pair(sendbuf, recvbuf, self.size)
        _flat.reduce_scatter(s.ptr, r.ptr, r.count, r.nccl_dtype, _op(op), self.ptr,
                             _interop.stream_handle(stream))

    def all_to_all(self, sendbuf: Operand, recvbuf: Operand, stream: Stream = None) -> None:
        """``ncclAlltoAll``: both hold ``size`` blocks; block j of `sendbuf` goes to rank j."""
        s, r = self._pair(sendbuf, recvbuf, 1)
        if s.count % self.size:
            raise UsageError(f"all_to_all: {s.count} elements do not split into {self.size} equal blocks")
        _flat.all_to_all(s.ptr, r.ptr, s.count // self.size, s.nccl_dtype, self.ptr,
                         _interop.stream_handle(stream))

    def send(self, sendbuf: Operand, peer: int, stream: Stream = None) -> None:
        """``ncclSend`` to `peer` (pair with :meth:`recv`; wrap several in :func:`group`)."""
        s = _Operand(sendbuf, "sendbuf", self.device, writable=False)
        self._check_rank(peer, "peer")
        _flat.send(s.ptr, s.count, s.nccl_dtype, peer, self.ptr, _interop.stream_handle(stream))

    def recv(self, recvbuf: Operand, peer: int, stream: Stream = None) -> None:
        """``ncclRecv`` from `peer`."""
        r = _Operand(recvbuf, "recvbuf", self.device, writable=True)
        self._check_rank(peer, "peer")
        _flat.recv(r.ptr, r.count, r.nccl_dtype, peer, self.ptr, _interop.stream_handle(stream))

    def _check_rank(self, rank: int, what: str) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            raise UsageError(f"{what} must be a rank in [0, {self.size}), got {rank!r}")
