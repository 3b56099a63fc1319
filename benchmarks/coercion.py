"""What describing one array costs the hot path, per source kind, on the CPU (no GPU needed).

    python benchmarks/coercion.py [--n 200000] [--out DIR]

For each source (a ``(ptr, count, dtype)`` tuple, a ``__cuda_array_interface__`` object, a NumPy
array through ``__dlpack__``, PyTorch CPU tensors through DLPack's C exchange API, their attributes,
``__dlpack__``, a CuPy-like array's attributes, where these are installed) it reports:

* ``call_ns``: ``mpbind._core.array_info(x)`` from Python (a call into the core and a result tuple);
* ``producer_ns``: what the source's own protocol costs from Python, for comparison (building the
  interface dict, ``__dlpack__()``), where there is one.

Device-only checks are not part of it (CPU tensors are host memory); the whole hot call, checks
included, is timed on the GPU by ``nccl_allreduce.py`` and ``nvshmem_latency.py``. Streams are
timed the same way (``mpbind._core.stream_handle(s)``). The table goes to stdout, the CSV to ``--out``.
The core's coercion alone, without the call from Python, is not timed here: that needs the core's
test hooks, which the benchmarks do not use.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import _results  # noqa: E402
from _timing import ns_per_call  # noqa: E402

from mpbind import _core  # noqa: E402


class InterfaceArray:
    """Like a CuPy or PyTorch CUDA array: the interface dict is built on every access."""

    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.n,), "typestr": "<f4", "data": (0x7F0000000000, False), "strides": None, "version": 3}


class CupyLike:
    """What the core reads of a CuPy array (its attribute path)."""

    class MemoryPointer:
        ptr, device_id = 0x7F0000000000, 0

    def __init__(self, np: Any) -> None:
        self.shape, self.strides, self.dtype, self.data = (1024,), (4,), np.dtype("float32"), self.MemoryPointer()


def sources() -> list[tuple[str, Any, str | None, Callable[[], object] | None]]:
    """(name, object, forced path or None, the producer's own protocol or None)."""
    out: list[tuple[str, Any, str | None, Callable[[], object] | None]] = [
        ("tuple (ptr, count, dtype)", (0x7F0000000000, 1024, "float32"), None, None),
    ]
    cai = InterfaceArray(1024)
    out.append(("__cuda_array_interface__ (dict built per access)", cai, None,
                lambda: cai.__cuda_array_interface__))
    try:
        import numpy as np
    except ImportError:
        return out
    host = np.zeros(1024, np.float32)
    out.append(("NumPy via __dlpack__ (versioned)", host, None, lambda: host.__dlpack__(max_version=(1, 0))))
    out.append(("CuPy-like attributes", CupyLike(np), "cupy", None))
    try:
        import torch
    except ImportError:
        return out
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        t = torch.zeros(1024, dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
            out.append((f"torch {name} via the DLPack C exchange API", t, "exchange", None))
        out.append((f"torch {name} via attributes", t, "torch", lambda t=t: (t.data_ptr(), t.dtype, t.shape,
                                                                              t.stride(), t.get_device())))
        out.append((f"torch {name} via __dlpack__", t, "dlpack", lambda t=t: t.__dlpack__(max_version=(1, 0))))
    return out


# Raw handles must point at readable, pointer-aligned memory (the core's stream check); these do.
_STREAM_MEMORY = (ctypes.c_uint64 * 32)()
_HANDLES = [ctypes.addressof(_STREAM_MEMORY) + 64 * i for i in range(4)]


def streams() -> list[tuple[str, Any]]:
    class TorchLike:
        cuda_stream = _HANDLES[0]

    class _BaseStream:  # as CuPy 14's: a Python class of cupy.cuda.stream, .ptr on the instance
        def __init__(self) -> None:
            self.ptr = _HANDLES[1]

        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, self.ptr)

    _BaseStream.__module__, _BaseStream.__qualname__ = "cupy.cuda.stream", "_BaseStream"

    class Protocol:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, _HANDLES[2])

    return [("None", None), ("int", _HANDLES[3]), (".cuda_stream (PyTorch)", TorchLike()),
            (".ptr (CuPy)", _BaseStream()), ("__cuda_stream__", Protocol())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--out", type=Path, default=Path("benchmark-results"))
    a = ap.parse_args()
    rows = []
    for name, obj, source, producer in sources():
        _core.array_info(obj, source=source, tuples=True)  # warm the per-type cache
        call = min(ns_per_call(lambda obj=obj, source=source: _core.array_info(obj, source=source, tuples=True),
                               a.n // 4) for _ in range(5))
        own = min(ns_per_call(producer, a.n // 4) for _ in range(5)) if producer else float("nan")
        rows.append([name, call, own])
    for name, stream in streams():
        rows.append([f"stream: {name}",
                     min(ns_per_call(lambda s=stream: _core.stream_handle(s), a.n // 4) for _ in range(5)),
                     float("nan")])
    header = ["source", "call_ns", "producer_ns"]
    print(_results.table(header, rows))
    _results.write_csv(a.out / "coercion.csv", header, rows)
    print(f"wrote {a.out / 'coercion.csv'}")


if __name__ == "__main__":
    main()
