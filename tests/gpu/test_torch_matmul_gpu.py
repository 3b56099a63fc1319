"""The planned matmul as a torch operator (``mpbind.torch.matmul``) on one GPU with one NCCL rank: a
tensor-parallel layer's product ``h = x W^T`` against torch, its gradients through the plans of
:func:`mpbind.torch.gradient_plans` by ``torch.autograd.gradcheck`` in double precision and against
torch's autograd, inside ``torch.compile(fullgraph=True)`` and a CUDA graph. Several ranks need
several GPUs (the planned matmul suite).

FP8 with the scales of each call (``mpbind::matmul_scaled``, and the layer's ``execute(scales=)``):
e4m3 W and x (TN, as cuBLASLt takes FP8) with per-tensor scales, two calls with different scale
tensors each against torch in float32, ``amax_d`` against the product's and D's absolute maximum,
eager against compiled, and the plan's own calls still on its planned scales afterwards. The
planner gives ``amax_d`` (and D's scale) to an FP8 D only, so the plan with ``amax_d`` has an e4m3 D;
a second plan, bfloat16 D with the scales of A and B, returns D alone."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
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


# --- FP8 with the scales of each call ---------------------------------------------------------------

F8 = torch.float8_e4m3fn
T8, H8, F8_OUT = 32, 64, 48  # tokens, hidden, features: multiples of 16, as the FP8 kernels' local sizes must be
PLANNED = (0.5, 2.0, 4.0)  # the planned scales of A, B and D
CALLS = ((0.25, 3.0, 2.0), (1.5, 0.75, 0.5))  # two calls' scales, neither the planned ones


def fp8_values(shape: tuple[int, ...], seed: int) -> Any:
    """Uniform in [-1, 1), rounded to e4m3."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, generator=g, device="cuda") * 2 - 1).to(F8)


def scalar(value: float) -> Any:
    return torch.tensor([value], dtype=torch.float32, device="cuda")


def fp8_reference(w: Any, x: Any, sa: float, sb: float) -> Any:
    """h = (x sb) (W sa)^T in float32: the product before D's scale, which amax_d is the maximum of."""
    return (x.float() * sb) @ (w.float() * sa).T


def assert_fp8_close(d: Any, want: Any) -> None:
    """An e4m3 D against its float32 value: rounding to e4m3 (3 mantissa bits) moves a normal value by
    at most 1/16 of it (rtol 0.07 leaves room for the accumulation order) and a subnormal one (below
    2**-6) by at most 2**-10."""
    assert d.dtype == F8
    torch.testing.assert_close(d.float(), want, rtol=0.07, atol=2**-9)


def assert_amax_close(amax: Any, ref: Any) -> None:
    """amax_d against the float32 product's absolute maximum. cuBLASLt's FP8 kernels accumulate in
    their own order and precision (on one H200: 1.2e-4 relative from torch's float32 product of the
    same e4m3 values), so within 1e-3."""
    assert amax.dtype == torch.float32 and tuple(amax.shape) == (1,)
    torch.testing.assert_close(amax, ref.abs().max().reshape(1), rtol=1e-3, atol=1e-6)


@pytest.fixture(scope="module")
def fp8(comm: nccl.Communicator) -> Iterator[Any]:
    """Two FP8 plans of h^T = W x^T (W: F x H, e4m3; x: T x H, e4m3) on the one-rank communicator:
    ``with_amax`` (e4m3 D, scales a, b, d and amax_d) and ``bf16`` (bfloat16 D, scales a and b), with
    the arrays and scales they were planned on."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9")
    w, x = fp8_values((F8_OUT, H8), 31), fp8_values((T8, H8), 32)
    h8 = torch.zeros(T8, F8_OUT, dtype=F8, device="cuda")
    hb = torch.zeros(T8, F8_OUT, dtype=torch.bfloat16, device="cuda")
    sa, sb, sd = (scalar(v) for v in PLANNED)
    amax = torch.zeros(1, dtype=torch.float32, device="cuda")
    dists = {"a_dist": dist.by_columns((H8, F8_OUT), 1), "b_dist": dist.by_columns((H8, T8), 1),
             "d_dist": dist.by_rows((F8_OUT, T8), 1)}
    with_amax = matmul.plan(comm, w.T, x.T, h8.T, transa=True, scaling="tensor",
                            scales={"a": sa, "b": sb, "d": sd, "amax_d": amax}, **dists)
    bf16 = matmul.plan(comm, w.T, x.T, hb.T, transa=True, scaling="tensor", scales={"a": sa, "b": sb}, **dists)
    yield SimpleNamespace(with_amax=with_amax, bf16=bf16, w=w, x=x, h8=h8, hb=hb,
                          planned={"a": sa, "b": sb, "d": sd, "amax_d": amax})
    torch.cuda.synchronize()
    for p in (bf16, with_amax):
        mpt.forget(p)
        p.close()


def assert_planned_pointers(p: Any, planned: dict[str, Any]) -> None:
    """The plan's descriptor points at the scales it was planned with."""
    descriptor = p.matmul.descriptor
    attributes = {"a": "a_scale_pointer", "b": "b_scale_pointer", "d": "d_scale_pointer", "amax_d": "amax_d_pointer"}
    for name in p.plan.scales:
        assert getattr(descriptor, attributes[name]) == planned[name].data_ptr(), name


