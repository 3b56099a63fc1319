"""Distributions as values (mpbind.distributions): the pieces of every rank, the owners of every
element, the tiling check and its refusals, and the conversions to cuBLASMp descriptors (against
NUMROC, brute force and the core's own local-shape rule) and to cuFFTMp boxes."""

from __future__ import annotations

import dataclasses
import itertools
import pickle
from typing import Any

import numpy as np
import pytest

from mpbind import _core
from mpbind import distributions as dist
from mpbind.cublasmp import GridLayout
from mpbind.errors import UsageError

LAYOUT = {"col": int(GridLayout.COL_MAJOR), "row": int(GridLayout.ROW_MAJOR)}


def coverage(d: dist.Distribution) -> np.ndarray:
    """How many ranks hold each element, from the pieces' boxes."""
    count = np.zeros(d.shape, dtype=int)
    for r in range(d.nranks):
        for box in d.boxes(r):
            count[tuple(slice(lo, up) for lo, up in zip(box.lower, box.upper, strict=True))] += 1
    return count


def owner_map(d: dist.Distribution) -> np.ndarray:
    out = np.full(d.shape, -1)
    for index in itertools.product(*map(range, d.shape)):
        owners = d.owners(index)
        assert len(owners) == 1, (index, owners)
        out[index] = owners[0]
    return out


