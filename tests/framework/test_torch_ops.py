"""mpbind's torch operators without a GPU: their registration checked by ``torch.library.opcheck``
(schema, fake kernel, autograd registration, AOT dispatch) on meta tensors, their shape rules and
refusals, their gradients (each backward is the adjoint collective), and a tensor-parallel block
compiled by ``torch.compile(fullgraph=True)`` with no graph break. The CUDA kernels, which call
NCCL, run in the GPU suites."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import mpbind.torch as mpt  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

OPS = torch.ops.mpbind
NAME = "Communicator#1"  # the fake kernels never look a communicator up


def meta(*shape: int, dtype: Any = None, grad: bool = True) -> Any:
    return torch.randn(shape, device="meta", dtype=dtype or torch.float32, requires_grad=grad)


CASES = [
    ("all_reduce.sum", OPS.all_reduce.default, lambda: (meta(8, 4), NAME, "sum")),
    ("all_reduce.avg.complex", OPS.all_reduce.default, lambda: (meta(8, 4, dtype=torch.complex64), NAME, "avg")),
    ("all_reduce.max", OPS.all_reduce.default, lambda: (meta(8, 4), NAME, "max")),
    ("all_reduce_.in_place", OPS.all_reduce_.default, lambda: (meta(8, 4, grad=False), NAME, "sum")),
    ("all_gather", OPS.all_gather.default, lambda: (meta(8, 4), NAME, 3)),
    ("all_gather.bf16", OPS.all_gather.default, lambda: (meta(2, 5, dtype=torch.bfloat16), NAME, 2)),
    ("reduce_scatter", OPS.reduce_scatter.default, lambda: (meta(8, 4), NAME, "sum", 4)),
    ("reduce_scatter.avg", OPS.reduce_scatter.default, lambda: (meta(6, 2), NAME, "avg", 3)),
    ("all_to_all", OPS.all_to_all.default, lambda: (meta(8, 4), NAME, 2)),
    ("broadcast", OPS.broadcast.default, lambda: (meta(8, 4, grad=False), NAME, 0)),
    ("send_recv", OPS.send_recv.default, lambda: (meta(8, 4), NAME, 1, 0)),
    ("send_recv.complex", OPS.send_recv.default, lambda: (meta(3, dtype=torch.complex64), NAME, 0, 2)),
    ("recv", OPS.recv.default, lambda: ([4, 2], torch.bfloat16, torch.device("meta"), NAME, 1)),
]


@pytest.mark.parametrize(("op", "args"), [(op, args) for _, op, args in CASES], ids=[c[0] for c in CASES])
def test_opcheck(op: Any, args: Callable[[], tuple[Any, ...]]) -> None:
    result = torch.library.opcheck(op, args())
    assert set(result.values()) == {"SUCCESS"}, result


def test_output_shapes_and_dtypes() -> None:
    x = meta(8, 4, dtype=torch.bfloat16)
    assert OPS.all_reduce(x, NAME, "sum").shape == (8, 4)
    assert OPS.all_gather(x, NAME, 3).shape == (24, 4)
    assert OPS.all_gather(meta(grad=False), NAME, 5).shape == (5,)  # a 0-d tensor per rank
    assert OPS.reduce_scatter(x, NAME, "sum", 4).shape == (2, 4)
    assert OPS.all_to_all(x, NAME, 8).shape == (8, 4)
    assert OPS.broadcast(x, NAME, 1).dtype == torch.bfloat16
    t = x.detach().t()  # not contiguous: the results are
    assert OPS.all_reduce(t, NAME, "sum").is_contiguous()


@pytest.mark.parametrize(("call", "match"), [
    (lambda: OPS.all_reduce(meta(4), NAME, "mean"), "op must be one of sum, prod, max, min, avg"),
    (lambda: OPS.all_reduce(meta(4, dtype=torch.complex64), NAME, "max"), "max of complex tensors"),
    (lambda: OPS.all_gather(meta(4), NAME, 0), r"group_size must be in \[1, 1048576\]"),
    (lambda: OPS.all_gather(meta(4), NAME, 2**62), r"group_size must be in \[1, 1048576\] \(MAX_RANKS\), not 4611"),
    (lambda: OPS.reduce_scatter(meta(8, 4), NAME, "sum", 3), r"dim 0 of a \(8, 4\) tensor does not split into 3"),
    (lambda: OPS.reduce_scatter(meta(grad=False), NAME, "sum", 1), "does not split"),
    (lambda: OPS.all_to_all(meta(6), NAME, 4), "does not split into 4"),
    (lambda: OPS.broadcast(meta(4), NAME, -1), "root must be >= 0"),
    (lambda: OPS.all_reduce(torch.ones(4), NAME, "sum"), "takes CUDA tensors, not a cpu tensor"),
    (lambda: OPS.all_reduce_(torch.ones(4), NAME, "sum"), "takes CUDA tensors"),
])
def test_bad_calls_are_refused_naming_what(call: Callable[[], Any], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        call()


def test_the_functions_take_tensors_and_communicators() -> None:
    with pytest.raises(TypeError, match="x must be a torch.Tensor, not list"):
        mpt.all_reduce([1.0], NAME)
    with pytest.raises(TypeError, match="comm must be an mpbind.nccl.Communicator or its registered name, not int"):
        mpt.all_gather(meta(4), 3)
    with pytest.raises(UsageError, match="no mpbind object is registered as 'Communicator#999'"):
        mpt.reduce_scatter(meta(4), "Communicator#999")
    with pytest.raises(TypeError, match="not an mpbind object with a serial number"):
        mpt.name_of(object())


def _backward_ops(fn: Callable[..., Any], *inputs: Any) -> list[str]:
    """The mpbind operators in the backward graph AOT autograd makes for `fn` (compiled on meta tensors)."""
    from torch._functorch.aot_autograd import aot_function

    seen: list[str] = []

    def forward(gm: Any, _: Any) -> Any:
        return gm

    def backward(gm: Any, _: Any) -> Any:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "mpbind" in str(n.target))
        return gm

    out = aot_function(fn, fw_compiler=forward, bw_compiler=backward)(*inputs)
    out.sum().backward()
    return seen


@pytest.mark.parametrize(("fn", "adjoint"), [
    (lambda x: OPS.all_reduce(x, NAME, "sum"), ["mpbind.all_reduce.default"]),
    (lambda x: OPS.all_reduce(x, NAME, "avg"), ["mpbind.all_reduce.default"]),
    (lambda x: OPS.all_gather(x, NAME, 2), ["mpbind.reduce_scatter.default"]),
    (lambda x: OPS.reduce_scatter(x, NAME, "sum", 2), ["mpbind.all_gather.default"]),
    (lambda x: OPS.all_to_all(x, NAME, 2), ["mpbind.all_to_all.default"]),
], ids=["all_reduce.sum", "all_reduce.avg", "all_gather", "reduce_scatter", "all_to_all"])
def test_each_gradient_is_the_adjoint_collective(fn: Callable[[Any], Any], adjoint: list[str]) -> None:
    x = meta(8, 4)
    assert _backward_ops(fn, x) == adjoint
    assert x.grad is not None and x.grad.shape == x.shape


def test_a_reduction_without_a_gradient_says_so() -> None:
    y = OPS.all_reduce(meta(4), NAME, "max")
    with pytest.raises(UsageError, match="an all-reduce max has no gradient here"):
        y.sum().backward()


def _tp_block(x: Any, w1: Any, w2: Any) -> Any:
    # A row-parallel pair and a sequence-parallel round trip (mpbind.torch.copy_to_group and
    # reduce_from_group, which take a communicator, run in the GPU suite).
    h = torch.relu(x @ w1)
    y = OPS.all_reduce(h @ w2, NAME, "sum")
    g = OPS.all_gather(y, NAME, 2)
    return OPS.reduce_scatter(g, NAME, "sum", 2)


def test_a_tensor_parallel_block_compiles_whole_forward_and_backward() -> None:
    x, w1, w2 = meta(8, 16), meta(16, 32), meta(32, 16)
    explained = torch._dynamo.explain(_tp_block)(x, w1, w2)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch.compiler.reset()
    out = torch.compile(_tp_block, backend="aot_eager", fullgraph=True)(x, w1, w2)
    assert out.shape == (8, 16)
    out.sum().backward()
    assert x.grad.shape == x.shape and w1.grad.shape == w1.shape and w2.grad.shape == w2.shape


class _CoreStandIn:
    """What mpbind.torch reads of a communicator's core on the way to an operator: serial, size, closed."""

    def __init__(self, serial: int, size: int) -> None:
        self.serial, self.size, self.closed = serial, size, False


