"""cuBLASMp bindings without a GPU: coverage against libcublasmp's exports, the clear error where
there is no NVIDIA driver or the process's NCCL is too old, and the typed attributes.

(Values as the compiler sees the headers: tests/generator/test_compiler_probe.py; the stubs:
tests/flat/test_stubs.py.)"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mpbind._infra import info as _info
from mpbind.bindings import cublasmp

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
IR: dict[str, Any] = json.loads((REPO / "codegen" / "ir" / "cublasmp.json").read_text())


def _dist(name: str) -> md.Distribution:
    try:
        return md.distribution(name)
    except md.PackageNotFoundError:
        pytest.skip(f"{name} is not installed")


def test_all_71_functions_are_bound_and_callable() -> None:
    dist = _dist("nvidia-cublasmp-cu13")
    lib = str(dist.locate_file("nvidia/cublasmp/cu13/lib/libcublasmp.so.0"))
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1].split("@")[0] for line in out.splitlines() if "cublasMp" in line}
    bound = {f["name"]: f["python"] for f in IR["functions"] if "python" in f}
    assert len(bound) == 71 and set(bound) == exported
    for python in bound.values():
        assert callable(getattr(cublasmp, python)), python
    # _bufferSize functions return (device bytes, host bytes)
    assert cublasmp.matmul_buffer_size.__doc__ and "Returns tuple[int, int]" in cublasmp.matmul_buffer_size.__doc__


def test_no_driver_gives_a_clear_error() -> None:
    count, _ = _info.gpu_count()
    if count:
        pytest.skip("a GPU driver is present")
    from mpbind.errors import LibraryNotFoundError

    with pytest.raises(LibraryNotFoundError, match=r"libcuda\.so\.1.*NVIDIA driver"):
        cublasmp.get_version()


def test_an_old_nccl_gives_a_clear_error(tmp_path: Path, c_compiler: str) -> None:
    src = tmp_path / "fake_nccl.c"
    src.write_text("int ncclGetVersion(int* v) { *v = 22809; return 0; }\n")
    lib = tmp_path / "libnccl.so.2"
    subprocess.run([c_compiler, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    code = textwrap.dedent("""
        from mpbind.bindings import cublasmp
        from mpbind.errors import LibraryNotFoundError
        try:
            cublasmp.get_version()
        except LibraryNotFoundError as exc:
            print(exc)
    """)
    env = dict(os.environ, MPBIND_NCCL_PATH=str(lib))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "needs nccl >= 2.29.2" in out.stdout and "2.28.9" in out.stdout, out.stdout


def test_logger_callback_is_checked_before_the_library() -> None:
    with pytest.raises(TypeError, match="callable"):
        cublasmp.logger_set_callback(42)  # type: ignore[arg-type]


def test_attribute_types_are_those_the_header_documents() -> None:
    header = (Path(str(_dist("nvidia-cublasmp-cu13").locate_file("nvidia/cublasmp/cu13/include")))
              / "cublasmp.h").read_text()
    documented = {
        name: " ".join(ctype.replace("*", " *").split())
        for ctype, name in __import__("re").findall(
            r"Type:\s*((?:const\s+)?\w+\s*\*?)\.?[^/]*?\*/\s*CUBLASMP_MATMUL_DESCRIPTOR_ATTRIBUTE_(\w+)\s*=", header)
    }
    table = {attr.name: ctype for attr, (ctype, _, _) in cublasmp.MATMUL_DESCRIPTOR_ATTRIBUTE_TYPES.items()}
    assert len(documented) == len(cublasmp.MatmulDescriptorAttribute) == 29
    assert table == documented


@pytest.mark.parametrize(("attr", "value", "message"), [
    ("TRANSA", 1.5, "cublasOperation_t"),
    ("TRANSA", 99, "not one of its values"),
    ("EPILOGUE", "relu", "cublasMpMatmulEpilogue_t"),
    ("COMMUNICATION_SM_COUNT", 2**40, "int32_t"),
    ("BIAS_POINTER", -1, "void *"),
])
def test_typed_attribute_refuses_wrong_values_before_the_library(attr: str, value: object, message: str) -> None:
    from mpbind.errors import UsageError

    with pytest.raises(UsageError, match=message):
        cublasmp.matmul_descriptor_set(0, cublasmp.MatmulDescriptorAttribute[attr], value)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="unknown"):
        cublasmp.matmul_descriptor_get(0, 999)
