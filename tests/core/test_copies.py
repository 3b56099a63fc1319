"""The core's objects that own a library resource (every class with close(): communicators, grids,
teams, allocations, plans, registrations, ...) refuse copy.copy, copy.deepcopy and pickle with a
TypeError naming the class: a copy would share the resource, and closing either would release it
under the other. The layer's Owned facades refuse the same way."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator

import pytest

from mpbind import _core

T = _core._testing


def owning_classes() -> Iterator[type]:
    """Every class of the core that owns a library resource: those with close()."""
    for module in (_core, _core._testing, _core.nccl, _core.nvshmem, _core.cublasmp, _core.cufftmp):
        for value in vars(module).values():
            if isinstance(value, type) and "close" in vars(value):
                yield value


def test_every_owning_class_refuses_copies() -> None:
    names = {f"{c.__module__}.{c.__qualname__}" for c in owning_classes()}
    assert {"mpbind._core.Registration", "mpbind._core.nccl.Communicator", "mpbind._core.cublasmp.Grid",
            "mpbind._core.nvshmem.Team", "mpbind._core.cufftmp.Reshape"} <= names, names
    for cls in owning_classes():
        for method in ("__copy__", "__deepcopy__", "__reduce_ex__", "__reduce__"):
            assert method in vars(cls), (cls, method)


def test_copy_deepcopy_and_pickle_are_refused() -> None:
    owner = T.Owner()
    objects = [owner, T.Resource(False), owner.add(False), T.cached(7), owner.register(0x1000, 64)]
    try:
        for obj in objects:
            name = type(obj).__qualname__
            with pytest.raises(TypeError, match=rf"cannot copy .*{name}: it owns a library resource, which close\(\) "
                                                "releases once"):
                copy.copy(obj)
            with pytest.raises(TypeError, match=rf"cannot copy .*{name}: it owns a library resource"):
                copy.deepcopy(obj)
            with pytest.raises(TypeError, match=rf"cannot copy .*{name}"):
                copy.deepcopy([obj])  # inside a container too
            for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
                with pytest.raises(TypeError, match=rf"cannot pickle .*{name}: it owns a library resource of this "
                                                    "process"):
                    pickle.dumps(obj, protocol)
            assert not obj.closed  # refused without touching it
    finally:
        for obj in reversed(objects):
            obj.close()
        T.cache_clear()


def test_copy_message_names_the_kind() -> None:
    with T.Owner() as owner, pytest.raises(TypeError, match=r"^cannot copy _testing\.Owner: "):
        copy.copy(owner)
