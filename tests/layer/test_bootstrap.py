"""Unique-id exchange: real ids from NCCL and NVSHMEM, shared by simulated ranks (threads)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from mpbind import bootstrap
from mpbind.bindings import nccl, nvshmem
from mpbind.errors import UsageError


class ThreadWorld:
    """A broadcast among `n` threads: what the root passes, every rank receives."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n)
        self.value: bytes | None = None

    def broadcast(self, data: bytes | None, root: int) -> bytes:
        if data is not None:
            self.value = data
        self.barrier.wait(timeout=30)
        assert self.value is not None
        out = self.value
        self.barrier.wait(timeout=30)
        return out


@pytest.mark.parametrize(("library", "cls"), [("nccl", nccl.UniqueId), ("nvshmem", nvshmem.UniqueId)])
@pytest.mark.parametrize("root", [0, 2])
def test_every_rank_gets_the_roots_id(library: str, cls: type, root: int) -> None:
    n = 4
    world = ThreadWorld(n)
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            results[rank] = bootstrap.share_unique_id(library, world.broadcast, root=root, rank=rank)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    ids = [results[r] for r in range(n)]
    assert all(isinstance(u, cls) for u in ids)
    assert len({bytes(u) for u in ids}) == 1
    assert bytes(ids[0]) != bytes(cls())  # a real id, not the zero default


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown library"):
        bootstrap.share_unique_id("mpi", lambda d, r: b"")
    with pytest.raises(UsageError, match="rank="):
        bootstrap.share_unique_id("nccl", lambda d, r: d or b"")
    with pytest.raises(UsageError, match="via must be"):
        bootstrap.share_unique_id("nccl", 42, rank=0)
    with pytest.raises(UsageError, match="root"):
        bootstrap.share_unique_id("nccl", lambda d, r: d or b"", root=-1, rank=0)
    with pytest.raises(UsageError, match="5 bytes; the frame it was given has 1024"):
        bootstrap.share_unique_id("nccl", lambda d, r: b"short", rank=1)
    with pytest.raises(UsageError, match="not bytes"):
        bootstrap.share_unique_id("nvshmem", lambda d, r: 5, rank=1)


def test_mpi4py_communicator() -> None:
    mpi = pytest.importorskip("mpi4py.MPI", reason="mpi4py is an optional extra")
    uid = bootstrap.share_unique_id("nccl", mpi.COMM_SELF)
    assert isinstance(uid, nccl.UniqueId) and len(bytes(uid)) == 128
