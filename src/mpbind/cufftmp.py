"""cuFFTMp objects that own their library resources: plans, descriptors and reshapes.

A :class:`Plan` is made for the whole distributed array on every PE (an mpi4py
communicator, or ``None`` when NVSHMEM is already initialised on its world team)::

    from mpbind import cufftmp
    plan = cufftmp.Plan.create_3d(MPI.COMM_WORLD, (nx, ny, nz), cufftmp.Type.C2C, stream=s)
    plan.exec(local, direction=cufftmp.FORWARD)   # local: an NVSHMEM-backed device array
    plan.close()                                  # collective

Every object is a context manager with an idempotent :meth:`close`; use after close
raises :class:`~mpbind.errors.UsageError`. Releasing a plan, a descriptor or a made
reshape is collective (cuFFTMp frees NVSHMEM memory): an object dropped unclosed warns
``ResourceWarning`` and waits until :func:`mpbind.drain` runs on every PE (a plan
without a communicator, or a reshape not yet made, holds nothing collective and is
released at once). Closing a plan frees its descriptors first.

Layouts of plans made by :meth:`Plan.create_2d`/:meth:`Plan.create_3d` (cuFFTMp's
built-in slabs, row-major, ``cufftXtSetSubformatDefault(INPLACE, INPLACE_SHUFFLED)``):
the forward input is X-slabs (PE k owns planes ``x0:x1``, the first ``X % N`` PEs one
more), the forward output Y-slabs; R2C/D2Z input pads Z to ``2*(Z//2+1)`` reals.
:meth:`Plan.local_shapes` gives this PE's shapes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# drain, queued: process-wide (mpbind.drain(), mpbind.queued()), kept here as aliases.
from mpbind import _core, drain, queued
from mpbind._infra import args as _args
from mpbind._infra import interop as _interop
from mpbind._infra import placement as _placement
from mpbind._infra.owned import Owned
from mpbind.bindings.cufftmp import (
    FORWARD,
    INVERSE,
    CommType,
    CopyType,
    Result,
    SubFormat,
    Type,
)
from mpbind.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from typing import Any

    import numpy as np

    from mpbind.typing import Array, DTypeLike, Stream

__all__ = [
    "FORWARD",
    "INVERSE",
    "CommType",
    "CopyType",
    "Descriptor",
    "Plan",
    "Reshape",
    "Result",
    "SubFormat",
    "Type",
    "drain",
    "queued",
]

_cf = _core.cufftmp

Shape = tuple[int, ...]
Box = tuple[Sequence[int], Sequence[int]]  # [lower, upper) global corners
Side = tuple[str, Shape, Shape, str]  # a PE's piece for Plan.executor: dtype, shape, storage, box text

# (input dtype, output dtype) of the forward (or only) direction of each type.
_DTYPES: dict[Type, tuple[str, str]] = {
    Type.C2C: ("complex64", "complex64"),
    Type.Z2Z: ("complex128", "complex128"),
    Type.R2C: ("float32", "complex64"),
    Type.D2Z: ("float64", "complex128"),
    Type.C2R: ("complex64", "float32"),
    Type.Z2D: ("complex128", "float64"),
}
_COMPLEX = (Type.C2C, Type.Z2Z)
_REAL_INPUT = (Type.R2C, Type.D2Z)  # FORWARD only
_REAL_OUTPUT = (Type.C2R, Type.Z2D)  # INVERSE only


def _fft_type(value: Any) -> Type:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"fft_type must be a cufftmp.Type, not {type(value).__name__}")
    try:
        return Type(value)
    except ValueError:
        raise UsageError(f"fft_type {value} is not a cufftmp.Type ({', '.join(t.name for t in Type)})") from None


def _direction(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"direction must be FORWARD (-1) or INVERSE (1), not {type(value).__name__}")
    if value not in (FORWARD, INVERSE):
        raise UsageError(f"direction must be FORWARD (-1) or INVERSE (1), got {value}")
    return int(value)


def _resolve_comm(comm: Any) -> tuple[CommType, int, Any]:
    """(comm type, MPI_Comm address, object to keep alive) of ``comm``.

    cuFFTMp takes an ``MPI_Comm*`` and keeps using it until the plan is destroyed, so
    an mpi4py communicator is resolved to its handle's address and kept alive."""
    if comm is None:
        return CommType.NONE, 0, None
    if isinstance(comm, bool):
        raise TypeError("comm must be an mpi4py communicator, an MPI_Comm address (int) or None")
    if isinstance(comm, int):
        if comm == 0:
            raise UsageError("comm address is 0 (pass None for CommType.NONE)")
        return CommType.MPI, _args.checked(comm, "comm (an MPI_Comm address)", _args.SIZE_MAX), None
    try:
        from mpi4py import MPI
    except ImportError:
        raise TypeError(f"comm must be an MPI_Comm address (int) or None, not {type(comm).__name__} "
                        "(mpi4py is not installed: pip install 'mpbind[mpi]')") from None
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, an MPI_Comm address (int) or None, "
                        f"not {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise UsageError("comm is MPI.COMM_NULL")
    return CommType.MPI, int(MPI._addressof(comm)), comm


