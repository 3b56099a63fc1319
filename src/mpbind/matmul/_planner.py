"""The decisions of a distributed matmul, made from values every rank has alike (no library call).

``plan(a=..., b=..., d=..., a_dtype=..., ...)`` takes how A, B, (C,) D are spread over the ranks
(:mod:`mpbind.distributions`), their element types, the transposes, the epilogue and the scaling,
and returns a :class:`MatmulPlan`: the algorithm cuBLASMp will run, the process grids and the
descriptor of every operand (block sizes chosen so that cuBLASMp's constraints hold: the blocks of
one dimension are equal in every matrix that has it, ``mbA == mbD``, ``nbB == nbD``,
``kbA == kbB``), the part of a replicated operand each rank hands over, the compute type, the
memory the algorithm needs, and the reasons (``explain()``). Every refusal is a ``UsageError``
naming the operand and what was expected, the same on every rank since it depends only on these
values. ``mpbind.matmul.plan`` turns a plan into cuBLASMp objects.

The algorithms follow cuBLASMp's tensor-parallel guide ("Using cuBLASMp for Tensor Parallelism"):

=====================  ======================  ======================  ==========================
algorithm              op(A) (m x k)           op(B) (k x n)           D (m x n)
=====================  ======================  ======================  ==========================
local                  rows like D, or all     all                     rows split
local                  all                     columns like D, or all  columns split
local                  all                     all                     all (replicated)
allgather_gemm         rows like D, or all     columns split           rows split
gemm_reducescatter     k split, or all         k split like A, or all  columns split
gemm_allreduce         k split, or all         k split like A, or all  all (TN only)
general                anything else with one block size per dimension (SUMMA on one 2-D grid)
=====================  ======================  ======================  ==========================

"all" is a replicated operand: it plays the split the algorithm needs by handing over a slice
of itself (a view, no copy). The overlapped algorithms need equal parts on every rank; the same
layouts with uneven parts run as ``general``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from mpbind._infra import args as _args
from mpbind.bindings.cublasmp import CublasComputeType, CudaDataType, GridLayout, MatmulEpilogue, MatmulMatrixScale
from mpbind.distributions import BlockCyclicArgs, Distribution, Replicated, numroc
from mpbind.errors import UsageError

__all__ = ["ALGORITHMS", "EPILOGUES", "ComputeCapabilityError", "MatmulPlan", "OperandPlan", "block_scale_elements",
           "plan"]

Algorithm = Literal["local", "allgather_gemm", "gemm_reducescatter", "gemm_allreduce", "general"]
ALGORITHMS: tuple[Algorithm, ...] = ("local", "allgather_gemm", "gemm_reducescatter", "gemm_allreduce", "general")
Scaling = Literal["tensor", "mxfp8", "nvfp4"]
Dim = Literal["m", "n", "k"]
View = tuple[int, int, int, int]  # rows r0:r1, columns c0:c1 of a replicated local array

FP8 = ("float8_e4m3fn", "float8_e5m2")
FP4 = "float4_e2m1fn_x2"
_WIDE = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
             "float8_e4m3fn": 1, "float8_e5m2": 1, FP4: 1}
CUDA_TYPES: dict[str, CudaDataType] = {
    "float16": CudaDataType.R_16F, "bfloat16": CudaDataType.R_16BF, "float32": CudaDataType.R_32F,
    "float64": CudaDataType.R_64F, "complex64": CudaDataType.C_32F, "complex128": CudaDataType.C_64F,
    "float8_e4m3fn": CudaDataType.R_8F_E4M3, "float8_e5m2": CudaDataType.R_8F_E5M2, FP4: CudaDataType.R_4F_E2M1,
}
# FP8 inputs (A, B) -> the outputs cuBLASLt gives them (cuBLASMp's samples run each of these).
_FP8_OUTPUTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("float8_e4m3fn", "float8_e4m3fn"): ("float8_e4m3fn", "bfloat16", "float16", "float32"),
    ("float8_e4m3fn", "float8_e5m2"): ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32"),
    ("float8_e5m2", "float8_e4m3fn"): ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32"),
    (FP4, FP4): (FP4, "bfloat16", "float16", "float32"),
}
_CT = CublasComputeType
# Compute types per input type (nvmath-python's table of what cuBLASLt supports); the first is the default.
_COMPUTE: dict[str, tuple[CublasComputeType, ...]] = {
    "float16": (_CT.COMPUTE_32F, _CT.COMPUTE_32F_PEDANTIC, _CT.COMPUTE_16F, _CT.COMPUTE_16F_PEDANTIC),
    "bfloat16": (_CT.COMPUTE_32F, _CT.COMPUTE_32F_PEDANTIC),
    "float32": (_CT.COMPUTE_32F, _CT.COMPUTE_32F_PEDANTIC, _CT.COMPUTE_32F_FAST_16F, _CT.COMPUTE_32F_FAST_16BF,
                _CT.COMPUTE_32F_FAST_TF32, _CT.COMPUTE_32F_EMULATED_16BFX9),
    "complex64": (_CT.COMPUTE_32F, _CT.COMPUTE_32F_PEDANTIC, _CT.COMPUTE_32F_FAST_16F, _CT.COMPUTE_32F_FAST_16BF,
                  _CT.COMPUTE_32F_FAST_TF32, _CT.COMPUTE_32F_EMULATED_16BFX9),
    "float64": (_CT.COMPUTE_64F, _CT.COMPUTE_64F_PEDANTIC, _CT.COMPUTE_64F_EMULATED_FIXEDPOINT),
    "complex128": (_CT.COMPUTE_64F, _CT.COMPUTE_64F_PEDANTIC, _CT.COMPUTE_64F_EMULATED_FIXEDPOINT),
    "float8_e4m3fn": (_CT.COMPUTE_32F,), "float8_e5m2": (_CT.COMPUTE_32F,), FP4: (_CT.COMPUTE_32F,),
}

_E = MatmulEpilogue


@dataclass(frozen=True)
class _EpilogueKind:
    member: MatmulEpilogue
    bias: Literal["", "in", "out"] = ""  # a bias vector read, or a bias gradient written
    bias_of: Literal["m", "n"] = "m"  # what the bias vector runs along
    aux: Literal["", "in", "out"] = ""  # an auxiliary matrix (GELU input / ReLU mask) written or read
    relu_mask: bool = False  # the aux is ReLU's bit mask, not GELU's input values


EPILOGUES: dict[str, _EpilogueKind] = {
    "none": _EpilogueKind(_E.DEFAULT),
    "bias": _EpilogueKind(_E.BIAS, bias="in"),
    "relu": _EpilogueKind(_E.RELU),
    "relu_bias": _EpilogueKind(_E.RELU_BIAS, bias="in"),
    "relu_aux": _EpilogueKind(_E.RELU_AUX, aux="out", relu_mask=True),
    "relu_aux_bias": _EpilogueKind(_E.RELU_AUX_BIAS, bias="in", aux="out", relu_mask=True),
    "drelu": _EpilogueKind(_E.DRELU, aux="in", relu_mask=True),
    "drelu_bgrad": _EpilogueKind(_E.DRELU_BGRAD, bias="out", aux="in", relu_mask=True),
    "gelu": _EpilogueKind(_E.GELU),
    "gelu_bias": _EpilogueKind(_E.GELU_BIAS, bias="in"),
    "gelu_aux": _EpilogueKind(_E.GELU_AUX, aux="out"),
    "gelu_aux_bias": _EpilogueKind(_E.GELU_AUX_BIAS, bias="in", aux="out"),
    "dgelu": _EpilogueKind(_E.DGELU, aux="in"),
    "dgelu_bgrad": _EpilogueKind(_E.DGELU_BGRAD, bias="out", aux="in"),
    "bgrada": _EpilogueKind(_E.BGRADA, bias="out"),
    "bgradb": _EpilogueKind(_E.BGRADB, bias="out", bias_of="n"),
}


class ComputeCapabilityError(UsageError):
    """The GPU is too old for what the plan asks (FP8 needs compute capability 8.9, block-scaled
    MXFP8/NVFP4 10.0). ``capability`` is the GPU's, ``required`` the feature's."""

    def __init__(self, feature: str, capability: tuple[int, int], required: tuple[int, int],
                 where: str = "this GPU") -> None:
        self.feature = feature
        self.capability: tuple[int, int] = _capability(capability, "capability")
        self.required: tuple[int, int] = _capability(required, "required")
        (major, minor), (need_major, need_minor) = self.capability, self.required
        super().__init__(f"{feature} needs compute capability {need_major}.{need_minor} or newer; {where} is "
                         f"{major}.{minor} (sm_{major}{minor})")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.feature, self.capability, self.required))


def _capability(value: object, name: str) -> tuple[int, int]:
    """A compute capability: (major, minor), two ints."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a (major, minor) pair of ints, not {value!r}")
    return _args.integer(value[0], f"{name}[0]"), _args.integer(value[1], f"{name}[1]")