def _communicator(serial: int, size: int) -> Any:
    from mpbind.nccl import Communicator

    return Communicator._over(_CoreStandIn(serial, size))


def _block_with(x: Any, w1: Any, w2: Any, comm: Any) -> Any:
    h = torch.relu(mpt.copy_to_group(x, comm) @ w1)
    y = mpt.reduce_from_group(h @ w2, comm)
    return mpt.reduce_scatter(mpt.all_gather(y, comm), comm)


def test_a_compiled_function_takes_the_communicator_itself() -> None:
    # Its name and size are constants of the graph, guarded by the communicator's identity: another
    # communicator (of another size) recompiles rather than reusing the first one's constants.
    two, four = _communicator(10_000_001, 2), _communicator(10_000_002, 4)
    try:
        x, w1, w2 = meta(8, 16), meta(16, 32), meta(32, 16)
        explained = torch._dynamo.explain(_block_with)(x, w1, w2, two)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        torch.compiler.reset()
        compiled = torch.compile(lambda t, c: mpt.all_gather(t, c), backend="aot_eager", fullgraph=True)
        assert compiled(x, two).shape == (16, 16)
        assert compiled(x, four).shape == (32, 16)
        out = torch.compile(_block_with, backend="aot_eager", fullgraph=True)(x, w1, w2, two)
        assert out.shape == (8, 16)
        out.sum().backward()
        assert x.grad.shape == x.shape and w1.grad.shape == w1.shape and w2.grad.shape == w2.shape
    finally:
        mpt.forget(two), mpt.forget(four)



