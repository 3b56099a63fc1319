"""cuFFTMp bindings without a GPU: coverage against libcufftMp's exports, real version queries
and typed failures.

(Values as the compiler sees the headers: tests/generator/test_compiler_probe.py; the stubs:
tests/flat/test_stubs.py.)"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import pickle
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mpbind._infra import info as _info
from mpbind._infra import loader as _loader
from mpbind.bindings import cufftmp
from mpbind.errors import CuFFTMpError, UsageError

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
IR: dict[str, Any] = json.loads((REPO / "codegen" / "ir" / "cufftmp.json").read_text())
WHEEL: str = IR["wheel"]


def _pinned_wheel() -> md.Distribution:
    try:
        dist = md.distribution(WHEEL)
    except md.PackageNotFoundError:
        pytest.skip(f"{WHEEL} is not installed")
    if dist.version != IR["version"]:
        pytest.skip(f"{WHEEL} {dist.version} is installed; the bindings pin {IR['version']}")
    return dist


def _exports(path: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True)
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}


def test_every_exported_declared_function_is_bound() -> None:
    dist = _pinned_wheel()
    lib = str(dist.locate_file("nvidia/cufftmp/cu13/lib/libcufftMp.so.12"))
    exported = {n for n in _exports(lib) if n.lstrip("_").startswith("cufft")}
    declared = {f["name"]: f for f in IR["functions"]}
    problems = [n for n in sorted(exported & set(declared))
                if "python" not in declared[n] and not declared[n].get("excluded")]
    assert problems == []
    # exported but not declared by the pinned headers: nothing to bind from them
    assert sorted(exported - set(declared)) == ["cufftDebug", "cufftMpAttachReshapeComm", "cufftXtMakePlanGuru64"]


def test_bound_functions_are_callables_and_exclusions_have_reasons() -> None:
    for f in IR["functions"]:
        if "python" in f:
            assert callable(getattr(cufftmp, f["python"])), f["name"]
        else:
            assert f["excluded"].strip(), f["name"]
    excluded = sorted(f["name"] for f in IR["functions"] if "excluded" in f)
    assert excluded == ["cufftXtSetCallback", "cufftXtSetJITCallback"]


def test_version_and_properties_match_the_library(installed: dict[str, Any]) -> None:
    pin = installed["cufftmp"]  # the library of this environment's wheel family: 12.1 (cu13) or 11.4 (cu12)
    try:
        md.distribution(pin.wheel)
    except md.PackageNotFoundError:
        pytest.skip(f"{pin.wheel} is not installed")
    lib = ctypes.CDLL(_loader.load("cufftmp").path)
    version = ctypes.c_int()
    assert lib.cufftGetVersion(ctypes.byref(version)) == 0
    major, minor, patch = pin.parts[:3]  # the wheel's fourth number is its build
    assert cufftmp.get_version() == version.value == major * 1000 + minor * 100 + patch
    assert [cufftmp.get_property(i) for i in range(3)] == [major, minor, patch]
    assert _loader.loaded_version("cufftmp") == f"{major}.{minor}.{patch}"


def test_cufftmp_shares_the_process_nvshmem() -> None:
    cufft_path = _loader.load("cufftmp").path
    nvshmem_path = _loader.load("nvshmem").path
    maps = Path("/proc/self/maps").read_text()
    copies = {line.split()[-1] for line in maps.splitlines() if line.endswith("libnvshmem_host.so.3")}
    assert copies == {str(Path(nvshmem_path).resolve())}, (cufft_path, copies)


def test_create_without_a_gpu_raises_a_typed_error() -> None:
    count, _ = _info.gpu_count()
    if count:
        pytest.skip("a GPU is visible")
    with pytest.raises(CuFFTMpError) as info:
        cufftmp.create()
    err = info.value
    assert type(err) is not CuFFTMpError and err.status == type(err).status_code
    assert err.function == "cufftCreate" and "CUFFT_" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and again.status == err.status


def test_bad_input_is_refused_before_the_library() -> None:
    with pytest.raises(UsageError, match="NULL"):
        cufftmp.LibXtDesc.from_ptr(0)
    with pytest.raises(UsageError, match="rank"):
        cufftmp.mp_make_plan_decomposition(0, 3, [4, 4], [0] * 3, [4] * 3, None, [0] * 3, [4] * 3, None,
                                           cufftmp.Type.C2C, None, cufftmp.CommType.NONE)
    with pytest.raises(UsageError, match="lower_input"):
        cufftmp.xt_set_distribution(0, 3, [0, 0], [4, 4, 4], [0, 0, 0], [4, 4, 4])
    with pytest.raises(TypeError, match="mpi_comm"):
        cufftmp.mp_attach_comm(0, cufftmp.CommType.MPI, "not a communicator")
    with pytest.raises(TypeError):
        cufftmp.exec_c2c("plan", 0, 0, cufftmp.FORWARD)


def test_descriptor_structs_expose_per_gpu_pointers() -> None:
    desc = cufftmp.XtDesc()
    assert len(desc.GPUs) == len(desc.data) == len(desc.size) == cufftmp.MAX_CUDA_DESCRIPTOR_GPUS
    desc.data = [0x1000 * (i + 1) for i in range(cufftmp.MAX_CUDA_DESCRIPTOR_GPUS)]
    copy = cufftmp.XtDesc.from_ptr(desc.ptr)
    assert copy.data[:2] == (0x1000, 0x2000)
    lib = cufftmp.LibXtDesc(descriptor=desc.ptr)
    assert cufftmp.XtDesc.from_ptr(cufftmp.LibXtDesc.from_ptr(lib.ptr).descriptor).data[1] == 0x2000
