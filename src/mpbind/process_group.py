"""The ranks' control plane: small set-up exchanges over the channel a job already has, and the one
protocol by which the ranks agree on a plan before anything collective runs.

A :class:`ProcessGroup` is the group of processes a plan, a bootstrap or a placement check spans,
seen from this process: its ``rank``, ``nranks``, and three exchanges of a few values, for set-up
only (never for data)::

    group = process_group(MPI.COMM_WORLD)         # or a torch.distributed group, an nccl.Communicator,
    rows = group.allgather_ints([m, n])           # mpbind.nvshmem (or a Team), a callable, a ProcessGroup
    uid = group.broadcast_bytes(data, root=0)     # root's bytes on every rank

Implementations: :class:`MPIProcessGroup` (mpi4py), :class:`TorchProcessGroup` (torch.distributed),
:class:`NCCLProcessGroup` (an all-gather of a small device buffer), :class:`NVSHMEMProcessGroup`
(``fcollect`` on symmetric memory) and :class:`CallableProcessGroup` (functions of the caller's).

Every exchange moves one frame of :data:`FRAME_WORDS` int64 words per rank, whatever it carries: a
rank that asks for another exchange, or another width, than the others cannot make the transport
hang on a size mismatch; the frames say what each rank asked, and every rank then raises the same
:class:`~mpbind.errors.UsageError`. Waits are bounded where the transport allows it (MPI, torch,
NCCL and NVSHMEM through the layer's bounded wait: ``timeout=``, else ``MPBIND_TIMEOUT``, else 600
seconds, then :class:`~mpbind.errors.WaitTimeoutError`; Ctrl-C interrupts them).

Agreement: :func:`agree` (each rank's values and whether it refused, exchanged once; any refusal or
difference raises the same exception with the same message on every rank), :func:`decided`
(a decision made on each rank, then agreed), :func:`largest` and :func:`smallest` (of one int per
rank), and :func:`digest` (a stable 64-bit digest of a plan's parameters).
"""

from __future__ import annotations

import abc
import sys

from mpbind._infra import args as _args
from mpbind._infra.optional import require
from mpbind.errors import MpbindError, UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, TypeVar

    _T = TypeVar("_T")
    Allgather = Callable[[bytes], Sequence[bytes]]
    Broadcast = Callable[[bytes | None, int], bytes]

__all__ = [
    "FRAME_WORDS",
    "MAX_BYTES",
    "MAX_INTS",
    "MAX_VALUES",
    "MESSAGE_BYTES",
    "CallableProcessGroup",
    "MPIProcessGroup",
    "NCCLProcessGroup",
    "NVSHMEMProcessGroup",
    "ProcessGroup",
    "TorchProcessGroup",
    "agree",
    "decided",
    "digest",
    "largest",
    "process_group",
    "smallest",
]

#: The int64 words every rank sends in every exchange: two of header (what the rank asked), the rest payload.
FRAME_WORDS = 128
_HEADER = 2
#: The most ints an allgather carries, and the most bytes an allgather or a broadcast carries.
MAX_INTS = FRAME_WORDS - _HEADER
MAX_BYTES = 8 * MAX_INTS
#: The bytes of a refusal's message that travel in an agreement (a longer one is cut).
MESSAGE_BYTES = 512
_MESSAGE_WORDS = MESSAGE_BYTES // 8
#: The most values an agreement compares.
MAX_VALUES = MAX_INTS - 1 - _MESSAGE_WORDS

# What a frame's header says a rank asked: (operation, width or root).
_INTS, _BYTES, _BROADCAST_ROOT, _BROADCAST_RECEIVE = 1, 2, 3, 4
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Buffers an exchange that was given up may still write: kept for the life of the process.
_abandoned: list[Any] = []


# --- the group ----------------------------------------------------------------------------------------------


