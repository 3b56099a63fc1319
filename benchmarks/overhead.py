"""Call overhead of the flat bindings: ns per `get_version()` call against anchors in the same run.

    python benchmarks/overhead.py [--calls N] [--repeat R] [--json]

Anchors: nccl4py's binding of the same call (when installed: pip install 'mpbind[bench]'),
a ctypes call of ncclGetVersion on the same library file, and an empty Python lambda.
Each figure is the best of R repeats of N calls (the least-disturbed run).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import timeit
from collections.abc import Callable


def _ns_per_call(fn: Callable[[], object], calls: int, repeat: int) -> float:
    fn()  # load the library and fill the function-pointer table first
    best = min(timeit.repeat(fn, number=calls, repeat=repeat))
    return best / calls * 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from mpbind import _loader
    from mpbind.bindings import nccl

    path = _loader.load("nccl").path
    lib = ctypes.CDLL(path)
    c_get_version = lib.ncclGetVersion
    c_get_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
    c_get_version.restype = ctypes.c_int
    box = ctypes.c_int()

    def ctypes_get_version() -> int:
        if c_get_version(ctypes.byref(box)) != 0:
            raise RuntimeError("ncclGetVersion failed")
        return box.value

    rows: dict[str, float] = {}
    rows["mpbind nccl.get_version()"] = _ns_per_call(nccl.get_version, a.calls, a.repeat)
    try:
        from nccl.bindings import nccl as nccl4py
    except ImportError:
        nccl4py = None
    if nccl4py is not None:
        rows["nccl4py get_version()"] = _ns_per_call(nccl4py.get_version, a.calls, a.repeat)
    rows["ctypes ncclGetVersion"] = _ns_per_call(ctypes_get_version, a.calls, a.repeat)
    rows["empty lambda"] = _ns_per_call(lambda: None, a.calls, a.repeat)

    ours = rows["mpbind nccl.get_version()"]
    if a.json:
        print(json.dumps({"ns_per_call": rows, "library": path}, indent=1))
        return 0
    print(f"NCCL {nccl.get_version()} from {path}; best of {a.repeat} x {a.calls} calls")
    for name, ns in rows.items():
        print(f"  {name:28s} {ns:7.1f} ns   mpbind/this = {ours / ns:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
