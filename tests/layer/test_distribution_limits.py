"""Limits of the distributions: at most MAX_RANKS ranks and 64 axes, extents and element counts
within an int64, checked before anything per rank is built, so that a mistyped count is refused at
once; per-rank answers computed rather than listed, and no query that loops over the ranks once per
rank."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from mpbind import distributions as dist
from mpbind.errors import UsageError
from mpbind.fft import _planner as _fft_plan


def test_a_global_array_of_more_elements_than_an_int64_holds_is_refused() -> None:
    assert dist.Split((2**31, 2**32 - 1), 2).shape == (2**31, 2**32 - 1)  # 2**63 - 2**31 elements fit
    with pytest.raises(UsageError, match=r"element count is 9223372036854775808, more than an int64"):
        dist.Split((2**62, 2), 2)
    with pytest.raises(UsageError, match="element count"):
        dist.Replicated((2**32, 2**32), 1)
    with pytest.raises(UsageError, match="element count"):
        dist.BlockCyclic((2**40, 2**40), (1, 1), (1, 1))
    with pytest.raises(UsageError, match=r"shape\[0\] must be <= 2\*\*63 - 1"):
        dist.Split((2**63,), 1)
    with pytest.raises(UsageError, match="element count"):
        dist.Box((0, 0), (2**62, 4))


def test_block_cyclic_args_keep_numpy_ints_as_python_ints() -> None:
    # np.int64(2**32) * np.int64(2**32) wraps to 0 in NumPy: the grid check must see the real product.
    with pytest.raises(UsageError, match="process count must be <= 2\\*\\*63 - 1, got 18446744073709551616"):
        dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, np.int64(2**32), np.int64(2**32), "col")
    args = dist.BlockCyclicArgs(np.int64(8), 8, 2, 2, 0, 0, np.int32(2), 2, "col")
    assert type(args.m) is int and type(args.nprow) is int and args.nranks == 4


def _quick(call: Any, error: type[Exception], message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(error, match=message):
        call()
    assert time.perf_counter() - start < 0.5  # refused before anything per rank is built


@pytest.mark.parametrize(("call", "message"), [
    (lambda: dist.Split((10,), 10**12), "nranks is 1000000000000: a distribution takes at most MAX_RANKS"),
    (lambda: dist.Split.blocked((10,), 10**12), "at most MAX_RANKS"),
    (lambda: dist.Replicated((10,), 2**40), "at most MAX_RANKS"),
    (lambda: dist.Pencils((8, 8), (2**20, 2)), "grid .*'s rank count is 2097152"),
    (lambda: dist.BlockCyclic((8, 8), (2**11, 2**10), (1, 1)), "rank count is 2097152"),
    (lambda: dist.BlockCyclicArgs(8, 8, 1, 1, 0, 0, 2**30, 2**30, "col"), "process count is 1152921504606846976"),
    (lambda: dist.Boxes((4,), [((0,), (4,))] * (2**20 + 1)), "the number of boxes .* at most MAX_RANKS"),
    (lambda: dist.Split((10,), 3, counts=range(10**12)), "counts has more than"),
    (lambda: dist.Box(range(10**12), range(10**12)), "lower has more than 64 entries"),
])
def test_a_mistyped_count_is_refused_at_once(call: Any, message: str) -> None:
    _quick(call, UsageError, message)


def test_the_largest_rank_count_is_taken() -> None:
    s = dist.Split((2**20,), dist.MAX_RANKS)
    assert s.nranks == 2**20 and s.box(2**20 - 1) == dist.Box((2**20 - 1,), (2**20,))
    assert s.owners((12345,)) == (12345,)


def test_block_cyclic_pieces_are_computed_not_listed() -> None:
    d = dist.BlockCyclic((2**62, 1), (2, 1), (1, 1))  # every rank holds 2**61 one-row blocks
    assert d.local_shape(1) == (2**61, 1)
    assert d.owners((2**62 - 1, 0)) == (1,)
    _quick(lambda: d.box(0), UsageError, r"2305843009213693952 x 1 blocks, not one box")
    _quick(lambda: d.boxes(0), UsageError, "boxes\\(\\) lists at most 1048576")
    single = dist.BlockCyclic((2**59, 8), (2, 1), (2**58, 8))
    assert single.box(1) == dist.Box((2**58, 0), (2**59, 8))
    assert single.boxes(1) == (single.box(1),)
    assert dist.BlockCyclic((4, 4), (3, 1), (2, 4)).box(2) == dist.Box((0, 0), (0, 4))  # a process with no block


def test_queries_over_many_ranks_are_not_quadratic() -> None:
    n = 2**14  # each of these was a loop over ranks per rank: 2**28 steps, minutes
    s = dist.Split((n, 4), n)
    p = dist.Pencils((128, 128, 2), (128, 128))
    start = time.perf_counter()
    assert s.to_block_cyclic().nprow == n
    assert [s.box(r).lower[0] for r in range(n)] == list(range(n))
    assert p.owners((127, 7, 1)) == (127 * 128 + 7,)
    boxes = dist.Boxes((n, 4), [s.box(r) for r in range(n)])
    assert boxes.check() is boxes
    _fft_plan.plan_fft((n, n), "complex64", n)
    assert time.perf_counter() - start < 10


def test_overlaps_are_still_found_and_named_by_rank_order() -> None:
    boxes = [((0, 0), (2, 4)), ((2, 0), (4, 4)), ((3, 1), (4, 2)), ((4, 0), (8, 4))]
    with pytest.raises(UsageError, match=r"ranks 1 and 2 overlap: Box\(\[2, 0\], \[4, 4\]\) and Box\(\[3, 1\], "
                                         r"\[4, 2\]\) share Box\(\[3, 1\], \[4, 2\]\)"):
        dist.Boxes((8, 4), boxes).check()
    columns = [((0, c), (8, c + 1)) for c in range(4)] + [((0, 2), (8, 3))]  # swept along axis 1
    with pytest.raises(UsageError, match="ranks 2 and 4 overlap"):
        dist.Boxes((8, 4), columns).check()


def test_values_in_messages_never_fail_to_print() -> None:
    huge = 10**5000  # Python refuses its decimal text: messages give its size instead
    with pytest.raises(UsageError, match="nranks must be <= 2\\*\\*63 - 1, got a 16610-bit integer"):
        dist.Split((10,), huge)
    with pytest.raises(UsageError, match=r"shape\[0\] must be <= 2\*\*63 - 1, got a 16610-bit integer"):
        dist.Split((huge,), 2)
