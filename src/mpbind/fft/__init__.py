"""Distributed FFTs and reshapes planned from distributions: arrays in, arrays out, on every GPU.

::

    from mpi4py import MPI
    from mpbind import fft, distributions as dist

    comm = MPI.COMM_WORLD
    p = fft.plan(comm, (nx, ny, nz), "complex64")           # X-slabs in, Y-slabs out (cuFFTMp's own)
    y = p.execute(x)                                        # x: this rank's X-slab (torch, CuPy, DLPack)
    back = p.execute(y, direction=fft.INVERSE)              # Y-slabs back to X-slabs (unnormalised)

    r = fft.plan(comm, (nx, ny, nz), "float32", output=dist.Split((nx, ny, nz // 2 + 1), n, axis=2))
    half = r.execute(real_slab)                             # R2C: the Hermitian half, Z-slabs

    move = fft.plan_reshape(comm, dist.Split(shape, n, 0), dist.Pencils(shape, (2, 2)), "int16")
    mine = move.execute(piece)

A plan says what each rank gives and gets (:attr:`FFTPlan.input_shape`, ``output_shape``,
``input_dtype``, ``output_dtype``, :meth:`FFTPlan.explain`) and runs again on new data. The input
and output distributions are :mod:`mpbind.distributions` values of the global arrays (for R2C the
output's last axis is ``n // 2 + 1``; for C2R that is the input's): cuFFTMp's slabs by default,
any box per rank otherwise (:mod:`mpbind.fft._planner` says how each pair runs).

Arrays. cuFFTMp transforms in place in NVSHMEM memory. ``execute(x)`` takes this rank's piece as
a device array of any library (PyTorch, CuPy, DLPack, ``__cuda_array_interface__``), C-contiguous,
of the plan's dtype and local shape:

* an array in mpbind's NVSHMEM memory (:func:`mpbind.nvshmem.empty`, or a view into it) with room
  for the plan's buffer from its start (:attr:`FFTPlan.buffer_bytes`: the larger side, stored) is
  transformed where it is, copy-free: it then holds the result, and the returned view is over it;
* any other array is copied into the plan's own buffer (and left as it was); the returned view is
  over that buffer, valid until the next ``execute``; pass ``out=`` to have it copied out;
* ``x=None`` transforms what the plan's own buffer holds (fill it through :meth:`FFTPlan.input_view`).

Results are :class:`DeviceView` objects (``__cuda_array_interface__``, and DLPack where they are
contiguous): ``torch.as_tensor(y, device="cuda")`` or ``cupy.asarray(y)`` view them without a copy.
They can be passed to the next plan (an R2C output to a C2R plan): a view over a plan's buffer with
room enough runs copy-free too. Work is queued on the plan's stream.

Refusals. Making a plan is collective: every rank passes the same global values (shape, dtype,
distributions) and the ranks agree on them in one small exchange (:func:`mpbind.process_group.decided`
over the MPI communicator, or NVSHMEM when ``comm`` is None) before anything else collective runs,
so a refusal is the same :class:`~mpbind.errors.UsageError` (``TypeError`` for a wrong kind of
argument) with the same message on every rank. ``execute`` checks this rank's array against the
plan (dtype, shape, device, contiguity) before any library call; those checks read only the array
and the plan, so a program that passes each rank the piece the plan states passes them everywhere.

Lifetimes. A plan owns its cuFFTMp plan and buffer (a descriptor), a reshape plan its cuFFTMp
reshape and symmetric buffers: ``close()`` (or ``with``) releases them, collectively, on every
rank; dropped unclosed they wait for :func:`mpbind.drain`, as every collective release does.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any, Generic, TypeVar, cast

from mpbind import _core, cufftmp, distributions, nvshmem
from mpbind._core import Composite
from mpbind._infra import args as _args
from mpbind._infra import cuda as _cuda
from mpbind._infra import interop as _interop
from mpbind._infra.owned import Owned, core_of
from mpbind.distributions import Distribution
from mpbind.errors import UsageError
from mpbind.fft import _planner as _fft_plan
from mpbind.fft._planner import Algorithm, FFTSpec, Kind, ReshapeSpec, Side, plan_fft
from mpbind.process_group import MPIProcessGroup, NVSHMEMProcessGroup, ProcessGroup, decided, digest, largest
from mpbind.typing import Array, Stream

__all__ = ["FORWARD", "INVERSE", "DeviceView", "FFTPlan", "ReshapePlan", "plan", "plan_reshape"]

FORWARD: int = cufftmp.FORWARD
INVERSE: int = cufftmp.INVERSE

# --- views -----------------------------------------------------------------------------------------------


class DeviceView(_interop.ArrayInfo):
    """A rank's piece of a distributed array in device memory: pointer, shape, strides (elements),
    dtype, device. Exports ``__cuda_array_interface__`` (strided where a real side is padded) and,
    when contiguous, DLPack. It keeps its memory's owner alive; the memory is the owner's (a plan's
    buffer is overwritten by the plan's next ``execute``). `room`: bytes of symmetric memory from
    `ptr` on, alike on every rank (0 where it is not symmetric).

    Made by hand, every field is checked (TypeError or UsageError naming it): `shape` a sequence of
    at most 64 extents >= 0, `strides` one int per extent, `dtype` a known element type, and the
    memory the view spans (its byte size within an int64) inside the address space from `ptr`.
    A copy (``copy.copy``) is another view of the same memory."""

    __slots__ = ("room",)
    room: int

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, device: int,
                 room: int, owner: Any) -> None:
        dims = tuple(_args.integer(n, f"shape[{i}]", minimum=0, maximum=_args.INT64_MAX)
                     for i, n in enumerate(_args.sequence(shape, "shape", _args.MAX_NDIM, "extents")))
        steps = tuple(_args.integer(n, f"strides[{i}]", minimum=-_args.INT64_MAX, maximum=_args.INT64_MAX)
                      for i, n in enumerate(_args.sequence(strides, "strides", _args.MAX_NDIM)))
        if len(steps) != len(dims):
            raise UsageError(f"strides {steps} must give one stride per extent of shape {dims}")
        name = _interop.dtype_name(dtype)
        size = _interop.itemsize(name)
        _args.product((*dims, size), f"a {name} view of shape {dims}: its byte size")
        address = _args.integer(ptr, "ptr", minimum=0, maximum=_args.SIZE_MAX)
        if 0 not in dims:  # the bytes it reaches, from the lowest element to the end of the highest
            low = sum(min((n - 1) * st, 0) for n, st in zip(dims, steps, strict=True)) * size
            high = sum(max((n - 1) * st, 0) for n, st in zip(dims, steps, strict=True)) * size + size
            if address + low < 0:
                raise UsageError(f"a view at {address:#x} with strides {steps} reaches below address 0")
            _args.span(address, high, "the view")
        self._set(address, dims, steps, name, _args.integer(device, "device", minimum=-2, maximum=_args.INT_MAX),
                  _args.integer(room, "room", minimum=0, maximum=_args.SIZE_MAX), owner)

    @classmethod
    def _of(cls, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, device: int, room: int,
            owner: Any) -> DeviceView:
        """A view of a plan's piece, whose fields the plan computed (and checked when it was made)."""
        self = cls.__new__(cls)
        self._set(ptr, shape, strides, dtype, device, room, owner)
        return self

    def _set(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, device: int, room: int,
             owner: Any) -> None:
        super().__init__(ptr, shape, strides, dtype, device, False, owner)
        self.room = room

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def contiguous(self) -> bool:
        return self.c_contiguous

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        size = self.itemsize
        strides = None if self.contiguous else tuple(s * size for s in self.strides)
        return {"version": 3, "shape": self.shape, "typestr": _interop.typestr(self.dtype),
                "data": (self.ptr, False), "strides": strides, "stream": None}

    def __dlpack__(self, **kwargs: Any) -> Any:
        if not self.contiguous:
            raise BufferError("this view is strided (a padded real side); use __cuda_array_interface__ "
                              "(torch.as_tensor, cupy.asarray)")
        code, bits = _interop.dlpack_code(self.dtype)
        view = _core.dlpack_view(self.ptr, list(self.shape), code, bits, self.device, self)
        return view.__dlpack__(**{k: v for k, v in kwargs.items() if v is not None})

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)  # kDLCUDA

    def __repr__(self) -> str:
        return (f"<DeviceView {self.dtype} shape={self.shape} strides={self.strides} ptr={self.ptr:#x} "
                f"device={self.device}>")


