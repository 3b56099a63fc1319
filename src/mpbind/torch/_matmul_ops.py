"""The planned matmul as a torch operator (``mpbind::matmul``), registered when :mod:`mpbind.torch`
is imported.

A plan (:func:`mpbind.matmul.plan`) computes ``D = alpha op(A) op(B) + beta C`` on column-major
matrices. The operator takes and returns torch's row-major tensors of the same memory: a tensor of
shape ``(c, r)`` is the ``r x c`` column-major piece (its transpose; a ``Linear`` weight, ``out x in``,
is the ``in x out`` matrix), as :meth:`~mpbind.matmul.PlannedMatmul.launch_pieces` gives them,
transposed. The kernel runs the plan's ``cublasMpMatmul`` on those tensors (no copy) on torch's
current stream.

Gradients (real types, a plan without an epilogue), through two more plans given by name, each
planned on the matching distributions (:func:`gradient_plans` makes them):

* ``grad_a`` computes dA: ``alpha G op(B)^T`` (``transa`` N: its operands are G and B, ``transb``
  flipped) or ``alpha op(B) G^T`` (``transa`` T: B and G, ``transa = transb``, ``transb`` T);
* ``grad_b`` computes dB: ``alpha op(A)^T G`` (``transb`` N: A and G, ``transa`` flipped) or
  ``alpha G^T op(A)`` (``transb`` T: G and A, ``transa`` T, ``transb = transa``);
* dC is ``beta G``.

G is the incoming gradient of D. Each is checked against the plan it serves before it runs.

FP8 with scales of each call (``mpbind::matmul_scaled``): an FP8 plan made with ``scales=`` runs
with the scale tensors given to the call (``scale_a``, ``scale_b``, ``scale_d``, as planned) instead
of the planned ones, through :meth:`~mpbind.matmul.PlannedMatmul.execute`'s ``scales=``; where the
plan has ``amax_d``, the operator returns it as a new float32 tensor of one element beside D (else
an empty one), so that it mutates nothing. It has no gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mpbind.errors import UsageError
from mpbind.matmul import PlannedMatmul
from mpbind.torch import _registry
from mpbind.torch._library import define
from mpbind.torch._ops import on_cuda, stream_of

__all__ = ["gradient_operands", "matmul_on", "matmul_scaled_on", "pieces", "scale_tensors"]

_DIFFERENTIABLE = ("float16", "bfloat16", "float32", "float64")


def pieces(p: PlannedMatmul) -> dict[str, tuple[tuple[int, int], str]]:
    """Operand -> (shape, dtype) of the torch tensor this rank gives or gets (the column-major piece's
    transpose)."""
    return {name: ((cols, rows), dtype) for name, ((rows, cols), dtype) in p.launch_pieces().items()}


def _check(p: PlannedMatmul, plan: str, given: dict[str, Tensor | None],
           op: str = "mpbind::matmul") -> tuple[tuple[int, int], str]:
    """The tensors against the plan's pieces; D's (shape, dtype)."""
    want = pieces(p)
    for name, t in given.items():
        if (t is None) != (name not in want):
            raise UsageError(f"{op}: {plan} was planned " + ("with " if t is None else "without ") + name)
        if t is None:
            continue
        shape, dtype = want[name]
        if tuple(t.shape) != shape or t.dtype != getattr(torch, dtype):
            raise UsageError(f"{op}: {name} must be {dtype} of shape {shape} (the transpose of this rank's "
                             f"column-major piece), not {str(t.dtype)[6:]} of shape {tuple(t.shape)}")
    return want["d"]


def _output(a: Tensor, b: Tensor, c: Tensor | None, plan: str, grad_a: str, grad_b: str) -> Tensor:
    """The fake kernel: the checks and the (empty) output."""
    shape, dtype = _check(_registry.lookup(plan, PlannedMatmul), plan, {"a": a, "b": b, "c": c})
    return a.new_empty(shape, dtype=getattr(torch, dtype))


def matmul_on(p: PlannedMatmul, a: Tensor, b: Tensor, c: Tensor | None = None, plan: str = "plan") -> Tensor:
    """The kernel on the plan itself: D from A, B (and C), a new tensor."""
    for t in (a, b, c):
        if t is not None:
            on_cuda(t, "mpbind::matmul")
    shape, dtype = _check(p, plan, {"a": a, "b": b, "c": c})
    out = a.new_empty(shape, dtype=getattr(torch, dtype))
    ops = {"a": a.contiguous().T, "b": b.contiguous().T, "c": None if c is None else c.contiguous().T}
    p.execute(ops["a"], ops["b"], out.T, ops["c"], stream=stream_of(a))
    return out


def _kernel(a: Tensor, b: Tensor, c: Tensor | None, plan: str, grad_a: str, grad_b: str) -> Tensor:
    return matmul_on(_registry.lookup(plan, PlannedMatmul), a, b, c, plan)


def gradient_operands(p: Any, which: str) -> tuple[str, str, bool, bool]:
    """(first operand, second operand, transa, transb) of the plan computing d`which` (``a`` or
    ``b``) of the plan `p` (a :class:`~mpbind.matmul._planner.MatmulPlan`): ``g`` is D's gradient."""
    if which == "a":
        return ("g", "b", False, not p.transb) if not p.transa else ("b", "g", p.transb, True)
    return ("a", "g", not p.transa, False) if not p.transb else ("g", "a", True, p.transa)


