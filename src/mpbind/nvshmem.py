"""NVSHMEM, the Pythonic way: a runtime, teams and symmetric arrays that own their resources.

::

    from mpi4py import MPI
    from mpbind import nvshmem

    with nvshmem.init(mpi_comm=MPI.COMM_WORLD, device=0) as rt:   # nvshmem_finalize on exit
        src = nvshmem.zeros(1024, "float32")                     # symmetric: every PE allocates
        dst = nvshmem.empty(1024, "float32")
        nvshmem.put(dst, src, pe=(rt.my_pe + 1) % rt.n_pes, stream=s)
        nvshmem.quiet(stream=s)
        nvshmem.reduce("sum", dst, src, stream=s)
        x = cupy.from_dlpack(dst)                                # zero-copy view

One runtime per process: NVSHMEM cannot be initialised again after ``finalize()``.
Releases that are collective (``nvshmem_free``, ``nvshmem_team_destroy``) never run from
the garbage collector: an array or team dropped without ``free()``/``destroy()`` warns
``ResourceWarning`` and waits in a queue that ``Runtime.drain()`` or ``finalize()`` runs,
newest first, on every PE.

Operations run on a CUDA stream (``stream=None`` is the default stream) and check
their arguments (symmetric memory, dtypes, sizes, PE numbers) before any library call.
In NVSHMEM's limited multi-PE-per-GPU mode (``Runtime.limited_mpg``: several PEs on one
GPU without CUDA MPS) only RMA, ``quiet``, ``barrier_all`` and ``sync_all`` work; the
library exits the process on the others, so they raise ``UsageError`` here instead.
"""

from __future__ import annotations

import contextlib
import math
import operator
import sys
import threading

from mpbind import _core

# RMA, synchronisation and collectives on a stream: the core's functions themselves (typed and
# documented there, with the reason), each checking its arguments before its one library call.
from mpbind._core.nvshmem import (
    alltoall,
    barrier,
    barrier_all,
    broadcast,
    fcollect,
    get,
    put,
    quiet,
    reduce,
    sync_all,
)
from mpbind._infra import args as _args
from mpbind._infra import cuda as _cuda
from mpbind._infra import placement as _placement
from mpbind._infra.interop import (
    device_span,
    dtype_name,
    itemsize,
)
from mpbind.errors import CudaError, UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any

    from mpbind.typing import Buffer as BufferLike

__all__ = [
    "PeerArray",
    "Registration",
    "Runtime",
    "SymmetricArray",
    "SymmetricMemory",
    "Team",
    "alltoall",
    "barrier",
    "barrier_all",
    "broadcast",
    "device",
    "empty",
    "fcollect",
    "finalize",
    "get",
    "init",
    "is_finalized",
    "is_initialized",
    "my_pe",
    "n_pes",
    "pes_sharing_this_gpu",
    "put",
    "quiet",
    "recent_operations",
    "reduce",
    "register",
    "runtime",
    "sync_all",
    "zeros",
]

_nv = _core.nvshmem
Runtime = _nv.Runtime
Team = _nv.Team
SymmetricMemory = _nv.SymmetricMemory
Registration = _core.Registration

_LIMITED_STATUS = 3  # InitStatus.LIMITED_MPG


def _flat() -> Any:
    from mpbind.bindings import nvshmem as flat  # imported late: it loads no library, but is large

    return flat


# --- runtime ---------------------------------------------------------------------------------


