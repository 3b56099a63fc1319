"""mpbind's NCCL collectives as torch functions (re-exported by :mod:`mpbind.torch`): each runs the
collective where it is called, eagerly or traced.

Where torch has CUDA they run the C++ operators of :mod:`._native`: eagerly through the gate in the
core (``_native.GATE``) where nothing else is to see the call, else through the dispatcher; traced by
Dynamo as the operators themselves, through their autograd functions where a gradient is wanted.
Elsewhere (a CPU-only torch) they run the Python operators of :mod:`._ops`.

Why a module of their own: Dynamo inlines these functions, and guards every module their code reaches
by two ways with a Python check on each call of the compiled program (~1.5 µs each, measured on one
H200). Called as ``mpbind.torch.all_reduce``, functions defined in ``mpbind.torch`` itself would be
such a module; so would ``_native`` or ``_ops`` read as attributes. What the traced path reads is
bound here by name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mpbind._infra import args as _args
from mpbind.errors import UsageError
from mpbind.torch import _native, _ops
from mpbind.torch._ops import tensor_arg
from mpbind.torch._registry import communicator_of, launched, resolved

__all__ = ["all_gather", "all_reduce", "all_reduce_", "all_to_all", "broadcast", "copy_to_group", "recv",
           "reduce_from_group", "reduce_scatter", "send", "send_recv"]

# What the traced path reads, bound by name (see above).
_NATIVE = _native.AVAILABLE
_ALL_REDUCE_IN_PLACE, _ALL_GATHER, _REDUCE_SCATTER, _ALL_TO_ALL = (
    _native.ALL_REDUCE_IN_PLACE, _native.ALL_GATHER, _native.REDUCE_SCATTER, _native.ALL_TO_ALL)
_AllReduce, _AllGather, _ReduceScatter, _AllToAll, _CopyToGroup, _ReduceFromGroup = (
    _native.AllReduce, _native.AllGather, _native.ReduceScatter, _native.AllToAll, _native.CopyToGroup,
    _native.ReduceFromGroup)
_reduced, _wants_grad, _REDUCTION_CODES = _native.reduced, _native.wants_grad, _native.REDUCTION_CODES
_check_op, _check_blocks, _check_in_place = _ops.check_op, _ops.check_blocks, _ops.check_in_place


def _native_call(x: Any) -> bool:
    """Whether the call goes to the C++ operators (:mod:`._native`): where they run, on a CUDA tensor
    (a fake one while tracing). They are called as they are (eagerly, traced, under any mode: the
    dispatcher's path is C++ throughout), through their autograd function where a gradient is wanted."""
    return _NATIVE and isinstance(x, Tensor) and x.is_cuda


#: The eager calls that run the C++ kernels without the dispatcher (``_native.GATE``), or None; asked
#: only outside Dynamo (which takes the check as a constant, and traces the operators).
_gate = _native.GATE
_compiling = torch.compiler.is_dynamo_compiling
_increment_version = torch.autograd.graph.increment_version
_K_ALL_REDUCE, _K_ALL_GATHER, _K_REDUCE_SCATTER, _K_ALL_TO_ALL = (_native.K_ALL_REDUCE, _native.K_ALL_GATHER,
                                                                  _native.K_REDUCE_SCATTER, _native.K_ALL_TO_ALL)


def all_reduce(x: Tensor, comm: Any, op: str = "sum") -> Tensor:
    """The reduction (`op`: sum, prod, max, min, avg) of `x` over the ranks, as a new tensor."""
    if not _compiling() and _gate is not None and (y := _gate(_K_ALL_REDUCE, x, comm, op, False)) is not None:
        return y
    if _native_call(x):
        _check_op(op, x)
        launch = launched(comm)[0]
        if _wants_grad(x):
            return _AllReduce.apply(x, launch, op)
        return _reduced(x, launch, op)
    if _ops.direct_call(x):
        return _ops.all_reduce_on(x, communicator_of(comm), op)
    return torch.ops.mpbind.all_reduce(tensor_arg(x), resolved(comm)[0], op)


def all_reduce_(x: Tensor, comm: Any, op: str = "sum") -> Tensor:
    """:func:`all_reduce` into `x` itself (contiguous); returns `x`."""
    if not _compiling() and _gate is not None and _gate(_K_ALL_REDUCE, x, comm, op, True) is not None:
        _increment_version(x)  # as the dispatcher does for an in-place operator: autograd sees the write
        return x
    if _native_call(x) and not _wants_grad(x):  # the C++ operator (compiled code calls no Python)
        _check_op(op, x)
        _check_in_place(x, "mpbind.torch.all_reduce_")
        _ALL_REDUCE_IN_PLACE(x, launched(comm)[0], _REDUCTION_CODES[op])
        if not _compiling():  # (traced, functionalization accounts for the write)
            _increment_version(x)  # the dispatcher does not: the operator has no ADInplaceOrView kernel
        return x
    if _ops.direct_call(x):
        _ops.all_reduce_in_place_on(x, communicator_of(comm), op)
        _increment_version(x)
        return x
    torch.ops.mpbind.all_reduce_(tensor_arg(x), resolved(comm)[0], op)
    return x


def all_gather(x: Tensor, comm: Any) -> Tensor:
    """Every rank's `x` stacked along dim 0, rank order (``size * x.shape[0]`` rows)."""
    if not _compiling() and _gate is not None and (y := _gate(_K_ALL_GATHER, x, comm, "", False)) is not None:
        return y
    if _native_call(x):
        launch, size = launched(comm)
        if _wants_grad(x):
            return _AllGather.apply(x, launch, size)
        return _ALL_GATHER(x.contiguous(), launch, size)
    if _ops.direct_call(x):
        c = communicator_of(comm)
        return _ops.all_gather_on(x, c, c.size)
    name, size = resolved(comm)
    return torch.ops.mpbind.all_gather(tensor_arg(x), name, size)


def reduce_scatter(x: Tensor, comm: Any, op: str = "sum") -> Tensor:
    """Block ``rank`` (of ``size`` equal blocks along dim 0) of the reduction of `x` over the ranks."""
    if not _compiling() and _gate is not None and (y := _gate(_K_REDUCE_SCATTER, x, comm, op, False)) is not None:
        return y
    if _native_call(x):
        launch, size = launched(comm)
        _check_op(op, x)
        _check_blocks(x, size, "mpbind.torch.reduce_scatter")
        if _wants_grad(x):
            return _ReduceScatter.apply(x, launch, op, size)
        return _REDUCE_SCATTER(x.contiguous(), launch, _REDUCTION_CODES[op], size)
    if _ops.direct_call(x):
        c = communicator_of(comm)
        return _ops.reduce_scatter_on(x, c, op, c.size)
    name, size = resolved(comm)
    return torch.ops.mpbind.reduce_scatter(tensor_arg(x), name, op, size)


def all_to_all(x: Tensor, comm: Any) -> Tensor:
    """Block j (of ``size`` equal blocks along dim 0) goes to rank j; block r of the result came from rank r."""
    if not _compiling() and _gate is not None and (y := _gate(_K_ALL_TO_ALL, x, comm, "", False)) is not None:
        return y
    if _native_call(x):
        launch, size = launched(comm)
        _check_blocks(x, size, "mpbind.torch.all_to_all")
        if _wants_grad(x):
            return _AllToAll.apply(x, launch)
        return _ALL_TO_ALL(x.contiguous(), launch)
    if _ops.direct_call(x):
        c = communicator_of(comm)
        return _ops.all_to_all_on(x, c, c.size)
    name, size = resolved(comm)
    return torch.ops.mpbind.all_to_all(tensor_arg(x), name, size)


def broadcast(x: Tensor, comm: Any, root: int) -> Tensor:
    """Rank `root`'s `x` on every rank, as a new tensor (no gradient)."""
    if _ops.direct_call(x):
        return _ops.broadcast_on(x, communicator_of(comm), root)
    return torch.ops.mpbind.broadcast(tensor_arg(x), resolved(comm)[0], root)


def send_recv(x: Tensor, comm: Any, send_to: int, recv_from: int) -> Tensor:
    """Send `x` to rank `send_to` and receive a tensor of the same shape and dtype from `recv_from`, in
    one NCCL group (a ring or a pipeline's exchange); its gradient goes back the way the data came."""
    if _ops.direct_call(x):
        return _ops.send_recv_on(x, communicator_of(comm), send_to, recv_from)
    return torch.ops.mpbind.send_recv(tensor_arg(x), resolved(comm)[0], send_to, recv_from)


def send(x: Tensor, comm: Any, peer: int) -> None:
    """Send `x` to rank `peer` (which calls :func:`recv`). Not inside a compiled function, which would
    drop an operator without an output: use :func:`send_recv` there."""
    if _ops.direct_call(x):
        return _ops.send_on(x, communicator_of(comm), peer)
    torch.ops.mpbind.send(tensor_arg(x), resolved(comm)[0], peer)


def recv(shape: Any, dtype: torch.dtype, comm: Any, peer: int, device: Any = None) -> Tensor:
    """A new tensor of `shape` and `dtype` received from rank `peer` (on `device`, default the current
    CUDA device)."""
    dims = [_args.integer(n, "shape's extents", minimum=0) for n in _args.sequence(shape, "shape", _args.MAX_NDIM)]
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, not {type(dtype).__name__}")
    _args.product([*dims, dtype.itemsize], "recv's size in bytes")  # refused before a tensor is made
    name = resolved(comm)[0]
    if device is None and not torch.cuda.is_available():
        raise UsageError("recv receives into a CUDA tensor, and torch sees no CUDA device")
    try:
        where = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:  # a device this torch cannot name or reach
        raise UsageError(f"device {device!r}: {exc}") from None
    return torch.ops.mpbind.recv(dims, dtype, where, name, _args.integer(peer, "peer", minimum=0))


def copy_to_group(x: Tensor, comm: Any) -> Tensor:
    """`x` itself forward, its gradient summed over the ranks backward: where a tensor-parallel block
    begins (Megatron's ``f``)."""
    return _CopyToGroup.apply(tensor_arg(x), launched(comm)[0] if _native_call(x) else resolved(comm)[0])


def reduce_from_group(x: Tensor, comm: Any) -> Tensor:
    """`x` summed over the ranks forward, the gradient passed through backward: where a tensor-parallel
    block ends (Megatron's ``g``). Without a gradient to record it is :func:`all_reduce`'s sum."""
    if not _compiling() and _gate is not None and (y := _gate(_K_ALL_REDUCE, x, comm, "sum", False)) is not None:
        return y
    if _native_call(x):
        launch = launched(comm)[0]
        if _wants_grad(x):
            return _ReduceFromGroup.apply(x, launch)
        return _reduced(x, launch, "sum")
    if _ops.direct_call(x):
        return _ops.all_reduce_on(x, communicator_of(comm), "sum")
    return _ReduceFromGroup.apply(tensor_arg(x), resolved(comm)[0])
