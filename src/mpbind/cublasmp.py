"""cuBLASMp, the Pythonic way: cached grids, owned descriptors, planned matmuls.

    from mpbind import cublasmp, nccl
    comm = nccl.Communicator.from_mpi(MPI.COMM_WORLD)
    handle = cublasmp.Handle(stream)
    grid = cublasmp.grid(comm, nprow, npcol)              # cached per (comm, device, shape, layout)
    a = cublasmp.Matrix(grid, a_local, shape=(m, k), block=(mb, nb))
    ...
    mm = cublasmp.Matmul(handle, a, b, d, transa=True)    # sizes and allocates the workspace once
    mm.execute()                                          # one cublasMpMatmul call
    mm.capture(stream); mm.execute()                      # or: one CUDA graph replay

Matrices are column-major, as cuBLASMp's: a local piece is a Fortran-ordered 2-D device
array (a row-major ``x`` enters as ``x.T``). A grid lives until its communicator closes;
closing the communicator releases, in order, registrations, workspaces, descriptors and
grids on it. Workspaces come from ``cublasMpMalloc`` and are shared by the plans of a grid,
registered on every other grid a plan touches. The flat C API is :mod:`mpbind.bindings.cublasmp`;
every object's ``ptr`` is its C handle for it.

Ownership: a :class:`Matrix` owns its descriptor (the array stays the caller's); a
:class:`Matmul` owns the matmul descriptor it creates, while one passed in stays the caller's
unless ``own_descriptor=True``.

Matmuls planned from how each matrix is distributed are built on this module by the feature
:mod:`mpbind.matmul` (``mpbind.matmul.plan``); this module does not import it.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import struct
from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Any, Generic, TypeVar, cast, overload

from mpbind import _core
from mpbind._infra import args as _args
from mpbind._infra import interop as _interop
from mpbind._infra.owned import Owned, core_of
from mpbind.bindings import cublasmp as _flat
from mpbind.bindings.cublasmp import (
    CublasComputeType,
    CublasOperation,
    CudaDataType,
    GridLayout,
    MatmulAlgoType,
    MatmulDescriptorAttribute,
    MatmulEpilogue,
    MatmulMatrixScale,
    ResultScheme,
)
from mpbind.errors import UsageError
from mpbind.nccl import Communicator
from mpbind.typing import Array, Stream

__all__ = [
    "CublasComputeType", "CublasOperation", "CudaDataType", "Grid", "GridLayout", "Handle", "Matmul",
    "MatmulAlgoType", "MatmulDescriptor", "MatmulDescriptorAttribute", "MatmulEpilogue", "MatmulMatrixScale", "Matrix",
    "DATA_TYPES", "MatrixDescriptor", "ResultScheme", "Workspace", "gemm", "grid", "grid_cache_info", "matmul",
    "scalar_bytes",
]

Handle = _core.cublasmp.Handle
Grid = _core.cublasmp.Grid
MatrixDescriptor = _core.cublasmp.MatrixDescriptor
Workspace = _core.cublasmp.Workspace

#: The CUDA data type of a matrix of each dtype the layer takes (a :class:`Matrix`'s array, a
#: matmul descriptor's communication type), read-only.
DATA_TYPES: Mapping[str, CudaDataType] = MappingProxyType({
    "float16": CudaDataType.R_16F, "bfloat16": CudaDataType.R_16BF, "float32": CudaDataType.R_32F,
    "float64": CudaDataType.R_64F, "complex64": CudaDataType.C_32F, "complex128": CudaDataType.C_64F,
    "int8": CudaDataType.R_8I, "int32": CudaDataType.R_32I, "float8_e4m3fn": CudaDataType.R_8F_E4M3,
    "float8_e5m2": CudaDataType.R_8F_E5M2,
})


_MAX_I64 = 2**63 - 1


def grid(comm: Communicator, nprow: int, npcol: int, layout: GridLayout | int = GridLayout.COL_MAJOR) -> Grid:
    """The cached grid of `comm` (an :class:`mpbind.nccl.Communicator`); created collectively on a miss."""
    core = core_of(comm) if isinstance(comm, Communicator) else comm
    if not isinstance(core, _core.nccl.Communicator):
        raise TypeError(f"comm must be an mpbind.nccl.Communicator, not {type(comm).__name__}")
    nprow = _args.integer(nprow, "nprow", minimum=1, maximum=_MAX_I64)
    npcol = _args.integer(npcol, "npcol", minimum=1, maximum=_MAX_I64)
    return _core.cublasmp.grid(core, nprow, npcol, int(_member(layout, "layout", GridLayout)))


_E = TypeVar("_E", bound=IntEnum)


def _member(value: Any, name: str, enum: type[_E]) -> _E:
    """`value` (a member of `enum` or its int value) as the member, or TypeError/UsageError naming `name`."""
    v = _args.integer(value, name)
    try:
        return enum(v)
    except ValueError:
        raise UsageError(f"{name} must be a {enum.__name__} ({', '.join(m.name for m in enum)}), got {v}") from None


def _pair(value: Any, name: str, minimum: int) -> tuple[int, int]:
    """A pair of ints >= `minimum` (a shape, a block, a process coordinate)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a pair of ints, not {value!r}")
    return (_args.integer(value[0], f"{name}[0]", minimum=minimum, maximum=_MAX_I64),
            _args.integer(value[1], f"{name}[1]", minimum=minimum, maximum=_MAX_I64))