def _same_layout(shape: Sequence[int], strides: Sequence[int], want: Sequence[int]) -> bool:
    """Strides equal where they matter (extents of 1 ignore theirs; an empty array is any layout)."""
    if 0 in shape:
        return True
    return all(n == 1 or s == w for n, s, w in zip(shape, strides, want, strict=True))


# --- operands -----------------------------------------------------------------------------------------


class _Operand:
    """An array given to ``execute``, checked against one side of a plan."""

    __slots__ = ("ptr", "device", "in_place", "rows", "row_bytes", "pitch")

    def __init__(self, ptr: int, device: int, in_place: bool, rows: int, row_bytes: int, pitch: int) -> None:
        self.ptr = ptr
        self.device = device
        self.in_place = in_place  # its memory holds the transform: no copy
        self.rows, self.row_bytes, self.pitch = rows, row_bytes, pitch  # how to copy it in or out


def _operand(x: Any, what: str, side: Side, device: int, need: int, writable: bool) -> _Operand:
    """`x` checked against `side` (dtype, device, local shape, contiguity), and whether it lies in
    NVSHMEM memory with `need` bytes from its start (then it is used in place)."""
    info = x if isinstance(x, DeviceView) else _interop.device_array(x, what, writable=writable, contiguous=False)
    room = x.room if isinstance(x, DeviceView) else -1
    ptr, shape, strides, dtype, dev = info.ptr, info.shape, info.strides, info.dtype, info.device
    readonly = info.readonly  # a read-only input is copied, never transformed where it is
    if dtype != side.dtype:
        hint = ""
        if side.dtype.startswith("float") and dtype.startswith("complex"):
            hint = " (an R2C plan takes the real array; a complex input needs a C2C plan)"
        raise UsageError(f"{what} is {dtype}; this plan's {_role(what)} on this rank is {side.dtype}{hint}")
    if dev != device:
        raise UsageError(f"{what} is on device {dev}; the plan runs on device {device}")
    if shape == side.shape and _same_layout(shape, strides, side.strides):
        stored = True  # laid out as the plan stores it (a padded real side included)
    elif shape == side.storage and _same_layout(shape, strides, distributions.row_major_strides(shape)):
        stored = True  # the padded storage itself
    elif shape == side.shape and _same_layout(shape, strides, distributions.row_major_strides(shape)):
        stored = False  # packed, the plan pads it
    elif shape != side.shape and shape != side.storage:
        extra = f" (or {side.storage} padded)" if side.padded else ""
        raise UsageError(f"{what} has shape {shape}; this rank's piece is {side.shape}{extra}, box {side.box!r}")
    else:
        raise UsageError(f"{what} must be C-contiguous (strides {strides} elements for shape {shape}); "
                         f"copy it with .contiguous() / cupy.ascontiguousarray first")
    rows, row_bytes, pitch = distributions.pitched_rows(side.shape, side.itemsize, side.storage if stored else None)
    in_place = False
    if stored and not readonly:
        if room < 0:
            room = _symmetric_room(ptr, need)
        in_place = room >= need
    return _Operand(ptr, dev, in_place, rows, row_bytes, pitch)


