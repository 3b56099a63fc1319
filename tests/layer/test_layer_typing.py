"""The Pythonic layer type-checks strictly against the core's generated stubs (mpbind/_core/*.pyi), its
runtime matches what type checkers see (stubtest), its public types are complete (verifytypes), and
streams, arrays and descriptor attributes are typed: misuse does not type-check."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

MODULES = ("mpbind.nccl", "mpbind.cublasmp", "mpbind.nvshmem", "mpbind.cufftmp", "mpbind._infra.interop",
           "mpbind.typing", "mpbind._infra.args", "mpbind._infra.placement", "mpbind._infra.optional",
           "mpbind.bootstrap", "mpbind.process_group", "mpbind.fft")  # a package: -p mpbind.fft checks fft._planner too
LAYER = ("mpbind.nccl", "mpbind.nvshmem", "mpbind.cublasmp", "mpbind.cufftmp")
# Optional extras (torch, mpi4py) and cuda-bindings ship no types.
MYPY_CONFIG = "[mypy]\n[mypy-torch.*,mpi4py.*,cuda.*]\nignore_missing_imports = True\n"

# Right usage: must type-check.
GOOD = """\
from typing import Any
from mpbind import cublasmp, nccl, nvshmem

class Stream:
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 0)

class Tensor:
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {}

def use(comm: nccl.Communicator, x: Tensor, d: cublasmp.MatmulDescriptor) -> None:
    comm.all_reduce(x, x, stream=Stream())
    comm.all_reduce((0, 4, "float32"), x, op="max", stream=7)
    nvshmem.quiet(stream=None)
    d.transa = cublasmp.CublasOperation.T
    d.communication_sm_count = 8
    op: cublasmp.CublasOperation = d.transa
    pointer: int = d.bias_pointer
"""
# Each line of USE must be rejected by mypy with the error code given.
BAD = """\
from mpbind import cublasmp, nccl, nvshmem

def use(comm: nccl.Communicator, d: cublasmp.MatmulDescriptor, x: object) -> None:
    comm.all_reduce((0, 4, "float32"), (0, 4, "float32"), stream="s")
    d.transa = "T"
    comm.all_reduce(x, x)
    nvshmem.quiet(stream=1.5)
    s: str = d.epilogue
    cublasmp.Handle(stream="s")
"""
BAD_LINES = {4: "arg-type", 5: "assignment", 6: "arg-type", 7: "arg-type", 8: "assignment", 9: "arg-type"}


def _mypy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir",
                           str(tmp_path / "cache"), *args], capture_output=True, text=True, cwd=tmp_path, timeout=600)


def test_core_stubs_cover_every_submodule() -> None:
    import mpbind
    from mpbind import _core

    stubs = Path(mpbind.__file__).parent / "_core"
    built = ["xla.pyi"] if hasattr(_core, "xla") else []  # the XLA FFI handlers, built with jaxlib's headers
    assert sorted(p.name for p in stubs.glob("*.pyi")) == [
        "__init__.pyi", "cublasmp.pyi", "cufftmp.pyi", "nccl.pyi", "nvshmem.pyi", *built]
    assert "class MatmulPlan" in (stubs / "cublasmp.pyi").read_text()


def test_layer_is_strictly_typed(tmp_path: Path) -> None:
    args = [a for m in MODULES for a in ("-p", m)]
    proc = _mypy(tmp_path, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_streams_arrays_and_attributes_are_typed(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    proc = _mypy(tmp_path, "--no-error-summary", "good.py", "bad.py")
    out = proc.stdout + proc.stderr
    assert "good.py" not in out, out
    found = {int(m[1]): m[2] for m in re.finditer(r"bad\.py:(\d+): error: .*\[([\w-]+)\]$", out, re.M)}
    assert found == BAD_LINES, out


def test_stubtest_layer_modules(tmp_path: Path) -> None:
    # No allowlist: the layer's modules are plain Python over the core's generated stubs.
    # --ignore-disjoint-bases: see tests/flat/test_stubs.py.
    config = tmp_path / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    proc = subprocess.run([sys.executable, "-m", "mypy.stubtest", *LAYER, "--ignore-disjoint-bases",
                           "--mypy-config-file", str(config)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _basedpyright() -> str:
    try:
        import basedpyright  # noqa: F401 - installed with the test extra; bundles its node runtime
    except ImportError:
        pytest.skip("basedpyright is not installed (pip install 'mpbind[test]')")
    exe = shutil.which("basedpyright", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("basedpyright's command is not next to this Python")
    return exe


def test_verifytypes_is_complete(tmp_path: Path) -> None:
    exe = _basedpyright()
    # verifytypes resolves the package with the `python` first on PATH: this interpreter's.
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run([exe, "--verifytypes", "mpbind", "--ignoreexternal", "--outputjson"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=600)
    report = json.loads(proc.stdout)
    completeness = report["typeCompleteness"]
    assert completeness["packageRootDirectory"], proc.stdout[-3000:]  # mpbind was found
    problems = [(s["name"], d["message"]) for s in completeness["symbols"] for d in s["diagnostics"]
                if d["severity"] == "error"]
    assert completeness["completenessScore"] == 1.0, problems