def _number(value: Any, name: str) -> complex:
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    try:
        return complex(cast("complex", value))  # int, float, complex, NumPy scalars
    except (OverflowError, TypeError, ValueError) as exc:  # an int beyond any float, a Number without complex()
        raise UsageError(f"{name} = {_args.shown(value)} is not a number a matmul scalar can hold: {exc}") from None


def _matrix(value: Any, name: str) -> Matrix:
    return _args.instance(value, name, Matrix, "a cublasmp.Matrix")


def _compute_type(value: Any, dtype: str) -> int:
    return int(_compute_for(dtype) if value is None else _member(value, "compute_type", CublasComputeType))


def grid_cache_info() -> dict[str, int]:
    """Grid cache statistics: ``entries``, ``hits``, ``misses``."""
    return dict(_core.cublasmp.grid_cache_info())


def _compute_for(dtype: str) -> CublasComputeType:
    if dtype in ("float64", "complex128"):
        return CublasComputeType.COMPUTE_64F
    if dtype == "int8":
        return CublasComputeType.COMPUTE_32I
    return CublasComputeType.COMPUTE_32F


_SCALAR_MAX = {"e": 65504.0, "f": 3.4028234663852886e38}  # the largest finite float16 and float32


def scalar_bytes(value: complex, compute: CublasComputeType | int, complex_data: bool = False,
                 name: str = "scalar") -> bytes:
    """`value` as the host bytes cuBLASMp reads for a scalar (alpha, beta) of compute type `compute`:
    its real part, then its imaginary part for `complex_data`, in the type cuBLAS uses for `compute`.
    A UsageError naming `name` where that type cannot hold it (not an int32 for an integer compute
    type, beyond a float16 or float32), rather than a rounded or wrapped value."""
    base = CublasComputeType(compute).name
    if base.startswith("COMPUTE_64F"):
        fmt = "d"
    elif base.startswith("COMPUTE_32I"):
        fmt = "i"
    elif base.startswith("COMPUTE_16F"):
        fmt = "e"
    else:
        fmt = "f"
    v = _number(value, name)
    if not complex_data and v.imag:
        raise UsageError(f"{name} = {_args.shown(value)}: a complex scalar for real data")
    parts = (v.real, v.imag) if complex_data else (v.real,)
    if fmt == "i":
        if not all(p.is_integer() and -(2**31) <= p < 2**31 for p in parts):
            raise UsageError(f"{name} = {_args.shown(value)}: an integer compute type takes an int32 scalar")
        return struct.pack(fmt * len(parts), *(int(p) for p in parts))
    largest = _SCALAR_MAX.get(fmt)  # struct rounds a float32 beyond it to inf: refused, as a float16 is
    if largest is not None and any(math.isfinite(p) and abs(p) > largest for p in parts):
        raise UsageError(f"{name} = {_args.shown(value)} is beyond the {'float16' if fmt == 'e' else 'float32'} "
                         f"scalar of {base}")
    return struct.pack(fmt * len(parts), *parts)