# --- NUMROC --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 100])
@pytest.mark.parametrize("nb", [1, 3, 16, 128])
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_numroc_counts_the_rows_a_process_holds(n: int, nb: int, nprocs: int) -> None:
    for isrc in range(nprocs):
        for iproc in range(nprocs):
            brute = sum(1 for i in range(n) if (i // nb + isrc) % nprocs == iproc)
            assert dist.numroc(n, nb, iproc, isrc, nprocs) == brute


@pytest.mark.parametrize(("grid", "layout"), [((1, 1), "col"), ((2, 1), "col"), ((1, 3), "row"), ((2, 2), "col"),
                                              ((2, 2), "row"), ((3, 2), "col"), ((2, 3), "row")])
@pytest.mark.parametrize(("shape", "block", "src"), [((10, 7), (3, 2), (0, 0)), ((10, 7), (4, 4), (1, 0)),
                                                     ((1, 9), (1, 2), (0, 1)), ((16, 16), (16, 16), (0, 0))])
def test_block_cyclic_local_shapes_match_the_core(grid: tuple[int, int], layout: Any, shape: tuple[int, int],
                                                  block: tuple[int, int], src: tuple[int, int]) -> None:
    src = (src[0] % grid[0], src[1] % grid[1])
    d = dist.BlockCyclic(shape, grid, block, src, layout)
    args = d.to_block_cyclic()
    for rank in range(d.nranks):
        core = _core._testing.cublasmp_local_shape(*shape, *block, *src, *grid, LAYOUT[layout], rank)
        assert args.local_shape(rank) == tuple(core) == d.local_shape(rank)
        assert args.lld(rank) == max(1, core[0])
    assert (coverage(d) == 1).all()
    owners = owner_map(d)
    for rank in range(d.nranks):
        assert (owners == rank).sum() == int(np.prod(d.local_shape(rank)))
        assert sum(b.size for b in d.boxes(rank)) == int(np.prod(d.local_shape(rank)))


def test_block_cyclic_grid_numbering() -> None:
    col = dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 3, "col")
    row = dataclasses.replace(col, layout="row")
    assert [col.coords(r) for r in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert [row.coords(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    for args in (col, row):
        assert all(args.rank_of(*args.coords(r)) == r for r in range(6))
    assert not col.contiguous and dist.BlockCyclicArgs(8, 8, 4, 8, 0, 0, 2, 1, "col").contiguous


# --- splits, pencils, boxes, replicated ----------------------------------------------------------


@pytest.mark.parametrize(("extent", "nranks", "counts"), [(8, 2, (4, 4)), (10, 4, (3, 3, 2, 2)), (3, 4, (1, 1, 1, 0)),
                                                          (0, 2, (0, 0)), (7, 1, (7,))])
def test_split_default_puts_the_extra_elements_first(extent: int, nranks: int, counts: tuple[int, ...]) -> None:
    s = dist.Split((extent, 5), nranks)
    assert s.counts == counts
    assert s.offsets == tuple(np.concatenate([[0], np.cumsum(counts)]))
    assert s.uniform == (len(set(counts)) == 1)


@pytest.mark.parametrize(("extent", "nranks", "block", "counts"), [
    (10, 4, None, (3, 3, 3, 1)), (8, 2, None, (4, 4)), (12, 4, 4, (4, 4, 4, 0)), (5, 3, 5, (5, 0, 0)),
])
def test_split_blocked_is_numroc(extent: int, nranks: int, block: int | None, counts: tuple[int, ...]) -> None:
    s = dist.Split.blocked((4, extent), nranks, axis=1, block=block)
    assert s.counts == counts
    b = block or -(-extent // nranks)
    assert s.counts == tuple(dist.numroc(extent, b, r, 0, nranks) for r in range(nranks))


@pytest.mark.parametrize("shape", [(12, 5), (6, 7, 8), (9,)])
@pytest.mark.parametrize("nranks", [1, 2, 3, 5])
def test_splits_along_any_axis_tile_once(shape: tuple[int, ...], nranks: int) -> None:
    for axis in range(len(shape)):
        s = dist.Split(shape, nranks, axis)
        assert (coverage(s) == 1).all()
        owners = owner_map(s)
        for rank in range(nranks):
            box = s.box(rank)
            assert s.local_shape(rank) == box.shape
            assert box.shape[axis] == s.counts[rank]
            assert (owners[tuple(slice(lo, up) for lo, up in zip(box.lower, box.upper, strict=True))] == rank).all()
        assert s.check() is s


def test_split_with_negative_axis_and_uneven_counts() -> None:
    s = dist.Split((4, 10), 3, axis=-1, counts=[5, 0, 5])
    assert s.axis == 1
    assert [s.box(r) for r in range(3)] == [dist.Box((0, 0), (4, 5)), dist.Box((0, 5), (4, 5)),
                                            dist.Box((0, 5), (4, 10))]
    assert s.owners((2, 5)) == (2,)
    assert dist.by_rows((6, 2), 2) == dist.Split((6, 2), 2, 0)
    assert dist.by_columns((6, 2), 2, counts=(2, 0)).counts == (2, 0)


@pytest.mark.parametrize(("shape", "grid", "axes"), [((8, 6, 5), (2, 3), (0, 1)), ((8, 6, 5), (3, 2), (1, 2)),
                                                     ((7, 9), (2, 2), (1, 0)), ((5, 4, 3), (1, 4), (2, 0))])
def test_pencils_tile_once(shape: tuple[int, ...], grid: tuple[int, int], axes: tuple[int, int]) -> None:
    p = dist.Pencils(shape, grid, axes)
    assert p.nranks == grid[0] * grid[1]
    assert (coverage(p) == 1).all()
    for rank in range(p.nranks):
        i, j = divmod(rank, grid[1])
        box = p.box(rank)
        assert box.shape[axes[0]] == p.counts[0][i] and box.shape[axes[1]] == p.counts[1][j]
        assert p.owners(box.lower) == (rank,) if not box.empty else True
    assert p.check() is p


def test_pencils_with_uneven_counts() -> None:
    p = dist.Pencils((6, 5, 4), (2, 2), counts=((4, 2), (1, 4)))
    assert [p.local_shape(r) for r in range(4)] == [(4, 1, 4), (4, 4, 4), (2, 1, 4), (2, 4, 4)]
    assert (coverage(p) == 1).all()


def test_replicated_has_every_rank_as_owner() -> None:
    r = dist.Replicated((3, 4), 3)
    assert r.replicated and not dist.by_rows((3, 4), 3).replicated
    assert r.box(2) == dist.Box((0, 0), (3, 4)) and r.local_shape(1) == (3, 4)
    assert r.owners((2, 3)) == (0, 1, 2)
    assert r.check() is r
    with pytest.raises(UsageError, match="replicated array has every rank as its owner"):
        r.to_block_cyclic()


def test_boxes_that_tile() -> None:
    b = dist.Boxes((4, 6), [((0, 0), (2, 6)), dist.Box((2, 0), (4, 3)), ((2, 3), (4, 6))])
    assert b.nranks == 3 and b.check() is b
    assert b.owners((3, 4)) == (2,)
    assert b.local_shape(1) == (2, 3)
    assert (coverage(b) == 1).all()


def test_boxes_exchange_collects_every_rank_box() -> None:
    mine = [((0, 0, 0), (2, 3, 4)), ((2, 0, 0), (5, 3, 4))]
    gathered = dist.Boxes.exchange((5, 3, 4), dist.Box((2, 0, 0), (5, 3, 4)), lambda box: mine)
    assert gathered == dist.Boxes((5, 3, 4), mine) and gathered.check() is gathered


# --- the tiling check ----------------------------------------------------------------------------


@pytest.mark.parametrize(("boxes", "message"), [
    ([((0, 0), (3, 4)), ((2, 0), (4, 4))], r"ranks 0 and 1 overlap: Box\(\[0, 0\], \[3, 4\]\) and "
                                           r"Box\(\[2, 0\], \[4, 4\]\) share Box\(\[2, 0\], \[3, 4\]\)"),
    ([((0, 0), (2, 4)), ((2, 0), (4, 3))], r"cover 14 of the 16 elements .* no rank holds Box\(\[2, 3\], \[4, 4\]\)"),
    ([((0, 0), (2, 4)), ((0, 0), (0, 0)), ((3, 0), (4, 4))], r"no rank holds Box\(\[2, 0\], \[3, 4\]\)"),
    ([((0, 0), (4, 4)), ((1, 1), (2, 2))], r"ranks 0 and 1 overlap"),
])
def test_gaps_and_overlaps_name_the_ranks_and_boxes(boxes: list[Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        dist.Boxes((4, 4), boxes).check()


def test_gap_in_three_dimensions() -> None:
    boxes = [((0, 0, 0), (2, 2, 2)), ((2, 0, 0), (4, 2, 2)), ((0, 2, 0), (4, 3, 1))]
    with pytest.raises(UsageError, match=r"no rank holds Box\(\[0, 2, 1\], \[2, 3, 2\]\)"):
        dist.Boxes((4, 3, 2), boxes).check()


def test_the_check_is_a_function_of_values() -> None:
    # The same values give the same answer anywhere: distributions compare, hash and pickle by value.
    a = dist.Boxes((4, 4), [((0, 0), (2, 4)), ((2, 0), (4, 4))])
    b = pickle.loads(pickle.dumps(a))
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert len({dist.by_rows((8, 2), 2), dist.Split((8, 2), 2, 0), dist.by_columns((8, 2), 2)}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.shape = (5, 5)  # type: ignore[misc]


# --- refusals of the constructors ----------------------------------------------------------------


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda: dist.Split((8, 4), 0), UsageError, "nranks must be >= 1"),
    (lambda: dist.Split((8, 4), 2, axis=2), UsageError, "axis 2 is out of range"),
    (lambda: dist.Split((8, 4), 2, axis=-3), UsageError, "axis must be >= -2"),
    (lambda: dist.Split((8, 4), 2, counts=(4, 3)), UsageError, r"counts \(4, 3\) add up to 7, not the extent 8"),
    (lambda: dist.Split((8, 4), 2, counts=(8,)), UsageError, "counts must have 2 entries"),
    (lambda: dist.Split((8, 4), 2, counts=(9, -1)), UsageError, r"counts\[1\] must be >= 0"),
    (lambda: dist.Split((8, 4), True), TypeError, "nranks must be an int"),
    (lambda: dist.Split("84", 2), TypeError, "shape must be a sequence"),
    (lambda: dist.Split((), 2), UsageError, "at least one axis"),
    (lambda: dist.Split((8, -1), 2), UsageError, r"shape\[1\] must be >= 0"),
    (lambda: dist.Split.blocked((8, 4), 4, block=1), UsageError, "block 1 x 4 ranks covers 4 of the extent 8"),
    (lambda: dist.Pencils((8,), (1, 1)), UsageError, "pencils split two axes"),
    (lambda: dist.Pencils((8, 4), (2, 2), axes=(1, 1)), UsageError, "two different axes"),
    (lambda: dist.Pencils((8, 4), (2, 2), counts=((4, 4),)), TypeError, "pair of per-piece counts"),
    (lambda: dist.Pencils((8, 4), (2, 2), counts=((4, 4), (3, 3))), UsageError, r"counts\[1\] .* add up to 6"),
    (lambda: dist.Boxes((4, 4), []), TypeError, "non-empty sequence"),
    (lambda: dist.Boxes((4, 4), [((0, 0), (5, 4))]), UsageError, r"rank 0's box .* inside the shape \[4, 4\]"),
    (lambda: dist.Boxes((4, 4), [((2, 0), (1, 4))]), UsageError, "need 0 <= lower <= upper <= shape"),
    (lambda: dist.Boxes((4, 4), [((0,), (4,))]), UsageError, r"boxes\[0\] lower must have 2 entries"),
    (lambda: dist.Boxes((4, 4), [(0, 4)]), TypeError, r"boxes\[0\] lower must be a sequence"),
    (lambda: dist.Boxes((4, 4), [None]), TypeError, r"boxes\[0\] must be a \(lower, upper\) pair"),
    (lambda: dist.BlockCyclic((8, 8), (2, 2), (0, 2)), UsageError, r"block\[0\] must be >= 1"),
    (lambda: dist.BlockCyclic((8, 8), (2, 2), (2, 2), src=(2, 0)), UsageError, "src .* outside the 2 x 2 grid"),
    (lambda: dist.BlockCyclic((8, 8), (2, 2), (2, 2), layout="diag"), UsageError, "layout must be 'col' or 'row'"),
    (lambda: dist.BlockCyclic((8, 8, 8), (2, 2), (2, 2)), UsageError, "shape must have 2 entries"),
    (lambda: dist.Replicated((2, 2), 0), UsageError, "nranks must be >= 1"),
    (lambda: dist.Distribution(), TypeError, "make a Replicated, Split"),
    (lambda: dist.Box((0, 0), (4,)), UsageError, "upper must have 2 entries"),
    (lambda: dist.Box((2, 0), (1, 4)), UsageError, "lower <= upper on every axis"),
    (lambda: dist.Box(0, 0), TypeError, "lower must be a sequence of ints"),
    (lambda: dist.Box((-1,), (1,)), UsageError, r"lower\[0\] must be >= 0"),
    (lambda: dist.BlockCyclicArgs(8, 8, 0, 2, 0, 0, 2, 2, "col"), UsageError, "mb must be >= 1, got 0"),
    (lambda: dist.BlockCyclicArgs(8, 8, 2, 0, 0, 0, 2, 2, "col"), UsageError, "nb must be >= 1, got 0"),
    (lambda: dist.BlockCyclicArgs(-1, 8, 2, 2, 0, 0, 2, 2, "col"), UsageError, "m must be >= 0"),
    (lambda: dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, 0, 2, "col"), UsageError, "nprow must be >= 1"),
    (lambda: dist.BlockCyclicArgs(8, 8, 2, 2, 0, 2, 2, 2, "col"), UsageError, r"\(rsrc, csrc\) = \(0, 2\)"),
    (lambda: dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, "diag"), UsageError, "layout must be 'col' or 'row'"),
    (lambda: dist.BlockCyclicArgs(8, 8, 1.5, 2, 0, 0, 2, 2, "col"), TypeError, "mb must be an int"),
])
def test_constructors_refuse_bad_values(make: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: dist.numroc(8, 0, 0, 0, 2), UsageError, "nb must be >= 1, got 0"),
    (lambda: dist.numroc(8, 2, 0, 0, 0), UsageError, "nprocs must be >= 1, got 0"),
    (lambda: dist.numroc(8, 2, -1, 0, 2), UsageError, "iproc must be >= 0"),
    (lambda: dist.numroc(8.0, 2, 0, 0, 2), TypeError, "n must be an int"),
    (lambda: dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, "col").coords(4), UsageError, "rank 4 is out of range"),
    (lambda: dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, "col").local_shape(-1), UsageError, "rank must be >= 0"),
    (lambda: dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, "col").rank_of(0, 2), UsageError, "outside the 2 x 2"),
    (lambda: dist.Box((0,), (4,)).intersection(((0,), (2,))), TypeError, "other must be a Box"),
])
def test_value_methods_refuse_bad_arguments(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: dist.by_rows((4, 4), 2).box(2), "rank 2 is out of range for 2 ranks"),
    (lambda: dist.by_rows((4, 4), 2).owners((4, 0)), r"index \[4, 0\] is outside the shape \[4, 4\] \(axis 0\)"),
    (lambda: dist.by_rows((4, 4), 2).owners((1,)), "index must have 2 entries"),
    (lambda: dist.BlockCyclic((8, 8), (2, 1), (2, 8)).box(0), "rank 0's piece .* is 2 x 1 blocks, not one box"),
    (lambda: dist.BlockCyclic((8, 8), (2, 1), (2, 8)).to_cufftmp(0), "2 x 1 blocks"),
])
def test_queries_refuse_bad_ranks_and_indices(call: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        call()


# --- to cuBLASMp descriptors ---------------------------------------------------------------------


@pytest.mark.parametrize(("d", "expected"), [
    (dist.by_rows((8, 6), 2), (8, 6, 4, 6, 0, 0, 2, 1, "col")),
    (dist.by_columns((8, 6), 3), (8, 6, 8, 2, 0, 0, 1, 3, "row")),
    (dist.by_rows((10, 4), 4, counts=(3, 3, 3, 1)), (10, 4, 3, 4, 0, 0, 4, 1, "col")),
    (dist.by_rows((10, 4), 3, counts=(5, 5, 0)), (10, 4, 5, 4, 0, 0, 3, 1, "col")),
    (dist.by_columns((4, 10), 3, counts=(0, 6, 4)), (4, 10, 4, 6, 0, 1, 1, 3, "row")),
    (dist.by_columns((4, 10), 2, counts=(0, 10)), (4, 10, 4, 10, 0, 1, 1, 2, "row")),
    (dist.by_rows((4, 10), 1), (4, 10, 4, 10, 0, 0, 1, 1, "col")),
    (dist.Pencils((8, 6), (2, 3)), (8, 6, 4, 2, 0, 0, 2, 3, "row")),
    (dist.Pencils((8, 6), (2, 3), axes=(1, 0)), (8, 6, 3, 3, 0, 0, 3, 2, "col")),
    (dist.Pencils((7, 6), (2, 2), counts=((4, 3), (3, 3))), (7, 6, 4, 3, 0, 0, 2, 2, "row")),
    (dist.Boxes((4, 6), [((0, 0), (2, 6)), ((2, 0), (4, 6))]), (4, 6, 2, 6, 0, 0, 2, 1, "col")),
    (dist.Boxes((4, 6), [((0, 0), (2, 3)), ((2, 0), (4, 3)), ((0, 3), (2, 6)), ((2, 3), (4, 6))]),
     (4, 6, 2, 3, 0, 0, 2, 2, "col")),
    (dist.BlockCyclic((9, 9), (2, 2), (2, 3), (1, 0), "row"), (9, 9, 2, 3, 1, 0, 2, 2, "row")),
])
def test_to_block_cyclic(d: dist.Distribution, expected: tuple[Any, ...]) -> None:
    args = d.to_block_cyclic()
    assert dataclasses.astuple(args) == expected
    for rank in range(d.nranks):
        assert args.local_shape(rank) == tuple(d.local_shape(rank))
    # Every element is where the descriptor says: the same owner through either description.
    owners = owner_map(d)
    for i, j in itertools.product(range(d.shape[0]), range(d.shape[1])):
        prow = (i // args.mb + args.rsrc) % args.nprow
        pcol = (j // args.nb + args.csrc) % args.npcol
        assert owners[i, j] == args.rank_of(prow, pcol)


@pytest.mark.parametrize(("d", "message"), [
    (dist.by_rows((10, 4), 4), r"Split\(shape=\(10, 4\), axis=0, counts=\(3, 3, 2, 2\)\): the pieces are not"),
    (dist.by_rows((8, 4), 3, counts=(2, 4, 2)), "NUMROC's form"),
    (dist.by_columns((4, 8), 2, counts=(3, 5)), "Split.blocked"),
    (dist.Boxes((4, 4), [((0, 0), (2, 4)), ((2, 0), (4, 4))][::-1]), "not the cells of a process grid"),
    (dist.Boxes((4, 6), [((0, 0), (4, 2)), ((0, 2), (2, 6)), ((2, 2), (4, 6))]), "not the cells of a process grid"),
    (dist.Split((4, 4, 4), 2), "describes 2-D arrays"),
    (dist.Boxes((4, 4), [((0, 0), (3, 4)), ((2, 0), (4, 4))]), "overlap"),
])
def test_to_block_cyclic_refuses_what_no_descriptor_describes(d: dist.Distribution, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        d.to_block_cyclic()


# --- to cuFFTMp boxes ----------------------------------------------------------------------------


def test_to_cufftmp_gives_corners_and_row_major_strides() -> None:
    s = dist.Split((8, 6, 5), 3, axis=1)
    assert s.to_cufftmp(0) == ((0, 0, 0), (8, 2, 5), (10, 5, 1))
    assert s.to_cufftmp(2) == ((0, 4, 0), (8, 6, 5), (10, 5, 1))
    p = dist.Pencils((8, 6, 5), (2, 3), axes=(1, 2), counts=((3, 3), (2, 2, 1)))
    assert p.to_cufftmp(5) == ((0, 3, 4), (8, 6, 5), (3, 1, 1))
    empty = dist.Split((2, 4, 4), 3, axis=0)
    assert empty.to_cufftmp(2) == ((2, 0, 0), (2, 4, 4), (16, 4, 1))  # an empty extent counts as 1


def test_to_cufftmp_strides_are_numpy_c_order() -> None:
    for d in (dist.Split((5, 7, 3), 2, 2), dist.Pencils((5, 7, 3), (2, 2)), dist.Split((9, 4), 4, 0)):
        for rank in range(d.nranks):
            lower, upper, strides = d.to_cufftmp(rank)
            c_order = np.zeros([max(u - lo, 1) for lo, u in zip(lower, upper, strict=True)], "int8").strides
            assert strides == c_order


# --- layout arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize(("extent", "parts"), [(10, 4), (7, 7), (3, 5), (0, 2), (64, 3), (1, 1)])
def test_slab_is_the_split_of_split(extent: int, parts: int) -> None:
    d = dist.Split((extent, 2), parts, axis=0)
    for part in range(parts):
        start, stop = dist.slab(extent, parts, part)
        box = d.box(part)
        assert (start, stop) == (box.lower[0], box.upper[0])
    assert dist.slab(10, 4, 0) == (0, 3) and dist.slab(10, 4, 3) == (8, 10)  # the extra rows first


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: dist.slab(10, 4, 4), UsageError, "part 4 is out of range for 4 slabs"),
    (lambda: dist.slab(10, 0, 0), UsageError, "parts"),
    (lambda: dist.slab(-1, 2, 0), UsageError, "extent"),
    (lambda: dist.slab(10, 2, 1.0), TypeError, "part"),
])
def test_slab_refuses_bad_values(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_row_major_strides() -> None:
    assert dist.row_major_strides((3, 4, 5)) == (20, 5, 1)
    assert dist.row_major_strides((3, 0, 4)) == (4, 4, 1)  # an empty extent counts as 1, as cuFFTMp takes it
    assert dist.row_major_strides((7,)) == (1,)
    assert dist.row_major_strides(()) == ()
    assert dist.Box((1, 2), (4, 7)).strides() == (5, 1)
    big = (2**32, 2**32)
    assert dist.row_major_strides(big) == (2**32, 1)  # unchecked without `what`: Python ints
    with pytest.raises(UsageError, match="the big box's span"):
        dist.row_major_strides(big, "the big box's span")
    assert dist.row_major_strides((2**31, 2**31), "fits") == (2**31, 1)


def test_hermitian_and_padded_real_shapes() -> None:
    assert dist.hermitian_shape((50, 62, 36)) == (50, 62, 19)
    assert dist.hermitian_shape((50, 62, 35)) == (50, 62, 18)
    assert dist.hermitian_shape((8, 9)) == (8, 5)
    assert dist.padded_real_shape((4, 6, 36)) == (4, 6, 38)
    assert dist.padded_real_shape((4, 6, 35)) == (4, 6, 36)
    for n in range(1, 20):  # the padded real row holds exactly the complex half's bytes
        assert dist.padded_real_shape((n,))[0] == 2 * dist.hermitian_shape((n,))[0]
    for fn in (dist.hermitian_shape, dist.padded_real_shape):
        for empty in ((), [], {}):
            with pytest.raises(UsageError, match="at least one axis"):
                fn(empty)
        for junk in ("", b""):
            with pytest.raises(TypeError, match="shape must be a sequence of ints"):
                fn(junk)
        with pytest.raises(UsageError, match=r"shape\[1\]"):
            fn((4, -1))
        with pytest.raises((TypeError, UsageError), match="shape"):
            fn((4, "x"))


def test_pitched_rows() -> None:
    assert dist.pitched_rows((4, 6, 5), 8) == (24, 40, 40)  # packed: the pitch is the row
    assert dist.pitched_rows((4, 6, 5), 4, storage=(4, 6, 6)) == (24, 20, 24)  # a padded real side
    assert dist.pitched_rows((0, 3), 16) == (0, 48, 48)
    assert dist.pitched_rows((9,), 2) == (1, 18, 18)


def test_cufftmp_box() -> None:
    box = dist.Box((2, 0), (5, 8))
    assert dist.cufftmp_box(box) == ((2, 0), (5, 8), (8, 1))
    assert dist.cufftmp_box(box, 3) == ((0, 2, 0), (1, 5, 8), (24, 8, 1))  # a leading axis of extent 1
    assert dist.cufftmp_box(box, 3, (2, 1)) == ((0, 2, 0), (1, 5, 16), (48, 16, 1))  # 2 units an element
    assert dist.cufftmp_box(dist.Box((0, 2), (3, 6)), None, (1, 2)) == ((0, 1), (3, 3), (2, 1))  # 2 a unit
    assert dist.cufftmp_box(dist.Box((1,), (4,)), 3) == ((0, 0, 1), (1, 1, 4), (3, 3, 1))
    with pytest.raises(UsageError, match="a 2-D box cannot be described as 1-D"):
        dist.cufftmp_box(box, 1)
    with pytest.raises(TypeError, match="box must be a Box"):
        dist.cufftmp_box(((0,), (1,)))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"scale\[1\]"):
        dist.cufftmp_box(box, 3, (1, 0))