def _gradient_plan(p: PlannedMatmul, plan: str, name: str, which: str) -> PlannedMatmul:
    """The plan `name` computing d`which`, checked to fit `p`."""
    if not name:
        raise UsageError(f"a gradient through {plan} with respect to {which} needs its plan (grad_{which}=; "
                         "mpbind.torch.gradient_plans makes both)")
    g = _registry.lookup(name, PlannedMatmul)
    first, second, transa, transb = gradient_operands(p.plan, which)
    mine, theirs = pieces(p), pieces(g)
    want = {"a": mine["d" if first == "g" else first], "b": mine["d" if second == "g" else second], "d": mine[which]}
    got = {k: theirs[k] for k in ("a", "b", "d") if k in theirs}
    if (g.plan.transa, g.plan.transb) != (transa, transb) or got != want or "c" in theirs or \
            g.plan.alpha != p.plan.alpha or g.plan.epilogue != "none":
        raise UsageError(f"grad_{which} ({name}) must compute d{which} of {plan}: {first.upper()} x {second.upper()} "
                         f"with transa={transa}, transb={transb}, alpha={p.plan.alpha}, pieces {want}; it has "
                         f"transa={g.plan.transa}, transb={g.plan.transb}, alpha={g.plan.alpha}, pieces {got}")
    return g