class Matrix(Owned):
    """The local piece of a block-cyclic distributed matrix and its descriptor on `grid`.

    `local` is a column-major (Fortran-ordered) 2-D device array: this process's rows x columns
    of the global ``shape`` in ``block`` = (mb, nb) blocks, the first block on process
    ``src`` = (rsrc, csrc). On a 1 x 1 grid `shape` and `block` default to the local shape.
    The matrix owns its descriptor (``close()`` destroys it); the array stays the caller's.
    """

    __slots__ = ("grid", "array", "info", "shape", "block", "_core")
    _core: MatrixDescriptor
    grid: Grid
    array: Array
    info: _interop.ArrayInfo
    shape: tuple[int, int]
    block: tuple[int, int]

    def __init__(self, grid: Grid, local: Array, shape: tuple[int, int] | None = None,
                 block: tuple[int, int] | None = None, src: tuple[int, int] = (0, 0)) -> None:
        _args.instance(grid, "grid", Grid, "a cublasmp.Grid (from cublasmp.grid())")
        if not (_args.exports_array(local) or isinstance(local, _interop.ArrayInfo)):
            raise TypeError(f"local must be a device array (__cuda_array_interface__ or DLPack), "
                            f"not {type(local).__name__}")
        shape = None if shape is None else _pair(shape, "shape", 0)
        block = None if block is None else _pair(block, "block", 1)
        src = _pair(src, "src", 0)
        info = _interop.device_array(local, "local matrix", contiguous=False)
        if len(info.shape) != 2:
            raise UsageError(f"a local matrix is 2-D, got shape {info.shape}")
        rows, cols = info.shape
        if info.strides[0] != 1 and rows > 1:
            raise UsageError(
                f"a local matrix must be column-major (strides (1, lld)); got strides {info.strides} "
                "elements: pass x.T for a row-major x")
        lld = max(1, info.strides[1] if cols > 1 else rows)
        if lld < rows:
            raise UsageError(f"leading dimension {lld} < {rows} local rows")
        if info.dtype not in DATA_TYPES:
            raise UsageError(f"cuBLASMp has no {info.dtype} matrices")
        single = grid.nprow == 1 and grid.npcol == 1
        if shape is None:
            if not single:
                raise UsageError("shape= (the global shape) is required on a grid larger than 1 x 1")
            shape = (rows, cols)
        if block is None:
            if not single:
                raise UsageError("block= (mb, nb) is required on a grid larger than 1 x 1")
            block = (max(1, rows), max(1, cols))
        m, n = shape
        mb, nb = block
        expect_rows = _flat.numroc(m, mb, self._coord(grid, 0), src[0], grid.nprow) if grid.nprow > 1 else m
        expect_cols = _flat.numroc(n, nb, self._coord(grid, 1), src[1], grid.npcol) if grid.npcol > 1 else n
        if (rows, cols) != (expect_rows, expect_cols):
            raise UsageError(
                f"local piece is {rows} x {cols}; a {m} x {n} matrix in {mb} x {nb} blocks on a "
                f"{grid.nprow} x {grid.npcol} grid gives this process {expect_rows} x {expect_cols}")
        self.grid = grid
        self.array = local
        self.info = info
        self.shape = (m, n)
        self.block = (mb, nb)
        self._core = grid.matrix_descriptor(m, n, mb, nb, src[0], src[1], lld, int(DATA_TYPES[info.dtype]))

    @staticmethod
    def _coord(grid: Grid, axis: int) -> int:
        comm = grid.communicator
        rank = comm.rank
        # cuBLASMp grids number processes column-major (COL_MAJOR) or row-major (ROW_MAJOR).
        if grid.layout == GridLayout.COL_MAJOR:
            return rank % grid.nprow if axis == 0 else rank // grid.nprow
        return rank // grid.npcol if axis == 0 else rank % grid.npcol

    @property
    def descriptor(self) -> MatrixDescriptor:
        """Its ``cublasMpMatrixDescriptor_t`` (owned: closed with the matrix)."""
        return self._core

    @property
    def dtype(self) -> str:
        return self.info.dtype

    @property
    def ptr(self) -> int:
        return self.info.ptr

    def operand(self) -> tuple[int, int, int, MatrixDescriptor]:
        """(ptr, ia, ja, descriptor) as the core's matmul plan takes it."""
        return (self.info.ptr, 1, 1, self._core)

    def _described(self) -> str:
        return f"local {self.info.shape[0]}x{self.info.shape[1]} {self.dtype}"


_V = TypeVar("_V", bound=int)

# The C value range of each attribute (struct format of its C type in the flat bindings' table).
_RANGES = {"i": (-(2**31), 2**31 - 1), "q": (-(2**63), 2**63 - 1), "Q": (0, 2**64 - 1)}


