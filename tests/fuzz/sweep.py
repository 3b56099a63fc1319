"""Bad-input fuzz sweep over every public callable of mpbind (flat bindings and Pythonic layer).

    python tests/fuzz/sweep.py                       # full sweep, summary table
    python tests/fuzz/sweep.py --jobs 2 --json result.json
    python tests/fuzz/sweep.py --sample              # the fast sample `make test` runs
    python tests/fuzz/sweep.py --module mpbind.nccl --by-design

Every argument slot of every callable gets each of None, "x", -1, 2**70, 1.5, [], object(),
b"\\0"*8 and True in turn, the other arguments 0; plus one call with all arguments 0. An outcome
is a finding when the call ends the process (a signal or an exit status), blocks past the
timeout, or raises something other than an mpbind.errors class, TypeError, ValueError or
OverflowError. Calls that end the process or block by design (fuzz_calls.BY_DESIGN) are skipped
unless --by-design is given. The exit status is 1 when there are findings (130 when interrupted:
Ctrl-C stops the sweep and reports the calls made so far).
"""

from __future__ import annotations

import os

# Before NumPy is imported (by the layer modules): the parent forks, so it keeps one thread.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import fuzz_calls as calls_  # noqa: E402
import fuzz_runner as runner  # noqa: E402
from fuzz_targets import CONSTRUCTOR, MODULES, Target, targets  # noqa: E402

ACCEPTABLE_BUILTINS = (TypeError, ValueError, OverflowError)
# Opened in the parent before forking. Not cuBLASMp: without an NVIDIA driver its failed search
# leaves over 100 MB in the parent, and every fork of a larger parent is slower.
PRELOAD = ("nccl", "nvshmem", "cufftmp")
FINDINGS = ("signal", "exit", "timeout", "unacceptable")
BY_DESIGN_ROW = "(by design)"  # the summary's row for fuzz_calls.BY_DESIGN and BY_DESIGN_CALLS


# --- in the child ------------------------------------------------------------------------------

def _acceptable(exc: BaseException) -> bool:
    from mpbind.errors import MpbindError

    return isinstance(exc, (MpbindError, *ACCEPTABLE_BUILTINS))


