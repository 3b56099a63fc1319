"""Objects that own a library resource refuse copy.copy, copy.deepcopy and pickling alike, with a
TypeError naming the class (a shallow copy would share the handle: closing one would close both);
value classes (distributions, plans' decisions, device views) stay copyable."""

from __future__ import annotations

import copy
import importlib
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from mpbind import collective as collective_matmul
from mpbind import distributions as dist
from mpbind import fft
from mpbind._core import Composite
from mpbind._infra.owned import Owned, Uncopyable
from mpbind.fft import _planner as _fft_plan
from mpbind.matmul import _planner as _matmul_plan

PUBLIC = ["mpbind.nccl", "mpbind.nvshmem", "mpbind.cublasmp", "mpbind.cufftmp", "mpbind.fft", "mpbind.matmul",
          "mpbind.collective", "mpbind.kernels"]

# Every owning class of the public modules (a test below checks that none is missing).
OWNING = ["nccl.Communicator", "cublasmp.Matrix", "cublasmp.MatmulDescriptor",
          "cublasmp.Matmul", "matmul.PlannedMatmul", "cufftmp.Plan", "cufftmp.Descriptor", "cufftmp.Reshape",
          "fft.FFTPlan", "fft.ReshapePlan", "collective.AllGatherMatmul", "kernels.Library"]

# Owning classes that are the core's own types: the core refuses copies alike, naming the class.
CORE_OWNING = ["nvshmem.SymmetricArray"]

COPIES: list[tuple[str, Callable[[Any], Any]]] = [
    ("copy.copy", copy.copy), ("copy.deepcopy", copy.deepcopy),
    *((f"pickle protocol {p}", lambda x, p=p: pickle.dumps(x, protocol=p)) for p in range(pickle.HIGHEST_PROTOCOL + 1)),
]


def _class(name: str) -> type[Any]:
    module, attr = name.split(".")
    return getattr(importlib.import_module(f"mpbind.{module}"), attr)  # type: ignore[no-any-return]


def test_every_owning_class_of_the_public_modules_is_listed() -> None:
    found = set()
    for module in map(importlib.import_module, PUBLIC):
        for attr in dir(module):
            value = getattr(module, attr)
            if (isinstance(value, type) and issubclass(value, Uncopyable) and not attr.startswith("_")
                    and value not in (Owned, Uncopyable)):
                found.add(value)
    listed = {_class(n) for n in OWNING}
    assert found <= listed, sorted(c.__qualname__ for c in found - listed)


@pytest.mark.parametrize("name", OWNING)
@pytest.mark.parametrize(("how", "make_copy"), COPIES, ids=[c[0] for c in COPIES])
def test_owning_objects_refuse_every_copy(name: str, how: str, make_copy: Callable[[Any], Any]) -> None:
    cls = _class(name)
    assert issubclass(cls, Uncopyable)
    obj = cls.__new__(cls)  # the refusal is the class's: no library needed to show it
    with pytest.raises(TypeError, match=f"cannot copy {cls.__name__}: it owns a library resource .*pass the object "
                                        "itself"):
        make_copy(obj)


@pytest.mark.parametrize("name", CORE_OWNING)
@pytest.mark.parametrize(("how", "make_copy"), COPIES, ids=[c[0] for c in COPIES])
def test_owning_core_objects_refuse_every_copy(name: str, how: str, make_copy: Callable[[Any], Any]) -> None:
    cls = _class(name)
    obj = cls.__new__(cls)  # not made: the refusal is the class's
    with pytest.raises(TypeError, match=f"cannot (copy|pickle) {name}: it owns a library resource"):
        make_copy(obj)


@pytest.mark.parametrize(("how", "make_copy"), COPIES, ids=[c[0] for c in COPIES])
def test_composite_parts_refuse_copies_too(how: str, make_copy: Callable[[Any], Any]) -> None:
    parts = Composite([], "plan parts")
    with pytest.raises(TypeError, match="cannot (copy|pickle) Composite"):
        make_copy(parts)
    assert issubclass(collective_matmul.AllGatherMatmul, Uncopyable)
    assert issubclass(fft.FFTPlan, Owned) and issubclass(fft.ReshapePlan, Owned)


def test_a_refused_copy_leaves_the_original_usable() -> None:
    parts = Composite([], "plan parts")
    with pytest.raises(TypeError):
        copy.copy(parts)
    assert not parts.closed
    parts.close()
    assert parts.closed


VALUES = [
    dist.Split((10, 4), 3), dist.Pencils((8, 6, 4), (2, 2)), dist.BlockCyclic((8, 8), (2, 2), (2, 2)),
    dist.Boxes((4, 4), [((0, 0), (2, 4)), ((2, 0), (4, 4))]), dist.Replicated((4,), 2), dist.Box((0, 1), (2, 3)),
    dist.BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, "col"),
    _fft_plan.plan_fft((8, 8, 8), "complex64", 2),
    _fft_plan.plan_reshape(dist.Split((8, 8), 2, 0), dist.Split((8, 8), 2, 1), "float32"),
    _matmul_plan.plan(a=dist.by_rows((8, 4), 2), b=dist.Replicated((4, 6), 2), d=dist.by_rows((8, 6), 2),
                      a_dtype="float32"),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_values_stay_copyable(value: Any) -> None:
    assert copy.copy(value) == value
    assert copy.deepcopy(value) == value
    assert pickle.loads(pickle.dumps(value)) == value


def test_a_split_copy_answers_as_the_original() -> None:
    s = dist.Split((10, 4), 3, counts=(0, 6, 4))
    for again in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert [again.box(r) for r in range(3)] == [s.box(r) for r in range(3)]
        assert again.owners((7, 0)) == s.owners((7, 0)) == (2,)
        assert hash(again) == hash(s)


def test_a_device_view_copy_is_another_view_of_the_same_memory() -> None:
    owner = Composite([], "owner")
    view = fft.DeviceView(0x10000, (4, 3), (3, 1), "float32", 0, 48, owner)
    again = copy.copy(view)
    assert again is not view
    assert (again.ptr, again.shape, again.strides, again.dtype, again.device, again.room) == \
        (view.ptr, view.shape, view.strides, view.dtype, view.device, view.room)
    assert again.owner is owner  # the owner, not a copy of it: the memory stays alive
    assert again.__cuda_array_interface__ == view.__cuda_array_interface__
