"""The collectives' C++ operators (``mpbind::nccl_all_reduce``, ``nccl_all_gather``, ``nccl_reduce_scatter``,
``nccl_all_to_all``; their kernels are the core's, ``_core/torch_ops.cpp``), and the autograd functions
:mod:`mpbind.torch` runs them through.

Why two kinds of operator: the functional operators of :mod:`._ops` (``mpbind::all_reduce``, ...)
have Python kernels, which a compiled program pays for on every call (measured on one H200 with
PyTorch 2.11: a Python kernel that only allocates costs ~40 µs inside a compiled function, ~4 µs
eagerly). These take the communicator's launch id (:attr:`~mpbind.nccl.Communicator.launch_id`) and
the reduction as ints and run in C++, registered through torch's stable C shim, so one build of the
core serves every PyTorch whose shim has them (2.11 and 2.13 checked). They have no autograd kernel
of their own: the functions here (``autograd.Function``, which ``torch.compile`` traces) give each
its adjoint. Used where torch has
CUDA; elsewhere (a CPU-only PyTorch, or one whose shim lacks a function) :mod:`mpbind.torch` keeps the
Python operators, and :data:`REASON` says why. The tensor-parallel pair (:class:`CopyToGroup`,
:class:`ReduceFromGroup`) serves both: given a launch id it sums by the C++ operator, given a
registry name by the Python one. Eagerly, :data:`GATE` runs the same kernels without the dispatcher
where nothing else is to see the call.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from mpbind import _core, nccl
from mpbind.errors import UsageError
from mpbind.torch import _library, _ops

#: ncclRedOp_t of each reduction the operators take (REDUCTIONS lists them in NCCL's order).
REDUCTION_CODES = {op: code for code, op in enumerate(_ops.REDUCTIONS)}
# Read by compiled programs' tracing as names of this module, not through torch's (fewer guards).
_compiling, _grad_enabled = torch.compiler.is_dynamo_compiling, torch.is_grad_enabled
_CONTIGUOUS = torch.contiguous_format


def _register() -> tuple[bool, str]:
    """Register the C++ operators; (whether they run here, why not)."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cuda = os.path.join(lib, "libtorch_cuda.so") if torch.version.cuda else ""
    try:
        _core.torch_ops_register(os.path.join(lib, "libtorch_cpu.so"), cuda, os.path.join(lib, "libtorch_python.so"))
    except RuntimeError as exc:
        return False, str(exc)
    return (True, "") if cuda else (False, "this PyTorch has no CUDA")


#: Whether the C++ operators are registered and can run (PyTorch with CUDA); :data:`REASON` says why not.
AVAILABLE, REASON = _register()


