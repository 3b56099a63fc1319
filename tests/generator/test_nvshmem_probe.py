"""Enum values, constants, struct sizes and initializers as the C++ compiler sees the pinned NVSHMEM headers.

A small C++ program includes the real ``nvshmem_host.h`` (which needs the CUDA runtime
headers), prints every value the IR lists, and the test compares them with the generated
module.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mpbind.bindings import nvshmem

REPO = Path(__file__).resolve().parents[2]
IR_PATH = REPO / "bindings" / "ir" / "nvshmem.json"
WHEEL = "nvidia-nvshmem-cu13"
INCLUDE_SUBDIR = "nvidia/nvshmem/include"

# Initializer macro -> (C type, module class).
INITIALIZERS = {
    "NVSHMEMX_INIT_ATTR_INITIALIZER": ("nvshmemx_init_attr_t", nvshmem.InitAttr),
    "NVSHMEMX_UNIQUEID_INITIALIZER": ("nvshmemx_uniqueid_t", nvshmem.UniqueId),
    "NVSHMEM_TEAM_CONFIG_INITIALIZER": ("nvshmem_team_config_t", nvshmem.TeamConfig),
    "NVSHMEMX_REGION_ATTRS_INITIALIZER": ("nvshmemx_region_attrs_t", nvshmem.RegionAttrs),
}

Probe = dict[tuple[str, str, str], float | int | str]


def _ir() -> dict[str, Any]:
    if not IR_PATH.is_file():
        pytest.skip("the frozen IR is not in this checkout")
    data: dict[str, Any] = json.loads(IR_PATH.read_text())
    return data


def _nvshmem_include() -> Path:
    try:
        dist = md.distribution(WHEEL)
    except md.PackageNotFoundError:
        pytest.skip(f"{WHEEL} is not installed")
    if dist.version != _ir()["version"]:
        pytest.skip(f"{WHEEL} {dist.version} is installed; the bindings pin {_ir()['version']}")
    return Path(str(dist.locate_file(INCLUDE_SUBDIR)))


def _cuda_include() -> Path:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        pytest.skip("cuda.pathfinder has no find_nvidia_header_directory: cannot locate the CUDA headers")
    found = find_nvidia_header_directory("cudart")
    if not found:
        pytest.skip("no CUDA runtime headers (cuda_runtime.h) found: nvshmem_host.h needs them")
    return Path(found)


@pytest.fixture(scope="module")
def cxx_compiler() -> str:
    """Path of a C++ compiler; the NVSHMEM headers are C++."""
    for cxx in ("c++", "g++", "clang++"):
        path = shutil.which(cxx)
        if path:
            return path
    pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH")


def _visible_headers(cxx: str, includes: list[str], nvshmem_include: Path, src: Path) -> set[str]:
    """Headers under the NVSHMEM include folder that `src` pulls in (paths relative to it)."""
    proc = subprocess.run([cxx, "-std=c++17", "-M", *includes, str(src)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = str(nvshmem_include.resolve()) + "/"
    deps = proc.stdout.replace("\\\n", " ").split()
    return {str(Path(d).resolve())[len(root):] for d in deps if str(Path(d).resolve()).startswith(root)}


def _program(ir: dict[str, Any], visible: set[str]) -> str:
    lines = [
        "#include <nvshmem_host.h>",
        "#include <cstdio>",
        "#include <type_traits>",
        "template <typename T> static void num(const char* kind, const char* owner, const char* name, T v) {",
        "  if (std::is_floating_point<T>::value) std::printf(\"%s %s %s f:%.17g\\n\", kind, owner, name, (double)v);",
        "  else std::printf(\"%s %s %s i:%lld\\n\", kind, owner, name, (long long)v);",
        "}",
        "static void hex(const char* name, const void* p, size_t n) {",
        "  std::printf(\"init - %s h:\", name);",
        "  for (size_t i = 0; i < n; ++i) std::printf(\"%02x\", ((const unsigned char*)p)[i]);",
        "  std::printf(\"\\n\");",
        "}",
    ]
    for macro, (ctype, _) in INITIALIZERS.items():
        # Static storage: zero-initialised first, so padding bytes are zero.
        lines.append(f"static const {ctype} init_{macro} = {macro};")
    lines.append("int main() {")
    for e in ir["enums"]:
        if e["header"] not in visible:
            continue
        for c_name, _, _ in e["members"]:
            lines.append(f'  num("enum", "{e["name"]}", "{c_name}", {c_name});')
    for c in ir["constants"]:
        if c["header"] in visible:
            lines.append(f'  num("const", "-", "{c["name"]}", ({c["name"]}));')
    for s in ir["structs"]:
        if s["header"] in visible:
            lines.append(f'  num("sizeof", "-", "{s["name"]}", sizeof({s["name"]}));')
    for macro in INITIALIZERS:
        lines.append(f'  hex("{macro}", &init_{macro}, sizeof(init_{macro}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory, cxx_compiler: str) -> Probe:
    """(kind, owner, name) -> value, as printed by the compiled probe."""
    ir = _ir()
    nvshmem_include = _nvshmem_include()
    includes = [f"-I{_cuda_include()}", f"-I{nvshmem_include}"]
    tmp = tmp_path_factory.mktemp("nvshmem_probe")
    head = tmp / "head.cpp"
    head.write_text("#include <nvshmem_host.h>\n")
    visible = _visible_headers(cxx_compiler, includes, nvshmem_include, head)
    assert "nvshmem_host.h" in visible
    src = tmp / "probe.cpp"
    src.write_text(_program(ir, visible))
    exe = tmp / "probe"
    build = subprocess.run([cxx_compiler, "-std=c++17", *includes, str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True)
    out: Probe = {}
    for line in run.stdout.splitlines():
        kind, owner, name, raw = line.split()
        tag, _, value = raw.partition(":")
        out[(kind, owner, name)] = float(value) if tag == "f" else value if tag == "h" else int(value)
    return out


def _py_constant_name(c_name: str) -> str:
    for prefix in ("NVSHMEMX_", "NVSHMEM_"):
        if c_name.startswith(prefix):
            return c_name[len(prefix):]
    return c_name


def test_probe_saw_the_main_enums(compiled: Probe) -> None:
    owners = {owner for kind, owner, _ in compiled if kind == "enum"}
    assert {"nvshmemx_status", "nvshmemx_init_status_t", "nvshmemx_thread_support_t", "nvshmem_team_id_t",
            "flags"} <= owners
    assert len(owners) >= len(_ir()["enums"]) - 3, f"most enums were not visible: {sorted(owners)}"


def test_enum_members_match_the_compiler(compiled: Probe) -> None:
    problems = []
    checked = 0
    for e in _ir()["enums"]:
        if ("enum", e["name"], e["members"][0][0]) not in compiled:
            continue
        cls = getattr(nvshmem, e["python"])
        for c_name, py_name, _ in e["members"]:
            c_value = compiled[("enum", e["name"], c_name)]
            member = cls.__members__.get(py_name)
            checked += 1
            if member is None:
                problems.append(f"{e['python']}.{py_name} ({c_name}) is missing")
            elif int(member) != c_value:
                problems.append(f"{e['python']}.{py_name} = {int(member)}, C {c_name} = {c_value}")
        c_values = {compiled[("enum", e["name"], c)] for c, _, _ in e["members"]}
        extra = [m for m, v in cls.__members__.items() if int(v) not in c_values]
        if extra:
            problems.append(f"{e['python']} has members with no C value: {extra}")
    assert checked > 100
    assert problems == []


def test_constants_match_the_compiler(compiled: Probe) -> None:
    problems = []
    for c in _ir()["constants"]:
        c_value = compiled[("const", "-", c["name"])]
        py_value = getattr(nvshmem, _py_constant_name(c["name"]))
        if type(py_value) is not int or py_value != c_value:
            problems.append(f"{_py_constant_name(c['name'])} = {py_value!r}, C {c['name']} = {c_value!r}")
    assert len(_ir()["constants"]) >= 10
    assert problems == []


def test_struct_sizes_match_the_compiler(compiled: Probe) -> None:
    problems = []
    for s in _ir()["structs"]:
        c_size = compiled[("sizeof", "-", s["name"])]
        if s["size"] != c_size:
            problems.append(f"IR {s['name']} size {s['size']}, C {c_size}")
        cls = getattr(nvshmem, s["python"], None)
        if cls is not None and cls().nbytes != c_size:
            problems.append(f"{s['python']}().nbytes = {cls().nbytes}, sizeof({s['name']}) = {c_size}")
    assert problems == []
    for name in ("InitAttr", "InitArgs", "UniqueIdArgs", "UniqueId", "TeamConfig", "LibVersion", "RegionAttrs"):
        assert isinstance(getattr(nvshmem, name)().nbytes, int)


@pytest.mark.parametrize("macro", sorted(INITIALIZERS))
def test_default_bytes_match_the_initializer(compiled: Probe, macro: str) -> None:
    expected = bytes.fromhex(str(compiled[("init", "-", macro)]))
    obj = INITIALIZERS[macro][1]()
    assert obj.nbytes == len(expected)
    got = ctypes.string_at(obj.ptr, obj.nbytes)
    assert got.hex() == expected.hex(), f"{type(obj).__name__}() differs from {macro}"
    if isinstance(obj, nvshmem.UniqueId):
        assert bytes(obj) == expected
