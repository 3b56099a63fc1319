"""Enum values, constants and NCCL_CONFIG_INITIALIZER as the C compiler sees them in the pinned nccl.h.

A small C program includes the real header (with a stand-in for the three CUDA headers it
includes, so no CUDA toolkit is needed), prints every value, and the test compares them with
the generated module.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mpbind.bindings import nccl

REPO = Path(__file__).resolve().parents[2]
IR_PATH = REPO / "bindings" / "ir" / "nccl.json"
WHEEL = "nvidia-nccl-cu13"

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


def _ir() -> dict[str, Any]:
    if not IR_PATH.is_file():
        pytest.skip("the frozen IR is not in this checkout")
    data: dict[str, Any] = json.loads(IR_PATH.read_text())
    return data


def _header_dir() -> Path:
    try:
        dist = md.distribution(WHEEL)
    except md.PackageNotFoundError:
        pytest.skip(f"{WHEEL} is not installed")
    if dist.version != _ir()["version"]:
        pytest.skip(f"{WHEEL} {dist.version} is installed; the bindings pin {_ir()['version']}")
    return Path(str(dist.locate_file("nvidia/nccl/include")))


def _program(ir: dict[str, Any]) -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stdint.h>",
        "#include <nccl.h>",
        "#define NUM(x) _Generic((x), float: printf(\"f:%.17g\\n\", (double)(x)), "
        "double: printf(\"f:%.17g\\n\", (double)(x)), default: printf(\"i:%lld\\n\", (long long)(x)))",
        "int main(void) {",
    ]
    for e in ir["enums"]:
        if e["header"] != "nccl.h":
            continue
        for c_name, _, _ in e["members"]:
            lines.append(f'  printf("enum {e["name"]} {c_name} "); NUM({c_name});')
    for c in ir["constants"]:
        if c["header"] == "nccl.h":
            lines.append(f'  printf("const {c["name"]} "); NUM({c["name"]});')
    lines.append("  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;")
    struct = next(s for s in ir["structs"] if s["name"] == "ncclConfig_t")
    for f in struct["fields"]:
        value = f"config.{f['name']}"
        if f["type"]["kind"] == "pointer":
            value = f"(intptr_t){value}"
        lines.append(f'  printf("field ncclConfig_t {f["name"]} "); NUM({value});')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory, c_compiler: str) -> dict[tuple[str, str, str], float | int]:
    """(kind, owner, name) -> value, as printed by the compiled probe."""
    ir = _ir()
    include = _header_dir()
    cc = c_compiler
    tmp = tmp_path_factory.mktemp("probe")
    shim = tmp / "shim"
    shim.mkdir()
    for name, text in CUDA_SHIM.items():
        (shim / name).write_text(text)
    src = tmp / "probe.c"
    src.write_text(_program(ir))
    exe = tmp / "probe"
    build = subprocess.run([cc, "-std=c11", "-I", str(shim), "-I", str(include), str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True)
    out: dict[tuple[str, str, str], float | int] = {}
    for line in run.stdout.splitlines():
        kind, *rest = line.split()
        if kind == "const":
            owner, name, raw = "", rest[0], rest[1]
        else:
            owner, name, raw = rest
        tag, _, number = raw.partition(":")
        out[(kind, owner, name)] = float(number) if tag == "f" else int(number)
    return out


def test_probe_saw_every_nccl_h_enum(compiled: dict[tuple[str, str, str], float | int]) -> None:
    owners = {owner for kind, owner, _ in compiled if kind == "enum"}
    expected = {e["name"] for e in _ir()["enums"] if e["header"] == "nccl.h"}
    assert owners == expected
    assert {"ncclResult_t", "ncclDataType_t", "ncclRedOp_t"} <= owners


def test_enum_members_match_the_compiler(compiled: dict[tuple[str, str, str], float | int]) -> None:
    problems = []
    for e in _ir()["enums"]:
        if e["header"] != "nccl.h":
            continue
        cls = getattr(nccl, e["python"])
        for c_name, py_name, _ in e["members"]:
            c_value = compiled[("enum", e["name"], c_name)]
            member = cls.__members__.get(py_name)
            if member is None:
                problems.append(f"{e['python']}.{py_name} ({c_name}) is missing")
            elif int(member) != c_value:
                problems.append(f"{e['python']}.{py_name} = {int(member)}, C {c_name} = {c_value}")
        # No member that the header does not have (aliases such as ncclInt = ncclInt32 fold in).
        c_values = {compiled[("enum", e["name"], c)] for c, _, _ in e["members"]}
        extra = [m for m, v in cls.__members__.items() if int(v) not in c_values]
        if extra:
            problems.append(f"{e['python']} has members with no C value: {extra}")
    assert problems == []


def test_constants_match_the_compiler(compiled: dict[tuple[str, str, str], float | int]) -> None:
    prefix = "NCCL_"
    problems = []
    checked = 0
    for c in _ir()["constants"]:
        if c["header"] != "nccl.h":
            continue
        c_value = compiled[("const", "", c["name"])]
        py_name = c["name"][len(prefix):] if c["name"].startswith(prefix) else c["name"]
        py_value = getattr(nccl, py_name)
        checked += 1
        if isinstance(c_value, float):
            if not (isinstance(py_value, float) and math.isclose(py_value, c_value, rel_tol=1e-7)):
                problems.append(f"{py_name} = {py_value!r}, C {c['name']} = {c_value!r}")
        elif type(py_value) is not int or py_value != c_value:
            problems.append(f"{py_name} = {py_value!r}, C {c['name']} = {c_value!r}")
    assert checked >= 10
    assert problems == []


def test_config_defaults_match_the_initializer(compiled: dict[tuple[str, str, str], float | int]) -> None:
    config = nccl.Config()
    fields = [name for kind, owner, name in compiled if kind == "field" and owner == "ncclConfig_t"]
    assert {"size", "magic", "version", "blocking", "netName"} <= set(fields)
    problems = []
    for name in fields:
        c_value = compiled[("field", "ncclConfig_t", name)]
        py_value = getattr(config, name)
        if py_value is None:
            py_value = 0  # a NULL pointer
        if py_value != c_value:
            problems.append(f"Config().{name} = {py_value!r}, NCCL_CONFIG_INITIALIZER gives {c_value!r}")
    assert problems == []
    assert config.nbytes == compiled[("field", "ncclConfig_t", "size")]