def _fake_same(x: Tensor, comm: int, *rest: int) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_scatter(x: Tensor, comm: int, op: int, group_size: int) -> Tensor:
    _ops.check_group(group_size)
    _ops.check_blocks(x, group_size, "mpbind::nccl_reduce_scatter")
    return x.new_empty((x.shape[0] // group_size, *x.shape[1:]))


def _fake_in_place(x: Tensor, comm: int, op: int) -> None:
    return None


if _core.torch_ops_registered():
    for _name, _fake in (("nccl_all_reduce", _fake_same), ("nccl_all_gather", _ops.gathered),
                         ("nccl_reduce_scatter", _fake_scatter), ("nccl_all_to_all", _fake_same),
                         ("nccl_all_reduce_", _fake_in_place)):
        torch.library.register_fake(f"mpbind::{_name}", _fake)


#: Eager calls that run the C++ kernels directly, without the dispatcher (``_core.torch_eager_gate``:
#: called with a collective's code, the tensor, the communicator, the reduction's name ("" for none) and
#: whether in place, all positionally, it runs the call, or returns None where the dispatcher is to see
#: it); None where the C++ operators do not run or torch's tensors lack the DLPack C exchange API it
#: reads them through (and makes their outputs by, where libtorch_python's wrapper is not found). Its
#: callers rule out Dynamo's tracing first (which is not to trace into it; other tracers hand it fake
#: tensors or run a mode, which it leaves to the dispatcher).
GATE: Any = (_core.torch_eager_gate(Tensor, nccl.Communicator, _library.SEEN_BY, _grad_enabled)
             if AVAILABLE and _core.torch_eager_ready(torch.empty(0)) else None)
#: The collectives' codes as the gate takes them (launch::Collective).
K_ALL_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_ALL_TO_ALL = range(4)


def wants_grad(x: Tensor) -> bool:
    """Whether a call on `x` records a gradient (the autograd function), else the operator itself
    runs (a compiled program guards on both, so each case is a graph of its own)."""
    return x.requires_grad and _grad_enabled()


# The overloads themselves (an eager call skips the packet's lookup); None where not registered.
ALL_REDUCE: Any = None
ALL_REDUCE_IN_PLACE: Any = None
ALL_GATHER: Any = None
REDUCE_SCATTER: Any = None
ALL_TO_ALL: Any = None
if _core.torch_ops_registered():
    ALL_REDUCE, ALL_GATHER = torch.ops.mpbind.nccl_all_reduce.default, torch.ops.mpbind.nccl_all_gather.default
    REDUCE_SCATTER, ALL_TO_ALL = torch.ops.mpbind.nccl_reduce_scatter.default, torch.ops.mpbind.nccl_all_to_all.default
    ALL_REDUCE_IN_PLACE = torch.ops.mpbind.nccl_all_reduce_.default


def reduced(x: Tensor, comm: int, op: str) -> Tensor:
    """The all-reduce of `x` as a new tensor. Traced by Dynamo it is the in-place operator on a copy of
    `x`, as torch's functional collective is: inductor drops the copy where it changes nothing and puts
    the operator back in place on `x`'s buffer where nothing reads it afterwards (no allocation, no
    copy; otherwise it copies first). Eagerly it is the functional operator."""
    code = REDUCTION_CODES[op]
    if _compiling():
        y = x.clone(memory_format=_CONTIGUOUS)
        ALL_REDUCE_IN_PLACE(y, comm, code)
        return y
    return ALL_REDUCE(x.contiguous(), comm, code)


class AllReduce(torch.autograd.Function):
    """The sum (or average) over the ranks; its gradient is the same reduction of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, op: str) -> Tensor:
        ctx.comm, ctx.op = comm, op
        return reduced(x, comm, op)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        if ctx.op not in _ops.LINEAR:
            raise UsageError(f"an all-reduce {ctx.op} has no gradient here (sum and avg have)")
        return AllReduce.apply(grad, ctx.comm, ctx.op), None, None


class AllGather(torch.autograd.Function):
    """Every rank's tensor stacked along dim 0; its gradient is the sum of each rank's block."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, group_size: int) -> Tensor:
        ctx.comm, ctx.group_size = comm, group_size
        return ALL_GATHER(x.contiguous(), comm, group_size)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return ReduceScatter.apply(grad, ctx.comm, "sum", ctx.group_size), None, None


class ReduceScatter(torch.autograd.Function):
    """This rank's block of the reduction; its gradient is the all-gather of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, op: str, group_size: int) -> Tensor:
        ctx.comm, ctx.op, ctx.group_size = comm, op, group_size
        return REDUCE_SCATTER(x.contiguous(), comm, REDUCTION_CODES[op], group_size)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        if ctx.op not in _ops.LINEAR:
            raise UsageError(f"a reduce-scatter {ctx.op} has no gradient here (sum and avg have)")
        g = AllGather.apply(grad, ctx.comm, ctx.group_size)
        return (g / ctx.group_size if ctx.op == "avg" else g), None, None, None


class AllToAll(torch.autograd.Function):
    """Block j to rank j; its own adjoint."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int) -> Tensor:
        ctx.comm = comm
        return ALL_TO_ALL(x.contiguous(), comm)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return AllToAll.apply(grad, ctx.comm), None


def _summed(x: Tensor, comm: int | str) -> Tensor:
    """The sum over the ranks: by the C++ operator (`comm` a launch id) or, where those do not run, by
    the Python one (`comm` a registry name)."""
    if isinstance(comm, str):
        return torch.ops.mpbind.all_reduce(x, comm, "sum")
    return reduced(x, comm, "sum")


class CopyToGroup(torch.autograd.Function):
    """Identity forward, the gradient summed over the ranks backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int | str) -> Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _summed(grad, ctx.comm), None


class ReduceFromGroup(torch.autograd.Function):
    """The sum over the ranks forward, the gradient passed through backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int | str) -> Tensor:
        return _summed(x, comm)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None
