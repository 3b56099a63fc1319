"""Bad-input fuzz sweep over every public callable of mpbind (flat bindings and Pythonic layer).

    python tests/fuzz/sweep.py                       # the plain sweep, summary table
    python tests/fuzz/sweep.py --deep                # the deep sweep
    python tests/fuzz/sweep.py --plain --deep --jobs 2 --json result.json
    python tests/fuzz/sweep.py --sample              # the fast sample `make test` runs (both modes)
    python tests/fuzz/sweep.py --module mpbind.nccl --by-design

Plain: every argument slot of every public callable gets each value of fuzz_values.py in turn (None,
"x", -1, 2**70, NaN, 2**64, NumPy scalars, ints whose __index__ lies, text, host arrays, and array
and stream objects whose protocol lies: see --list-values), the other arguments 0; plus one call with
all arguments 0. Deep (fuzz_deep.py): each value in one slot of a valid call, from recipes per
callable, the core's private intake and the planners included.

An outcome is a finding when the call ends the process (a signal or an exit status), blocks past the
timeout, raises something other than an mpbind.errors class, TypeError, ValueError, OverflowError or
BufferError (a hostile object's own error passed on is accepted too), or, in the deep sweep, returns
where it should have refused ("accepted": a malformed array or stream object in an intake slot, an
impossible array description, a result that fails when used). Calls that end the process or block
by design (fuzz_calls.BY_DESIGN) are skipped unless --by-design is given. The exit status is 1 when
there are findings (130 when interrupted: Ctrl-C stops the sweep and reports the calls made so far).
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
import fuzz_deep as deep  # noqa: E402
import fuzz_runner as runner  # noqa: E402
import fuzz_values as values_  # noqa: E402
from fuzz_targets import CONSTRUCTOR, MODULES, Target, targets  # noqa: E402

# Opened in the parent before forking. Not cuBLASMp: without an NVIDIA driver its failed search
# leaves over 100 MB in the parent, and every fork of a larger parent is slower.
PRELOAD = ("nccl", "nvshmem", "cufftmp")
FINDINGS = ("signal", "exit", "timeout", "unacceptable", "accepted")
GIB = 1 << 30
BY_DESIGN_ROW = "(by design)"  # the summary's row for fuzz_calls.BY_DESIGN and BY_DESIGN_CALLS


# --- in the child ------------------------------------------------------------------------------

def _exception(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = "<str() failed>"
    return {"exception": name, "message": message[:300], "acceptable": calls_.acceptable(exc)}


def _raised(exc: BaseException) -> dict[str, Any]:
    return {"outcome": "raised", **_exception(exc)}


def execute_deep(call: deep.DeepCall, state: deep.State) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result = deep.invoke(call, state)
    except KeyboardInterrupt:
        raise
    except deep.NoInstance as exc:
        rec: dict[str, Any] = {"outcome": "no-instance", "exception": str(exc)[:300]}
    except BaseException as exc:
        rec = _raised(exc)
        if call.slot < 0:
            rec["lacks"] = deep.lacks(exc)
    else:
        rec = {"outcome": "returned", "type": type(result).__name__}
        if call.slot < 0:
            rec["uses"] = deep.working_uses(result)
            shares = deep.copy_shares(result)
            if shares:
                rec["accepted"] = shares
        else:
            why, later = deep.judge(call, result)
            if why:
                rec["accepted"] = why
            elif later:
                rec.update(later=later[0], **_exception(later[1]))
        del result  # a crash while releasing it belongs to this call
    rec["ms"] = round((time.perf_counter() - started) * 1e3, 3)
    return rec


def execute_call(call: Item, state: deep.State) -> dict[str, Any]:
    if isinstance(call, deep.DeepCall):
        return execute_deep(call, state)
    instances = state.instances
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


def execute_probe(probe: tuple[str, str, str], state: deep.State) -> dict[str, Any]:
    module, owner, recipe = probe
    try:
        obj = state.instances.get(module, recipe)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return _raised(exc)
    return {"outcome": "returned", "instance": isinstance(obj, getattr(importlib.import_module(module), owner))}


# --- in the parent -----------------------------------------------------------------------------

def category(rec: dict[str, Any]) -> str:
    """returned | acceptable | unacceptable | accepted | signal | exit | timeout | no-instance | not-run"""
    outcome = rec["outcome"]
    if outcome == "raised":
        return "acceptable" if rec["acceptable"] else "unacceptable"
    if outcome == "returned" and "later" in rec:  # its result failed when used
        return "accepted" if rec["acceptable"] else "unacceptable"
    if outcome == "returned" and "accepted" in rec:
        return "accepted"
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
    results = runner.run(batches, execute_probe, deep.State, jobs=opts.jobs, timeout=opts.timeout,
                         workdir=workdir, memory=opts.memory)
    found = {}
    for t, batch, recs in zip(ctors, batches, results, strict=True):
        for (_, _, recipe), rec in zip(batch, recs, strict=True):
            if rec.get("instance"):
                found[t.id] = recipe
                break
    return found


Item = calls_.Call | calls_.Scenario | deep.DeepCall


def plan(ts: list[Target], recipes: dict[str, str], opts: argparse.Namespace
         ) -> tuple[list[list[Item]], list[dict[str, Any]]]:
    """One batch per target; and the targets left out (by design, or no instance to call them on)."""
    def make(t: Target, recipe: str | None = None) -> list[calls_.Call]:
        return calls_.sample(t, recipe) if opts.sample else calls_.full(t, recipe, opts.values)

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


def recipe_status(rec: dict[str, Any]) -> str:
    """What the valid call of a recipe did: valid | needs GPU | needs a package | no instance (without a
    GPU) | invalid | a finding's category."""
    cat = category(rec)
    if cat == "returned":
        return "valid"
    if cat == "no-instance":
        return "no instance"
    if cat == "acceptable":
        return f"needs {'a ' if rec['lacks'] == 'package' else ''}{rec['lacks']}" if rec.get("lacks") else "invalid"
    return cat


