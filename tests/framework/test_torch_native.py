"""The collectives' C++ operators (``mpbind::nccl_all_reduce``, ``nccl_all_gather``, ``nccl_reduce_scatter``,
``nccl_all_to_all``, ``nccl_all_reduce_``) without a GPU: registered into this PyTorch through its stable C
shim, checked by ``torch.library.opcheck`` on meta tensors, refusing a CPU tensor by name, and the autograd functions
that give each its adjoint, traced whole by ``torch.compile``. Their CUDA kernels run in the GPU suite."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import mpbind.torch  # noqa: E402,F401 - registers the operators
from mpbind import _core  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402
from mpbind.torch import _native  # noqa: E402

OPS = torch.ops.mpbind
LAUNCH = 7  # the fake kernels never look a communicator up


def meta(*shape: int, grad: bool = False) -> Any:
    return torch.randn(shape, device="meta", requires_grad=grad)


def test_the_operators_are_registered_through_the_shim() -> None:
    assert _core.torch_ops_registered()
    for name in ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_all_to_all", "nccl_all_reduce_"):
        assert hasattr(OPS, name)
    assert str(OPS.nccl_all_reduce.default._schema) == "mpbind::nccl_all_reduce(Tensor x, int comm, int op) -> Tensor"
    # the C++ operators run where torch has CUDA; this PyTorch says why not otherwise
    assert _native.AVAILABLE == bool(torch.version.cuda), _native.REASON
    assert _native.REDUCTION_CODES == {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}  # ncclRedOp_t


@pytest.mark.parametrize(("op", "args"), [
    (lambda: OPS.nccl_all_reduce.default, lambda: (meta(4, 3), LAUNCH, 0)),
    (lambda: OPS.nccl_all_gather.default, lambda: (meta(4, 3), LAUNCH, 2)),
    (lambda: OPS.nccl_reduce_scatter.default, lambda: (meta(4, 3), LAUNCH, 4, 2)),
    (lambda: OPS.nccl_all_to_all.default, lambda: (meta(4, 3), LAUNCH)),
    (lambda: OPS.nccl_all_reduce_.default, lambda: (meta(4, 3), LAUNCH, 0)),
], ids=["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_reduce_in_place"])
def test_opcheck(op: Callable[[], Any], args: Callable[[], tuple[Any, ...]]) -> None:
    result = torch.library.opcheck(op(), args())
    assert set(result.values()) == {"SUCCESS"}, result


def test_output_shapes_and_refusals() -> None:
    assert OPS.nccl_all_gather(meta(4, 3), LAUNCH, 3).shape == (12, 3)
    assert OPS.nccl_all_gather(meta(), LAUNCH, 5).shape == (5,)
    assert OPS.nccl_reduce_scatter(meta(6, 2), LAUNCH, 0, 3).shape == (2, 2)
    assert OPS.nccl_all_to_all(meta(6, 2), LAUNCH).shape == (6, 2)
    with pytest.raises(UsageError, match=r"dim 0 of a \(6, 2\) tensor does not split into 4 equal blocks"):
        OPS.nccl_reduce_scatter(meta(6, 2), LAUNCH, 0, 4)
    with pytest.raises(RuntimeError, match="mpbind::nccl_all_reduce takes CUDA tensors, not a cpu tensor"):
        OPS.nccl_all_reduce(torch.ones(4), LAUNCH, 0)  # the kernel itself, before any communicator
    with pytest.raises(RuntimeError, match="mpbind::nccl_all_gather takes CUDA tensors"):
        OPS.nccl_all_gather(torch.ones(4), LAUNCH, 2)


def _backward_ops(fn: Callable[[Any], Any], x: Any) -> list[str]:
    """The mpbind operators in the backward graph AOT autograd makes for `fn` on meta tensors."""
    from torch._functorch.aot_autograd import aot_function

    seen: list[str] = []

    def backward(gm: Any, _: Any) -> Any:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "mpbind" in str(n.target))
        return gm

    aot_function(fn, fw_compiler=lambda gm, _: gm, bw_compiler=backward)(x).sum().backward()
    return seen


@pytest.mark.parametrize(("fn", "adjoint"), [
    (lambda x: _native.AllReduce.apply(x, LAUNCH, "sum"), ["mpbind.nccl_all_reduce.default"]),
    (lambda x: _native.AllReduce.apply(x, LAUNCH, "avg"), ["mpbind.nccl_all_reduce.default"]),
    (lambda x: _native.AllGather.apply(x, LAUNCH, 2), ["mpbind.nccl_reduce_scatter.default"]),
    (lambda x: _native.ReduceScatter.apply(x, LAUNCH, "sum", 2), ["mpbind.nccl_all_gather.default"]),
    (lambda x: _native.AllToAll.apply(x, LAUNCH), ["mpbind.nccl_all_to_all.default"]),
    (lambda x: _native.CopyToGroup.apply(x, LAUNCH), ["mpbind.nccl_all_reduce.default"]),
    (lambda x: _native.ReduceFromGroup.apply(x, LAUNCH), []),
    (lambda x: _native.CopyToGroup.apply(x, "Communicator#1"), ["mpbind.all_reduce.default"]),  # by name: Python's
], ids=["all_reduce.sum", "all_reduce.avg", "all_gather", "reduce_scatter", "all_to_all", "copy_to_group",
        "reduce_from_group", "copy_to_group.by_name"])
def test_each_gradient_is_the_adjoint_collective(fn: Callable[[Any], Any], adjoint: list[str]) -> None:
    x = meta(8, 4, grad=True)
    assert _backward_ops(fn, x) == adjoint
    assert x.grad is not None and x.grad.shape == x.shape


def test_a_max_has_no_gradient() -> None:
    with pytest.raises(UsageError, match="an all-reduce max has no gradient here"):
        _native.AllReduce.apply(meta(4, grad=True), LAUNCH, "max").sum().backward()
    with pytest.raises(UsageError, match="a reduce-scatter min has no gradient here"):
        _native.ReduceScatter.apply(meta(4, grad=True), LAUNCH, "min", 2).sum().backward()


def _block(x: Any, w1: Any, w2: Any) -> Any:
    h = torch.relu(_native.CopyToGroup.apply(x, LAUNCH) @ w1)
    y = _native.ReduceFromGroup.apply(h @ w2, LAUNCH)
    return _native.ReduceScatter.apply(_native.AllGather.apply(y, LAUNCH, 2), LAUNCH, "sum", 2)


def test_a_block_of_the_autograd_functions_compiles_whole_forward_and_backward() -> None:
    x, w1, w2 = meta(8, 16, grad=True), meta(16, 32, grad=True), meta(32, 16, grad=True)
    explained = torch._dynamo.explain(_block)(x, w1, w2)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch.compiler.reset()
    out = torch.compile(_block, backend="aot_eager", fullgraph=True)(x, w1, w2)
    assert out.shape == (8, 16)
    out.sum().backward()
    assert x.grad.shape == x.shape and w1.grad.shape == w1.shape and w2.grad.shape == w2.shape


def test_a_gradient_is_recorded_only_where_one_is_wanted() -> None:
    assert not _native.wants_grad(meta(2))
    leaf = meta(2, grad=True)
    assert _native.wants_grad(leaf)
    with torch.no_grad():
        assert not _native.wants_grad(leaf)


def test_the_shim_is_found_by_the_loaded_librarys_name_wherever_it_lies() -> None:
    # A PyTorch whose libraries lie elsewhere than torch/lib (a distribution's own layout) is found by
    # the loaded library's name; a library that is not loaded is never loaded a second time.
    import subprocess
    import sys

    code = ("import torch\nfrom mpbind import _core\n"
            "try:\n    _core.torch_ops_register('/nowhere/libnot_torch.so', '')\nexcept RuntimeError as e:\n"
            "    print('refused:', e)\n"
            "print(_core.torch_ops_register('/nowhere/libtorch_cpu.so', ''), _core.torch_ops_registered())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "refused: libtorch_cpu is not loaded from /nowhere/libnot_torch.so (import torch first)" in out, out
    names = ["nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_all_to_all", "nccl_all_reduce_"]
    assert f"{names} True" in out, out


def test_the_eager_gate_reads_torchs_tensors_and_leaves_what_it_cannot_run() -> None:
    # torch.Tensor's DLPack C exchange API has what the eager kernels need (an allocator, a way back to
    # Python, the current stream); the gate runs where the C++ operators do.
    from mpbind.torch import _library

    assert _core.torch_eager_ready(torch.empty(0))
    # its outputs made as the kernels make theirs, handed over by libtorch_python (a subclass's: DLPack's)
    assert _core.torch_ops_wraps(torch.Tensor) and not _core.torch_ops_wraps(torch.nn.Parameter)
    assert (_native.GATE is not None) == _native.AVAILABLE

    class Comm:
        _launch = LAUNCH

    gate = _core.torch_eager_gate(torch.Tensor, Comm, _library.SEEN_BY, torch.is_grad_enabled)
    x = torch.ones(4)
    assert gate(_native.K_ALL_REDUCE, x, Comm(), "sum") is None  # host memory: the dispatcher's, which refuses it
    assert gate(_native.K_ALL_REDUCE, torch.nn.Parameter(x), Comm(), "sum") is None  # a subclass
    with pytest.raises(UsageError, match="only an all-reduce works in place"):
        gate(_native.K_ALL_GATHER, x, Comm(), None, True)
