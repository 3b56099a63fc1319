"""A fast, deterministic sample of the bad-input fuzz sweep (tests/fuzz/sweep.py).

Every public callable of both layers (of NVSHMEM's per-type functions, three element types per
family) is called with all arguments 0 and with one bad value per argument slot. The sample runs
once, in a subprocess (its children are forked from a process that has imported nothing else);
then each module is checked for crashes, process exits, hangs and unacceptable exception classes
separately (test_no_finding[<module>-<kind>]), with example calls in the failure message.
`python tests/fuzz/sweep.py --module <module>` gives the full picture of one module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
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


def _explain(found: list[dict[str, Any]], what: str, module: str) -> str:
    lines = [f"{len(found)} sampled calls of {module} {what}; for example:"]
    for c in found[:EXAMPLES]:
        detail = c.get("signal") or c.get("status") or c.get("exception") or ""
        if c["category"] == "timeout":
            detail = "interruptible" if c.get("interruptible") else "not interruptible"
        said = c.get("message") or "".join((c.get("log") or "").splitlines()[-1:])  # the library's last words
        lines.append(f"  {c['call']}  ->  {c['category']} {detail}  {said[:150]}".rstrip())
    lines.append(f"(python tests/fuzz/sweep.py --module {module} --json out.json: every call and its outcome)")
    return "\n".join(lines)


def test_sample_covers_every_module(sample: dict[str, Any]) -> None:
    seen = {c["module"] for c in sample["calls"]}
    assert seen == set(MODULES)
    assert sample["summary"]["categories"].get("not-run", 0) == 0


def test_a_function_of_star_args_gets_one_slot() -> None:
    found = {t.name: t.params for t in targets(("mpbind",))}
    assert found["load_libraries"] == (Param("names", optional=True),)


# Each kind of finding: the outcome category of its calls, and what they did.
FINDINGS = {
    "crash": ("signal", "were killed by a signal"),
    "exit": ("exit", "ended the process"),
    "hang": ("timeout", "did not return within the timeout"),
    "exception": ("unacceptable", "raised something other than an mpbind.errors class, TypeError, ValueError "
                                  "or OverflowError"),
}


@pytest.mark.parametrize("finding", FINDINGS)
@pytest.mark.parametrize("module", MODULES)
def test_no_finding(sample: dict[str, Any], module: str, finding: str) -> None:
    category, what = FINDINGS[finding]
    found = [c for c in sample["calls"] if c["module"] == module and c["category"] == category]
    assert not found, _explain(found, what, module)