def _check_placement(comm: Any) -> None:
    """Before a plan or a reshape is made over an mpi4py communicator (cuFFTMp initialises NVSHMEM then,
    if it is not yet), the PEs compare their GPUs over it: PlacementError on every PE where NVSHMEM
    would hang."""
    if comm is not None and not isinstance(comm, int):
        from mpbind.process_group import MPIProcessGroup

        _placement.check(MPIProcessGroup(comm), None, "cuFFTMp (through NVSHMEM)")


def _subformat(value: Any, name: str) -> int:
    v = _args.integer(value, name)
    try:
        return int(SubFormat(v))
    except ValueError:
        raise UsageError(f"{name} must be a cufftmp.SubFormat ({', '.join(f.name for f in SubFormat)}), "
                         f"got {v}") from None


def _ints(values: Sequence[int], name: str) -> list[int]:
    """Corners or strides, as cuFFTMp takes them: long long."""
    return [_args.integer(v, f"{name}[{i}]", minimum=-_args.INT64_MAX - 1, maximum=_args.INT64_MAX)
            for i, v in enumerate(_sequence(values, name))]


def _sequence(values: Any, name: str) -> tuple[Any, ...]:
    """`values` (any iterable but a string, of at most 64 items) as a tuple, or TypeError naming `name`."""
    return _args.sequence(values, name, _args.MAX_NDIM)


def _rank_size(comm: Any) -> tuple[int, int] | None:
    """(rank, size) of an mpi4py communicator; None when only an address is known."""
    if comm is None or isinstance(comm, int):
        return None
    return int(comm.Get_rank()), int(comm.Get_size())


def _shape(shape: Sequence[int], ndim: int) -> Shape:
    try:
        dims = _args.sequence(shape, "shape", _args.MAX_NDIM)
    except TypeError:
        raise TypeError(f"shape must be a sequence of {ndim} ints, not {type(shape).__name__}") from None
    if len(dims) != ndim:
        raise UsageError(f"shape must have {ndim} extents, got {len(dims)}: {dims}")
    # cufftMakePlan2d/3d and cufftMpMakePlanDecomposition take int extents.
    return tuple(_args.integer(n, f"shape[{i}]", minimum=1, maximum=_args.INT_MAX) for i, n in enumerate(dims))


def _ndim(values: Any, name: str) -> int:
    """How many extents or coordinates `values` holds (a sequence of ints)."""
    return len(_sequence(values, name))


def _box(box: Box, ndim: int, what: str) -> tuple[list[int], list[int]]:
    try:
        lower, upper = box
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a (lower, upper) pair of corners") from None
    lo, up = _ints(lower, f"{what} lower corner"), _ints(upper, f"{what} upper corner")
    if len(lo) != ndim or len(up) != ndim:
        raise UsageError(f"{what} corners must have {ndim} coordinates, got {lo} and {up}")
    if any(a < 0 or b < a for a, b in zip(lo, up, strict=True)):
        raise UsageError(f"{what} [{lo}, {up}) is not a box (need 0 <= lower <= upper)")
    return lo, up


