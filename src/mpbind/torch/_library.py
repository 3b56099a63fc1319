"""How mpbind's functional torch operators are registered: ``torch.library``'s own layer (a schema,
a kernel, a fake kernel and an autograd kernel), not ``torch.library.custom_op``.

Why: every call of an operator goes through the dispatcher, and each Python kernel on the way costs a
call into Python. ``custom_op`` puts two of its own in front of the kernel (its autograd wrapper and
its backend wrapper); measured on one CPU with a kernel that only allocates its output: the kernel
alone 2.7 µs, through ``custom_op`` 26 µs, through ``Library.impl`` with ``register_autograd`` 20 µs,
through ``Library.impl`` alone 8.5 µs. Here the one Python kernel at the autograd key does the work
itself when nothing asks for a gradient (a plain CUDA tensor, no mode or transform to see the call:
``direct``), redispatches below autograd when something else must see it (fake tensors, meta,
functionalization), and records the backward through an ``autograd.Function`` when a gradient is
wanted. ``torch.library.opcheck`` checks each operator's registration like a ``custom_op``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mpbind.errors import UsageError

#: The operators' library fragment (``custom_op`` adds the others to the same namespace).
LIB = torch.library.Library("mpbind", "FRAGMENT")


#: What else would see a call that skips the dispatcher, each true when it would: a torch-function mode,
#: a dispatch mode, a functorch transform, ``torch.jit.trace`` (the C++ kernels' gate asks the same).
#: Each is torch's C function (``torch.jit.is_tracing`` is a Python function around ``_is_tracing``,
#: which answers the same outside TorchScript: ~0.2 µs less per call on one H200).
SEEN_BY = (torch._C._is_torch_function_mode_enabled, torch._C._len_torch_dispatch_stack,
           torch._C._are_functorch_transforms_active, torch._C._is_tracing)
_function_mode, _dispatch_modes, _transforms, _jit_tracing = SEEN_BY


def direct(x: Any) -> bool:
    """Whether a call may run its kernel directly, without the dispatcher's other keys: eager
    (torch.compile traces the operator), a plain CUDA tensor (no subclass: FakeTensor, DTensor,
    FunctionalTensor), and nothing of :data:`SEEN_BY` to see the call. Gradients are the caller's to
    rule out. The kernel is the same either way."""
    return (type(x) is Tensor and x.is_cuda and not (torch.compiler.is_compiling() or _function_mode()
                                                     or _dispatch_modes() or _transforms() or _jit_tracing()))


def save_arguments(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """What every backward needs: the operator's arguments after the tensor (comm, then op or size)."""
    ctx.args = inputs[1:]


def _wants_grad(args: tuple[Any, ...]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)


def define(schema: str, kernel: Callable[..., Any], fake: Callable[..., Any],
           backward: Callable[..., Any] | None = None,
           setup_context: Callable[[Any, tuple[Any, ...], Any], None] = save_arguments) -> Any:
    """Define ``mpbind::<schema>`` (functional: it returns new tensors and mutates nothing) with its
    kernel (for any device: it refuses what it cannot run, naming it), its fake kernel, and, with
    `backward`, its gradient; returns the operator's default overload. Without `backward` a gradient
    through it raises, naming the operator."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    LIB.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"mpbind::{name}", fake, lib=LIB)
    overload = getattr(torch.ops.mpbind, name).default

    def below(*args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args)

    def no_backward(ctx: Any, *grads: Any) -> Any:
        raise UsageError(f"mpbind::{name} has no gradient")

    class Recorded(torch.autograd.Function):
        @staticmethod
        def forward(*args: Any) -> Any:
            return below(*args)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            setup_context(ctx, inputs, output)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            return (backward or no_backward)(ctx, *grads)

    Recorded.__name__ = Recorded.__qualname__ = f"mpbind_{name}"

    def autograd_kernel(*args: Any) -> Any:
        if _wants_grad(args):
            return Recorded.apply(*args)
        if direct(args[0]):
            return kernel(*args)
        return below(*args)

    LIB.impl(name, autograd_kernel, "Autograd")
    return overload
