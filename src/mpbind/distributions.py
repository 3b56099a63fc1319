"""How an array is spread over the ranks of a communicator: small immutable values.

    from mpbind import distributions as dist
    a = dist.by_rows((m, k), nranks)                         # rank r holds a contiguous band of rows
    b = dist.by_columns((k, n), nranks, counts=(96, 32))     # uneven, given per rank
    c = dist.BlockCyclic((m, n), grid=(2, 2), block=(64, 64))
    x = dist.Split((nx, ny, nz), nranks, axis=0)             # slabs of a 3-D array
    p = dist.Pencils((nx, ny, nz), grid=(2, 4), axes=(0, 1))
    q = dist.Boxes((nx, ny), [((0, 0), (4, 6)), ((4, 0), (8, 6))])

Every distribution answers, from values every rank has alike (the global shape, the rank count,
the per-rank counts or boxes), where each rank's piece lies (:meth:`~Distribution.box`,
:meth:`~Distribution.local_shape`), which ranks own an element (:meth:`~Distribution.owners`),
and whether the pieces tile the array exactly once (:meth:`~Distribution.check`: a gap or an
overlap is a :class:`~mpbind.errors.UsageError` naming the ranks and boxes). So a check that
refuses one refuses it on every rank, before anything collective runs.

Boxes are half-open, ``[lower, upper)``, in global element coordinates. A uniform split puts
the extra elements first, as cuFFTMp's slabs do (``numpy.array_split``): 10 rows over 4 ranks
are ``(3, 3, 2, 2)``. :meth:`Split.blocked` splits as ScaLAPACK's ``numroc`` does instead
(``(3, 3, 3, 1)``), which is what a cuBLASMp descriptor can describe.

Conversions for the planners: :meth:`~Distribution.to_block_cyclic` (a cuBLASMp descriptor's
arguments, :class:`BlockCyclicArgs`) for 2-D arrays, and :meth:`~Distribution.to_cufftmp` (the box
corners and row-major strides cuFFTMp takes) for box-shaped pieces.

Layout arithmetic lives here and nowhere else in the package: :func:`slab` (cuFFTMp's slab split),
:func:`row_major_strides`, :func:`hermitian_shape` and :func:`padded_real_shape` (a real
transform's halved and in-place padded last axis), :func:`pitched_rows` (how a pitched copy moves a
piece) and :func:`cufftmp_box` (a box as cuFFTMp takes it, in 3-D and in units of another size).

Limits, checked when a value is made: at most ``MAX_RANKS`` (2**20) ranks, far above any job, so
that a mistyped rank count is refused at once instead of building a per-rank tuple until memory
runs out; at most ``MAX_NDIM`` (64) axes; extents, coordinates and a global array's element count
within an int64, what cuBLASMp's descriptors and cuFFTMp's boxes take. A block-cyclic piece is
listed box by box only by :meth:`~Distribution.boxes`, which refuses more than ``MAX_BOXES``
(2**20); its :meth:`~Distribution.box`, ``local_shape`` and ``owners`` are computed.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mpbind._infra import args as _args
from mpbind._infra.args import INT64_MAX, MAX_NDIM, MAX_RANKS
from mpbind.errors import UsageError

__all__ = [
    "BlockCyclic", "BlockCyclicArgs", "Box", "Boxes", "Distribution", "Pencils", "Replicated", "Split", "by_columns",
    "by_rows", "cufftmp_box", "hermitian_shape", "numroc", "padded_real_shape", "pitched_rows", "row_major_strides",
    "slab", "MAX_BOXES", "MAX_NDIM", "MAX_RANKS",
]

Shape = tuple[int, ...]
Layout = Literal["col", "row"]  # cuBLASMp grid layouts: ranks numbered down columns (COL_MAJOR) or along rows

# Beyond this many cells (times boxes), a gap is reported by its size only, not by a point it leaves out.
_GAP_SEARCH_CELLS = 1 << 18
_GAP_SEARCH_WORK = 1 << 22

#: The most boxes :meth:`Distribution.boxes` lists for one rank's block-cyclic piece.
MAX_BOXES = 2**20


def numroc(n: int, nb: int, iproc: int, isrc: int, nprocs: int) -> int:
    """ScaLAPACK's NUMROC: how many of `n` rows (in blocks of `nb`, the first block on process
    `isrc`) process `iproc` of `nprocs` holds."""
    n, nb, nprocs = _int(n, "n"), _int(nb, "nb", 1), _int(nprocs, "nprocs", 1)
    iproc, isrc = _int(iproc, "iproc"), _int(isrc, "isrc")
    mydist = (nprocs + iproc - isrc) % nprocs
    nblocks = n // nb
    count = (nblocks // nprocs) * nb
    extra = nblocks % nprocs
    if mydist < extra:
        count += nb
    elif mydist == extra:
        count += n % nb
    return count


# --- layout arithmetic (the one home of slab, box, stride and pitch arithmetic) ---------------------


def slab(extent: int, parts: int, part: int) -> tuple[int, int]:
    """``[start, stop)`` of `part` when `extent` is split into `parts` slabs as cuFFTMp splits it
    (and :class:`Split` by default): the first ``extent % parts`` slabs one longer."""
    extent, parts = _int(extent, "extent"), _int(parts, "parts", 1)
    part = _int(part, "part")
    if part >= parts:
        raise UsageError(f"part {part} is out of range for {parts} slabs")
    base, extra = divmod(extent, parts)
    start = part * base + min(part, extra)
    return start, start + base + (1 if part < extra else 0)


def row_major_strides(shape: Sequence[int], what: str | None = None) -> Shape:
    """Row-major strides in elements of a piece of `shape`, an empty extent counting as 1 (as cuFFTMp
    takes strides). With `what`, the span they describe (the product of the extents, empty ones as 1)
    is checked to fit an int64, the C type they are handed to (:class:`~mpbind.errors.UsageError`
    naming `what`)."""
    extents = tuple(max(int(n), 1) for n in shape)
    if what is not None:
        _args.product(extents, what)
    out: list[int] = []
    step = 1
    for extent in reversed(extents):
        out.append(step)
        step *= extent
    return tuple(reversed(out))


def hermitian_shape(shape: Sequence[int]) -> Shape:
    """The Hermitian half of a real transform's `shape`: the last axis ``n // 2 + 1`` long."""
    s = _shape(shape)
    return (*s[:-1], s[-1] // 2 + 1)


def padded_real_shape(shape: Sequence[int]) -> Shape:
    """How an in-place real-to-complex transform stores a real piece of `shape`: the last axis padded
    to ``2 * (n // 2 + 1)`` reals, the bytes of its Hermitian half."""
    s = _shape(shape)
    return (*s[:-1], 2 * (s[-1] // 2 + 1))


def pitched_rows(shape: Sequence[int], itemsize: int, storage: Sequence[int] | None = None) -> tuple[int, int, int]:
    """``(rows, row_bytes, pitch)`` of a row-major piece of `shape` with `itemsize`-byte elements, as a
    pitched copy moves it: its rows (every axis but the last), the bytes of one row, and the bytes from
    one row to the next in `storage` (its stored shape, the last axis padded; default `shape`)."""
    dims = tuple(shape)
    stored = tuple(storage) if storage is not None else dims
    last, stored_last = (dims[-1] if dims else 1), (stored[-1] if stored else 1)
    return math.prod(dims[:-1]), last * itemsize, stored_last * itemsize


def cufftmp_box(box: Box, ndim: int | None = None, scale: tuple[int, int] = (1, 1)) -> tuple[Shape, Shape, Shape]:
    """``(lower, upper, strides)`` of `box` as cuFFTMp takes a box: row-major strides; with `ndim`, as
    an `ndim`-D box (leading axes of extent 1 added); with `scale` ``(num, den)``, its last axis in
    units of ``num / den`` elements (a 2-byte element as half a 4-byte unit is ``(1, 2)``; the caller
    makes sure the edges are multiples of `den`)."""
    if not isinstance(box, Box):
        raise TypeError(f"box must be a Box, not {type(box).__name__}")
    lead = 0 if ndim is None else _int(ndim, "ndim") - len(box.lower)
    if lead < 0:
        raise UsageError(f"a {len(box.lower)}-D box cannot be described as {ndim}-D")
    num, den = _int(scale[0], "scale[0]", 1), _int(scale[1], "scale[1]", 1)
    lower = (0,) * lead + box.lower
    upper = (1,) * lead + box.upper
    if (num, den) != (1, 1):
        lower = (*lower[:-1], lower[-1] * num // den)
        upper = (*upper[:-1], upper[-1] * num // den)
    return lower, upper, row_major_strides(tuple(u - lo for lo, u in zip(lower, upper, strict=True)))


# --- argument checks (every rank runs them on the same values) ------------------------------------


def _int(value: Any, name: str, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    if type(value) is int and minimum <= value <= maximum:  # the common case, asked per rank: no more to do
        return value
    v = _args.integer(value, name, minimum=minimum)
    if v > maximum:
        raise UsageError(f"{name} must be <= {_args.show(maximum)}, got {_args.show(v)}")
    return v


def _ints(values: Any, name: str, minimum: int = 0, length: int | None = None,
          limit: int = MAX_NDIM) -> tuple[int, ...]:
    """At most `limit` ints (exactly `length` when given), read no further than that."""
    given = _args.sequence(values, name, limit if length is None else max(length, limit))
    out = tuple(_int(v, f"{name}[{i}]", minimum) for i, v in enumerate(given))
    if length is not None and len(out) != length:
        raise UsageError(f"{name} must have {length} entries, got {len(out)}: {out}")
    return out


def _shape(shape: Any) -> Shape:
    out = _ints(shape, "shape")
    if not out:
        raise UsageError("shape must have at least one axis")
    _args.product(out, f"shape {out}'s element count")
    return out


def _nranks(value: Any, name: str = "nranks") -> int:
    n = _int(value, name, 1)
    if n > MAX_RANKS:
        raise UsageError(f"{name} is {_args.show(n)}: a distribution takes at most MAX_RANKS = {MAX_RANKS} ranks, "
                         "more than any job has")
    return n


def _axis(axis: Any, ndim: int, name: str = "axis") -> int:
    a = _int(axis, name, minimum=-ndim)
    if a >= ndim:
        raise UsageError(f"{name} {a} is out of range for a {ndim}-D array")
    return a % ndim


def _balanced(extent: int, parts: int) -> tuple[int, ...]:
    """The first ``extent % parts`` parts one larger (cuFFTMp's slabs, numpy.array_split)."""
    q, r = divmod(extent, parts)
    return tuple(q + (1 if i < r else 0) for i in range(parts))


def _counts(counts: Any, extent: int, parts: int, name: str) -> tuple[int, ...]:
    if counts is None:
        return _balanced(extent, parts)
    out = _ints(counts, name, length=parts)
    if sum(out) != extent:
        raise UsageError(f"{name} {out} add up to {sum(out)}, not the extent {extent}")
    return out


def _offsets(counts: Sequence[int]) -> tuple[int, ...]:
    return tuple(itertools.accumulate(counts, initial=0))


def _blocked_counts(counts: Sequence[int]) -> tuple[int, int] | None:
    """(block, source process) when `counts` (per process, in grid order) are what NUMROC gives for
    one block size: leading empty processes, then full blocks, a last partial one, then empty ones."""
    src = 0
    while src < len(counts) and counts[src] == 0:
        src += 1
    if src == len(counts):
        return 1, 0  # an empty extent: any block describes it
    block = counts[src]
    rest = counts[src:]
    full = 0
    while full < len(rest) and rest[full] == block:
        full += 1
    tail = rest[full:]
    if tail and not (tail[0] < block and all(c == 0 for c in tail[1:])):
        return None
    return block, src


# --- values -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """The half-open box ``[lower, upper)`` of global element coordinates."""

    lower: Shape
    upper: Shape

    def __post_init__(self) -> None:
        lower = _ints(self.lower, "lower")
        upper = _ints(self.upper, "upper", length=len(lower))
        if any(lo > u for lo, u in zip(lower, upper, strict=True)):
            raise UsageError(f"a box needs lower <= upper on every axis, got {list(lower)} and {list(upper)}")
        _args.product((u - lo for lo, u in zip(lower, upper, strict=True)), f"box {list(lower)}, {list(upper)}'s "
                      "element count")
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    @classmethod
    def _of(cls, lower: Shape, upper: Shape) -> Box:
        """A box whose corners are a distribution's own, checked when it was made (no check again:
        a plan over 2**20 ranks makes millions of boxes)."""
        box = object.__new__(cls)
        object.__setattr__(box, "lower", lower)
        object.__setattr__(box, "upper", upper)
        return box

    @property
    def shape(self) -> Shape:
        return tuple(u - lo for lo, u in zip(self.lower, self.upper, strict=True))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def empty(self) -> bool:
        return self.size == 0

    def contains(self, index: Sequence[int]) -> bool:
        return all(lo <= i < u for i, lo, u in zip(index, self.lower, self.upper, strict=True))

    def intersection(self, other: Box) -> Box | None:
        """The common box, or None when the two share no element."""
        if not isinstance(other, Box):
            raise TypeError(f"other must be a Box, not {type(other).__name__}")
        lower = tuple(max(a, b) for a, b in zip(self.lower, other.lower, strict=True))
        upper = tuple(min(a, b) for a, b in zip(self.upper, other.upper, strict=True))
        if any(lo >= u for lo, u in zip(lower, upper, strict=True)):
            return None
        return Box._of(lower, upper)

    def strides(self) -> Shape:
        """Row-major strides of the box in elements (an empty extent counts as 1, as cuFFTMp expects)."""
        return row_major_strides(self.shape)

    def __repr__(self) -> str:
        return f"Box({list(self.lower)}, {list(self.upper)})"


@dataclass(frozen=True)
class BlockCyclicArgs:
    """A 2-D block-cyclic layout as a cuBLASMp matrix descriptor takes it (ScaLAPACK's ``DESC``).

    ``(m, n)`` global shape, ``(mb, nb)`` blocks, the first block on process ``(rsrc, csrc)`` of an
    ``nprow x npcol`` grid whose ranks are numbered down columns (``layout="col"``, cuBLASMp's
    COL_MAJOR: rank ``prow + pcol * nprow``) or along rows (``"row"``: ``prow * npcol + pcol``).
    """

    m: int
    n: int
    mb: int
    nb: int
    rsrc: int
    csrc: int
    nprow: int
    npcol: int
    layout: Layout

    def __post_init__(self) -> None:
        for name, minimum in (("m", 0), ("n", 0), ("mb", 1), ("nb", 1), ("nprow", 1), ("npcol", 1), ("rsrc", 0),
                              ("csrc", 0)):
            # Kept as Python ints: a NumPy integer would wrap in the products below.
            object.__setattr__(self, name, _int(getattr(self, name), name, minimum))
        _nranks(self.nprow * self.npcol, f"a {self.nprow} x {self.npcol} grid's process count")
        if self.rsrc >= self.nprow or self.csrc >= self.npcol:
            raise UsageError(f"(rsrc, csrc) = ({self.rsrc}, {self.csrc}) is outside the "
                             f"{self.nprow} x {self.npcol} grid")
        if self.layout not in ("col", "row"):
            raise UsageError(f"layout must be 'col' or 'row', got {self.layout!r}")

    @property
    def nranks(self) -> int:
        return self.nprow * self.npcol

    def coords(self, rank: int) -> tuple[int, int]:
        """(process row, process column) of `rank`."""
        if _int(rank, "rank") >= self.nranks:
            raise UsageError(f"rank {rank} is out of range for the {self.nprow} x {self.npcol} grid")
        if self.layout == "col":
            return rank % self.nprow, rank // self.nprow
        return rank // self.npcol, rank % self.npcol

    def rank_of(self, prow: int, pcol: int) -> int:
        if _int(prow, "prow") >= self.nprow or _int(pcol, "pcol") >= self.npcol:
            raise UsageError(f"({prow}, {pcol}) is outside the {self.nprow} x {self.npcol} grid")
        return prow + pcol * self.nprow if self.layout == "col" else prow * self.npcol + pcol

    def local_shape(self, rank: int) -> tuple[int, int]:
        """(rows, columns) of `rank`'s local matrix (NUMROC along each axis)."""
        prow, pcol = self.coords(rank)
        return (numroc(self.m, self.mb, prow, self.rsrc, self.nprow),
                numroc(self.n, self.nb, pcol, self.csrc, self.npcol))

    def lld(self, rank: int) -> int:
        """The smallest leading dimension of `rank`'s column-major local matrix (at least 1)."""
        return max(1, self.local_shape(rank)[0])

    @property
    def contiguous(self) -> bool:
        """Each process holds at most one block along each axis (a 1-D or 2-D split without cycling)."""
        return self.mb * self.nprow >= self.m and self.nb * self.npcol >= self.n


# --- distributions --------------------------------------------------------------------------------


class Distribution:
    """Where each rank's piece of a global array lies. Immutable, hashable, compared by value."""

    shape: Shape
    nranks: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Distribution is the base of the distributions: make a Replicated, Split, Pencils, Boxes "
                        "or BlockCyclic (or by_rows(), by_columns())")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def replicated(self) -> bool:
        """True when every rank holds the whole array."""
        return False

    def boxes(self, rank: int) -> tuple[Box, ...]:
        """The boxes of `rank`'s piece (one for box-shaped pieces; a block-cyclic piece has several)."""
        raise NotImplementedError

    def box(self, rank: int) -> Box:
        """`rank`'s piece as one box; UsageError when it is not one (a cyclic layout)."""
        pieces = self.boxes(rank)
        if len(pieces) != 1:
            raise UsageError(f"rank {rank}'s piece of {self!r} is {len(pieces)} boxes, not one")
        return pieces[0]

    def local_shape(self, rank: int) -> Shape:
        """The shape of `rank`'s local array."""
        return self.box(rank).shape

    def owners(self, index: Sequence[int]) -> tuple[int, ...]:
        """The ranks holding the element at global `index`."""
        idx = self._index(index)
        return tuple(r for r in range(self.nranks) if any(b.contains(idx) for b in self.boxes(r)))

    def check(self) -> Distribution:
        """Self, when the pieces tile the global array exactly once; else UsageError naming the ranks
        and boxes that overlap or the part no rank holds."""
        pieces = [(r, b) for r in range(self.nranks) for b in self.boxes(r)]
        _check_tiling(self.shape, pieces)
        return self

    def to_block_cyclic(self) -> BlockCyclicArgs:
        """The cuBLASMp descriptor arguments of this 2-D layout; UsageError when a block-cyclic
        descriptor cannot describe it (uneven counts not of NUMROC's form, replicated, N-D)."""
        if self.ndim != 2:
            raise UsageError(f"a block-cyclic descriptor describes 2-D arrays; {self!r} is {self.ndim}-D")
        self.check()
        return _grid_of(self.shape, [self.box(r) for r in range(self.nranks)], repr(self))

    def to_cufftmp(self, rank: int) -> tuple[Shape, Shape, Shape]:
        """(lower, upper, strides) of `rank`'s box as cuFFTMp takes them (row-major strides)."""
        return cufftmp_box(self.box(rank))

    # helpers shared by the subclasses
    def _rank(self, rank: Any) -> int:
        r = _int(rank, "rank")
        if r >= self.nranks:
            raise UsageError(f"rank {r} is out of range for {self.nranks} ranks")
        return r

    def _index(self, index: Any) -> Shape:
        idx = _ints(index, "index", length=self.ndim)
        for axis, (i, extent) in enumerate(zip(idx, self.shape, strict=True)):
            if i >= extent:
                raise UsageError(f"index {list(idx)} is outside the shape {list(self.shape)} (axis {axis})")
        return idx


@dataclass(frozen=True, repr=False)
class Replicated(Distribution):
    """Every rank holds the whole array."""

    shape: Shape
    nranks: int

    def __init__(self, shape: Sequence[int], nranks: int) -> None:
        object.__setattr__(self, "shape", _shape(shape))
        object.__setattr__(self, "nranks", _nranks(nranks))

    @property
    def replicated(self) -> bool:
        return True

    def boxes(self, rank: int) -> tuple[Box, ...]:
        self._rank(rank)
        return (Box._of((0,) * self.ndim, self.shape),)

    def owners(self, index: Sequence[int]) -> tuple[int, ...]:
        self._index(index)
        return tuple(range(self.nranks))

    def check(self) -> Distribution:
        return self  # every rank holds every element: that is what replicated means

    def to_block_cyclic(self) -> BlockCyclicArgs:
        raise UsageError(f"{self!r}: a block-cyclic descriptor gives each element one owner; a replicated array "
                         "has every rank as its owner")

    def __repr__(self) -> str:
        return f"Replicated(shape={self.shape}, nranks={self.nranks})"


@dataclass(frozen=True, repr=False)
class Split(Distribution):
    """Contiguous pieces along one axis, in rank order: rank r holds ``counts[r]`` consecutive
    indices of `axis` (slabs of an N-D array; rows or columns of a matrix). `counts` defaults to
    a uniform split with the extra elements on the first ranks."""

    shape: Shape
    nranks: int
    axis: int
    counts: Shape
    _starts: Shape = field(init=False, repr=False, compare=False)  # the offsets, computed once

    def __init__(self, shape: Sequence[int], nranks: int, axis: int = 0, counts: Sequence[int] | None = None) -> None:
        s = _shape(shape)
        p = _nranks(nranks)
        a = _axis(axis, len(s))
        c = _counts(counts, s[a], p, "counts")
        object.__setattr__(self, "shape", s)
        object.__setattr__(self, "nranks", p)
        object.__setattr__(self, "axis", a)
        object.__setattr__(self, "counts", c)
        object.__setattr__(self, "_starts", _offsets(c))  # not a field: computed once, not compared

    @classmethod
    def blocked(cls, shape: Sequence[int], nranks: int, axis: int = 0, block: int | None = None) -> Split:
        """The split NUMROC makes: `block` (default ``ceil(extent / nranks)``) per rank until the extent
        runs out (10 over 4 ranks: ``(3, 3, 3, 1)``). Any such split has a block-cyclic descriptor."""
        s = _shape(shape)
        p = _nranks(nranks)
        extent = s[_axis(axis, len(s))]
        b = max(1, -(-extent // p)) if block is None else _int(block, "block", 1)
        if b * p < extent:
            raise UsageError(f"block {b} x {p} ranks covers {b * p} of the extent {extent}: a split needs "
                             f"block >= {-(-extent // p)}")
        return cls(s, p, axis, [numroc(extent, b, r, 0, p) for r in range(p)])

    @property
    def offsets(self) -> Shape:
        """Where each rank's piece starts along `axis` (and, last, the extent)."""
        return self._starts

    @property
    def uniform(self) -> bool:
        return len(set(self.counts)) == 1

    def boxes(self, rank: int) -> tuple[Box, ...]:
        r = self._rank(rank)
        lower = [0] * self.ndim
        upper = list(self.shape)
        lower[self.axis], upper[self.axis] = self._starts[r], self._starts[r + 1]
        return (Box._of(tuple(lower), tuple(upper)),)

    def owners(self, index: Sequence[int]) -> tuple[int, ...]:
        i = self._index(index)[self.axis]
        r = bisect.bisect_right(self._starts, i) - 1  # the last rank starting at or before i: it is not empty
        return (r,)

    def check(self) -> Distribution:
        return self  # counts that add up to the extent tile it exactly once

    def __repr__(self) -> str:
        return f"Split(shape={self.shape}, axis={self.axis}, counts={self.counts})"


@dataclass(frozen=True, repr=False)
class Pencils(Distribution):
    """Pieces on a ``grid[0] x grid[1]`` grid of ranks over two axes (``axes``): rank
    ``i * grid[1] + j`` holds piece ``i`` along ``axes[0]`` and piece ``j`` along ``axes[1]``, all of
    the other axes. `counts` (a pair of per-piece counts) defaults to uniform splits of both axes."""

    shape: Shape
    nranks: int
    grid: tuple[int, int]
    axes: tuple[int, int]
    counts: tuple[Shape, Shape]
    _starts: tuple[Shape, Shape] = field(init=False, repr=False, compare=False)  # the offsets, computed once

    def __init__(self, shape: Sequence[int], grid: Sequence[int], axes: Sequence[int] = (0, 1),
                 counts: Sequence[Sequence[int]] | None = None) -> None:
        s = _shape(shape)
        if len(s) < 2:
            raise UsageError(f"pencils split two axes; shape {s} has {len(s)}")
        g = _ints(grid, "grid", 1, length=2)
        _nranks(g[0] * g[1], f"grid {g}'s rank count")
        ax = tuple(_axis(a, len(s), f"axes[{i}]") for i, a in enumerate(_ints(axes, "axes", -len(s), length=2)))
        if ax[0] == ax[1]:
            raise UsageError(f"axes must be two different axes, got {ax}")
        if counts is None:
            c: tuple[Shape, Shape] = (_balanced(s[ax[0]], g[0]), _balanced(s[ax[1]], g[1]))
        else:
            if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or len(counts) != 2:
                raise TypeError("counts must be a pair of per-piece counts (one sequence per axis)")
            c = (_counts(counts[0], s[ax[0]], g[0], "counts[0]"), _counts(counts[1], s[ax[1]], g[1], "counts[1]"))
        object.__setattr__(self, "shape", s)
        object.__setattr__(self, "nranks", g[0] * g[1])
        object.__setattr__(self, "grid", (g[0], g[1]))
        object.__setattr__(self, "axes", (ax[0], ax[1]))
        object.__setattr__(self, "counts", c)
        object.__setattr__(self, "_starts", (_offsets(c[0]), _offsets(c[1])))  # not a field

    def boxes(self, rank: int) -> tuple[Box, ...]:
        r = self._rank(rank)
        i, j = divmod(r, self.grid[1])
        lower = [0] * self.ndim
        upper = list(self.shape)
        for axis, piece, off in ((self.axes[0], i, self._starts[0]), (self.axes[1], j, self._starts[1])):
            lower[axis], upper[axis] = off[piece], off[piece + 1]
        return (Box._of(tuple(lower), tuple(upper)),)

    def owners(self, index: Sequence[int]) -> tuple[int, ...]:
        idx = self._index(index)
        i = bisect.bisect_right(self._starts[0], idx[self.axes[0]]) - 1
        j = bisect.bisect_right(self._starts[1], idx[self.axes[1]]) - 1
        return (i * self.grid[1] + j,)

    def check(self) -> Distribution:
        return self  # two splits that each add up tile the array exactly once

    def __repr__(self) -> str:
        return f"Pencils(shape={self.shape}, grid={self.grid}, axes={self.axes}, counts={self.counts})"


@dataclass(frozen=True, repr=False)
class Boxes(Distribution):
    """Arbitrary per-rank boxes: rank r holds ``boxes[r]``, a ``(lower, upper)`` pair of corners
    (or a :class:`Box`). Nothing is assumed: :meth:`check` says whether they tile the array."""

    shape: Shape
    nranks: int
    pieces: tuple[Box, ...]

    def __init__(self, shape: Sequence[int], boxes: Sequence[Box | tuple[Sequence[int], Sequence[int]]]) -> None:
        s = _shape(shape)
        if isinstance(boxes, (str, bytes)) or not isinstance(boxes, Sequence) or not boxes:
            raise TypeError("boxes must be a non-empty sequence of (lower, upper) corners, one per rank")
        _nranks(len(boxes), "the number of boxes (one per rank)")
        pieces = []
        for r, given in enumerate(boxes):
            lower: Sequence[int]
            upper: Sequence[int]
            if isinstance(given, Box):
                lower, upper = given.lower, given.upper
            else:
                try:
                    lower, upper = _args.sequence(given, f"boxes[{r}]", 2, "corners")
                except (TypeError, ValueError):
                    raise TypeError(f"boxes[{r}] must be a (lower, upper) pair of corners, not "
                                    f"{type(given).__name__}") from None
            lo = _ints(lower, f"boxes[{r}] lower", length=len(s))
            up = _ints(upper, f"boxes[{r}] upper", length=len(s))
            if any(a > b for a, b in zip(lo, up, strict=True)) or any(b > e for b, e in zip(up, s, strict=True)):
                raise UsageError(f"rank {r}'s box Box({list(lo)}, {list(up)}) is not a box inside the shape {list(s)} "
                                 "(need 0 <= lower <= upper <= shape)")
            pieces.append(Box._of(lo, up))  # inside the shape: checked above
        object.__setattr__(self, "shape", s)
        object.__setattr__(self, "nranks", len(pieces))
        object.__setattr__(self, "pieces", tuple(pieces))

    @classmethod
    def exchange(cls, shape: Sequence[int], box: Box | tuple[Sequence[int], Sequence[int]],
                 allgather: Callable[[Any], Sequence[Any]]) -> Boxes:
        """The distribution whose rank r holds the `box` rank r passed: `allgather` (collective, e.g.
        an mpi4py communicator's ``allgather``) collects them. Every rank calls it unconditionally, so
        a refusal afterwards (``check()``) is the same on every rank."""
        given = (tuple(box.lower), tuple(box.upper)) if isinstance(box, Box) else box
        return cls(shape, list(allgather(given)))

    def boxes(self, rank: int) -> tuple[Box, ...]:
        return (self.pieces[self._rank(rank)],)

    def __repr__(self) -> str:
        return f"Boxes(shape={self.shape}, boxes={list(self.pieces)})"


@dataclass(frozen=True, repr=False)
class BlockCyclic(Distribution):
    """ScaLAPACK's 2-D block-cyclic layout: ``block`` = (mb, nb) blocks dealt round-robin over an
    ``nprow x npcol`` grid from process ``src``; `layout` numbers the grid's ranks down columns
    (``"col"``) or along rows (``"row"``), as cuBLASMp's grids do."""

    shape: Shape
    nranks: int
    grid: tuple[int, int]
    block: tuple[int, int]
    src: tuple[int, int]
    layout: Layout

    def __init__(self, shape: Sequence[int], grid: Sequence[int], block: Sequence[int],
                 src: Sequence[int] = (0, 0), layout: Layout = "col") -> None:
        s = _ints(shape, "shape", length=2)
        _args.product(s, f"shape {s}'s element count")
        g = _ints(grid, "grid", 1, length=2)
        _nranks(g[0] * g[1], f"grid {g}'s rank count")
        b = _ints(block, "block", 1, length=2)
        sr = _ints(src, "src", length=2)
        if sr[0] >= g[0] or sr[1] >= g[1]:
            raise UsageError(f"src {sr} is outside the {g[0]} x {g[1]} grid")
        if layout not in ("col", "row"):
            raise UsageError(f"layout must be 'col' or 'row', got {layout!r}")
        object.__setattr__(self, "shape", s)
        object.__setattr__(self, "nranks", g[0] * g[1])
        object.__setattr__(self, "grid", (g[0], g[1]))
        object.__setattr__(self, "block", (b[0], b[1]))
        object.__setattr__(self, "src", (sr[0], sr[1]))
        object.__setattr__(self, "layout", layout)

    def to_block_cyclic(self) -> BlockCyclicArgs:
        return BlockCyclicArgs(self.shape[0], self.shape[1], self.block[0], self.block[1], self.src[0], self.src[1],
                               self.grid[0], self.grid[1], self.layout)

    def _blocks(self, axis: int, proc: int) -> range:
        """The blocks (their numbers) along `axis` that process row/column `proc` holds: computed, not listed."""
        extent, b, p, s = self.shape[axis], self.block[axis], self.grid[axis], self.src[axis]
        return range((proc - s) % p, (extent + b - 1) // b, p)

    def _ranges(self, axis: int, proc: int) -> list[tuple[int, int]]:
        """The index ranges along `axis` that process row/column `proc` holds."""
        extent, b = self.shape[axis], self.block[axis]
        return [(i * b, min((i + 1) * b, extent)) for i in self._blocks(axis, proc)]

    def boxes(self, rank: int) -> tuple[Box, ...]:
        prow, pcol = self.to_block_cyclic().coords(self._rank(rank))
        count = len(self._blocks(0, prow)) * len(self._blocks(1, pcol))
        if count > MAX_BOXES:
            raise UsageError(f"rank {rank}'s piece of {self!r} is {count} blocks; boxes() lists at most {MAX_BOXES} "
                             "(local_shape() and owners() answer without listing them)")
        return tuple(Box._of((r0, c0), (r1, c1)) for r0, r1 in self._ranges(0, prow)
                     for c0, c1 in self._ranges(1, pcol))

    def box(self, rank: int) -> Box:
        prow, pcol = self.to_block_cyclic().coords(self._rank(rank))
        rows, cols = self._blocks(0, prow), self._blocks(1, pcol)
        if len(rows) > 1 or len(cols) > 1:
            raise UsageError(f"rank {rank}'s piece of {self!r} is {len(rows)} x {len(cols)} blocks, not one box")
        r0, r1 = self._ranges(0, prow)[0] if rows else (0, 0)
        c0, c1 = self._ranges(1, pcol)[0] if cols else (0, 0)
        return Box._of((r0, c0), (r1, c1))

    def local_shape(self, rank: int) -> Shape:
        return self.to_block_cyclic().local_shape(self._rank(rank))

    def owners(self, index: Sequence[int]) -> tuple[int, ...]:
        i, j = self._index(index)
        args = self.to_block_cyclic()
        prow = (i // self.block[0] + self.src[0]) % self.grid[0]
        pcol = (j // self.block[1] + self.src[1]) % self.grid[1]
        return (args.rank_of(prow, pcol),)

    def check(self) -> Distribution:
        return self  # every block has exactly one owner

    def __repr__(self) -> str:
        return (f"BlockCyclic(shape={self.shape}, grid={self.grid}, block={self.block}, src={self.src}, "
                f"layout={self.layout!r})")


def by_rows(shape: Sequence[int], nranks: int, counts: Sequence[int] | None = None) -> Split:
    """A matrix split by rows (rank r holds ``counts[r]`` consecutive rows, all columns)."""
    return Split(shape, nranks, 0, counts)


def by_columns(shape: Sequence[int], nranks: int, counts: Sequence[int] | None = None) -> Split:
    """A matrix split by columns (rank r holds ``counts[r]`` consecutive columns, all rows)."""
    return Split(shape, nranks, 1, counts)


# --- tiling and grids -----------------------------------------------------------------------------


def _check_tiling(shape: Shape, pieces: Sequence[tuple[int, Box]]) -> None:
    """UsageError unless the boxes (rank, box) cover `shape` exactly once."""
    whole = Box((0,) * len(shape), shape)
    live = [(r, b) for r, b in pieces if not b.empty]
    # A sweep along the axis where the boxes start at the most places: each box is compared with the
    # boxes before it that reach past its start there (in a tiling, its neighbours along the other
    # axes), not with every other box.
    axis = max(range(len(shape)), key=lambda a: len({b.lower[a] for _, b in live}), default=0)
    live.sort(key=lambda rb: (rb[1].lower[axis], rb[0]))
    open_: list[tuple[int, Box]] = []
    for r2, b2 in live:
        open_ = [(r, b) for r, b in open_ if b.upper[axis] > b2.lower[axis]]
        for r1, b1 in open_:
            common = b1.intersection(b2)
            if common is not None:
                first, second = sorted(((r1, b1), (r2, b2)), key=lambda rb: rb[0])
                who = f"rank {r1}" if r1 == r2 else f"ranks {first[0]} and {second[0]}"
                raise UsageError(f"{who} overlap: {first[1]!r} and {second[1]!r} share {common!r} "
                                 f"({common.size} elements)")
        open_.append((r2, b2))
    covered = sum(b.size for _, b in live)
    if covered != whole.size:
        hole = _uncovered(shape, [b for _, b in live])
        where = f"; no rank holds {hole!r}" if hole is not None else ""
        raise UsageError(f"the boxes cover {covered} of the {whole.size} elements of shape {list(shape)}{where}")


def _uncovered(shape: Shape, boxes: Sequence[Box]) -> Box | None:
    """A cell (between the boxes' corners) that no box covers, when there are few enough to look."""
    cuts = [sorted({0, extent, *(b.lower[a] for b in boxes), *(b.upper[a] for b in boxes)})
            for a, extent in enumerate(shape)]
    cells = math.prod(len(c) - 1 for c in cuts)
    if cells > _GAP_SEARCH_CELLS or cells * len(boxes) > _GAP_SEARCH_WORK:
        return None
    for cell in itertools.product(*(list(zip(c, c[1:], strict=False)) for c in cuts)):
        lower = tuple(lo for lo, _ in cell)
        if not any(b.contains(lower) for b in boxes):
            return Box(lower, tuple(up for _, up in cell))
    return None


def _grid_of(shape: Shape, boxes: Sequence[Box], what: str) -> BlockCyclicArgs:
    """The block-cyclic descriptor of per-rank boxes that form a grid: rank r's box is cell (i, j) of
    a row partition x column partition, ranks numbered along rows or down columns, and each
    partition's counts of NUMROC's form (one block size, the remainder last)."""
    p = len(boxes)  # they tile the array: the distribution's check() ran
    # P x 1 grids are numbered down the column (COL_MAJOR) and 1 x P along the row, as cuBLASMp's
    # tensor-parallel layouts are; the other layout is tried second (the same mapping for 1-D grids).
    candidates = [(nprow, p // nprow) for nprow in range(1, p + 1) if p % nprow == 0]
    for nprow, npcol in candidates:
        layouts: tuple[Layout, Layout] = ("col", "row") if nprow >= npcol else ("row", "col")
        for layout in layouts:
            args = _try_grid(shape, boxes, nprow, npcol, layout)
            if args is not None:
                return args
    raise UsageError(f"{what}: the pieces are not the cells of a process grid with one block size per axis "
                     f"(NUMROC's form: equal counts, the remainder last); a block-cyclic descriptor cannot "
                     f"describe them (use Split.blocked or counts of that form)")


def _try_grid(shape: Shape, boxes: Sequence[Box], nprow: int, npcol: int, layout: Layout) -> BlockCyclicArgs | None:
    probe = BlockCyclicArgs(shape[0], shape[1], 1, 1, 0, 0, nprow, npcol, layout)
    rows: dict[int, tuple[int, int]] = {}
    cols: dict[int, tuple[int, int]] = {}
    for rank, box in enumerate(boxes):
        prow, pcol = probe.coords(rank)
        r, c = rows.setdefault(prow, (box.lower[0], box.upper[0])), cols.setdefault(pcol, (box.lower[1], box.upper[1]))
        if r != (box.lower[0], box.upper[0]) or c != (box.lower[1], box.upper[1]):
            return None
    found = []
    for parts in ([rows[i] for i in range(nprow)], [cols[j] for j in range(npcol)]):
        # Grid order must be global order: a process row's rows come right after the previous one's.
        starts = [lo for lo, hi in parts if hi > lo]
        blocked = _blocked_counts([hi - lo for lo, hi in parts])
        if starts != sorted(starts) or blocked is None:
            return None
        found.append(blocked)
    (mb, rsrc), (nb, csrc) = found
    args = BlockCyclicArgs(shape[0], shape[1], mb, nb, rsrc, csrc, nprow, npcol, layout)
    if any(args.local_shape(r) != b.shape for r, b in enumerate(boxes)):
        return None
    return args
