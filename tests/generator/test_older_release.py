"""The NCCL bindings of an older release, generated from that release's nccl.h (a committed fixture)
into a temporary folder: what `codegen/generate.py --headers DIR --release V --out DIR` does, and
what a bump to another release relies on."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RELEASE = "2.28.9"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / f"nccl-{RELEASE}"


@dataclass
class Generated:
    out: Path
    stdout: str
    ir: dict[str, Any]
    pinned: dict[str, Any]


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory, generator: Callable[[str], ModuleType]) -> Generated:
    pytest.importorskip("clang.cindex", reason="libclang parses the headers")
    from cuda.pathfinder import find_nvidia_header_directory

    if not find_nvidia_header_directory("cudart"):
        pytest.skip("no CUDA runtime headers: nccl.h includes cuda_runtime.h")
    out = tmp_path_factory.mktemp("nccl_old")
    proc = subprocess.run(
        [sys.executable, str(REPO / "codegen" / "generate.py"), "--lib", "nccl", "--headers", str(FIXTURE),
         "--release", RELEASE, "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ir = json.loads((out / "codegen" / "ir" / "nccl.json").read_text())
    pinned = json.loads((REPO / "codegen" / "ir" / "nccl.json").read_text())
    return Generated(out, proc.stdout, ir, pinned)


def test_the_ir_is_that_of_the_old_release(old: Generated, generator: Callable[[str], ModuleType]) -> None:
    key = generator("since").release_key
    assert old.ir["version"] == RELEASE != old.pinned["version"]
    assert old.ir["headers"] == {"nccl.h": hashlib.sha256((FIXTURE / "nccl.h").read_bytes()).hexdigest()}
    bound = [f for f in old.ir["functions"] if "excluded" not in f]
    assert len(bound) >= 30
    assert [f["name"] for f in bound if key(f["since"].removeprefix("<=")) > key(RELEASE)] == []


def test_what_the_old_header_lacks_is_absent_and_listed(old: Generated) -> None:
    names = {f["name"] for f in old.ir["functions"]}
    later = {f["name"]: f for f in old.pinned["functions"] if f["name"] not in names}
    # Later additions: the parameter registry (2.30), Grow (2.29), the collectives' Config variants (2.31).
    assert {"ncclCommGrow", "ncclParamGet", "ncclAllReduceConfig", "ncclSetEncryption"} <= set(later)
    # What 2.28.9 has stays, as the pinned spec describes it.
    assert {"ncclCommShrink", "ncclCommWindowRegister", "ncclAlltoAll", "ncclCommRevoke"} <= names
    assert "missing header: nccl_device/host.h" in old.stdout.splitlines()
    listed = {line.removeprefix("not declared: ") for line in old.stdout.splitlines()
              if line.startswith("not declared: ")}
    assert {"ncclCommGrow", "ncclParamGet", "ncclAllReduceConfig"} <= listed <= set(later)
    module = (old.out / "src" / "mpbind" / "bindings" / "nccl.pyx").read_text()
    stub = (old.out / "src" / "mpbind" / "bindings" / "nccl.pyi").read_text()
    for f in later.values():
        if "python" in f:
            assert f"def {f['python']}(" not in module and f"def {f['python']}(" not in stub, f["name"]
    shrink = next(f for f in old.ir["functions"] if f["name"] == "ncclCommShrink")
    assert [p["role"] for p in shrink["params"]][:3] == ["in", "in_array", "length"]


def test_every_file_is_sealed_with_the_old_version(old: Generated, generator: Callable[[str], ModuleType]) -> None:
    common = generator("emit_common")
    files = [p for p in old.out.rglob("*") if p.is_file() and p.suffix in {".pyx", ".pxd", ".pyi", ".py"}]
    # the library's six, _status.py and _coverage.py (every library's), _common.pxd/.pyx (no library's)
    assert len(files) == 10
    for path in files:
        text = path.read_text()
        digest, body = common.unseal(text)
        assert digest == common.body_digest(body), path
        if path.name not in {"_status.py", "_coverage.py", "_common.pxd", "_common.pyx"}:
            assert f"(NCCL {RELEASE})" in text.splitlines()[0], path
    coverage = (old.out / "src" / "mpbind" / "bindings" / "_coverage.py").read_text()
    assert f"'nccl': '{RELEASE}'" in coverage or f'"nccl": "{RELEASE}"' in coverage


def test_the_old_bindings_cythonize(old: Generated, tmp_path: Path) -> None:
    cython = shutil.which("cython", path=str(Path(sys.executable).parent)) or shutil.which("cython")
    if cython is None:
        pytest.skip("Cython is not installed")
    src = tmp_path / "src"
    shutil.copytree(old.out / "src", src)
    # Packages, so that `cimport mpbind.bindings.cynccl` finds these pxd files, not an installed mpbind's.
    for pkg in ("mpbind", "mpbind/bindings", "mpbind/bindings/_internal"):
        (src / pkg / "__init__.py").touch()
    for pyx in ("mpbind/bindings/cynccl.pyx", "mpbind/bindings/_internal/nccl.pyx", "mpbind/bindings/nccl.pyx"):
        proc = subprocess.run([cython, "-3", "--cplus", "-M", "-I", ".", pyx, "-o", str(tmp_path / "out.cpp")],
                              cwd=src, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        deps = (tmp_path / "out.cpp.dep").read_text().split()
        assert "mpbind/bindings/cynccl.pxd" in deps, deps
