"""The coverage audit (``python -m mpbind coverage``) against each pinned library itself.

Every function the pinned library exports with one of its prefixes (its dynamic symbol table,
``nm -D --defined-only`` of the installed wheel's shared library, or the recorded symbol list
``codegen/symbols/<lib>.json`` where that wheel is not installed) must appear in the report,
bound or excluded with a reason; every function the report binds must be exported (or be a
header's static inline function reproduced over an exported one). NCCL's header is also read
with a regex, independently of the libclang-based generator.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mpbind.bindings import _coverage, nccl, nvshmem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]
# nm's symbol types of code: text, weak, indirect function.
CODE_TYPES = {"T", "W", "i"}
COLLECTIVE_LAUNCH = ("nvshmemx_collective_launch", "nvshmemx_collective_launch_attr",
                     "nvshmemx_collective_launch_query_gridsize")

Rows = dict[str, tuple[str | None, str | None]]


def _spec(lib: str) -> dict[str, Any]:
    path = REPO / "codegen" / "specs" / f"{lib}.toml"
    if not path.is_file():
        pytest.skip("the generator's specs are not in this checkout")
    spec: dict[str, Any] = tomllib.loads(path.read_text())["library"]
    return spec


def _recorded(lib: str, release: str) -> set[str]:
    """The functions codegen/symbols/<lib>.json records for `release` (spans "a-b", "a-", "a")."""
    record = json.loads((REPO / "codegen" / "symbols" / f"{lib}.json").read_text())
    order = sorted(record["releases"], key=lambda v: tuple(int(x) for x in v.split(".")))
    at = order.index(release)
    out = set()
    for name, spans in record["exports"].items():
        for span in spans.split(","):
            first, dash, last = span.partition("-")
            stop = order.index(last) if last else len(order) - 1 if dash else order.index(first)
            if order.index(first) <= at <= stop:
                out.add(name)
    return out


def _nm(binary: Path, prefixes: tuple[str, ...]) -> set[str]:
    nm = shutil.which("nm")
    assert nm is not None
    out = subprocess.run([nm, "-D", "--defined-only", str(binary)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return {parts[-1].split("@")[0] for line in out.splitlines()
            if len(parts := line.split()) >= 2 and parts[-2] in CODE_TYPES and parts[-1].startswith(prefixes)}


def _installed_binary(lib: str, pins: dict[str, Any]) -> Path | None:
    """The shared library of the pinned wheel, when that release is installed here and nm reads it."""
    pin = pins[lib]
    try:
        dist = md.distribution(pin.wheel)
    except md.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(_spec(lib)["binary"])))
    return path if dist.version == pin.version and path.is_file() and shutil.which("nm") else None


@pytest.fixture(scope="module", params=LIBRARIES)
def lib(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def exported(lib: str, pins: dict[str, Any]) -> set[str]:
    """What the pinned library exports with one of its prefixes: nm of the installed wheel, else the record."""
    assert _coverage.PINNED[lib] == pins[lib].version
    prefixes = tuple(_spec(lib)["prefixes"])
    binary = _installed_binary(lib, pins)
    names = _nm(binary, prefixes) if binary is not None else _recorded(lib, pins[lib].version)
    assert names, f"{lib}: no exported function found"
    return names


@pytest.fixture(scope="module")
def rows(lib: str) -> Rows:
    table = {c: (py, why) for c, py, why in _coverage.COVERAGE[lib]}
    assert len(table) == len(_coverage.COVERAGE[lib]), "a function appears twice in the report"
    return table


def test_every_export_is_bound_or_excluded(lib: str, exported: set[str], rows: Rows) -> None:
    absent = sorted(exported - rows.keys())
    assert absent == [], f"{lib} exports functions the coverage report does not list: {absent}"


def test_the_report_records_exactly_the_exports(lib: str, exported: set[str]) -> None:
    assert set(_coverage.EXPORTED[lib]) == exported, (
        f"exported but not recorded: {sorted(exported - _coverage.EXPORTED[lib])}; "
        f"recorded but not exported: {sorted(_coverage.EXPORTED[lib] - exported)}"
    )


def test_the_recorded_symbol_list_agrees_with_the_installed_library(lib: str, pins: dict[str, Any]) -> None:
    binary = _installed_binary(lib, pins)
    if binary is None:
        pytest.skip(f"{pins[lib].wheel} {pins[lib].version} is not installed here (or there is no nm)")
    assert _nm(binary, tuple(_spec(lib)["prefixes"])) == _recorded(lib, pins[lib].version)


def test_every_row_is_bound_or_excluded_with_a_reason(rows: Rows) -> None:
    problems = []
    for name, (py, why) in rows.items():
        if py is None and not (isinstance(why, str) and why.strip()):
            problems.append(f"{name}: neither bound nor excluded with a reason")
        if py is not None and why is not None:
            problems.append(f"{name}: bound as {py} and also excluded ({why})")
    assert problems == []
    bound = [py for py, _ in rows.values() if py is not None]
    assert bound and len(bound) == len(set(bound)), "two C functions share a Python name"


def test_bound_functions_are_exported(lib: str, exported: set[str], rows: Rows) -> None:
    """A bound function is exported, or reproduced in Python over an exported one (CALLS)."""
    calls = _coverage.CALLS[lib]
    missing = []
    for name, (py, _) in rows.items():
        if py is None or name in exported:
            continue
        if name not in calls:
            missing.append(f"{name}: bound, not exported and not reproduced")
        elif calls[name] not in exported:
            missing.append(f"{name}: reproduced over {calls[name]}, which is not exported")
    assert missing == []
    assert set(calls) <= {name for name, (py, _) in rows.items() if py is not None}


def test_not_exported_and_device_only_exclusions_are_not_exported(lib: str, exported: set[str], rows: Rows) -> None:
    wrong = sorted(name for name, (_, why) in rows.items() if why is not None and name in exported
                   and (why.startswith("not exported by") or why.startswith("device-only")))
    assert wrong == [], f"excluded as not exported or device-only, yet exported: {wrong}"


def test_every_bound_name_is_a_callable_of_the_module(lib: str, rows: Rows) -> None:
    module = importlib.import_module(f"mpbind.bindings.{lib}")
    absent = sorted(f"{c} -> {py}" for c, (py, _) in rows.items()
                    if py is not None and not callable(getattr(module, py, None)))
    assert absent == []


def test_every_since_is_of_a_bound_function(lib: str, rows: Rows) -> None:
    assert set(_coverage.SINCE[lib]) == {c for c, (py, _) in rows.items() if py is not None}


# -- the command line -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "mpbind", "coverage", "--json"],
                          cwd=tmp_path_factory.mktemp("cli"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_cli_json_agrees(lib: str, rows: Rows, exported: set[str], cli_json: dict[str, Any]) -> None:
    assert set(cli_json) == set(_coverage.COVERAGE) == set(LIBRARIES)
    data = cli_json[lib]
    assert data["pinned"] == _coverage.PINNED[lib]
    got = {r["c_name"]: (r["python_name"], r["excluded"]) for r in data["functions"]}
    assert len(got) == len(data["functions"])
    assert got == rows
    assert {r["c_name"] for r in data["functions"] if r["exported"]} == exported
    assert {r["c_name"]: r["calls"] for r in data["functions"] if r["calls"]} == _coverage.CALLS[lib]


def test_cli_json_binds_the_collective_launch(cli_json: dict[str, Any]) -> None:
    rows = {r["c_name"]: r for r in cli_json["nvshmem"]["functions"]}
    for name in COLLECTIVE_LAUNCH:
        assert rows[name]["python_name"] == name.removeprefix("nvshmemx_"), rows[name]
        assert rows[name]["exported"] and rows[name]["excluded"] is None


def test_cli_table_accounts_for_every_function(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mpbind", "coverage"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["library", "pinned", "bound", "excluded", "missing", "total", "exported"]
    table = {line.split()[0]: line.split() for line in lines[1:1 + len(LIBRARIES)]}
    for lib in LIBRARIES:
        _, pinned, bound, excluded, missing, total, exported = table[lib]
        entries = _coverage.COVERAGE[lib]
        assert pinned == _coverage.PINNED[lib]
        assert (int(bound), int(excluded), int(missing), int(total)) == (
            sum(py is not None for _, py, _ in entries), sum(py is None for _, py, _ in entries), 0, len(entries))
        assert int(exported) == len(_coverage.EXPORTED[lib])
    # Each reason is listed, with its functions named where few share it.
    for lib in LIBRARIES:
        for reason in {why for _, _, why in _coverage.COVERAGE[lib] if why is not None}:
            assert any(line.split(None, 2)[:1] == [lib] and reason in line for line in lines), reason


# -- NCCL: its header read independently of the generator ------------------------------------

# Host API declarations of nccl.h: `ncclResult_t ncclX(`, `const char* ncclX(`, `void ncclX(`.
# Each also has a `pnccl` profiling twin, which the pattern does not match.
DECLARATION = re.compile(r"^[ \t]*(?:ncclResult_t|const[ \t]+char[ \t]*\*|void)[ \t]+(nccl\w+)[ \t]*\(", re.M)
EXPECTED_DECLARATIONS = 73


@pytest.fixture(scope="module")
def nccl_header_functions(pins: dict[str, Any]) -> list[str]:
    pin = pins["nccl"]
    try:
        dist = md.distribution(pin.wheel)
    except md.PackageNotFoundError:
        pytest.skip(f"{pin.wheel} is not installed: no pinned header to audit against")
    if dist.version != pin.version:
        pytest.skip(f"{pin.wheel} {dist.version} is installed; the bindings pin {pin.version}")
    header = Path(str(dist.locate_file("nvidia/nccl/include/nccl.h")))
    names = DECLARATION.findall(header.read_text())
    assert len(names) == len(set(names)), "a function is declared twice"
    return names


def test_nccl_header_declaration_count(nccl_header_functions: list[str]) -> None:
    assert len(nccl_header_functions) == EXPECTED_DECLARATIONS, sorted(nccl_header_functions)


def test_every_nccl_header_function_is_in_the_report(nccl_header_functions: list[str]) -> None:
    listed = {c for c, _, _ in _coverage.COVERAGE["nccl"]}
    assert sorted(set(nccl_header_functions) - listed) == []


# -- NVSHMEM: device-only declarations and per-type families -----------------------------------

IR_PATH = REPO / "codegen" / "ir" / "nvshmem.json"
DEVICE_SUFFIX = re.compile(r"_(?:block|warp|warpgroup)$")
DEVICE_ONLY = "device-only (__device__): not callable from the host"
NOT_EXPORTED = "not exported by libnvshmem_host.so.3 (header-inline or device-only)"
THREAD_GROUP = "device-only (thread-group variant): not callable from the host"


@pytest.fixture(scope="module")
def nvshmem_ir() -> dict[str, Any]:
    if not IR_PATH.is_file():
        pytest.skip("the frozen IR is not in this checkout")
    data: dict[str, Any] = json.loads(IR_PATH.read_text())
    return data


@pytest.fixture(scope="module")
def nvshmem_functions(nvshmem_ir: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in nvshmem_ir["functions"]}


def test_nvshmem_exclusion_reasons_follow_the_device_flag(nvshmem_functions: dict[str, dict[str, Any]]) -> None:
    functions = nvshmem_functions
    assert {f["excluded"] for f in functions.values() if f.get("excluded")} == {DEVICE_ONLY, THREAD_GROUP, NOT_EXPORTED}
    wrong = sorted(name for name, f in functions.items()
                   if f.get("excluded") and (f["excluded"] == DEVICE_ONLY) != bool(f["device_only"]))
    assert wrong == []
    assert sorted(n for n, f in functions.items() if f["device_only"] and not f.get("excluded")) == []


def test_nvshmem_block_warp_and_warpgroup_variants_are_excluded(
        nvshmem_functions: dict[str, dict[str, Any]]) -> None:
    suffixed = [name for name in nvshmem_functions if DEVICE_SUFFIX.search(name)]
    assert len(suffixed) > 500
    assert sorted(name for name in suffixed
                  if nvshmem_functions[name].get("excluded") not in (DEVICE_ONLY, THREAD_GROUP)) == []


def test_nvshmem_families_dispatch_exactly_their_members(
        nvshmem_ir: dict[str, Any], nvshmem_functions: dict[str, dict[str, Any]]) -> None:
    assert nvshmem_ir["families"]
    problems = []
    for fam in nvshmem_ir["families"]:
        op = fam["python"]
        table = getattr(nvshmem, f"_FAMILY_{op}", None)
        if not callable(getattr(nvshmem, op, None)) or not isinstance(table, dict):
            problems.append(f"{op}: no dispatcher or no dispatch table")
            continue
        if set(table) != set(fam["members"]):
            problems.append(f"{op}: dispatches {sorted(table)}, members {sorted(fam['members'])}")
            continue
        for type_name, c_name in fam["members"].items():
            if table[type_name] is not getattr(nvshmem, nvshmem_functions[c_name]["python"]):
                problems.append(f"{op}[{type_name}] is not {nvshmem_functions[c_name]['python']}")
        if set(fam["members"]) - set(nvshmem_ir["family_types"]):
            problems.append(f"{op}: types without a NumPy entry")
    assert problems == []
    assert nvshmem.FAMILY_TYPES == nvshmem_ir["family_types"]


def test_nvshmem_module_callables_fold_into_operations(
        nvshmem_ir: dict[str, Any], nvshmem_functions: dict[str, dict[str, Any]]) -> None:
    bound = {c: f["python"] for c, f in nvshmem_functions.items() if f.get("python")}
    members = [c for fam in nvshmem_ir["families"] for c in fam["members"].values()]
    assert len(members) == len(set(members)), "a function belongs to two families"
    assert set(members) <= bound.keys()
    operations = len(nvshmem_ir["families"]) + len(bound.keys() - set(members))
    assert 200 <= operations <= 250, operations  # ~1500 functions fold into ~225 operations

    names = {name: getattr(nvshmem, name) for name in dir(nvshmem)}  # the IntEnums too (made on first use)
    public = {name for name, value in names.items()
              if not name.startswith("_") and callable(value) and not isinstance(value, type)}
    classes = {name for name, value in names.items() if not name.startswith("_") and isinstance(value, type)}
    structs_and_enums = {e["python"] for e in nvshmem_ir["enums"]} | {s["python"] for s in nvshmem_ir["structs"]}
    assert classes <= structs_and_enums, sorted(classes - structs_and_enums)
    assert len(public) == len(bound) + len(nvshmem_ir["families"])
    assert len(public - {bound[c] for c in members}) == operations


# -- NCCL: every bound function refuses a wrong argument type ---------------------------------

def _bound_names() -> list[str]:
    return sorted(py for _, py, _ in _coverage.COVERAGE["nccl"] if py is not None)


@pytest.mark.parametrize("name", _bound_names())
def test_wrong_argument_type_raises_type_error(name: str) -> None:
    fn = getattr(nccl, name)
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        pytest.skip("takes no arguments")
    required = [p for p in params if p.default is inspect.Parameter.empty]
    # object() for the first parameter; 0 converts for every other scalar (int, enum, handle,
    # address, float, bool) and is only looked at after the first parameter.
    args: list[object] = [object()] + [0] * max(len(required) - 1, 0)
    with pytest.raises(TypeError):
        fn(*args)
