"""mpbind's torch operators on one GPU with one NCCL rank: every operator against its one-rank reference
(the input itself, whatever the dtype, complex included), inside a CUDA graph and replayed on new data,
inside ``torch.compile(fullgraph=True)`` (inductor, and ``mode="reduce-overhead"``) against eager, and
their gradients by ``torch.autograd.gradcheck`` in double precision. Several ranks need several GPUs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import mpbind.torch as mpt  # noqa: E402
from mpbind import nccl  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402


@pytest.fixture(scope="module")
def comm(nccl_one_rank: nccl.Communicator) -> nccl.Communicator:
    return nccl_one_rank


OPS: dict[str, Callable[[Any, Any], Any]] = {
    "all_reduce.sum": lambda x, c: mpt.all_reduce(x, c),
    "all_reduce.avg": lambda x, c: mpt.all_reduce(x, c, "avg"),
    "all_reduce.max": lambda x, c: mpt.all_reduce(x, c, "max"),
    "all_gather": lambda x, c: mpt.all_gather(x, c),
    "reduce_scatter": lambda x, c: mpt.reduce_scatter(x, c),
    "all_to_all": lambda x, c: mpt.all_to_all(x, c),
    "broadcast": lambda x, c: mpt.broadcast(x, c, 0),
    "send_recv": lambda x, c: mpt.send_recv(x, c, 0, 0),  # to and from itself
    "copy_to_group": lambda x, c: mpt.copy_to_group(x, c),
    "reduce_from_group": lambda x, c: mpt.reduce_from_group(x, c),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "int32"])
@pytest.mark.parametrize("name", list(OPS))
def test_each_operator_on_one_rank_is_the_identity(comm: nccl.Communicator, name: str, dtype: str) -> None:
    if name == "all_reduce.avg" and dtype == "int32":
        pytest.skip("an average of integers is not an integer")
    x = (torch.arange(24, device="cuda") - 7).to(getattr(torch, dtype)).reshape(6, 4)
    y = OPS[name](x.t(), comm)  # a transposed (non-contiguous) input too
    torch.cuda.synchronize()
    assert y.dtype == x.dtype and torch.equal(y, x.t()), name
    assert y.data_ptr() != x.data_ptr() or name == "copy_to_group"  # a new tensor (copy_to_group: a view)


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_complex_tensors_are_reduced_as_their_real_view(comm: nccl.Communicator, op: str) -> None:
    x = torch.randn(5, 3, dtype=torch.complex64, device="cuda")
    assert torch.equal(mpt.all_reduce(x, comm, op), x)
    with pytest.raises(UsageError, match="max of complex tensors"):
        mpt.all_reduce(x, comm, "max")


def test_all_reduce_in_place_and_the_registry(comm: nccl.Communicator) -> None:
    x = torch.ones(8, device="cuda")
    assert mpt.all_reduce_(x, comm) is x and torch.equal(x, torch.ones(8, device="cuda"))
    name = mpt.name_of(comm)
    assert name == f"Communicator#{comm.serial}" and name in mpt.registered() and mpt.lookup(name, nccl.Communicator)
    assert torch.equal(mpt.all_gather(x, name), x)  # the name works where the communicator does


def test_a_cuda_graph_captures_the_operators(comm: nccl.Communicator) -> None:
    static = torch.zeros(16, 4, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture wants
        mpt.all_reduce(static, comm)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mpt.reduce_scatter(mpt.all_gather(mpt.all_reduce(static, comm), comm), comm)
    for seed in range(3):
        new = torch.randn(16, 4, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
        static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, new)


def _block(x: Any, w1: Any, w2: Any, comm: nccl.Communicator) -> Any:
    h = torch.relu(mpt.copy_to_group(x, comm) @ w1)
    return mpt.reduce_from_group(h @ w2, comm)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_block_matches_eager_forward_and_backward(comm: nccl.Communicator, mode: str) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w1, w2 = (torch.randn(s, device="cuda", generator=g, requires_grad=True) for s in ((8, 16), (16, 32), (32, 16)))
    eager = _block(x, w1, w2, comm)
    eager.sum().backward()
    want = [t.grad.clone() for t in (x, w1, w2)]
    for t in (x, w1, w2):
        t.grad = None
    torch.compiler.reset()
    compiled = torch.compile(_block, fullgraph=True, mode=mode)  # fullgraph: a graph break raises
    for _ in range(3):  # reduce-overhead records its graph on a later call
        for t in (x, w1, w2):
            t.grad = None
        out = compiled(x, w1, w2, comm)
        out.sum().backward()
    torch.testing.assert_close(out, eager)
    for t, w in zip((x, w1, w2), want, strict=True):
        torch.testing.assert_close(t.grad, w)


@pytest.mark.parametrize("name", ["all_reduce.sum", "all_reduce.avg", "all_gather", "reduce_scatter", "all_to_all",
                                  "copy_to_group", "reduce_from_group", "send_recv"])
def test_gradcheck_in_double_precision(comm: nccl.Communicator, name: str) -> None:
    x = torch.randn(4, 3, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: OPS[name](t, comm), (x,))


def test_send_and_recv_in_one_group(comm: nccl.Communicator) -> None:
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    with nccl.group():  # a rank sending to itself: both halves in one group
        mpt.send(x, comm, 0)
        y = mpt.recv((3, 4), torch.float32, comm, 0)
    torch.cuda.synchronize()
    assert torch.equal(y, x)
    with pytest.raises(UsageError, match="peer 1 is not a rank"):
        mpt.recv((2,), torch.float32, comm, 1)


def test_a_compiled_function_with_the_communicator_recompiles_for_another(comm: nccl.Communicator) -> None:
    other = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    try:
        torch.compiler.reset()
        f = torch.compile(lambda t, c: mpt.all_gather(t, c) * 2, fullgraph=True)
        x = torch.ones(3, device="cuda")
        assert torch.equal(f(x, comm), 2 * x) and torch.equal(f(x, other), 2 * x)
        other.close()
        with pytest.raises(Exception, match="is closed"):  # the second graph held the closed one's name
            f(x, other)
    finally:
        other.close()


def test_a_closed_communicator_is_refused_by_name() -> None:
    c = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    name = mpt.name_of(c)
    c.close()
    with pytest.raises(UsageError, match="is closed"):
        mpt.all_reduce(torch.ones(2, device="cuda"), name)


def test_eager_calls_skip_the_dispatcher_only_when_nothing_needs_it(comm: nccl.Communicator) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    from mpbind.torch import _ops

    x = torch.ones(4, device="cuda")
    assert _ops.direct_call(x)
    leaf = torch.ones(4, device="cuda", requires_grad=True)
    assert not _ops.direct_call(leaf)  # a gradient to record: the autograd kernel must see it
    with torch.no_grad():
        assert _ops.direct_call(leaf)
    assert not _ops.direct_call(torch.ones(4))  # CPU: the dispatcher refuses it, naming the device

    seen: list[str] = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen():
        assert not _ops.direct_call(x)
        mpt.all_reduce(x, comm)
    native = "mpbind.nccl_all_reduce.default" if mpt.CPP_OPERATORS else "mpbind.all_reduce.default"
    assert native in seen  # the mode saw the operator
    # Both paths give the same result, and the gradient of the dispatcher's path is the adjoint.
    y = torch.arange(6.0, device="cuda")
    assert torch.equal(mpt.all_gather(y, comm), torch.ops.mpbind.all_gather(y, mpt.name_of(comm), 1))


def test_the_cpp_operators_run_the_collectives_here(comm: nccl.Communicator) -> None:
    # Where torch has CUDA the functions run the C++ operators (mpbind::nccl_all_reduce, ...), eagerly and
    # in compiled code, which calls them with no Python kernel; they refuse what they cannot run.
    from torch._inductor.utils import run_and_get_code

    assert mpt.CPP_OPERATORS, mpt.CPP_OPERATORS_REASON
    ops = torch.ops.mpbind
    x = torch.randn(6, 4, device="cuda")
    assert torch.equal(ops.nccl_all_reduce(x, comm.launch_id, 0), x)
    torch.compiler.reset()
    f = torch.compile(lambda t: mpt.reduce_scatter(mpt.all_gather(mpt.all_reduce(t * 2, comm), comm), comm),
                      fullgraph=True)
    out, code = run_and_get_code(f, x)
    assert torch.equal(out, 2 * x)
    assert all(f"torch.ops.mpbind.{n}.default" in "".join(code) for n in ("nccl_all_reduce_", "nccl_all_gather",
                                                                             "nccl_reduce_scatter"))
    assert "torch.ops.mpbind.all_reduce" not in "".join(code)
    with pytest.raises(RuntimeError, match="no communicator is registered under id 0"):
        ops.nccl_all_reduce(x, 0, 0)
    with pytest.raises(RuntimeError, match="mpbind::nccl_all_reduce takes CUDA tensors, not a cpu tensor"):
        ops.nccl_all_reduce(x.cpu(), comm.launch_id, 0)
    with pytest.raises(RuntimeError, match="takes a contiguous tensor"):
        ops.nccl_all_reduce(x.t(), comm.launch_id, 0)
    with pytest.raises(RuntimeError, match="a max of complex tensors is not defined"):
        ops.nccl_all_reduce(torch.ones(2, dtype=torch.complex64, device="cuda"), comm.launch_id, 2)
    with pytest.raises(RuntimeError, match="do not fit this collective on 1 ranks"):
        ops.nccl_all_gather(x, comm.launch_id, 2)  # traced for two ranks, run on one
    with pytest.raises(RuntimeError, match="NCCL has no type"):
        ops.nccl_all_reduce(torch.ones(2, dtype=torch.bool, device="cuda"), comm.launch_id, 0)


def test_eager_calls_run_the_kernels_without_the_dispatcher(comm: nccl.Communicator, monkeypatch: Any) -> None:
    # Eagerly, on a plain contiguous CUDA tensor, the functions run the C++ kernels directly (through
    # _native.GATE): torch's tensors made by torch's allocator, on torch's current stream.
    from mpbind.torch import _native, _nccl

    assert _native.GATE is not None
    kinds: list[int] = []
    ran: list[bool] = []

    def counted(kind: int, *args: Any) -> Any:
        kinds.append(kind)
        out = _native.GATE(kind, *args)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(_nccl, "_gate", counted)
    x = torch.randn(8, 3, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the work goes on the current stream, whichever it is
        outs = [mpt.all_reduce(x, comm), mpt.all_gather(x, comm), mpt.reduce_scatter(x, comm), mpt.all_to_all(x, comm),
                mpt.all_reduce(x, comm, "max"), mpt.reduce_from_group(x, comm)]
        same = mpt.all_reduce_(x, comm)
    side.synchronize()
    assert kinds == [0, 1, 2, 3, 0, 0, 0] and all(ran)
    for y in outs:
        assert type(y) is torch.Tensor and y.is_contiguous() and y.device == x.device and y.shape == x.shape
        assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    assert same is x
    z = torch.randn(4, dtype=torch.complex128, device="cuda")
    assert torch.equal(mpt.all_reduce(z, comm, "avg"), z)
    for dtype in (torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8, torch.int32, torch.int64,
                  torch.float8_e4m3fn, torch.complex64):  # each output of the input's dtype
        v = torch.arange(6, device="cuda").reshape(2, 3).to(dtype)
        y = mpt.all_gather(v, comm)
        assert y.dtype == dtype and y.shape == (2, 3) and torch.equal(y.view(torch.uint8), v.view(torch.uint8))
    with pytest.raises(UsageError, match="max of complex tensors"):
        mpt.all_reduce(z, comm, "max")
    with pytest.raises(UsageError, match="does not split into 1 equal blocks"):
        mpt.reduce_scatter(torch.ones((), device="cuda"), comm)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(200):  # each output is torch's and freed with its last reference
        mpt.all_gather(x, comm)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert kinds.count(1) == 210 and all(ran)
    # What something else is to see goes through the dispatcher: a gradient, a mode, compilation.
    ran.clear()
    leaf = torch.ones(4, device="cuda", requires_grad=True)
    mpt.all_reduce(leaf, comm).sum().backward()
    with torch.device("cuda"):  # a torch-function mode
        mpt.all_gather(x, comm)
    traced = torch.jit.trace(lambda t: mpt.all_reduce(t, comm), (x,), check_trace=False)
    assert ran == [False, False, False]
    assert "mpbind::nccl_all_reduce" in str(traced.graph)  # the tracer saw the operator
    assert torch.equal(traced(x), x)
    assert torch.equal(leaf.grad, torch.ones(4, device="cuda"))


def test_an_in_place_all_reduce_is_a_write_autograd_sees(comm: nccl.Communicator) -> None:
    # Like torch's in-place operators, all_reduce_ bumps the tensor's version, whichever way it runs (the
    # gate; the dispatcher, under a mode): a backward that needs the tensor as it was refuses instead of
    # using what the reduction wrote.
    w = torch.ones(4, device="cuda", requires_grad=True)
    unseen = []
    for mode in (False, True):
        x = torch.full((4,), 2.0, device="cuda")
        y = (w * x).sum()  # saves x for the backward
        if mode:
            with torch.device("cuda"):  # a torch-function mode: the gate leaves the call to the dispatcher
                mpt.all_reduce_(x, comm)
        else:
            mpt.all_reduce_(x, comm)
        try:
            y.backward()
            unseen.append(mode)
        except RuntimeError as exc:
            assert "modified by an inplace operation" in str(exc)
    assert unseen == []


def test_compiled_all_reduce_works_in_place_where_nothing_else_reads_its_input(comm: nccl.Communicator) -> None:
    # Traced, the all-reduce is the in-place operator on a copy of its input, as torch's functional
    # collective is: inductor drops the copy and reduces in place where nothing reads the input later,
    # and copies first where something does (the caller's own tensor, a value used again).
    from torch._inductor.utils import run_and_get_code

    torch.compiler.reset()
    x = torch.randn(64, 8, device="cuda")
    kept = x.clone()
    cases = {
        "intermediate": (lambda t: mpt.all_reduce(t * 2, comm), lambda t: 2 * t),
        "input": (lambda t: mpt.all_reduce(t, comm), lambda t: t),
        "used_again": (lambda t: mpt.all_reduce(t * 2, comm) + t * 2, lambda t: 4 * t),
        "transposed": (lambda t: mpt.all_reduce((t * 2).t(), comm), lambda t: (2 * t).t()),
        "reduce_from_group": (lambda t: mpt.reduce_from_group(t * 2, comm), lambda t: 2 * t),  # no gradient
    }
    for name, (fn, want) in cases.items():
        out, code = run_and_get_code(torch.compile(fn, fullgraph=True), x)
        torch.cuda.synchronize()
        assert torch.equal(out, want(kept)), name
        assert torch.equal(x, kept), name  # the caller's tensor is never written
        text = "".join(code)
        assert "torch.ops.mpbind.nccl_all_reduce_.default" in text, name
        assert "torch.ops.mpbind.nccl_all_reduce.default" not in text, name
        if name in ("intermediate", "reduce_from_group"):  # one kernel (t * 2), reduced in its buffer: no copy
            assert text.count(".run(") == 1, text
    # all_reduce_ is the same operator, in place on what it is given.
    def in_place(t: Any) -> Any:
        y = t * 3
        mpt.all_reduce_(y, comm)
        return y

    out, code = run_and_get_code(torch.compile(in_place, fullgraph=True), x)
    assert torch.equal(out, 3 * kept) and torch.equal(x, kept)
    assert "torch.ops.mpbind.nccl_all_reduce_.default" in "".join(code)
    assert "torch.ops.mpbind.all_reduce_" not in "".join(code)  # not the Python operator
    # Under reduce-overhead (CUDA graphs) as well, replayed on new data.
    f = torch.compile(cases["used_again"][0], mode="reduce-overhead", fullgraph=True)
    for seed in range(3):
        y = torch.randn(64, 8, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
        assert torch.equal(f(y), 4 * y)


def test_eager_calls_on_a_non_blocking_communicator() -> None:
    # A non-blocking communicator's launch may come back in progress: the eager kernels wait for it
    # (bounded, Ctrl-C honoured) before returning.
    from mpbind.bindings import nccl as flat

    c = nccl.Communicator.init(1, 0, nccl.get_unique_id(), config=flat.Config(blocking=0))
    try:
        x = torch.randn(1024, device="cuda")
        for _ in range(5):
            y, z = mpt.all_reduce(x, c), mpt.all_gather(x, c)
            assert mpt.all_reduce_(x, c) is x
        torch.cuda.synchronize()
        assert torch.equal(y, x) and torch.equal(z, x)
    finally:
        c.close()