class ProcessGroup(abc.ABC):
    """A group of processes seen from this one, for set-up exchanges: ``rank``, ``nranks``,
    :meth:`allgather_ints`, :meth:`allgather_bytes` and :meth:`broadcast_bytes`. Every exchange is
    collective (every rank makes it, in the same order) and moves one fixed-size frame per rank.

    A subclass implements :meth:`_allgather_frame` (and may implement :meth:`_broadcast_frame`)."""

    #: What the group calls its members in messages ("rank", or "PE" for NVSHMEM).
    unit = "rank"

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the group."""

    @property
    @abc.abstractmethod
    def nranks(self) -> int:
        """The number of processes in the group."""

    @abc.abstractmethod
    def _allgather_frame(self, frame: list[int]) -> list[list[int]]:
        """Every rank's `frame` (FRAME_WORDS int64s), in rank order. Collective."""

    def _broadcast_frame(self, frame: list[int], root: int) -> list[int]:
        """Rank `root`'s `frame` on every rank (the others pass a frame that says they receive). Collective."""
        rows = self._checked(self._allgather_frame(frame))
        _same_exchange(rows, self.unit, root)
        return rows[root]

    # --- the exchanges ---

    def allgather_ints(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's `values` (the same number of int64s on every rank, at most MAX_INTS), in rank
        order. A rank that passes another number of values makes every rank raise the same UsageError."""
        words = _ints(values, "allgather_ints: values")
        rows = self._gather([_INTS, len(words), *words])
        return [row[_HEADER:_HEADER + len(words)] for row in rows]

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's `data` (the same length on every rank, at most MAX_BYTES), in rank order."""
        data = _bytes(data, "allgather_bytes: data")
        rows = self._gather([_BYTES, len(data), *_words_of(data)])
        return [_bytes_of(row[_HEADER:], len(data)) for row in rows]

    def broadcast_bytes(self, data: bytes | None, root: int) -> bytes:
        """Rank `root`'s `data` (at most MAX_BYTES) on every rank; the other ranks' `data` is ignored
        (pass None). A root that passes None makes every rank raise the same UsageError."""
        root = _args.integer(root, "broadcast_bytes: root", minimum=0, maximum=_args.INT_MAX)
        size = self._size()
        if size is not None and root >= size:
            raise UsageError(f"broadcast_bytes: root is {root}; the group has {size} {self.unit}s")
        if self.rank == root and data is None:  # said to every rank, which all refuse alike
            frame = _frame([_BROADCAST_ROOT, -1])
        elif self.rank == root:
            data = _bytes(data, "broadcast_bytes: data")
            frame = _frame([_BROADCAST_ROOT, len(data), *_words_of(data)])
        else:
            frame = _frame([_BROADCAST_RECEIVE, root])
        if size == 1:
            got = frame
        else:
            got = self._broadcast_frame(frame, root)
            if len(got) != FRAME_WORDS:
                raise UsageError(f"the broadcast delivered {len(got)} words; a frame has {FRAME_WORDS}")
            if got[0] != _BROADCAST_ROOT:
                raise UsageError(f"{self.unit} {root} made another exchange than a broadcast from it "
                                 f"({_asked(got)}): every {self.unit} must make the same exchanges in the same order")
        if got[1] < 0:
            raise UsageError(f"broadcast_bytes: {self.unit} {root}, the root, passed None instead of the bytes to send")
        return _bytes_of(got[_HEADER:], got[1])

    def _gather(self, frame: list[int]) -> list[list[int]]:
        """Every rank's frame, after checking that every rank asked the same exchange."""
        frame = _frame(frame)
        if self._size() == 1:
            return [frame]
        rows = self._checked(self._allgather_frame(frame))
        _same_exchange(rows, self.unit, None)
        return rows

    def _checked(self, rows: list[list[int]]) -> list[list[int]]:
        """`rows`, checked to be one frame per rank (what a caller's callable returns may not be)."""
        if len(rows) != self.nranks or any(len(row) != FRAME_WORDS for row in rows):
            raise UsageError(f"the allgather delivered {len(rows)} frames of {sorted({len(r) for r in rows})} words; "
                             f"the group has {self.nranks} {self.unit}s and a frame {FRAME_WORDS} words")
        return rows

    def _size(self) -> int | None:
        return self.nranks

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.unit} {self.rank} of {self._size() or '?'}>"


def _frame(words: list[int]) -> list[int]:
    return words + [0] * (FRAME_WORDS - len(words))


def _asked(frame: Sequence[int]) -> str:
    op, width = frame[0], frame[1]
    return {_INTS: f"an allgather of {width} ints", _BYTES: f"an allgather of {width} bytes",
            _BROADCAST_ROOT: f"a broadcast of {max(width, 0)} bytes from it",
            _BROADCAST_RECEIVE: f"a broadcast from {width}"}.get(op, "no known exchange")


