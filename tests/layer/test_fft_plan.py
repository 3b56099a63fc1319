"""The arithmetic of distributed FFTs and reshapes (mpbind.fft._planner), without a GPU: which boxes each
rank holds on each side per transform type, which pairs run on cuFFTMp's slabs, the padding of the
real side, the Hermitian-halved shapes, the buffers, what cuFFTMp is asked for, and every refusal."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mpbind import distributions as dist
from mpbind.errors import UsageError
from mpbind.fft import _planner as fp


def split(n: int, parts: int, k: int) -> tuple[int, int]:
    """cuFFTMp's slab split, written out: the first n % parts parts one longer."""
    base, extra = divmod(n, parts)
    start = k * base + min(k, extra)
    return start, start + base + (1 if k < extra else 0)


# --- shapes and defaults ----------------------------------------------------------------------------



@pytest.mark.parametrize("shape", [(50, 62, 36), (51, 63, 36), (16, 12, 8), (9, 7)])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_c2c_defaults_are_cufftmp_slabs(shape: tuple[int, ...], nranks: int, dtype: str) -> None:
    s = fp.plan_fft(shape, dtype, nranks)
    assert (s.kind, s.input_dtype, s.output_dtype, s.algorithm) == ("c2c", dtype, dtype, "slabs")
    assert s.subformats == ("XT_FORMAT_INPLACE", "XT_FORMAT_INPLACE_SHUFFLED")
    assert s.cufft_type == ("C2C" if dtype == "complex64" else "Z2Z")
    for r in range(nranks):
        x0, x1 = split(shape[0], nranks, r)
        y0, y1 = split(shape[1], nranks, r)
        i, o = s.input_side(r), s.output_side(r)
        assert i.box.lower[0] == x0 and i.shape == (x1 - x0, *shape[1:]) and not i.padded
        assert o.box.lower[1] == y0 and o.shape == (shape[0], y1 - y0, *shape[2:]) and not o.padded
        assert s.buffer_bytes(r) == max(i.nbytes, o.nbytes)
    assert s.max_buffer_bytes == max(s.buffer_bytes(r) for r in range(nranks))


