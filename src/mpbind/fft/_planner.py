"""What a distributed FFT or reshape does on each rank, computed from distributions alone.

No library is called here: :func:`plan_fft` and :func:`plan_reshape` take the global shape, the
element types and the input and output :mod:`mpbind.distributions` (values every rank passes
alike) and return frozen values that say, for every rank, which box of which global array it
holds on each side, how that piece is stored, how many bytes the in-place buffer needs, and
what cuFFTMp is asked for. A refusal is a :class:`~mpbind.errors.UsageError` (``TypeError`` for
a wrong kind) that depends only on those values, so every rank refuses alike.

FFTs. Three kinds in two precisions: ``c2c`` (complex64 or complex128 both ways), ``r2c`` (a real
float32/float64 array to its Hermitian half, complex, with the last axis ``n // 2 + 1`` long) and
``c2r`` (back). The *input* distribution is of the input array (the real one for R2C, the halved
complex one for C2R), the *output* distribution of the output array. Two ways to run them:

* ``slabs``: cuFFTMp's own layout, the fastest (one exchange, no reshape around it). Chosen when
  the input and output are its slabs: X-slabs in and Y-slabs out (3-D, any kind; 2-D C2C) or, for
  C2C, Y-slabs in and X-slabs out. Its real side is stored padded (the last axis holds
  ``2 * (n // 2 + 1)`` reals) because the transform is in place; the plan pads and unpads.
* ``boxes``: any other pair, through ``cufftXtSetDistribution`` with each rank's boxes stored
  packed (row-major, no padding); cuFFTMp redistributes inside the transform.

Reshapes move a global array of any element type from one distribution to another
(``cufftMpMakeReshape``). cuFFTMp takes 3-D boxes of 4, 8 or 16-byte elements: a 1-D or 2-D
array gets leading axes of extent 1, and another element size is expressed in those units along
the last axis (a 32-byte element is two 16-byte units; 2-byte elements go two at a time, which
needs every box to start and end on an even index of the last axis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mpbind._infra import args as _args
from mpbind.distributions import (
    Box,
    Distribution,
    Split,
    cufftmp_box,
    hermitian_shape,
    padded_real_shape,
    row_major_strides,
)
from mpbind.errors import UsageError

__all__ = ["FFTSpec", "ReshapeSpec", "Side", "plan_fft", "plan_reshape"]

Shape = tuple[int, ...]
Kind = Literal["c2c", "r2c", "c2r"]
Algorithm = Literal["slabs", "boxes"]

KINDS: tuple[Kind, ...] = ("c2c", "r2c", "c2r")
_COMPLEX = {"float32": "complex64", "float64": "complex128"}
_REAL_DTYPES = frozenset(_COMPLEX)
_REAL = {v: k for k, v in _COMPLEX.items()}
_ITEMSIZE = {"float32": 4, "float64": 8, "complex64": 8, "complex128": 16}
# cuFFTMp's plan type of each (kind, input dtype): cufftmp.Type member names.
_CUFFT_TYPE = {("c2c", "complex64"): "C2C", ("c2c", "complex128"): "Z2Z", ("r2c", "float32"): "R2C",
               ("r2c", "float64"): "D2Z", ("c2r", "complex64"): "C2R", ("c2r", "complex128"): "Z2D"}
_INT_MAX = 2**31 - 1  # cufftMakePlan2d/3d take int extents
_RESHAPE_UNITS = (16, 8, 4)  # element sizes cufftMpMakeReshape takes


@dataclass(frozen=True)
class Side:
    """One rank's local array on one side of a transform or reshape: the box of the global array it
    holds (``shape`` is its extents), its element type, and how it is stored (``storage`` differs
    from ``shape`` only where the last axis is padded; ``strides`` are in elements)."""

    box: Box
    dtype: str
    storage: Shape

    @property
    def shape(self) -> Shape:
        return self.box.shape

    @property
    def strides(self) -> Shape:
        return row_major_strides(self.storage)

    @property
    def padded(self) -> bool:
        return self.storage != self.shape

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self.dtype, 0) or _itemsize(self.dtype)

    @property
    def elements(self) -> int:
        """Elements the storage spans (padding included)."""
        return math.prod(self.storage)

    @property
    def nbytes(self) -> int:
        return self.elements * self.itemsize


def _itemsize(dtype: str) -> int:
    from mpbind._infra import interop as _interop  # the core knows every dtype name; only reached for reshapes

    return _interop.itemsize(dtype)


# --- argument checks (pure: every rank runs them on the same values) -------------------------------


def _shape(shape: Any, what: str = "shape") -> Shape:
    out = [_args.index(n, f"{what}[{i}]") for i, n in enumerate(_args.sequence(shape, what, _args.MAX_NDIM))]
    if any(n < 1 for n in out):
        raise UsageError(f"{what} must have extents >= 1, got {tuple(out)}")
    return tuple(out)


def _side(dist: Any, name: str, shape: Shape, nranks: int, what: str) -> Distribution:
    """`dist` checked to be a distribution of `shape` over `nranks` ranks whose pieces are single
    boxes tiling the array exactly once; the message names `name`."""
    if not isinstance(dist, Distribution):
        raise TypeError(f"{name} must be an mpbind.distributions value (Split, Pencils, Boxes, ...), "
                        f"not {type(dist).__name__}")
    if dist.shape != shape:
        raise UsageError(f"{name} is a distribution of shape {dist.shape}; the {what} is {shape}")
    if dist.nranks != nranks:
        raise UsageError(f"{name} spreads the array over {dist.nranks} ranks; the communicator has {nranks}")
    if dist.replicated:
        raise UsageError(f"{name} is replicated; a distributed transform holds each element on one rank")
    try:
        for r in range(nranks):
            dist.box(r)
        dist.check()
    except UsageError as exc:
        raise UsageError(f"{name}: {exc}") from None
    return dist


def _same_pieces(a: Distribution, b: Distribution) -> bool:
    return a.shape == b.shape and a.nranks == b.nranks and all(a.box(r) == b.box(r) for r in range(a.nranks))


def _slabs(shape: Shape, nranks: int, axis: int) -> Split:
    """cuFFTMp's slabs along `axis`: the first ``n % nranks`` ranks one more."""
    return Split(shape, nranks, axis)


