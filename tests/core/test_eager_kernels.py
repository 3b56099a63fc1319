"""The collectives' eager kernels (``_core.torch_eager``: what :mod:`mpbind.torch`'s functions run
without torch's dispatcher) over a framework of the test's making (``ProducingTensor``: DLPack's C
exchange API with an allocator): the output each collective asks the framework for, what is refused
before anything is allocated or launched, an allocator whose tensor is not what was asked for, and
which calls the gate in front of them (``_core.torch_eager_gate``) lets through. No communicator is
registered under the id the calls name, so a call that gets as far as the launch is refused there,
after its output was made and before NCCL is called."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from mpbind import _core
from mpbind.errors import MpbindError, UsageError

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_objects import KDL_CPU, KDL_CUDA, ExchangeTensor, ProducingTensor  # noqa: E402

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = range(4)  # launch::Collective
SUM, MAX, AVG = 0, 2, 4  # ncclRedOp_t
NOBODY = 2**63  # a launch id nobody registered
FLOAT32, COMPLEX64, UINT8, INT16 = (2, 32), (5, 64), (1, 8), (0, 16)  # DLPack (code, bits)
UNLAUNCHED = "no communicator is registered under id"


@pytest.fixture(autouse=True)
def producer() -> Any:
    ProducingTensor.lie = ""
    ProducingTensor.asked.clear()
    ProducingTensor.made.clear()
    yield ProducingTensor
    ProducingTensor.lie = ""


def tensor(shape: tuple[int, ...], dtype: tuple[int, int] = FLOAT32, **kw: Any) -> ProducingTensor:
    return ProducingTensor(shape, *dtype, **kw)


def eager(kind: int, x: Any, op: int = SUM, group: int = 1, in_place: bool = False) -> Any:
    return _core.torch_eager(kind, x, NOBODY, op, group, in_place)


@pytest.mark.parametrize(("kind", "group", "shape", "out"), [
    (ALL_REDUCE, 1, (4, 3), (4, 3)),
    (ALL_GATHER, 4, (2, 3), (8, 3)),
    (ALL_GATHER, 3, (), (3,)),
    (REDUCE_SCATTER, 2, (6, 5), (3, 5)),
    (ALL_TO_ALL, 3, (6,), (6,)),
])
def test_the_output_is_asked_of_the_framework(kind: int, group: int, shape: tuple[int, ...],
                                              out: tuple[int, ...]) -> None:
    with pytest.raises(UsageError, match=UNLAUNCHED):
        eager(kind, tensor(shape), group=group)
    assert ProducingTensor.asked == [(out, FLOAT32, (KDL_CUDA, 0))]
    assert [m.shape for m in ProducingTensor.made] == [out]  # and handed back to Python as the framework's


def test_complex_tensors_are_summed_as_their_real_view() -> None:
    with pytest.raises(UsageError, match=UNLAUNCHED):
        eager(ALL_REDUCE, tensor((4,), COMPLEX64), AVG)
    assert ProducingTensor.asked == [((4,), COMPLEX64, (KDL_CUDA, 0))]
    with pytest.raises(UsageError, match="a max of complex tensors is not defined"):
        eager(ALL_REDUCE, tensor((4,), COMPLEX64), MAX)


def test_in_place_allocates_nothing() -> None:
    with pytest.raises(UsageError, match=r"mpbind.torch.all_reduce_: .*" + UNLAUNCHED):
        eager(ALL_REDUCE, tensor((4,)), in_place=True)
    assert ProducingTensor.asked == []
    with pytest.raises(UsageError, match="only an all-reduce works in place"):
        eager(ALL_GATHER, tensor((4,)), group=2, in_place=True)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: eager(ALL_REDUCE, tensor((4,), device=(KDL_CPU, 0))), "takes CUDA tensors; x is in host memory"),
    (lambda: eager(ALL_REDUCE, tensor((4, 3), strides=(1, 4))), "takes a contiguous tensor"),
    (lambda: eager(ALL_REDUCE, tensor((4,), INT16)), "NCCL has no type for int16"),
    (lambda: eager(ALL_REDUCE, tensor((4,)), 5), "ncclRedOp_t 5 is not sum .. avg"),
    (lambda: eager(ALL_REDUCE, tensor((4,)), -1), "ncclRedOp_t -1 is not sum .. avg"),
    (lambda: eager(ALL_GATHER, tensor((4,)), group=0), r"group_size must be in \[1, 1048576\], not 0"),
    (lambda: eager(ALL_GATHER, tensor((4,)), group=2**20 + 1), "group_size must be in"),
    (lambda: eager(REDUCE_SCATTER, tensor((5, 2)), group=2), "dim 0 does not split into 2 equal blocks"),
    (lambda: eager(REDUCE_SCATTER, tensor(()), group=2), "dim 0 does not split into 2 equal blocks"),
    (lambda: eager(ALL_TO_ALL, tensor((5,)), group=2), "dim 0 does not split into 2 equal blocks"),
    (lambda: eager(ALL_GATHER, tensor((2**61,), UINT8), group=8), "the output's size overflows"),
    (lambda: eager(4, tensor((4,))), "unknown collective 4"),
])
def test_refused_before_anything_is_allocated(call: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        call()
    assert ProducingTensor.asked == []


def test_only_a_framework_that_makes_tensors() -> None:
    with pytest.raises(TypeError, match="DLPack C exchange API"):
        eager(ALL_REDUCE, ExchangeTensor((4,)))  # reads its tensors, cannot make one
    with pytest.raises(TypeError, match="not a list"):
        eager(ALL_REDUCE, [1.0, 2.0])
    assert not _core.torch_eager_ready(ExchangeTensor((4,)))
    assert _core.torch_eager_ready(tensor((4,)))


@pytest.mark.parametrize("lie", ["shape", "dtype", "device", "strides", "ndim", "null"])
def test_an_allocation_other_than_asked_for_is_refused(lie: str) -> None:
    ProducingTensor.lie = lie
    with pytest.raises(MpbindError, match="allocator returned another tensor than the C-contiguous"):
        eager(ALL_REDUCE, tensor((4, 3)))
    assert ProducingTensor.made == []  # never handed to Python, never written to


def test_a_failed_allocation_says_why() -> None:
    ProducingTensor.lie = "fail"
    with pytest.raises(MpbindError, match=r"allocation \(\(4, 3\), float32\) failed \(MemoryError: out of device"):
        eager(ALL_REDUCE, tensor((4, 3)))


class Comm:
    """Stands for mpbind.nccl.Communicator: the gate reads its registered launch id, and where none is
    yet, the property that registers one."""

    def __init__(self, launch: int | None = NOBODY) -> None:
        self._launch = launch

    @property
    def launch_id(self) -> int:
        self._launch = NOBODY
        return self._launch


class Watchers:
    """The gate's ``seen_by`` and grad mode, each switched by a test."""

    def __init__(self) -> None:
        self.on: set[str] = set()
        self.seen_by = tuple(self._asker(n) for n in ("function mode", "dispatch modes", "transforms", "tracing"))

    def _asker(self, name: str) -> Any:
        return lambda: int(name in self.on) if name == "dispatch modes" else name in self.on  # a count, or a bool

    def grad_enabled(self) -> bool:
        return "grad" in self.on


