"""The generated stubs of each library: they match the runtime module (stubtest, with an allowlist
whose every entry is used and has a reason) and carry real types: `mypy --strict` accepts
typed/<lib>.py and rejects each line of typed/<lib>_misuse.py marked `# error: <code>` with that code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]


def _empty_config(tmp_path: Path) -> str:
    """A mypy config of defaults only, so that no user or project config changes the run."""
    path = tmp_path / "mypy.ini"
    path.write_text("[mypy]\n")
    return str(path)


def _allowlist(lib: str) -> Path:
    return HERE / f"stubtest_allowlist_{lib}.txt"


@pytest.mark.parametrize("lib", LIBRARIES)
def test_stubtest(lib: str, tmp_path: Path) -> None:
    # An allowlist entry that matches nothing is an error too. --ignore-disjoint-bases: PEP 800
    # (@disjoint_base) is still a draft that stubtest checks behind this switch; every cdef class
    # is a disjoint base at runtime.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", f"mpbind.bindings.{lib}", "--allowlist", str(_allowlist(lib)),
         "--ignore-disjoint-bases", "--mypy-config-file", _empty_config(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("lib", LIBRARIES)
def test_every_allowlist_entry_has_a_reason(lib: str) -> None:
    # Entries come in blank-line separated groups, each opened by its reason.
    groups = [block.splitlines() for block in _allowlist(lib).read_text().split("\n\n") if block.strip()]
    entries = [line for group in groups for line in group if not line.startswith("#")]
    assert entries
    for group in groups:
        if any(not line.startswith("#") for line in group):
            assert group[0].startswith("#"), f"entries without a reason: {group}"


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for every library's run: the stubs they share are analysed once."""
    return tmp_path_factory.mktemp("mypy_cache")


@pytest.mark.parametrize("lib", LIBRARIES)
def test_mypy_accepts_the_typed_example_and_rejects_misuse(lib: str, tmp_path: Path, mypy_cache: Path) -> None:
    example = HERE / "typed" / f"{lib}.py"
    misuse = HERE / "typed" / f"{lib}_misuse.py"
    expected = {no: m[1] for no, line in enumerate(misuse.read_text().splitlines(), 1)
                if (m := re.search(r"# error: ([\w-]+)", line))}
    assert len(expected) >= 6
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(mypy_cache),
         "--config-file", _empty_config(tmp_path), str(example), str(misuse)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert example.name + ":" not in out, out
    found = {int(m[1]): m[2] for m in re.finditer(rf"{misuse.name}:(\d+): error: .*\[([\w-]+)\]$", out, re.M)}
    assert found == expected, out
    assert proc.returncode == 1