# --- FFTs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FFTSpec:
    """A distributed FFT, decided: its global shape (the transform's, real for R2C/C2R), kind,
    element types, the input and output distributions, and the algorithm with its reason.

    The forward transform of a C2C plan maps the input distribution to the output one and its
    inverse maps them back; an R2C plan only transforms forward, a C2R plan only inverse (from
    its complex input to its real output)."""

    shape: Shape
    kind: Kind
    input_dtype: str
    output_dtype: str
    input: Distribution
    output: Distribution
    algorithm: Algorithm
    reason: str

    @property
    def nranks(self) -> int:
        return self.input.nranks

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def cufft_type(self) -> str:
        """The cufftmp.Type member name (C2C, Z2Z, R2C, D2Z, C2R, Z2D)."""
        return _CUFFT_TYPE[(self.kind, self.input_dtype)]

    @property
    def real_dtype(self) -> str | None:
        return None if self.kind == "c2c" else _REAL.get(self.input_dtype, self.input_dtype)

    @property
    def subformats(self) -> tuple[str, str] | None:
        """cufftXtSetSubformatDefault's (forward, inverse) SubFormat names on the built-in slabs: the
        layout the forward transform reads and the one the inverse reads. None for boxes."""
        if self.algorithm != "slabs":
            return None
        if self.kind == "c2c" and not _same_pieces(self.input, _slabs(self.input.shape, self.nranks, 0)):
            return ("XT_FORMAT_INPLACE_SHUFFLED", "XT_FORMAT_INPLACE")  # Y-slabs in, X-slabs out
        return ("XT_FORMAT_INPLACE", "XT_FORMAT_INPLACE_SHUFFLED")  # X-slabs forward (C2R: its output)

    def _storage(self, dist: Distribution, rank: int, dtype: str) -> Side:
        box = dist.box(rank)
        storage = box.shape
        if self.algorithm == "slabs" and dtype in _REAL_DTYPES:  # the real side of a built-in R2C/C2R
            storage = (*box.shape[:-1], padded_real_shape(self.shape)[-1])
        return Side(box, dtype, storage)

    def input_side(self, rank: int) -> Side:
        """`rank`'s input piece as it is stored."""
        return self._storage(self.input, rank, self.input_dtype)

    def output_side(self, rank: int) -> Side:
        """`rank`'s output piece as it is stored."""
        return self._storage(self.output, rank, self.output_dtype)

    def buffer_bytes(self, rank: int) -> int:
        """Bytes of `rank`'s in-place buffer: the larger of its two sides as stored."""
        return max(self.input_side(rank).nbytes, self.output_side(rank).nbytes, 1)

    @property
    def max_buffer_bytes(self) -> int:
        """The largest buffer over the ranks (symmetric memory is allocated alike on every rank)."""
        return max(self.buffer_bytes(r) for r in range(self.nranks))

    def distribution_boxes(self, rank: int) -> tuple[Shape, Shape, Shape, Shape, Shape, Shape]:
        """cufftXtSetDistribution's (lower_in, upper_in, strides_in, lower_out, upper_out, strides_out)
        of `rank`: the forward input box first, which for R2C and C2R is always the real side."""
        real_first = self.kind != "c2r"
        a = self.input_side(rank) if real_first else self.output_side(rank)
        b = self.output_side(rank) if real_first else self.input_side(rank)
        return a.box.lower, a.box.upper, a.strides, b.box.lower, b.box.upper, b.strides

    def explain(self, rank: int | None = None) -> str:
        """One line per decision (and `rank`'s pieces, when given)."""
        dims = "x".join(map(str, self.shape))
        lines = [f"{self.cufft_type} ({self.kind}, {self.input_dtype} -> {self.output_dtype}) {self.ndim}-D {dims} "
                 f"on {self.nranks} rank(s)",
                 f"input:  {self.input!r}", f"output: {self.output!r}",
                 f"algorithm: {self.algorithm}: {self.reason}"]
        if self.algorithm == "slabs" and self.kind != "c2c":
            n, padded = self.shape[-1], padded_real_shape(self.shape)[-1]
            lines.append(f"the real side is stored padded in place: last axis {n} -> {padded} reals "
                         "(the plan pads and unpads when it copies)")
        lines.append(f"in-place buffer: up to {self.max_buffer_bytes} bytes on a rank")
        if rank is not None:
            i, o = self.input_side(rank), self.output_side(rank)
            lines.append(f"rank {rank}: input {i.box!r} stored {i.storage}, output {o.box!r} stored {o.storage}, "
                         f"buffer {self.buffer_bytes(rank)} bytes")
        return "\n".join(lines)


