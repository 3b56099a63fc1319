"""How the benchmarks time host calls: one clock reading around each call, no averaging inside."""

from __future__ import annotations

import time
from collections.abc import Callable


def host_times(fn: Callable[[], object], n: int, then: Callable[[], object] | None = None) -> list[float]:
    """Microseconds of each of `n` calls of `fn` (and of `then()` after it, timed with it, when given)."""
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        if then is not None:
            then()
        out.append((clock() - t0) / 1e3)
    return out


def ns_per_call(fn: Callable[[], object], calls: int) -> float:
    """Nanoseconds per call of `fn`, from one clock reading around `calls` calls (for calls too short
    to time one by one)."""
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls
