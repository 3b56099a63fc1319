"""mpbind's torch operators over plans (namespace ``mpbind``): the distributed FFT and reshape of
:mod:`mpbind.fft`, registered when :mod:`mpbind.torch` is imported.

A plan travels as its registry name, like a communicator. The fake kernels read the plan for this
rank's input and output shapes and dtypes (a plan is made before the program is traced, on every
rank). The CUDA kernels run the plan's work on its stream, ordered after torch's current stream and
before it again (an event each way, so CUDA graphs capture it), into a new tensor; the input is
copied into the plan's buffer, never transformed in place.

Gradients. A C2C transform is linear with the adjoint ``F^H``: the unnormalised DFT's adjoint is the
unnormalised inverse, so the gradient of FORWARD is INVERSE of the incoming gradient (and the
reverse), through the same plan. A reshape is a permutation of elements: its adjoint is the
reshape back, through the plan given as ``reverse``. An R2C transform's adjoint is the C2R of the
incoming gradient with the Hermitian half's interior bins halved (each stands for two bins of the
full spectrum); a C2R's is the R2C of the gradient with them doubled; each through the plan of the
other kind given as ``reverse``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mpbind.errors import UsageError
from mpbind.fft import FORWARD, INVERSE, FFTPlan, ReshapePlan
from mpbind.torch import _registry
from mpbind.torch._library import define
from mpbind.torch._ops import on_cuda


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)  # the plans' dtypes (float32, complex64, ...) are torch's names too


def _check_input(x: Tensor, shape: tuple[int, ...], dtype: str, what: str) -> None:
    if tuple(x.shape) != tuple(shape) or x.dtype != _dtype(dtype):
        raise UsageError(f"{what}: this rank's input must be {dtype} of shape {tuple(shape)}, not {str(x.dtype)[6:]} "
                         f"of shape {tuple(x.shape)}")


def _on_device(x: Tensor, device: int, what: str) -> None:
    if x.device.index != device:
        raise UsageError(f"{what}: x is on {x.device}; the plan's PE uses cuda:{device}")


def _on_plan_stream(handle: int, run: Callable[[], object], *tensors: Tensor) -> None:
    """`run` queued on the plan's stream `handle`, after the work already on torch's current stream and
    before what comes next there. The tensors it reads or writes are marked in use on that stream."""
    current = torch.cuda.current_stream()
    if handle == current.cuda_stream:
        run()
        return
    other = torch.cuda.ExternalStream(handle)
    other.wait_stream(current)
    for t in tensors:
        t.record_stream(other)
    run()
    current.wait_stream(other)


# --- fft ----------------------------------------------------------------------------------------------


def _sides(p: FFTPlan, direction: int) -> tuple[tuple[int, ...], str, tuple[int, ...], str]:
    """(input shape, input dtype, output shape, output dtype) of this rank for `direction`."""
    allowed = {"c2c": (FORWARD, INVERSE), "r2c": (FORWARD,), "c2r": (INVERSE,)}[p.kind]
    if direction not in allowed:
        names = " or ".join("FORWARD" if d == FORWARD else "INVERSE" for d in allowed)
        raise UsageError(f"a {p.kind} plan transforms {names} ({', '.join(map(str, allowed))}), not {direction}")
    if p.kind == "c2c" and direction == INVERSE:
        return p.output_shape, p.output_dtype, p.input_shape, p.input_dtype
    return p.input_shape, p.input_dtype, p.output_shape, p.output_dtype


def _check_reverse(p: FFTPlan, plan: str, reverse: str) -> None:
    """`reverse` (an R2C plan's C2R, or the reverse) runs this plan's transform back on this rank."""
    if p.kind == "c2c":
        raise UsageError(f"a c2c plan's gradient runs through {plan} itself: reverse must be empty")
    p.check_reverse(_registry.lookup(reverse, FFTPlan), f"reverse ({reverse})")


def _output(p: FFTPlan, x: Tensor, plan: str, direction: int, reverse: str) -> Tensor:
    """The checks and the (empty) output of an FFT through `p` (called `plan`)."""
    in_shape, in_dtype, out_shape, out_dtype = _sides(p, direction)
    _check_input(x, in_shape, in_dtype, "mpbind::fft")
    if reverse:
        _check_reverse(p, plan, reverse)
    return x.new_empty(out_shape, dtype=_dtype(out_dtype))


def _transformed(x: Tensor, plan: str, direction: int, reverse: str) -> Tensor:
    """The fake kernel: the checks and the (empty) output."""
    return _output(_registry.lookup(plan, FFTPlan), x, plan, direction, reverse)


def _fft_kernel(x: Tensor, plan: str, direction: int, reverse: str) -> Tensor:
    p = _registry.lookup(plan, FFTPlan)
    out = _output(p, x, plan, direction, reverse)
    on_cuda(x, "mpbind::fft")
    _on_device(x, p.device, "mpbind::fft")
    src = x.contiguous()
    _on_plan_stream(p.stream, lambda: p.execute(src, direction=direction, out=out), src, out)
    return out


def _fft_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
    plan, direction, reverse = ctx.args
    p = _registry.lookup(plan, FFTPlan)
    if p.kind == "c2c":  # the unnormalised DFT's adjoint is its unnormalised inverse
        back = INVERSE if direction == FORWARD else FORWARD
        return torch.ops.mpbind.fft(grad.contiguous(), plan, back, ""), None, None, None
    if not reverse:
        other = "c2r" if p.kind == "r2c" else "r2c"
        raise UsageError(f"a gradient through {p.kind} plan {plan} needs its {other} plan back (reverse=)")
    # y = R2C(x) = crop(F x): dx = Re(F^H pad(dy)) = C2R(dy with its interior bins halved).
    # y = C2R(z) = Re(F^H pad(D z)), D doubling the interior bins: dz = D R2C(dy).
    mask = torch.ones(p.output_shape if p.kind == "r2c" else p.input_shape, dtype=grad.real.dtype,
                      device=grad.device)
    mask[..., p.hermitian_interior] = 0.5 if p.kind == "r2c" else 2.0
    if p.kind == "r2c":
        return torch.ops.mpbind.fft((grad * mask).contiguous(), reverse, INVERSE, plan), None, None, None
    return torch.ops.mpbind.fft(grad.contiguous(), reverse, FORWARD, plan) * mask, None, None, None


fft = define("fft(Tensor x, str plan, int direction, str reverse) -> Tensor", _fft_kernel, _transformed, _fft_backward)


# --- reshape -------------------------------------------------------------------------------------------


def _moved_by(p: ReshapePlan, x: Tensor, reverse: str) -> Tensor:
    """The checks and the (empty) output of a reshape through `p`."""
    _check_input(x, p.input_shape, p.dtype, "mpbind::reshape")
    if reverse:
        r = _registry.lookup(reverse, ReshapePlan)
        if (r.input_shape, r.output_shape, r.dtype) != (p.output_shape, p.input_shape, p.dtype):
            raise UsageError(f"reverse ({reverse}) must move {p.dtype} {p.output_shape} pieces back to "
                             f"{p.input_shape}, not {r.dtype} {r.input_shape} to {r.output_shape}")
    return x.new_empty(p.output_shape)


def _moved(x: Tensor, plan: str, reverse: str) -> Tensor:
    """The fake kernel: the checks and the (empty) output."""
    return _moved_by(_registry.lookup(plan, ReshapePlan), x, reverse)


def _reshape_kernel(x: Tensor, plan: str, reverse: str) -> Tensor:
    p = _registry.lookup(plan, ReshapePlan)
    out = _moved_by(p, x, reverse)
    on_cuda(x, "mpbind::reshape")
    _on_device(x, p.device, "mpbind::reshape")
    p.execute(x.contiguous(), out=out, stream=torch.cuda.current_stream(x.device))
    return out


def _reshape_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
    plan, reverse = ctx.args
    if not reverse:
        raise UsageError(f"a gradient through {plan} needs the plan back (reverse=, from its output distribution "
                         "to its input)")
    return torch.ops.mpbind.reshape(grad.contiguous(), reverse, plan), None, None


reshape = define("reshape(Tensor x, str plan, str reverse) -> Tensor", _reshape_kernel, _moved, _reshape_backward)
