"""Coverage audit of the NVSHMEM flat bindings against the pinned host library.

The NVSHMEM headers declare their per-type families through macros, so a regex over them
(as the NCCL audit does) is not feasible. The independent reference here is the dynamic
symbol table of the pinned wheel's ``libnvshmem_host.so.3``: what it exports is what the
host can call. The frozen IR says which functions the headers declare.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mpbind.bindings import _coverage, nvshmem

REPO = Path(__file__).resolve().parents[2]
IR_PATH = REPO / "bindings" / "ir" / "nvshmem.json"
WHEEL = "nvidia-nvshmem-cu13"
LIBRARY = "nvidia/nvshmem/lib/libnvshmem_host.so.3"
API_SYMBOL = re.compile(r"^nvshmem(?:x|id)?_\w+$")
DEVICE_SUFFIX = re.compile(r"_(?:block|warp|warpgroup)$")
DEVICE_ONLY = "device-only (__device__): not callable from the host"
NOT_EXPORTED = "not exported by libnvshmem_host.so.3 (header-inline or device-only)"
THREAD_GROUP = "device-only (thread-group variant): not callable from the host"
# Exported by the host library but declared outside nvshmem_host.h (device/ headers, or
# no public header at all), so the pinned host headers do not declare them.
EXPORTED_UNDECLARED = {
    "nvshmem_debug_log",
    "nvshmemx_collective_launch",
    "nvshmemx_collective_launch_attr",
    "nvshmemx_collective_launch_query_gridsize",
}

Functions = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def ir() -> dict[str, Any]:
    if not IR_PATH.is_file():
        pytest.skip("the frozen IR is not in this checkout")
    data: dict[str, Any] = json.loads(IR_PATH.read_text())
    return data


@pytest.fixture(scope="module")
def functions(ir: dict[str, Any]) -> Functions:
    table = {f["name"]: f for f in ir["functions"]}
    assert len(table) == len(ir["functions"]), "a function appears twice in the IR"
    return table


@pytest.fixture(scope="module")
def library_path(ir: dict[str, Any]) -> Path:
    try:
        dist = md.distribution(WHEEL)
    except md.PackageNotFoundError:
        pytest.skip(f"{WHEEL} is not installed: no pinned library to audit against")
    if dist.version != ir["version"]:
        pytest.skip(f"{WHEEL} {dist.version} is installed; the bindings pin {ir['version']}")
    path = Path(str(dist.locate_file(LIBRARY)))
    if not path.is_file():
        pytest.skip(f"{WHEEL} has no {LIBRARY}")
    return path


@pytest.fixture(scope="module")
def exported(library_path: Path, functions: Functions) -> set[str]:
    """The IR's functions that the pinned host library exports (one dlsym each)."""
    lib = ctypes.CDLL(str(library_path))
    return {name for name in functions if hasattr(lib, name)}


def _bound(functions: Functions) -> dict[str, str]:
    return {c: f["python"] for c, f in functions.items() if f.get("python")}


# -- (a) the library's exports -------------------------------------------------------------

def test_every_exported_declared_function_is_bound(functions: Functions, exported: set[str]) -> None:
    assert len(exported) > 1000, "the library exports almost none of the IR's functions"
    unbound = sorted(name for name in exported if not functions[name].get("python"))
    assert unbound == [], f"exported by libnvshmem_host and declared, but not bound: {unbound}"


def test_exported_api_symbols_are_declared(library_path: Path, functions: Functions) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm on PATH to list the library's dynamic symbols")
    proc = subprocess.run([nm, "-D", "--defined-only", str(library_path)], capture_output=True, text=True,
                          timeout=60, check=True)
    symbols = set()
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TWi":
            symbols.add(parts[2].split("@", 1)[0])
    api = {s for s in symbols if API_SYMBOL.match(s)}
    assert len(api) > 1000
    undeclared = api - functions.keys()
    assert undeclared == EXPORTED_UNDECLARED, (
        f"new exports outside the IR: {sorted(undeclared - EXPORTED_UNDECLARED)}; "
        f"gone: {sorted(EXPORTED_UNDECLARED - undeclared)}"
    )


# -- (b) every IR function is bound or excluded with a reason --------------------------------

def test_every_function_is_bound_or_excluded(functions: Functions) -> None:
    problems = []
    for name, f in functions.items():
        py, why = f.get("python"), f.get("excluded")
        if py is None and not (isinstance(why, str) and why.strip()):
            problems.append(f"{name}: neither bound nor excluded with a reason")
        if py is not None and why is not None:
            problems.append(f"{name}: bound as {py} and also excluded ({why})")
    assert problems == []
    bound = _bound(functions)
    assert len(set(bound.values())) == len(bound), "two C functions share a Python name"


