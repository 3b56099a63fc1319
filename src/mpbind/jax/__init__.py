"""mpbind inside ``jax.jit``: NCCL collectives, the distributed FFT and reshape plans of
:mod:`mpbind.fft` and the planned matmuls of :mod:`mpbind.matmul` as XLA FFI custom calls (optional
extra ``jax``).

    import jax
    from mpbind import fft, nccl, jax as mpj

    comm = nccl.Communicator.from_mpi(MPI.COMM_WORLD)      # made collectively, outside jit
    p = fft.plan(MPI.COMM_WORLD, (nx, ny, nz), "complex64")

    @jax.jit
    def smooth(slab):                                      # this rank's input piece
        k = mpj.fft(slab, p)                               # its piece of the spectrum
        return mpj.fft(k * weights, p, direction=mpj.INVERSE) / (nx * ny * nz)

    total = jax.jit(lambda x: mpj.all_reduce(x, comm))(x)

Communicators and plans are made on every rank before the program is traced, and the program
names them by id (their ``launch_id``): each call is a custom call of the XLA FFI handlers the core
was built with (see ``mpbind._core.xla``), run on the stream XLA gives it, with no host
synchronisation. XLA runs every call itself, outside its command buffers (CUDA graphs): a graph's
replay would skip each call's checks (a communicator closed or aborted since, a plan released).

Arrays are this rank's pieces: the collectives work along the first axis (``all_gather`` stacks the
ranks' arrays there, ``reduce_scatter`` and ``all_to_all`` cut it into one block per rank), the FFT
takes the plan's input piece of the direction and returns its output piece (``FFTPlan.pieces``).
The FFT copies its input into the plan's NVSHMEM buffer and its result out of it (one copy each
way; XLA's buffers are not symmetric memory); nothing is allocated per call. The planned matmul
takes and returns its column-major pieces as the row-major JAX arrays of the same memory (an r x c
piece is a (c, r) array; ``matmul_plan``) and runs on them directly, without a copy.

Transformations. ``jax.grad``/``jax.vjp``: all-reduce (sum, avg) is its own transpose, all-gather and
reduce-scatter are each other's, all-to-all is its own; a C2C FFT's transpose is the plan's other
direction conjugated around (the DFT matrix is symmetric; the other direction maps the output
distribution back); an R2C's is the C2R of the conjugated cotangent with its interior bins halved,
a C2R's the conjugated R2C with them doubled, each through the plan of the other kind given as
``reverse``; a reshape's is the reshape back (``reverse``). ``jax.vmap`` runs the batch one call at a
time (each call is collective: every rank must map the same batch).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from typing import Any

try:
    import jax
except ModuleNotFoundError as _exc:  # pragma: no cover - depends on the environment
    if _exc.name != "jax":
        raise
    from mpbind.errors import MissingDependencyError

    raise MissingDependencyError("jax", "jax", "mpbind.jax") from None

import jax.numpy as jnp
import numpy as np

from mpbind import _core
from mpbind.errors import UsageError, WaitTimeoutError
from mpbind.fft import FORWARD, INVERSE, FFTPlan, ReshapePlan
from mpbind.matmul import PlannedMatmul
from mpbind.nccl import Communicator
from mpbind.process_group import CallableProcessGroup, ProcessGroup

__all__ = [
    "FORWARD",
    "INVERSE",
    "REDUCTIONS",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "available",
    "c2c_transpose",
    "c2r_transpose",
    "fft",
    "matmul",
    "matmul_plan",
    "process_group",
    "r2c_transpose",
    "reduce_scatter",
    "reshape",
]

# ncclRedOp_t by name; avg divides the sum by the number of ranks.
REDUCTIONS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
_LINEAR = (REDUCTIONS["sum"], REDUCTIONS["avg"])  # the reductions with a transpose
# What NCCL moves and reduces (complex: as its real and imaginary parts, sum and avg only).
_NCCL_DTYPES = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
                          "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128"})
_PREFIX = "mpbind_"

_lock = threading.Lock()
_registered: bool | None = None  # None: not tried yet


def available() -> bool:
    """Whether this build of mpbind has the XLA FFI handlers (built where jaxlib's headers were found);
    registers them with JAX (platform CUDA) on first use."""
    global _registered
    with _lock:
        if _registered is None:
            xla = getattr(_core, "xla", None)
            if xla is not None:
                for name, handler in xla.handlers().items():
                    jax.ffi.register_ffi_target(_PREFIX + name, handler, platform="CUDA")
            _registered = xla is not None
        return _registered


def _require() -> None:
    if not available():
        raise UsageError("this build of mpbind has no XLA FFI handlers: jaxlib's headers were not found when it was "
                         "built. Install jax, then rebuild mpbind from source (pip install --no-build-isolation "
                         "--force-reinstall --no-deps <mpbind source>)")


def _call(target: str, x: Any, shape: tuple[int, ...], dtype: Any, **attrs: Any) -> Any:
    out = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    return jax.ffi.ffi_call(_PREFIX + target, out, vmap_method="sequential")(x, **attrs)


def _array(x: Any, what: str) -> Any:
    # a JAX array (a tracer inside jit is one) or a NumPy array / scalar, which JAX takes as it is
    if not isinstance(x, (jax.Array, np.ndarray, np.generic)):
        raise TypeError(f"{what}: x must be a JAX array, not {type(x).__name__}")
    return x


# --- collectives --------------------------------------------------------------------------------------


def _comm(comm: Any, what: str) -> tuple[int, int]:
    """(launch id, number of ranks) of a communicator argument."""
    if not isinstance(comm, Communicator):
        raise TypeError(f"{what}: comm must be an mpbind.nccl.Communicator, not {type(comm).__name__}")
    _require()
    return comm.launch_id, comm.size


def _reduction(op: Any, x: Any, what: str) -> int:
    if not isinstance(op, str) or op.lower() not in REDUCTIONS:
        raise UsageError(f"{what}: op must be one of {', '.join(REDUCTIONS)}, not {op!r}")
    code = REDUCTIONS[op.lower()]
    if jnp.issubdtype(x.dtype, jnp.complexfloating) and code not in _LINEAR:
        raise UsageError(f"{what}: a complex array is reduced as its real and imaginary parts: sum or avg, not {op}")
    return code


def _movable(x: Any, what: str) -> None:
    if jnp.dtype(x.dtype).name not in _NCCL_DTYPES:
        raise UsageError(f"{what}: NCCL has no {jnp.dtype(x.dtype).name} type")


def _blocks(x: Any, size: int, what: str) -> None:
    if x.ndim == 0 or x.shape[0] % size:
        raise UsageError(f"{what}: the first axis ({x.shape[0] if x.ndim else 'a scalar has none'}) must split into "
                         f"{size} equal blocks, one per rank")


def _no_transpose(what: str, op: int) -> None:
    name = next(k for k, v in REDUCTIONS.items() if v == op)
    raise UsageError(f"{what} with op={name!r} has no gradient (sum and avg have)")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _all_reduce(x: Any, comm: int, size: int, op: int) -> Any:
    return _call("all_reduce", x, x.shape, x.dtype, comm=np.uint64(comm), op=np.int32(op))


def _all_reduce_fwd(x: Any, comm: int, size: int, op: int) -> tuple[Any, None]:
    return _all_reduce(x, comm, size, op), None


def _all_reduce_bwd(comm: int, size: int, op: int, _: None, ct: Any) -> tuple[Any]:
    if op not in _LINEAR:
        _no_transpose("all_reduce", op)
    return (_all_reduce(ct, comm, size, op),)  # y = sum_s x_s: each x_s gets the sum of the y cotangents


_all_reduce.defvjp(_all_reduce_fwd, _all_reduce_bwd)


def _gathered(x: Any, size: int) -> tuple[int, ...]:
    return (size * x.shape[0], *x.shape[1:]) if x.ndim else (size,)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _all_gather(x: Any, comm: int, size: int) -> Any:
    return _call("all_gather", x, _gathered(x, size), x.dtype, comm=np.uint64(comm))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _reduce_scatter(x: Any, comm: int, size: int, op: int) -> Any:
    return _call("reduce_scatter", x, (x.shape[0] // size, *x.shape[1:]), x.dtype, comm=np.uint64(comm),
                 op=np.int32(op))


def _all_gather_fwd(x: Any, comm: int, size: int) -> tuple[Any, tuple[int, ...]]:
    return _all_gather(x, comm, size), x.shape


def _all_gather_bwd(comm: int, size: int, shape: tuple[int, ...], ct: Any) -> tuple[Any]:
    back = _reduce_scatter(ct, comm, size, REDUCTIONS["sum"])
    return (back.reshape(shape),)  # a scalar's gather is (size,): its block is (1,)


def _reduce_scatter_fwd(x: Any, comm: int, size: int, op: int) -> tuple[Any, None]:
    return _reduce_scatter(x, comm, size, op), None


def _reduce_scatter_bwd(comm: int, size: int, op: int, _: None, ct: Any) -> tuple[Any]:
    if op not in _LINEAR:
        _no_transpose("reduce_scatter", op)
    back = _all_gather(ct, comm, size)
    return (back / size if op == REDUCTIONS["avg"] else back,)


_all_gather.defvjp(_all_gather_fwd, _all_gather_bwd)
_reduce_scatter.defvjp(_reduce_scatter_fwd, _reduce_scatter_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _all_to_all(x: Any, comm: int, size: int) -> Any:
    return _call("all_to_all", x, x.shape, x.dtype, comm=np.uint64(comm))


def _all_to_all_fwd(x: Any, comm: int, size: int) -> tuple[Any, None]:
    return _all_to_all(x, comm, size), None


def _all_to_all_bwd(comm: int, size: int, _: None, ct: Any) -> tuple[Any]:
    return (_all_to_all(ct, comm, size),)  # block j of rank i goes to block i of rank j: its own inverse


_all_to_all.defvjp(_all_to_all_fwd, _all_to_all_bwd)


def all_reduce(x: Any, comm: Communicator, op: str = "sum") -> Any:
    """The reduction of every rank's `x` (same shape and dtype on every rank), on every rank."""
    x = _array(x, "all_reduce")
    cid, size = _comm(comm, "all_reduce")
    _movable(x, "all_reduce")
    return _all_reduce(x, cid, size, _reduction(op, x, "all_reduce"))


def all_gather(x: Any, comm: Communicator) -> Any:
    """Every rank's `x` stacked along the first axis in rank order (a scalar becomes one element)."""
    x = _array(x, "all_gather")
    cid, size = _comm(comm, "all_gather")
    _movable(x, "all_gather")
    return _all_gather(x, cid, size)


def reduce_scatter(x: Any, comm: Communicator, op: str = "sum") -> Any:
    """The reduction of every rank's `x`, cut along the first axis into one block per rank: this rank's."""
    x = _array(x, "reduce_scatter")
    cid, size = _comm(comm, "reduce_scatter")
    _movable(x, "reduce_scatter")
    _blocks(x, size, "reduce_scatter")
    return _reduce_scatter(x, cid, size, _reduction(op, x, "reduce_scatter"))


def all_to_all(x: Any, comm: Communicator) -> Any:
    """Block j (of the first axis cut into one block per rank) of this rank's `x` to rank j, which
    keeps it as its block i (this rank's number)."""
    x = _array(x, "all_to_all")
    cid, size = _comm(comm, "all_to_all")
    _movable(x, "all_to_all")
    _blocks(x, size, "all_to_all")
    return _all_to_all(x, cid, size)


# --- the distributed FFT and reshape --------------------------------------------------------------------


def _piece(x: Any, shape: tuple[int, ...], dtype: str, what: str) -> None:
    if tuple(x.shape) != tuple(shape) or jnp.dtype(x.dtype) != jnp.dtype(dtype):
        raise UsageError(f"{what}: this rank's input must be {dtype} of shape {tuple(shape)}, not "
                         f"{jnp.dtype(x.dtype).name} of shape {tuple(x.shape)}")


# A transform as its custom call needs it: (plan id, direction, out shape, out dtype).
_Call = tuple[int, int, tuple[int, ...], str]


def _transform(x: Any, c: _Call) -> Any:
    plan, direction, shape, dtype = c
    return _call("fft", x, shape, dtype, plan=np.uint64(plan), direction=np.int32(direction))


def _transpose_args(ct: Any, transform: Any, interior: slice | None, what: str) -> Any:
    ct = _array(ct, what)
    if ct.ndim == 0:
        raise UsageError(f"{what}: the cotangent must have at least one axis, not a scalar")
    if not callable(transform):
        raise TypeError(f"{what}: the transform must be callable, not {type(transform).__name__}")
    if interior is not None and not isinstance(interior, slice):
        raise TypeError(f"{what}: interior must be a slice of the halved axis, not {type(interior).__name__}")
    return jnp.asarray(ct)


def c2c_transpose(ct: Any, other_way: Any) -> Any:
    """The transpose of a C2C transform, from the cotangent of its output: the DFT matrix is symmetric,
    and `other_way` (the plan's other direction, from the output distribution back) is its conjugate:
    F^T ct = conj(other_way(conj(ct)))."""
    ct = _transpose_args(ct, other_way, None, "c2c_transpose")
    return jnp.conj(other_way(jnp.conj(ct)))


def r2c_transpose(ct: Any, c2r: Any, interior: slice) -> Any:
    """The transpose of an R2C transform y = crop(F x): Re(F^T pad(ct)), which is the C2R of conj(ct)
    with the interior bins (`interior`, which stand for two of the full spectrum) halved."""
    ct = _transpose_args(ct, c2r, interior, "r2c_transpose")
    weights = jnp.ones(ct.shape[-1], dtype=jnp.real(ct).dtype).at[interior].set(0.5)
    return c2r(jnp.conj(ct) * weights)


def c2r_transpose(ct: Any, r2c: Any, interior: slice) -> Any:
    """The transpose of a C2R transform (JAX's convention for complex cotangents): the R2C of `ct`, its
    interior bins doubled, conjugated."""
    ct = _transpose_args(ct, r2c, interior, "c2r_transpose")
    spectrum = r2c(ct)
    weights = jnp.ones(spectrum.shape[-1], dtype=jnp.real(spectrum).dtype).at[interior].set(2.0)
    return jnp.conj(spectrum * weights)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _fft(x: Any, c: _Call, back: _Call, kind: str, interior: tuple[int, int]) -> Any:
    return _transform(x, c)


def _fft_fwd(x: Any, c: _Call, back: _Call, kind: str, interior: tuple[int, int]) -> tuple[Any, None]:
    return _fft(x, c, back, kind, interior), None


def _fft_bwd(c: _Call, back: _Call, kind: str, interior: tuple[int, int], _: None, ct: Any) -> tuple[Any]:
    def way(t: Any) -> Any:
        return _fft(t, back, c, kind if kind == "c2c" else {"r2c": "c2r", "c2r": "r2c"}[kind], interior)

    if kind == "c2c":
        return (c2c_transpose(ct, way),)
    if back[0] == 0:
        other = {"r2c": "c2r", "c2r": "r2c"}[kind]
        raise UsageError(f"fft: a gradient through an {kind} plan needs its {other} plan back (reverse=)")
    bins = slice(*interior)
    if kind == "r2c":
        return (r2c_transpose(ct, way, bins),)
    return (c2r_transpose(ct, way, bins),)


_fft.defvjp(_fft_fwd, _fft_bwd)


def fft(x: Any, plan: FFTPlan, direction: int | str | None = None, *, reverse: FFTPlan | None = None) -> Any:
    """This rank's piece `x` transformed by `plan` (unnormalised, like :meth:`FFTPlan.execute`):
    `direction` FORWARD (default; C2R plans: INVERSE) from the input distribution to the output one,
    INVERSE back (C2C plans). Collective: every rank's program calls it. `reverse`, for the gradient of
    an R2C (C2R) plan: the C2R (R2C) plan of the same global shape from this plan's output pieces to
    its inputs."""
    x = _array(x, "fft")
    if not isinstance(plan, FFTPlan):
        raise TypeError(f"fft: plan must be an mpbind.fft.FFTPlan, not {type(plan).__name__}")
    _require()
    in_shape, in_dtype, out_shape, out_dtype = plan.pieces(direction)
    _piece(x, in_shape, in_dtype, "fft")
    d = plan.direction(direction)
    c = (plan.launch_id, d, tuple(out_shape), out_dtype)
    interior = (0, 0)
    if plan.kind == "c2c":
        if reverse is not None:
            raise UsageError("fft: a c2c plan's gradient runs through the plan itself: reverse must be None")
        back = (plan.launch_id, INVERSE if d == FORWARD else FORWARD, tuple(in_shape), in_dtype)
    elif reverse is None:
        back = (0, 0, tuple(in_shape), in_dtype)  # no gradient: refused when one is taken
    else:
        back = _reverse(plan, reverse)
        s = plan.hermitian_interior
        interior = (s.start, s.stop)
    return _fft(x, c, back, plan.kind, interior)


def _reverse(plan: FFTPlan, reverse: Any) -> _Call:
    """The call of `reverse`, checked to run `plan`'s transform back on this rank."""
    plan.check_reverse(reverse, "fft: reverse")
    want = {"r2c": "c2r", "c2r": "r2c"}[plan.kind]
    _, _, out_shape, out_dtype = reverse.pieces()
    return (reverse.launch_id, INVERSE if want == "c2r" else FORWARD, tuple(out_shape), out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _reshape(x: Any, c: tuple[int, tuple[int, ...], str], back: tuple[int, tuple[int, ...], str]) -> Any:
    plan, shape, dtype = c
    return _call("reshape", x, shape, dtype, plan=np.uint64(plan))


def _reshape_fwd(x: Any, c: Any, back: Any) -> tuple[Any, None]:
    return _reshape(x, c, back), None


def _reshape_bwd(c: Any, back: Any, _: None, ct: Any) -> tuple[Any]:
    if back[0] == 0:
        raise UsageError("reshape: its gradient needs the plan back (reverse=, from its output distribution to its "
                         "input)")
    return (_reshape(ct, back, c),)  # a permutation of elements: its transpose is the move back


_reshape.defvjp(_reshape_fwd, _reshape_bwd)


def reshape(x: Any, plan: ReshapePlan, *, reverse: ReshapePlan | None = None) -> Any:
    """This rank's piece `x` of `plan`'s input distribution, moved into its piece of the output one.
    Collective. `reverse` (for the gradient): the plan moving the output pieces back."""
    x = _array(x, "reshape")
    if not isinstance(plan, ReshapePlan):
        raise TypeError(f"reshape: plan must be an mpbind.fft.ReshapePlan, not {type(plan).__name__}")
    _require()
    _piece(x, plan.input_shape, plan.dtype, "reshape")
    back: tuple[int, tuple[int, ...], str] = (0, tuple(plan.input_shape), plan.dtype)
    if reverse is not None:
        if not isinstance(reverse, ReshapePlan):
            raise TypeError(f"reshape: reverse must be an mpbind.fft.ReshapePlan, not {type(reverse).__name__}")
        if (reverse.input_shape, reverse.output_shape, reverse.dtype) != (plan.output_shape, plan.input_shape,
                                                                          plan.dtype):
            raise UsageError(f"reshape: reverse must move {plan.dtype} {plan.output_shape} pieces back to "
                             f"{plan.input_shape}, not {reverse.dtype} {reverse.input_shape} to {reverse.output_shape}")
        back = (reverse.launch_id, tuple(plan.input_shape), plan.dtype)
    return _reshape(x, (plan.launch_id, tuple(plan.output_shape), plan.dtype), back)


# --- the planned matmul ----------------------------------------------------------------------------------
#
# cuBLASMp's matrices are column-major; JAX's arrays are row-major. A JAX array of shape (c, r) is the
# column-major r x c matrix of the same memory (its transpose): the pieces here are given that way, and
# the distributions describe the column-major (stored) matrices, as in mpbind.matmul.


def _stand_in(x: Any, name: str, device: int) -> Any:
    """An ArrayInfo of fresh memory on `device` laid out as the column-major piece of the JAX piece `x`
    (an array or ShapeDtypeStruct of shape (c, r)); its contents are never read by a launch."""
    from mpbind._infra.interop import ArrayInfo, dtype_name

    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"matmul_plan: {name} must be a JAX array or jax.ShapeDtypeStruct, not {type(x).__name__}")
    if len(x.shape) != 2:
        raise UsageError(f"matmul_plan: {name} must be 2-D, not of shape {tuple(x.shape)}")
    gpus = [d for d in jax.local_devices() if d.platform == "gpu" and d.local_hardware_id == device]
    if not gpus:
        raise UsageError(f"matmul_plan: JAX has no GPU of this process with CUDA ordinal {device} (the "
                         "communicator's device)")
    cols, rows = (int(n) for n in x.shape)
    memory = jax.device_put(jnp.zeros((cols, rows), x.dtype), gpus[0])
    memory.block_until_ready()
    return ArrayInfo(memory.unsafe_buffer_pointer(), (rows, cols), (1, max(rows, 1)), dtype_name(str(x.dtype)),
                     device, False, memory)


def matmul_plan(comm: Communicator, a: Any, b: Any, d: Any, *, c: Any = None, **options: Any) -> PlannedMatmul:
    """A planned matmul for :func:`matmul`: :func:`mpbind.matmul.plan` from this rank's JAX pieces
    (arrays or ``jax.ShapeDtypeStruct``; only their shapes and dtypes are read). Each piece of shape
    (c, r) stands for the column-major r x c matrix piece (its transpose, the same memory); `options`
    are ``plan``'s (``a_dist``, ``b_dist``, ``d_dist``, ``c_dist``, ``transa``, ``alpha``, ...), its
    distributions those of the column-major matrices. The plan keeps its own pieces of these shapes
    (zeros) for its eager use; ``bias``, ``aux`` and ``scales`` are refused (a launch cannot point the
    descriptor at new ones). Collective: every rank calls it, and a refusal is raised on every rank."""
    from mpbind import matmul as _matmul_mod
    from mpbind.process_group import NCCLProcessGroup, agree, digest

    if not isinstance(comm, Communicator):
        raise TypeError(f"matmul_plan: comm must be an mpbind.nccl.Communicator, not {type(comm).__name__}")
    fixed = sorted(k for k in ("bias", "aux", "scales") if options.get(k) is not None)
    given = {"a": a, "b": b, "c": c, "d": d}
    failure: Exception | None = None
    pieces: dict[str, Any] = {}
    try:
        _require()
        if a is None or b is None or d is None:
            raise TypeError("matmul_plan: a, b and d are required (JAX arrays or jax.ShapeDtypeStructs)")
        if fixed:
            raise UsageError(f"matmul_plan: {', '.join(fixed)} cannot be launched from a compiled program (the "
                             "descriptor holds their pointers)")
        pieces = {name: _stand_in(x, name, comm.device) for name, x in given.items() if x is not None}
    except (UsageError, TypeError, ValueError) as exc:
        failure = exc
    agree(NCCLProcessGroup(comm), "mpbind.jax.matmul_plan", digest(sorted(pieces) if failure is None else None),
          failure, described="the pieces given")
    planned = _matmul_mod.plan(comm, pieces["a"], pieces["b"], pieces["d"], c=pieces.get("c"), **options)
    _ = planned.launch_id  # refusals here, not in the first traced call
    return planned


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _matmul(a: Any, b: Any, c: Any, call: tuple[int, tuple[int, ...], str]) -> Any:
    plan, shape, dtype = call
    out = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    args = (a, b) if c is None else (a, b, c)
    target = "matmul" if c is None else "matmul_c"
    return jax.ffi.ffi_call(_PREFIX + target, out, vmap_method="sequential")(*args, plan=np.uint64(plan))


def _matmul_fwd(a: Any, b: Any, c: Any, call: Any) -> tuple[Any, None]:
    return _matmul(a, b, c, call), None


def _matmul_bwd(call: Any, _: None, ct: Any) -> tuple[Any, Any, Any]:
    raise UsageError("matmul: a planned matmul has no gradient here (plan the transposed products and call them: "
                     "dA = dD B^T, dB = A^T dD)")


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(a: Any, b: Any, plan: PlannedMatmul, c: Any = None) -> Any:
    """This rank's piece of D from its pieces of A and B (and C, where planned with one), by `plan`
    (from :func:`matmul_plan`, or :func:`mpbind.matmul.plan` on packed arrays). Each piece is the
    (c, r) JAX array of an r x c column-major piece (``plan.launch_pieces()``, transposed; a replicated
    operand: the whole array). Collective: every rank's program calls it."""
    if not isinstance(plan, PlannedMatmul):
        raise TypeError(f"matmul: plan must be an mpbind.matmul.PlannedMatmul, not {type(plan).__name__}")
    _require()
    pieces = plan.launch_pieces()
    if (c is None) != ("c" not in pieces):
        raise UsageError("matmul: the plan was made " + ("with c: pass it" if c is None else "without c"))
    for name, x in (("a", a), ("b", b), ("c", c)):
        if x is None:
            continue
        x = _array(x, "matmul")
        (rows, cols), dtype = pieces[name]
        _piece(x, (cols, rows), dtype, f"matmul: {name}")
    (rows, cols), dtype = pieces["d"]
    return _matmul(a, b, c, (plan.launch_id, (cols, rows), dtype))


# --- bootstrap over JAX's distributed client --------------------------------------------------------------

_exchanges = itertools.count()  # every process makes the same exchanges in the same order


def process_group(*, timeout: float | None = None) -> ProcessGroup:
    """This process's group of ``jax.distributed`` (after ``jax.distributed.initialize()``): its
    exchanges go through the coordinator's key-value store, so communicators, plans and unique ids
    (:func:`mpbind.bootstrap.share_unique_id`) need no MPI. Each wait polls, honours Ctrl-C and ends
    after `timeout` seconds (None: ``MPBIND_TIMEOUT``, else 600) with WaitTimeoutError."""
    from jax._src import distributed  # the client of jax.distributed.initialize(): no public accessor

    client = distributed.global_state.client
    if client is None:
        raise UsageError("mpbind.jax.process_group: call jax.distributed.initialize() first")
    deadline = _core.timeout_arg(timeout, "timeout")
    rank, nranks = jax.process_index(), jax.process_count()

    def allgather(data: bytes) -> list[bytes]:
        key = f"mpbind/exchange/{next(_exchanges)}"
        client.key_value_set_bytes(f"{key}/{rank}", bytes(data))
        return [_wait_for(client, f"{key}/{r}", deadline, r) for r in range(nranks)]

    return CallableProcessGroup(rank, nranks, allgather=allgather)


def _wait_for(client: Any, key: str, deadline: float, rank: int) -> bytes:
    """The value of `key` once a rank set it: polled (Ctrl-C reaches Python between polls), bounded."""
    start = time.monotonic()
    pause = 1e-4
    while True:
        try:
            return bytes(client.key_value_try_get_bytes(key))
        except Exception as exc:  # jaxlib's error for a key not set yet (NOT_FOUND) has no class of its own
            if "NOT_FOUND" not in str(exc) and "not found" not in str(exc).lower():
                raise
        if time.monotonic() - start > deadline:
            raise WaitTimeoutError("mpbind.jax.process_group exchange", deadline, f"rank {rank} never set {key}")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


# Plans and communicators may be arguments of a jitted function: static (hashed by identity), no leaves.
for _cls in (Communicator, FFTPlan, ReshapePlan, PlannedMatmul):
    jax.tree_util.register_static(_cls)