def _save(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    a, b, c, plan, grad_a, grad_b = inputs
    ctx.save_for_backward(a, b)
    ctx.args = (plan, grad_a, grad_b, c is not None)


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
    a, b = ctx.saved_tensors
    plan, grad_a, grad_b, has_c = ctx.args
    p = _registry.lookup(plan, PlannedMatmul)
    if p.plan.epilogue != "none" or p.plan.d.dtype not in _DIFFERENTIABLE:
        raise UsageError(f"a gradient through {plan} is defined here for a plain product of "
                         f"{', '.join(_DIFFERENTIABLE)} matrices, not a {p.plan.d.dtype} one with epilogue "
                         f"{p.plan.epilogue!r}")
    operands = {"a": a, "b": b, "g": grad.contiguous()}
    out: dict[str, Tensor | None] = {"a": None, "b": None}
    for which, name in (("a", grad_a), ("b", grad_b)):
        if ctx.needs_input_grad["ab".index(which)]:
            first, second, _, _ = gradient_operands(p.plan, which)
            _gradient_plan(p, plan, name, which)
            out[which] = torch.ops.mpbind.matmul(operands[first], operands[second], None, name, "", "")
    dc = grad * p.plan.beta.real if has_c and ctx.needs_input_grad[2] else None
    return out["a"], out["b"], dc, None, None, None


matmul = define("matmul(Tensor a, Tensor b, Tensor? c, str plan, str grad_a, str grad_b) -> Tensor", _kernel, _output,
                _backward, _save)


# --- FP8 with the scales of each call ------------------------------------------------------------------

_SCALED = "mpbind::matmul_scaled"
#: The scales the operator takes, in its schema's order (``amax_d``, where planned, is its output).
_SCALE_INPUTS = ("a", "b", "d")


def scale_tensors(scales: Any) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The scale tensors (a, b, d) of :func:`mpbind.torch.matmul`'s `scales` (a dict of name ->
    tensor), checked for their names."""
    if not isinstance(scales, dict):
        raise TypeError(f"scales must be a dict of name -> tensor, not {type(scales).__name__}")
    if "amax_d" in scales:
        raise UsageError("amax_d is not given: the operator returns it (a new tensor beside D)")
    unknown = [name for name in scales if name not in _SCALE_INPUTS]
    if unknown:
        raise UsageError(f"scales are named 'a', 'b' and 'd'; got {', '.join(map(repr, unknown))}")
    return scales.get("a"), scales.get("b"), scales.get("d")


def _check_scales(p: PlannedMatmul, plan: str, given: dict[str, Tensor | None]) -> bool:
    """The scale tensors against the plan's (named as planned, their dtypes and element counts);
    whether the plan has ``amax_d``."""
    want = p.scale_pieces()
    if not want:
        raise UsageError(f"{_SCALED}: {plan} was planned without scales (an FP8 plan made with scales= takes them); "
                         "use mpbind::matmul")
    if p.captured:
        raise UsageError(f"{_SCALED}: {plan} is captured and replays the scales it recorded; scales of a call need a "
                         "plan that is not captured")
    for name, t in given.items():
        if (t is None) != (name not in want):
            raise UsageError(f"{_SCALED}: {plan} was planned with scales {', '.join(want)}: scale_{name} must be "
                             + ("given" if t is None else "None"))
        if t is None:
            continue
        count, dtypes = want[name]
        dtype = str(t.dtype)[6:]
        if t.numel() != count or dtype not in dtypes:
            raise UsageError(f"{_SCALED}: scale_{name} must hold {count} {' or '.join(dtypes)}, not {t.numel()} "
                             f"{dtype}")
    return "amax_d" in want


def _scaled_outputs(p: PlannedMatmul, a: Tensor, b: Tensor, c: Tensor | None, scale_a: Tensor | None,
                    scale_b: Tensor | None, scale_d: Tensor | None, plan: str) -> tuple[Tensor, Tensor]:
    """The checks and the outputs: D (empty) and amax_d (zero; no element where the plan has none)."""
    shape, dtype = _check(p, plan, {"a": a, "b": b, "c": c}, _SCALED)
    amax = _check_scales(p, plan, {"a": scale_a, "b": scale_b, "d": scale_d})
    return a.new_empty(shape, dtype=getattr(torch, dtype)), a.new_zeros((1 if amax else 0,), dtype=torch.float32)


def _scaled_fake(a: Tensor, b: Tensor, c: Tensor | None, scale_a: Tensor | None, scale_b: Tensor | None,
                 scale_d: Tensor | None, plan: str) -> tuple[Tensor, Tensor]:
    return _scaled_outputs(_registry.lookup(plan, PlannedMatmul), a, b, c, scale_a, scale_b, scale_d, plan)


def matmul_scaled_on(p: PlannedMatmul, a: Tensor, b: Tensor, c: Tensor | None, scale_a: Tensor | None,
                     scale_b: Tensor | None, scale_d: Tensor | None, plan: str = "plan") -> tuple[Tensor, Tensor]:
    """The kernel on the plan itself: (D, amax_d) from A, B (and C) with these scales, new tensors."""
    for t in (a, b, c, scale_a, scale_b, scale_d):
        if t is not None:
            on_cuda(t, _SCALED)
    out, amax = _scaled_outputs(p, a, b, c, scale_a, scale_b, scale_d, plan)
    # amax_d starts at zero: the absolute maximum cuBLASLt writes there is then right whether it sets
    # the value or folds it in.
    scales = {name: t.contiguous() for name, t in (("a", scale_a), ("b", scale_b), ("d", scale_d)) if t is not None}
    if amax.numel():
        scales["amax_d"] = amax
    p.execute(a.contiguous().T, b.contiguous().T, out.T, None if c is None else c.contiguous().T, stream=stream_of(a),
              scales=scales)
    return out, amax


def _scaled_kernel(a: Tensor, b: Tensor, c: Tensor | None, scale_a: Tensor | None, scale_b: Tensor | None,
                   scale_d: Tensor | None, plan: str) -> tuple[Tensor, Tensor]:
    return matmul_scaled_on(_registry.lookup(plan, PlannedMatmul), a, b, c, scale_a, scale_b, scale_d, plan)


matmul_scaled = define("matmul_scaled(Tensor a, Tensor b, Tensor? c, Tensor? scale_a, Tensor? scale_b, "
                       "Tensor? scale_d, str plan) -> (Tensor d, Tensor amax_d)", _scaled_kernel, _scaled_fake)