def init(unique_id: Any = None, rank: int | None = None, nranks: int | None = None, *,
         mpi_comm: Any = None, bootstrap: str | None = None, device: int | None = None,
         placement_via: Any = None, notice_after: float | None = 60.0, timeout: float | None = None,
         watchdog: bool | None = None) -> Runtime:
    """Initialise NVSHMEM (collective) and return the process's runtime.

    Either ``unique_id`` (a ``UniqueId`` or 128 bytes that every rank received, see
    :func:`mpbind.bootstrap.share_unique_id`) with this process's ``rank`` and ``nranks``, or
    ``mpi_comm`` (an mpi4py communicator): with ``bootstrap="mpi"`` (the default there)
    NVSHMEM bootstraps over MPI, with ``bootstrap="uid"`` rank 0's unique id is shared over it.
    ``device`` (a CUDA ordinal) is made current first; by default the current device is used.

    Before NVSHMEM initialises, the PEs compare their GPUs (host and device UUID) and raise
    :class:`~mpbind.errors.PlacementError` on every PE when NVSHMEM could not initialise with
    that placement (a different number of PEs on each GPU hangs it). They do so over
    ``mpi_comm``, or over ``placement_via`` with a unique id: a
    :class:`~mpbind.process_group.ProcessGroup` or anything
    :func:`~mpbind.process_group.process_group` takes (an mpi4py communicator, a torch.distributed
    group, an ``allgather(data: bytes) -> Sequence[bytes]`` callable); without either nothing is
    checked.

    NVSHMEM's initialisation waits until every PE has called it; here it waits at most `timeout`
    seconds (None: ``MPBIND_TIMEOUT``, else 600) and Ctrl-C interrupts it. With ``mpi_comm`` the PEs
    first say over MPI that they arrived, so that a PE that never comes is named: every PE that did
    raises :class:`~mpbind.errors.WaitTimeoutError` listing the missing ones; with a unique id that
    cannot be known, and the error says so. The initialisation itself runs on a thread of its own
    (not with an MPI bootstrap below ``MPI_THREAD_SERIALIZED``, which must stay on the thread that
    called it): given up, that thread is left waiting inside NVSHMEM, which cannot be interrupted,
    and NVSHMEM cannot be initialised again in the process, which should end. A PE still waiting
    after ``notice_after`` seconds says so on stderr (None: never).

    `timeout` is also the deadline of this PE's waits for its collectives on streams. With
    `watchdog` (None: ``MPBIND_WATCHDOG``) a thread watches them: one still running after `timeout`
    is reported on stderr with the PE, the operation and the flight record
    (:func:`recent_operations`), and the process ends (exit status 70): NVSHMEM cannot abort it.

    Calling it again with the same bootstrap, rank, size and device returns the live runtime
    (the unique id is only a rendezvous token and is not compared); with others it raises
    ``UsageError``. After ``finalize()`` NVSHMEM cannot be initialised again in the process.
    """
    seconds = _core.timeout_arg(timeout, "timeout")
    watched = _core.watchdog_arg(watchdog, "watchdog")
    if device is not None:
        device = _args.integer(device, "device", minimum=0, maximum=_args.INT_MAX)
    if notice_after is not None and (isinstance(notice_after, bool) or not isinstance(notice_after, (int, float))
                                     or not 0 < notice_after <= threading.TIMEOUT_MAX):  # NaN fails both
        raise UsageError(f"notice_after must be a number of seconds > 0 (at most threading.TIMEOUT_MAX) or None, "
                         f"not {notice_after!r}")
    if bootstrap not in (None, "uid", "mpi"):
        raise UsageError(f"bootstrap must be 'uid' or 'mpi', not {bootstrap!r}")
    if mpi_comm is not None:
        if unique_id is not None or rank is not None or nranks is not None:
            raise UsageError("pass either mpi_comm= or unique_id= with rank= and nranks=, not both")
        if not all(hasattr(mpi_comm, name) for name in ("Get_rank", "Get_size", "Iallgather")):
            raise TypeError(f"mpi_comm must be an mpi4py communicator, not {type(mpi_comm).__name__}")
        method = bootstrap or "mpi"
        rank, nranks = int(mpi_comm.Get_rank()), int(mpi_comm.Get_size())
    elif unique_id is not None:
        if bootstrap not in (None, "uid"):
            raise UsageError("a unique_id bootstraps with bootstrap='uid'")
        method = "uid"
        if nranks is None or rank is None:
            raise UsageError("with unique_id=, pass this process's rank= and the job's nranks=")
        nranks = _args.integer(nranks, "nranks", minimum=1, maximum=_args.INT_MAX)
        rank = _args.integer(rank, "rank", minimum=0, maximum=nranks - 1)
    else:
        raise UsageError("init() needs unique_id= with rank= and nranks=, or mpi_comm=")
    group = None
    if placement_via is not None or mpi_comm is not None:
        from mpbind.process_group import process_group

        group = process_group(mpi_comm if placement_via is None else placement_via, rank=rank, nranks=nranks,
                              timeout=seconds, what="mpi_comm" if placement_via is None else "placement_via")
        if group.nranks != nranks:
            raise UsageError(f"placement_via spans {group.nranks} processes; init was given nranks={nranks}")

    params = {"bootstrap": method, "rank": str(rank), "nranks": str(nranks),
              "device": "current" if device is None else str(device)}
    if _nv.is_initialized() or _nv.is_finalized():  # the core decides, before any bootstrap traffic
        rt = _nv.start(params, _never)
        _nv.set_deadline(seconds, watched)
        return rt
    if _given_up:
        raise UsageError(f"{_given_up}; NVSHMEM cannot be initialised again in this process: end it")

    flat = _flat()
    attr = flat.InitAttr()
    if method == "uid":
        if mpi_comm is not None:
            from mpbind.bootstrap import share_unique_id

            unique_id = share_unique_id("nvshmem", mpi_comm)
        elif not isinstance(unique_id, flat.UniqueId):
            # Bytes-likes only: bytes() of an int would allocate that many bytes.
            if not isinstance(unique_id, (bytes, bytearray, memoryview)):
                raise TypeError(f"unique_id must be an mpbind.bindings.nvshmem.UniqueId or 128 bytes, "
                                f"not {type(unique_id).__name__}")
            unique_id = flat.UniqueId(bytes(unique_id))
        flat.set_attr_uniqueid_args(rank, nranks, unique_id, attr)
        flags = flat.InitFlags.WITH_UNIQUEID
    else:
        flat.set_attr_mpi_comm_args(mpi_comm, attr)
        flags = flat.InitFlags.WITH_MPI_COMM

    what = f"nvshmem.init (rank {rank} of {nranks}, {method} bootstrap)"
    if mpi_comm is not None:
        _arrival(mpi_comm, seconds, what)  # every PE is here, or every PE that is raises naming who is not
    if group is not None:
        _placement.check(group, device)  # collective; the same PlacementError on every PE

    def run_init() -> None:
        _select_device(device)
        with _waiting_notice(notice_after, what, seconds):
            _bounded(lambda: flat.init_attr(flags, attr), device, seconds, what, _MISSING_MPI if mpi_comm else
                     _MISSING_UID, on_thread=method != "mpi" or _mpi_allows_threads())

    rt = _nv.start(params, run_init)
    _nv.set_deadline(seconds, watched)
    return rt