@dataclass(frozen=True)
class OperandPlan:
    """One matrix as cuBLASMp sees it: its descriptor on a process grid, per rank.

    ``descs[r]`` is rank r's descriptor (the same on every rank, except for the ``local``
    algorithm whose 1 x 1 grids describe each rank's own piece); ``views[r]`` is None when rank r
    hands over its whole local array, or the ``(r0, r1, c0, c1)`` slice of a replicated one."""

    name: str
    dtype: str
    shape: tuple[int, int]  # the global (stored) shape the caller gave
    distribution: Distribution
    descs: tuple[BlockCyclicArgs, ...]
    views: tuple[View | None, ...]

    def desc(self, rank: int) -> BlockCyclicArgs:
        return self.descs[_args.integer(rank, "rank", minimum=0, maximum=len(self.descs) - 1)]

    def local_shape(self, rank: int) -> tuple[int, int]:
        """The local piece cuBLASMp works on at `rank` (after the view)."""
        d = self.desc(rank)
        return d.local_shape(0 if d.nranks == 1 else int(rank))

    def given_shape(self, rank: int) -> tuple[int, int]:
        """The shape of the local array rank `rank` passes in (before the view)."""
        shape = tuple(self.distribution.local_shape(rank))
        return (shape[0], shape[1])

    @property
    def grid(self) -> tuple[int, int, GridLayout]:
        """(nprow, npcol, layout) of the operand's process grid."""
        d = self.descs[0]
        return d.nprow, d.npcol, _LAYOUTS[d.layout]

    @property
    def grid_description(self) -> str:
        """The process grid in words: ``"2 x 1 column-major"``."""
        nprow, npcol, layout = self.grid
        return f"{nprow} x {npcol} {'column' if layout == GridLayout.COL_MAJOR else 'row'}-major"