def test_exclusion_reasons_follow_the_device_flag(functions: Functions) -> None:
    reasons = {f["excluded"] for f in functions.values() if f.get("excluded")}
    assert reasons == {DEVICE_ONLY, THREAD_GROUP, NOT_EXPORTED}
    wrong = sorted(
        name for name, f in functions.items()
        if f.get("excluded") and (f["excluded"] == DEVICE_ONLY) != bool(f["device_only"])
    )
    assert wrong == []
    assert sorted(n for n, f in functions.items() if f["device_only"] and not f.get("excluded")) == []


def test_no_excluded_function_is_exported(functions: Functions, exported: set[str]) -> None:
    device_only = sorted(n for n, f in functions.items() if f.get("excluded") == DEVICE_ONLY and n in exported)
    assert device_only == [], f"excluded as device-only, yet exported by libnvshmem_host: {device_only}"
    not_exported = sorted(n for n, f in functions.items()
                          if f.get("excluded") in (NOT_EXPORTED, THREAD_GROUP) and n in exported)
    assert not_exported == [], f"excluded as not exported, yet exported: {not_exported}"


def test_block_warp_and_warpgroup_variants_are_excluded(functions: Functions) -> None:
    suffixed = [name for name in functions if DEVICE_SUFFIX.search(name)]
    assert len(suffixed) > 500
    assert sorted(name for name in suffixed if not functions[name].get("excluded")) == []
    assert sorted(name for name in suffixed
                  if functions[name].get("excluded") not in (DEVICE_ONLY, THREAD_GROUP)) == []


def test_bound_functions_are_exported_or_reproduced_inline(functions: Functions, exported: set[str]) -> None:
    missing = []
    for name, f in functions.items():
        if not f.get("python"):
            continue
        if f["inline"]:
            # A static inline of the header, reproduced over an exported entry point.
            uses = f["inline_body"]["uses"]
            if uses not in exported:
                missing.append(f"{name} (inline over {uses})")
        elif name not in exported:
            missing.append(name)
    assert missing == []


# -- (c) the module --------------------------------------------------------------------------

def test_every_bound_name_is_a_callable_of_the_module(functions: Functions) -> None:
    bound = _bound(functions)
    assert len(bound) > 1400
    absent = sorted(f"{c} -> {py}" for c, py in bound.items() if not callable(getattr(nvshmem, py, None)))
    assert absent == []


def test_families_dispatch_exactly_their_members(ir: dict[str, Any], functions: Functions) -> None:
    assert ir["families"]
    problems = []
    for fam in ir["families"]:
        op = fam["python"]
        if not callable(getattr(nvshmem, op, None)):
            problems.append(f"{op}: no dispatcher")
            continue
        table = getattr(nvshmem, f"_FAMILY_{op}", None)
        if not isinstance(table, dict):
            problems.append(f"{op}: no dispatch table")
            continue
        if set(table) != set(fam["members"]):
            problems.append(f"{op}: dispatches {sorted(table)}, members {sorted(fam['members'])}")
            continue
        for type_name, c_name in fam["members"].items():
            if table[type_name] is not getattr(nvshmem, functions[c_name]["python"]):
                problems.append(f"{op}[{type_name}] is not {functions[c_name]['python']}")
        if set(fam["members"]) - set(ir["family_types"]):
            problems.append(f"{op}: types without a NumPy entry")
    assert problems == []
    assert nvshmem.FAMILY_TYPES == ir["family_types"]


def test_module_callables_fold_into_operations(ir: dict[str, Any], functions: Functions) -> None:
    bound = _bound(functions)
    members = [c for fam in ir["families"] for c in fam["members"].values()]
    assert len(members) == len(set(members)), "a function belongs to two families"
    assert set(members) <= bound.keys()
    operations = len(ir["families"]) + len(bound.keys() - set(members))
    assert 200 <= operations <= 250, operations  # ~1500 functions fold into ~225 operations

    public = {name for name, value in vars(nvshmem).items()
              if not name.startswith("_") and callable(value) and not isinstance(value, type)}
    classes = {name for name, value in vars(nvshmem).items() if not name.startswith("_") and isinstance(value, type)}
    structs_and_enums = {e["python"] for e in ir["enums"]} | {s["python"] for s in ir["structs"]}
    assert classes <= structs_and_enums, sorted(classes - structs_and_enums)
    assert len(public) == len(bound) + len(ir["families"])
    member_names = {bound[c] for c in members}
    assert len(public - member_names) == operations


# -- (d) the command line --------------------------------------------------------------------

def test_cli_json_agrees(functions: Functions, tmp_path: Path, pins: dict[str, Any]) -> None:
    proc = subprocess.run([sys.executable, "-m", "mpbind", "coverage", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert "nvshmem" in data
    assert data["nvshmem"]["pinned"] == _coverage.PINNED["nvshmem"] == pins["nvshmem"].version
    rows = {r["c_name"]: (r["python_name"], r["excluded"]) for r in data["nvshmem"]["functions"]}
    assert len(rows) == len(data["nvshmem"]["functions"])
    assert rows == {c: (f.get("python"), f.get("excluded")) for c, f in functions.items()}
    assert rows == {c: (py, why) for c, py, why in _coverage.COVERAGE["nvshmem"]}
