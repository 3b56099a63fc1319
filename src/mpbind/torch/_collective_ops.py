"""The collective matmul as a torch operator (``mpbind::all_gather_matmul``), registered when
:mod:`mpbind.torch` is imported: ``out = all_gather(x) @ w`` of an
:class:`mpbind.collective.AllGatherMatmul` plan, named by its registry name, on torch's current stream.

It has no gradient here (its adjoint needs a reduce-scatter over the PEs of the plan's NVSHMEM team,
which the plan does not have). A CUDA graph cannot hold it: the plan counts its calls on the host
(the signal values its ring waits for), so a replay would wait for a count already reached; the
kernel refuses a capturing stream, naming why.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mpbind.collective import AllGatherMatmul
from mpbind.errors import UsageError
from mpbind.torch import _registry
from mpbind.torch._library import define
from mpbind.torch._ops import on_cuda

__all__ = ["all_gather_matmul_on"]


def _gathered_product(x: Tensor, w: Tensor, plan: str) -> Tensor:
    """The fake kernel: the checks and the (empty) output."""
    return _output(_registry.lookup(plan, AllGatherMatmul), x, w)


def _output(p: AllGatherMatmul, x: Tensor, w: Tensor) -> Tensor:
    dtype = getattr(torch, p.dtype)
    if tuple(x.shape) != (p.m, p.k) or x.dtype != dtype:
        raise UsageError(f"mpbind::all_gather_matmul: x must be {p.dtype} [{p.m}, {p.k}] (this PE's rows), not "
                         f"{str(x.dtype)[6:]} {list(x.shape)}")
    if tuple(w.shape) != (p.k, p.n) or w.dtype != dtype:
        raise UsageError(f"mpbind::all_gather_matmul: w must be {p.dtype} [{p.k}, {p.n}] (this PE's columns), not "
                         f"{str(w.dtype)[6:]} {list(w.shape)}")
    return x.new_empty((p.n_pes * p.m, p.n))


def all_gather_matmul_on(p: AllGatherMatmul, x: Tensor, w: Tensor) -> Tensor:
    """The kernel on the plan itself."""
    on_cuda(x, "mpbind::all_gather_matmul")
    out = _output(p, x, w)
    if torch.cuda.is_current_stream_capturing():
        raise UsageError("mpbind::all_gather_matmul cannot be captured into a CUDA graph: the plan counts its calls "
                         "on the host, and a replay would wait for a count already reached")
    return p(x.contiguous(), w, out)


def _kernel(x: Tensor, w: Tensor, plan: str) -> Tensor:
    return all_gather_matmul_on(_registry.lookup(plan, AllGatherMatmul), x, w)


all_gather_matmul = define("all_gather_matmul(Tensor x, Tensor w, str plan) -> Tensor", _kernel, _gathered_product)