_given_up = ""  # why an initialisation was given up: its thread still waits inside NVSHMEM
_ARRIVED, _VERDICT = 0x4D42, 0x4D43  # MPI tags of the arrival check ("MB", "MC")
_VERDICT_GRACE = 5.0  # seconds a PE waits for PE 0's verdict beyond the deadline (PE 0 sends it at its deadline)
_sends: list[Any] = []  # the arrival check's sends, kept until the process ends (a peer may never take them)


_MISSING_UID = ("not every PE called init with this unique id and nranks (one never started, or died); which PEs "
                "are missing cannot be known over a unique id (init(mpi_comm=...) names them)")
_MISSING_MPI = "every PE arrived (checked over MPI), but one never finished NVSHMEM's initialisation (it died)"


def _bounded(init: Callable[[], None], device: int | None, seconds: float, what: str, missing: str, *,
             on_thread: bool) -> None:
    """`init()` (NVSHMEM's blocking initialisation) on a thread of its own, waited for with the core's
    bounded wait: `seconds` at most, Ctrl-C honoured. Given up, the thread is left inside NVSHMEM."""
    global _given_up
    if not on_thread:
        init()
        return
    target = _current_device() if device is None else device  # NVSHMEM initialises on the calling thread's
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def body() -> None:
        try:
            _select_device(target)
            init()
            outcome.append(None)
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=body, name="mpbind-nvshmem-init", daemon=True).start()
    try:
        _core.wait_until(done.is_set, seconds, what, f"{missing}. NVSHMEM cannot be interrupted: its "
                         "initialisation thread is left waiting, and the process should end")
    except BaseException as exc:
        _given_up = f"an earlier {what} was given up ({type(exc).__name__})"
        raise
    if outcome[0] is not None:
        raise outcome[0]


def _current_device() -> int | None:
    try:
        return _cuda.current_device()
    except CudaError:
        return None


def _mpi_allows_threads() -> bool:
    """Whether NVSHMEM's MPI bootstrap may run on another thread than the one that initialised MPI."""
    from mpi4py import MPI

    return bool(MPI.Query_thread() >= MPI.THREAD_SERIALIZED)