def _described(side: Side) -> tuple[str, tuple[int, ...], tuple[int, ...], str]:
    """`side` as the core's executor takes it: (dtype, shape, storage, the box's repr for messages)."""
    return side.dtype, side.shape, side.storage, repr(side.box)


def _role(what: str) -> str:
    return "output" if what == "out" else "input"


def _symmetric_room(ptr: int, need: int) -> int:
    """`need` when [ptr, ptr + need) lies in a live allocation of mpbind's NVSHMEM runtime, else 0."""
    if not nvshmem.is_initialized():
        return 0
    return need if _core.nvshmem.containing(ptr, need) is not None else 0


# --- agreeing ---------------------------------------------------------------------------------------------

_FFT_VALUES = "shape, dtype, kind, distributions and algorithm"


def _dtype_key(dtype: Any) -> str:
    """The dtype's name where the core knows it (NumPy, CuPy, torch spellings agree), else its text."""
    try:
        return _interop.dtype_name(dtype)
    except (TypeError, ValueError, UsageError):
        return repr(dtype)


def _group(comm: Any) -> ProcessGroup:
    """The ranks a plan spans: `comm` (mpi4py), or NVSHMEM's world when `comm` is None."""
    if comm is None:
        if not nvshmem.is_initialized():
            raise UsageError("comm=None plans over NVSHMEM's world: initialise it first (mpbind.nvshmem.init), "
                             "or pass an mpi4py communicator")
        return NVSHMEMProcessGroup()
    if not all(hasattr(comm, name) for name in ("Get_rank", "Get_size", "Iallgather")):
        raise TypeError(f"comm must be an mpi4py communicator or None, not {type(comm).__name__}")
    return MPIProcessGroup(comm)