def _box_strides(lower: Sequence[int], upper: Sequence[int]) -> list[int]:
    from mpbind import distributions  # here: it imports typing and dataclasses, which this module does not

    extents = [up - lo for lo, up in zip(lower, upper, strict=True)]
    return list(distributions.row_major_strides(extents, f"the box [{list(lower)}, {list(upper)})'s element count"))


def _boxes(input_box: Box, output_box: Box, ndim: int, input_strides: Sequence[int] | None,
           output_strides: Sequence[int] | None) -> tuple[list[int], ...]:
    """(lower, upper, strides) of the input box, then of the output box; strides default to row-major."""
    lo_in, up_in = _box(input_box, ndim, "input_box")
    lo_out, up_out = _box(output_box, ndim, "output_box")
    st_in = _ints(input_strides, "input_strides") if input_strides is not None else _box_strides(lo_in, up_in)
    st_out = _ints(output_strides, "output_strides") if output_strides is not None else _box_strides(lo_out, up_out)
    return lo_in, up_in, st_in, lo_out, up_out, st_out


def _in_subformats(layout: dict[int, tuple[Shape, Shape]] | None, t: Type,
                   subformats: tuple[int, int] | None) -> dict[int, tuple[Shape, Shape]] | None:
    """The built-in slabs' `layout` (X-slabs in, Y-slabs out) as `subformats` lay them out: swapped
    (XT_FORMAT_INPLACE_SHUFFLED forward), a forward transform reads Y-slabs and writes X-slabs; a real
    transform's padding does not swap, so its layout is then not known here (None)."""
    if layout is None or subformats is None or subformats[0] != SubFormat.XT_FORMAT_INPLACE_SHUFFLED:
        return layout
    if t not in _COMPLEX:
        return None
    return {FORWARD: layout[INVERSE], INVERSE: layout[FORWARD]}


