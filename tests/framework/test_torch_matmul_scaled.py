"""The FP8 matmul with the scales of each call as a torch operator (``mpbind::matmul_scaled``, and
``mpbind.torch.matmul(..., scales=)``) without a GPU: its registration checked by
``torch.library.opcheck`` on meta tensors, the fake kernel's outputs (D of the plan's piece and type,
amax_d one float32 where planned, none elsewhere), a compiled function without a graph break, the
refusals (names, types, element counts, CPU tensors, a plan without scales, a captured plan, a
gradient), and the kernel's call of the plan's ``execute(scales=)``. The CUDA kernel, which calls
cuBLASMp, runs in tests/gpu/test_torch_matmul_gpu.py."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import mpbind.torch as mpt  # noqa: E402
from mpbind import distributions as dist  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402
from mpbind.torch import _matmul_ops  # noqa: E402

OPS = torch.ops.mpbind
F8 = torch.float8_e4m3fn
T, H, F = 32, 64, 96  # tokens, hidden, features: h (T x F) = x (T x H) W^T, W (F x H)


class _CoreStandIn:
    """What mpbind.torch reads of a plan's core on the way to an operator: serial, size, closed."""

    def __init__(self, serial: int, size: int) -> None:
        self.serial, self.size, self.closed = serial, size, False


def _planned(serial: int, rank: int = 1, captured: bool = False, **decision: Any) -> Any:
    """A PlannedMatmul of the planner's real decision for `rank`, over a stand-in core: what the fake
    kernel reads (pieces, scales, whether it is captured) without cuBLASMp."""
    from mpbind.matmul import PlannedMatmul
    from mpbind.matmul._planner import plan as decide

    p = PlannedMatmul.__new__(PlannedMatmul)
    p.plan = decide(compute_capability=None, **decision)
    p._core, p._rank = _CoreStandIn(serial, 2), rank
    p._matmul = SimpleNamespace(captured=captured)
    return p


def _fp8_layer(serial: int, d_dtype: str = "bfloat16", scales: tuple[str, ...] = ("a", "b"), **options: Any) -> Any:
    """The column-major h^T = W x^T over two ranks (W by columns of W^T, x^T by tokens, h^T by features): an
    FP8 TN product, as cuBLASLt takes FP8."""
    return _planned(serial, a=dist.by_columns((H, F), 2), b=dist.by_columns((H, T), 2), d=dist.by_rows((F, T), 2),
                    a_dtype="float8_e4m3fn", d_dtype=d_dtype, transa=True, scales=scales, **options)


def meta(*shape: int, dtype: Any = torch.float32) -> Any:
    return torch.empty(shape, device="meta", dtype=dtype)


def operands(p: Any) -> tuple[Any, Any]:
    """Meta tensors of this rank's A and B (the transposes of the column-major pieces)."""
    pieces = p.launch_pieces()
    return (meta(*pieces[k][0][::-1], dtype=getattr(torch, pieces[k][1])) for k in ("a", "b"))  # type: ignore[return-value]


@pytest.fixture
def plans() -> Iterator[dict[str, Any]]:
    made = {
        "bf16": _fp8_layer(10_000_101),                                                    # D bfloat16: a, b
        "fp8": _fp8_layer(10_000_102, "float8_e4m3fn", ("a", "b", "d", "amax_d")),          # D FP8: a, b, d, amax_d
        "plain": _planned(10_000_103, a=dist.by_columns((H, F), 2), b=dist.by_columns((H, T), 2),
                          d=dist.by_rows((F, T), 2), a_dtype="bfloat16", transa=True),      # no scales
        "captured": _fp8_layer(10_000_104, captured=True),
    }
    yield made
    for p in made.values():
        mpt.forget(p)


def test_the_schema_and_opcheck(plans: dict[str, Any]) -> None:
    schema = str(OPS.matmul_scaled.default._schema)
    assert schema == ("mpbind::matmul_scaled(Tensor a, Tensor b, Tensor? c, Tensor? scale_a, Tensor? scale_b, "
                      "Tensor? scale_d, str plan) -> (Tensor d, Tensor amax_d)")
    for key, scales in (("bf16", (meta(1), meta(1), None)), ("fp8", (meta(1), meta(1), meta(1)))):
        a, b = operands(plans[key])
        checked = torch.library.opcheck(OPS.matmul_scaled.default, (a, b, None, *scales, mpt.name_of(plans[key])))
        assert set(checked.values()) == {"SUCCESS"}, (key, checked)