def _dtypes(kind: Any, dtype: str) -> tuple[Kind, str, str]:
    """(kind, input dtype, output dtype); the kind defaults from the dtype (real: r2c, complex: c2c)."""
    if kind is None:
        kind = "r2c" if dtype in _COMPLEX else "c2c"
    if not isinstance(kind, str) or kind.lower() not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    k: Kind = kind.lower()  # type: ignore[assignment]
    if k == "r2c":
        if dtype not in _COMPLEX:
            raise UsageError(f"an r2c transform takes a real input (float32 or float64); dtype is {dtype}")
        return k, dtype, _COMPLEX[dtype]
    if dtype not in _REAL:
        raise UsageError(f"a {k} transform takes a complex input (complex64 or complex128); dtype is {dtype}")
    return k, dtype, _REAL[dtype] if k == "c2r" else dtype


def plan_fft(shape: Sequence[int], dtype: str, nranks: int, *, kind: Kind | None = None,
             input: Distribution | None = None, output: Distribution | None = None,
             algorithm: Algorithm | None = None) -> FFTSpec:
    """Decide a distributed FFT of the global `shape` (2-D or 3-D; the real shape for R2C/C2R) whose
    input has element type `dtype`, over `nranks` ranks.

    `input` and `output` default to cuFFTMp's slabs: X-slabs in and Y-slabs out for C2C and R2C,
    Y-slabs in and X-slabs out for C2R (the inverse of an R2C). `algorithm` None picks ``slabs``
    where the pair is cuFFTMp's own, else ``boxes``; ``"boxes"`` forces the general path,
    ``"slabs"`` refuses a pair that is not cuFFTMp's."""
    dims = _shape(shape)
    if len(dims) not in (2, 3):
        raise UsageError(f"cuFFTMp transforms 2-D and 3-D arrays; shape {dims} is {len(dims)}-D")
    if isinstance(nranks, bool) or not isinstance(nranks, int) or not 1 <= nranks <= _args.MAX_RANKS:
        raise UsageError(f"nranks must be an int in [1, {_args.MAX_RANKS}], got {nranks!r}")
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a dtype name, not {type(dtype).__name__}")
    k, in_dtype, out_dtype = _dtypes(kind, dtype)
    if any(n > _INT_MAX for n in dims):
        raise UsageError(f"cuFFTMp takes extents that fit in an int; shape {dims}")
    if dims[0] < nranks or dims[1] < nranks:
        raise UsageError(f"cuFFTMp needs the first two extents >= the number of ranks ({nranks}); shape {dims}")
    if len(dims) == 3 and dims[2] < 2:
        raise UsageError(f"cuFFTMp needs the last extent of a 3-D transform >= 2; shape {dims}")
    if algorithm not in (None, "slabs", "boxes"):
        raise UsageError(f"algorithm must be 'slabs', 'boxes' or None, got {algorithm!r}")
    half = hermitian_shape(dims)
    in_shape = half if k == "c2r" else dims
    out_shape = half if k == "r2c" else dims
    in_axis, out_axis = (1, 0) if k == "c2r" else (0, 1)
    what_in = {"c2c": "input array", "r2c": "real input array", "c2r": "halved complex input array"}[k]
    what_out = {"c2c": "output array", "r2c": "halved complex output array", "c2r": "real output array"}[k]
    src = _side(input if input is not None else _slabs(in_shape, nranks, in_axis), "input", in_shape, nranks, what_in)
    dst = _side(output if output is not None else _slabs(out_shape, nranks, out_axis), "output", out_shape, nranks,
                what_out)
    natural = _natural_slabs(k, len(dims), src, dst, nranks)
    if algorithm == "slabs" and natural is None:
        raise UsageError(f"algorithm='slabs' takes cuFFTMp's own slab pairs ({_SLAB_PAIRS[k]}); "
                         f"input {src!r} -> output {dst!r} is not one (use 'boxes' or None)")
    if natural is not None and algorithm != "boxes":
        chosen: Algorithm = "slabs"
        reason = f"{natural}: cuFFTMp's built-in layout, transformed in place with no reshape around it"
    else:
        chosen = "boxes"
        reason = ("asked for" if algorithm == "boxes" else "not one of cuFFTMp's slab pairs") + \
            ": cufftXtSetDistribution with every rank's boxes, stored packed; cuFFTMp redistributes inside"
    spec = FFTSpec(dims, k, in_dtype, out_dtype, src, dst, chosen, reason)
    # The largest piece as stored (padding included) becomes a symmetric allocation, copy sizes and
    # cuFFTMp's long long strides: it must fit an int64 (the pieces' own extents already do).
    _args.checked(spec.max_buffer_bytes, "the largest rank's in-place buffer (bytes)")
    return spec