def test_point_to_point_shapes_gradient_and_refusals() -> None:
    x = meta(6, 2, dtype=torch.float64)
    assert OPS.send_recv(x, NAME, 1, 0).shape == (6, 2)
    assert OPS.recv([3, 5], torch.float16, torch.device("meta"), NAME, 0).dtype == torch.float16
    # The gradient goes back the way the data came: to recv_from, from send_to.
    assert _backward_ops(lambda t: OPS.send_recv(t, NAME, 1, 0), x) == ["mpbind.send_recv.default"]
    with pytest.raises(UsageError, match="send_to and recv_from must be ranks"):
        OPS.send_recv(x, NAME, -1, 0)
    with pytest.raises(UsageError, match="negative extents"):
        OPS.recv([3, -1], torch.float32, torch.device("meta"), NAME, 0)
    with pytest.raises(UsageError, match="takes CUDA tensors"):
        OPS.send(torch.ones(2), NAME, 0)


def test_recv_refuses_a_size_past_int64_before_anything() -> None:
    with pytest.raises(UsageError, match="recv's size in bytes"):
        mpt.recv((2**32, 2**31), torch.float32, NAME, 0)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, not str"):
        mpt.recv((2,), "float32", NAME, 0)


def test_a_compiled_send_is_refused_not_dropped() -> None:
    # A compiled graph drops an operator without an output, and the peer would wait for ever.
    torch.compiler.reset()
    with pytest.raises(Exception, match=r"UsageError\(.mpbind::send has no output, so a compiled graph would drop"):
        torch.compile(lambda t: OPS.send(t, NAME, 1), backend="aot_eager", fullgraph=True)(meta(4))