def probe_recipes(rs: list[deep.Recipe], opts: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """Each recipe's valid call, in children (it may crash): its record."""
    batches = pack([[deep.DeepCall(r, -1, "")] for r in rs], opts.batch)
    results = runner.run(batches, execute_call, deep.State, jobs=opts.jobs, timeout=opts.timeout, workdir=workdir,
                         memory=opts.memory)
    return [rec for recs in results for rec in recs]


def plan_deep(rs: list[deep.Recipe], probes: list[dict[str, Any]], opts: argparse.Namespace
              ) -> tuple[list[list[Item]], list[dict[str, Any]]]:
    """One batch per recipe that can be swept (valid, or stopped at the library: its checks ran
    first); and every recipe's status."""
    batches: list[list[Item]] = []
    status = []
    for r, rec in zip(rs, probes, strict=True):
        st = recipe_status(rec)
        if st == "invalid" and not r.curated:
            continue  # a derived call the callable refuses: nothing valid to keep
        swept = st not in ("invalid", "no instance")
        t = r.target
        if opts.sample:
            pairs = deep.sample_slots(r, values_.values_for(t.module, t.name, calls_.sample_values()))
        else:
            pairs = [(i, v) for i in range(len(r.slots)) for v in values_.values_for(t.module, t.name, opts.values)]
        if swept:
            batches.append([deep.DeepCall(r, i, v, tuple(rec.get("uses", ()))) for i, v in pairs])
        status.append({"target": t.id, "module": t.module, "recipe": r.source, "curated": r.curated,
                       "status": st, "slots": len(r.slots), "calls": len(pairs) if swept else 0,
                       "why": rec.get("message") or rec.get("exception") or ""})
    return batches, status


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
                "param": None, "value": None, "mode": "plain", "category": category(rec), "by_design": call.why,
                **rec}
    t = call.target
    out = {"call": call.render(), "target": t.id, "module": t.module, "kind": t.kind, "param": call.param,
           "value": call.value if call.param is not None else None, "category": category(rec), **rec}
    if isinstance(call, deep.DeepCall):
        return {**out, "mode": "deep", "recipe": call.recipe.source}
    out["mode"] = "plain"
    if t.id in calls_.BY_DESIGN:
        out["module"], out["by_design"] = BY_DESIGN_ROW, calls_.BY_DESIGN[t.id]
    return out


def row(r: dict[str, Any]) -> str:
    """The summary's row of a record: its module, and the mode when deep."""
    return r["module"] + (" (deep)" if r.get("mode") == "deep" else "")


def _accepted(r: dict[str, Any]) -> str:
    """The kind of an accepted call's flaw (its details are in its record)."""
    return r["accepted"].split(":")[0] if "accepted" in r else f"its result's {r['later']} raised {r['exception']}"