def _runtime(comm: Any, size: int) -> int:
    """NVSHMEM initialised (over `comm` when not yet, collective) with one PE per rank; its device."""
    if not nvshmem.is_initialized():
        nvshmem.init(mpi_comm=comm)
    if nvshmem.n_pes() != size:
        raise UsageError(f"the communicator has {size} ranks but NVSHMEM runs {nvshmem.n_pes()} PEs: cuFFTMp plans "
                         "over NVSHMEM's world")
    return nvshmem.device()


# --- what both plans hold ---------------------------------------------------------------------------------

_Spec = TypeVar("_Spec", FFTSpec, ReshapeSpec)


class _Plan(Owned, Generic[_Spec]):
    """A plan made on every rank: the decision the ranks agreed on (`spec`), this rank's place in it, its
    device, and the stream its work is queued on."""

    _core: Composite
    spec: _Spec

    def _place(self, spec: _Spec, rank: int, device: int, stream: Stream) -> None:
        self.spec = spec
        self._rank = rank
        self._device = device
        self._stream = _interop.stream_handle(stream)
        self._stream_obj = stream

    @property
    def input_shape(self) -> tuple[int, ...]:
        """This rank's input piece (a C2C inverse takes the output shape)."""
        return self.spec.input_side(self._rank).shape

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.spec.output_side(self._rank).shape

    @property
    def device(self) -> int:
        """The GPU this rank's part of the plan runs on."""
        return self._device

    def _view(self, ptr: int, side: Side, room: int, owner: Any) -> DeviceView:
        """This rank's piece `side` at `ptr` (`room` symmetric bytes from there), kept alive by `owner`."""
        return DeviceView._of(ptr, side.shape, side.strides, side.dtype, self._device, room, owner)

    @property
    def launch_id(self) -> int:
        """The id a framework's compiled program names this plan by (the XLA FFI handlers of
        :mod:`mpbind.jax`): registered on first use, released when the plan is collected. A launch of a
        closed plan fails with an error naming it."""
        if self._launch is None:
            if self.closed:
                raise UsageError(f"{type(self).__name__} is closed")
            launch = self._register_launch()
            weakref.finalize(self, _core.cufftmp.launch_release, launch)
            self._launch = launch
        return self._launch

    def _register_launch(self) -> int:
        raise NotImplementedError

    _rank: int
    _device: int
    _stream: int
    _stream_obj: Any
    _launch: int | None = None


# --- FFT plans --------------------------------------------------------------------------------------------


def plan(comm: Any, shape: Sequence[int], dtype: Any, kind: Kind | None = None, *, input: Distribution | None = None,
         output: Distribution | None = None, algorithm: Algorithm | None = None, stream: Stream = None) -> FFTPlan:
    """Plan a distributed FFT of the global `shape` (2-D or 3-D; for R2C and C2R the real shape) whose
    input elements are `dtype`, over `comm` (an mpi4py communicator, or None for NVSHMEM's world).

    `kind` is ``"c2c"``, ``"r2c"`` or ``"c2r"`` (default: r2c for a real dtype, c2c for a complex one).
    `input`/`output` are distributions of the input and output global arrays (default: cuFFTMp's
    X-slabs in, Y-slabs out; a C2R plan, the inverse of an R2C, takes Y-slabs in and gives X-slabs).
    `algorithm` None lets the plan pick (``explain()`` says what it picked and why).

    Collective: every rank calls it with the same values; a refusal is raised on every rank before
    anything collective. NVSHMEM is initialised over `comm` when it is not yet."""
    group = _group(comm)
    rank, size = group.rank, group.nranks

    shape_key: Any = shape
    try:  # read once, and no further than a shape goes: a generator is read here, a huge range refused
        shape = shape_key = _args.sequence(shape, "shape", _args.MAX_NDIM)
    except (TypeError, UsageError):
        shape_key = ("not a shape", type(shape).__name__)  # plan_fft raises the error, agreed by every rank

    def decide() -> FFTSpec:
        spec = plan_fft(shape, _interop.dtype_name(dtype), size, kind=kind, input=input, output=output,
                        algorithm=algorithm)
        _interop.stream_handle(stream)  # a bad stream is refused here, before anything collective
        return spec

    values = digest(shape_key, _dtype_key(dtype), kind, repr(input), repr(output), algorithm)
    spec = decided(group, "fft.plan", values, decide, described=_FFT_VALUES)
    return FFTPlan._make(comm, group, spec, rank, stream)


