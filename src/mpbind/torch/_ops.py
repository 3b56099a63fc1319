"""mpbind's torch operators over a communicator (namespace ``mpbind``), registered when
:mod:`mpbind.torch` is imported.

Each has a schema of tensors, ints and strings (a communicator travels as its registry name, the
group size as an int, so that a traced program needs neither), a kernel that calls the layer on
torch's current stream and never synchronises the host (so CUDA graphs capture it), a fake kernel
with the exact output shape and dtype (FakeTensor, meta tensors, ``torch.compile``), and autograd
where the math defines one. The functional ones are registered through :mod:`._library` (one Python
kernel on the dispatcher's path: the reason is there); those without a gradient, a mutation or a
tensor input (``all_reduce_``, ``broadcast``, ``send``, ``recv``) are ``torch.library.custom_op``.
Eager calls that need nothing from the dispatcher (:func:`direct_call`) run the same kernel
directly. Where torch has CUDA, :mod:`mpbind.torch`'s functions run the collectives as the C++
operators of :mod:`._native` instead; these serve elsewhere, and whoever calls them by name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mpbind import nccl
from mpbind._infra.args import MAX_RANKS
from mpbind.errors import UsageError
from mpbind.torch import _registry
from mpbind.torch._library import define, direct, save_arguments

#: The reductions the operators take; sum and avg also over complex tensors (their real view).
REDUCTIONS = ("sum", "prod", "max", "min", "avg")  # ncclRedOp_t's order
#: The reductions with a gradient (linear ones).
LINEAR = ("sum", "avg")

__all__ = ["LINEAR", "REDUCTIONS", "check_blocks", "check_group", "check_in_place", "check_op", "direct_call",
           "gathered", "on_cuda", "save_arguments", "stream_of", "tensor_arg"]


def tensor_arg(x: Any) -> Tensor:
    """`x`, which must be a torch.Tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, not {type(x).__name__}")
    return x


def direct_call(x: Any) -> bool:
    """Whether an eager call may skip the dispatcher and run its kernel: :func:`direct`, and no
    gradient to record."""
    return direct(x) and not (x.requires_grad and torch.is_grad_enabled())


def stream_of(x: Tensor) -> int:
    """torch's current stream on `x`'s device, as the handle the layer takes (no Stream object made)."""
    return torch._C._cuda_getCurrentRawStream(x.get_device())


def _communicator(name: str) -> Any:
    return _registry.lookup(name, nccl.Communicator)


def _group(c: Any, comm: str, group_size: int) -> Any:
    """`c` (called `comm`), which must have `group_size` ranks (what the fake kernel assumed)."""
    if c.size != group_size:
        raise UsageError(f"group_size is {group_size}; {comm} has {c.size} ranks")
    return c


def check_op(op: str, x: Tensor) -> None:
    """`op` is a reduction the operators take, and defined on `x`'s dtype."""
    if op not in REDUCTIONS:
        raise UsageError(f"op must be one of {', '.join(REDUCTIONS)}, not {op!r}")
    if x.is_complex() and op not in LINEAR:
        raise UsageError(f"a {op} of complex tensors is not defined (sum and avg are, over the real and imaginary "
                         "parts)")


def check_group(group_size: int) -> None:
    """`group_size` is a rank count mpbind takes."""
    # Capped like every rank count mpbind takes: a mistyped size is refused, never an output that large.
    if not 1 <= group_size <= MAX_RANKS:
        raise UsageError(f"group_size must be in [1, {MAX_RANKS}] (MAX_RANKS), not {group_size}")


def check_blocks(x: Tensor, group_size: int, what: str) -> None:
    """`x` splits into `group_size` equal blocks along dim 0."""
    if x.dim() == 0 or x.shape[0] % group_size:
        raise UsageError(f"{what}: dim 0 of a {tuple(x.shape)} tensor does not split into {group_size} equal blocks")


def _flat(t: Tensor) -> Tensor:
    """What NCCL is given: a complex tensor as its real view (two reals per element)."""
    return torch.view_as_real(t) if t.is_complex() else t


def on_cuda(x: Tensor, what: str) -> None:
    if x.device.type != "cuda":
        raise UsageError(f"{what} takes CUDA tensors, not a {x.device.type} tensor")


def _by_name(on: Any, what: str) -> Any:
    """The kernel of an operator whose work is ``on(x, communicator, *rest, comm=name)``: the
    communicator looked up by its name, after the tensor's device is checked."""

    def kernel(x: Tensor, comm: str, *rest: Any) -> Any:
        on_cuda(x, what)
        return on(x, _communicator(comm), *rest, comm=comm)

    return kernel


# --- all_reduce ---------------------------------------------------------------------------------