@pytest.fixture
def gate() -> Any:
    w = Watchers()
    g = _core.torch_eager_gate(ProducingTensor, Comm, w.seen_by, w.grad_enabled)
    return g, w


class Derived(ProducingTensor):
    pass


@pytest.mark.parametrize(("case", "call"), [
    ("another tensor type", lambda g, w: g(ALL_REDUCE, ExchangeTensor((4,)), Comm(), "sum")),
    ("a subclass", lambda g, w: g(ALL_REDUCE, Derived((4,)), Comm(), "sum")),
    ("another communicator type", lambda g, w: g(ALL_REDUCE, tensor((4,)), object(), "sum")),
    ("a communicator's name", lambda g, w: g(ALL_REDUCE, tensor((4,)), "Communicator#1", "sum")),
    ("an unknown reduction", lambda g, w: g(ALL_REDUCE, tensor((4,)), Comm(), "mean")),
    ("a reduction not named", lambda g, w: g(REDUCE_SCATTER, tensor((4,)), Comm(), SUM)),
    ("host memory", lambda g, w: g(ALL_REDUCE, tensor((4,), device=(KDL_CPU, 0)), Comm(), "sum")),
    ("not contiguous", lambda g, w: g(ALL_GATHER, tensor((4, 3), strides=(1, 4)), Comm())),
    ("no tensor", lambda g, w: g(ALL_REDUCE, None, Comm(), "sum")),
    ("no communicator", lambda g, w: g(ALL_REDUCE, tensor((4,)), None, "sum")),
    ("no reduction", lambda g, w: g(ALL_REDUCE, tensor((4,)), Comm(), None)),
])
def test_the_gate_leaves_to_the_dispatcher(gate: Any, case: str, call: Any) -> None:
    g, w = gate
    assert call(g, w) is None, case
    assert ProducingTensor.asked == []