def _fft_plan(serial: int, shape: tuple[int, ...], dtype: str, nranks: int, rank: int) -> Any:
    """An FFTPlan of the planner's real decision for `rank` of `nranks`, over a stand-in core: what the
    fake kernels read (shapes, dtypes, kind) without cuFFTMp."""
    from mpbind.fft import FFTPlan
    from mpbind.fft._planner import plan_fft

    p = FFTPlan._over(_CoreStandIn(serial, nranks))
    p._place(plan_fft(shape, dtype, nranks), rank, 0, None)
    return p


def test_the_fft_operator_takes_the_plans_shapes_and_dtypes() -> None:
    c2c, r2c = _fft_plan(10_000_011, (8, 6, 4), "complex64", 2, 1), _fft_plan(10_000_012, (8, 6, 4), "float32", 2, 0)
    try:
        x = meta(*c2c.input_shape, dtype=torch.complex64)
        checked = torch.library.opcheck(OPS.fft.default, (x, mpt.name_of(c2c), mpt.FORWARD, ""))
        assert set(checked.values()) == {"SUCCESS"}, checked
        y = mpt.fft(x, c2c)
        assert y.shape == c2c.output_shape and y.dtype == torch.complex64
        assert mpt.fft(y, c2c, "inverse").shape == c2c.input_shape
        assert _backward_ops(lambda t: torch.view_as_real(mpt.fft(t, c2c)), x) == ["mpbind.fft.default"]  # the inverse
        half = mpt.fft(meta(*r2c.input_shape), r2c)
        assert half.shape == r2c.output_shape and half.dtype == torch.complex64
        with pytest.raises(UsageError, match="a r2c plan transforms FORWARD"):
            mpt.fft(meta(*r2c.input_shape), r2c, "inverse")
        with pytest.raises(UsageError, match=r"input must be complex64 of shape \(4, 6, 4\), not float32 of shape"):
            mpt.fft(meta(4, 6, 4), c2c)
        with pytest.raises(UsageError, match=r"a gradient through r2c plan FFTPlan#10000012 needs its c2r plan back"):
            mpt.fft(meta(*r2c.input_shape), r2c).abs().sum().backward()
        with pytest.raises(TypeError, match="plan must be an mpbind.fft.FFTPlan or its registered name, not int"):
            mpt.fft(x, 3)
        torch.compiler.reset()
        loss = torch.compile(lambda t, p: mpt.fft(t, p).abs().square().sum(), backend="aot_eager", fullgraph=True)
        loss(x, c2c).backward()
        assert x.grad.shape == x.shape
    finally:
        mpt.forget(c2c), mpt.forget(r2c)


