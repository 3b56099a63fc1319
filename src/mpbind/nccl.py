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

Nothing waits without a bound. What waits for the other ranks (``init``, ``split``, ``shrink``,
``finalize``, ``close``, window registration) gives up after the communicator's ``timeout``
(seconds; default ``MPBIND_TIMEOUT``, else 600) with :class:`~mpbind.errors.WaitTimeoutError`, and
Ctrl-C interrupts it within a fraction of a second. With ``watchdog=True`` (or ``MPBIND_WATCHDOG=1``)
a thread watches the communicator's operations: an error NCCL reports, or an operation still running
after ``timeout``, revokes the communicator (aborts it before NCCL 2.28.7), prints its flight record
(:meth:`Communicator.recent_operations`) on stderr, and every later call on it raises
:class:`~mpbind.errors.CommunicatorAbortedError` (:class:`~mpbind.errors.CollectiveTimeoutError` for
an overrun). The survivors carry on with ``shrink(exclude_ranks)``.
"""

from __future__ import annotations

# drain, queued, registrations: process-wide (mpbind.drain() ...), kept here as aliases.
from mpbind import _core, drain, queued, registrations
from mpbind._core import nccl as _core_nccl
from mpbind._infra import args as _args
from mpbind._infra import interop as _interop
from mpbind._infra.optional import require
from mpbind._infra.owned import Owned
from mpbind.bindings import nccl as _flat
from mpbind.bindings.nccl import Config, UniqueId, get_unique_id, get_version

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from collections.abc import Sequence
    from contextlib import AbstractContextManager
    from typing import Any

    from mpbind.bindings.nccl import DataType, RedOp
    from mpbind.typing import Buffer as BufferLike
    from mpbind.typing import Operand, Stream

__all__ = [
    "Buffer", "Communicator", "Config", "DataType", "RedOp", "Registration", "UniqueId", "drain",
    "get_unique_id", "get_version", "group", "mem_alloc", "queued", "registrations",
]

Buffer = _core.nccl.Buffer
Registration = _core.Registration


def __getattr__(name: str) -> object:
    # The flat bindings' IntEnums, made on first use: importing this module imports no enum.
    if name in ("DataType", "RedOp"):
        return getattr(_flat, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_MAX_SIZE = 2**64 - 1  # size_t
_MAX_INT = 2**31 - 1  # C int
_SHRINK_ABORT = 1  # NCCL_SHRINK_ABORT


def mem_alloc(nbytes: int) -> Buffer:
    """``ncclMemAlloc``: memory suited to registration and windows; freed when released or collected."""
    return _core.nccl.mem_alloc(_args.integer(nbytes, "nbytes", minimum=1, maximum=_MAX_SIZE))


class _Group:
    __slots__ = ()

    def __enter__(self) -> None:
        _core.nccl.group_start()

    def __exit__(self, *exc: object) -> None:
        _core.nccl.group_end()


def group() -> AbstractContextManager[None]:
    """``ncclGroupStart()`` ... ``ncclGroupEnd()`` around the block (also when it raises). Leaving the
    outermost group waits (bounded) until NCCL launched the work of the non-blocking communicators in
    it, and tracks the watched communicators' operations from then on; the flat
    ``group_start``/``group_end`` do neither."""
    return _Group()  # a class, not contextlib.contextmanager: importing mpbind.nccl stays cheap


def _config(config: Config | None) -> Config | None:
    return None if config is None else _args.instance(config, "config", Config, "an mpbind.nccl.Config or None")


def _deadline(timeout: float | None, watchdog: bool | None) -> tuple[float, bool]:
    """`timeout` in seconds (None: ``MPBIND_TIMEOUT``, else 600) and `watchdog` (None: ``MPBIND_WATCHDOG``),
    checked before anything collective runs."""
    return _core.timeout_arg(timeout, "timeout"), _core.watchdog_arg(watchdog, "watchdog")


def _inherited(timeout: float | None, watchdog: bool | None) -> None:
    """Check what is given of `timeout` and `watchdog` (None: the parent communicator's)."""
    if timeout is not None:
        _core.timeout_arg(timeout, "timeout")
    if watchdog is not None:
        _core.watchdog_arg(watchdog, "watchdog")


class Communicator(Owned):
    """An NCCL communicator (``ncclComm_t``) and everything that depends on it.

    Create with :meth:`init`, :meth:`from_mpi` or :meth:`from_torch` (collective). Buffers are
    arrays with ``__cuda_array_interface__``/DLPack or ``(ptr, count, dtype)`` tuples; streams are
    ints, ``__cuda_stream__`` objects, CuPy or PyTorch streams, or None (the default stream).
    ``close()`` (or ``destroy()``) releases what depends on it, then finalizes and destroys it
    (collective). :attr:`ptr` is the ``ncclComm_t`` for the flat bindings.
    """

    __slots__ = ("_core", "_launch", "__weakref__")
    _core: _core_nccl.Communicator
    _launch: int | None

    def __init__(self, core: Any) -> None:
        if not isinstance(core, _core.nccl.Communicator):
            raise TypeError("create communicators with Communicator.init(), from_mpi() or from_torch()")
        self._core = core
        self._launch = None

    @property
    def launch_id(self) -> int:
        """The id a framework's compiled program names this communicator by (the XLA FFI handlers of
        :mod:`mpbind.jax`): registered on first use, released when the communicator is collected. A
        launch on a closed or failed communicator fails with an error naming it."""
        launch = getattr(self, "_launch", None)
        if launch is None:
            import weakref  # here: importing mpbind.nccl stays light

            launch = int(_core.nccl.launch_register(self._core))
            weakref.finalize(self, _core.nccl.launch_release, launch)
            self._launch = launch
        return launch

    # --- creation ---------------------------------------------------------

    @classmethod
    def init(cls, nranks: int, rank: int, unique_id: UniqueId | bytes, config: Config | None = None, *,
             timeout: float | None = None, watchdog: bool | None = None) -> Communicator:
        """``ncclCommInitRankConfig`` (collective over the `nranks` ranks sharing `unique_id`).

        Waits at most `timeout` seconds (None: ``MPBIND_TIMEOUT``, else 600) for the other ranks, then
        raises :class:`~mpbind.errors.WaitTimeoutError`; Ctrl-C interrupts the wait. `timeout` is also the
        communicator's deadline from then on. `watchdog` (None: ``MPBIND_WATCHDOG``) watches its operations.
        """
        nranks = _args.integer(nranks, "nranks", minimum=1, maximum=_MAX_INT)
        rank = _args.integer(rank, "rank", minimum=0, maximum=nranks - 1)
        if not isinstance(unique_id, (UniqueId, bytes, bytearray, memoryview)):
            raise TypeError(f"unique_id must be an mpbind.nccl.UniqueId or 128 bytes, not {type(unique_id).__name__}")
        seconds, watched = _deadline(timeout, watchdog)
        return cls(_core.nccl.Communicator.init(nranks, rank, unique_id, _config(config), seconds, watched))

    @classmethod
    def from_mpi(cls, comm: Any, config: Config | None = None, *, timeout: float | None = None,
                 watchdog: bool | None = None) -> Communicator:
        """One NCCL rank per rank of the mpi4py communicator `comm` (its unique id sent over MPI);
        `timeout` and `watchdog` as for :meth:`init`."""
        from mpbind.bootstrap import share_unique_id

        if not (hasattr(comm, "Get_rank") and hasattr(comm, "Get_size") and hasattr(comm, "bcast")):
            raise TypeError(f"comm must be an mpi4py communicator, not {type(comm).__name__}")
        _config(config)
        seconds, watched = _deadline(timeout, watchdog)
        uid = share_unique_id("nccl", comm)
        return cls.init(int(comm.Get_size()), int(comm.Get_rank()), uid, config, timeout=seconds, watchdog=watched)

    @classmethod
    def from_torch(cls, group: Any = None, config: Config | None = None, *, timeout: float | None = None,
                   watchdog: bool | None = None) -> Communicator:
        """One NCCL rank per rank of a torch.distributed process group (None: the default group);
        `timeout` and `watchdog` as for :meth:`init`."""
        dist = require("torch.distributed", "Communicator.from_torch")
        from mpbind.bootstrap import share_unique_id

        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, not {type(group).__name__}")
        _config(config)
        seconds, watched = _deadline(timeout, watchdog)
        via = dist if group is None else group
        uid = share_unique_id("nccl", via)
        return cls.init(int(dist.get_world_size(group)), int(dist.get_rank(group)), uid, config, timeout=seconds,
                        watchdog=watched)

    def split(self, color: int, key: int, config: Config | None = None, *, timeout: float | None = None,
              watchdog: bool | None = None) -> Communicator | None:
        """``ncclCommSplit`` (collective, bounded); None on ranks passing ``color=-1``. `timeout` and
        `watchdog` default to this communicator's."""
        color = _args.integer(color, "color", minimum=-1, maximum=_MAX_INT)
        key = _args.integer(key, "key", minimum=-_MAX_INT - 1, maximum=_MAX_INT)
        _inherited(timeout, watchdog)
        core = self._core.split(color, key, _config(config), timeout, watchdog)
        return None if core is None else Communicator(core)

    def shrink(self, exclude_ranks: Sequence[int], config: Config | None = None, flags: int = 0, *,
               abort: bool = False, timeout: float | None = None, watchdog: bool | None = None) -> Communicator:
        """``ncclCommShrink`` (collective over the remaining ranks, bounded): a communicator without
        `exclude_ranks`. ``abort=True`` (``NCCL_SHRINK_ABORT``) first ends what still runs on this one; a
        revoked communicator (the watchdog's, or :meth:`revoke`) is shrunk once quiescent. `timeout` and
        `watchdog` default to this communicator's."""
        from collections.abc import Sequence  # here, not at import: the module loads no collections

        if isinstance(exclude_ranks, (str, bytes)) or not isinstance(exclude_ranks, Sequence):
            raise TypeError(f"exclude_ranks must be a sequence of ranks, not {type(exclude_ranks).__name__}")
        # Read no further than this communicator's ranks (a mistyped range would be read to its end).
        given = _args.sequence(exclude_ranks, "exclude_ranks", self.size, "ranks")
        ranks = [_args.integer(r, "exclude_ranks[]", minimum=0, maximum=_MAX_INT) for r in given]
        flags = _args.integer(flags, "flags", minimum=0, maximum=_MAX_INT)
        if not isinstance(abort, bool):
            raise TypeError(f"abort must be True or False, not {type(abort).__name__}")
        if abort:
            flags |= _SHRINK_ABORT
        _inherited(timeout, watchdog)
        return Communicator(self._core.shrink(ranks, _config(config), flags, timeout, watchdog))

    def revoke(self) -> None:
        """``ncclCommRevoke`` (NCCL >= 2.28.7; :class:`~mpbind.errors.FunctionNotFoundError` naming the
        version before): stop what is in flight on this rank. From then on only :meth:`shrink` and
        ``close()`` work; other calls raise :class:`~mpbind.errors.CommunicatorAbortedError`. Returns once
        the communicator is quiescent (bounded by its ``timeout``)."""
        self._core.revoke()

    def recent_operations(self) -> list[dict[str, Any]]:
        """The flight record, kept while the watchdog watches this communicator: its last 64 operations,
        oldest first, each a dict of ``seq``, ``operation``, ``count``, ``bytes``, ``dtype``, ``peer``,
        ``stream``, ``enqueued`` (a ``time.time()``), ``state`` (enqueuing, pending, completed, untracked,
        failed) and ``completed`` (None when not tracked). Comparing ranks shows who stopped where."""
        return list(self._core.recent_operations())

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
    def timeout(self) -> float:
        """This communicator's deadline in seconds: its waits, and the watchdog's."""
        return float(self._core.timeout)

    @property
    def watched(self) -> bool:
        """Whether the watchdog watches its operations (and keeps its flight record)."""
        return bool(self._core.watched)

    @property
    def failed(self) -> bool:
        """True once it failed (the watchdog, :meth:`revoke`, a wait given up): calls on it raise
        :class:`~mpbind.errors.CommunicatorAbortedError`."""
        return bool(self._core.failed)

    @property
    def ptr(self) -> _flat.Comm:
        """The ``ncclComm_t`` (an int) for :mod:`mpbind.bindings.nccl`; ``UsageError`` once closed."""
        return _flat.Comm(self._core.ptr)

    handle = ptr  # its earlier name

    def finalize(self) -> None:
        """Drain what is queued under this communicator, then ``ncclCommFinalize`` (collective, bounded by
        its ``timeout``; given up, the communicator is aborted)."""
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
    # Each is one call into the core, which describes the buffers (arrays or (ptr, count, dtype)),
    # checks them (device, dtype, counts, writability, rank, reduction) and calls NCCL once.

    def all_reduce(self, sendbuf: Operand, recvbuf: Operand, op: str | RedOp | int = "sum",
                   stream: Stream = None) -> None:
        """``ncclAllReduce``; `sendbuf` may be `recvbuf` (in place)."""
        self._core.all_reduce(sendbuf, recvbuf, op, stream)

    def reduce(self, sendbuf: Operand, recvbuf: Operand, root: int, op: str | RedOp | int = "sum",
               stream: Stream = None) -> None:
        """``ncclReduce`` to `root`."""
        self._core.reduce(sendbuf, recvbuf, root, op, stream)

    def broadcast(self, sendbuf: Operand, recvbuf: Operand, root: int, stream: Stream = None) -> None:
        """``ncclBroadcast`` from `root`."""
        self._core.broadcast(sendbuf, recvbuf, root, stream)

    def all_gather(self, sendbuf: Operand, recvbuf: Operand, stream: Stream = None) -> None:
        """``ncclAllGather``: `recvbuf` holds ``size`` x `sendbuf`."""
        self._core.all_gather(sendbuf, recvbuf, stream)

    def reduce_scatter(self, sendbuf: Operand, recvbuf: Operand, op: str | RedOp | int = "sum",
                       stream: Stream = None) -> None:
        """``ncclReduceScatter``: `sendbuf` holds ``size`` x `recvbuf`."""
        self._core.reduce_scatter(sendbuf, recvbuf, op, stream)

    def all_to_all(self, sendbuf: Operand, recvbuf: Operand, stream: Stream = None) -> None:
        """``ncclAlltoAll``: both hold ``size`` blocks; block j of `sendbuf` goes to rank j."""
        self._core.all_to_all(sendbuf, recvbuf, stream)

    def send(self, sendbuf: Operand, peer: int, stream: Stream = None) -> None:
        """``ncclSend`` to `peer` (pair with :meth:`recv`; wrap several in :func:`group`)."""
        self._core.send(sendbuf, peer, stream)

    def recv(self, recvbuf: Operand, peer: int, stream: Stream = None) -> None:
        """``ncclRecv`` from `peer`."""
        self._core.recv(recvbuf, peer, stream)