@pytest.mark.parametrize("watcher", ["function mode", "dispatch modes", "transforms", "tracing"])
def test_the_gate_leaves_what_something_is_to_see(gate: Any, watcher: str) -> None:
    g, w = gate
    w.on.add(watcher)
    assert g(ALL_REDUCE, tensor((4,)), Comm(), "sum") is None
    assert ProducingTensor.asked == []


def test_the_gate_leaves_a_gradient_to_record(gate: Any) -> None:
    g, w = gate
    x = tensor((4,))
    x.requires_grad = True
    w.on.add("grad")
    assert g(ALL_REDUCE, x, Comm(), "sum") is None
    w.on.discard("grad")  # no_grad(): nothing to record, the kernel runs
    with pytest.raises(UsageError, match=UNLAUNCHED):
        g(ALL_REDUCE, x, Comm(), "sum")
    assert ProducingTensor.asked == [((4,), FLOAT32, (KDL_CUDA, 0))]


@pytest.mark.parametrize(("kind", "op"), [(ALL_REDUCE, "avg"), (REDUCE_SCATTER, "sum"), (ALL_GATHER, None),
                                          (ALL_TO_ALL, "ignored")])
def test_the_gate_runs_the_kernel(gate: Any, kind: int, op: str | None) -> None:
    g, _ = gate
    with pytest.raises(UsageError, match=UNLAUNCHED):  # unknown id: a group of one, refused at the launch
        g(kind, tensor((4,), COMPLEX64), Comm(), op)
    assert ProducingTensor.asked == [((4,), COMPLEX64, (KDL_CUDA, 0))]
    with pytest.raises(UsageError, match=r"mpbind.torch.all_reduce: a max of complex tensors is not defined"):
        g(ALL_REDUCE, tensor((4,), COMPLEX64), Comm(), "max")
    with pytest.raises(UsageError, match="only an all-reduce works in place"):
        g(ALL_GATHER, tensor((4,)), Comm(), None, True)


def test_the_gate_registers_the_launch_id_once(gate: Any) -> None:
    g, _ = gate
    c = Comm(None)
    with pytest.raises(UsageError, match=UNLAUNCHED):
        g(ALL_REDUCE, tensor((4,)), c, "sum")
    assert c._launch == NOBODY
    del c._launch  # never set: the property, too
    with pytest.raises(UsageError, match=UNLAUNCHED):
        g(ALL_REDUCE, tensor((4,)), c, "sum")
    assert c._launch == NOBODY
