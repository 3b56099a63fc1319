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

The operators (``torch.ops.mpbind.*``, see ``_ops``, ``_plan_ops`` and ``_matmul_ops``; the collectives' C++ ones,
``_native``) take a communicator or a plan by its registry name (:func:`name_of`) or launch id, so a
traced program holds a string or an int; the functions here (the collectives': ``_nccl``'s) take
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

from mpbind.collective import AllGatherMatmul
from mpbind.errors import UsageError
from mpbind.fft import FORWARD, INVERSE, FFTPlan, ReshapePlan
from mpbind.matmul import PlannedMatmul
from mpbind.nccl import Communicator
from mpbind.torch import _collective_ops, _matmul_ops, _native, _ops, _plan_ops  # noqa: F401 - registers the operators
from mpbind.torch._nccl import (
    all_gather,
    all_reduce,
    all_reduce_,
    all_to_all,
    broadcast,
    copy_to_group,
    recv,
    reduce_from_group,
    reduce_scatter,
    send,
    send_recv,
)
from mpbind.torch._ops import REDUCTIONS, tensor_arg
from mpbind.torch._registry import communicator_of, forget, lookup, name_of, object_of, plan_name, registered

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


def fft(x: Tensor, plan: Any, direction: int | str | None = None, reverse: Any = None) -> Tensor:
    """This rank's piece of the distributed FFT of `plan` (an :class:`mpbind.fft.FFTPlan`) of this rank's
    piece `x`, as a new tensor; `direction` ``"forward"``/``fft.FORWARD`` or ``"inverse"``/``fft.INVERSE``
    (both unnormalised; default: forward, inverse for a C2R plan). Collective. A C2C plan's gradient
    runs through the plan itself; an R2C or C2R plan's through `reverse`, the plan of the other kind
    from this plan's output distribution back to its input."""
    name, kind = plan_name(plan, FFTPlan)
    if direction is None:
        direction = INVERSE if kind == "c2r" else FORWARD
    if isinstance(direction, str) and direction.lower() in ("forward", "inverse"):
        direction = FORWARD if direction.lower() == "forward" else INVERSE
    if isinstance(direction, bool) or not isinstance(direction, int):
        raise UsageError(f"direction must be 'forward', 'inverse', fft.FORWARD or fft.INVERSE, not {direction!r}")
    back = "" if reverse is None else plan_name(reverse, FFTPlan)[0]
    return torch.ops.mpbind.fft(tensor_arg(x), name, direction, back)


def reshape(x: Tensor, plan: Any, reverse: Any = None) -> Tensor:
    """This rank's piece of the global array `plan` (an :class:`mpbind.fft.ReshapePlan`) moves to its
    output distribution, as a new tensor. Collective. With `reverse` (the plan back, from the output
    distribution to the input) it has a gradient: the reshape back."""
    back = "" if reverse is None else plan_name(reverse, ReshapePlan)[0]
    return torch.ops.mpbind.reshape(tensor_arg(x), plan_name(plan, ReshapePlan)[0], back)


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
            d, amax = _matmul_ops.matmul_scaled_on(object_of(plan, PlannedMatmul, "plan"), a, b, c, sa, sb, sd)
        else:
            d, amax = torch.ops.mpbind.matmul_scaled(tensor_arg(a), tensor_arg(b), c, sa, sb, sd,
                                                     plan_name(plan, PlannedMatmul)[0])
        return (d, amax) if amax.shape[0] else d
    if _ops.direct_call(a) and all(t is None or (type(t) is Tensor and not t.requires_grad) for t in (b, c)):
        for g, what in ((grad_a, "grad_a"), (grad_b, "grad_b")):
            if g is not None:  # checked as the operator's path does, though no gradient is taken here
                object_of(g, PlannedMatmul, what)
        return _matmul_ops.matmul_on(object_of(plan, PlannedMatmul, "plan"), a, b, c)
    name = plan_name(plan, PlannedMatmul)[0]
    back = ["" if g is None else plan_name(g, PlannedMatmul)[0] for g in (grad_a, grad_b)]
    return torch.ops.mpbind.matmul(tensor_arg(a), tensor_arg(b), c, name, *back)


def all_gather_matmul(x: Tensor, w: Tensor, plan: Any) -> Tensor:
    """``all_gather(x) @ w`` by `plan` (an :class:`mpbind.collective.AllGatherMatmul`, or its name): this
    PE's rows `x` ``[m, k]`` and columns `w` ``[k, n]`` give ``[P*m, n]``, on torch's current stream, as
    a new tensor. Collective (every PE of the plan). No gradient; not in CUDA graphs (the plan counts
    its calls on the host)."""
    if _ops.direct_call(x) and type(w) is Tensor and not w.requires_grad:
        return _collective_ops.all_gather_matmul_on(object_of(plan, AllGatherMatmul, "plan"), x, w)
    return torch.ops.mpbind.all_gather_matmul(tensor_arg(x), tensor_arg(w), plan_name(plan, AllGatherMatmul)[0])


def gradient_plans(comm: Any, plan: Any, **options: Any) -> tuple[PlannedMatmul, PlannedMatmul]:
    """The plans of dA and dB for :func:`matmul`'s gradient through `plan` (a plain product of real
    float16, bfloat16, float32 or float64 matrices): each planned by :func:`mpbind.matmul.plan` on the
    distributions the products need (dA's result in A's, dB's in B's), with `options` (``handle``,
    ``algo_type``, ...). Each keeps pieces of its own for planning (torch tensors of its operands'
    shapes). Collective."""
    from mpbind import matmul as _matmul

    c = communicator_of(comm)
    planned = object_of(plan, PlannedMatmul, "plan")
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
