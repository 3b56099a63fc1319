"""The exception hierarchy of docs/DESIGN.md and the generated per-status classes."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mpbind.errors as errors
from mpbind.bindings import _status, nccl

IR_PATH = Path(__file__).resolve().parents[2] / "codegen" / "ir" / "nccl.json"

# Result members that are not errors.
NOT_ERRORS = {"SUCCESS", "NUM_RESULTS"}


def _error_members() -> list[nccl.Result]:
    return [member for member in nccl.Result if member.name not in NOT_ERRORS]


def _camel(enum_name: str) -> str:
    """``INVALID_ARGUMENT`` -> ``InvalidArgument``."""
    return "".join(part.capitalize() for part in enum_name.split("_"))


@pytest.fixture(scope="module")
def ir() -> dict[str, Any]:
    if not IR_PATH.is_file():
        pytest.skip(f"the frozen IR is not in this checkout ({IR_PATH.name})")
    data: dict[str, Any] = json.loads(IR_PATH.read_text())
    return data


@pytest.fixture(scope="module")
def ir_functions(ir: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in ir["functions"]}


# --- hierarchy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (errors.MpbindError, (Exception,)),
        (errors.LibraryNotFoundError, (errors.MpbindError, ImportError)),
        (errors.FunctionNotFoundError, (errors.MpbindError, NotImplementedError)),
        (errors.LibraryError, (errors.MpbindError, RuntimeError)),
        (errors.UsageError, (errors.MpbindError, ValueError)),
        (errors.NCCLError, (errors.LibraryError,)),
        (errors.NVSHMEMError, (errors.LibraryError,)),
        (errors.CuBLASMpError, (errors.LibraryError,)),
        (errors.CuFFTMpError, (errors.LibraryError,)),
        (errors.CudaError, (errors.LibraryError, RuntimeError)),
    ],
)
def test_hierarchy(cls: type[BaseException], bases: tuple[type[BaseException], ...]) -> None:
    for base in bases:
        assert issubclass(cls, base), f"{cls.__name__} is not a subclass of {base.__name__}"


def test_branches_are_disjoint() -> None:
    branches = [
        errors.LibraryNotFoundError,
        errors.FunctionNotFoundError,
        errors.LibraryError,
        errors.UsageError,
    ]
    for a in branches:
        for b in branches:
            if a is not b:
                assert not issubclass(a, b), f"{a.__name__} should not derive from {b.__name__}"
    assert not issubclass(errors.UsageError, RuntimeError)
    assert not issubclass(errors.LibraryError, ValueError)


def test_cuda_error_names_the_call_and_the_cuda_error() -> None:
    err = errors.CudaError("cudaMemcpy2DAsync", 1, "cudaErrorInvalidValue", "invalid argument")
    assert str(err) == "cudaMemcpy2DAsync failed: cudaErrorInvalidValue (1): invalid argument"
    assert err.library == "cuda" and err.function == "cudaMemcpy2DAsync" and err.status == 1
    assert "CudaError" in errors.__all__ and type(err).__module__ == "mpbind.errors"
    assert "cuda" not in errors.LIBRARY_ERRORS  # the table is of the bound libraries' generated statuses


def test_library_errors_table() -> None:
    assert errors.LIBRARY_ERRORS == {
        "nccl": errors.NCCLError,
        "nvshmem": errors.NVSHMEMError,
        "cublasmp": errors.CuBLASMpError,
        "cufftmp": errors.CuFFTMpError,
    }
    for library, cls in errors.LIBRARY_ERRORS.items():
        assert cls.library == library


# --- one class per ncclResult_t error value --------------------------------------------------


def test_one_subclass_per_error_status() -> None:
    classes = {
        cls.status_code: cls
        for name in errors.__all__
        if isinstance(cls := getattr(errors, name), type)
        and issubclass(cls, errors.NCCLError)
        and cls is not errors.NCCLError
    }
    assert set(classes) == {int(m) for m in _error_members()}
    assert len(classes) == len(_error_members())


@pytest.mark.parametrize("member", _error_members(), ids=lambda m: m.name)
def test_status_class_matches_result(member: nccl.Result) -> None:
    err = _status.make_error("nccl", "ncclSomething", int(member), "descr", None)
    cls = type(err)
    assert cls is not errors.NCCLError
    assert issubclass(cls, errors.NCCLError)
    assert cls.status_code == int(member)
    # Generated names follow the C names: ncclInvalidArgument -> NCCLInvalidArgumentError.
    expected = "NCCL" + _camel(member.name)
    assert cls.__name__ in {expected, expected + "Error"}
    assert getattr(errors, cls.__name__) is cls
    assert err.status == int(member)
    assert err.library == "nccl"
    assert err.function == "ncclSomething"
    assert err.status_name is not None and err.status_name.startswith("nccl")
    assert err.status_name in str(err)
    assert f"({int(member)})" in str(err)
    assert "descr" in str(err)


@pytest.mark.parametrize("status", [0, 9])
def test_non_error_statuses_have_no_subclass(status: int) -> None:
    err = _status.make_error("nccl", "ncclFoo", status)
    assert type(err) is errors.NCCLError


def test_unknown_status_is_plain_ncclerror() -> None:
    err = _status.make_error("nccl", "ncclX", 9999)
    assert type(err) is errors.NCCLError
    assert err.status == 9999
    assert err.status_name is None
    assert err.function == "ncclX"
    assert "unknown status" in str(err)
    assert "9999" in str(err)
    assert "ncclX" in str(err)


def test_negative_unknown_status() -> None:
    err = _status.make_error("nccl", "ncclX", -3)
    assert type(err) is errors.NCCLError
    assert "unknown status" in str(err)


def test_message_with_last_error() -> None:
    err = errors.NCCLInvalidArgumentError(
        "ncclCommCount", 4, "ncclInvalidArgument", "invalid argument", "comm is NULL"
    )
    text = str(err)
    assert text.startswith("ncclCommCount failed: ncclInvalidArgument (4): invalid argument")
    assert "comm is NULL" in text
    # A last-error message equal to the description is not repeated.
    same = errors.NCCLInvalidArgumentError("f", 4, "ncclInvalidArgument", "x y z", "x y z")
    assert str(same).count("x y z") == 1


# --- pickling ------------------------------------------------------------------------------


def _library_error_samples() -> list[errors.LibraryError]:
    samples: list[errors.LibraryError] = [
        _status.make_error("nccl", "ncclCommInitRank", int(m), f"text {m.name}", "last words")
        for m in _error_members()
    ]
    samples.append(_status.make_error("nccl", "ncclX", 9999))
    samples.append(errors.NCCLError("ncclY", 3))
    samples.append(errors.CuBLASMpError("cublasMpZ", 7, "CUBLASMP_STATUS_X", "d", None, "hint"))
    samples.append(errors.CudaError("cudaMemcpy", 1, "cudaErrorInvalidValue", "invalid argument"))
    return samples


@pytest.mark.parametrize("err", _library_error_samples(), ids=lambda e: f"{type(e).__name__}")
def test_library_error_pickles(err: errors.LibraryError) -> None:
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is type(err)
    for attr in ("function", "status", "status_name", "description", "last_error", "hint",
                 "library"):
        assert getattr(clone, attr) == getattr(err, attr), attr
    assert str(clone) == str(err)
    assert clone.args == err.args


def test_function_not_found_pickles() -> None:
    err = errors.FunctionNotFoundError(
        "ncclCommWindowRegister", "/opt/lib/libnccl.so.2", "2.20.5", "2.27.3", library="nccl"
    )
    assert "ncclCommWindowRegister" in str(err)
    assert "/opt/lib/libnccl.so.2" in str(err)
    assert "2.20.5" in str(err)
    assert "2.27.3" in str(err)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is errors.FunctionNotFoundError
    for attr in ("function", "library", "library_path", "loaded_version", "first_version"):
        assert getattr(clone, attr) == getattr(err, attr), attr
    assert str(clone) == str(err)


def test_function_not_found_old_since() -> None:
    err = errors.FunctionNotFoundError("ncclGetVersion", "/x/libnccl.so", None, "<=2.13.4")
    assert "unknown" in str(err)
    assert "2.13.4 or earlier" in str(err)


@pytest.mark.parametrize(
    "err",
    [errors.UsageError("bad input"), errors.LibraryNotFoundError("nothing found"),
     errors.MpbindError("base")],
    ids=lambda e: type(e).__name__,
)
def test_simple_errors_pickle(err: errors.MpbindError) -> None:
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is type(err)
    assert str(clone) == str(err)


def test_status_module_imports_on_its_own() -> None:
    """``import mpbind.bindings._status`` in a fresh interpreter, before ``mpbind.errors``."""
    proc = subprocess.run(
        [sys.executable, "-c",
         "import mpbind.bindings._status as s; print(s.make_error('nccl', 'f', 4).__class__.__name__)"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "NCCLInvalidArgumentError"


# --- ncclInProgress is not an error where the IR says so -------------------------------------


def test_ir_status_model(ir: dict[str, Any]) -> None:
    status = ir["status"]
    assert status["in_progress"] == "ncclInProgress"
    assert "ncclSuccess" in status["not_errors"]


@pytest.mark.parametrize(
    "function", ["ncclCommInitRankConfig", "ncclCommFinalize", "ncclGroupEnd", "ncclCommSplit",
                 "ncclAllReduce", "ncclCommDestroy"]
)
def test_ir_accepts_in_progress(ir_functions: dict[str, dict[str, Any]], function: str) -> None:
    success = ir_functions[function].get("success") or []
    assert "ncclSuccess" in success
    assert "ncclInProgress" in success


@pytest.mark.parametrize("function", ["ncclGetVersion", "ncclGetUniqueId", "ncclMemAlloc"])
def test_ir_rejects_in_progress(ir_functions: dict[str, dict[str, Any]], function: str) -> None:
    assert ir_functions[function].get("success") == ["ncclSuccess"]


def test_ir_every_comm_function_accepts_in_progress(ir: dict[str, Any]) -> None:
    """Every status-returning function taking a ncclComm_t may return ncclInProgress."""
    wrong = []
    for f in ir["functions"]:
        returns = f["returns"]
        if returns.get("kind") != "enum" or returns.get("name") != "ncclResult_t":
            continue
        takes_comm = any("ncclComm_t" in json.dumps(p["type"]) for p in f["params"])
        if takes_comm and "ncclInProgress" not in (f.get("success") or []):
            wrong.append(f["name"])
    assert wrong == []
