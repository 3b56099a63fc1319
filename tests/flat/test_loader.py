"""How mpbind finds and opens libnccl: lazily, from the wheel, or from MPBIND_NCCL_PATH.

Loading is process-wide and happens once, so every case that needs a particular
environment runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mpbind._infra import loader as _loader
from mpbind.errors import FunctionNotFoundError, LibraryNotFoundError

ENV_VAR = "MPBIND_NCCL_PATH"
WHEELS = _loader.LIBRARIES["nccl"].wheels  # nvidia-nccl-cu13, nvidia-nccl-cu12: either family


def _wheel_library() -> Path | None:
    """libnccl.so.2 of the installed nvidia-nccl wheel (either family), found through the wheel's RECORD."""
    for wheel in WHEELS:
        try:
            dist = importlib.metadata.distribution(wheel)
        except importlib.metadata.PackageNotFoundError:
            continue
        for entry in dist.files or []:
            if entry.name == "libnccl.so.2":
                path = Path(str(dist.locate_file(entry))).resolve()
                if path.is_file():
                    return path
    return None


WHEEL_LIB = _wheel_library()
needs_wheel = pytest.mark.skipif(WHEEL_LIB is None, reason=f"none of {', '.join(WHEELS)} is installed")


def _run(code: str, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; it must print one JSON object as its last line."""
    full_env = dict(os.environ)
    full_env.pop(ENV_VAR, None)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=180, env=full_env,
    )
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{proc.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


MAPS_HELPER = """
def nccl_mapped():
    with open("/proc/self/maps") as f:
        return any("libnccl" in line for line in f)
"""


# --- lazy loading ----------------------------------------------------------------------------


@needs_wheel
def test_nothing_loaded_at_import() -> None:
    out = _run(MAPS_HELPER + """
import json
import mpbind
at_mpbind = nccl_mapped()
import mpbind.errors
import mpbind.bindings.nccl as nccl
at_bindings = nccl_mapped()
from mpbind._infra import loader as _loader
loaded_flag = _loader.is_loaded("nccl")
version = nccl.get_version()
print(json.dumps({"at_mpbind": at_mpbind, "at_bindings": at_bindings, "flag": loaded_flag,
                  "after_call": nccl_mapped(), "flag_after": _loader.is_loaded("nccl"),
                  "version": version}))
""")
    assert out["at_mpbind"] is False
    assert out["at_bindings"] is False
    assert out["flag"] is False
    assert out["after_call"] is True
    assert out["flag_after"] is True
    assert out["version"] > 0


def test_import_mpbind_imports_no_extension() -> None:
    out = _run("""
import json, sys
import mpbind
mods = sorted(m for m in sys.modules if m.startswith("mpbind"))
print(json.dumps({"mods": mods}))
""")
    assert out["mods"] == ["mpbind"]


# --- the wheel -------------------------------------------------------------------------------


@needs_wheel
def test_found_in_wheel() -> None:
    if os.environ.get(ENV_VAR):
        pytest.skip(f"{ENV_VAR} is set in this environment")
    lib = _loader.load("nccl")
    path = Path(lib.path).resolve()
    assert path == WHEEL_LIB
    assert path.parts[-4:] == ("nvidia", "nccl", "lib", "libnccl.so.2")
    assert "site-packages" in path.parts or "dist-packages" in path.parts
    assert lib.found_via != ENV_VAR
    assert lib.handle != 0
    assert lib.name == "nccl"
    # One load per process.
    assert _loader.load("nccl") is lib
    assert _loader.is_loaded("nccl")


def test_unknown_library_name() -> None:
    with pytest.raises(LibraryNotFoundError, match="nosuchlib"):
        _loader.load("nosuchlib")


@pytest.mark.parametrize(
    ("code", "text"),
    [(22809, "2.28.9"), (22703, "2.27.3"), (21903, "2.19.3"), (2708, "2.7.8"), (2408, "2.4.8")],
)
def test_format_version(code: int, text: str) -> None:
    assert _loader.format_version("nccl", code) == text


# --- MPBIND_NCCL_PATH ------------------------------------------------------------------------

LOAD_REPORT = """
import json
from mpbind._infra import loader as _loader
from mpbind.bindings import nccl
version = nccl.get_version()
lib = _loader.load("nccl")
print(json.dumps({"path": lib.path, "found_via": lib.found_via, "version": version,
                  "loaded_version": _loader.loaded_version("nccl")}))
"""


@needs_wheel
@pytest.mark.parametrize("target", ["file", "folder"])
def test_override_honoured(tmp_path: Path, target: str) -> None:
    assert WHEEL_LIB is not None
    # A copy in a folder of its own: the result cannot come from the wheel's search.
    folder = tmp_path / "override"
    folder.mkdir()
    copy = folder / "libnccl.so.2"
    shutil.copy2(WHEEL_LIB, copy)
    value = str(copy) if target == "file" else str(folder)
    out = _run(LOAD_REPORT, {ENV_VAR: value})
    assert out["found_via"] == ENV_VAR
    assert Path(out["path"]).resolve() == copy.resolve()
    assert out["version"] > 0


@needs_wheel
def test_override_wheel_file_itself() -> None:
    assert WHEEL_LIB is not None
    for value in (str(WHEEL_LIB), str(WHEEL_LIB.parent)):
        out = _run(LOAD_REPORT, {ENV_VAR: value})
        assert out["found_via"] == ENV_VAR
        assert Path(out["path"]).resolve() == WHEEL_LIB


MISSING_REPORT = """
import json, pickle
from mpbind._infra import loader as _loader
from mpbind.errors import LibraryNotFoundError
from mpbind.bindings import nccl
try:
    nccl.get_version()
except Exception as exc:
    out = {"type": type(exc).__name__, "lnf": isinstance(exc, LibraryNotFoundError),
           "import_error": isinstance(exc, ImportError), "message": str(exc)}
    try:
        _loader.load("nccl")
    except Exception as again:
        out["again"] = type(again).__name__
    print(json.dumps(out))
else:
    print(json.dumps({"type": None}))
"""


def test_override_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libnccl.so.2"
    out = _run(MISSING_REPORT, {ENV_VAR: str(missing)})
    assert out["type"] == "LibraryNotFoundError"
    assert out["lnf"] is True
    assert out["import_error"] is True
    assert ENV_VAR in out["message"]
    assert str(missing) in out["message"]
    assert "tried" in out["message"]
    # A failed load is not cached as a success.
    assert out["again"] == "LibraryNotFoundError"


def test_override_folder_without_library(tmp_path: Path) -> None:
    out = _run(MISSING_REPORT, {ENV_VAR: str(tmp_path)})
    assert out["type"] == "LibraryNotFoundError"
    assert out["import_error"] is True
    assert str(tmp_path / "libnccl.so.2") in out["message"]


def test_override_not_a_library(tmp_path: Path) -> None:
    bogus = tmp_path / "libnccl.so.2"
    bogus.write_text("not an ELF file\n")
    out = _run(MISSING_REPORT, {ENV_VAR: str(bogus)})
    assert out["type"] == "LibraryNotFoundError"
    assert str(bogus) in out["message"]


# --- a library that lacks symbols ------------------------------------------------------------

FAKE_SOURCE = r"""
typedef enum { ncclSuccess = 0 } ncclResult_t;
ncclResult_t ncclGetVersion(int* version) { *version = 22809; return ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t result) { (void)result; return "fake error"; }
"""


@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory: pytest.TempPathFactory, c_compiler: str) -> Path:
    """A libnccl.so.2 exporting only ncclGetVersion (2.28.9) and ncclGetErrorString."""
    cc = c_compiler
    folder = tmp_path_factory.mktemp("fake_nccl")
    src = folder / "fake_nccl.c"
    src.write_text(FAKE_SOURCE)
    lib = folder / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True,
                   capture_output=True, timeout=120)
    return lib


MISSING_SYMBOL_REPORT = """
import json, pickle
from mpbind._infra import loader as _loader
from mpbind.errors import FunctionNotFoundError
from mpbind.bindings import nccl
from mpbind.bindings._internal import nccl as internal

def attempt(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        clone = pickle.loads(pickle.dumps(exc))
        return {"type": type(exc).__name__, "fnf": isinstance(exc, FunctionNotFoundError),
                "nie": isinstance(exc, NotImplementedError), "message": str(exc),
                "function": getattr(exc, "function", None),
                "library_path": getattr(exc, "library_path", None),
                "loaded_version": getattr(exc, "loaded_version", None),
                "first_version": getattr(exc, "first_version", None),
                "clone_type": type(clone).__name__, "clone_message": str(clone),
                "clone_function": getattr(clone, "function", None),
                "clone_first_version": getattr(clone, "first_version", None)}
    return {"type": None}

out = {
    "version": nccl.get_version(),
    "loaded_version": _loader.loaded_version("nccl"),
    "path": _loader.load("nccl").path,
    "error_string": nccl.get_error_string(1),
    "count_address": internal.symbol_address("ncclCommCount"),
    "version_address": internal.symbol_address("ncclGetVersion"),
    "comm_count": attempt(nccl.comm_count, 0),
    "window_register": attempt(nccl.comm_window_register, 0, 0, 0, 0),
    "unique_id": attempt(nccl.get_unique_id),
}
print(json.dumps(out))
"""


def _check_not_found(info: dict[str, Any], function: str, lib: Path, since: str) -> None:
    assert info["type"] == "FunctionNotFoundError", info
    assert info["fnf"] is True
    assert info["nie"] is True
    message = info["message"]
    assert function in message
    assert str(lib) in message
    assert "2.28.9" in message
    assert since in message
    assert info["function"] == function
    assert Path(info["library_path"]).resolve() == lib.resolve()
    assert info["loaded_version"] == "2.28.9"
    assert info["clone_type"] == "FunctionNotFoundError"
    assert info["clone_message"] == message
    assert info["clone_function"] == function
    assert info["clone_first_version"] == info["first_version"]


def test_missing_symbol(fake_nccl: Path) -> None:
    out = _run(MISSING_SYMBOL_REPORT, {ENV_VAR: str(fake_nccl)})
    assert out["version"] == 22809
    assert out["loaded_version"] == "2.28.9"
    assert Path(out["path"]).resolve() == fake_nccl.resolve()
    assert out["error_string"] == "fake error"
    assert out["count_address"] == 0
    assert out["version_address"] != 0
    _check_not_found(out["window_register"], "ncclCommWindowRegister", fake_nccl, "2.27.3")
    assert out["window_register"]["first_version"] == "2.27.3"
    _check_not_found(out["comm_count"], "ncclCommCount", fake_nccl, "2.13.4")
    _check_not_found(out["unique_id"], "ncclGetUniqueId", fake_nccl, "2.13.4")


@needs_wheel
def test_symbols_come_from_the_loaded_handle_only(fake_nccl: Path) -> None:
    """With the real libnccl already global in the process, the override's missing symbols
    still raise: mpbind never binds a foreign copy through RTLD_DEFAULT."""
    assert WHEEL_LIB is not None
    code = f"""
import ctypes, os
ctypes.CDLL({str(WHEEL_LIB)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
""" + MISSING_SYMBOL_REPORT
    out = _run(code, {ENV_VAR: str(fake_nccl)})
    assert out["version"] == 22809
    assert out["count_address"] == 0
    _check_not_found(out["comm_count"], "ncclCommCount", fake_nccl, "2.13.4")


def test_function_not_found_error_pickles_in_process() -> None:
    err = FunctionNotFoundError("ncclCommCount", "/lib/libnccl.so.2", "2.28.9", "<=2.13.4",
                                library="nccl")
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is FunctionNotFoundError
    assert str(clone) == str(err)
    assert (clone.function, clone.library, clone.library_path, clone.loaded_version,
            clone.first_version) == ("ncclCommCount", "nccl", "/lib/libnccl.so.2", "2.28.9",
                                     "<=2.13.4")