def _same_exchange(rows: list[list[int]], unit: str, root: int | None) -> None:
    """UsageError, the same on every rank, unless every rank asked the same exchange (an allgather of
    one width, or a broadcast from `root`)."""
    if root is None:
        differ = [r for r, row in enumerate(rows) if row[:_HEADER] != rows[0][:_HEADER]]
    else:
        differ = [r for r, row in enumerate(rows)
                  if row[0] != (_BROADCAST_ROOT if r == root else _BROADCAST_RECEIVE) or (r != root and row[1] != root)]
    if differ:
        seen: dict[tuple[int, ...], int] = {}
        for r, row in enumerate(rows):
            seen.setdefault(tuple(row[:_HEADER]), r)
        asked = "; ".join(f"{unit} {r}: {_asked(rows[r])}" for r in sorted(seen.values())[:4])
        raise UsageError(f"the {unit}s made different exchanges ({asked}): every {unit} must make the same "
                         "exchanges in the same order")


def _ints(values: Sequence[int], name: str, limit: int = MAX_INTS) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of ints, not {type(values).__name__}")
    if len(values) > limit:
        raise UsageError(f"{name} has {len(values)} ints; an exchange carries at most {limit}")
    return [_args.integer(v, f"{name}[{i}]", minimum=_INT64_MIN, maximum=_INT64_MAX) for i, v in enumerate(values)]


def _bytes(data: Any, name: str) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, not {type(data).__name__}")
    out = bytes(data)
    if len(out) > MAX_BYTES:
        raise UsageError(f"{name} has {len(out)} bytes; an exchange carries at most {MAX_BYTES}")
    return out


def _words_of(data: bytes) -> list[int]:
    padded = data + b"\0" * (-len(data) % 8)
    return [int.from_bytes(padded[i:i + 8], "little", signed=True) for i in range(0, len(padded), 8)]