def test_r2c_and_c2r_gradients_run_through_the_plan_of_the_other_kind() -> None:
    from mpbind.fft._planner import plan_fft

    r2c = _fft_plan(10_000_021, (8, 6, 5), "float32", 2, 1)
    c2r = _fft_plan(10_000_022, (8, 6, 5), "complex64", 2, 1)
    c2r._place(plan_fft((8, 6, 5), "complex64", 2, kind="c2r", input=r2c.spec.output, output=r2c.spec.input), 1, 0,
               None)
    c2c = _fft_plan(10_000_023, (8, 6, 4), "complex64", 2, 1)
    try:
        x = meta(*r2c.input_shape)
        assert set(torch.library.opcheck(OPS.fft.default, (x, mpt.name_of(r2c), mpt.FORWARD, mpt.name_of(c2r))
                                         ).values()) == {"SUCCESS"}
        assert _backward_ops(lambda t: torch.view_as_real(mpt.fft(t, r2c, reverse=c2r)), x) == ["mpbind.fft.default"]
        z = meta(*c2r.input_shape, dtype=torch.complex64)
        y = mpt.fft(z, c2r, reverse=r2c)  # INVERSE, a C2R plan's only direction, by default
        assert y.shape == r2c.input_shape and y.dtype == torch.float32
        y.sum().backward()
        assert z.grad.shape == z.shape and z.grad.dtype == torch.complex64
        with pytest.raises(UsageError, match="reverse .* must be a c2r plan of the global shape"):
            mpt.fft(x, r2c, reverse=c2c)
        with pytest.raises(UsageError, match="a c2c plan's gradient runs through"):
            mpt.fft(meta(*c2c.input_shape, dtype=torch.complex64), c2c, reverse=r2c)
        # rank 0's C2R: pieces of the same shapes, elsewhere in the spectrum (its bins would be weighed wrong)
        elsewhere = _fft_plan(10_000_024, (8, 6, 5), "complex64", 2, 0)
        elsewhere._place(plan_fft((8, 6, 5), "complex64", 2, kind="c2r", input=r2c.spec.output,
                                  output=r2c.spec.input), 0, 0, None)
        assert (elsewhere.input_shape, elsewhere.output_shape) == (c2r.input_shape, c2r.output_shape)
        with pytest.raises(UsageError, match="must be a c2r plan of the global shape .* from this plan's output piece"):
            mpt.fft(x, r2c, reverse=elsewhere)
        mpt.forget(elsewhere)
    finally:
        mpt.forget(r2c), mpt.forget(c2r), mpt.forget(c2c)


@pytest.mark.parametrize(("n", "lo", "up", "interior"), [
    (8, 0, 5, (1, 4)),    # even n: bins 1..3 (4 is the Nyquist bin)
    (7, 0, 4, (1, 4)),    # odd n: bins 1..3, no Nyquist bin
    (8, 2, 5, (0, 2)),    # a piece from bin 2: its bins 2 and 3
    (8, 4, 5, (0, 0)),    # the Nyquist bin alone
    (9, 3, 5, (0, 2)),    # odd: bins 3 and 4 both interior
])
def test_the_interior_bins_of_a_piece(n: int, lo: int, up: int, interior: tuple[int, int]) -> None:
    from types import SimpleNamespace

    from mpbind.distributions import Box
    from mpbind.fft import FFTPlan

    plan = SimpleNamespace(spec=SimpleNamespace(kind="r2c", shape=(4, n)), output_box=Box((0, lo), (4, up)))
    s = FFTPlan.hermitian_interior.fget(plan)  # type: ignore[attr-defined]
    assert (s.start, s.stop) == interior


def _reshape_plan(serial: int, source: Any, target: Any, rank: int) -> Any:
    """A ReshapePlan of the planner's real decision for `rank`, over a stand-in core (no cuFFTMp)."""
    from mpbind.fft import ReshapePlan
    from mpbind.fft._planner import plan_reshape

    p = ReshapePlan._over(_CoreStandIn(serial, source.nranks))
    p._place(plan_reshape(source, target, "float32"), rank, 0, None)
    return p


def test_the_reshape_operator_and_its_gradient_through_the_plan_back() -> None:
    from mpbind import distributions as dist

    by_x, by_y = dist.Split((8, 6, 4), 2, 0), dist.Split((8, 6, 4), 2, 1)
    there, back = _reshape_plan(10_000_031, by_x, by_y, 1), _reshape_plan(10_000_032, by_y, by_x, 1)
    try:
        x = meta(*there.input_shape)
        checked = torch.library.opcheck(OPS.reshape.default, (x, mpt.name_of(there), mpt.name_of(back)))
        assert set(checked.values()) == {"SUCCESS"}, checked
        assert mpt.reshape(x, there, reverse=back).shape == there.output_shape == (8, 3, 4)
        assert _backward_ops(lambda t: mpt.reshape(t, there, reverse=back), x) == ["mpbind.reshape.default"]
        with pytest.raises(UsageError, match="needs the plan back"):
            mpt.reshape(x, there).sum().backward()
        with pytest.raises(UsageError, match=r"reverse \(ReshapePlan#10000031\) must move"):
            mpt.reshape(x, there, reverse=there)
    finally:
        mpt.forget(there), mpt.forget(back)


