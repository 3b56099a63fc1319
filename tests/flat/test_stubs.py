"""The generated stubs: they match the runtime module (stubtest) and carry real types (mypy)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALLOWLIST = HERE / "stubtest_allowlist.txt"
TYPED_EXAMPLE = HERE / "typed_example.py"

# Each line must be rejected by mypy, with the error code given.
BAD_SNIPPET = """\
from mpbind.bindings import nccl

rank = nccl.comm_count("not a communicator")
comm: nccl.Comm = 5
text: int = nccl.get_error_string(nccl.Result.SUCCESS)
config = nccl.Config(blocking="yes")
uid: bytes = nccl.get_unique_id()
dtype: nccl.DataType = nccl.Result.SUCCESS
"""
BAD_LINES = {3: "arg-type", 4: "assignment", 5: "assignment", 6: "arg-type", 7: "assignment", 8: "assignment"}


def _empty_config(tmp_path: Path) -> str:
    """A mypy config of defaults only, so that no user or project config changes the run."""
    path = tmp_path / "mypy.ini"
    path.write_text("[mypy]\n")
    return str(path)


def test_stubtest(tmp_path: Path) -> None:
    # --ignore-disjoint-bases: PEP 800 (@disjoint_base) is still a draft that stubtest checks
    # behind this switch; every cdef class is a disjoint base at runtime.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "mpbind.bindings.nccl", "--allowlist", str(ALLOWLIST),
         "--ignore-disjoint-bases", "--mypy-config-file", _empty_config(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_accepts_the_typed_example_and_rejects_misuse(tmp_path: Path) -> None:
    bad = tmp_path / "bad_usage.py"
    bad.write_text(BAD_SNIPPET)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
         "--config-file", _empty_config(tmp_path), str(TYPED_EXAMPLE), str(bad)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert TYPED_EXAMPLE.name not in out, out
    found = {int(m[1]): m[2] for m in re.finditer(r"bad_usage\.py:(\d+): error: .*\[([\w-]+)\]$", out, re.M)}
    assert found == BAD_LINES, out
    assert proc.returncode == 1