class Plan(Owned):
    """A distributed FFT plan over a cufftHandle (``cufftCreate``/``cufftDestroy``).

    Build one step by step (:meth:`attach_comm`, :meth:`set_stream`,
    :meth:`make_plan_3d`, ...) or in one call with :meth:`create_2d`,
    :meth:`create_3d` or :meth:`create_decomposition`. Destruction is collective once
    a communicator is attached."""

    def __init__(self) -> None:
        self._core = _cf.Plan()
        self._comm: Any = None
        # Per-direction local shapes (input, output), when the layout is known.
        self._layout: dict[int, tuple[Shape, Shape]] | None = None
        self._distribution: tuple[list[int], list[int], list[int], list[int]] | None = None

    # --- one-call construction ---

    @classmethod
    def create_2d(cls, comm: Any, shape: Sequence[int], fft_type: int, *, stream: Stream = None) -> Plan:
        """A 2-D plan on the built-in slabs: attach ``comm`` (mpi4py communicator, MPI_Comm
        address, or None for NVSHMEM's world), set the stream, make it (collective)."""
        return cls._made(comm, _shape(shape, 2), _fft_type(fft_type), stream, None, None)

    @classmethod
    def create_3d(cls, comm: Any, shape: Sequence[int], fft_type: int, *, stream: Stream = None) -> Plan:
        """A 3-D plan on the built-in slabs: attach ``comm`` (mpi4py communicator, MPI_Comm
        address, or None for NVSHMEM's world), set the stream, make it (collective)."""
        return cls._made(comm, _shape(shape, 3), _fft_type(fft_type), stream, None, None)

    @classmethod
    def create(cls, comm: Any, shape: Sequence[int], fft_type: int, *,
               subformats: tuple[int, int] | None = None, stream: Stream = None) -> Plan:
        """A 2-D or 3-D plan on the built-in slabs, made in one call (collective): attach ``comm``
        (mpi4py communicator, MPI_Comm address, or None for NVSHMEM's world), set the stream, set
        ``subformats`` (cufftXtSetSubformatDefault's (forward, inverse); default
        ``(XT_FORMAT_INPLACE, XT_FORMAT_INPLACE_SHUFFLED)``: X-slabs in, Y-slabs out; swapped, a
        forward transform reads Y-slabs and writes X-slabs), make it."""
        t = _fft_type(fft_type)
        ndim = _ndim(shape, "shape")
        if ndim not in (2, 3):
            raise UsageError(f"cuFFTMp plans are 2-D or 3-D, got shape {tuple(shape)}")
        formats = None
        if subformats is not None:
            try:
                forward, inverse = subformats
            except (TypeError, ValueError):
                raise TypeError("subformats must be a (forward, inverse) pair of cufftmp.SubFormat") from None
            formats = (_subformat(forward, "subformats[0]"), _subformat(inverse, "subformats[1]"))
        return cls._made(comm, _shape(shape, ndim), t, stream, None, formats)

    @classmethod
    def create_decomposition(cls, comm: Any, shape: Sequence[int], fft_type: int, input_box: Box,
                             output_box: Box, *, input_strides: Sequence[int] | None = None,
                             output_strides: Sequence[int] | None = None, stream: Stream = None) -> Plan:
        """A 2-D or 3-D plan whose forward transform goes from this PE's ``input_box`` to its
        ``output_box`` (``[lower, upper)`` global corners; the inverse goes back). Strides
        default to row-major boxes. (cufftMpMakePlanDecomposition.)"""
        t = _fft_type(fft_type)
        ndim = _ndim(shape, "shape")
        if ndim not in (2, 3):
            raise UsageError(f"cuFFTMp plans are 2-D or 3-D, got shape {tuple(shape)}")
        dims = _shape(shape, ndim)
        boxes = _boxes(input_box, output_box, len(dims), input_strides, output_strides)
        return cls._made(comm, dims, t, stream, boxes, None)

    @classmethod
    def _made(cls, comm: Any, dims: Shape, t: Type, stream: Stream, boxes: tuple[list[int], ...] | None,
              subformats: tuple[int, int] | None) -> Plan:
        """Attach `comm`, set `stream`, set the layout (`boxes`: lower, upper, strides of the input
        box, then of the output box; None: the built-in slabs in `subformats`, by default X-slabs in
        and Y-slabs out) and make the plan, all collective: the one builder of every create_*.

        When a step fails no reference to the core plan is left, not even in the traceback, so its
        lifetime row applies: with a communicator attached its release waits for drain() on every
        PE (the other PEs may not have failed), without one it is released at once."""
        comm_type, address, keep = _resolve_comm(comm)
        _check_placement(keep)
        core = _cf.Plan()
        try:
            core.attach_comm(comm_type, address, keep)
            if stream is not None:
                core.set_stream(stream)
            if boxes is None:
                # cufftExec* on raw pointers reads X-slabs and writes Y-slabs (and back), unless swapped.
                forward, inverse = subformats or (SubFormat.XT_FORMAT_INPLACE, SubFormat.XT_FORMAT_INPLACE_SHUFFLED)
                core.set_subformat_default(forward, inverse)
            else:
                lo_in, up_in, st_in, lo_out, up_out, st_out = boxes
                core.set_distribution(lo_in, up_in, lo_out, up_out, st_in, st_out)
            if len(dims) == 2:
                core.make_plan_2d(dims[0], dims[1], t)
            else:
                core.make_plan_3d(dims[0], dims[1], dims[2], t)
        except BaseException:
            del core
            raise
        self = cls._over(core)
        self._comm = comm
        self._distribution = None if boxes is None else (boxes[0], boxes[1], boxes[3], boxes[4])
        self._layout = _in_subformats(self._local_layout(dims, t), t, subformats)
        return self

    # --- step by step ---

    def attach_comm(self, comm: Any) -> None:
        """cufftMpAttachComm: ``comm`` is an mpi4py communicator (kept alive with the plan), an
        MPI_Comm address (int, ``MPI._addressof(comm)``) or None (CommType.NONE)."""
        comm_type, address, keep = _resolve_comm(comm)
        self._core.attach_comm(comm_type, address, keep)
        self._comm = comm

    def set_stream(self, stream: Stream) -> None:
        """cufftSetStream: an int, None (the default stream), or a CuPy/PyTorch/``__cuda_stream__`` stream."""
        self._core.set_stream(stream)

    def set_subformat_default(self, forward: int, inverse: int) -> None:
        """cufftXtSetSubformatDefault (before the plan is made)."""
        formats = _subformat(forward, "forward"), _subformat(inverse, "inverse")
        self._core.set_subformat_default(*formats)

    def set_distribution(self, lower_input: Sequence[int], upper_input: Sequence[int],
                         lower_output: Sequence[int], upper_output: Sequence[int],
                         strides_input: Sequence[int] | None = None,
                         strides_output: Sequence[int] | None = None) -> None:
        """cufftXtSetDistribution: this PE's input and output boxes (before the plan is made)."""
        corners = (_ints(lower_input, "lower_input"), _ints(upper_input, "upper_input"),
                   _ints(lower_output, "lower_output"), _ints(upper_output, "upper_output"))
        self._core.set_distribution(*corners,
                                    None if strides_input is None else _ints(strides_input, "strides_input"),
                                    None if strides_output is None else _ints(strides_output, "strides_output"))
        self._distribution = corners

    def make_plan_2d(self, nx: int, ny: int, fft_type: int) -> int:
        """cufftMakePlan2d (collective with a communicator); returns the work size in bytes."""
        return self._make(_shape((nx, ny), 2), _fft_type(fft_type))

    def make_plan_3d(self, nx: int, ny: int, nz: int, fft_type: int) -> int:
        """cufftMakePlan3d (collective with a communicator); returns the work size in bytes."""
        return self._make(_shape((nx, ny, nz), 3), _fft_type(fft_type))

    def _make(self, dims: Shape, t: Type) -> int:
        _check_placement(self._comm)
        if len(dims) == 2:
            work = int(self._core.make_plan_2d(dims[0], dims[1], t))
        else:
            work = int(self._core.make_plan_3d(dims[0], dims[1], dims[2], t))
        self._layout = self._local_layout(dims, t)
        return work

    def _local_layout(self, dims: Shape, t: Type) -> dict[int, tuple[Shape, Shape]] | None:
        if self._distribution is not None:
            if t not in _COMPLEX:
                return None  # real-to-complex boxes carry their own padding rules
            lo_in, up_in, lo_out, up_out = self._distribution
            a = tuple(u - lo for lo, u in zip(lo_in, up_in, strict=True))
            b = tuple(u - lo for lo, u in zip(lo_out, up_out, strict=True))
            return {FORWARD: (a, b), INVERSE: (b, a)}
        where = _rank_size(self._comm)
        if where is None:
            return None
        from mpbind import distributions  # here: it imports typing and dataclasses, which this module does not

        rank, size = where
        if len(dims) == 2:
            if t not in _COMPLEX:
                return None
            nx, ny = dims
            x0, x1 = distributions.slab(nx, size, rank)
            y0, y1 = distributions.slab(ny, size, rank)
            a2: Shape = (x1 - x0, ny)
            b2: Shape = (nx, y1 - y0)
            return {FORWARD: (a2, b2), INVERSE: (b2, a2)}
        nx, ny, nz = dims
        x0, x1 = distributions.slab(nx, size, rank)
        y0, y1 = distributions.slab(ny, size, rank)
        if t in _COMPLEX:
            xs: Shape = (x1 - x0, ny, nz)
            ys: Shape = (nx, y1 - y0, nz)
            return {FORWARD: (xs, ys), INVERSE: (ys, xs)}
        real_x = distributions.padded_real_shape((x1 - x0, ny, nz))  # stored padded: the transform is in place
        cplx_y = distributions.hermitian_shape((nx, y1 - y0, nz))
        if t in _REAL_INPUT:
            return {FORWARD: (real_x, cplx_y)}
        return {INVERSE: (cplx_y, real_x)}

    # --- queries ---

    @property
    def handle(self) -> int:
        """The cufftHandle, for the flat bindings."""
        return int(self._live.handle)

    @property
    def fft_type(self) -> Type | None:
        """The type it was made with, or None before it is made."""
        t = self._live.fft_type
        return None if t is None else Type(t)

    @property
    def shape(self) -> Shape:
        """The global extents (empty before it is made)."""
        return tuple(self._live.shape)

    @property
    def work_size(self) -> int:
        return int(self._live.work_size)

    @property
    def comm(self) -> Any:
        """The communicator given to :meth:`attach_comm` (None for CommType.NONE or none yet)."""
        return self._comm

    def local_shapes(self, direction: int) -> tuple[Shape, Shape] | None:
        """This PE's (input, output) local shapes for ``direction``, as stored (R2C input padded);
        None when the layout is not known here (a communicator given as an address, real-to-complex
        boxes, 2-D real transforms)."""
        d = _direction(direction)
        self._live  # noqa: B018 - raises UsageError once closed
        if self._layout is None:
            return None
        return self._layout.get(d)

    def dtypes(self, direction: int | None = None) -> tuple[str, str]:
        """(input dtype, output dtype) names of ``direction`` for the made plan."""
        t = self.fft_type
        if t is None:
            raise UsageError("the plan is not made yet (call make_plan_2d/3d or a create_* method)")
        self._implied_direction(t, direction)  # checks a real plan's direction
        return _DTYPES[t]  # complex-to-complex plans keep their dtype both ways

    @staticmethod
    def _implied_direction(t: Type, direction: int | None) -> int:
        if direction is None:
            if t in _REAL_INPUT:
                return FORWARD
            if t in _REAL_OUTPUT:
                return INVERSE
            raise UsageError(f"a {t.name} plan needs direction=FORWARD or INVERSE")
        d = _direction(direction)
        if t in _REAL_INPUT and d != FORWARD:
            raise UsageError(f"a {t.name} plan only transforms FORWARD")
        if t in _REAL_OUTPUT and d != INVERSE:
            raise UsageError(f"a {t.name} plan only transforms INVERSE")
        return d

    # --- execution ---

    def exec(self, input: Array | int, output: Array | int | None = None, direction: int | None = None) -> None:
        """Transform ``input`` into ``output`` (None: in place) on the plan's stream.

        Arrays (CuPy, PyTorch, anything with ``__cuda_array_interface__`` or DLPack) must be
        C-contiguous device memory from NVSHMEM (cuFFTMp's requirement), of the plan's dtypes
        (C2C complex64, Z2Z complex128, R2C float32 -> complex64, ...) and, where the layout is
        known, large enough for this PE's part. Ints are taken as raw device pointers, unchecked.
        ``direction`` is implied for real-to-complex (FORWARD) and complex-to-real (INVERSE) plans."""
        self._core.exec(input, output, direction, self._layout)

    def malloc(self, format: int = SubFormat.XT_FORMAT_INPLACE) -> Descriptor:
        """cufftXtMalloc (collective): this PE's part of the distributed data, in ``format``
        (XT_FORMAT_INPLACE for slabs, XT_FORMAT_DISTRIBUTED_INPUT for boxes)."""
        return Descriptor._over(self._live.malloc(_subformat(format, "format")))

    def executor(self, descriptor: Descriptor, sides: dict[int, tuple[Side, Side]], *, need: int,
                 via_descriptor: bool, device: int, name: str) -> _core.cufftmp.Executor:
        """A made plan's in-place transform as one call per execute (for plans built on this one, such as
        :class:`mpbind.fft.FFTPlan`): an object whose ``execute(x, room, out, direction)`` checks `x` and
        `out` against this PE's `sides` (``{direction: (input, output)}``, each ``(dtype, shape,
        storage, box text)``: the piece's extents and the extents it is stored with, a padded last axis
        included), copies `x` into `descriptor`'s buffer unless it can be transformed where it is (stored
        so, writable, with `need` bytes of NVSHMEM memory from its start), runs the transform and copies
        the result into `out`, on the plan's stream. `via_descriptor`: cufftXtExecDescriptor on
        `descriptor` pointed at the memory (a plan made with boxes), else cufftExec* on the pointer.
        `device` is where the arrays must be; `name` names the plan in messages."""
        if not isinstance(descriptor, Descriptor):
            raise TypeError(f"descriptor must be a cufftmp.Descriptor, not {type(descriptor).__name__}")
        executor: _core.cufftmp.Executor = self._live.executor(
            descriptor._core, sides, _args.index(need, "need"), bool(via_descriptor), _args.integer(device, "device"),
            str(name))
        return executor

    def exec_descriptor(self, input: Descriptor, output: Descriptor | None = None,
                        direction: int | None = None) -> None:
        """cufftXtExecDescriptor (collective); ``output`` None is in place."""
        if not isinstance(input, Descriptor) or not (output is None or isinstance(output, Descriptor)):
            raise TypeError("exec_descriptor takes cufftmp.Descriptor objects")
        t = self.fft_type
        if t is None:
            raise UsageError("exec_descriptor: the plan is not made yet")
        d = self._implied_direction(t, direction)
        self._live.exec_descriptor(input._core, None if output is None else output._core, d)

    # --- lifetime (close, closed, serial, with: Owned) ---

    @property
    def _live(self) -> Any:
        """The core plan, checked open."""
        if self._core.closed:
            raise UsageError("cufftmp.Plan is closed")
        return self._core

    def destroy(self) -> None:
        """Same as ``close()``."""
        self.close()