class _Attribute(Generic[_V]):
    """One attribute of a matmul descriptor, typed as in cublasmp.h: an enum member or an int.

    Read, it is ``cublasMpMatmulDescriptorGetAttribute``; set, it checks the value (an int in the C type's
    range; for an enum, one of its members) and calls ``cublasMpMatmulDescriptorSetAttribute``."""

    attr: MatmulDescriptorAttribute
    kind: type[_V]  # its enum, or int
    name: str
    low: int  # the C type's range
    high: int

    def __init__(self, attr: MatmulDescriptorAttribute, kind: type[_V]) -> None:
        self.attr = attr
        self.kind = kind
        self.name = attr.name.lower()
        self.low, self.high = _RANGES[_flat.MATMUL_DESCRIPTOR_ATTRIBUTE_TYPES[attr][1]]
        self.__doc__ = f"CUBLASMP_MATMUL_DESCRIPTOR_ATTRIBUTE_{attr.name} ({kind.__name__})."

    @overload
    def __get__(self, obj: None, owner: type[MatmulDescriptor]) -> _Attribute[_V]: ...
    @overload
    def __get__(self, obj: MatmulDescriptor, owner: type[MatmulDescriptor]) -> _V: ...

    def __get__(self, obj: MatmulDescriptor | None, owner: type[MatmulDescriptor]) -> _Attribute[_V] | _V:
        if obj is None:
            return self
        return cast("_V", _flat.matmul_descriptor_get(obj.ptr, self.attr))

    def __set__(self, obj: MatmulDescriptor, value: _V | int) -> None:
        if issubclass(self.kind, IntEnum):
            value = _member(value, self.name, self.kind)
        else:
            value = _args.integer(value, self.name, minimum=self.low, maximum=self.high)
        _flat.matmul_descriptor_set(obj.ptr, self.attr, value)


_A = MatmulDescriptorAttribute


