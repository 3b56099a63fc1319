"""Enum values, constants, struct sizes and struct initializers as the C or C++ compiler sees each
library's pinned headers, against the generated module.

A small program (in the spec's language) includes the real headers, prints every value the IR
lists for the headers it can see, and the test compares them with the generated module. NCCL's
nccl.h also builds without CUDA headers: with a stand-in for the three it includes, as C.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata as md
import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
CODEGEN = REPO / "codegen"

CUDA_SHIM = {
    "cuda_runtime.h": (
        "#pragma once\n"
        "#define CUDART_VERSION 13000\n"
        "typedef struct CUstream_st* cudaStream_t;\n"
        "typedef struct CUevent_st* cudaEvent_t;\n"
    ),
    "cuda_fp16.h": "#pragma once\n",
    "cuda_bf16.h": "#pragma once\n",
}


@dataclass(frozen=True)
class Library:
    """What each library's probe must at least see and check."""

    name: str
    main_enums: frozenset[str]
    min_members: int = 0
    min_constants: int = 0
    shim_headers: tuple[str, ...] = ()  # headers that build, as C, with CUDA_SHIM instead of CUDA's
    classes: tuple[str, ...] = field(default=())  # enum (int) or struct classes the module must have


LIBRARIES = {
    lib.name: lib
    for lib in [
        Library("nccl", frozenset({"ncclResult_t", "ncclDataType_t", "ncclRedOp_t"}), min_constants=10,
                shim_headers=("nccl.h",)),
        Library("nvshmem", frozenset({"nvshmemx_status", "nvshmemx_init_status_t", "nvshmemx_thread_support_t",
                                      "nvshmem_team_id_t", "flags"}), min_members=100, min_constants=10,
                classes=("InitAttr", "InitArgs", "UniqueIdArgs", "UniqueId", "TeamConfig", "LibVersion",
                         "RegionAttrs")),
        Library("cublasmp", frozenset({"cublasMpStatus_t", "cublasMpGridLayout_t", "cudaDataType_t",
                                       "cublasOperation_t"}), min_members=100,
                classes=("GridLayout", "MatmulAlgoType", "MatmulEpilogue", "MatmulMatrixScale", "ResultScheme",
                         "EmulationStrategy", "CudaDataType", "CublasComputeType", "CublasOperation")),
        Library("cufftmp", frozenset({"cufftResult", "cufftType", "cufftMpCommType"}), min_constants=5),
    ]
}

Key = tuple[str, str, str]  # (kind, owner, name)
Values = dict[Key, "int | float | str"]


@dataclass
class Probe:
    lib: str
    ir: dict[str, Any]
    module: ModuleType
    visible: set[str]  # headers the program includes, as the IR names them
    values: Values
    shim: bool  # built against CUDA_SHIM: only the shim_headers


def _spec(lib: str) -> dict[str, Any]:
    return tomllib.loads((CODEGEN / "specs" / f"{lib}.toml").read_text())


def _pinned_include(lib: str, spec: dict[str, Any], ir: dict[str, Any]) -> list[Path]:
    """The pinned wheel's include folder, then those of the wheels its headers include."""
    try:
        dist = md.distribution(spec["library"]["wheel"])
    except md.PackageNotFoundError:
        pytest.skip(f"{spec['library']['wheel']} is not installed")
    if dist.version != ir["version"]:
        pytest.skip(f"{dist.metadata['Name']} {dist.version} is installed; the bindings pin {ir['version']}")
    dirs = [Path(str(dist.locate_file(spec["library"]["include_subdir"])))]
    for wheel, subdir in spec["library"].get("extra_includes", []):
        try:
            dirs.append(Path(str(md.distribution(wheel).locate_file(subdir))))
        except md.PackageNotFoundError:
            pytest.skip(f"{wheel} (headers {lib} includes) is not installed")
    return dirs


def _cuda_include() -> str | None:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        return None
    found = find_nvidia_header_directory("cudart")
    return str(found) if found else None


def _compiler(language: str) -> str:
    names = ("c++", "g++", "clang++") if language == "c++" else ("cc", "gcc", "clang")
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"no {language} compiler ({', '.join(names)}) on PATH")


