"""Process groups for tests without a second process: ranks as threads exchanging through a shared
table (:class:`ThreadWorld`), and one rank's side of an exchange whose other ranks' answers are
scripted (:class:`Scripted`; what a real rank sends is taken from :func:`sent`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from mpbind import process_group as pg

FRAME_BYTES = 8 * pg.FRAME_WORDS


class Scripted(pg.ProcessGroup):
    """Rank 0 of a group whose other ranks answer `others` to every allgather_ints; records what it sent."""

    def __init__(self, *others: list[int], unit: str = "rank") -> None:
        self.others = [list(o) for o in others]
        self.sent: list[list[int]] = []
        self.unit = unit

    @property
    def rank(self) -> int:
        return 0

    @property
    def nranks(self) -> int:
        return 1 + len(self.others)

    def _allgather_frame(self, frame: list[int]) -> list[list[int]]:
        raise AssertionError("allgather_ints answers")

    def allgather_ints(self, values: Any) -> list[list[int]]:
        self.sent.append(list(values))
        return [list(values), *self.others]


def sent(call: Callable[[pg.ProcessGroup], object]) -> list[int]:
    """What a rank making `call(group)` sends in its first exchange (whether it then goes on or refuses)."""
    probe = Scripted()
    with contextlib.suppress(Exception):
        call(probe)
    return probe.sent[0]


class ThreadWorld:
    """`n` ranks as threads: an allgather and a broadcast of bytes through a shared table, recording
    the size of every part a rank sent."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n)
        self.table: list[bytes | None] = [None] * n
        self.sent: list[int] = []
        self.lock = threading.Lock()

    def _allgather(self, rank: int) -> Callable[[bytes], list[bytes | None]]:
        def allgather(data: bytes) -> list[bytes | None]:
            with self.lock:
                self.sent.append(len(data))
            self.table[rank] = data
            self.barrier.wait(timeout=30)
            out = list(self.table)
            self.barrier.wait(timeout=30)
            return out

        return allgather

    def _broadcast(self, data: bytes | None, root: int) -> bytes:
        if data is not None:
            self.table[root] = data
        self.barrier.wait(timeout=30)
        out = self.table[root]
        self.barrier.wait(timeout=30)
        assert out is not None
        return out

    def group(self, rank: int, *, broadcast_only: bool = False) -> pg.ProcessGroup:
        if broadcast_only:
            return pg.CallableProcessGroup(rank, self.n, broadcast=self._broadcast)
        return pg.CallableProcessGroup(rank, self.n, allgather=self._allgather(rank))  # type: ignore[arg-type]

    def run(self, fn: Callable[[pg.ProcessGroup], Any], **kwargs: Any) -> list[Any]:
        """fn(group) on every rank at once; what each returned or raised, in rank order."""
        out: list[Any] = [None] * self.n

        def main(rank: int) -> None:
            try:
                out[rank] = fn(self.group(rank, **kwargs))
            except BaseException as exc:  # compared by the tests
                out[rank] = exc

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "an exchange hung"
        return out


def same_error(results: Sequence[Any], cls: type[BaseException]) -> str:
    """The one message every rank raised (`cls` on each), checked identical."""
    assert all(isinstance(r, cls) for r in results), results
    messages = {str(r) for r in results}
    assert len(messages) == 1, messages
    return messages.pop()