class MatmulDescriptor(Owned):
    """``cublasMpMatmulDescriptor_t`` with one typed property per attribute (``transa``, ``epilogue``,
    ``algo_type``, ``communication_sm_count``, ``a_scale_pointer``, ``amax_d_pointer``, ``bias_pointer``, ...).

    Keyword arguments of the constructor set attributes by those names.
    """

    _core: _core.cublasmp.MatmulDescriptor

    # One per MatmulDescriptorAttribute, typed as cublasmp.h types it (a test checks them against the
    # flat bindings' MATMUL_DESCRIPTOR_ATTRIBUTE_TYPES).
    transa: _Attribute[CublasOperation] = _Attribute(_A.TRANSA, CublasOperation)
    transb: _Attribute[CublasOperation] = _Attribute(_A.TRANSB, CublasOperation)
    compute_type: _Attribute[CublasComputeType] = _Attribute(_A.COMPUTE_TYPE, CublasComputeType)
    algo_type: _Attribute[MatmulAlgoType] = _Attribute(_A.ALGO_TYPE, MatmulAlgoType)
    communication_sm_count: _Attribute[int] = _Attribute(_A.COMMUNICATION_SM_COUNT, int)
    epilogue: _Attribute[MatmulEpilogue] = _Attribute(_A.EPILOGUE, MatmulEpilogue)
    bias_pointer: _Attribute[int] = _Attribute(_A.BIAS_POINTER, int)
    bias_batch_stride: _Attribute[int] = _Attribute(_A.BIAS_BATCH_STRIDE, int)
    bias_data_type: _Attribute[CudaDataType] = _Attribute(_A.BIAS_DATA_TYPE, CudaDataType)
    epilogue_aux_pointer: _Attribute[int] = _Attribute(_A.EPILOGUE_AUX_POINTER, int)
    epilogue_aux_ld: _Attribute[int] = _Attribute(_A.EPILOGUE_AUX_LD, int)
    epilogue_aux_batch_stride: _Attribute[int] = _Attribute(_A.EPILOGUE_AUX_BATCH_STRIDE, int)
    epilogue_aux_data_type: _Attribute[CudaDataType] = _Attribute(_A.EPILOGUE_AUX_DATA_TYPE, CudaDataType)
    epilogue_aux_scale_pointer: _Attribute[int] = _Attribute(_A.EPILOGUE_AUX_SCALE_POINTER, int)
    epilogue_aux_amax_pointer: _Attribute[int] = _Attribute(_A.EPILOGUE_AUX_AMAX_POINTER, int)
    epilogue_aux_scale_mode: _Attribute[MatmulMatrixScale] = _Attribute(_A.EPILOGUE_AUX_SCALE_MODE,
                                                                        MatmulMatrixScale)
    a_scale_pointer: _Attribute[int] = _Attribute(_A.A_SCALE_POINTER, int)
    a_scale_mode: _Attribute[MatmulMatrixScale] = _Attribute(_A.A_SCALE_MODE, MatmulMatrixScale)
    b_scale_pointer: _Attribute[int] = _Attribute(_A.B_SCALE_POINTER, int)
    b_scale_mode: _Attribute[MatmulMatrixScale] = _Attribute(_A.B_SCALE_MODE, MatmulMatrixScale)
    c_scale_pointer: _Attribute[int] = _Attribute(_A.C_SCALE_POINTER, int)
    c_scale_mode: _Attribute[MatmulMatrixScale] = _Attribute(_A.C_SCALE_MODE, MatmulMatrixScale)
    d_scale_pointer: _Attribute[int] = _Attribute(_A.D_SCALE_POINTER, int)
    d_scale_mode: _Attribute[MatmulMatrixScale] = _Attribute(_A.D_SCALE_MODE, MatmulMatrixScale)
    amax_d_pointer: _Attribute[int] = _Attribute(_A.AMAX_D_POINTER, int)
    d_out_scale_pointer: _Attribute[int] = _Attribute(_A.D_OUT_SCALE_POINTER, int)
    d_out_scale_mode: _Attribute[MatmulMatrixScale] = _Attribute(_A.D_OUT_SCALE_MODE, MatmulMatrixScale)
    communication_type: _Attribute[CudaDataType] = _Attribute(_A.COMMUNICATION_TYPE, CudaDataType)
    bias_result_scheme: _Attribute[ResultScheme] = _Attribute(_A.BIAS_RESULT_SCHEME, ResultScheme)

    def __init__(self, compute_type: CublasComputeType | int = CublasComputeType.COMPUTE_32F,
                 **attributes: int) -> None:
        compute = _member(compute_type, "compute_type", CublasComputeType)
        for name in attributes:
            if not isinstance(getattr(type(self), name, None), _Attribute):
                raise TypeError(f"MatmulDescriptor has no attribute {name!r}")
        self._core = _core.cublasmp.MatmulDescriptor(int(compute))
        for name, value in attributes.items():
            setattr(self, name, value)

    @property
    def ptr(self) -> _flat.MatmulDescriptor:
        """The ``cublasMpMatmulDescriptor_t`` for :mod:`mpbind.bindings.cublasmp`."""
        return cast("_flat.MatmulDescriptor", self._core.ptr)

    handle = ptr  # its earlier name


def _check_operands(handle: Any, transa: Any, transb: Any, alpha: Any, beta: Any, **matrices: Any) -> None:
    """The arguments a matmul and a gemm share, checked for their types (their shapes come next)."""
    _args.instance(handle, "handle", Handle, "a cublasmp.Handle")
    for name, value in matrices.items():
        _matrix(value, name)
    _args.boolean(transa, "transa")
    _args.boolean(transb, "transb")
    _number(alpha, "alpha")
    _number(beta, "beta")


def _processes(*matrices: Matrix) -> int:
    """How many processes the grids of a matmul's matrices span (what its capture() rule asks)."""
    return max(m.grid.nprow * m.grid.npcol for m in matrices)