def _raised(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = "<str() failed>"
    return {"outcome": "raised", "exception": name, "message": message[:300], "acceptable": _acceptable(exc)}


def execute_call(call: calls_.Call | calls_.Scenario, instances: calls_.Instances) -> dict[str, Any]:
    if isinstance(call, calls_.Call) and call.recipe is not None:
        try:
            instances.get(call.target.module, call.recipe)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the instance could not be made again in this child
            return {"outcome": "no-instance", "exception": type(exc).__name__}
    started = time.perf_counter()
    try:
        result = calls_.invoke(call, instances)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        rec = _raised(exc)
    else:
        rec = {"outcome": "returned", "type": type(result).__name__}
        del result  # a crash while releasing it belongs to this call
    rec["ms"] = round((time.perf_counter() - started) * 1e3, 3)
    return rec


def execute_probe(probe: tuple[str, str, str], instances: calls_.Instances) -> dict[str, Any]:
    module, owner, recipe = probe
    try:
        obj = instances.get(module, recipe)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return _raised(exc)
    return {"outcome": "returned", "instance": isinstance(obj, getattr(importlib.import_module(module), owner))}


# --- in the parent -----------------------------------------------------------------------------

def category(rec: dict[str, Any]) -> str:
    """returned | acceptable | unacceptable | signal | exit | timeout | no-instance | not-run"""
    outcome = rec["outcome"]
    if outcome == "raised":
        return "acceptable" if rec["acceptable"] else "unacceptable"
    return str(outcome)


def preload() -> dict[str, str]:
    """Open each library once in the parent, so that children do not search for it again."""
    loaded = {}
    for lib in PRELOAD:
        try:
            importlib.import_module(f"mpbind.bindings._internal.{lib}").symbol_address("")
            loaded[lib] = "loaded"
        except Exception as exc:
            loaded[lib] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return loaded


def find_instances(ts: list[Target], opts: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """class target id -> the first recipe that makes an instance (run in children: it may crash)."""
    wanted = {(t.module, t.owner) for t in ts if t.needs_instance}
    ctors = [t for t in ts if t.kind == CONSTRUCTOR and (t.module, t.owner) in wanted]
    batches = [[(t.module, t.owner, r) for r in calls_.default_recipes(t)] for t in ctors]
    results = runner.run(batches, execute_probe, calls_.Instances, jobs=opts.jobs, timeout=opts.timeout,
                         workdir=workdir)
    found = {}
    for t, batch, recs in zip(ctors, batches, results, strict=True):
        for (_, _, recipe), rec in zip(batch, recs, strict=True):
            if rec.get("instance"):
                found[t.id] = recipe
                break
    return found


Item = calls_.Call | calls_.Scenario


def plan(ts: list[Target], recipes: dict[str, str], opts: argparse.Namespace
         ) -> tuple[list[list[Item]], list[dict[str, Any]]]:
    """One batch per target; and the targets left out (by design, or no instance to call them on)."""
    make = calls_.sample if opts.sample else calls_.full
    batches: list[list[Item]] = []
    left_out = []
    for t in ts:
        if t.id in calls_.BY_DESIGN and not opts.by_design:
            left_out.append({"target": t.id, "why": "by design: " + calls_.BY_DESIGN[t.id],
                             "calls": len(make(t))})
            continue
        recipe = None
        if t.needs_instance:
            recipe = recipes.get(f"{t.module}.{t.owner}")
            if recipe is None:
                left_out.append({"target": t.id, "why": "no instance without a GPU (or any recipe)",
                                 "calls": len(make(t))})
                continue
        batches.append(list(make(t, recipe)))
    if opts.by_design:
        batches += [[calls_.Scenario(source, why)] for source, why in calls_.BY_DESIGN_CALLS.items()]
    return batches, left_out


def pack(per_target: list[list[Item]], budget: int) -> list[list[Item]]:
    """Whole targets, in order, into batches of about `budget` calls (one child each, while none dies)."""
    batches: list[list[Item]] = []
    for target_calls in per_target:
        if batches and len(batches[-1]) + len(target_calls) <= budget:
            batches[-1].extend(target_calls)
        else:
            batches.append(list(target_calls))
    return batches


def describe(call: Item, rec: dict[str, Any]) -> dict[str, Any]:
    if isinstance(call, calls_.Scenario):
        return {"call": call.render(), "target": call.source, "module": BY_DESIGN_ROW, "kind": "by design",
                "param": None, "value": None, "category": category(rec), "by_design": call.why, **rec}
    t = call.target
    out = {"call": call.render(), "target": t.id, "module": t.module, "kind": t.kind, "param": call.param,
           "value": call.value if call.param is not None else None, "category": category(rec), **rec}
    if t.id in calls_.BY_DESIGN:
        out["module"], out["by_design"] = BY_DESIGN_ROW, calls_.BY_DESIGN[t.id]
    return out


def summarise(all_records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by category, kind of finding and module; by-design calls only in their own row."""
    records = [r for r in all_records if "by_design" not in r]
    cats = Counter(r["category"] for r in records)
    by_module: dict[str, Counter[str]] = {}
    for r in records:
        by_module.setdefault(r["module"], Counter())[r["category"]] += 1
    return {
        "calls": len(records),
        "categories": dict(cats),
        "findings": sum(cats[c] for c in FINDINGS),
        "signals": dict(Counter(r["signal"] for r in records if r["category"] == "signal")),
        "exits": dict(Counter(str(r["status"]) for r in records if r["category"] == "exit")),
        "timeouts": dict(Counter("interruptible" if r["interruptible"] else "not interruptible"
                                 for r in records if r["category"] == "timeout")),
        "unacceptable": dict(Counter(r["exception"] for r in records if r["category"] == "unacceptable")
                             .most_common()),
        "by_module": {m: dict(c) for m, c in by_module.items()},
        "by_design": [{"call": r["call"], "outcome": outcome(r), "why": r["by_design"]}
                      for r in all_records if "by_design" in r],
    }


def outcome(r: dict[str, Any]) -> str:
    """One line: what the call did."""
    cat = r["category"]
    if cat == "signal":
        return f"killed by {r['signal']}"
    if cat == "exit":
        return f"process exited, status {r['status']}"
    if cat == "timeout":
        return "timed out, " + ("interrupted by SIGINT" if r["interruptible"] else "not interruptible (SIGKILL)")
    if cat in ("acceptable", "unacceptable"):
        return f"raised {r['exception']}: {r['message'][:100]}"
    return f"{cat} {r.get('type', '')}".strip()


def print_summary(s: dict[str, Any], left_out: list[dict[str, Any]], seconds: float) -> None:
    cats = s["categories"]
    print(f"\n{s['calls']} calls (by design left aside) in {seconds:.0f} s: {cats.get('returned', 0)} returned, "
          f"{cats.get('acceptable', 0)} raised an acceptable exception, {s['findings']} findings")
    cols = ("returned", "acceptable", "unacceptable", "signal", "exit", "timeout")
    print(f"\n{'module':26} {'calls':>7} " + " ".join(f"{c:>12}" for c in cols))
    for module, c in s["by_module"].items():
        print(f"{module:26} {sum(c.values()):>7} " + " ".join(f"{c.get(k, 0):>12}" for k in cols))
    print("\nfindings by kind:")
    for sig, n in sorted(s["signals"].items()):
        print(f"  killed by {sig:28} {n:>7}")
    for status, n in sorted(s["exits"].items()):
        print(f"  process exited, status {status:15} {n:>7}")
    for how, n in s["timeouts"].items():
        print(f"  timed out, {how:27} {n:>7}")
    for exc, n in s["unacceptable"].items():
        print(f"  raised {exc:31} {n:>7}")
    if not s["findings"]:
        print("  none")
    if s["by_design"]:
        print("\nby design (not findings):")
        for r in s["by_design"]:
            print(f"  {r['call']}\n      -> {r['outcome']}")
    if cats.get("no-instance"):
        print(f"\n{cats['no-instance']} calls not made: their instance could not be made again in their child")
    if cats.get("not-run"):
        print(f"\n{cats['not-run']} calls not made: the sweep was interrupted")
    if left_out:
        print(f"\nleft out: {sum(x['calls'] for x in left_out)} calls of {len(left_out)} targets "
              f"({sum(1 for x in left_out if x['why'].startswith('by design'))} by design; "
              "the rest have no instance to call them on); see the JSON")


def write_json(path: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """One JSON document, each call on a line of its own (grep finds a call with its outcome)."""
    with open(path, "w") as f:
        f.write(json.dumps(head, indent=1)[:-2] + ',\n "calls": [\n')
        f.write(",\n".join(json.dumps(r, separators=(",", ":")) for r in records))
        f.write("\n]}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="child processes at once (default 2)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds one call may take (default 10)")
    ap.add_argument("--sample", action="store_true",
                    help="one bad value per argument slot, and 3 element types of each per-type family")
    ap.add_argument("--module", action="append", choices=MODULES, help="only these modules (repeatable)")
    ap.add_argument("--match", help="only targets whose id contains this text")
    ap.add_argument("--batch", type=int, default=300,
                    help="calls per child, whole callables packed together (default 300; 1: a child per callable)")
    ap.add_argument("--by-design", action="store_true", help="also run the calls that end or block by design")
    ap.add_argument("--no-preload", action="store_true", help="let every child load the libraries itself")
    ap.add_argument("--json", type=Path, help="write every call and its outcome here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    opts = ap.parse_args(argv)

    started = time.monotonic()
    ts = targets(tuple(opts.module or MODULES))
    if opts.match:
        ts = [t for t in ts if opts.match in t.id]
    if opts.sample:
        ts = calls_.sample_targets(ts)
    loaded = {} if opts.no_preload else preload()
    with tempfile.TemporaryDirectory(prefix="mpbind-fuzz-") as tmp:
        workdir = Path(tmp)
        os.environ["TMPDIR"] = tmp  # files the calls create stay in the working directory
        recipes = find_instances(ts, opts, workdir)
        batches, left_out = plan(ts, recipes, opts)
        batches = pack(batches, opts.batch)
        progress = None if opts.quiet else runner.Progress(sum(len(b) for b in batches))
        results = runner.run(batches, execute_call, calls_.Instances, jobs=opts.jobs, timeout=opts.timeout,
                             workdir=workdir, progress=progress)
    records = [describe(c, r) for batch, recs in zip(batches, results, strict=True)
               for c, r in zip(batch, recs, strict=True)]
    seconds = time.monotonic() - started
    summary = summarise(records)
    print_summary(summary, left_out, seconds)
    if opts.json:
        import mpbind

        meta = {"mpbind": mpbind.__version__, "python": platform.python_version(), "machine": platform.node(),
                "mode": "sample" if opts.sample else "full", "jobs": opts.jobs, "timeout_s": opts.timeout,
                "seconds": round(seconds, 1), "modules": list(opts.module or MODULES), "libraries": loaded,
                "bad_values": list(calls_.BAD_VALUES), "by_design": calls_.BY_DESIGN, "instances": recipes}
        write_json(opts.json, {"meta": meta, "summary": summary, "left_out": left_out}, records)
    if summary["categories"].get("not-run"):
        return 130
    return 1 if summary["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
