"""The Pythonic layer type-checks strictly against the core's generated stubs (mpbind/_core/*.pyi)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

MODULES = ("mpbind.nccl", "mpbind.cublasmp", "mpbind.nvshmem", "mpbind.cufftmp", "mpbind._interop")


def test_core_stubs_cover_every_submodule() -> None:
    import mpbind

    stubs = Path(mpbind.__file__).parent / "_core"
    assert sorted(p.name for p in stubs.glob("*.pyi")) == [
        "__init__.pyi", "cublasmp.pyi", "cufftmp.pyi", "nccl.pyi", "nvshmem.pyi"]
    assert "class MatmulPlan" in (stubs / "cublasmp.pyi").read_text()


def test_layer_is_strictly_typed(tmp_path: Path) -> None:
    config = tmp_path / "mypy.ini"
    # Optional extras (torch, mpi4py) and cuda-bindings ship no types.
    config.write_text("[mypy]\n[mypy-torch.*,mpi4py.*,cuda.*]\nignore_missing_imports = True\n")
    args = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir", str(tmp_path)]
    for m in MODULES:
        args += ["-p", m]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