class Matmul(Owned):
    """A planned ``D = alpha op(A) op(B) + beta C``: ``execute()`` is one ``cublasMpMatmul``.

    The plan sizes the workspace once (``cublasMpMatmul_bufferSize``), takes it from the grid's
    shared :class:`Workspace` (or `workspace`), registers it on every grid involved and keeps the
    operands alive. `c` defaults to none (``beta`` must then be 0).

    Without `descriptor` the plan creates its matmul descriptor and owns it (``close()`` destroys
    it). A `descriptor` passed in stays the caller's (who closes it, after the plan) unless
    ``own_descriptor=True`` hands it to the plan; :attr:`owns_descriptor` says which.
    """

    m: int
    n: int
    k: int
    descriptor: MatmulDescriptor
    _processes: int

    def __init__(self, handle: Handle, a: Matrix, b: Matrix, d: Matrix, c: Matrix | None = None, *,
                 transa: bool = False, transb: bool = False, alpha: complex = 1.0, beta: complex = 0.0,
                 compute_type: CublasComputeType | int | None = None, descriptor: MatmulDescriptor | None = None,
                 own_descriptor: bool = False, workspace: Workspace | None = None) -> None:
        _check_operands(handle, transa, transb, alpha, beta, a=a, b=b, d=d)
        if c is not None:
            _matrix(c, "c")
        if descriptor is not None:
            _args.instance(descriptor, "descriptor", MatmulDescriptor, "a cublasmp.MatmulDescriptor or None")
        _args.boolean(own_descriptor, "own_descriptor")
        if workspace is not None:
            _args.instance(workspace, "workspace", Workspace, "a cublasmp.Workspace or None")
        m, n = d.shape
        ka = a.shape[0] if transa else a.shape[1]
        a_rows = a.shape[1] if transa else a.shape[0]
        kb = b.shape[1] if transb else b.shape[0]
        b_cols = b.shape[0] if transb else b.shape[1]
        if a_rows != m or b_cols != n or ka != kb:
            raise UsageError(
                f"op(A) is {a_rows} x {ka} and op(B) {kb} x {b_cols}; D is {m} x {n}")
        if c is not None and c.shape != d.shape:
            raise UsageError(f"C is {c.shape[0]} x {c.shape[1]} but D is {m} x {n}")
        if c is None and complex(beta) != 0:
            raise UsageError("beta != 0 needs c=")
        if a.dtype != b.dtype:
            raise UsageError(f"A is {a.dtype} but B is {b.dtype}")
        if descriptor is None:
            compute = _compute_type(compute_type, a.dtype)
            descriptor = MatmulDescriptor(compute)
            descriptor.transa = CublasOperation.T if transa else CublasOperation.N
            descriptor.transb = CublasOperation.T if transb else CublasOperation.N
            own_descriptor = True
        else:
            compute = int(descriptor._core.compute_type)
        is_complex = a.dtype.startswith("complex")
        self.m, self.n, self.k = m, n, ka
        self.descriptor = descriptor
        self._processes = _processes(a, b, d)
        self._core = _core.cublasmp.MatmulPlan(
            handle, descriptor._core, m, n, ka, scalar_bytes(alpha, compute, is_complex, "alpha"), a.operand(),
            b.operand(), scalar_bytes(beta, compute, is_complex, "beta"), None if c is None else c.operand(),
            d.operand(), workspace, (a, b, c, d, descriptor), own_descriptor)
        # The bound method itself: no Python frame between the caller and the library call.
        self.execute = self._core.execute  # type: ignore[method-assign]

    @classmethod
    def from_core(cls, plan: Any, m: int, n: int, k: int, descriptor: MatmulDescriptor, *, processes: int) -> Matmul:
        """A Matmul over a core matmul plan (``mpbind._core.cublasmp.MatmulPlan``) that another part of
        mpbind built, its operands, scalars and workspace settled there (``mpbind.matmul.plan``):
        `m`, `n`, `k` and `descriptor` as it was made with, `processes` how many processes its grids
        span (what :meth:`capture` refuses on). ``close()`` closes the core plan."""
        if not isinstance(plan, _core.cublasmp.MatmulPlan):
            raise TypeError(f"plan must be an mpbind._core.cublasmp.MatmulPlan, not {type(plan).__name__}")
        _args.instance(descriptor, "descriptor", MatmulDescriptor, "a cublasmp.MatmulDescriptor")
        self = cls._over(plan)
        self.m, self.n, self.k = m, n, k
        self.descriptor = descriptor
        self._processes = _args.integer(processes, "processes", minimum=1)
        self.execute = plan.execute  # type: ignore[method-assign]
        return self

    def execute(self, stream: Stream = None, *, a: Array | None = None, b: Array | None = None,
                c: Array | None = None, d: Array | None = None) -> None:
        """``cublasMpMatmul`` on `stream` (default: the handle's). Replaced per instance in ``__init__``.

        `a`, `b`, `c`, `d`: arrays that stand in for the planned operands in this call (new data for
        the same plan): each must be a column-major device array of its matrix's local shape, dtype and
        leading dimension (checked before the call; `d` writable). A captured plan refuses them."""
        self._core.execute(stream, a=a, b=b, c=c, d=d)

    __call__ = execute

    def capture(self, stream: Stream = None) -> Matmul:
        """Record the call into a CUDA graph on `stream` (default: the handle's; not the legacy
        default stream). ``execute()`` then replays it with one ``cuGraphLaunch``, a few
        microseconds of host time instead of the library's own planning per call. The plan is
        frozen: descriptor attributes changed later are not seen. Returns self.

        Over more than one process it needs ``descriptor.algo_type = MatmulAlgoType.NO_OVERLAP``:
        cuBLASMp 0.10 may otherwise pick an overlapped all-gather+GEMM or GEMM+reduce-scatter, whose
        capture fails (CUBLASMP_STATUS_INTERNAL_ERROR) or whose replays give wrong results. The
        refusal depends only on the plan, so every rank refuses alike."""
        if self._processes > 1 and self.descriptor.algo_type != MatmulAlgoType.NO_OVERLAP:
            raise UsageError("capturing a matmul over several processes needs descriptor.algo_type = "
                             "cublasmp.MatmulAlgoType.NO_OVERLAP (cuBLASMp 0.10's overlapped all-gather+GEMM and "
                             "GEMM+reduce-scatter do not capture or replay correctly)")
        self._core.capture(stream)
        return self

    @property
    def captured(self) -> bool:
        return bool(self._core.captured)

    @property
    def workspace_size(self) -> tuple[int, int]:
        """(device bytes, host bytes) the library asked for."""
        return tuple(self._core.workspace_size)

    @property
    def owns_descriptor(self) -> bool:
        """True when ``close()`` also destroys :attr:`descriptor` (else it stays its creator's)."""
        return bool(self._core.owns_descriptor)


