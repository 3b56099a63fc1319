"""Made-up stream handles on one GPU with one NVSHMEM PE (initialised through a unique id, no MPI):
an int that is no CUDA stream (2**31, 2**40, 2**63 - 1, 2**63, 2**64 - 1), given as an int or
through a stream object's protocol, is refused with UsageError by nvshmem put/get and by
cublasmp ``Handle.set_stream`` before any library sees it (the driver would dereference it: a
segfault); a real stream (PyTorch's, CuPy's when installed, and the special handles 0, 1, 2) still
runs, and put/get move the right data.

NVSHMEM initialises once per process, so the checks run in a child process: this file run as a
script prints one line per check and ``streams: all passed``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

N = 256
DONE = "streams: all passed"
BOGUS = (2**31, 2**40, 2**63 - 1, 2**63, 2**64 - 1)


def test_bogus_streams_on_one_pe() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from runner import run_alone

    run_alone(__file__, DONE)


# --- the child: one PE ---------------------------------------------------------------------------------


class Protocol:
    """A stream object whose ``__cuda_stream__`` gives any handle: a lying object."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _refused(call: Callable[[], object]) -> None:
    from mpbind.errors import UsageError

    try:
        call()
    except UsageError as e:
        if "which is no CUDA stream" not in str(e):
            raise AssertionError(f"refused for another reason: {e}") from e
        return
    raise AssertionError("not refused")


def _run() -> None:
    from runner import run_checks, single_pe

    from mpbind import cublasmp

    with single_pe(N) as (torch, nv, stream, dest, src):

        def host(arr: Any) -> np.ndarray:
            torch.cuda.synchronize()
            return torch.from_dlpack(arr).cpu().numpy()

        def bogus_put_get() -> str:
            local = torch.zeros(N, device="cuda")
            for handle in BOGUS:
                for s in (handle, Protocol(handle)):
                    _refused(lambda s=s: nv.put(dest, local, 0, stream=s))
                    _refused(lambda s=s: nv.get(local, src, 0, stream=s))
            return f"{len(BOGUS)} handles refused, as ints and through __cuda_stream__"

        def real_put_get() -> str:
            torch.from_dlpack(src).copy_(torch.arange(N, dtype=torch.float32, device="cuda"))
            torch.cuda.synchronize()
            streams: list[Any] = [stream, stream.cuda_stream, Protocol(stream.cuda_stream), 0, 1, 2]
            try:
                import cupy

                streams.append(cupy.cuda.Stream(non_blocking=True))
            except ImportError:
                pass
            for s in streams:
                out = torch.zeros(N, device="cuda")
                torch.cuda.synchronize()
                nv.get(out, src, 0, stream=s)
                nv.put(dest, out, 0, stream=s)
                nv.quiet(stream=s)
                torch.cuda.synchronize()
                np.testing.assert_array_equal(out.cpu().numpy(), np.arange(N, dtype=np.float32))
                np.testing.assert_array_equal(host(dest), np.arange(N, dtype=np.float32))
                torch.from_dlpack(dest).zero_()
            return f"{len(streams)} streams ran; data checked"

        def cublasmp_set_stream() -> str:
            handle = cublasmp.Handle(stream)
            try:
                for bad in BOGUS:
                    _refused(lambda bad=bad: handle.set_stream(bad))
                    _refused(lambda bad=bad: handle.set_stream(Protocol(bad)))
                assert handle.stream == stream.cuda_stream  # unchanged by the refusals
                other = torch.cuda.Stream()
                handle.set_stream(other)
                assert handle.stream == other.cuda_stream
                handle.set_stream(0)
                assert handle.stream == 0
            finally:
                handle.close()
            return "refused; real streams set"

        checks = [("put_get.bogus", bogus_put_get), ("put_get.real", real_put_get),
                  ("cublasmp.set_stream", cublasmp_set_stream)]
        run_checks(checks, DONE)


if __name__ == "__main__":
    _run()