@pytest.mark.parametrize("nz", [36, 35])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize(("dtype", "complex_dtype"), [("float32", "complex64"), ("float64", "complex128")])
def test_r2c_slabs_pad_the_real_side(nz: int, nranks: int, dtype: str, complex_dtype: str) -> None:
    shape = (50, 62, nz)
    s = fp.plan_fft(shape, dtype, nranks)
    assert (s.kind, s.algorithm, s.output_dtype, s.cufft_type) == ("r2c", "slabs", complex_dtype,
                                                                   "R2C" if dtype == "float32" else "D2Z")
    assert s.output.shape == (50, 62, nz // 2 + 1)
    for r in range(nranks):
        x0, x1 = split(50, nranks, r)
        y0, y1 = split(62, nranks, r)
        i, o = s.input_side(r), s.output_side(r)
        assert i.shape == (x1 - x0, 62, nz) and i.storage == (x1 - x0, 62, 2 * (nz // 2 + 1)) and i.padded
        assert i.strides == (62 * 2 * (nz // 2 + 1), 2 * (nz // 2 + 1), 1)
        assert o.shape == o.storage == (50, y1 - y0, nz // 2 + 1)
        # In place: the padded reals hold exactly the complex numbers of the same X-slab.
        assert i.nbytes == (x1 - x0) * 62 * (nz // 2 + 1) * np.dtype(complex_dtype).itemsize
    c = fp.plan_fft(shape, complex_dtype, nranks, kind="c2r")
    assert (c.kind, c.algorithm, c.output_dtype) == ("c2r", "slabs", dtype)
    assert c.subformats == ("XT_FORMAT_INPLACE", "XT_FORMAT_INPLACE_SHUFFLED")
    for r in range(nranks):  # the inverse of the R2C: its output in, its input out
        assert c.input_side(r) == s.output_side(r) and c.output_side(r) == s.input_side(r)
        assert c.buffer_bytes(r) == s.buffer_bytes(r)


def test_c2c_y_slabs_in_x_slabs_out_is_the_swapped_slab_pair() -> None:
    shape = (10, 7, 6)
    s = fp.plan_fft(shape, "complex64", 3, input=dist.Split(shape, 3, axis=1), output=dist.Split(shape, 3, axis=0))
    assert s.algorithm == "slabs" and s.subformats == ("XT_FORMAT_INPLACE_SHUFFLED", "XT_FORMAT_INPLACE")
    assert s.input_side(1).shape == (10, 2, 6) and s.output_side(1).shape == (3, 7, 6)


def test_explicit_counts_equal_to_cufftmp_split_still_use_slabs() -> None:
    shape = (10, 7, 6)
    given = dist.Split(shape, 3, axis=0, counts=(4, 3, 3))
    assert fp.plan_fft(shape, "complex64", 3, input=given).algorithm == "slabs"
    other = dist.Split(shape, 3, axis=0, counts=(3, 3, 4))
    s = fp.plan_fft(shape, "complex64", 3, input=other)
    assert s.algorithm == "boxes" and "not one of cuFFTMp's slab pairs" in s.reason
    pencils_as_slabs = dist.Pencils(shape, grid=(3, 1), axes=(0, 1))
    assert fp.plan_fft(shape, "complex64", 3, input=pencils_as_slabs).algorithm == "slabs"


# --- boxes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_redistributed_output_goes_through_boxes(nranks: int) -> None:
    shape = (51, 63, 36)  # X-slabs back to X-slabs: the case a silent wrong answer was seen in
    xs = dist.Split(shape, nranks, axis=0)
    s = fp.plan_fft(shape, "complex64", nranks, output=xs)
    assert s.algorithm == "boxes" and s.subformats is None
    for r in range(nranks):
        lo_in, up_in, st_in, lo_out, up_out, st_out = s.distribution_boxes(r)
        assert (lo_in, up_in) == (xs.box(r).lower, xs.box(r).upper) == (lo_out, up_out)
        assert st_in == st_out == dist.row_major_strides(xs.box(r).shape)  # packed


@pytest.mark.parametrize("nz", [36, 35])
def test_r2c_boxes_are_packed_and_real_first(nz: int) -> None:
    shape = (8, 12, nz)
    half = dist.hermitian_shape(shape)
    real = dist.Pencils(shape, grid=(2, 2), axes=(0, 1))
    cplx = dist.Pencils(half, grid=(2, 2), axes=(0, 2))
    s = fp.plan_fft(shape, "float32", 4, input=real, output=cplx)
    assert s.algorithm == "boxes"
    c = fp.plan_fft(shape, "complex64", 4, kind="c2r", input=cplx, output=real)
    assert c.algorithm == "boxes"
    for r in range(4):
        i = s.input_side(r)
        assert i.storage == i.shape and i.strides == dist.row_major_strides(i.shape)  # no padding on boxes
        # cuFFTMp takes the real box first for both R2C and C2R plans.
        assert s.distribution_boxes(r) == c.distribution_boxes(r)
        lo_in, up_in, _, lo_out, up_out, _ = c.distribution_boxes(r)
        assert (lo_in, up_in) == (real.box(r).lower, real.box(r).upper)
        assert (lo_out, up_out) == (cplx.box(r).lower, cplx.box(r).upper)


def test_two_d_real_transforms_use_boxes_and_two_d_c2c_uses_slabs() -> None:
    assert fp.plan_fft((9, 7), "complex64", 2).algorithm == "slabs"
    s = fp.plan_fft((9, 7), "float32", 2)
    assert s.algorithm == "boxes" and s.output.shape == (9, 4)
    assert s.input_side(1).shape == (4, 7) and s.output_side(1).shape == (9, 2)


def test_forced_algorithms() -> None:
    shape = (16, 12, 8)
    assert fp.plan_fft(shape, "complex64", 2, algorithm="boxes").algorithm == "boxes"
    with pytest.raises(UsageError, match="algorithm='slabs'"):
        fp.plan_fft(shape, "complex64", 2, output=dist.Split(shape, 2, axis=0), algorithm="slabs")
    with pytest.raises(UsageError, match="algorithm must be"):
        fp.plan_fft(shape, "complex64", 2, algorithm="pencils")  # type: ignore[arg-type]


def test_arbitrary_boxes_and_an_empty_rank() -> None:
    shape = (4, 4, 6)
    boxes = dist.Boxes(shape, [((0, 0, 0), (4, 4, 3)), ((0, 0, 3), (4, 4, 6)), ((0, 0, 0), (0, 0, 0))])
    out = dist.Split(shape, 3, axis=1, counts=(2, 2, 0))
    s = fp.plan_fft(shape, "complex128", 3, input=boxes, output=out)
    assert s.algorithm == "boxes"
    assert s.input_side(2).shape == (0, 0, 0) and s.output_side(2).shape == (4, 0, 6)
    assert s.buffer_bytes(2) == 1  # nothing to hold; allocations are never empty


@pytest.mark.parametrize("kind", ["c2c", "r2c", "c2r"])
def test_every_rank_pieces_tile_both_sides(kind: str) -> None:
    shape = (7, 6, 5)
    dtype = "float64" if kind == "r2c" else "complex128"
    s = fp.plan_fft(shape, dtype, 3, kind=kind)  # type: ignore[arg-type]
    for d in (s.input, s.output):
        count = np.zeros(d.shape, int)
        for r in range(3):
            b = d.box(r)
            count[tuple(slice(lo, up) for lo, up in zip(b.lower, b.upper, strict=True))] += 1
        assert (count == 1).all()
    want_in = dist.hermitian_shape(shape) if kind == "c2r" else shape
    want_out = dist.hermitian_shape(shape) if kind == "r2c" else shape
    assert (s.input.shape, s.output.shape) == (want_in, want_out)


def test_explain_names_the_choice_and_the_pieces() -> None:
    text = fp.plan_fft((50, 62, 35), "float32", 2).explain(rank=1)
    assert "R2C" in text and "slabs" in text and "padded" in text and "35 -> 36" in text and "rank 1" in text
    text = fp.plan_fft((51, 63, 36), "complex64", 2, output=dist.Split((51, 63, 36), 2)).explain()
    assert "boxes" in text and "cufftXtSetDistribution" in text


# --- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shape": (8,)}, UsageError, "2-D and 3-D"),
        ({"shape": (8, 8, 8, 8)}, UsageError, "2-D and 3-D"),
        ({"shape": (8, 0, 8)}, UsageError, ">= 1"),
        ({"shape": (8, 8.0, 8)}, TypeError, r"shape\[1\]"),
        ({"shape": "888"}, TypeError, "sequence"),
        ({"shape": (1, 8, 8)}, UsageError, "first two extents >= the number of ranks"),
        ({"shape": (8, 1, 8)}, UsageError, "first two extents"),
        ({"shape": (8, 8, 1)}, UsageError, "last extent"),
        ({"shape": (2**31, 8, 8)}, UsageError, "fit in an int"),
        ({"kind": "r2c", "dtype": "complex64"}, UsageError, "r2c transform takes a real input"),
        ({"kind": "c2c", "dtype": "float32"}, UsageError, "c2c transform takes a complex input"),
        ({"kind": "c2r", "dtype": "float64"}, UsageError, "c2r transform takes a complex input"),
        ({"dtype": "int32"}, UsageError, "complex input"),
        ({"kind": "fft"}, UsageError, "kind must be one of"),
        ({"dtype": 7}, TypeError, "dtype"),
        ({"nranks": 0}, UsageError, "nranks"),
    ],
)
def test_plan_refusals(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    args = {"shape": (8, 8, 8), "dtype": "complex64", "nranks": 2}
    args.update(kwargs)
    shape, dtype, nranks = args.pop("shape"), args.pop("dtype"), args.pop("nranks")
    with pytest.raises(error, match=match):
        fp.plan_fft(shape, dtype, nranks, **args)


def test_distribution_refusals_name_the_side() -> None:
    shape = (8, 8, 8)
    with pytest.raises(TypeError, match="input must be an mpbind.distributions value"):
        fp.plan_fft(shape, "complex64", 2, input=((0, 0, 0), (4, 8, 8)))  # type: ignore[arg-type]
    # R2C's output is the halved array: the full shape is refused with the one expected.
    with pytest.raises(UsageError, match=r"output is a distribution of shape \(8, 8, 8\); the halved complex "
                                         r"output array is \(8, 8, 5\)"):
        fp.plan_fft(shape, "float32", 2, output=dist.Split(shape, 2, axis=1))
    with pytest.raises(UsageError, match=r"input is a distribution of shape \(8, 8, 8\); the halved complex input"):
        fp.plan_fft(shape, "complex64", 2, kind="c2r", input=dist.Split(shape, 2, axis=1))
    with pytest.raises(UsageError, match="over 3 ranks; the communicator has 2"):
        fp.plan_fft(shape, "complex64", 2, input=dist.Split(shape, 3))
    with pytest.raises(UsageError, match="replicated"):
        fp.plan_fft(shape, "complex64", 2, input=dist.Replicated(shape, 2))
    overlap = dist.Boxes(shape, [((0, 0, 0), (5, 8, 8)), ((4, 0, 0), (8, 8, 8))])
    with pytest.raises(UsageError, match="output: ranks 0 and 1 overlap"):
        fp.plan_fft(shape, "complex64", 2, output=overlap)
    gap = dist.Boxes(shape, [((0, 0, 0), (3, 8, 8)), ((4, 0, 0), (8, 8, 8))])
    with pytest.raises(UsageError, match="input: the boxes cover"):
        fp.plan_fft(shape, "complex64", 2, input=gap)
    cyclic = dist.BlockCyclic((8, 8), grid=(2, 1), block=(2, 8))
    with pytest.raises(UsageError, match="input: rank 0's piece .* not one box"):
        fp.plan_fft((8, 8), "complex64", 2, input=cyclic)


# --- reshapes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("itemsize", "unit", "scale"), [
    (4, 4, (1, 1)), (8, 8, (1, 1)), (16, 16, (1, 1)), (32, 16, (2, 1)), (12, 4, (3, 1)), (24, 8, (3, 1)),
    (2, 4, (1, 2)), (1, 4, (1, 4)), (6, 4, (3, 2)), (3, 4, (3, 4))])
def test_reshape_units(itemsize: int, unit: int, scale: tuple[int, int]) -> None:
    shape = (4, 8, 16)
    s = fp.plan_reshape(dist.Split(shape, 2, axis=0), dist.Split(shape, 2, axis=2), "uint8", itemsize=itemsize)
    assert (s.unit, s.scale) == (unit, scale)


def test_reshape_groups_need_even_edges() -> None:
    shape = (4, 9)
    with pytest.raises(UsageError, match="groups of 2 along the last axis"):
        fp.plan_reshape(dist.Split(shape, 2, axis=0), dist.Split(shape, 2, axis=1), "float16")


def unit_view(g: np.ndarray, s: fp.ReshapeSpec) -> np.ndarray:
    """The global array as cuFFTMp sees it: 3-D, in units of s.unit bytes."""
    g3 = g.reshape((1,) * (3 - g.ndim) + g.shape)
    raw = np.ascontiguousarray(g3).view(np.uint8).reshape(g3.shape[:2] + (-1,))
    return raw.view(np.dtype(f"V{s.unit}")).reshape(
        g3.shape[:2] + (-1,))


@pytest.mark.parametrize(("dtype", "shape"), [("int16", (6, 8)), ("int8", (5, 8, 12)), ("complex128", (7, 5, 3)),
                                              ("float32", (11,)), ("uint8", (16,)), ("float64", (6, 4))])
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_reshape_boxes_move_every_element_once(dtype: str, shape: tuple[int, ...], nranks: int) -> None:
    """What cuFFTMp would do with the boxes, in NumPy: each output unit box, cut from the global array
    in units, holds exactly the elements of the output distribution's piece."""
    step = 4 // math.gcd(np.dtype(dtype).itemsize, 4)  # 1- and 2-byte elements move in groups
    src = dist.Split(shape, nranks, axis=0)
    dst = dist.Split(shape, nranks, axis=len(shape) - 1, counts=_even(shape[-1], nranks, step)) if len(shape) > 1 \
        else dist.Split(shape, nranks, axis=0, counts=_even(shape[0], nranks, step)[::-1])
    s = fp.plan_reshape(src, dst, dtype)
    g = (np.arange(math.prod(shape)) * 7 + 3).astype(dtype).reshape(shape)
    units = unit_view(g, s)
    for r in range(nranks):
        for d, (lo, up, strides) in zip((src, dst), s.cufftmp_boxes(r), strict=True):
            b = d.box(r)
            piece = np.ascontiguousarray(g[tuple(slice(a, z) for a, z in zip(b.lower, b.upper, strict=True))])
            cut = units[tuple(slice(a, z) for a, z in zip(lo, up, strict=True))]
            assert cut.tobytes() == piece.tobytes()
            assert strides == dist.row_major_strides(tuple(z - a for a, z in zip(lo, up, strict=True)))
    assert s.max_input_bytes == max(max(math.prod(src.box(r).shape) for r in range(nranks)) * s.itemsize, 1)


def _even(n: int, parts: int, step: int) -> tuple[int, ...]:
    """Counts whose edges are multiples of `step`, the remainder on the last part."""
    base = (n // parts) // step * step
    return (*([base] * (parts - 1)), n - base * (parts - 1))


def test_reshape_refusals() -> None:
    shape = (8, 8)
    with pytest.raises(TypeError, match="input must be"):
        fp.plan_reshape("slabs", dist.Split(shape, 2), "float32")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="output is a distribution of shape"):
        fp.plan_reshape(dist.Split(shape, 2), dist.Split((8, 9), 2), "float32")
    with pytest.raises(UsageError, match="1-D to 3-D"):
        fp.plan_reshape(dist.Split((2, 2, 2, 2), 2), dist.Split((2, 2, 2, 2), 2), "float32")
    with pytest.raises(UsageError, match="over 4 ranks; the communicator has 2"):
        fp.plan_reshape(dist.Split(shape, 2), dist.Split(shape, 4), "float32")
    with pytest.raises(UsageError, match="element size"):
        fp.plan_reshape(dist.Split(shape, 2), dist.Split(shape, 2), "float32", itemsize=0)


def test_slab_pieces_match_the_layer_layouts() -> None:
    """The planner's slabs are the layouts mpbind.cufftmp states for its built-in plans."""
    from mpbind import cufftmp

    for shape, nranks in itertools.product([(10, 7, 6), (50, 62, 35)], [1, 2, 3]):
        for r in range(nranks):
            p = cufftmp.Plan.__new__(cufftmp.Plan)
            p._comm = SimpleNamespace(Get_rank=lambda r=r: r, Get_size=lambda n=nranks: n)  # mpi4py's two calls
            p._distribution = None
            for t, dtype in ((cufftmp.Type.C2C, "complex64"), (cufftmp.Type.R2C, "float32")):
                layer = p._local_layout(shape, t)[cufftmp.FORWARD]
                s = fp.plan_fft(shape, dtype, nranks)
                assert layer == (s.input_side(r).storage, s.output_side(r).storage)