def _arrival(comm: Any, seconds: float, what: str) -> None:
    """Before NVSHMEM's initialisation: every PE of `comm` says over MPI that it arrived. PE 0 collects
    who did (at most `seconds`) and tells the others; when one never came, every PE that did raises
    WaitTimeoutError naming the missing ones. Non-blocking MPI, polled with the core's bounded wait."""
    from mpbind.errors import WaitTimeoutError

    rank, size = int(comm.Get_rank()), int(comm.Get_size())
    if size == 1:
        return

    def missing_text(missing: list[int]) -> str:
        return (f"PE{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {size} never called init "
                f"(checked over MPI before NVSHMEM's initialisation)")

    if rank == 0:
        arrived = [True] + [False] * (size - 1)
        pending = {r: comm.irecv(source=r, tag=_ARRIVED) for r in range(1, size)}
        _sends.extend(comm.isend(True, dest=r, tag=_ARRIVED) for r in range(1, size))  # PE 0 is here

        def everyone() -> bool:
            for r in [r for r, req in pending.items() if req.test()[0]]:
                arrived[r] = True
                del pending[r]
            return not pending

        try:
            _core.wait_until(everyone, seconds, what)
        except WaitTimeoutError:
            pass
        missing = [r for r in range(size) if not arrived[r]]
        for r in range(1, size):
            if arrived[r]:
                _sends.append(comm.isend(missing, dest=r, tag=_VERDICT))
        if missing:
            for req in pending.values():
                req.cancel()
            raise WaitTimeoutError(what, seconds, missing_text(missing))
        return
    _sends.append(comm.isend(True, dest=0, tag=_ARRIVED))
    # PE 0's window opened before its word that it arrived reached this PE: the verdict comes at most
    # `seconds` after that, and the time to send it (the grace) later.
    for tag, wait, detail in ((_ARRIVED, seconds, "PE 0, which collects who arrived, never did (or died); which "
                                                  "other PEs arrived cannot be known"),
                              (_VERDICT, seconds + _VERDICT_GRACE, "PE 0 arrived but never said who else did (it "
                                                                   "died)")):
        req = comm.irecv(source=0, tag=tag)
        box: list[Any] = []

        def answered(req: Any = req, box: list[Any] = box) -> bool:
            flag, message = req.test()
            if flag:
                box.append(message)
            return bool(flag)

        try:
            _core.wait_until(answered, wait, what, detail)
        except BaseException:
            req.cancel()
            raise
    if box[0]:
        raise WaitTimeoutError(what, seconds, missing_text(list(box[0])))


@contextlib.contextmanager
def _waiting_notice(after: float | None, what: str, seconds: float) -> Iterator[None]:
    """Say on stderr when the block (a wait for the other PEs, GIL released) lasts `after` seconds."""
    if after is None or after >= seconds:
        yield
        return

    def notice() -> None:
        sys.stderr.write(f"mpbind: {what} has waited {after:g} s for the other PEs. NVSHMEM's initialisation "
                         f"returns once every PE has called init() (the same unique id and nranks); it is given up "
                         f"after {seconds:g} s (timeout=, MPBIND_TIMEOUT), and Ctrl-C interrupts it\n")
        sys.stderr.flush()

    timer = threading.Timer(after, notice)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _never() -> None:
    raise AssertionError("unreachable: a live runtime is never initialised again")


def _select_device(device: int | None) -> None:
    """Make `device` current and its primary context exist: NVSHMEM initialises on the current context."""
    if device is not None:
        _cuda.set_device(device)
    # Only a warm-up: without a usable GPU, NVSHMEM's own initialisation reports the error.
    _cuda.ensure_context()


def runtime() -> Runtime:
    """The live runtime; ``UsageError`` before :func:`init` or after ``finalize()``."""
    return _nv.runtime()


def is_initialized() -> bool:
    """True while a runtime is live."""
    return bool(_nv.is_initialized())


def is_finalized() -> bool:
    """True once NVSHMEM was finalized in this process (it cannot be initialised again)."""
    return bool(_nv.is_finalized())


def finalize() -> None:
    """``runtime().finalize()`` (collective): release everything, then ``nvshmem_finalize``."""
    _nv.runtime().finalize()


def recent_operations() -> list[dict[str, Any]]:
    """The flight record of this PE's collectives on streams, kept while the watchdog watches them
    (``init(watchdog=True)``): the last 64, oldest first, as ``nccl.Communicator.recent_operations``."""
    return list(_nv.recent_operations())


def my_pe() -> int:
    """This PE's number in the world team."""
    return int(_nv.my_pe())


