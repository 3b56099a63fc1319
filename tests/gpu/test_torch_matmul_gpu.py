"""The planned matmul as a torch operator (``mpbind.torch.matmul``) on one GPU with one NCCL rank: a
tensor-parallel layer's product ``h = x W^T`` against torch, its gradients through the plans of
:func:`mpbind.torch.gradient_plans` by ``torch.autograd.gradcheck`` in double precision and against
torch's autograd, inside ``torch.compile(fullgraph=True)`` and a CUDA graph. Several ranks need
several GPUs (the planned matmul suite)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from runner import need_library

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import mpbind.torch as mpt  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind import matmul, nccl  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

T, H, F = 24, 16, 40  # tokens, hidden, features


@pytest.fixture(scope="module")
def comm(nccl_one_rank: nccl.Communicator) -> nccl.Communicator:
    need_library("cublasmp")
    return nccl_one_rank


def seeded(shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=dtype)


@pytest.fixture(scope="module", params=[torch.float64, torch.float32], ids=["float64", "float32"])
def layer(request: Any, comm: nccl.Communicator) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(forward plan, dW plan, dx plan, dtype): h (T x F) = x (T x H) W^T (W: F x H, a Linear's weight),
    planned as the column-major h^T = W x^T on the one-rank communicator."""
    dtype = request.param
    w, x, h = torch.empty(F, H, dtype=dtype, device="cuda"), torch.empty(T, H, dtype=dtype, device="cuda"), \
        torch.empty(T, F, dtype=dtype, device="cuda")
    fwd = matmul.plan(comm, w.T, x.T, h.T, transa=True, a_dist=dist.by_columns((H, F), 1),
                      b_dist=dist.by_columns((H, T), 1), d_dist=dist.by_rows((F, T), 1))
    grad_w, grad_x = mpt.gradient_plans(comm, fwd)
    yield fwd, grad_w, grad_x, dtype
    torch.cuda.synchronize()
    for p in (grad_x, grad_w, fwd):
        mpt.forget(p)
        p.close()


def test_the_product_and_its_gradients_against_torch(layer: tuple[Any, Any, Any, Any]) -> None:
    fwd, grad_w, grad_x, dtype = layer
    w, x = seeded((F, H), dtype, 1).requires_grad_(), seeded((T, H), dtype, 2).requires_grad_()
    h = mpt.matmul(w, x, fwd, grad_a=grad_w, grad_b=grad_x)
    g = seeded((T, F), dtype, 3)
    h.backward(g)
    w_ref, x_ref = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    h_ref = x_ref @ w_ref.T
    h_ref.backward(g)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(h, h_ref.detach(), **tol)
    torch.testing.assert_close(w.grad, w_ref.grad, **tol)
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)
    with torch.no_grad():  # eager, no gradient: the kernel runs without the dispatcher, same result
        torch.testing.assert_close(mpt.matmul(w, x, fwd), h.detach(), rtol=0, atol=0)


def test_gradcheck_in_double_precision(layer: tuple[Any, Any, Any, Any]) -> None:
    fwd, grad_w, grad_x, dtype = layer
    if dtype != torch.float64:
        pytest.skip("gradcheck runs in double precision")
    w, x = seeded((F, H), dtype, 4).requires_grad_(), seeded((T, H), dtype, 5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: mpt.matmul(a, b, fwd, grad_a=grad_w, grad_b=grad_x), (w, x))


def test_compiled_and_captured_match_eager(layer: tuple[Any, Any, Any, Any]) -> None:
    fwd, grad_w, grad_x, dtype = layer
    w, x = seeded((F, H), dtype, 6), seeded((T, H), dtype, 7)

    def step(a: Any, b: Any) -> Any:
        return torch.relu(mpt.matmul(a, b * 2, fwd, grad_a=grad_w, grad_b=grad_x)).sum(dim=0)

    eager = step(w, x)
    torch.compiler.reset()
    explained = torch._dynamo.explain(step)(w, x)
    assert explained.graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(compiled(w, x), eager, **tol)  # inductor may sum in another order
    wg, xg = w.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(wg, xg).sum().backward()
    we, xe = w.clone().requires_grad_(), x.clone().requires_grad_()
    step(we, xe).sum().backward()
    torch.testing.assert_close(wg.grad, we.grad, **tol)
    torch.testing.assert_close(xg.grad, xe.grad, **tol)
    # a CUDA graph of the operator, replayed on new data
    static_w, static_x = w.clone(), x.clone()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        step(static_w, static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(static_w, static_x)
    for seed in range(2):
        static_w.copy_(seeded((F, H), dtype, 10 + seed))
        static_x.copy_(seeded((T, H), dtype, 20 + seed))
        graph.replay()
        torch.testing.assert_close(out, step(static_w, static_x), rtol=0, atol=0)


def test_refusals_name_what_is_wrong(layer: tuple[Any, Any, Any, Any]) -> None:
    fwd, grad_w, grad_x, dtype = layer
    w, x = seeded((F, H), dtype, 8), seeded((T, H), dtype, 9)
    with pytest.raises(UsageError, match=r"a must be .* of shape \(40, 16\)"):
        mpt.matmul(x, x, fwd)
    with pytest.raises(UsageError, match=r"grad_a .* must compute da"):
        mpt.matmul(w.requires_grad_(), x, fwd, grad_a=grad_x, grad_b=grad_w).sum().backward()
