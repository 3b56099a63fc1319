"""Import time of mpbind's modules: the median over fresh processes of what `python -X importtime` reports.

    python benchmarks/import_time.py [--runs K] [--against DIR] [--json] [MODULE ...]

Each run is a new interpreter importing one module; the figure is that module's cumulative import
time (everything it imports that the interpreter had not loaded at start-up). Also listed: whether
NumPy or typing were imported. --against DIR times the mpbind package in DIR too (another build,
e.g. main's, installed with `pip install --target DIR .`), alternating with this install run by run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

MODULES = ["mpbind", "mpbind.bindings.nccl", "mpbind.nccl", "mpbind.nvshmem", "mpbind.cufftmp", "mpbind.cublasmp"]
PROBE = "import sys, {module}; print(sorted(m for m in ('numpy', 'typing') if m in sys.modules))"


def _once(module: str, pythonpath: str | None) -> tuple[float, list[str]]:
    """ms to import `module` in a fresh interpreter, and which of numpy and typing it imported."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE.format(module=module)], env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"importing {module} failed:\n{proc.stderr[-3000:]}")
    found = re.search(rf"^import time:\s+\d+ \|\s+(\d+) \| {re.escape(module)}$", proc.stderr, re.M)
    if found is None:
        raise SystemExit(f"no import time for {module} in:\n{proc.stderr[-3000:]}")
    return int(found[1]) / 1000, eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own printout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", default=MODULES)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--against", help="a folder holding another mpbind package, timed alternately")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    installs = {"this": None} if a.against is None else {"base": os.path.abspath(a.against), "this": None}
    table: dict[str, dict[str, dict[str, object]]] = {}
    for module in a.modules:
        times: dict[str, list[float]] = {label: [] for label in installs}
        loaded: dict[str, list[str]] = {}
        for k in range(a.runs):
            order = list(installs.items())
            for label, path in order if k % 2 == 0 else order[::-1]:
                ms, loaded[label] = _once(module, path)
                times[label].append(ms)
        table[module] = {label: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                                 "imports": loaded[label]} for label, t in times.items()}
    if a.json:
        print(json.dumps({"runs": a.runs, "python": sys.version.split()[0], "modules": table}, indent=1))
        return 0
    print(f"Python {sys.version.split()[0]}, {a.runs} fresh processes per module; -X importtime, cumulative ms")
    for module, rows in table.items():
        for label, r in rows.items():
            also = ", ".join(r["imports"]) or "neither numpy nor typing"  # type: ignore[arg-type]
            print(f"  {module:22s} {label:4s} median {r['median_ms']:6.1f}  (min {r['min_ms']:.1f}, "
                  f"max {r['max_ms']:.1f})  imports {also}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