def n_pes() -> int:
    """The number of PEs."""
    return int(_nv.n_pes())


def device() -> int:
    """The GPU of this PE's NVSHMEM runtime: the device :func:`init` was given, else the calling
    thread's current one (0 where none is set). UsageError before :func:`init` and after :func:`finalize`."""
    rt = _nv.runtime()
    dev = rt.params.get("device", "current")
    if dev != "current":
        return int(dev)
    current = _current_device()
    return 0 if current is None else current


def pes_sharing_this_gpu() -> int:
    """How many PEs of the running job use this PE's GPU (NVSHMEM's same-GPU team; 1 before init).
    The same on every PE: placements with a different number of PEs per GPU are refused at init."""
    from mpbind.bindings import nvshmem as flat

    if flat.init_status() < flat.InitStatus.IS_INITIALIZED:
        return 1
    return max(1, flat.team_n_pes(flat.Team.SAME_GPU))


# --- arrays ----------------------------------------------------------------------------------


# SymmetricArray and PeerArray are the core's types (the hot calls read them by C++ type): an array
# is made over its allocation by _nv.symmetric_array, its description checked once, there.
SymmetricArray = _nv.SymmetricArray
PeerArray = _nv.PeerArray


def _is_index(value: Any) -> bool:
    """An int or an integer of another library (NumPy's), not a bool."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return False
    try:
        operator.index(value)
    except Exception:  # noqa: BLE001 - an __index__ that fails, whatever it raises: not an integer
        return False
    return True


def _shape_of(shape: int | Sequence[int]) -> tuple[int, ...]:
    try:
        given = (shape,) if _is_index(shape) else _args.sequence(shape, "shape", _args.MAX_NDIM)
    except TypeError:
        given = (None,)  # refused below, as an extent that is not an int is
    dims = tuple(operator.index(d) if _is_index(d) else -1 for d in given)
    if any(d < 0 for d in dims):
        raise UsageError(f"shape must be non-negative ints, not {_args.shown(shape)}")
    if math.prod(dims) == 0:
        raise UsageError(f"cannot allocate an empty symmetric array (shape {dims})")
    return dims


def _allocate(shape: int | Sequence[int], dtype: Any, zero: bool, alignment: int) -> SymmetricArray:
    dims = _shape_of(shape)
    name = dtype_name(dtype)
    align = operator.index(alignment) if _is_index(alignment) else -1
    if not 0 <= align <= 2**63 or align & (align - 1):
        raise UsageError(f"alignment must be 0 or a power of two (at most 2**63), not {_args.shown(alignment)}")
    # nvshmem_malloc takes a size_t; DLPack and the array interface describe the array in int64.
    nbytes = _args.product((*dims, itemsize(name)), f"a symmetric {name} array of shape {dims}: its byte size")
    gpu = device()  # also UsageError before init / after finalize
    return _nv.symmetric_array(_nv.allocate(nbytes, zero, align), dims, name, gpu)


def empty(shape: int | Sequence[int], dtype: Any = "float32", *, alignment: int = 0) -> SymmetricArray:
    """Uninitialised symmetric memory: ``nvshmem_malloc``, or ``nvshmem_align`` with an alignment.
    Collective: every PE allocates the same shape and dtype, in the same order."""
    return _allocate(shape, dtype, False, alignment)


def zeros(shape: int | Sequence[int], dtype: Any = "float32") -> SymmetricArray:
    """Zeroed symmetric memory (``nvshmem_calloc``). Collective, like :func:`empty`."""
    return _allocate(shape, dtype, True, 0)


def register(buffer: BufferLike) -> Registration:
    """Register local device memory (``nvshmemx_buffer_register``) so that it can be the local side
    of RMA on remote transports. ``buffer`` is a C-contiguous device array or ``(ptr, nbytes)``.
    Registering the same range again returns another reference; the last one closed unregisters."""
    ptr, nbytes, owner = device_span(buffer)
    return _nv.runtime().register(ptr, nbytes, owner)


# --- argument checks -------------------------------------------------------------------------


def _check_pe(pe: Any, what: str, n: int | None = None) -> int:
    if n is None:
        n = int(_nv.runtime().n_pes)
    number = operator.index(pe) if _is_index(pe) else -1
    if not 0 <= number < n:
        raise UsageError(f"{what} must be a PE number in [0, {n}), not {_args.shown(pe)}")
    return number