# --- the planned matmul ---


def _planned(serial: int, rank: int, **decision: Any) -> Any:
    """A PlannedMatmul of the planner's real decision for `rank`, over a stand-in core: what the fake
    kernels and the gradient checks read (pieces, transposes, alpha) without cuBLASMp."""
    from mpbind.matmul import PlannedMatmul
    from mpbind.matmul._planner import plan as decide

    p = PlannedMatmul.__new__(PlannedMatmul)
    p.plan = decide(compute_capability=None, **decision)
    p._core, p._rank = _CoreStandIn(serial, 2), rank
    return p


def _tp_layer(serial: int, transa: bool = True, transb: bool = False, alpha: float = 1.0) -> Any:
    # h^T (F x T) = W^T x^T: W (H x F) by columns, x^T (H x T) by columns, h^T by rows; 2 ranks, rank 1
    from mpbind import distributions as dist

    H, F, T = 16, 24, 8
    a = dist.by_columns((H, F), 2) if transa else dist.by_rows((F, H), 2)
    b = dist.by_columns((H, T), 2) if not transb else dist.by_rows((T, H), 2)
    return _planned(serial, 1, a=a, b=b, d=dist.by_rows((F, T), 2), a_dtype="float32", transa=transa,
                    transb=transb, alpha=alpha)


def _gradients_of(fwd: Any, serial: int) -> tuple[Any, Any]:
    """Stand-ins of the plans of dA and dB for `fwd` (the decisions gradient_plans would make)."""
    from mpbind.torch._matmul_ops import gradient_operands

    p = fwd.plan
    dists = {"a": p.a.distribution, "b": p.b.distribution, "g": p.d.distribution}
    made = []
    for i, which in enumerate("ab"):
        first, second, transa, transb = gradient_operands(p, which)
        made.append(_planned(serial + i, fwd._rank, a=dists[first], b=dists[second], d=dists[which], a_dtype="float32",
                             transa=transa, transb=transb, alpha=p.alpha))
    return made[0], made[1]


def test_the_matmul_operator_takes_the_plans_pieces_and_its_gradient_runs_through_two_plans() -> None:
    fwd = _tp_layer(10_000_031)
    ga, gb = _gradients_of(fwd, 10_000_032)
    try:
        pieces = fwd.launch_pieces()  # column-major (rows, cols): the tensors are their transposes
        a, b = (meta(*pieces[k][0][::-1]) for k in ("a", "b"))
        names = [mpt.name_of(p) for p in (fwd, ga, gb)]
        checked = torch.library.opcheck(OPS.matmul.default, (a, b, None, *names))
        assert set(checked.values()) == {"SUCCESS"}, checked
        d = mpt.matmul(a, b, fwd, grad_a=ga, grad_b=gb)
        assert tuple(d.shape) == pieces["d"][0][::-1] and d.dtype == torch.float32
        # with B needing no gradient, the backward is one product: dA through grad_a
        assert _backward_ops(lambda x, y: mpt.matmul(x, y, fwd, grad_a=ga, grad_b=gb), a, b.detach()) == \
            ["mpbind.matmul.default"]
        a.grad = None
        mpt.matmul(a, b, fwd, grad_a=ga, grad_b=gb).sum().backward()
        assert a.grad.shape == a.shape and b.grad.shape == b.shape
        with pytest.raises(UsageError, match=r"a must be float32 of shape \(12, 16\)"):
            mpt.matmul(b, b, fwd)
        with pytest.raises(UsageError, match="was planned without c"):
            mpt.matmul(a, b, fwd, meta(*pieces["d"][0][::-1]))
        with pytest.raises(UsageError, match="with respect to a needs its plan"):
            mpt.matmul(a, b, fwd).sum().backward()
        with pytest.raises(UsageError, match=r"grad_a \(PlannedMatmul#10000033\) must compute da"):
            mpt.matmul(a, b.detach(), fwd, grad_a=gb).sum().backward()
        torch.compiler.reset()
        explained = torch._dynamo.explain(lambda x, y: mpt.matmul(x, y, fwd, grad_a=ga, grad_b=gb))(a, b)
        assert explained.graph_break_count == 0
    finally:
        for p in (fwd, ga, gb):
            mpt.forget(p)


