"""mpbind inside PyTorch programs: NCCL collectives and the distributed FFT and reshape plans as torch
operators that ``torch.compile`` traces without a graph break, CUDA graphs capture, and autograd
differentiates (optional extra ``torch``).

    from mpbind import fft, nccl, torch as mpt

    comm = nccl.Communicator.from_torch()        # or any mpbind Communicator
    y = mpt.all_reduce(x, comm)                   # torch.ops.mpbind.all_reduce(x, "Communicator#3", "sum")
    z = mpt.reduce_scatter(y, comm)               # its gradient is an all-gather, and the reverse
    h = mpt.copy_to_group(x, comm)                # identity forward, all-reduce backward (tensor parallelism)
    r = mpt.send_recv(x, comm, send_to=(rank + 1) % n, recv_from=(rank - 1) % n)   # a ring step
    p = fft.plan(mpi_comm, (nx, ny, nz), "complex64")
    k = mpt.fft(slab, p)                          # its gradient is the inverse transform of the gradient
    h = mpt.matmul(w, x, up, grad_a=dw_plan, grad_b=dx_plan)   # a planned matmul (mpbind.matmul.plan)

The operators (``torch.ops.mpbind.*``, see ``_ops``, ``_plan_ops`` and ``_matmul_ops``) take a communicator or a plan
by its registry name (:func:`name_of`), so a traced program holds a string; the functions here take
the object (or its name) and pass the name and the group size, which the compiler takes as constants
(an object is guarded by identity: another one recompiles). Each returns a new tensor on torch's
current stream (``all_reduce_`` works in place) and never synchronises the host.
Gradients: all-reduce (sum, avg) is its own adjoint, all-gather and reduce-scatter are each other's,
all-to-all is its own, send_recv's is the exchange back; complex tensors are reduced as their real
view (sum and avg). A C2C FFT's gradient is the unnormalised transform the other way; an R2C's or
C2R's, the plan of the other kind (give ``reverse``); a reshape's, the reshape back (``reverse``); a
planned matmul's, the plans of dA and dB (:func:`gradient_plans`).
``send`` has no output, so compiled graphs refuse it.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
except ModuleNotFoundError as _exc:  # pragma: no cover - depends on the environment
    if _exc.name != "torch":
        raise
    from mpbind.errors import MissingDependencyError

    raise MissingDependencyError("torch", "torch", "mpbind.torch") from None

from torch import Tensor

from mpbind._infra import args as _args
from mpbind.collective import AllGatherMatmul
from mpbind.errors import UsageError
from mpbind.fft import FORWARD, INVERSE, FFTPlan, ReshapePlan
from mpbind.matmul import PlannedMatmul
from mpbind.nccl import Communicator
from mpbind.torch import _collective_ops, _matmul_ops, _native, _ops, _plan_ops  # noqa: F401 - registers the operators
from mpbind.torch._ops import REDUCTIONS
from mpbind.torch._registry import forget, lookup, name_of, registered

#: Whether the collectives run as C++ operators here (``torch.ops.mpbind.nccl_all_reduce``, ...: where
#: torch has CUDA and its stable C shim has what they need); :data:`CPP_OPERATORS_REASON` says why not.
CPP_OPERATORS: bool = _native.AVAILABLE
CPP_OPERATORS_REASON: str = _native.REASON

__all__ = [
    "CPP_OPERATORS",
    "CPP_OPERATORS_REASON",
    "REDUCTIONS",
    "all_gather",
    "all_gather_matmul",
    "all_reduce",
    "all_reduce_",
    "all_to_all",
    "broadcast",
    "FORWARD",
    "INVERSE",
    "copy_to_group",
    "fft",
    "forget",
    "gradient_plans",
    "matmul",
    "lookup",
    "name_of",
    "reduce_from_group",
    "recv",
    "reduce_scatter",
    "registered",
    "reshape",
    "send",
    "send_recv",
]


def _constants(*classes: type) -> None:
    """Let ``torch.compile`` take these mpbind objects as constants, guarded by identity, so that a
    compiled function may be given the communicator itself; without this, reading its name from the
    core is a graph break. Registered with torch's pytree constants (a class without leaves)."""
    from torch.utils import _pytree

    register, known = getattr(_pytree, "register_constant", None), getattr(_pytree, "is_constant_class", None)
    if register is None or known is None:  # an older PyTorch: the objects' names still work
        return
    for cls in classes:
        if not known(cls):
            register(cls)