def test_fp8_with_the_scales_of_each_call_against_torch(fp8: Any) -> None:
    w, x = fp8.w, fp8.x
    for sa, sb, sd in CALLS:
        out = mpt.matmul(w, x, fp8.with_amax, scales={"a": scalar(sa), "b": scalar(sb), "d": scalar(sd)})
        assert isinstance(out, tuple)
        d, amax = out
        assert tuple(d.shape) == (T8, F8_OUT)
        ref = fp8_reference(w, x, sa, sb)
        assert_fp8_close(d, ref * sd)
        assert_amax_close(amax, ref)
        # and D's own absolute maximum, brought back before D's scale, within e4m3's rounding
        torch.testing.assert_close(d.float().abs().max() / sd, amax[0], rtol=0.07, atol=2**-9)
        h = mpt.matmul(w, x, fp8.bf16, scales={"a": scalar(sa), "b": scalar(sb)})  # no amax_d: D alone
        assert isinstance(h, torch.Tensor) and h.dtype == torch.bfloat16
        torch.testing.assert_close(h.float(), ref, rtol=8e-3, atol=1e-3)  # bfloat16 keeps 8 bits
    # the plans' own calls still use the planned scales
    for p in (fp8.with_amax, fp8.bf16):
        assert_planned_pointers(p, fp8.planned)
    fp8.planned["amax_d"].zero_()
    stream = torch.cuda.current_stream()
    fp8.with_amax.execute(stream=stream)
    fp8.bf16.execute(stream=stream)
    torch.cuda.synchronize()
    sa, sb, sd = PLANNED
    ref = fp8_reference(w, x, sa, sb)
    assert_fp8_close(fp8.h8, ref * sd)
    assert_amax_close(fp8.planned["amax_d"], ref)
    torch.testing.assert_close(fp8.hb.float(), ref, rtol=8e-3, atol=1e-3)


def test_fp8_compiled_matches_eager(fp8: Any) -> None:
    p = fp8.with_amax

    def step(w: Any, x: Any, sa: Any, sb: Any, sd: Any) -> Any:
        return mpt.matmul(w, x, p, scales={"a": sa, "b": sb, "d": sd})

    for sa, sb, sd in CALLS:
        args = (fp8.w, fp8.x, scalar(sa), scalar(sb), scalar(sd))
        d, amax = step(*args)
        torch.compiler.reset()
        explained = torch._dynamo.explain(step)(*args)
        assert explained.graph_break_count == 0
        dc, amaxc = torch.compile(step, fullgraph=True)(*args)
        torch.testing.assert_close(dc.float(), d.float(), rtol=0, atol=0)  # one kernel: the same bits
        torch.testing.assert_close(amaxc, amax, rtol=0, atol=0)
    assert_planned_pointers(p, fp8.planned)


def test_fp8_layer_execute_with_scales(fp8: Any) -> None:
    p, w, x = fp8.with_amax, fp8.w, fp8.x
    stream = torch.cuda.current_stream()
    for sa, sb, sd in CALLS:
        out = torch.zeros(T8, F8_OUT, dtype=F8, device="cuda")
        amax = torch.zeros(1, dtype=torch.float32, device="cuda")
        p.execute(w.T, x.T, out.T, stream=stream,
                  scales={"a": scalar(sa), "b": scalar(sb), "d": scalar(sd), "amax_d": amax})
        torch.cuda.synchronize()
        ref = fp8_reference(w, x, sa, sb)
        assert_fp8_close(out, ref * sd)
        assert_amax_close(amax, ref)
        assert_planned_pointers(p, fp8.planned)
    with pytest.raises(UsageError, match=r"scales must name exactly the planned ones \('a', 'b', 'd', 'amax_d'\)"):
        p.execute(scales={"a": scalar(1.0), "b": scalar(1.0)})
    with pytest.raises(UsageError, match=r"scales\['d'\] must be 1 contiguous float32"):
        p.execute(scales={**fp8.planned, "d": scalar(1.0).double()})
    with pytest.raises(UsageError, match=r"scales\['amax_d'\] must be 1 contiguous float32 on device 0; got 2"):
        p.execute(scales={**fp8.planned, "amax_d": torch.zeros(2, device="cuda")})
    with pytest.raises(UsageError, match=r"scales\['a'\] must be in GPU memory"):
        p.execute(scales={**fp8.planned, "a": torch.ones(1)})
    assert_planned_pointers(p, fp8.planned)


def test_fp8_refusals_of_the_operator(fp8: Any, layer: tuple[Any, Any, Any, Any]) -> None:
    w, x = fp8.w, fp8.x
    with pytest.raises(UsageError, match=r"scale_d must be given"):
        mpt.matmul(w, x, fp8.with_amax, scales={"a": scalar(1.0), "b": scalar(1.0)})
    with pytest.raises(UsageError, match=r"scale_a must hold 1 float32, not 2 float32"):
        mpt.matmul(w, x, fp8.bf16, scales={"a": torch.ones(2, device="cuda"), "b": scalar(1.0)})
    with pytest.raises(UsageError, match="takes CUDA tensors, not a cpu tensor"):
        mpt.matmul(w, x, fp8.bf16, scales={"a": torch.ones(1), "b": scalar(1.0)})
    fwd, _, _, dtype = layer  # a plan without scales
    a, b = seeded((F, H), dtype, 40), seeded((T, H), dtype, 41)
    with pytest.raises(UsageError, match="was planned without scales"):
        mpt.matmul(a, b, fwd, scales={"a": scalar(1.0), "b": scalar(1.0)})
