"""A fast, deterministic sample of the bad-input fuzz sweep (tests/fuzz/sweep.py), both modes.

Plain: every public callable of both layers (of NVSHMEM's per-type functions, three element types
per family) is called with all arguments 0 and with one value per argument slot. Deep: every recipe
(tests/fuzz/fuzz_deep.py) with one value per slot while the other arguments stay valid, and the
sentinels (the hostile array objects that found crashes and wrapped sizes) in every intake slot.
The sample runs once, in a subprocess (its children are forked from a process that has imported
nothing else); then each module of each mode is checked for crashes, process exits, hangs,
unacceptable exception classes and accepted malformed input separately
(test_no_finding[<module>-<mode>-<kind>]), with example calls in the failure message.
`python tests/fuzz/sweep.py [--deep] --module <module>` gives the full picture of one module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fuzz_deep import recipe_modules
from fuzz_targets import MODULES, Param, targets

HERE = Path(__file__).parent

EXAMPLES = 12


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fuzz") / "sample.json"
    proc = subprocess.run([sys.executable, str(HERE / "sweep.py"), "--sample", "--quiet", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    # 0: no findings, 1: findings (checked per module below); anything else: the harness failed.
    assert proc.returncode in (0, 1) and out.is_file(), proc.stdout + proc.stderr
    return dict(json.loads(out.read_text()))


def _explain(found: list[dict[str, Any]], what: str, module: str, mode: str) -> str:
    lines = [f"{len(found)} sampled calls of {module} ({mode}) {what}; for example:"]
    for c in found[:EXAMPLES]:
        detail = c.get("signal") or c.get("status") or c.get("exception") or c.get("accepted") or ""
        if c["category"] == "timeout":
            detail = "interruptible" if c.get("interruptible") else "not interruptible"
        said = c.get("message") or "".join((c.get("log") or "").splitlines()[-1:])  # the library's last words
        lines.append(f"  {c['call']}  ->  {c['category']} {detail}  {said[:150]}".rstrip())
    lines.append(f"(python tests/fuzz/sweep.py --{mode} --module {module} --json out.json: every call and its "
                 "outcome)")
    return "\n".join(lines)


# (module, mode): the rows of the sweep's summary.
ROWS = [(m, "plain") for m in MODULES] + [(m, "deep") for m in recipe_modules()]


def test_sample_covers_every_module(sample: dict[str, Any]) -> None:
    seen = {(c["module"], c["mode"]) for c in sample["calls"]}
    assert {m for m, mode in seen if mode == "plain"} == set(MODULES)
    # Deep: every module with a recipe, called where one could be (without a GPU, not all can).
    assert {r["module"] for r in sample["recipes"]} >= set(recipe_modules())
    assert {(m, mode) for m, mode in seen if mode == "deep"} == {(r["module"], "deep") for r in sample["recipes"]
                                                                 if r["calls"]}
    assert sample["summary"]["categories"].get("not-run", 0) == 0


def test_every_curated_recipe_is_a_valid_call(sample: dict[str, Any]) -> None:
    """A curated deep recipe returns, or stops only where this machine lacks a GPU or a package."""
    broken = [f"{r['recipe']}: {r['status']}: {r['why'][:150]}" for r in sample["recipes"]
              if r["curated"] and r["status"] not in ("valid", "needs GPU", "needs a package", "no instance")]
    assert not broken, "\n".join(broken)


def test_the_sentinels_reach_the_core_intake_and_the_check_runners(sample: dict[str, Any]) -> None:
    from fuzz_values import VALUES

    sentinels = {s for s, v in VALUES.items() if v.sentinel}
    for target in ("mpbind._core.array_info", "mpbind._core._testing.nccl_plan", "mpbind._core._testing.nvshmem_plan"):
        tried = {c["value"] for c in sample["calls"] if c["mode"] == "deep" and c["target"] == target}
        assert sentinels <= tried, target


def test_a_function_of_star_args_gets_one_slot() -> None:
    found = {t.name: t.params for t in targets(("mpbind",))}
    assert found["load_libraries"] == (Param("names", optional=True),)


# Each kind of finding: the outcome category of its calls, and what they did.
FINDINGS = {
    "crash": ("signal", "were killed by a signal"),
    "exit": ("exit", "ended the process"),
    "hang": ("timeout", "did not return within the timeout"),
    "exception": ("unacceptable", "raised something other than an mpbind.errors class, TypeError, ValueError, "
                                  "OverflowError or BufferError"),
    "accepted": ("accepted", "returned where they should have refused (a malformed array or stream object, an "
                             "impossible description, a result that fails when used)"),
}


@pytest.mark.parametrize("finding", FINDINGS)
@pytest.mark.parametrize(("module", "mode"), ROWS, ids=[f"{m}-{mode}" for m, mode in ROWS])
def test_no_finding(sample: dict[str, Any], module: str, mode: str, finding: str) -> None:
    category, what = FINDINGS[finding]
    found = [c for c in sample["calls"] if c["module"] == module and c["mode"] == mode and c["category"] == category]
    assert not found, _explain(found, what, module, mode)