class Descriptor(Owned):
    """Distributed data from :meth:`Plan.malloc` (cufftXtMalloc). Freeing it (cufftXtFree) is
    collective; closing its plan frees it first."""

    _core: Any

    def __init__(self) -> None:
        raise TypeError("Descriptors come from Plan.malloc()")

    @property
    def ptr(self) -> int:
        """The cudaLibXtDesc*, for the flat bindings."""
        return int(self._core.ptr)

    @property
    def data(self) -> int:
        """Device pointer to this PE's part."""
        return int(self._core.data)

    @property
    def nbytes(self) -> int:
        """Bytes of this PE's part."""
        return int(self._core.nbytes)

    @property
    def subformat(self) -> SubFormat | int:
        """The current layout (an exec changes it)."""
        value = int(self._core.subformat)
        try:
            return SubFormat(value)
        except ValueError:
            return value

    def copy_from_host(self, array: np.ndarray) -> None:
        """cufftXtMemcpy HOST_TO_DEVICE of this PE's part from ``array``, a C-contiguous NumPy array
        of at least :attr:`nbytes` bytes (cuFFTMp reads that many). Not redistributed."""
        buf = self._host(array, "array", writable=False)
        self._core.memcpy(buf.ctypes.data, CopyType.HOST_TO_DEVICE)

    def copy_to_host(self, out: np.ndarray | None = None) -> np.ndarray:
        """cufftXtMemcpy DEVICE_TO_HOST of this PE's part into ``out`` (at least :attr:`nbytes`
        bytes, C-contiguous) or a new uint8 array; returns it."""
        if out is None:
            import numpy as np  # only here: the caller asked for a NumPy array

            buf = np.empty(self.nbytes, np.uint8)
        else:
            buf = self._host(out, "out", writable=True)
        self._core.memcpy(buf.ctypes.data, CopyType.DEVICE_TO_HOST)
        return buf

    def copy_from(self, src: Descriptor) -> None:
        """cufftXtMemcpy DEVICE_TO_DEVICE from another descriptor of the same layout."""
        if not isinstance(src, Descriptor):
            raise TypeError(f"src must be a cufftmp.Descriptor, not {type(src).__name__}")
        self._core.copy_from(src._core)

    def _host(self, array: Any, what: str, *, writable: bool) -> np.ndarray:
        if "numpy" not in sys.modules:  # then `array` cannot be a NumPy array
            raise TypeError(f"{what} must be a NumPy array, not {type(array).__name__}")
        import numpy as np  # loaded already: a lookup

        if not isinstance(array, np.ndarray):
            raise TypeError(f"{what} must be a NumPy array, not {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise UsageError(f"{what} must be C-contiguous")
        if writable and not array.flags.writeable:
            raise UsageError(f"{what} is read-only")
        need = self.nbytes
        if array.nbytes < need:
            raise UsageError(f"{what} holds {array.nbytes} bytes; the descriptor's part is {need} bytes")
        return array



class Reshape(Owned):
    """A redistribution between two box layouts (cufftMpCreateReshape). Making and executing it
    are collective, and so is its release once made."""

    def __init__(self) -> None:
        self._core = _cf.Reshape()

    @classmethod
    def create(cls, comm: Any, dtype: DTypeLike | int, input_box: Box, output_box: Box, *,
               input_strides: Sequence[int] | None = None,
               output_strides: Sequence[int] | None = None) -> Reshape:
        """A made reshape of elements of ``dtype`` (a dtype, or an element size in bytes) from this
        PE's ``input_box`` to its ``output_box`` (``[lower, upper)`` global corners, 3-D); strides
        default to row-major boxes."""
        r = cls()
        r.make(comm, dtype, input_box, output_box, input_strides=input_strides, output_strides=output_strides)
        return r

    def make(self, comm: Any, dtype: DTypeLike | int, input_box: Box, output_box: Box, *,
             input_strides: Sequence[int] | None = None, output_strides: Sequence[int] | None = None) -> None:
        """cufftMpMakeReshape (collective); see :meth:`create`."""
        if isinstance(dtype, bool):
            raise TypeError("dtype must be a dtype or an element size in bytes")
        element_size = _args.index(dtype, "element size") if isinstance(dtype, int) else _interop.itemsize(dtype)
        if element_size < 1:
            raise UsageError(f"element size must be >= 1 byte, got {element_size}")
        _args.checked(element_size, "element size", _args.INT64_MAX)
        ndim = _ndim(input_box[0] if isinstance(input_box, (tuple, list)) and input_box else None,
                     "input_box's lower corner")
        lo_in, up_in, st_in, lo_out, up_out, st_out = _boxes(input_box, output_box, ndim, input_strides,
                                                             output_strides)
        for what, lo, up in (("input", lo_in, up_in), ("output", lo_out, up_out)):  # what exec() copies
            _args.product((*(u - a for a, u in zip(lo, up, strict=True)), element_size), f"the {what} box's bytes")
        comm_type, address, keep = _resolve_comm(comm)
        _check_placement(keep)
        self._core.make(element_size, lo_in, up_in, st_in, lo_out, up_out, st_out, comm_type, address, keep)

    @property
    def element_size(self) -> int:
        return int(self._core.element_size)

    @property
    def workspace_size(self) -> int:
        """cufftMpGetReshapeSize: bytes of NVSHMEM workspace :meth:`exec` needs."""
        return int(self._core.workspace_size())

    def exec(self, output: Array | int, input: Array | int, workspace: Array | int | None = None,
             stream: Stream = None) -> None:
        """cufftMpExecReshapeAsync (collective) on ``stream``: ``input`` and ``output`` are NVSHMEM
        device arrays (checked to hold this PE's boxes) or int pointers; ``workspace`` (NVSHMEM,
        :attr:`workspace_size` bytes) is required when that size is not 0."""
        if not self._core.made:
            raise UsageError("exec: the reshape is not made yet (call make first)")
        esize = self.element_size
        out_ptr = self._bytes(output, "output", int(self._core.output_elements) * esize, writable=True)
        in_ptr = self._bytes(input, "input", int(self._core.input_elements) * esize, writable=False)
        need = self.workspace_size
        work = 0
        if workspace is not None:
            work = self._bytes(workspace, "workspace", need, writable=True)
        elif need:
            raise UsageError(f"exec needs an NVSHMEM workspace of {need} bytes (see workspace_size)")
        self._core.exec(out_ptr, in_ptr, work, stream)

    @staticmethod
    def _bytes(obj: Any, what: str, need: int, *, writable: bool) -> int:
        if isinstance(obj, bool):
            raise TypeError(f"{what} must be a device array or an int pointer")
        if isinstance(obj, int):
            return _args.checked(obj, f"{what} (a device pointer)", _args.SIZE_MAX)
        info = _interop.device_array(obj, what, writable=writable)
        if info.nbytes < need:
            raise UsageError(f"{what} holds {info.nbytes} bytes; this PE's box needs {need}")
        return info.ptr

    def destroy(self) -> None:
        """Same as ``close()``."""
        self.close()
