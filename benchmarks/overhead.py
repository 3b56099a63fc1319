"""Call overhead of the flat bindings: ns per call against anchors, or against another mpbind install.

    python benchmarks/overhead.py [--calls N] [--repeat R] [--json]
    python benchmarks/overhead.py --against DIR [--rounds K] [--nvshmem-init] [--json]

The first form times `nccl.get_version()` against nccl4py's binding of the same call (when
installed: pip install 'mpbind[bench]'), a ctypes call of ncclGetVersion on the same library
file, and an empty Python lambda. Each figure is the best of R repeats of N calls (the
least-disturbed run).

The second form compares this install with the mpbind found in DIR (a folder holding another
build's `mpbind` package, e.g. main's, installed with `pip install --target DIR .`): it runs K
rounds, each timing every call of CALLS once in a fresh process of each install, in alternating
order, and reports per call the median of each and the median of the paired differences (this -
DIR, round by round), so that load which changes during the run affects both alike. The calls
need no GPU; --nvshmem-init (a GPU) also initialises NVSHMEM with one PE and times calls that need
an initialised runtime.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable
from typing import Any


def _ns_per_call(fn: Callable[[], object], calls: int, repeat: int) -> float:
    fn()  # load the library and fill the function-pointer table first
    best = min(timeit.repeat(fn, number=calls, repeat=repeat))
    return best / calls * 1e9


def _raises(fn: Callable[[], object]) -> Callable[[], None]:
    def call() -> None:
        try:
            fn()
        except Exception:
            pass
    return call


def calls(nvshmem_init: bool) -> dict[str, Callable[[], object]]:
    """What the paired comparison times: one call per kind of argument a guard checks (none, an enum as
    an int and as an IntEnum, a nullable handle, a handle refused by the library, a struct address,
    a size_t), and NVSHMEM calls with and without the init check."""
    from mpbind.bindings import cufftmp, nccl, nvshmem

    config = nccl.Config()
    out: dict[str, Callable[[], object]] = {
        "nccl.get_version()": nccl.get_version,
        "nccl.get_error_string(0)": lambda: nccl.get_error_string(0),
        "nccl.get_error_string(Result.SUCCESS)": lambda: nccl.get_error_string(nccl.Result.SUCCESS),
        "nccl.get_last_error(0)": lambda: nccl.get_last_error(0),
        "nccl.comm_count(0) (raises NCCLInvalidArgumentError)": _raises(lambda: nccl.comm_count(0)),
        "nccl.Config.from_ptr(ptr)": lambda: nccl.Config.from_ptr(config.ptr),
        "cufftmp.get_property(0)": lambda: cufftmp.get_property(0),
        "nvshmem.my_pe() (no init check)": nvshmem.my_pe,
        "nvshmem.init_status()": nvshmem.init_status,
    }
    if nvshmem_init:
        _init_one_pe(nvshmem)
        buf = nvshmem.malloc(64)
        out["nvshmem.team_my_pe(0) (init check)"] = lambda: nvshmem.team_my_pe(0)
        out["nvshmem.team_n_pes(0) (init check)"] = lambda: nvshmem.team_n_pes(0)
        out["nvshmem.ptr(buf, 0) (init check)"] = lambda: nvshmem.ptr(buf, 0)
    return out


def _init_one_pe(nvshmem: Any) -> None:
    attr = nvshmem.InitAttr()
    nvshmem.set_attr_uniqueid_args(0, 1, nvshmem.get_uniqueid(), attr)
    nvshmem.init_attr(nvshmem.InitFlags.WITH_UNIQUEID, attr)


def _child(a: argparse.Namespace) -> int:
    import mpbind

    rows = {name: _ns_per_call(fn, a.calls, a.repeat) for name, fn in calls(a.nvshmem_init).items()}
    print(json.dumps({"mpbind": os.path.dirname(mpbind.__file__), "ns_per_call": rows}))
    return 0


def _run_child(a: argparse.Namespace, pythonpath: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--calls", str(a.calls), "--repeat", str(a.repeat)]
    if a.nvshmem_init:
        cmd.append("--nvshmem-init")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"a timing process failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def _paired(a: argparse.Namespace) -> int:
    base: list[dict[str, float]] = []
    this: list[dict[str, float]] = []
    where: dict[str, str] = {}
    for k in range(a.rounds):
        order = [("base", a.against), ("this", None)]
        for label, path in order if k % 2 == 0 else order[::-1]:
            got = _run_child(a, path)
            where[label] = got["mpbind"]
            (base if label == "base" else this).append(got["ns_per_call"])
    if where["base"] == where["this"]:
        raise SystemExit(f"both runs imported the same mpbind ({where['this']}): DIR holds no mpbind package")
    table = {}
    for name in this[0]:
        b = [r[name] for r in base]
        t = [r[name] for r in this]
        diffs = sorted(x - y for x, y in zip(t, b, strict=True))
        table[name] = {"base": statistics.median(b), "this": statistics.median(t),
                       "diff": statistics.median(diffs), "diff_q1": diffs[len(diffs) // 4],
                       "diff_q3": diffs[(3 * len(diffs)) // 4]}
    if a.json:
        print(json.dumps({"rounds": a.rounds, "calls": a.calls, "repeat": a.repeat, "base": where["base"],
                          "this": where["this"], "ns_per_call": table}, indent=1))
        return 0
    print(f"{a.rounds} rounds, each the best of {a.repeat} x {a.calls} calls per process, base and this alternating")
    print(f"  base: {where['base']}\n  this: {where['this']}")
    print(f"  {'call':55s} {'base ns':>8s} {'this ns':>8s} {'paired diff (IQR)':>22s}")
    for name, r in table.items():
        spread = f"{r['diff']:+.1f} ({r['diff_q1']:+.1f}..{r['diff_q3']:+.1f})"
        print(f"  {name:55s} {r['base']:8.1f} {r['this']:8.1f} {spread:>22s}")
    return 0


def _anchors(a: argparse.Namespace) -> int:
    from mpbind._infra import loader as _loader
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=None, help="calls per timing (default 1,000,000; 200,000 paired)")
    ap.add_argument("--repeat", type=int, default=None, help="timings per call, best kept (default 7; 5 paired)")
    ap.add_argument("--against", help="a folder holding another mpbind package to compare with, call by call")
    ap.add_argument("--rounds", type=int, default=15, help="paired rounds (default 15)")
    ap.add_argument("--nvshmem-init", action="store_true", help="also time calls after a one-PE init (GPU)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    paired = a.against is not None or a.child
    a.calls = a.calls or (200_000 if paired else 1_000_000)
    a.repeat = a.repeat or (5 if paired else 7)
    if a.child:
        return _child(a)
    if a.against is not None:
        a.against = os.path.abspath(a.against)
        return _paired(a)
    return _anchors(a)


if __name__ == "__main__":
    raise SystemExit(main())