@pytest.mark.parametrize(("transa", "transb"), [(False, False), (False, True), (True, False), (True, True)])
def test_the_gradient_plans_compute_the_adjoint_products(transa: bool, transb: bool) -> None:
    # dense NumPy matrices: the products the gradient plans run give the gradients of alpha op(A) op(B)
    import numpy as np

    from mpbind.torch._matmul_ops import gradient_operands

    class P:
        pass

    p = P()
    p.transa, p.transb = transa, transb  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    m, n, k, alpha = 3, 4, 5, 1.5
    A = rng.standard_normal((k, m) if transa else (m, k))
    B = rng.standard_normal((n, k) if transb else (k, n))

    def op(x: Any, t: bool) -> Any:
        return x.T if t else x

    G = rng.standard_normal((m, n))
    want = {"a": alpha * (op(G @ op(B, transb).T, transa)), "b": alpha * op(op(A, transa).T @ G, transb)}
    mats = {"a": A, "b": B, "g": G}
    for which in "ab":
        first, second, ta, tb = gradient_operands(p, which)
        got = alpha * op(mats[first], ta) @ op(mats[second], tb)
        assert np.allclose(got, want[which]), which


# --- the collective matmul ---


def _collective_plan(serial: int, m: int, k: int, n: int, dtype: str, n_pes: int) -> Any:
    """An AllGatherMatmul's description without NVSHMEM: what the fake kernel reads."""
    from mpbind.collective import AllGatherMatmul

    p = AllGatherMatmul.__new__(AllGatherMatmul)
    p.m, p.k, p.n, p.dtype, p.n_pes, p.pe, p.method = m, k, n, dtype, n_pes, 0, "host"
    p._serial, p._closed = serial, False
    return p


def test_the_collective_matmul_operator() -> None:
    p = _collective_plan(10_000_041, 5, 8, 6, "bfloat16", 3)  # an odd m: uneven halves
    try:
        x, w = meta(5, 8, dtype=torch.bfloat16, grad=False), meta(8, 6, dtype=torch.bfloat16, grad=False)
        checked = torch.library.opcheck(OPS.all_gather_matmul.default, (x, w, mpt.name_of(p)))
        assert set(checked.values()) == {"SUCCESS"}, checked
        out = mpt.all_gather_matmul(x, w, p)
        assert tuple(out.shape) == (15, 6) and out.dtype == torch.bfloat16
        with pytest.raises(UsageError, match=r"x must be bfloat16 \[5, 8\] \(this PE's rows\), not float16 \[5, 8\]"):
            mpt.all_gather_matmul(x.to(torch.float16), w, p)
        with pytest.raises(UsageError, match=r"w must be bfloat16 \[8, 6\]"):
            mpt.all_gather_matmul(x, meta(6, 8, dtype=torch.bfloat16, grad=False), p)
        with pytest.raises(UsageError, match="mpbind::all_gather_matmul has no gradient"):
            mpt.all_gather_matmul(x.requires_grad_(), w, p).float().sum().backward()
        torch.compiler.reset()
        explained = torch._dynamo.explain(lambda a, b: mpt.all_gather_matmul(a * 2, b, p))(x.detach(), w)
        assert explained.graph_break_count == 0
    finally:
        mpt.forget(p)