def _bytes_of(words: Sequence[int], size: int) -> bytes:
    if not 0 <= size <= 8 * len(words):
        raise UsageError(f"an exchange said it carried {size} bytes; a frame holds at most {8 * len(words)}")
    return b"".join(int(w).to_bytes(8, "little", signed=True) for w in words[:(size + 7) // 8])[:size]


def _timeout(timeout: float | None) -> float:
    """A timeout= argument as seconds (None: ``MPBIND_TIMEOUT``, else 600)."""
    from mpbind import _core

    return float(_core.timeout_arg(timeout, "timeout"))


def _wait(ready: Callable[[], object], timeout: float, what: str, keep: Any) -> None:
    """Poll `ready` through the layer's bounded wait. Given up, `keep` (what the transport may still
    write) stays alive: the exchange cannot be withdrawn."""
    from mpbind import _core

    try:
        _core.wait_until(ready, timeout, what, "another rank never made this exchange (it died, or took another "
                         "path); the exchange cannot be withdrawn, so the job should end")
    except BaseException:
        _abandoned.append(keep)
        raise


def _to_device(ptr: int, words: Sequence[int]) -> None:
    from mpbind._infra import cuda

    cuda.write_int64s(ptr, list(words))


def _from_device(ptr: int, count: int) -> list[int]:
    from mpbind._infra import cuda

    return cuda.read_int64s(ptr, count)


# --- implementations ---------------------------------------------------------------------------------------


class MPIProcessGroup(ProcessGroup):
    """The ranks of an mpi4py communicator. Exchanges are non-blocking MPI all-gathers of int64
    buffers, waited for at most `timeout` seconds (None: ``MPBIND_TIMEOUT``, else 600)."""

    comm: Any
    timeout: float

    def __init__(self, comm: Any, *, timeout: float | None = None) -> None:
        if not all(hasattr(comm, name) for name in ("Get_rank", "Get_size", "Iallgather")):
            raise TypeError(f"comm must be an mpi4py communicator, not {type(comm).__name__}")
        self.comm = comm
        self.timeout = _timeout(timeout)
        self._rank, self._nranks = int(comm.Get_rank()), int(comm.Get_size())

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def nranks(self) -> int:
        return self._nranks

    def _allgather_frame(self, frame: list[int]) -> list[list[int]]:
        from array import array

        send, recv = array("q", frame), array("q", bytes(8 * FRAME_WORDS * self._nranks))
        req = self.comm.Iallgather(send, recv)
        _wait(req.Test, self.timeout, "an MPI set-up exchange", (req, send, recv))
        return [list(recv[r * FRAME_WORDS:(r + 1) * FRAME_WORDS]) for r in range(self._nranks)]


class TorchProcessGroup(ProcessGroup):
    """The ranks of a torch.distributed process group (None: the default group). Exchanges are
    asynchronous all-gathers of int64 tensors (on the current CUDA device where the group's backend
    is NCCL), waited for at most `timeout` seconds (None: ``MPBIND_TIMEOUT``, else 600)."""

    group: Any
    timeout: float

    def __init__(self, group: Any = None, *, timeout: float | None = None) -> None:
        dist = require("torch.distributed", "TorchProcessGroup")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch.distributed ProcessGroup or None, not {type(group).__name__}")
        self.group = group
        self.timeout = _timeout(timeout)
        self._dist = dist
        self._rank, self._nranks = int(dist.get_rank(group)), int(dist.get_world_size(group))

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def nranks(self) -> int:
        return self._nranks

    def _allgather_frame(self, frame: list[int]) -> list[list[int]]:
        import torch

        backend = str(self._dist.get_backend(self.group))
        device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend and "gloo" not in backend \
            else torch.device("cpu")
        mine = torch.tensor(frame, dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(self._nranks)]
        work = self._dist.all_gather(every, mine, group=self.group, async_op=True)
        _wait(work.is_completed, self.timeout, "a torch.distributed set-up exchange", (work, mine, every))
        work.wait()
        return [[int(v) for v in t.tolist()] for t in every]


class NCCLProcessGroup(ProcessGroup):
    """The ranks of an :class:`mpbind.nccl.Communicator`. An exchange is one ``ncclAllGather`` of a
    small device buffer on the legacy default stream, waited for at most the communicator's
    ``timeout``; the communicator's device must be current."""

    comm: Any

    def __init__(self, comm: Any) -> None:
        nccl = sys.modules.get("mpbind.nccl")  # loaded wherever a Communicator exists
        if nccl is None or not isinstance(comm, nccl.Communicator):
            raise TypeError(f"comm must be an mpbind.nccl.Communicator, not {type(comm).__name__}")
        self.comm = comm

    @property
    def rank(self) -> int:
        return int(self.comm.rank)

    @property
    def nranks(self) -> int:
        return int(self.comm.size)

    def _allgather_frame(self, frame: list[int]) -> list[list[int]]:
        from mpbind._infra import cuda

        n = FRAME_WORDS * self.nranks
        buf = cuda.malloc(8 * (n + FRAME_WORDS))
        mine = buf + 8 * n
        try:
            _to_device(mine, frame)
            self.comm.all_gather((mine, FRAME_WORDS, "int64"), (buf, n, "int64"), stream=0)
        except BaseException:
            cuda.free(buf)
            raise

        def done() -> bool:
            return cuda.stream_done(0)

        _wait(done, self.comm.timeout, "an NCCL set-up exchange", buf)  # given up, buf stays: NCCL may write it
        try:
            every = _from_device(buf, n)
        finally:
            cuda.free(buf)
        return [every[r * FRAME_WORDS:(r + 1) * FRAME_WORDS] for r in range(self.nranks)]


class _Words:
    """`count` int64s of device memory at `ptr`, as the core's collectives take an array."""

    def __init__(self, ptr: int, count: int) -> None:
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": "<i8", "data": (ptr, False), "strides": None,
                                         "version": 3}


class NVSHMEMProcessGroup(ProcessGroup):
    """The PEs of NVSHMEM's world, or of a :class:`mpbind.nvshmem.Team`. An exchange is one
    ``fcollect`` on symmetric memory, waited for at most the runtime's deadline (``nvshmem.init``'s
    ``timeout``); NVSHMEM must be initialised."""

    unit = "PE"
    team: Any

    def __init__(self, team: Any = None) -> None:
        from mpbind import _core

        nv = _core.nvshmem
        if team is not None and not isinstance(team, nv.Team):
            raise TypeError(f"team must be an mpbind.nvshmem.Team or None, not {type(team).__name__}")
        if not nv.is_initialized():
            raise UsageError("an NVSHMEM process group needs NVSHMEM initialised first (mpbind.nvshmem.init)")
        self.team = team
        self._nv = nv

    @property
    def rank(self) -> int:
        return int(self._nv.my_pe() if self.team is None else self.team.my_pe)

    @property
    def nranks(self) -> int:
        return int(self._nv.n_pes() if self.team is None else self.team.n_pes)

    def _allgather_frame(self, frame: list[int]) -> list[list[int]]:
        n = self.nranks
        mine = self._nv.allocate(8 * FRAME_WORDS, True)
        every = self._nv.allocate(8 * FRAME_WORDS * n, True)
        try:
            _to_device(mine.ptr, frame)
            self._nv.fcollect(_Words(every.ptr, FRAME_WORDS * n), _Words(mine.ptr, FRAME_WORDS), self.team)
            # Freeing is collective and first waits (bounded by the runtime's deadline) for this PE's
            # collectives on streams: the fcollect above has completed when it returns.
            mine.close()
            got = _from_device(every.ptr, FRAME_WORDS * n)
        finally:
            every.close()
            mine.close()
        return [got[r * FRAME_WORDS:(r + 1) * FRAME_WORDS] for r in range(n)]


class CallableProcessGroup(ProcessGroup):
    """A group over the caller's own functions: ``allgather(data: bytes) -> Sequence[bytes]`` (every
    rank's `data`, in rank order) and/or ``broadcast(data: bytes | None, root: int) -> bytes`` (root's
    `data` on every rank; the others pass None). What they carry is opaque: one frame of
    ``8 * FRAME_WORDS`` bytes per rank. With only `broadcast`, an allgather is `nranks` broadcasts;
    with only `allgather`, a broadcast takes the root's part of one. `nranks` may be None with only
    a broadcast (the exchanges that need it then refuse)."""

    def __init__(self, rank: int, nranks: int | None, *, allgather: Allgather | None = None,
                 broadcast: Broadcast | None = None) -> None:
        if allgather is None and broadcast is None:
            raise UsageError("a CallableProcessGroup needs an allgather= or a broadcast= callable")
        for name, fn in (("allgather", allgather), ("broadcast", broadcast)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, not {type(fn).__name__}")
        if nranks is not None:
            nranks = _args.integer(nranks, "nranks", minimum=1, maximum=_args.INT_MAX)
        self._rank = _args.integer(rank, "rank", minimum=0, maximum=(nranks or 2**31) - 1)
        self._nranks = nranks
        self._allgather, self._broadcast = allgather, broadcast

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def nranks(self) -> int:
        if self._nranks is None:
            raise UsageError("this CallableProcessGroup was made without nranks: pass nranks= for an allgather")
        return self._nranks

    def _size(self) -> int | None:
        return self._nranks

    def _allgather_frame(self, frame: list[int]) -> list[list[int]]:
        if self._allgather is None:
            return [self._broadcast_frame(frame, r) for r in range(self.nranks)]
        got = self._allgather(_frame_bytes(frame))
        if isinstance(got, (str, bytes, bytearray)) or not hasattr(got, "__len__"):
            raise UsageError(f"the allgather callable returned {type(got).__name__}, not a sequence of bytes")
        return [_frame_words(part, f"the allgather callable's part {r}") for r, part in enumerate(got)]

    def _broadcast_frame(self, frame: list[int], root: int) -> list[int]:
        if self._broadcast is None:
            return super()._broadcast_frame(frame, root)
        got = self._broadcast(_frame_bytes(frame) if self._rank == root else None, root)
        return _frame_words(got, "the broadcast callable's result")


def _frame_bytes(frame: list[int]) -> bytes:
    return b"".join(w.to_bytes(8, "little", signed=True) for w in frame)


def _frame_words(data: Any, what: str) -> list[int]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"{what} is {type(data).__name__}, not bytes")
    data = bytes(data)
    if len(data) != 8 * FRAME_WORDS:
        raise UsageError(f"{what} has {len(data)} bytes; the frame it was given has {8 * FRAME_WORDS}")
    return _words_of(data)


# --- any channel as a group ---------------------------------------------------------------------------------


def process_group(obj: Any, *, rank: int | None = None, nranks: int | None = None, timeout: float | None = None,
                  what: str = "via") -> ProcessGroup:
    """`obj` as a :class:`ProcessGroup`: a ProcessGroup itself, an mpi4py communicator, a
    torch.distributed process group (or the torch.distributed module: the default group), an
    :class:`mpbind.nccl.Communicator`, the :mod:`mpbind.nvshmem` module (NVSHMEM's world) or one of
    its teams, or an ``allgather(data: bytes) -> Sequence[bytes]`` callable with this process's `rank`
    and the group's `nranks`. `timeout` bounds the waits of MPI and torch exchanges; `what` names
    `obj` in the error raised for anything else."""
    if isinstance(obj, ProcessGroup):
        return obj
    if all(hasattr(obj, name) for name in ("Get_rank", "Get_size", "Iallgather")):
        return MPIProcessGroup(obj, timeout=timeout)
    dist, group = _torch_group(obj)
    if dist is not None:
        return TorchProcessGroup(group, timeout=timeout)
    nccl = sys.modules.get("mpbind.nccl")  # an object of a module not loaded yet is none of its classes
    if nccl is not None and isinstance(obj, nccl.Communicator):
        return NCCLProcessGroup(obj)
    nvshmem = sys.modules.get("mpbind.nvshmem")
    if nvshmem is not None and (obj is nvshmem or isinstance(obj, nvshmem.Team)):
        return NVSHMEMProcessGroup(None if obj is nvshmem else obj)
    if callable(obj) and not isinstance(obj, type):
        if rank is None or nranks is None:
            raise UsageError(f"{what}: with an allgather callable, pass this process's rank= and the group's nranks=")
        return CallableProcessGroup(rank, nranks, allgather=obj)
    raise TypeError(f"{what} must be an mpbind ProcessGroup, an mpi4py communicator, a torch.distributed process "
                    "group, an mpbind.nccl.Communicator, mpbind.nvshmem (or a Team), or an allgather callable, "
                    f"not {type(obj).__name__}")


def _torch_group(obj: Any) -> tuple[Any, Any]:
    """(torch.distributed, group or None) when `obj` is torch.distributed or one of its groups."""
    if not (getattr(obj, "__name__", "") == "torch.distributed" or _args.module_of(obj).startswith("torch")):
        return None, None
    import torch.distributed as dist

    if obj is dist:
        return dist, None
    if isinstance(obj, dist.ProcessGroup):
        return dist, obj
    return None, None


# --- agreement ----------------------------------------------------------------------------------------------

# A refusal's kind travels as a code, so that every rank raises the same class: (code, class).
_KINDS: tuple[tuple[int, type[Exception]], ...] = ((1, UsageError), (2, TypeError), (3, OverflowError),
                                                   (4, MpbindError))


def _kind(failure: BaseException) -> int:
    if isinstance(failure, (UsageError, TypeError, OverflowError)):
        return next(code for code, cls in _KINDS if isinstance(failure, cls))
    return 1 if isinstance(failure, ValueError) else 4


def _message(failure: BaseException) -> bytes:
    text = str(failure) if _kind(failure) != 4 else f"{type(failure).__name__}: {failure}"
    data = text.encode("utf-8", "replace")
    if len(data) > MESSAGE_BYTES:  # cut on a character boundary, marked
        data = data[:MESSAGE_BYTES - 3].decode("utf-8", "ignore").encode() + b"..."
    return data


def _members(unit: str, ranks: Sequence[int]) -> str:
    return f"{unit}{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _check_group(group: Any) -> None:
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be an mpbind ProcessGroup, not {type(group).__name__}")


def agree(group: ProcessGroup, what: str, values: int | Sequence[int], failure: BaseException | None = None, *,
          described: str = "values", names: Sequence[str] | None = None) -> None:
    """The ranks' agreement before anything collective: every rank passes its `values` (an int, such
    as a :func:`digest`, or a fixed number of ints) and its `failure` (None, or why this rank refused).
    One exchange; then, when any rank refused, every rank raises the same exception (the first
    refusing rank's class, UsageError, TypeError or OverflowError, else MpbindError) with the same
    message, naming the ranks that refused and the first one's reason (the refusing rank's own error
    is its ``__cause__``); else, when any rank's values differ from rank 0's, every rank raises the
    same UsageError naming them (and, with `names`, the fields that differ). `what` names the
    operation and `described` its values in the messages. Collective: every rank calls it, whatever
    happened before."""
    _check_group(group)
    mine = _ints([values] if isinstance(values, int) else values, "agree: values", MAX_VALUES)
    if names is not None and len(names) != len(mine):
        raise UsageError(f"agree: {len(names)} names for {len(mine)} values")
    note = b"" if failure is None else _message(failure)
    words = _words_of(note.ljust(MESSAGE_BYTES, b"\0"))
    rows = group.allgather_ints([0 if failure is None else _kind(failure), *mine, *words])
    unit = group.unit
    refused = [r for r, row in enumerate(rows) if row[0]]
    if refused:
        first = rows[refused[0]]
        cls = dict(_KINDS).get(first[0], MpbindError)
        reason = _bytes_of(first[1 + len(mine):], MESSAGE_BYTES).rstrip(b"\0").decode("utf-8", "replace")
        also = f" (and on {_members(unit, refused[1:])})" if len(refused) > 1 else ""
        raise cls(f"{what} refused on {unit} {refused[0]}{also}: {reason}; no {unit} went on") from failure
    differ = [r for r, row in enumerate(rows) if row[1:1 + len(mine)] != rows[0][1:1 + len(mine)]]
    if differ:
        text = (f"{what} needs the same {described} on every {unit}: {_members(unit, differ)} passed others than "
                f"{unit} 0")
        if names is not None:
            ours, theirs = rows[0][1:], rows[differ[0]][1:]
            fields = [f"{name}={a} on {unit} 0, {b} on {unit} {differ[0]}"
                      for name, a, b in zip(names, ours, theirs, strict=False) if a != b]
            text += f" ({'; '.join(fields)})"
        raise UsageError(text)


def decided(group: ProcessGroup, what: str, values: int | Sequence[int], decide: Callable[[], _T], *,
            described: str = "values", names: Sequence[str] | None = None) -> _T:
    """`decide()` on this rank (the pure planning and this rank's own checks), then :func:`agree` on
    its outcome: its result on every rank, or the same refusal on every rank. Any Exception `decide`
    raises is agreed (a KeyboardInterrupt is not). Collective: every rank calls it."""
    _check_group(group)
    if not callable(decide):
        raise TypeError(f"decide must be callable, not {type(decide).__name__}")
    failure: BaseException | None = None
    decision: _T | None = None
    try:
        decision = decide()
    except Exception as exc:  # noqa: BLE001 - every failure is agreed, or the other ranks would wait for this one
        failure = exc
    agree(group, what, values, failure, described=described, names=names)
    return decision  # type: ignore[return-value]  # agree raised where decide did


def largest(group: ProcessGroup, value: int) -> int:
    """The largest of every rank's `value` (an int64): a size that differs by rank, agreed. Collective."""
    _check_group(group)
    return max(row[0] for row in group.allgather_ints([value]))


def smallest(group: ProcessGroup, value: int) -> int:
    """The smallest of every rank's `value` (an int64). Collective."""
    _check_group(group)
    return min(row[0] for row in group.allgather_ints([value]))


def digest(*values: Any) -> int:
    """A 64-bit digest of `values` for ranks to compare (an int64: it travels in an agreement). Built
    from their reprs, which are alike on every rank that passed the same values."""
    import hashlib  # here: only plans that agree across ranks need it

    return int.from_bytes(hashlib.blake2b(_digest_text(values).encode(), digest_size=8).digest(), "little",
                          signed=True)


def _digest_text(value: Any) -> str:
    """repr(value), with ints in hex where an int is too long for decimal text (repr would raise)."""
    try:
        return repr(value)
    except ValueError:
        if isinstance(value, int):
            return hex(value)
        if isinstance(value, (tuple, list)):
            return f"{type(value).__name__}({', '.join(map(_digest_text, value))})"
        if isinstance(value, dict):
            return f"dict({', '.join(f'{_digest_text(k)}: {_digest_text(v)}' for k, v in value.items())})"
        return f"<unprintable {type(value).__name__}>"