def test_the_fake_kernels_outputs(plans: dict[str, Any]) -> None:
    a, b = operands(plans["fp8"])
    assert tuple(a.shape) == (F // 2, H) and tuple(b.shape) == (T // 2, H)  # W's and x's rows of this rank
    d, amax = OPS.matmul_scaled(a, b, None, meta(1), meta(1), meta(), mpt.name_of(plans["fp8"]))  # a 0-d scale too
    # D: this rank's piece of h^T, F/2 x T column-major, i.e. a (T, F/2) tensor
    assert tuple(d.shape) == (T, F // 2) and d.dtype == F8
    assert tuple(amax.shape) == (1,) and amax.dtype == torch.float32
    d, amax = OPS.matmul_scaled(*operands(plans["bf16"]), None, meta(1), meta(1), None, mpt.name_of(plans["bf16"]))
    assert tuple(d.shape) == (T, F // 2) and d.dtype == torch.bfloat16
    assert tuple(amax.shape) == (0,) and amax.dtype == torch.float32  # the plan has no amax_d


def test_the_function_returns_amax_d_where_planned(plans: dict[str, Any]) -> None:
    a, b = operands(plans["fp8"])
    d, amax = mpt.matmul(a, b, plans["fp8"], scales={"a": meta(1), "b": meta(1), "d": meta(1)})
    assert d.dtype == F8 and tuple(amax.shape) == (1,)
    d = mpt.matmul(a, b, mpt.name_of(plans["bf16"]), scales={"a": meta(1), "b": meta(1)})  # by name; no amax_d
    assert isinstance(d, torch.Tensor) and tuple(d.shape) == (T, F // 2) and d.dtype == torch.bfloat16


def test_a_compiled_step_has_no_graph_break(plans: dict[str, Any]) -> None:
    p = plans["fp8"]
    a, b = operands(p)

    def step(w: Any, x: Any, sa: Any, sb: Any, sd: Any) -> Any:
        d, amax = mpt.matmul(w, x, p, scales={"a": sa, "b": sb, "d": sd})
        return d.float() * 2, amax

    torch.compiler.reset()
    explained = torch._dynamo.explain(step)(a, b, meta(1), meta(1), meta(1))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch.compiler.reset()
    d, amax = torch.compile(step, backend="aot_eager", fullgraph=True)(a, b, meta(1), meta(1), meta(1))
    assert tuple(d.shape) == (T, F // 2) and d.dtype == torch.float32 and tuple(amax.shape) == (1,)


@pytest.mark.parametrize(("key", "scales", "match"), [
    ("bf16", {"a": 1}, r"PlannedMatmul#10000101 was planned with scales a, b: scale_b must be given"),
    ("bf16", {"a": 1, "b": 1, "d": 1}, r"planned with scales a, b: scale_d must be None"),
    ("fp8", {"a": 1, "b": 1}, r"planned with scales a, b, d, amax_d: scale_d must be given"),
    ("bf16", {"a": 2, "b": 1}, r"mpbind::matmul_scaled: scale_a must hold 1 float32, not 2 float32"),
    ("bf16", {"a": torch.float16, "b": 1}, r"scale_a must hold 1 float32, not 1 float16"),
    ("plain", {"a": 1, "b": 1}, r"PlannedMatmul#10000103 was planned without scales .*use mpbind::matmul"),
    ("captured", {"a": 1, "b": 1}, r"PlannedMatmul#10000104 is captured and replays the scales it recorded"),
])
def test_the_operators_refusals(plans: dict[str, Any], key: str, scales: dict[str, Any], match: str) -> None:
    p = plans[key]
    a, b = operands(p)

    def tensor(spec: Any) -> Any:
        return meta(spec) if isinstance(spec, int) else meta(1, dtype=spec)

    args = [tensor(scales[k]) if k in scales else None for k in ("a", "b", "d")]
    with pytest.raises(UsageError, match=match):
        OPS.matmul_scaled(a, b, None, *args, mpt.name_of(p))


def test_the_operands_are_checked_as_mpbind_matmul_checks_them(plans: dict[str, Any]) -> None:
    p = plans["bf16"]
    a, b = operands(p)
    with pytest.raises(UsageError, match=r"mpbind::matmul_scaled: a must be float8_e4m3fn of shape \(48, 64\)"):
        OPS.matmul_scaled(a.to(torch.bfloat16), b, None, meta(1), meta(1), None, mpt.name_of(p))
    with pytest.raises(UsageError, match="mpbind::matmul_scaled: PlannedMatmul#10000101 was planned without c"):
        OPS.matmul_scaled(a, b, meta(T, F // 2, dtype=torch.bfloat16), meta(1), meta(1), None, mpt.name_of(p))


def test_the_functions_refusals(plans: dict[str, Any]) -> None:
    p = plans["bf16"]
    a, b = operands(p)
    with pytest.raises(UsageError, match="amax_d is not given: the operator returns it"):
        mpt.matmul(a, b, p, scales={"a": meta(1), "b": meta(1), "amax_d": meta(1)})
    with pytest.raises(UsageError, match=r"scales are named 'a', 'b' and 'd'; got 'x'"):
        mpt.matmul(a, b, p, scales={"a": meta(1), "b": meta(1), "x": meta(1)})
    with pytest.raises(TypeError, match="scales must be a dict of name -> tensor, not list"):
        mpt.matmul(a, b, p, scales=[meta(1), meta(1)])
    with pytest.raises(UsageError, match="no gradient here: grad_a and grad_b do not apply"):
        mpt.matmul(a, b, p, grad_a=p, scales={"a": meta(1), "b": meta(1)})


def test_cpu_tensors_are_refused(plans: dict[str, Any]) -> None:
    p = plans["bf16"]
    pieces = p.launch_pieces()
    a, b = (torch.zeros(pieces[k][0][::-1], dtype=F8) for k in ("a", "b"))
    one = torch.ones(1)
    with pytest.raises(UsageError, match="mpbind::matmul_scaled takes CUDA tensors, not a cpu tensor"):
        mpt.matmul(a, b, p, scales={"a": one, "b": one})
    with pytest.raises(UsageError, match="mpbind::matmul_scaled takes CUDA tensors, not a cpu tensor"):
        OPS.matmul_scaled(a, b, None, one, one, None, mpt.name_of(p))


def test_no_gradient(plans: dict[str, Any]) -> None:
    p = plans["bf16"]
    a, b = operands(p)
    d = mpt.matmul(a, b, p, scales={"a": meta(1).requires_grad_(), "b": meta(1)})
    with pytest.raises(UsageError, match="mpbind::matmul_scaled has no gradient"):
        d.float().sum().backward()


def test_block_scales_are_counted_for_this_ranks_piece() -> None:
    # MXFP8: one scale per 32 elements along K, in 128 x 4 tiles; this rank's A is 128 x 128 (k x m)
    p = _planned(10_000_111, a=dist.by_columns((128, 256), 2), b=dist.by_columns((128, 256), 2),
                 d=dist.by_rows((256, 256), 2), a_dtype="float8_e4m3fn", transa=True, scales=("a", "b"),
                 scaling="mxfp8")
    try:
        a, b = operands(p)
        blocks = meta(128 * 4, dtype=torch.uint8)
        d = mpt.matmul(a, b, p, scales={"a": blocks, "b": meta(128 * 4, dtype=torch.float8_e8m0fnu)})
        assert tuple(d.shape) == (256, 128) and d.dtype == torch.bfloat16
        with pytest.raises(UsageError, match="scale_b must hold 512 float8_e8m0fnu or uint8, not 1 float32"):
            mpt.matmul(a, b, p, scales={"a": blocks, "b": meta(1)})
    finally:
        mpt.forget(p)


def test_the_kernel_runs_the_plan_with_the_calls_scales(plans: dict[str, Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA kernel's wiring on CPU tensors: the device check and the stream are the GPU's, the
    # plan's execute a recorder.
    p = plans["fp8"]
    monkeypatch.setattr(_matmul_ops, "on_cuda", lambda t, what: None)
    monkeypatch.setattr(_matmul_ops, "stream_of", lambda t: 7)
    calls: list[tuple[Any, ...]] = []
    p.execute = lambda *arrays, stream=None, scales=None: calls.append((arrays, stream, scales))
    pieces = p.launch_pieces()
    a, b = (torch.zeros(pieces[k][0][::-1], dtype=F8) for k in ("a", "b"))
    sa, sb, sd = torch.tensor([0.5]), torch.tensor([2.0]), torch.tensor(4.0)
    d, amax = _matmul_ops.matmul_scaled_on(p, a, b, None, sa, sb, sd)
    ((given, stream, scales),) = calls
    assert stream == 7
    assert given[0].data_ptr() == a.data_ptr() and tuple(given[0].shape) == pieces["a"][0]  # the column-major pieces
    assert given[1].data_ptr() == b.data_ptr() and given[3] is None
    assert given[2].data_ptr() == d.data_ptr() and tuple(given[2].shape) == pieces["d"][0]
    assert sorted(scales) == ["a", "amax_d", "b", "d"]
    assert scales["a"] is sa and scales["d"] is sd and scales["amax_d"] is amax
    assert amax.shape == (1,) and float(amax) == 0.0  # zero before the library writes it