_SLAB_PAIRS = {"c2c": "X-slabs -> Y-slabs or Y-slabs -> X-slabs", "r2c": "3-D, X-slabs -> Y-slabs",
               "c2r": "3-D, Y-slabs -> X-slabs"}


def _natural_slabs(kind: Kind, ndim: int, src: Distribution, dst: Distribution, n: int) -> str | None:
    """Which of cuFFTMp's slab pairs `src` -> `dst` is, or None. 2-D real transforms are left to boxes:
    their built-in layout splits the halved axis, which the documentation does not spell out."""
    def slabs(d: Distribution, axis: int) -> bool:
        return _same_pieces(d, _slabs(d.shape, n, axis))

    if kind == "c2c":
        if slabs(src, 0) and slabs(dst, 1):
            return "X-slabs -> Y-slabs"
        if slabs(src, 1) and slabs(dst, 0):
            return "Y-slabs -> X-slabs"
        return None
    if ndim != 3:
        return None
    if kind == "r2c" and slabs(src, 0) and slabs(dst, 1):
        return "X-slabs -> Y-slabs"
    if kind == "c2r" and slabs(src, 1) and slabs(dst, 0):
        return "Y-slabs -> X-slabs"
    return None


# --- reshapes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReshapeSpec:
    """A redistribution of one global array from `input` to `output`, decided: the element type and
    how cuFFTMp sees it (3-D boxes of `unit`-byte elements, the last axis scaled by `scale`:
    a fraction ``(num, den)``, an element being ``num / den`` units)."""

    shape: Shape
    dtype: str
    itemsize: int
    input: Distribution
    output: Distribution
    unit: int
    scale: tuple[int, int]

    @property
    def nranks(self) -> int:
        return self.input.nranks

    def input_side(self, rank: int) -> Side:
        box = self.input.box(rank)
        return Side(box, self.dtype, box.shape)

    def output_side(self, rank: int) -> Side:
        box = self.output.box(rank)
        return Side(box, self.dtype, box.shape)

    @property
    def max_input_bytes(self) -> int:
        return max(max(self.input.box(r).size for r in range(self.nranks)) * self.itemsize, 1)

    @property
    def max_output_bytes(self) -> int:
        return max(max(self.output.box(r).size for r in range(self.nranks)) * self.itemsize, 1)

    def _box3(self, box: Box) -> tuple[Shape, Shape, Shape]:
        return cufftmp_box(box, 3, self.scale)

    def cufftmp_boxes(self, rank: int) -> tuple[tuple[Shape, Shape, Shape], tuple[Shape, Shape, Shape]]:
        """((lower, upper, strides) in, (lower, upper, strides) out) of `rank` as cufftMpMakeReshape
        takes them: 3-D, in `unit`-byte elements."""
        return self._box3(self.input.box(rank)), self._box3(self.output.box(rank))

    def explain(self) -> str:
        num, den = self.scale
        how = (f"{self.itemsize}-byte elements as they are" if (num, den) == (1, 1) else
               f"{self.itemsize}-byte elements as {num}/{den} unit(s) of {self.unit} bytes along the last axis")
        return "\n".join([f"reshape of {self.dtype} {'x'.join(map(str, self.shape))} over {self.nranks} rank(s)",
                          f"input:  {self.input!r}", f"output: {self.output!r}",
                          f"cufftMpMakeReshape on 3-D boxes, {how}"])