PRELUDE = {
    "c": [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "static void pi(const char* k, const char* o, const char* n, long long v) { printf(\"%s %s %s i:%lld\\n\", k, o, n, v); }",  # noqa: E501
        "static void pf(const char* k, const char* o, const char* n, double v) { printf(\"%s %s %s f:%.17g\\n\", k, o, n, v); }",  # noqa: E501
        "#define NUM(k, o, n, x) _Generic((x), float: pf, double: pf, default: pi)(k, o, n, (x))",
    ],
    "c++": [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#include <type_traits>",
        "template <typename T> static void num(const char* k, const char* o, const char* n, T v) {",
        "  if (std::is_floating_point<T>::value) printf(\"%s %s %s f:%.17g\\n\", k, o, n, (double)v);",
        "  else printf(\"%s %s %s i:%lld\\n\", k, o, n, (long long)v);",
        "}",
        "#define NUM(k, o, n, x) num(k, o, n, (x))",
    ],
}
HEX = [
    "static void hex(const char* name, const void* p, size_t n) {",
    "  printf(\"init - %s h:\", name);",
    "  for (size_t i = 0; i < n; ++i) printf(\"%02x\", ((const unsigned char*)p)[i]);",
    "  printf(\"\\n\");",
    "}",
]


def _program(language: str, headers: list[str], ir: dict[str, Any], visible: set[str],
             initializers: dict[str, str]) -> str:
    lines = [*PRELUDE[language], *HEX, *(f"#include <{h}>" for h in headers)]
    # Static storage: zero-initialised first, so padding bytes are zero.
    lines += [f"static const {ctype} init_{macro} = {macro};" for ctype, macro in initializers.items()]
    lines.append("int main(void) {")
    for e in ir["enums"]:
        if e["header"] in visible:
            lines += [f'  NUM("enum", "{e["name"]}", "{c}", {c});' for c, _, _ in e["members"]]
    lines += [f'  NUM("const", "-", "{c["name"]}", {c["name"]});' for c in ir["constants"] if c["header"] in visible]
    lines += [f'  NUM("sizeof", "-", "{s["name"]}", sizeof({s["name"]}));'
              for s in ir["structs"] if s["header"] in visible]
    lines += [f'  hex("{macro}", &init_{macro}, sizeof(init_{macro}));' for macro in initializers.values()]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _visible(cc: str, flags: list[str], own: Path, src: Path) -> set[str]:
    """Headers `src` includes: relative to the library's include folder, and by file name (as the IR
    names the foreign headers whose enums it takes)."""
    proc = subprocess.run([cc, *flags, "-M", str(src)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = str(own.resolve()) + "/"
    out = set()
    for dep in proc.stdout.replace("\\\n", " ").split()[1:]:
        path = str(Path(dep).resolve())
        out.add(path[len(root):] if path.startswith(root) else Path(path).name)
    return out


@pytest.fixture(scope="module", params=sorted(LIBRARIES))
def probe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Probe:
    lib: str = request.param
    ir: dict[str, Any] = json.loads((CODEGEN / "ir" / f"{lib}.json").read_text())
    spec = _spec(lib)
    includes = _pinned_include(lib, spec, ir)
    tmp = tmp_path_factory.mktemp(f"probe_{lib}")
    language = spec["library"].get("language", "c")
    headers = list(spec["library"]["headers"])
    cuda = _cuda_include()
    shim = cuda is None
    if shim:
        if not LIBRARIES[lib].shim_headers:
            pytest.skip(f"no CUDA runtime headers (cuda_runtime.h) found: the {lib} headers need them")
        (tmp / "shim").mkdir()
        for name, text in CUDA_SHIM.items():
            (tmp / "shim" / name).write_text(text)
        cuda, language, headers = str(tmp / "shim"), "c", list(LIBRARIES[lib].shim_headers)
    cc = _compiler(language)
    flags = ["-std=c++17" if language == "c++" else "-std=c11", *(f"-I{d}" for d in includes), f"-I{cuda}"]
    head = tmp / ("head.cpp" if language == "c++" else "head.c")
    head.write_text("".join(f"#include <{h}>\n" for h in headers))
    visible = _visible(cc, flags, includes[0], head)
    assert set(headers) <= visible
    # The *_INITIALIZER macros (spec: struct -> macro) of the structs the program sees.
    seen_structs = {s["initializer"]["macro"] for s in ir["structs"] if "initializer" in s and s["header"] in visible}
    initializers = {ctype: m for ctype, m in spec.get("initializers", {}).items() if m in seen_structs}
    src = tmp / ("probe.cpp" if language == "c++" else "probe.c")
    src.write_text(_program(language, headers, ir, visible, initializers))
    exe = tmp / "probe"
    build = subprocess.run([cc, *flags, str(src), "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True)
    values: Values = {}
    for line in run.stdout.splitlines():
        kind, owner, name, raw = line.split()
        tag, _, value = raw.partition(":")
        values[(kind, owner, name)] = float(value) if tag == "f" else value if tag == "h" else int(value)
    return Probe(lib, ir, importlib.import_module(f"mpbind.bindings.{lib}"), visible, values, shim)


def _py_constant_name(ir: dict[str, Any], c_name: str) -> str:
    """The module's name of a constant: without the library prefix (NCCL_, NVSHMEMX_, CUFFT_, ...)."""
    for prefix in sorted(ir["prefixes"], key=len, reverse=True):
        if c_name.startswith(prefix.upper() + "_"):
            return c_name[len(prefix) + 1:]
    return c_name


def test_probe_saw_the_main_enums(probe: Probe) -> None:
    seen = {owner for kind, owner, _ in probe.values if kind == "enum"}
    assert LIBRARIES[probe.lib].main_enums <= seen
    if not probe.shim:
        assert seen == {e["name"] for e in probe.ir["enums"]}
    for name in LIBRARIES[probe.lib].classes:
        cls = getattr(probe.module, name)
        assert issubclass(cls, int) or isinstance(cls().nbytes, int), name


def test_enum_members_match_the_compiler(probe: Probe) -> None:
    problems = []
    checked = 0
    for e in probe.ir["enums"]:
        if e["header"] not in probe.visible:
            continue
        cls = getattr(probe.module, e["python"])
        for c_name, py_name, _ in e["members"]:
            c_value = probe.values[("enum", e["name"], c_name)]
            member = cls.__members__.get(py_name)
            checked += 1
            if member is None:
                problems.append(f"{e['python']}.{py_name} ({c_name}) is missing")
            elif int(member) != c_value:
                problems.append(f"{e['python']}.{py_name} = {int(member)}, C {c_name} = {c_value}")
        # No member that the header does not have (aliases such as ncclInt = ncclInt32 fold in).
        c_values = {probe.values[("enum", e["name"], c)] for c, _, _ in e["members"]}
        extra = [m for m, v in cls.__members__.items() if int(v) not in c_values]
        if extra:
            problems.append(f"{e['python']} has members with no C value: {extra}")
    assert checked >= LIBRARIES[probe.lib].min_members
    assert problems == []


def test_constants_match_the_compiler(probe: Probe) -> None:
    problems = []
    checked = 0
    for c in probe.ir["constants"]:
        if c["header"] not in probe.visible:
            continue
        c_value = probe.values[("const", "-", c["name"])]
        py_name = _py_constant_name(probe.ir, c["name"])
        py_value = getattr(probe.module, py_name)
        checked += 1
        if isinstance(c_value, float):
            if not (isinstance(py_value, float) and math.isclose(py_value, c_value, rel_tol=1e-7)):
                problems.append(f"{py_name} = {py_value!r}, C {c['name']} = {c_value!r}")
        elif type(py_value) is not int or py_value != c_value:
            problems.append(f"{py_name} = {py_value!r}, C {c['name']} = {c_value!r}")
    assert checked >= LIBRARIES[probe.lib].min_constants
    assert problems == []


def test_struct_sizes_match_the_compiler(probe: Probe) -> None:
    problems = []
    for s in probe.ir["structs"]:
        if s["header"] not in probe.visible:
            continue
        c_size = probe.values[("sizeof", "-", s["name"])]
        if s["size"] != c_size:
            problems.append(f"IR {s['name']} size {s['size']}, C {c_size}")
        cls = getattr(probe.module, s["python"], None)
        if isinstance(cls, type) and not s.get("opaque") and cls().nbytes != c_size:
            problems.append(f"{s['python']}().nbytes = {cls().nbytes}, sizeof({s['name']}) = {c_size}")
    assert problems == []


def _fields_differing(struct: dict[str, Any], got: bytes, want: bytes) -> list[str]:
    fields = struct.get("fields", [])
    ends = [f["offset"] for f in fields[1:]] + [len(want)]
    return [f"{f['name']} = {got[f['offset']:end].hex()}, the initializer {want[f['offset']:end].hex()}"
            for f, end in zip(fields, ends, strict=True) if got[f["offset"]:end] != want[f["offset"]:end]]


def test_default_bytes_match_the_initializers(probe: Probe) -> None:
    """Each struct class built without arguments holds the bytes of the header's *_INITIALIZER."""
    macros = {s["initializer"]["macro"]: s for s in probe.ir["structs"]
              if "initializer" in s and s["header"] in probe.visible}
    assert sorted(m for (kind, _, m) in probe.values if kind == "init") == sorted(macros)
    assert bool(macros) == bool(_spec(probe.lib).get("initializers"))
    problems = []
    for macro, struct in macros.items():
        want = bytes.fromhex(str(probe.values[("init", "-", macro)]))
        obj = getattr(probe.module, struct["python"])()
        got = ctypes.string_at(obj.ptr, obj.nbytes)
        if got != want:
            problems.append(f"{type(obj).__name__}() differs from {macro}: "
                            f"{_fields_differing(struct, got, want) or [got.hex(), want.hex()]}")
        if struct.get("kind") == "bytes" and bytes(obj) != want:
            problems.append(f"bytes({type(obj).__name__}()) differs from {macro}")
    assert problems == []