def matmul(handle: Handle, a: Matrix, b: Matrix, d: Matrix, c: Matrix | None = None, *, stream: Stream = None,
           **options: Any) -> None:
    """Plan and run one matmul (see :class:`Matmul`); the grid's workspace is reused across calls."""
    with Matmul(handle, a, b, d, c, **options) as plan:
        plan.execute(stream)


def gemm(handle: Handle, a: Matrix, b: Matrix, c: Matrix, *, transa: bool = False, transb: bool = False,
         alpha: complex = 1.0, beta: complex = 0.0, compute_type: CublasComputeType | int | None = None,
         stream: Stream = None) -> None:
    """``C = alpha op(A) op(B) + beta C`` with ``cublasMpGemm``, in place in `c`; the workspace is the
    grid's shared one, registered on every grid involved."""
    _check_operands(handle, transa, transb, alpha, beta, a=a, b=b, c=c)
    m, n = c.shape
    ka = a.shape[0] if transa else a.shape[1]
    kb = b.shape[1] if transb else b.shape[0]
    if (a.shape[1] if transa else a.shape[0]) != m or (b.shape[0] if transb else b.shape[1]) != n or ka != kb:
        raise UsageError(f"op(A) x op(B) does not give C's {m} x {n}")
    compute = _compute_type(compute_type, a.dtype)
    is_complex = a.dtype.startswith("complex")
    alpha_b = ctypes.create_string_buffer(scalar_bytes(alpha, compute, is_complex, "alpha"), 16)
    beta_b = ctypes.create_string_buffer(scalar_bytes(beta, compute, is_complex, "beta"), 16)
    ta = int(CublasOperation.T if transa else CublasOperation.N)
    tb = int(CublasOperation.T if transb else CublasOperation.N)
    if stream is not None:
        handle.set_stream(stream)
    args: tuple[Any, ...] = (
        handle.ptr, ta, tb, m, n, ka, ctypes.addressof(alpha_b), a.ptr, 1, 1, a.descriptor.ptr, b.ptr, 1, 1,
        b.descriptor.ptr, ctypes.addressof(beta_b), c.ptr, 1, 1, c.descriptor.ptr, compute)
    device_bytes, host_bytes = _flat.gemm_buffer_size(*args)
    work = 0
    if device_bytes:
        ws = _core.cublasmp.shared_workspace(c.grid, device_bytes)
        ws.serve([a.grid, b.grid])
        work = ws.ptr
    host = handle.host_workspace(host_bytes)  # lives with the handle: the library may use it after returning
    full: tuple[Any, ...] = (*args, work, device_bytes, host, host_bytes)
    _flat.gemm(*full)
