"""Symmetric-memory bounds on one GPU with one NVSHMEM PE (initialised through a unique id, no MPI):
put, get and the collectives (fcollect, reduce), given a view into a symmetric allocation that runs
past its end, are refused with UsageError before NVSHMEM sees them; a view ending exactly at the end
runs and moves the right data (checked against NumPy). So are a view whose end would wrap past 2**64,
a view spanning two allocations, and a symmetric array whose slots were rewritten to claim more than
its allocation.

NVSHMEM initialises once per process, so the checks run in a child process: this file run as a
script (``python test_symmetric_bounds_gpu.py``) prints one line per check and ``bounds: all passed``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

N = 1024  # float32 elements of each allocation: 4096 bytes
HALF = N // 2
DONE = "bounds: all passed"


class Window:
    """A device array over any address, described by ``__cuda_array_interface__``: what a framework's
    view into symmetric memory looks like to the core, without the framework's own bounds checks."""

    def __init__(self, ptr: int, n: int, typestr: str = "<f4") -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (ptr, False), "strides": None,
                                         "version": 3}


def test_symmetric_bounds_on_one_pe() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from runner import run_alone

    run_alone(__file__, DONE)


# --- the child: one PE ---------------------------------------------------------------------------------


def _expect_refused(call: Callable[[], object], match: str, error: type[Exception] | None = None) -> str:
    from mpbind.errors import UsageError

    error = error or UsageError
    try:
        call()
    except error as e:
        if match not in str(e):
            raise AssertionError(f"refused for another reason: {e}") from e
        return str(e)
    raise AssertionError(f"not refused (expected {error.__name__}: {match})")