class FFTPlan(_Plan[FFTSpec]):
    """A distributed FFT, made: :meth:`execute` runs it on this rank's piece. See :func:`plan`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("FFT plans come from mpbind.fft.plan()")

    @classmethod
    def _make(cls, comm: Any, group: ProcessGroup, spec: FFTSpec, rank: int, stream: Stream) -> FFTPlan:
        device = _runtime(comm, spec.nranks)
        kind = cufftmp.Type[spec.cufft_type]
        sub = spec.subformats
        made: list[cufftmp.Plan] = []
        try:
            if sub is not None:
                formats = (cufftmp.SubFormat[sub[0]], cufftmp.SubFormat[sub[1]])
                made.append(cufftmp.Plan.create(comm, spec.shape, kind, subformats=formats, stream=stream))
            else:
                lo_in, up_in, st_in, lo_out, up_out, st_out = spec.distribution_boxes(rank)
                made.append(cufftmp.Plan.create_decomposition(comm, spec.shape, kind, (lo_in, up_in), (lo_out, up_out),
                                                              input_strides=st_in, output_strides=st_out,
                                                              stream=stream))
            # The buffer in the layout the plan reads first (a C2R plan reads the complex, "output" side).
            inverse_first = spec.kind == "c2r"
            if sub is not None:
                fmt = cufftmp.SubFormat[sub[1] if inverse_first else sub[0]]
            else:
                fmt = cufftmp.SubFormat.XT_FORMAT_DISTRIBUTED_OUTPUT if inverse_first else \
                    cufftmp.SubFormat.XT_FORMAT_DISTRIBUTED_INPUT
            desc = made[0].malloc(fmt)
        except BaseException:
            del made  # its lifetime row applies: queued for drain() on every rank once a communicator is attached
            raise
        p = made[0]
        self = cls._over(Composite([p], "fft plan parts"))
        self._place(spec, rank, device, stream)
        self._desc = desc
        self._buffer = desc.data
        # Whether an array is used in place must be decided alike on every rank (cuFFTMp writes into the
        # other ranks' memory at the address each passes): sizes are the largest over the ranks.
        self._room = largest(group, desc.nbytes)
        self._need = max(spec.max_buffer_bytes, self._room if spec.algorithm == "boxes" else 0)
        directions = {"c2c": (FORWARD, INVERSE), "r2c": (FORWARD,), "c2r": (INVERSE,)}[spec.kind]
        sides = {d: (_described(i), _described(o)) for d in directions for i, o in [self._sides(d)]}
        self._executor = p.executor(desc, sides, need=self._need, via_descriptor=spec.algorithm == "boxes",
                                    device=device, name="fft.FFTPlan")
        self._last = None
        return self

    # --- what each rank gives and gets ---

    @property
    def algorithm(self) -> str:
        """``slabs`` (cuFFTMp's built-in layout) or ``boxes`` (cufftXtSetDistribution)."""
        return self.spec.algorithm

    def explain(self) -> str:
        """What was chosen and why, and this rank's pieces."""
        return self.spec.explain(self._rank)

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def shape(self) -> tuple[int, ...]:
        """The transform's global shape (real for R2C/C2R)."""
        return self.spec.shape

    @property
    def input_dtype(self) -> str:
        return self.spec.input_dtype

    @property
    def output_dtype(self) -> str:
        return self.spec.output_dtype

    @property
    def input_box(self) -> Any:
        """This rank's box of the global input array."""
        return self.spec.input_side(self._rank).box

    @property
    def output_box(self) -> Any:
        return self.spec.output_side(self._rank).box

    @property
    def buffer_bytes(self) -> int:
        """Bytes an array used in place needs from its start on this rank."""
        return self._need

    @property
    def stream(self) -> int:
        """The stream the plan's work is queued on (cudaStream_t)."""
        return self._stream

    @property
    def cufftmp_plan(self) -> cufftmp.Plan:
        """The cuFFTMp plan this plan runs; its ``handle`` serves calls through :mod:`mpbind.bindings.cufftmp`.
        It stays this plan's: ``close()`` closes it."""
        return cast("cufftmp.Plan", self._core.parts[0])  # the first of its parts (FFTPlan._make)

    @property
    def descriptor(self) -> cufftmp.Descriptor:
        """The cuFFTMp descriptor of this rank's data, allocated when the plan was made (``data``: the
        plan's own buffer, ``ptr``: the descriptor itself). It stays this plan's."""
        return self._desc

    def input_view(self, direction: int | str | None = None) -> DeviceView:
        """The plan's own buffer as this rank's input of `direction` (default: the plan's own, forward but
        for C2R), stored as the plan stores it; fill it, then ``execute()``."""
        side = self._sides(self._direction(direction))[0]
        return self._view(self._buffer, side, self._room, self._desc)

    # --- running it ---

    def execute(self, x: Array | None = None, *, direction: int | str | None = None, out: Array | None = None) -> Any:
        """Transform this rank's piece `x` (None: the plan's own buffer) and return the result (a
        :class:`DeviceView`, or `out` when given). `direction` is for C2C plans: FORWARD (default)
        from the input distribution to the output one, INVERSE back (both unnormalised).

        `x` in mpbind's NVSHMEM memory with :attr:`buffer_bytes` from its start is transformed where it
        is (it then holds the result); every rank must then pass its counterpart (the same symmetric
        allocation, at the same offset), as cuFFTMp writes into the other ranks' memory at the address
        each passes. Any other `x` is copied into the plan's buffer. Collective: every rank calls it."""
        d = self._direction(direction)
        last = self._last
        if out is None and last is not None and last[0] is x and last[1] == d:
            if x is not None and isinstance(x, nvshmem.SymmetricArray) and x.closed:
                raise UsageError("x is a freed symmetric array")
            self._executor.run(last[2].ptr, d)
            return last[2]
        # One call into the core: the checks of x and out, the copies and the transform, on the plan's stream.
        ptr, in_place = self._executor.execute(x, x.room if isinstance(x, DeviceView) else -1, out, d)
        if out is not None:
            return out
        src, dst = self._sides(d)
        if x is not None and in_place:
            result = self._view(ptr, dst, self._need, x)
        else:
            result = self._view(ptr, dst, self._room, self._desc)
        self._last = (x, d, result) if in_place else None
        return result

    __call__ = execute

    def direction(self, direction: int | str | None = None) -> int:
        """`direction` as this plan runs it: FORWARD or INVERSE ('forward', 'inverse'; None: the plan's
        own, FORWARD but for C2R plans). UsageError for one it does not run."""
        return self._direction(direction)

    def pieces(self, direction: int | str | None = None) -> tuple[tuple[int, ...], str, tuple[int, ...], str]:
        """(input shape, input dtype, output shape, output dtype) of this rank's pieces for `direction`
        (default: the plan's own, forward but for C2R): what a framework's operator takes and returns."""
        i, o = self._sides(self._direction(direction))
        return i.shape, i.dtype, o.shape, o.dtype

    @property
    def hermitian_interior(self) -> slice:
        """For R2C and C2R plans: this rank's bins of the halved (last) axis, in its complex piece, that
        stand for two bins of the full spectrum (k and N - k): all but k = 0 and, for an even N, k = N/2.
        The adjoints of these transforms weigh them (mpbind.torch's and mpbind.jax's gradients)."""
        if self.spec.kind == "c2c":
            raise UsageError("a c2c plan keeps the whole spectrum: no bin stands for two")
        n = self.spec.shape[-1]
        box = self.output_box if self.spec.kind == "r2c" else self.input_box  # the complex side
        lo, up = box.lower[-1], box.upper[-1]
        first, last = max(lo, 1), min(up, (n + 1) // 2)  # interior k: 1 .. ceil(n/2) - 1
        return slice(first - lo, max(last - lo, first - lo))

    def check_reverse(self, reverse: FFTPlan, what: str = "reverse") -> None:
        """Raise UsageError unless `reverse` runs this R2C (C2R) plan's transform back on this rank:
        the plan of the other kind, of the same global shape, from this plan's output piece to its
        input piece, boxes included (a gradient weighs this rank's bins by where they lie in the
        spectrum, so pieces of the same shape elsewhere would give a wrong one). `what` names it."""
        want = {"r2c": "c2r", "c2r": "r2c"}.get(self.kind)
        if want is None:
            raise UsageError(f"a c2c plan's gradient runs through the plan itself: {what} must be empty")
        if not isinstance(reverse, FFTPlan):
            raise TypeError(f"{what} must be an mpbind.fft.FFTPlan, not {type(reverse).__name__}")
        if reverse.kind != want or reverse.shape != self.shape or \
                (reverse.input_shape, reverse.output_shape) != (self.output_shape, self.input_shape) or \
                (reverse.input_box, reverse.output_box) != (self.output_box, self.input_box):
            raise UsageError(f"{what} must be a {want} plan of the global shape {self.shape} from this plan's "
                             f"output piece {self.output_box} to its input piece {self.input_box}, not a "
                             f"{reverse.kind} plan of {reverse.shape} from {reverse.input_box} to {reverse.output_box}")

    def _register_launch(self) -> int:
        return int(_core.cufftmp.launch_register_fft(self._executor))

    def _direction(self, direction: int | str | None) -> int:
        kind = self.spec.kind
        if direction is None:
            return INVERSE if kind == "c2r" else FORWARD
        if isinstance(direction, str) and direction.lower() in ("forward", "inverse"):
            direction = FORWARD if direction.lower() == "forward" else INVERSE
        if isinstance(direction, bool) or direction not in (FORWARD, INVERSE):
            raise UsageError(f"direction must be fft.FORWARD ({FORWARD}), fft.INVERSE ({INVERSE}), 'forward' or "
                             f"'inverse', got {direction!r}")
        if kind == "r2c" and direction != FORWARD:
            raise UsageError("an r2c plan only transforms FORWARD (plan a c2r transform for the inverse)")
        if kind == "c2r" and direction != INVERSE:
            raise UsageError("a c2r plan only transforms INVERSE (from its complex input to its real output)")
        return int(direction)

    def _sides(self, d: int) -> tuple[Side, Side]:
        i, o = self.spec.input_side(self._rank), self.spec.output_side(self._rank)
        return (o, i) if (self.spec.kind == "c2c" and d == INVERSE) else (i, o)

    def _described(self) -> str:
        return f"{self.spec.cufft_type} {'x'.join(map(str, self.spec.shape))} {self.spec.algorithm}"

    _desc: cufftmp.Descriptor
    _buffer: int
    _need: int
    _room: int
    _executor: Any  # the core's cufftmp.Executor (cufftmp.Plan.executor)
    _last: tuple[Any, int, DeviceView] | None


# --- reshapes ---------------------------------------------------------------------------------------------


def plan_reshape(comm: Any, input: Distribution, output: Distribution, dtype: Any, *,
                 stream: Stream = None) -> ReshapePlan:
    """Plan moving a global array of `dtype` elements from the `input` distribution to `output` (1-D to
    3-D, any element size) over `comm` (an mpi4py communicator, or None for NVSHMEM's world).
    Collective, with the same agreement as :func:`plan`."""
    group = _group(comm)
    rank, size = group.rank, group.nranks

    def decide() -> ReshapeSpec:
        spec = _fft_plan.plan_reshape(input, output, _interop.dtype_name(dtype))
        if spec.nranks != size:
            raise UsageError(f"input spreads the array over {spec.nranks} ranks; the communicator has {size}")
        _interop.stream_handle(stream)
        return spec

    spec = decided(group, "fft.plan_reshape", digest(_dtype_key(dtype), repr(input), repr(output)), decide,
                   described="dtype and distributions")
    return ReshapePlan._make(comm, group, spec, rank, stream)


class ReshapePlan(_Plan[ReshapeSpec]):
    """A redistribution, made: :meth:`execute` moves this rank's piece. See :func:`plan_reshape`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("reshape plans come from mpbind.fft.plan_reshape()")

    @classmethod
    def _make(cls, comm: Any, group: ProcessGroup, spec: ReshapeSpec, rank: int, stream: Stream) -> ReshapePlan:
        device = _runtime(comm, spec.nranks)
        (lo_in, up_in, st_in), (lo_out, up_out, st_out) = spec.cufftmp_boxes(rank)
        owned: list[Any] = []
        try:
            r = cufftmp.Reshape.create(comm, spec.unit, (lo_in, up_in), (lo_out, up_out), input_strides=st_in,
                                       output_strides=st_out)
            owned.append(r)
            work = largest(group, r.workspace_size)
            # Symmetric memory is allocated alike on every rank: the largest piece of each side.
            owned.append(nvshmem.empty(spec.max_input_bytes, "uint8"))
            owned.append(nvshmem.empty(spec.max_output_bytes, "uint8"))
            if work:
                owned.append(nvshmem.empty(work, "uint8"))
        except BaseException:
            del owned  # their lifetime rows apply (queued for drain() on every rank)
            raise
        self = cls._over(Composite(owned, "reshape plan parts"))
        self._place(spec, rank, device, stream)
        self._reshape = core_of(owned[0])
        self._exec = self._reshape.exec
        self._in_buf, self._out_buf = owned[1], owned[2]
        self._work = owned[3].ptr if work else 0
        return self

    @property
    def dtype(self) -> str:
        return self.spec.dtype

    def explain(self) -> str:
        return self.spec.explain()

    def input_view(self) -> DeviceView:
        """The plan's own input buffer as this rank's input piece (fill it, then ``execute()``)."""
        return self._view(self._in_buf.ptr, self.spec.input_side(self._rank), self._in_buf.nbytes, self._in_buf)

    def execute(self, x: Array | None = None, *, out: Array | None = None, stream: Stream = None,
                sync: bool = True) -> Any:
        """Move this rank's piece `x` (None: the plan's input buffer) into the output distribution, on
        `stream` (default: the plan's). Returns the output piece (`out` when given; else a view of the
        plan's output buffer, valid until the next ``execute``). `x` and `out` lying in mpbind's NVSHMEM
        memory with room for the largest piece of any rank are used in place (every rank then passes its
        counterpart: the same allocation, at the same offset); others go through the plan's buffers.
        With `sync` (the default) the ranks first synchronise on the stream
        (``nvshmemx_sync_all_on_stream``): other ranks write into this one's output, which must no
        longer be in use. Collective."""
        s = self._stream if stream is None else _interop.stream_handle(stream)
        src, dst = self.spec.input_side(self._rank), self.spec.output_side(self._rank)
        if x is None:
            in_ptr = self._in_buf.ptr
        else:
            op = _operand(x, "x", src, self._device, self.spec.max_input_bytes, writable=False)
            in_ptr = op.ptr
            if not op.in_place:
                _cuda.copy_2d_async(self._in_buf.ptr, op.row_bytes, op.ptr, op.pitch, op.row_bytes, op.rows, s)
                in_ptr = self._in_buf.ptr
        target = None
        out_ptr = self._out_buf.ptr
        if out is not None:
            target = _operand(out, "out", dst, self._device, self.spec.max_output_bytes, writable=True)
            if target.in_place:
                out_ptr = target.ptr
        if sync:
            nvshmem.sync_all(s)
        self._exec(out_ptr, in_ptr, self._work, s)
        if target is None:
            return self._view(out_ptr, dst, self._out_buf.nbytes, self._out_buf)
        if not target.in_place:
            _cuda.copy_2d_async(target.ptr, target.pitch, out_ptr, target.row_bytes, target.row_bytes, target.rows, s)
        return out

    __call__ = execute

    def _register_launch(self) -> int:
        unit = self.spec.unit
        i, o = self.spec.input_side(self._rank), self.spec.output_side(self._rank)
        arrays = list(self._core.parts[1:])  # its symmetric buffers (the parts after the reshape, _make)
        return int(_core.cufftmp.launch_register_reshape(
            self._reshape, arrays, self._in_buf.ptr, self._out_buf.ptr, self._work, math.prod(i.shape) * unit,
            math.prod(o.shape) * unit, self._device))

    def _described(self) -> str:
        return f"{self.spec.dtype} {'x'.join(map(str, self.spec.shape))}"

    _reshape: Any  # the core's cufftmp.Reshape
    _exec: Any
    _in_buf: nvshmem.SymmetricArray
    _out_buf: nvshmem.SymmetricArray
    _work: int