@dataclass(frozen=True)
class MatmulPlan:
    """What a distributed ``D = alpha op(A) op(B) + beta C`` (then the epilogue) will do."""

    algorithm: Algorithm
    nranks: int
    m: int
    n: int
    k: int
    transa: bool
    transb: bool
    a: OperandPlan
    b: OperandPlan
    d: OperandPlan
    c: OperandPlan | None
    compute_type: CublasComputeType
    epilogue: str
    alpha: complex
    beta: complex
    scaling: Scaling | None
    scales: tuple[str, ...]  # the scale pointers the descriptor gets: "a", "b", "d", "amax_d"
    bias_dtype: str | None
    aux_dtype: str | None
    symmetric_workspace: bool
    staging_bytes: int
    required_capability: tuple[int, int] | None
    communication_dtype: str | None = None  # the type partial products travel in (None: cuBLASMp's default)
    reasons: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        # The planner makes plans; one made by hand must hold what its methods read.
        if self.algorithm not in ALGORITHMS:
            raise UsageError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        _args.integer(self.nranks, "nranks", minimum=1, maximum=_args.MAX_RANKS)
        for name in ("m", "n", "k", "staging_bytes"):
            _args.integer(getattr(self, name), name, minimum=0)
        for name in ("a", "b", "d"):
            _args.instance(getattr(self, name), name, OperandPlan, "an OperandPlan")
        if self.c is not None:
            _args.instance(self.c, "c", OperandPlan, "an OperandPlan or None")
        if self.epilogue not in EPILOGUES:
            raise UsageError(f"epilogue must be one of {', '.join(EPILOGUES)}, got {self.epilogue!r}")
        if self.scaling not in (None, "tensor", "mxfp8", "nvfp4"):
            raise UsageError(f"scaling must be None, 'tensor', 'mxfp8' or 'nvfp4', got {self.scaling!r}")
        for name in ("bias_dtype", "aux_dtype"):
            if getattr(self, name) is not None and getattr(self, name) not in _ITEMSIZE:
                raise UsageError(f"{name} must be None or one of {', '.join(_ITEMSIZE)}, got {getattr(self, name)!r}")

    @property
    def operands(self) -> tuple[OperandPlan, ...]:
        return tuple(o for o in (self.a, self.b, self.c, self.d) if o is not None)

    @property
    def scale_mode(self) -> MatmulMatrixScale | None:
        """How the A and B scales apply: one float32 per tensor, or cuBLASLt's block scales."""
        if self.scaling is None:
            return None
        return {"tensor": MatmulMatrixScale.SCALAR_FP32, "mxfp8": MatmulMatrixScale.VEC32_UE8M0,
                "nvfp4": MatmulMatrixScale.VEC16_UE4M3}[self.scaling]

    @property
    def uniform(self) -> bool:
        """Every rank hands cuBLASMp pieces of the same shapes (so it sizes the same workspace on each)."""
        return all(o.local_shape(r) == o.local_shape(0) for o in self.operands for r in range(self.nranks))

    @property
    def epilogue_member(self) -> MatmulEpilogue:
        return _E.ALLREDUCE if self.algorithm == "gemm_allreduce" else EPILOGUES[self.epilogue].member

    def gemm_shape(self, rank: int) -> tuple[int, int, int]:
        """(m, n, k) of the cuBLASMp call at `rank` (the local product's for the ``local`` algorithm)."""
        if self.algorithm != "local":
            return self.m, self.n, self.k
        rows, cols = self.d.local_shape(rank)
        return rows, cols, self.k

    def local_shapes(self, rank: int) -> dict[str, tuple[int, int]]:
        """Operand name -> the local piece cuBLASMp works on at `rank`."""
        return {o.name: o.local_shape(rank) for o in self.operands}

    def bias_length(self, rank: int) -> int:
        """Elements of the bias vector at `rank`: D's local rows for a bias read, the whole m (n for
        BGRADB) for a bias gradient written."""
        kind = EPILOGUES[self.epilogue]
        if kind.bias == "out":
            return self.n if kind.bias_of == "n" else self.m
        return self.d.local_shape(rank)[0]

    def aux_layout(self, rank: int) -> tuple[int, int, int]:
        """(leading dimension, columns, bytes) of the epilogue's auxiliary matrix at `rank`: GELU's
        inputs in the aux type (ld a multiple of 8), or ReLU's bit mask (ld a multiple of 128 bits)."""
        rows, cols = self.d.local_shape(rank)
        if EPILOGUES[self.epilogue].relu_mask:
            ld = _round_up(max(rows, 1), 128)
            return ld, cols, _args.product((ld // 8, cols), "the ReLU mask's bytes")
        ld = _round_up(max(rows, 1), 8)
        return ld, cols, _args.product((ld, cols, _ITEMSIZE[self.aux_dtype or self.d.dtype]), "the aux matrix's bytes")

    def require(self, capability: tuple[int, int], where: str = "this GPU") -> None:
        """ComputeCapabilityError when `capability` is below what the plan needs."""
        if self.required_capability is not None and tuple(capability) < self.required_capability:
            raise ComputeCapabilityError(_feature(self), (capability[0], capability[1]), self.required_capability,
                                         where)

    def explain(self) -> str:
        """Why this algorithm, and what it runs on: one line per decision."""
        return "\n".join(self.reasons)


# --- the planner ----------------------------------------------------------------------------------


_LAYOUTS: dict[str, GridLayout] = {"col": GridLayout.COL_MAJOR, "row": GridLayout.ROW_MAJOR}


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def _feature(p: MatmulPlan) -> str:
    if p.scaling == "mxfp8":
        return "MXFP8 block scaling"
    if p.scaling == "nvfp4":
        return "NVFP4 block scaling"
    return "FP8 matmul"


@dataclass(frozen=True)
class _Split:
    """An operand split along one logical dimension into contiguous pieces, in rank order."""

    dim: Dim
    axis: int  # the stored axis (0: rows, 1: columns)
    counts: tuple[int, ...]

    @property
    def uniform(self) -> bool:
        return len(set(self.counts)) == 1


@dataclass(frozen=True)
class _Operand:
    name: str
    dist: Distribution
    dtype: str
    dims: tuple[Dim, Dim]  # the logical dimension of each stored axis
    args: BlockCyclicArgs | None  # None: replicated

    @property
    def rep(self) -> bool:
        return self.args is None

    @property
    def split(self) -> _Split | None:
        """The 1-D contiguous split this operand is, if it is one."""
        a = self.args
        if a is None or a.nranks == 1 or not a.contiguous:
            return None
        if a.npcol == 1:
            return _Split(self.dims[0], 0, tuple(a.local_shape(r)[0] for r in range(a.nranks)))
        if a.nprow == 1:
            return _Split(self.dims[1], 1, tuple(a.local_shape(r)[1] for r in range(a.nranks)))
        return None

    def describe(self) -> str:
        if self.rep:
            return "replicated"
        s = self.split
        if s is not None:
            what = "rows" if s.axis == 0 else "columns"
            parts = f"{len(s.counts)} equal parts" if s.uniform else f"parts {list(s.counts)}"
            return f"split by {what} ({s.dim}) into {parts}"
        a = self.args
        assert a is not None
        return f"block-cyclic {a.mb} x {a.nb} on a {a.nprow} x {a.npcol} grid"


def plan(*, a: Distribution, b: Distribution, d: Distribution, c: Distribution | None = None, a_dtype: str,
         b_dtype: str | None = None, d_dtype: str | None = None, c_dtype: str | None = None, transa: bool = False,
         transb: bool = False, alpha: complex = 1.0, beta: complex = 0.0, epilogue: str | None = None,
         compute_type: CublasComputeType | int | None = None, scaling: str | None = None,
         scales: Collection[str] = (), compute_capability: tuple[int, int] | None = None,
         communication_type: str | CudaDataType | None = None) -> MatmulPlan:
    """Plan ``D = alpha op(A) op(B) + beta C`` over the ranks. Distributions carry the global
    (stored) shapes: A is ``m x k`` (``k x m`` with `transa`), B ``k x n`` (``n x k`` with `transb`),
    C and D ``m x n``. `scales`: which FP8 scales the caller gives (``"a"``, ``"b"``, ``"d"``,
    ``"amax_d"``). With `compute_capability`, refuses what that GPU cannot run
    (:class:`ComputeCapabilityError`). `communication_type`: the type GEMM+ReduceScatter and
    GEMM+AllReduce send their partial products in (between D's type and the compute's scale type;
    cuBLASMp's default for 16-bit results of a 32-bit compute is float32, twice the traffic of D's
    own type); other algorithms reduce nothing and leave it unused."""
    for name, value in (("a", a), ("b", b), ("d", d), ("c", c)):
        if (value is not None or name != "c") and not isinstance(value, Distribution):
            raise TypeError(f"{name} must be a distribution (mpbind.distributions), not {type(value).__name__}")
    for name, dtype in (("a_dtype", a_dtype), ("b_dtype", b_dtype), ("d_dtype", d_dtype), ("c_dtype", c_dtype)):
        if (dtype is not None or name == "a_dtype") and not isinstance(dtype, str):
            raise TypeError(f"{name} must be a dtype name (str), not {type(dtype).__name__}")
    for name, flag in (("transa", transa), ("transb", transb)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, not {type(flag).__name__}")
    b_dtype = a_dtype if b_dtype is None else b_dtype
    d_dtype = (a_dtype if a_dtype not in FP8 + (FP4,) else "bfloat16") if d_dtype is None else d_dtype
    kind = _epilogue(epilogue)
    nranks = _nranks(a=a, b=b, c=c, d=d)
    m, n, k = _dims(a, b, c, d, transa, transb)
    if scaling not in (None, "tensor", "mxfp8", "nvfp4"):
        raise UsageError(f"scaling must be 'tensor', 'mxfp8', 'nvfp4' or None; got {scaling!r}")
    checked, c_dtype = _types(a_dtype, b_dtype, c_dtype, d_dtype, c, scaling, transa, transb)  # type: ignore[arg-type]
    compute = _compute(a_dtype, compute_type)
    alpha, beta = _scalars(alpha, beta, a_dtype, c, _scale_type(compute, d_dtype))
    scale_names = _scales(checked, d_dtype, scales)

    ops = {name: _operand(name, dist, dtype, transa, transb)
           for name, dist, dtype in (("a", a, a_dtype), ("b", b, b_dtype), ("d", d, d_dtype), ("c", c, c_dtype))
           if dist is not None and dtype is not None}
    if c is not None and c != d:
        raise UsageError(f"C must be distributed as D is ({d!r}); C is {c!r}")
    reasons: list[str] = [
        f"D ({m} x {n}) = {'alpha ' if alpha != 1 else ''}op(A) op(B){' + beta C' if c is not None else ''}, "
        f"op(A) = {'A^T' if transa else 'A'} ({m} x {k}), op(B) = {'B^T' if transb else 'B'} ({k} x {n}), "
        f"{nranks} rank{'s' if nranks > 1 else ''}",
        *(f"{o.name.upper()} ({o.dist.shape[0]} x {o.dist.shape[1]} {o.dtype}): {o.describe()}" for o in ops.values()),
    ]
    extents: dict[Dim, int] = {"m": m, "n": n, "k": k}
    chosen = _choose(ops, extents, nranks, transa, transb, kind, reasons)
    algorithm, operands = chosen

    if algorithm == "gemm_allreduce" and kind.member != _E.DEFAULT:
        raise UsageError(f"a replicated D comes from GEMM+AllReduce, cuBLASMp's ALLREDUCE epilogue, which combines "
                         f"with no other epilogue; asked for {epilogue!r}")
    required = _fp8_checks(checked, a_dtype, algorithm, operands, nranks, extents)
    communicated = _communication(communication_type, algorithm, d_dtype, compute, reasons)
    staging, symmetric = _memory(algorithm, operands, extents, compute, d_dtype, communicated, reasons)
    result = MatmulPlan(
        algorithm=algorithm, nranks=nranks, m=m, n=n, k=k, transa=transa, transb=transb, a=operands["a"],
        b=operands["b"], d=operands["d"], c=operands.get("c"), compute_type=compute,
        epilogue="none" if epilogue is None else epilogue, alpha=alpha, beta=beta, scaling=checked,
        scales=scale_names, bias_dtype=(c_dtype or d_dtype) if kind.bias else None,
        aux_dtype=None if not kind.aux or kind.relu_mask else (c_dtype or d_dtype),
        symmetric_workspace=symmetric, staging_bytes=staging, required_capability=required,
        communication_dtype=communicated, reasons=())
    reasons.append(f"compute type {compute.name}; epilogue {result.epilogue_member.name}"
                   + (f"; {checked} scaling" if checked else ""))
    if required is not None:
        reasons.append(f"needs compute capability {required[0]}.{required[1]} or newer ({_feature(result)})")
    result = replace(result, reasons=tuple(reasons))
    if compute_capability is not None:
        result.require(compute_capability)
    return result


def _epilogue(epilogue: str | None) -> _EpilogueKind:
    if epilogue is None:
        return EPILOGUES["none"]
    if not isinstance(epilogue, str):
        raise TypeError(f"epilogue must be a str ({', '.join(EPILOGUES)}) or None, not {type(epilogue).__name__}")
    if epilogue not in EPILOGUES:
        raise UsageError(f"epilogue must be one of {', '.join(EPILOGUES)}; got {epilogue!r}")
    return EPILOGUES[epilogue]


def _nranks(**dists: Distribution | None) -> int:
    counts = {name: dist.nranks for name, dist in dists.items() if dist is not None}
    if len(set(counts.values())) != 1:
        raise UsageError("A, B, C and D must be spread over the same ranks; their distributions have "
                         + ", ".join(f"{name.upper()}: {p}" for name, p in counts.items()) + " ranks")
    return counts["a"]


def _dims(a: Distribution, b: Distribution, c: Distribution | None, d: Distribution, transa: bool,
          transb: bool) -> tuple[int, int, int]:
    for name, dist in (("a", a), ("b", b), ("c", c), ("d", d)):
        if dist is not None and (dist.ndim != 2 or 0 in dist.shape):
            raise UsageError(f"{name.upper()} must be a non-empty matrix; its distribution's shape is {dist.shape}")
    m, k = (a.shape[1], a.shape[0]) if transa else a.shape
    kb, n = (b.shape[1], b.shape[0]) if transb else b.shape
    if kb != k:
        raise UsageError(f"op(A) is {m} x {k} but op(B) is {kb} x {n}: B must have k = {k} "
                         f"{'columns' if transb else 'rows'} (B's shape {b.shape})")
    if d.shape != (m, n):
        raise UsageError(f"D's shape is {d.shape}; op(A) op(B) is {m} x {n}")
    if c is not None and c.shape != (m, n):
        raise UsageError(f"C's shape is {c.shape}; D is {m} x {n}")
    return m, n, k


def _types(a: str, b: str, c: str | None, d: str, c_dist: Distribution | None, scaling: Scaling | None,
           transa: bool, transb: bool) -> tuple[Scaling | None, str | None]:
    """(the scaling, C's type) after checking the type combination."""
    for name, dtype in (("A", a), ("B", b), ("D", d), ("C", c)):
        if dtype is not None and dtype not in CUDA_TYPES:
            raise UsageError(f"{name} is {dtype}; cuBLASMp multiplies {', '.join(CUDA_TYPES)}")
    narrow = a in FP8 + (FP4,) or b in FP8 + (FP4,)
    if not narrow:
        if scaling is not None:
            raise UsageError(f"scaling={scaling!r} applies to FP8/FP4 operands; A and B are {a}")
        if not a == b == d:
            raise UsageError(f"A, B and D must have one type for {a} inputs (FP8 may differ); got A {a}, B {b}, D {d}")
        if c_dist is not None and c not in (None, d):
            raise UsageError(f"C must be {d} like D; got {c}")
        return None, (d if c_dist is not None else None)
    if (a, b) not in _FP8_OUTPUTS:
        raise UsageError(f"FP8 multiplies float8_e4m3fn x float8_e4m3fn, float8_e4m3fn x float8_e5m2 or "
                         f"float8_e5m2 x float8_e4m3fn (NVFP4: {FP4} x {FP4}); got A {a}, B {b}")
    if d not in _FP8_OUTPUTS[(a, b)]:
        raise UsageError(f"D of {a} x {b} must be one of {', '.join(_FP8_OUTPUTS[(a, b)])}; got {d}")
    if scaling is None:
        scaling = "nvfp4" if a == FP4 else "tensor"
    if (scaling == "nvfp4") != (a == FP4):
        raise UsageError(f"scaling={scaling!r} does not fit {a} operands ({FP4} needs 'nvfp4'; FP8 'tensor' or "
                         "'mxfp8')")
    if (transa, transb) != (True, False):
        raise UsageError("FP8/FP4 operands need transa=True, transb=False (K contiguous in A and B: cuBLASLt's TN "
                         f"layout); got transa={transa}, transb={transb}")
    c_narrow = d in FP8 + (FP4,)
    if c_narrow and scaling != "tensor":
        raise UsageError(f"a {d} D with {scaling} block scaling needs D's output scales, which a plan does not take "
                         "yet; use a wider D (bfloat16, float16, float32)")
    if c_dist is not None:
        allowed = ("bfloat16", "float16") if c_narrow else (d,)
        if c not in allowed:
            raise UsageError(f"C with a {d} D must be {' or '.join(allowed)}; got {c}")
        return scaling, c
    return scaling, None


def _compute(a_dtype: str, compute_type: CublasComputeType | int | None) -> CublasComputeType:
    allowed = _COMPUTE[a_dtype]
    if compute_type is None:
        return allowed[0]
    if isinstance(compute_type, bool) or not isinstance(compute_type, int):
        raise TypeError(f"compute_type must be a CublasComputeType, not {type(compute_type).__name__}")
    try:
        ct = CublasComputeType(compute_type)
    except ValueError:
        raise UsageError(f"compute_type {compute_type} is not a CublasComputeType") from None
    if ct not in allowed:
        raise UsageError(f"compute_type {ct.name} does not multiply {a_dtype}; use one of "
                         f"{', '.join(x.name for x in allowed)}")
    return ct


# The largest finite scalar of each scale type narrower than float64 (alpha and beta are passed in it).
_SCALE_MAX = {"float16": 65504.0, "float32": 3.4028234663852886e38, "complex64": 3.4028234663852886e38}


def _scalars(alpha: complex, beta: complex, dtype: str, c: Distribution | None,
             scale: str) -> tuple[complex, complex]:
    out = []
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, (int, float, complex)):
            raise TypeError(f"{name} must be a number, not {type(value).__name__}")
        try:
            v = complex(value)
        except OverflowError:
            raise UsageError(f"{name} = {_args.shown(value)} is beyond any float") from None
        limit = _SCALE_MAX.get(scale)
        if limit is not None and any(math.isfinite(x) and abs(x) > limit for x in (v.real, v.imag)):
            raise UsageError(f"{name} = {value!r} is beyond the {scale} scalars of this compute type")
        if v.imag and not dtype.startswith("complex"):
            raise UsageError(f"{name} = {value!r} is complex but the operands are {dtype}")
        out.append(v)
    if c is None and out[1] != 0:
        raise UsageError(f"beta = {beta!r} needs C (c=); without C, beta must be 0")
    return out[0], out[1]


def _scales(scaling: Scaling | None, d_dtype: str, given: Collection[str]) -> tuple[str, ...]:
    names = set(_args.sequence(given, "scales", 8, "names ('a', 'b', 'd', 'amax_d')"))
    unknown = names - {"a", "b", "d", "amax_d"}
    if unknown:
        raise UsageError(f"scales are named 'a', 'b', 'd', 'amax_d'; got {_args.shown(unknown)}")
    if scaling is None:
        if names:
            raise UsageError(f"scales {sorted(names)} apply to FP8/FP4 operands only")
        return ()
    needed = {"a", "b"} | ({"d"} if d_dtype in FP8 and scaling == "tensor" else set())
    missing = needed - names
    if missing:
        raise UsageError(f"{scaling} scaling needs scales for {', '.join(sorted(missing)).upper()} "
                         f"({'one float32 each' if scaling == 'tensor' else 'block scale tensors'})")
    if "amax_d" in names and d_dtype not in FP8:
        raise UsageError(f"amax_d is the amax of an FP8 D; D is {d_dtype}")
    if "d" in names and d_dtype not in FP8 + (FP4,):
        raise UsageError(f"a scale for D applies to an FP8 D; D is {d_dtype}")
    return tuple(x for x in ("a", "b", "d", "amax_d") if x in names)


def _operand(name: str, dist: Distribution, dtype: str, transa: bool, transb: bool) -> _Operand:
    dims: tuple[Dim, Dim]
    if name == "a":
        dims = ("k", "m") if transa else ("m", "k")
    elif name == "b":
        dims = ("n", "k") if transb else ("k", "n")
    else:
        dims = ("m", "n")
    if isinstance(dist, Replicated):
        return _Operand(name, dist, dtype, dims, None)
    try:
        dist.check()
        args = dist.to_block_cyclic()
    except UsageError as exc:
        raise UsageError(f"{name.upper()}: {exc}") from None
    return _Operand(name, dist, dtype, dims, args)


# --- choosing the algorithm -----------------------------------------------------------------------


def _role_counts(ops: dict[str, _Operand], roles: dict[str, Dim | None], extents: dict[Dim, int],
                 nranks: int) -> dict[Dim, tuple[int, ...]] | None:
    """The per-rank counts of each split dimension when every operand can take its role (None: no
    split, i.e. replicated), else None. A replicated operand takes any split; a split operand only
    its own; operands splitting one dimension must split it alike."""
    counts: dict[Dim, tuple[int, ...]] = {}
    for name, dim in roles.items():
        op = ops.get(name)
        if op is None:
            continue
        if dim is None:
            if not op.rep:
                return None
            continue
        if op.rep:
            if name in ("c", "d"):
                return None  # a replicated result must be whole on every rank: no part of a split will do
            continue
        s = op.split
        if s is None or s.dim != dim:
            return None
        if counts.setdefault(dim, s.counts) != s.counts:
            return None
    for dim in {d for d in roles.values() if d is not None} - set(counts):
        counts[dim] = tuple(numroc(extents[dim], -(-extents[dim] // nranks), r, 0, nranks) for r in range(nranks))
    return counts


def _choose(ops: dict[str, _Operand], extents: dict[Dim, int], nranks: int, transa: bool, transb: bool,
            kind: _EpilogueKind, reasons: list[str]) -> tuple[Algorithm, dict[str, OperandPlan]]:
    if nranks == 1:
        reasons.append("one rank: a local GEMM")
        return "local", _local(ops, extents, {}, nranks)
    tn = transa and not transb
    # (algorithm, roles of A, B, D (C follows D), why)
    candidates: list[tuple[Algorithm, dict[str, Dim | None], str]] = [
        ("local", {"a": "m", "b": None, "d": "m"}, "each rank's rows of D need only its rows of op(A) and all of B"),
        ("local", {"a": None, "b": "n", "d": "n"}, "each rank's columns of D need only all of A and its columns of "
                                                   "op(B)"),
        ("local", {"a": None, "b": None, "d": None}, "A, B and D are replicated: every rank computes all of D"),
        ("allgather_gemm", {"a": "m", "b": "n", "d": "m"},
         "op(A) and D split by rows alike, op(B) by columns: AllGather+GEMM (each rank gathers B while it multiplies)"),
        ("gemm_reducescatter", {"a": "k", "b": "k", "d": "n"},
         "op(A) and op(B) split along k alike, D by columns: GEMM+ReduceScatter (partial products reduced and "
         "scattered while they are computed)"),
        ("gemm_allreduce", {"a": "k", "b": "k", "d": None},
         "op(A) and op(B) split along k alike, D replicated: GEMM+AllReduce (cuBLASMp's ALLREDUCE epilogue)"),
    ]
    for algorithm, roles, why in candidates:
        roles = {**roles, "c": roles["d"]}
        counts = _role_counts(ops, roles, extents, nranks)
        if counts is None:
            continue
        if algorithm in ("allgather_gemm", "gemm_reducescatter") and all(ops[x].rep for x in "ab"):
            continue  # nothing to gather or reduce: a local case matched first
        if algorithm == "gemm_allreduce":
            if not tn:
                reasons.append("D is replicated and A, B split along k, but cuBLASMp's GEMM+AllReduce takes the TN "
                               "layout only (transa=True, transb=False)")
                break
            if all(ops[x].rep for x in "ab"):
                continue
        for name, op in ops.items():
            if op.rep and roles[name] is not None:
                reasons.append(f"{name.upper()} is replicated: each rank hands over its part of the split "
                               f"({roles[name]}) as a view")
        uniform = all(len(set(v)) == 1 for v in counts.values())
        if algorithm == "gemm_allreduce" and not uniform:
            # Only the ALLREDUCE epilogue returns a replicated D, and cuBLASMp 0.10 answers NOT_SUPPORTED
            # for it on uneven k (measured on two H200s): refuse here, the same on every rank.
            raise UsageError(f"D is replicated and A, B are split along k in uneven parts ({_counts_text(counts)}): "
                             "cuBLASMp's GEMM+AllReduce needs equal parts along k; split k evenly, or split D "
                             "(GEMM+ReduceScatter) and gather it")
        if algorithm in ("allgather_gemm", "gemm_reducescatter") and not uniform:
            reasons.append(f"{why}; but the parts are uneven ({_counts_text(counts)}): cuBLASMp's overlapped "
                           "algorithm needs equal parts on every rank, so it runs its general algorithm on the same "
                           "descriptors")
            return "general", _tp(algorithm, ops, roles, counts, extents, nranks)
        reasons.append(why)
        if algorithm == "local":
            return "local", _local(ops, extents, counts, nranks)
        return algorithm, _tp(algorithm, ops, roles, counts, extents, nranks)
    if ops["d"].rep:
        raise UsageError("D is replicated: cuBLASMp returns a replicated D only through GEMM+AllReduce, which needs "
                         "transa=True, transb=False with A and B split along k (or replicated), or with A and B both "
                         f"replicated (a local product); got A {ops['a'].describe()}, B {ops['b'].describe()}, "
                         f"transa={transa}, transb={transb}")
    return "general", _general(ops, extents, nranks, reasons)


def _counts_text(counts: dict[Dim, tuple[int, ...]]) -> str:
    return ", ".join(f"{dim}: {list(c)}" for dim, c in sorted(counts.items()))


def _blocked(counts: Sequence[int]) -> int:
    """The block of a contiguous split (the first non-empty part)."""
    return next((c for c in counts if c), 1)


def _split_desc(rows: int, cols: int, axis: int, counts: Sequence[int], other_block: int,
                nranks: int) -> BlockCyclicArgs:
    """A contiguous split of a stored axis on cuBLASMp's tensor-parallel grids: rows over P x 1
    (column-major), columns over 1 x P (row-major); `other_block` along the unsplit axis."""
    src = next((r for r, c in enumerate(counts) if c), 0)
    block = _blocked(counts)
    if axis == 0:
        return BlockCyclicArgs(rows, cols, block, other_block, src, 0, nranks, 1, "col")
    return BlockCyclicArgs(rows, cols, other_block, block, 0, src, 1, nranks, "row")


def _views(desc: BlockCyclicArgs, nranks: int) -> tuple[View | None, ...]:
    """The slice of a replicated (full) local array that is rank r's piece of the contiguous `desc`."""
    out: list[View | None] = []
    for r in range(nranks):
        prow, pcol = desc.coords(r)
        rows, cols = desc.local_shape(r)
        # A contiguous layout: process row i (from the source) holds block i.
        r0 = min(((prow - desc.rsrc) % desc.nprow) * desc.mb, desc.m) if desc.nprow > 1 else 0
        c0 = min(((pcol - desc.csrc) % desc.npcol) * desc.nb, desc.n) if desc.npcol > 1 else 0
        out.append((r0, r0 + rows, c0, c0 + cols))
    return tuple(out)


def _tp(algorithm: Algorithm, ops: dict[str, _Operand], roles: dict[str, Dim | None],
        counts: dict[Dim, tuple[int, ...]], extents: dict[Dim, int], nranks: int) -> dict[str, OperandPlan]:
    """Descriptors of the tensor-parallel layouts: one block size per dimension (the split's, else the
    whole extent), so that mbA == mbD, nbB == nbD and kbA == kbB."""
    blocks = {dim: _blocked(counts[dim]) if dim in counts else extents[dim] for dim in ("m", "n", "k")}
    out: dict[str, OperandPlan] = {}
    for name, op in ops.items():
        rows, cols = op.dist.shape[0], op.dist.shape[1]
        dim = roles[name]
        if dim is None:  # D (and C) of GEMM+AllReduce: every rank's full m x n is column block r of m x nP
            desc = BlockCyclicArgs(rows, cols * nranks, rows, cols, 0, 0, 1, nranks, "row")
            out[name] = OperandPlan(name, op.dtype, (rows, cols), op.dist, (desc,) * nranks, (None,) * nranks)
            continue
        axis = op.dims.index(dim)
        other = op.dims[1 - axis]
        desc = _split_desc(rows, cols, axis, counts[dim], blocks[other], nranks)
        views = _views(desc, nranks) if op.rep else (None,) * nranks
        out[name] = OperandPlan(name, op.dtype, (rows, cols), op.dist, (desc,) * nranks, views)
    return out


def _local(ops: dict[str, _Operand], extents: dict[Dim, int], counts: dict[Dim, tuple[int, ...]],
           nranks: int) -> dict[str, OperandPlan]:
    """Each rank multiplies its own pieces on a 1 x 1 grid of its own: per-rank descriptors."""
    starts = {dim: tuple(itertools.accumulate(c, initial=0)) for dim, c in counts.items()}
    out: dict[str, OperandPlan] = {}
    for name, op in ops.items():
        rows, cols = op.dist.shape[0], op.dist.shape[1]
        descs: list[BlockCyclicArgs] = []
        views: list[View | None] = []
        for r in range(nranks):
            bounds = []
            for axis, dim in enumerate(op.dims):
                extent = (rows, cols)[axis]
                if dim in counts:
                    start = starts[dim][r]
                    bounds.append((start, start + counts[dim][r]))
                else:
                    bounds.append((0, extent))
            (r0, r1), (c0, c1) = bounds
            descs.append(BlockCyclicArgs(r1 - r0, c1 - c0, max(1, r1 - r0), max(1, c1 - c0), 0, 0, 1, 1, "col"))
            views.append((r0, r1, c0, c1) if op.rep and (r1 - r0, c1 - c0) != (rows, cols) else None)
        out[name] = OperandPlan(name, op.dtype, (rows, cols), op.dist, tuple(descs), tuple(views))
    return out


def _general(ops: dict[str, _Operand], extents: dict[Dim, int], nranks: int,
             reasons: list[str]) -> dict[str, OperandPlan]:
    """cuBLASMp's general algorithm on the operands' own layouts: along each dimension, the block of
    every operand split there must agree (the data stays where it is); where a grid has one process,
    any block describes the data, so it takes the dimension's block."""
    fixed: dict[Dim, dict[str, int]] = {"m": {}, "n": {}, "k": {}}
    for name, op in ops.items():
        if op.args is None:
            continue
        for axis, dim in enumerate(op.dims):
            procs = op.args.nprow if axis == 0 else op.args.npcol
            if procs > 1:
                fixed[dim][name] = op.args.mb if axis == 0 else op.args.nb
    blocks: dict[Dim, int] = {}
    for dim, by in fixed.items():
        if len(set(by.values())) > 1:
            raise UsageError(f"the {dim} blocks differ: " + ", ".join(f"{x.upper()} {b}" for x, b in by.items())
                             + f"; cuBLASMp needs one block size along {dim} in every matrix that has it "
                               "(the data is not moved to make them agree)")
        blocks[dim] = next(iter(by.values())) if by else extents[dim]
    out: dict[str, OperandPlan] = {}
    for name, op in ops.items():
        rows, cols = op.dist.shape[0], op.dist.shape[1]
        if op.args is None:
            desc = _adopt(name, op, blocks, extents, nranks)
            reasons.append(f"{name.upper()} is replicated: it is described as split along "
                           f"{op.dims[0] if desc.npcol == 1 else op.dims[1]} and each rank hands over its part as a "
                           "view")
            out[name] = OperandPlan(name, op.dtype, (rows, cols), op.dist, (desc,) * nranks, _views(desc, nranks))
            continue
        a = op.args
        desc = replace(a, mb=a.mb if a.nprow > 1 else blocks[op.dims[0]],
                       nb=a.nb if a.npcol > 1 else blocks[op.dims[1]])
        out[name] = OperandPlan(name, op.dtype, (rows, cols), op.dist, (desc,) * nranks, (None,) * nranks)
    grids = {o.grid for o in out.values()}
    if len(grids) == 1:
        nprow, npcol, _ = next(iter(grids))
        if 1 in (nprow, npcol):
            # One 1-D grid for every matrix makes cuBLASMp run SUMMA, which mishandles 1-D layouts
            # (nvmath-python avoids it the same way): D and C go on the other layout of the same
            # shape, which numbers a 1-D grid's ranks identically.
            for name in ("d", "c"):
                if name in out:
                    o = out[name]
                    flipped = replace(o.descs[0], layout="row" if o.descs[0].layout == "col" else "col")
                    out[name] = replace(o, descs=(flipped,) * nranks)
            reasons.append("general algorithm: every matrix on one 1-D grid; D goes on its other layout (same ranks) "
                           "so that cuBLASMp does not run SUMMA on a 1-D layout")
        else:
            reasons.append(f"general algorithm: SUMMA on the {nprow} x {npcol} grid every matrix shares")
    else:
        reasons.append("general algorithm: the matrices are on different grids; cuBLASMp moves blocks between them")
    reasons.append("blocks: " + ", ".join(f"{dim} {b}" for dim, b in blocks.items()))
    return out


def _adopt(name: str, op: _Operand, blocks: dict[Dim, int], extents: dict[Dim, int],
           nranks: int) -> BlockCyclicArgs:
    """A layout for a replicated operand in the general algorithm: split contiguously along one of
    its dimensions with that dimension's block (its view is then a slice), preferring a real split;
    a block as large as the extent puts it all on the first rank."""
    rows, cols = op.dist.shape[0], op.dist.shape[1]
    options = []
    for axis, dim in enumerate(op.dims):
        b = blocks[dim]
        if b * nranks >= extents[dim]:
            options.append((b >= extents[dim], axis))
    if not options:
        raise UsageError(f"{name.upper()} is replicated, but the other matrices' blocks along "
                         f"{' and '.join(op.dims)} are cyclic; a slice of {name.upper()} cannot take that layout "
                         f"(give {name.upper()} a distribution)")
    _, axis = min(options)
    other = blocks[op.dims[1 - axis]]
    counts = [numroc(extents[op.dims[axis]], blocks[op.dims[axis]], r, 0, nranks) for r in range(nranks)]
    return _split_desc(rows, cols, axis, counts, other, nranks)


# --- narrow types and memory ----------------------------------------------------------------------


def _fp8_checks(scaling: Scaling | None, a_dtype: str, algorithm: Algorithm, ops: dict[str, OperandPlan],
                nranks: int, extents: dict[Dim, int]) -> tuple[int, int] | None:
    """The compute capability FP8/FP4 needs, after checking the local GEMM sizes its kernels take."""
    if scaling is None:
        return None
    multiple = {"tensor": (16, 16, 16), "mxfp8": (128, 128, 128), "nvfp4": (128, 128, 64)}[scaling]
    for r in range(nranks):
        m, n, k = _local_gemm(algorithm, ops, r, nranks, extents)
        for dim, size, mult in (("m", m, multiple[0]), ("n", n, multiple[1]), ("k", k, multiple[2])):
            if size % mult:
                raise UsageError(f"{scaling} FP8 kernels need local GEMM sizes in multiples of {mult} along {dim}; "
                                 f"rank {r}'s local GEMM is {m} x {n} x {k} ({algorithm})")
    return (8, 9) if scaling == "tensor" else (10, 0)


def _local_gemm(algorithm: Algorithm, ops: dict[str, OperandPlan], rank: int, nranks: int,
                extents: dict[Dim, int]) -> tuple[int, int, int]:
    """(m, n, k) of the GEMM a rank runs: what the algorithm leaves local."""
    m, n, k = extents["m"], extents["n"], extents["k"]
    if algorithm == "local":
        rows, cols = ops["d"].local_shape(rank)
        return rows, cols, k
    if algorithm == "allgather_gemm":
        return ops["d"].local_shape(rank)[0], n, k
    if algorithm in ("gemm_reducescatter", "gemm_allreduce"):
        a = ops["a"]
        return m, n, a.local_shape(rank)[0] if a.descs[0].npcol == 1 else a.local_shape(rank)[1]
    # general: a block of D at a time; FP8 is TN, so A is k x m and its row block is k's.
    return ops["d"].descs[0].mb, ops["d"].descs[0].nb, ops["a"].descs[0].mb


def _scale_type(compute: CublasComputeType, d_dtype: str) -> str:
    """The type alpha and beta (and the accumulation) have: the compute type's, complex with D."""
    real = "float16" if compute.name.startswith("COMPUTE_16F") else (
        "float64" if compute.name.startswith("COMPUTE_64F") else "float32")
    if d_dtype.startswith("complex"):
        return {"float32": "complex64", "float64": "complex128"}[real]
    return real


def _communication(communication_type: str | CudaDataType | int | None, algorithm: Algorithm, d_dtype: str,
                   compute: CublasComputeType, reasons: list[str]) -> str | None:
    """The type the partial products travel in, checked against cuBLASMp's rule (D's type <= it <= the
    scale type, by element size); None where cuBLASMp chooses, or where nothing is reduced."""
    if communication_type is None:
        return None
    if isinstance(communication_type, str):
        name = communication_type
        if name not in CUDA_TYPES:
            raise UsageError(f"communication_type {name!r} is not one of {', '.join(CUDA_TYPES)}")
    elif isinstance(communication_type, int) and not isinstance(communication_type, bool):
        names = {int(v): k for k, v in CUDA_TYPES.items()}
        if int(communication_type) not in names:
            raise UsageError(f"communication_type {communication_type!r} is not a type cuBLASMp multiplies")
        name = names[int(communication_type)]
    else:
        raise TypeError(f"communication_type must be a dtype name or a CudaDataType, not "
                        f"{type(communication_type).__name__}")
    if algorithm not in ("gemm_reducescatter", "gemm_allreduce"):
        reasons.append(f"communication type {name}: not used ({algorithm} reduces no partial products)")
        return None
    scale = _scale_type(compute, d_dtype)
    if name.startswith("complex") != d_dtype.startswith("complex") or not (
            _ITEMSIZE[d_dtype] <= _ITEMSIZE[name] <= _ITEMSIZE[scale]):
        raise UsageError(f"communication_type {name} must be as wide as D ({d_dtype}) and no wider than the scale "
                         f"type ({scale}), {'complex' if d_dtype.startswith('complex') else 'real'} like D")
    reasons.append(f"partial products communicated in {name}")
    return name


def _memory(algorithm: Algorithm, ops: dict[str, OperandPlan], extents: dict[Dim, int],
            compute: CublasComputeType, d_dtype: str, communicated: str | None,
            reasons: list[str]) -> tuple[int, bool]:
    """(bytes the algorithm stages at least, whether the workspace must be symmetric)."""
    m, n, k = extents["m"], extents["n"], extents["k"]
    # cuBLASMp (>= 0.8.1) communicates 16-bit results of a 32-bit compute type in 32 bits, unless told.
    wide = 4 if compute.name.startswith("COMPUTE_32F") and _ITEMSIZE[d_dtype] <= 2 else _ITEMSIZE[d_dtype]
    if communicated is not None:
        wide = _ITEMSIZE[communicated]
    if algorithm == "allgather_gemm":
        staged = _args.product((k, n, _ITEMSIZE[ops["b"].dtype]), "the gathered B (bytes)")
        what = "the gathered B"
    elif algorithm in ("gemm_reducescatter", "gemm_allreduce"):
        staged = _args.product((m, n, wide), "the partial products of D (bytes)")
        what = "the partial products of D"
    else:
        staged = 0
        what = ""
    symmetric = algorithm in ("allgather_gemm", "gemm_reducescatter", "gemm_allreduce")
    if symmetric:
        grids = sorted({(o.grid[0], o.grid[1], o.grid[2].name) for o in ops.values()})
        reasons.append(f"workspace: at least {staged} bytes ({what}) from cublasMpMalloc (NCCL symmetric memory), "
                       f"registered on the grids {', '.join(f'{r} x {c} {lay}' for r, c, lay in grids)}; the "
                       "overlapped algorithms need it (on other memory cuBLASMp falls back to NO_OVERLAP or fails "
                       "with an internal error)")
    elif algorithm == "local":
        reasons.append("workspace: whatever the local GEMM asks (cublasMpMatmul_bufferSize), no communication")
    else:
        reasons.append("workspace: sized by cublasMpMatmul_bufferSize, from cublasMpMalloc on D's grid")
    for o in ops.values():
        reasons.append(f"{o.name.upper()}: {o.grid_description} grid, blocks {o.descs[0].mb} x {o.descs[0].nb}"
                       + (f", rank 0's local piece {o.local_shape(0)[0]} x {o.local_shape(0)[1]}"
                          if algorithm != "local" else ""))
    return staged, symmetric


def block_scale_elements(outer: int, k: int, scaling: Scaling) -> int:
    """Elements of the block-scale tensor of a ``k x outer`` operand (K contiguous): one scale per 32
    (MXFP8) or 16 (NVFP4) elements along K, in tiles of 128 x 4 (cuBLASLt's scale layout)."""
    vec = 32 if scaling == "mxfp8" else 16
    return _round_up(outer, 128) * _round_up(-(-k // vec), 4)  # integer ceil: k / vec rounds beyond 2**53