def _reduced(x: Tensor, comm: str, op: str) -> Tensor:
    """The checks and the (empty) output of an all-reduce: the fake kernel, and the kernel's start."""
    check_op(op, x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def all_reduce_on(x: Tensor, c: Any, op: str, comm: str = "") -> Tensor:
    """The all-reduce kernel on the communicator `c` itself (named `comm` where it has a name)."""
    out = _reduced(x, comm, op)
    on_cuda(x, "mpbind::all_reduce")
    c.all_reduce(_flat(x.contiguous()), _flat(out), op, stream=stream_of(x))
    return out


def _all_reduce_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
    comm, op = ctx.args
    if op not in LINEAR:
        raise UsageError(f"an all-reduce {op} has no gradient here (sum and avg have)")
    return torch.ops.mpbind.all_reduce(grad, comm, op), None, None


all_reduce = define("all_reduce(Tensor x, str comm, str op) -> Tensor",
                    _by_name(all_reduce_on, "mpbind::all_reduce"), _reduced,
                    _all_reduce_backward)


def check_in_place(x: Tensor, what: str) -> None:
    """`x` is contiguous: what `what`, working in place, takes."""
    if not x.is_contiguous():
        raise UsageError(f"{what} works in place on a contiguous tensor")


def all_reduce_in_place_on(x: Tensor, c: Any, op: str) -> None:
    check_op(op, x)
    on_cuda(x, "mpbind::all_reduce_")
    check_in_place(x, "mpbind::all_reduce_")
    c.all_reduce(_flat(x), _flat(x), op, stream=stream_of(x))


def _all_reduce_in_place_kernel(x: Tensor, comm: str, op: str) -> None:
    on_cuda(x, "mpbind::all_reduce_")
    all_reduce_in_place_on(x, _communicator(comm), op)


all_reduce_ = torch.library.custom_op("mpbind::all_reduce_", _all_reduce_in_place_kernel, mutates_args=("x",))


@all_reduce_.register_fake
def _(x: Tensor, comm: str, op: str) -> None:
    check_op(op, x)


# --- all_gather and reduce_scatter (each other's adjoint) -----------------------------------------------


def gathered(x: Tensor, comm: str | int, group_size: int) -> Tensor:
    """The checks and the (empty) output of an all-gather: the fake kernel (of the C++ operator too,
    whose `comm` is a launch id), and the kernel's start."""
    check_group(group_size)
    return x.new_empty((group_size * x.shape[0], *x.shape[1:]) if x.dim() else (group_size,))


def all_gather_on(x: Tensor, c: Any, group_size: int, comm: str = "") -> Tensor:
    out = gathered(x, comm, group_size)
    on_cuda(x, "mpbind::all_gather")
    _group(c, comm, group_size).all_gather(_flat(x.contiguous()), _flat(out), stream=stream_of(x))
    return out


def _scattered(x: Tensor, comm: str, op: str, group_size: int) -> Tensor:
    """The checks and the (empty) output of a reduce-scatter: the fake kernel, and the kernel's start."""
    check_op(op, x)
    check_group(group_size)
    check_blocks(x, group_size, "mpbind::reduce_scatter")
    return x.new_empty((x.shape[0] // group_size, *x.shape[1:]))


def reduce_scatter_on(x: Tensor, c: Any, op: str, group_size: int, comm: str = "") -> Tensor:
    out = _scattered(x, comm, op, group_size)
    on_cuda(x, "mpbind::reduce_scatter")
    _group(c, comm, group_size).reduce_scatter(_flat(x.contiguous()), _flat(out), op, stream=stream_of(x))
    return out


def _all_gather_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
    # y = [x_0; ...; x_{n-1}] on every rank: dL/dx_r = the sum over ranks of block r of their grads.
    comm, group_size = ctx.args
    return torch.ops.mpbind.reduce_scatter(grad, comm, "sum", group_size), None, None


def _reduce_scatter_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
    comm, op, group_size = ctx.args
    if op not in LINEAR:
        raise UsageError(f"a reduce-scatter {op} has no gradient here (sum and avg have)")
    g = torch.ops.mpbind.all_gather(grad, comm, group_size)
    return (g / group_size if op == "avg" else g), None, None, None


all_gather = define("all_gather(Tensor x, str comm, int group_size) -> Tensor",
                    _by_name(all_gather_on, "mpbind::all_gather"), gathered,
                    _all_gather_backward)
reduce_scatter = define("reduce_scatter(Tensor x, str comm, str op, int group_size) -> Tensor",
                        _by_name(reduce_scatter_on, "mpbind::reduce_scatter"), _scattered, _reduce_scatter_backward)


# --- all_to_all (its own adjoint) -----------------------------------------------------------------------


def _exchanged(x: Tensor, comm: str, group_size: int) -> Tensor:
    """The checks and the (empty) output of an all-to-all: the fake kernel, and the kernel's start."""
    check_group(group_size)
    check_blocks(x, group_size, "mpbind::all_to_all")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def all_to_all_on(x: Tensor, c: Any, group_size: int, comm: str = "") -> Tensor:
    out = _exchanged(x, comm, group_size)
    on_cuda(x, "mpbind::all_to_all")
    _group(c, comm, group_size).all_to_all(_flat(x.contiguous()), _flat(out), stream=stream_of(x))
    return out


def _all_to_all_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
    # Block j of rank r goes to block r of rank j: the transpose of a permutation is its inverse, itself.
    comm, group_size = ctx.args
    return torch.ops.mpbind.all_to_all(grad, comm, group_size), None, None


all_to_all = define("all_to_all(Tensor x, str comm, int group_size) -> Tensor",
                    _by_name(all_to_all_on, "mpbind::all_to_all"), _exchanged,
                    _all_to_all_backward)


# --- broadcast ----------------------------------------------------------------------------------------


def broadcast_on(x: Tensor, c: Any, root: int, comm: str = "") -> Tensor:
    on_cuda(x, "mpbind::broadcast")
    if not 0 <= root < c.size:
        raise UsageError(f"root {root} is not a rank of {comm or 'the communicator'} ({c.size} ranks)")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    c.broadcast(_flat(x.contiguous()), _flat(out), root, stream=stream_of(x))
    return out


def _broadcast_kernel(x: Tensor, comm: str, root: int) -> Tensor:
    on_cuda(x, "mpbind::broadcast")
    return broadcast_on(x, _communicator(comm), root, comm)


broadcast = torch.library.custom_op("mpbind::broadcast", _broadcast_kernel, mutates_args=())


@broadcast.register_fake
def _(x: Tensor, comm: str, root: int) -> Tensor:
    if root < 0:
        raise UsageError(f"root must be >= 0, not {root}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# --- point to point: send_recv (its adjoint is the reverse exchange), send, recv -------------------------


def _peer(c: Any, comm: str, peer: int, what: str) -> None:
    if not 0 <= peer < c.size:
        raise UsageError(f"{what} {peer} is not a rank of {comm} ({c.size} ranks)")


def _exchange_output(x: Tensor, comm: str, send_to: int, recv_from: int) -> Tensor:
    """The checks and the (empty) output of a send_recv: the fake kernel, and the CUDA kernel's start."""
    if send_to < 0 or recv_from < 0:
        raise UsageError(f"send_to and recv_from must be ranks (>= 0), not {send_to} and {recv_from}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def send_recv_on(x: Tensor, c: Any, send_to: int, recv_from: int, comm: str = "") -> Tensor:
    out = _exchange_output(x, comm, send_to, recv_from)
    on_cuda(x, "mpbind::send_recv")
    _peer(c, comm, send_to, "send_to")
    _peer(c, comm, recv_from, "recv_from")
    stream = stream_of(x)
    with nccl.group():  # one NCCL group: a ring of such exchanges does not deadlock
        c.send(_flat(x.contiguous()), send_to, stream=stream)
        c.recv(_flat(out), recv_from, stream=stream)
    return out


def _send_recv_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
    # y (here) = x (of recv_from): the gradient goes back the way the data came.
    comm, send_to, recv_from = ctx.args
    return torch.ops.mpbind.send_recv(grad, comm, recv_from, send_to), None, None, None


send_recv = define("send_recv(Tensor x, str comm, int send_to, int recv_from) -> Tensor",
                   _by_name(send_recv_on, "mpbind::send_recv"), _exchange_output,
                   _send_recv_backward)


def send_on(x: Tensor, c: Any, peer: int, comm: str = "") -> None:
    on_cuda(x, "mpbind::send")
    _peer(c, comm, peer, "peer")
    c.send(_flat(x.contiguous()), peer, stream=stream_of(x))


def _send_kernel(x: Tensor, comm: str, peer: int) -> None:
    on_cuda(x, "mpbind::send")
    send_on(x, _communicator(comm), peer, comm)


send = torch.library.custom_op("mpbind::send", _send_kernel, mutates_args=())


@send.register_fake
def _(x: Tensor, comm: str, peer: int) -> None:
    # An operator without an output is dropped from compiled graphs, and the peer's recv would wait
    # for a message that never comes: refused there, before anything is sent.
    raise UsageError("mpbind::send has no output, so a compiled graph would drop it; use send_recv (or send "
                     "outside the compiled function)")


def _received(shape: list[int], dtype: torch.dtype, device: torch.device, comm: str, peer: int) -> Tensor:
    """The checks and the (empty) output of a recv: the fake kernel, and the CUDA kernel's start."""
    if peer < 0:
        raise UsageError(f"peer must be a rank (>= 0), not {peer}")
    if any(n < 0 for n in shape):
        raise UsageError(f"shape must not have negative extents, not {tuple(shape)}")
    return torch.empty(shape, dtype=dtype, device=device)


def _recv_kernel(shape: list[int], dtype: torch.dtype, device: torch.device, comm: str, peer: int) -> Tensor:
    out = _received(shape, dtype, device, comm, peer)
    if out.device.type == "meta":  # no tensor argument picks the kernel: a meta recv is its shape alone
        return out
    on_cuda(out, "mpbind::recv")
    c = _communicator(comm)
    _peer(c, comm, peer, "peer")
    c.recv(_flat(out), peer, stream=stream_of(out))
    return out


recv = torch.library.custom_op("mpbind::recv", _recv_kernel, mutates_args=())


recv.register_fake(_received)