_constants(Communicator, FFTPlan, ReshapePlan, PlannedMatmul, AllGatherMatmul)


def _tensor(x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, not {type(x).__name__}")
    return x


def _object(obj: Any, kind: type, what: str) -> Any:
    """`obj` itself, or the registered object it names, which must be a `kind`."""
    found = lookup(obj, kind) if isinstance(obj, str) else obj
    if not isinstance(found, kind):
        raise TypeError(f"{what} must be an {kind.__module__}.{kind.__name__} or its registered name, not "
                        f"{type(obj).__name__}")
    return found


def _communicator(comm: Any) -> Communicator:
    """The Communicator `comm` is, or names (the layer refuses a closed one)."""
    return _object(comm, Communicator, "comm")


def _resolve(comm: Any) -> tuple[str, int]:
    """(registry name, size) of a Communicator or of a registered name."""
    c = _object(comm, Communicator, "comm")
    return name_of(c), c.size


@torch.compiler.assume_constant_result
def _launched(comm: Any) -> tuple[int, int]:
    """(launch id, size) of a Communicator or of a registered name, for the C++ operators: constants
    to the compiler, like :func:`_resolved`."""
    c = _object(comm, Communicator, "comm")
    return c.launch_id, c.size


def _native_call(x: Any) -> bool:
    """Whether the call goes to the C++ operators (:mod:`._native`): where they run, on a CUDA tensor
    (a fake one while tracing). They are called as they are (eagerly, traced, under any mode: the
    dispatcher's path is C++ throughout), through their autograd function where a gradient is wanted."""
    return _native.AVAILABLE and isinstance(x, Tensor) and x.is_cuda


#: The eager calls that run the C++ kernels without the dispatcher (``_native.GATE``), or None; asked
#: only outside Dynamo (which takes the check as a constant, and traces the operators).
_gate = _native.GATE
_compiling = torch.compiler.is_dynamo_compiling
_ALL_REDUCE, _ALL_GATHER, _REDUCE_SCATTER, _ALL_TO_ALL = (_native.K_ALL_REDUCE, _native.K_ALL_GATHER,
                                                          _native.K_REDUCE_SCATTER, _native.K_ALL_TO_ALL)


#: :func:`_resolve` as the compiler sees it: constants.
_resolved = torch.compiler.assume_constant_result(_resolve)


@torch.compiler.assume_constant_result
def _plan_name(plan: Any, kind: type) -> tuple[str, str]:
    """(registry name, kind of transform or "") of a plan of class `kind`, or of its name: constants to
    the compiler."""
    p = _object(plan, kind, "plan")
    return name_of(p), getattr(p, "kind", "")


def all_reduce(x: Tensor, comm: Any, op: str = "sum") -> Tensor:
    """The reduction (`op`: sum, prod, max, min, avg) of `x` over the ranks, as a new tensor."""
    if _gate is not None and not _compiling() and (y := _gate(_ALL_REDUCE, x, comm, op)) is not None:
        return y
    if _native_call(x):
        _ops.check_op(op, x)
        launch = _launched(comm)[0]
        if _native.wants_grad(x):
            return _native.AllReduce.apply(x, launch, op)
        return _native.reduced(x, launch, op)
    if _ops.direct_call(x):
        return _ops.all_reduce_on(x, _communicator(comm), op)
    return torch.ops.mpbind.all_reduce(_tensor(x), _resolved(comm)[0], op)


def all_reduce_(x: Tensor, comm: Any, op: str = "sum") -> Tensor:
    """:func:`all_reduce` into `x` itself (contiguous); returns `x`."""
    if _gate is not None and not _compiling() and _gate(_ALL_REDUCE, x, comm, op, True) is not None:
        return x
    if _native_call(x) and not _native.wants_grad(x):  # the C++ operator (compiled code calls no Python)
        _ops.check_op(op, x)
        _ops.check_in_place(x, "mpbind.torch.all_reduce_")
        _native.ALL_REDUCE_IN_PLACE(x, _launched(comm)[0], _native.REDUCTION_CODES[op])
        return x
    if _ops.direct_call(x):
        _ops.all_reduce_in_place_on(x, _communicator(comm), op)
        return x
    torch.ops.mpbind.all_reduce_(_tensor(x), _resolved(comm)[0], op)
    return x


def all_gather(x: Tensor, comm: Any) -> Tensor:
    """Every rank's `x` stacked along dim 0, rank order (``size * x.shape[0]`` rows)."""
    if _gate is not None and not _compiling() and (y := _gate(_ALL_GATHER, x, comm)) is not None:
        return y
    if _native_call(x):
        launch, size = _launched(comm)
        if _native.wants_grad(x):
            return _native.AllGather.apply(x, launch, size)
        return _native.ALL_GATHER(x.contiguous(), launch, size)
    if _ops.direct_call(x):
        c = _communicator(comm)
        return _ops.all_gather_on(x, c, c.size)
    name, size = _resolved(comm)
    return torch.ops.mpbind.all_gather(_tensor(x), name, size)


def reduce_scatter(x: Tensor, comm: Any, op: str = "sum") -> Tensor:
    """Block ``rank`` (of ``size`` equal blocks along dim 0) of the reduction of `x` over the ranks."""
    if _gate is not None and not _compiling() and (y := _gate(_REDUCE_SCATTER, x, comm, op)) is not None:
        return y
    if _native_call(x):
        launch, size = _launched(comm)
        _ops.check_op(op, x)
        _ops.check_blocks(x, size, "mpbind.torch.reduce_scatter")
        if _native.wants_grad(x):
            return _native.ReduceScatter.apply(x, launch, op, size)
        return _native.REDUCE_SCATTER(x.contiguous(), launch, _native.REDUCTION_CODES[op], size)
    if _ops.direct_call(x):
        c = _communicator(comm)
        return _ops.reduce_scatter_on(x, c, op, c.size)
    name, size = _resolved(comm)
    return torch.ops.mpbind.reduce_scatter(_tensor(x), name, op, size)


def all_to_all(x: Tensor, comm: Any) -> Tensor:
    """Block j (of ``size`` equal blocks along dim 0) goes to rank j; block r of the result came from rank r."""
    if _gate is not None and not _compiling() and (y := _gate(_ALL_TO_ALL, x, comm)) is not None:
        return y
    if _native_call(x):
        launch, size = _launched(comm)
        _ops.check_blocks(x, size, "mpbind.torch.all_to_all")
        if _native.wants_grad(x):
            return _native.AllToAll.apply(x, launch)
        return _native.ALL_TO_ALL(x.contiguous(), launch)
    if _ops.direct_call(x):
        c = _communicator(comm)
        return _ops.all_to_all_on(x, c, c.size)
    name, size = _resolved(comm)
    return torch.ops.mpbind.all_to_all(_tensor(x), name, size)


def broadcast(x: Tensor, comm: Any, root: int) -> Tensor:
    """Rank `root`'s `x` on every rank, as a new tensor (no gradient)."""
    if _ops.direct_call(x):
        return _ops.broadcast_on(x, _communicator(comm), root)
    return torch.ops.mpbind.broadcast(_tensor(x), _resolved(comm)[0], root)


def send_recv(x: Tensor, comm: Any, send_to: int, recv_from: int) -> Tensor:
    """Send `x` to rank `send_to` and receive a tensor of the same shape and dtype from `recv_from`, in
    one NCCL group (a ring or a pipeline's exchange); its gradient goes back the way the data came."""
    if _ops.direct_call(x):
        return _ops.send_recv_on(x, _communicator(comm), send_to, recv_from)
    return torch.ops.mpbind.send_recv(_tensor(x), _resolved(comm)[0], send_to, recv_from)


def send(x: Tensor, comm: Any, peer: int) -> None:
    """Send `x` to rank `peer` (which calls :func:`recv`). Not inside a compiled function, which would
    drop an operator without an output: use :func:`send_recv` there."""
    if _ops.direct_call(x):
        return _ops.send_on(x, _communicator(comm), peer)
    torch.ops.mpbind.send(_tensor(x), _resolved(comm)[0], peer)


def recv(shape: Any, dtype: torch.dtype, comm: Any, peer: int, device: Any = None) -> Tensor:
    """A new tensor of `shape` and `dtype` received from rank `peer` (on `device`, default the current
    CUDA device)."""
    dims = [_args.integer(n, "shape's extents", minimum=0) for n in _args.sequence(shape, "shape", _args.MAX_NDIM)]
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, not {type(dtype).__name__}")
    _args.product([*dims, dtype.itemsize], "recv's size in bytes")  # refused before a tensor is made
    name = _resolved(comm)[0]
    if device is None and not torch.cuda.is_available():
        raise UsageError("recv receives into a CUDA tensor, and torch sees no CUDA device")
    try:
        where = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:  # a device this torch cannot name or reach
        raise UsageError(f"device {device!r}: {exc}") from None
    return torch.ops.mpbind.recv(dims, dtype, where, name, _args.integer(peer, "peer", minimum=0))


def fft(x: Tensor, plan: Any, direction: int | str | None = None, reverse: Any = None) -> Tensor:
    """This rank's piece of the distributed FFT of `plan` (an :class:`mpbind.fft.FFTPlan`) of this rank's
    piece `x`, as a new tensor; `direction` ``"forward"``/``fft.FORWARD`` or ``"inverse"``/``fft.INVERSE``
    (both unnormalised; default: forward, inverse for a C2R plan). Collective. A C2C plan's gradient
    runs through the plan itself; an R2C or C2R plan's through `reverse`, the plan of the other kind
    from this plan's output distribution back to its input."""
    name, kind = _plan_name(plan, FFTPlan)
    if direction is None:
        direction = INVERSE if kind == "c2r" else FORWARD
    if isinstance(direction, str) and direction.lower() in ("forward", "inverse"):
        direction = FORWARD if direction.lower() == "forward" else INVERSE
    if isinstance(direction, bool) or not isinstance(direction, int):
        raise UsageError(f"direction must be 'forward', 'inverse', fft.FORWARD or fft.INVERSE, not {direction!r}")
    back = "" if reverse is None else _plan_name(reverse, FFTPlan)[0]
    return torch.ops.mpbind.fft(_tensor(x), name, direction, back)


def reshape(x: Tensor, plan: Any, reverse: Any = None) -> Tensor:
    """This rank's piece of the global array `plan` (an :class:`mpbind.fft.ReshapePlan`) moves to its
    output distribution, as a new tensor. Collective. With `reverse` (the plan back, from the output
    distribution to the input) it has a gradient: the reshape back."""
    back = "" if reverse is None else _plan_name(reverse, ReshapePlan)[0]
    return torch.ops.mpbind.reshape(_tensor(x), _plan_name(plan, ReshapePlan)[0], back)


def matmul(a: Tensor, b: Tensor, plan: Any, c: Tensor | None = None, *, grad_a: Any = None,
           grad_b: Any = None, scales: dict[str, Tensor] | None = None) -> Any:
    """This rank's piece of D from its pieces of A and B (and C, where planned with one) by `plan` (an
    :class:`mpbind.matmul.PlannedMatmul`, or its name), as a new tensor. Each tensor is the row-major
    ``(c, r)`` tensor of an ``r x c`` column-major piece (its transpose: ``plan.launch_pieces()``,
    transposed). Collective. Its gradient runs through `grad_a` and `grad_b`, the plans of dA and dB
    (:func:`gradient_plans`).

    `scales` (an FP8 plan made with ``scales=``): a dict ``{"a": ..., "b": ..., "d": ...}`` of the
    scale tensors this call uses instead of the planned ones, named as planned (``amax_d`` aside:
    float32 scalars, or block scales). It then returns ``(d, amax_d)`` where the plan has ``amax_d``
    (a new float32 tensor of one element: the absolute maximum of D before D's scale), else ``d``
    alone (``mpbind::matmul_scaled``; no gradient, so no `grad_a` or `grad_b`)."""
    if scales is not None:
        if grad_a is not None or grad_b is not None:
            raise UsageError("an FP8 product with scales has no gradient here: grad_a and grad_b do not apply")
        sa, sb, sd = _matmul_ops.scale_tensors(scales)
        if _ops.direct_call(a) and all(t is None or (type(t) is Tensor and not t.requires_grad)
                                       for t in (b, c, sa, sb, sd)):
            d, amax = _matmul_ops.matmul_scaled_on(_object(plan, PlannedMatmul, "plan"), a, b, c, sa, sb, sd)
        else:
            d, amax = torch.ops.mpbind.matmul_scaled(_tensor(a), _tensor(b), c, sa, sb, sd,
                                                     _plan_name(plan, PlannedMatmul)[0])
        return (d, amax) if amax.shape[0] else d
    if _ops.direct_call(a) and all(t is None or (type(t) is Tensor and not t.requires_grad) for t in (b, c)):
        for g, what in ((grad_a, "grad_a"), (grad_b, "grad_b")):
            if g is not None:  # checked as the operator's path does, though no gradient is taken here
                _object(g, PlannedMatmul, what)
        return _matmul_ops.matmul_on(_object(plan, PlannedMatmul, "plan"), a, b, c)
    name = _plan_name(plan, PlannedMatmul)[0]
    back = ["" if g is None else _plan_name(g, PlannedMatmul)[0] for g in (grad_a, grad_b)]
    return torch.ops.mpbind.matmul(_tensor(a), _tensor(b), c, name, *back)


def all_gather_matmul(x: Tensor, w: Tensor, plan: Any) -> Tensor:
    """``all_gather(x) @ w`` by `plan` (an :class:`mpbind.collective.AllGatherMatmul`, or its name): this
    PE's rows `x` ``[m, k]`` and columns `w` ``[k, n]`` give ``[P*m, n]``, on torch's current stream, as
    a new tensor. Collective (every PE of the plan). No gradient; not in CUDA graphs (the plan counts
    its calls on the host)."""
    if _ops.direct_call(x) and type(w) is Tensor and not w.requires_grad:
        return _collective_ops.all_gather_matmul_on(_object(plan, AllGatherMatmul, "plan"), x, w)
    return torch.ops.mpbind.all_gather_matmul(_tensor(x), _tensor(w), _plan_name(plan, AllGatherMatmul)[0])


def gradient_plans(comm: Any, plan: Any, **options: Any) -> tuple[PlannedMatmul, PlannedMatmul]:
    """The plans of dA and dB for :func:`matmul`'s gradient through `plan` (a plain product of real
    float16, bfloat16, float32 or float64 matrices): each planned by :func:`mpbind.matmul.plan` on the
    distributions the products need (dA's result in A's, dB's in B's), with `options` (``handle``,
    ``algo_type``, ...). Each keeps pieces of its own for planning (torch tensors of its operands'
    shapes). Collective."""
    from mpbind import matmul as _matmul

    c = _communicator(comm)
    planned = _object(plan, PlannedMatmul, "plan")
    p = planned.plan
    dtypes = {o.dtype for o in p.operands}
    if p.epilogue != "none" or len(dtypes) != 1 or not dtypes <= {"float16", "bfloat16", "float32", "float64"}:
        raise UsageError(f"gradient plans are made for a plain product of one real floating type, not {sorted(dtypes)} "
                         f"with epilogue {p.epilogue!r}")
    dists = {"a": p.a.distribution, "b": p.b.distribution, "g": p.d.distribution}
    shapes = _matmul_ops.pieces(planned)
    shapes["g"] = shapes["d"]
    dtype = getattr(torch, dtypes.pop())
    device = torch.device("cuda", c.device)
    made = []
    for which in ("a", "b"):
        first, second, transa, transb = _matmul_ops.gradient_operands(p, which)
        x, y, out = (torch.empty(shapes[k][0], dtype=dtype, device=device) for k in (first, second, which))
        made.append(_matmul.plan(c, x.T, y.T, out.T, a_dist=dists[first], b_dist=dists[second], d_dist=dists[which],
                                 transa=transa, transb=transb, alpha=p.alpha, **options))
    return made[0], made[1]


def copy_to_group(x: Tensor, comm: Any) -> Tensor:
    """`x` itself forward, its gradient summed over the ranks backward: where a tensor-parallel block
    begins (Megatron's ``f``)."""
    return _native.CopyToGroup.apply(_tensor(x), _launched(comm)[0] if _native_call(x) else _resolved(comm)[0])


def reduce_from_group(x: Tensor, comm: Any) -> Tensor:
    """`x` summed over the ranks forward, the gradient passed through backward: where a tensor-parallel
    block ends (Megatron's ``g``)."""
    if _native_call(x):
        launch = _launched(comm)[0]
        if _native.wants_grad(x):
            return _native.ReduceFromGroup.apply(x, launch)
        return _native.ALL_REDUCE(x.contiguous(), launch, 0)
    if _ops.direct_call(x):
        return _ops.all_reduce_on(x, _communicator(comm), "sum")
    return _native.ReduceFromGroup.apply(_tensor(x), _resolved(comm)[0])
