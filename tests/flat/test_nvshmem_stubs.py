"""The generated NVSHMEM stubs: they match the runtime module (stubtest) and carry real types (mypy)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALLOWLISTS = [HERE / "stubtest_allowlist.txt", HERE / "stubtest_allowlist_nvshmem.txt"]
TYPED_EXAMPLE = HERE / "typed_example_nvshmem.py"

# Each line must be rejected by mypy, with the error code given.
BAD_SNIPPET = """\
from mpbind.bindings import nvshmem

pe = nvshmem.malloc("1 MiB")
name: int = nvshmem.info_get_name()
uid: bytes = nvshmem.get_uniqueid()
nvshmem.set_attr_uniqueid_args(0, 1, nvshmem.get_uniqueid(), nvshmem.TeamConfig())
status: nvshmem.Status = nvshmem.InitStatus.NOT_INITIALIZED
major, minor, patch = nvshmem.info_get_version()
attr = nvshmem.InitAttr(no_such_field=5)
"""
BAD_LINES = {3: "arg-type", 4: "assignment", 5: "assignment", 6: "arg-type", 7: "assignment", 8: "misc",
             9: "call-arg"}


def _empty_config(tmp_path: Path) -> str:
    """A mypy config of defaults only, so that no user or project config changes the run."""
    path = tmp_path / "mypy.ini"
    path.write_text("[mypy]\n")
    return str(path)


def test_stubtest(tmp_path: Path) -> None:
    # Both modules in one run, so that every entry of both allowlists is used (stubtest
    # reports an unused entry as an error). --ignore-disjoint-bases: see test_stubs.py.
    allowlists = [arg for path in ALLOWLISTS for arg in ("--allowlist", str(path))]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "mpbind.bindings.nvshmem", "mpbind.bindings.nccl", *allowlists,
         "--ignore-disjoint-bases", "--mypy-config-file", _empty_config(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_allowlist_entry_has_a_reason() -> None:
    # Entries come in blank-line separated groups, each opened by its reason.
    groups = [block.splitlines() for block in ALLOWLISTS[1].read_text().split("\n\n") if block.strip()]
    entries = [line for group in groups for line in group if not line.startswith("#")]
    assert entries
    for group in groups:
        if any(not line.startswith("#") for line in group):
            assert group[0].startswith("#"), f"entries without a reason: {group}"


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