def summarise(all_records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by category, kind of finding and module; by-design calls only in their own row."""
    records = [r for r in all_records if "by_design" not in r]
    cats = Counter(r["category"] for r in records)
    by_module: dict[str, Counter[str]] = {}
    for r in records:
        by_module.setdefault(row(r), Counter())[r["category"]] += 1
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
        "accepted": dict(Counter(_accepted(r) for r in records if r["category"] == "accepted").most_common()),
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
    if cat == "accepted":
        return f"returned (accepted): {r.get('accepted') or _accepted(r)}"
    if cat in ("acceptable", "unacceptable"):
        return f"raised {r['exception']}: {r['message'][:100]}"
    return f"{cat} {r.get('type', '')}".strip()


def print_summary(s: dict[str, Any], left_out: list[dict[str, Any]], recipes: list[dict[str, Any]],
                  seconds: float) -> None:
    cats = s["categories"]
    print(f"\n{s['calls']} calls (by design left aside) in {seconds:.0f} s: {cats.get('returned', 0)} returned, "
          f"{cats.get('acceptable', 0)} raised an acceptable exception, {s['findings']} findings")
    cols = ("returned", "acceptable", "unacceptable", "accepted", "signal", "exit", "timeout")
    print(f"\n{'module':33} {'calls':>7} " + " ".join(f"{c:>12}" for c in cols))
    for module, c in s["by_module"].items():
        print(f"{module:33} {sum(c.values()):>7} " + " ".join(f"{c.get(k, 0):>12}" for k in cols))
    print("\nfindings by kind:")
    for sig, n in sorted(s["signals"].items()):
        print(f"  killed by {sig:28} {n:>7}")
    for status, n in sorted(s["exits"].items()):
        print(f"  process exited, status {status:15} {n:>7}")
    for how, n in s["timeouts"].items():
        print(f"  timed out, {how:27} {n:>7}")
    for exc, n in s["unacceptable"].items():
        print(f"  raised {exc:31} {n:>7}")
    for why, n in s["accepted"].items():
        print(f"  accepted: {why[:60]:60} {n:>7}")
    if not s["findings"]:
        print("  none")
    if recipes:
        print_recipes(recipes)
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


def print_recipes(recipes: list[dict[str, Any]]) -> None:
    by_status = Counter(r["status"] for r in recipes)
    print(f"\ndeep recipes: {len(recipes)} (" + ", ".join(f"{n} {st}" for st, n in by_status.most_common()) + ")")
    gpu = sorted({r["target"] for r in recipes if r["status"] in ("needs GPU", "no instance")})
    if gpu:
        print(f"  needs GPU ({len(gpu)} callables; swept where the instance was made): " + ", ".join(gpu))
    package = sorted({r["target"] for r in recipes if r["status"] == "needs a package"})
    if package:
        print(f"  needs a package ({len(package)} callables): " + ", ".join(package))
    for r in recipes:
        if r["curated"] and r["status"] not in ("valid", "needs GPU", "needs a package", "no instance"):
            print(f"  recipe {r['status']}: {r['recipe']}\n      -> {r['why'][:150]}")


def write_json(path: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """One JSON document, each call on a line of its own (grep finds a call with its outcome)."""
    with open(path, "w") as f:
        f.write(json.dumps(head, indent=1)[:-2] + ',\n "calls": [\n')
        f.write(",\n".join(json.dumps(r, separators=(",", ":")) for r in records))
        f.write("\n]}\n")


def _options(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plain", action="store_true", help="the plain sweep (the default without --deep)")
    ap.add_argument("--deep", action="store_true", help="the deep sweep: other arguments valid (fuzz_deep.py)")
    ap.add_argument("--sample", action="store_true",
                    help="one value per argument slot (and, deep, the sentinels in every intake slot), 3 element "
                         "types of each per-type family; both modes unless --plain or --deep says")
    ap.add_argument("--jobs", type=int, default=2, help="child processes at once (default 2)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds one call may take (default 10)")
    ap.add_argument("--memory", type=float, default=2.0,
                    help="GiB a child may allocate beyond its start (default 2; 0: no limit)")
    ap.add_argument("--module", action="append", choices=MODULES + deep.PRIVATE_MODULES,
                    help="only these modules (repeatable; the private ones are the deep sweep's)")
    ap.add_argument("--match", help="only targets whose id contains this text")
    groups = sorted({v.group for v in values_.VALUES.values()})
    ap.add_argument("--values", action="append", choices=groups, help="only values of these groups (repeatable)")
    ap.add_argument("--list-values", action="store_true", help="print the values by group and exit")
    ap.add_argument("--batch", type=int, default=300,
                    help="calls per child, whole callables packed together (default 300; 1: a child per callable)")
    ap.add_argument("--by-design", action="store_true", help="also run the calls that end or block by design")
    ap.add_argument("--no-preload", action="store_true", help="let every child load the libraries itself")
    ap.add_argument("--json", type=Path, help="write every call and its outcome here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    opts = ap.parse_args(argv)
    if not (opts.plain or opts.deep):
        opts.plain, opts.deep = True, opts.sample
    opts.values = tuple(s for s, v in values_.VALUES.items() if not opts.values or v.group in opts.values)
    opts.memory = int(opts.memory * GIB) or None
    return opts


def _list_values() -> None:
    for group in sorted({v.group for v in values_.VALUES.values()}):
        print(f"{group}:")
        for v in values_.VALUES.values():
            if v.group == group:
                flags = [f for f in ("malformed", "slow", "sentinel") if getattr(v, f)]
                print(f"  {v.source}" + (f"  ({', '.join(flags)})" if flags else ""))


def main(argv: list[str] | None = None) -> int:
    opts = _options(argv)
    if opts.list_values:
        _list_values()
        return 0
    started = time.monotonic()
    modules = tuple(opts.module or MODULES + deep.PRIVATE_MODULES)
    public = targets(tuple(m for m in modules if m in MODULES))
    if opts.match:
        public = [t for t in public if opts.match in t.id]
    ts = calls_.sample_targets(public) if opts.sample else public
    loaded = {} if opts.no_preload else preload()
    recipes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mpbind-fuzz-") as tmp:
        workdir = Path(tmp)
        os.environ["TMPDIR"] = tmp  # files the calls create stay in the working directory
        instances: dict[str, str] = {}
        batches: list[list[Item]] = []
        left_out: list[dict[str, Any]] = []
        if opts.plain:
            instances = find_instances(ts, opts, workdir)
            per_target, left_out = plan(ts, instances, opts)
            batches += pack(per_target, opts.batch)
        probes: list[tuple[Item, dict[str, Any]]] = []
        if opts.deep:
            rs = [r for r in deep.recipes(public, modules) if not opts.match or opts.match in r.target.id]
            probed = probe_recipes(rs, opts, workdir)
            probes = [(deep.DeepCall(r, -1, ""), rec) for r, rec in zip(rs, probed, strict=True)]
            per_recipe, recipes = plan_deep(rs, probed, opts)
            batches += pack(per_recipe, opts.batch)
        progress = None if opts.quiet else runner.Progress(sum(len(b) for b in batches))
        results = runner.run(batches, execute_call, deep.State, jobs=opts.jobs, timeout=opts.timeout,
                             workdir=workdir, progress=progress, memory=opts.memory)
    pairs = [(c, r) for batch, recs in zip(batches, results, strict=True) for c, r in zip(batch, recs, strict=True)]
    # The valid calls of the recipes swept are calls like any other (a crash there is a finding).
    swept = {r["recipe"] for r in recipes if r["calls"] or r["status"] in FINDINGS}
    records = [describe(c, r) for c, r in pairs + [p for p in probes if p[0].recipe.source in swept]]
    seconds = time.monotonic() - started
    summary = summarise(records)
    print_summary(summary, left_out, recipes, seconds)
    if opts.json:
        import mpbind

        modes = [m for m in ("plain", "deep") if getattr(opts, m)]
        meta = {"mpbind": mpbind.__version__, "python": platform.python_version(), "machine": platform.node(),
                "modes": modes, "sample": opts.sample, "jobs": opts.jobs, "timeout_s": opts.timeout,
                "memory_gib": (opts.memory or 0) / GIB, "seconds": round(seconds, 1), "modules": list(modules),
                "libraries": loaded, "values": list(opts.values), "by_design": calls_.BY_DESIGN,
                "instances": instances}
        write_json(opts.json, {"meta": meta, "summary": summary, "left_out": left_out, "recipes": recipes}, records)
    if summary["categories"].get("not-run"):
        return 130
    return 1 if summary["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