def _units(itemsize: int, boxes: Sequence[Box], shape: Shape) -> tuple[int, tuple[int, int]]:
    """(unit, (num, den)): elements of `itemsize` bytes as units cuFFTMp takes, along the last axis."""
    if itemsize in _RESHAPE_UNITS:
        return itemsize, (1, 1)
    for unit in _RESHAPE_UNITS:
        if itemsize % unit == 0:
            return unit, (itemsize // unit, 1)
    group = 4 // math.gcd(itemsize, 4)  # elements per group so that a group is a multiple of 4 bytes
    edges = {shape[-1], *(b.lower[-1] for b in boxes), *(b.upper[-1] for b in boxes)}
    if any(e % group for e in edges):
        raise UsageError(f"{itemsize}-byte elements move in groups of {group} along the last axis (cuFFTMp takes "
                         f"4, 8 or 16-byte elements); the boxes' last-axis edges {sorted(edges)} must be multiples "
                         f"of {group}")
    total = itemsize * group
    for unit in _RESHAPE_UNITS:
        if total % unit == 0:
            return unit, (total // unit, group)
    raise AssertionError("unreachable: a multiple of 4 bytes")


def plan_reshape(input: Distribution, output: Distribution, dtype: str, itemsize: int | None = None) -> ReshapeSpec:
    """Decide moving a global array of `dtype` elements from `input` to `output` (two distributions
    of the same 1-D to 3-D shape over the same ranks, single box per rank, each tiling it once)."""
    if not isinstance(input, Distribution):
        raise TypeError(f"input must be an mpbind.distributions value, not {type(input).__name__}")
    shape = input.shape
    if not 1 <= len(shape) <= 3:
        raise UsageError(f"cuFFTMp reshapes 1-D to 3-D arrays; input is {len(shape)}-D {shape}")
    src = _side(input, "input", shape, input.nranks, "global array")
    dst = _side(output, "output", shape, input.nranks, "global array of the input")
    size = _args.index(itemsize, "element size") if itemsize is not None else (_ITEMSIZE.get(dtype) or _itemsize(dtype))
    if size < 1:
        raise UsageError(f"element size must be >= 1 byte, got {size}")
    # Every coordinate and stride cuFFTMp takes (long long, in units of at most the element) and every
    # buffer is at most the global array's byte size.
    _args.product((*shape, size), f"the global {dtype} array {shape}'s byte size")
    boxes = [d.box(r) for d in (src, dst) for r in range(src.nranks)]
    unit, scale = _units(size, boxes, shape)
    return ReshapeSpec(shape, dtype, size, src, dst, unit, scale)