def _run() -> None:
    from runner import run_checks, single_pe

    from mpbind import _core

    with single_pe(N) as (torch, nv, stream, dest, src):
        checks: list[tuple[str, Callable[[], object]]] = []

        def host(arr: Any) -> np.ndarray:
            torch.cuda.synchronize()
            return torch.from_dlpack(arr).cpu().numpy()

        def fill(arr: Any, values: np.ndarray) -> None:
            torch.from_dlpack(arr).copy_(torch.from_numpy(values).cuda())
            torch.cuda.synchronize()

        def reset() -> None:
            fill(dest, np.zeros(N, np.float32))
            fill(src, np.arange(N, dtype=np.float32))

        def put_at_the_end() -> str:
            reset()
            local = torch.arange(HALF, dtype=torch.float32, device="cuda") + 1000
            nv.put(Window(dest.ptr + 4 * HALF, HALF), local, 0, stream=stream)  # ends exactly at the end
            nv.quiet(stream=stream)
            stream.synchronize()
            want = np.concatenate([np.zeros(HALF), np.arange(HALF) + 1000]).astype(np.float32)
            np.testing.assert_array_equal(host(dest), want)
            # A framework's own view of the last element: the same bounds.
            nv.put(torch.from_dlpack(dest)[N - 1:], torch.full((1,), 7.0, device="cuda"), 0, stream=stream)
            nv.quiet(stream=stream)
            stream.synchronize()
            assert host(dest)[N - 1] == 7.0
            return "ran; data checked"

        def put_past_the_end() -> str:
            reset()
            local = torch.zeros(HALF + 1, dtype=torch.float32, device="cuda")
            msg = _expect_refused(lambda: nv.put(Window(dest.ptr + 4 * HALF, HALF + 1), local, 0, stream=stream),
                                  "dest is not NVSHMEM symmetric memory")
            _expect_refused(lambda: nv.put(Window(dest.ptr + 4 * HALF + 2, HALF), local[:HALF], 0, stream=stream),
                            "dest is not NVSHMEM symmetric memory")
            np.testing.assert_array_equal(host(dest), np.zeros(N, np.float32))  # nothing was written
            return msg

        def get_at_the_end() -> str:
            reset()
            out = torch.zeros(HALF, dtype=torch.float32, device="cuda")
            nv.get(out, Window(src.ptr + 4 * HALF, HALF), 0, stream=stream)
            nv.quiet(stream=stream)
            stream.synchronize()
            np.testing.assert_array_equal(out.cpu().numpy(), np.arange(HALF, N, dtype=np.float32))
            return "ran; data checked"

        def get_past_the_end() -> str:
            out = torch.zeros(HALF, dtype=torch.float32, device="cuda")
            return _expect_refused(lambda: nv.get(out, Window(src.ptr + 4 * HALF + 4, HALF), 0, stream=stream),
                                   "src is not NVSHMEM symmetric memory")

        def fcollect_at_the_end() -> str:
            reset()
            nv.fcollect(Window(dest.ptr + 4 * HALF, HALF), Window(src.ptr, HALF), stream=stream)
            stream.synchronize()
            want = np.concatenate([np.zeros(HALF), np.arange(HALF)]).astype(np.float32)
            np.testing.assert_array_equal(host(dest), want)
            return "ran; data checked"

        def fcollect_past_the_end() -> str:
            reset()
            _expect_refused(lambda: nv.fcollect(Window(dest.ptr + 4 * HALF + 4, HALF), Window(src.ptr, HALF),
                                                stream=stream), "dest is not NVSHMEM symmetric memory")
            return _expect_refused(lambda: nv.fcollect(Window(dest.ptr, HALF), Window(src.ptr + 4 * HALF + 4, HALF),
                                                       stream=stream), "src is not NVSHMEM symmetric memory")

        def reduce_at_the_end() -> str:
            reset()
            nv.reduce("sum", Window(dest.ptr + 4 * HALF, HALF), Window(src.ptr + 4 * HALF, HALF), stream=stream)
            stream.synchronize()
            want = np.concatenate([np.zeros(HALF), np.arange(HALF, N)]).astype(np.float32)  # one PE: the sum is src
            np.testing.assert_array_equal(host(dest), want)
            return "ran; data checked"

        def reduce_past_the_end() -> str:
            return _expect_refused(lambda: nv.reduce("sum", Window(dest.ptr + 4 * HALF, HALF + 1),
                                                     Window(src.ptr, HALF + 1), stream=stream),
                                   "dest is not NVSHMEM symmetric memory")

        def wrapping_and_spanning_views() -> str:
            # An extent whose end would pass 2**64 (ptr + nbytes wrapped to a small address that could look
            # inside an allocation): from a real device pointer, more bytes than 2**63 - 1.
            wrap = (2**64 - dest.ptr) // 4 + 1
            _expect_refused(lambda: nv.put(Window(dest.ptr + 16, wrap), torch.zeros(1, device="cuda"), 0),
                            "holds more than 2**63 - 1 bytes", OverflowError)
            _expect_refused(lambda: nv.put(Window(dest.ptr + 16, 2**61 - 1), torch.zeros(1, device="cuda"), 0),
                            "dest is not NVSHMEM symmetric memory")
            # One view over two allocations: in the symmetric heap, but not within one allocation.
            lo, hi = sorted((dest, src), key=lambda a: a.ptr)
            both = (hi.ptr - lo.ptr) // 4 + N
            return _expect_refused(lambda: nv.put(Window(lo.ptr, both), torch.zeros(both, device="cuda"), 0),
                                   "dest is not NVSHMEM symmetric memory")

        def symmetric_arrays_are_fixed() -> str:
            # The core's own type: nothing of its description can be rewritten from Python, and an array is
            # never made over more than its allocation.
            reset()
            for name, value in (("shape", (2 * N,)), ("_shape", (2 * N,)), ("_core", None), ("dtype", "int8")):
                try:
                    setattr(dest, name, value)
                except AttributeError:
                    continue
                raise AssertionError(f"SymmetricArray.{name} could be set")
            small = nv.zeros(HALF, "float32")
            try:
                msg = _expect_refused(lambda: _core.nvshmem.symmetric_array(small.memory, (N,), "float32", dest.device),
                                      "more than its symmetric allocation's 2048")
            finally:
                small.free()
            nv.put(dest, torch.zeros(N, device="cuda"), 0, stream=stream)
            nv.quiet(stream=stream)
            stream.synchronize()
            return msg

        checks += [("put.exact_end", put_at_the_end), ("put.past_end", put_past_the_end),
                   ("get.exact_end", get_at_the_end), ("get.past_end", get_past_the_end),
                   ("fcollect.exact_end", fcollect_at_the_end), ("fcollect.past_end", fcollect_past_the_end),
                   ("reduce.exact_end", reduce_at_the_end), ("reduce.past_end", reduce_past_the_end),
                   ("wrapping_and_spanning", wrapping_and_spanning_views),
                   ("fixed_arrays", symmetric_arrays_are_fixed)]
        run_checks(checks, DONE)


if __name__ == "__main__":
    _run()
