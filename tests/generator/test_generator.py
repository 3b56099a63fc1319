"""The binding generator: --check, the frozen IR, seals, golden renderings and the spec."""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mpbind.bindings import nccl
from mpbind.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
CODEGEN = REPO / "codegen"
Generator = Callable[[str], ModuleType]
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE_GOLDEN = os.environ.get("MPBIND_UPDATE_GOLDEN") == "1"

# One representative function per parameter-role pattern of the Python API. The golden
# files hold the reviewed rendering (MPBIND_UPDATE_GOLDEN=1 rewrites them from the generator;
# review the diff before committing it).
GOLDEN_FUNCTIONS = [
    "ncclCommInitAll",  # out_array + nullable in_array whose length is an explicit argument
    "ncclCommShrink",  # in_array with a derived length + nullable struct pointer
    "ncclGetUniqueId",  # out struct
    "ncclCommRegister",  # void** out
    "ncclParamGetAllParameterKeys",  # out_str_array
    "ncclAllReduce",  # the guards: addresses, handles, a size_t and enums
    "ncclTeamWorld",  # a handle the library does not check for NULL (spec: non_null)
]
STUB_MARKER = "# --- stub ---"


@pytest.fixture(scope="module")
def ir(generate: ModuleType) -> dict[str, Any]:
    data: dict[str, Any] = generate.load_ir("nccl")
    return data


def _functions(ir: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in ir["functions"]}


# -- --check and the frozen IR ---------------------------------------------------------

def test_check_passes_on_the_checkout(generate: ModuleType) -> None:
    proc = subprocess.run([sys.executable, str(CODEGEN / "generate.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "generated files are current" in proc.stdout


def test_ir_round_trips(generate: ModuleType) -> None:
    text = generate.ir_path("nccl").read_text()
    assert generate.dump_ir(json.loads(text)) == text


# -- seals ----------------------------------------------------------------------------

def _generated_files(generate: ModuleType) -> list[Path]:
    irs = {lib: generate.load_ir(lib) for lib in generate.LIBRARIES}
    paths: list[Path] = sorted(generate.render(irs))
    return paths


def test_every_generated_file_carries_a_valid_seal(generate: ModuleType, generator: Generator) -> None:
    emit_common = generator("emit_common")
    for path in _generated_files(generate):
        digest, body = emit_common.unseal(path.read_text())
        assert digest is not None, f"{path.relative_to(REPO)} has no seal"
        assert digest == emit_common.body_digest(body), path.relative_to(REPO)


def test_seal_detects_a_one_character_edit(generator: Generator) -> None:
    emit_common = generator("emit_common")
    text = (REPO / "src" / "mpbind" / "bindings" / "nccl.pyi").read_text()
    digest, body = emit_common.unseal(text)
    assert digest is not None and digest == emit_common.body_digest(body)
    # Flip one character in the middle of the body (a type name becomes another).
    i = body.index("-> int", len(body) // 2) + len("-> ")
    edited = text[: len(text) - len(body)] + body[:i] + "j" + body[i + 1 :]
    assert len(edited) == len(text) and edited != text
    digest2, body2 = emit_common.unseal(edited)
    assert digest2 == digest
    assert digest2 != emit_common.body_digest(body2)


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "codegen" / "generate.py"), "--check"], cwd=root,
                          capture_output=True, text=True, timeout=120)


def test_check_fails_on_a_hand_edited_file(tree_copy: Path) -> None:
    pyi = tree_copy / "src" / "mpbind" / "bindings" / "nccl.pyi"
    text = pyi.read_text()
    i = text.rindex("-> None")
    pyi.write_text(text[:i] + "-> Nonf" + text[i + len("-> None") :])
    proc = _check(tree_copy)
    assert proc.returncode == 1, proc.stdout
    assert "src/mpbind/bindings/nccl.pyi: edited by hand" in proc.stdout


def test_check_fails_on_a_stale_resealed_file(tree_copy: Path, generator: Generator) -> None:
    emit_common = generator("emit_common")
    path = tree_copy / "src" / "mpbind" / "bindings" / "cynccl.pxd"
    text = path.read_text()
    digest, body = emit_common.unseal(text)
    assert digest is not None
    body = body.replace("nogil\n", "nogil  \n", 1)
    head = text[: text.index(digest)] + emit_common.body_digest(body) + "\n"
    path.write_text(head + body)
    proc = _check(tree_copy)
    assert proc.returncode == 1, proc.stdout
    assert "src/mpbind/bindings/cynccl.pxd: stale" in proc.stdout


# -- golden renderings ------------------------------------------------------------------

def _render(generator: Generator, name: str) -> str:
    generate, emit_python, emit_stubs = (generator(m) for m in ("generate", "emit_python", "emit_stubs"))
    lib = generate.load_library("nccl")
    python = lib.function(name).python
    # The function as it appears in the rendered module: from its `def` line to the next
    # top-level statement.
    module = emit_python.python_pyx(lib).splitlines()
    start = module.index(next(line for line in module if line.startswith(f"def {python}(")))
    end = next((i for i in range(start + 1, len(module)) if module[i][:1] not in ("", " ")), len(module))
    pyx = "\n".join(module[start:end]).rstrip() + "\n"
    return f"{pyx}{STUB_MARKER}\n{stub_definition(emit_stubs.stub(lib), python)}"


def stub_definition(stub: str, python: str) -> str:
    """A function's definition in a stub: its def line and its docstring."""
    lines = stub.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(f"def {python}(")]
    assert len(starts) == 1, starts
    end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i][:1] not in ("", " ")), len(lines))
    return "\n".join(lines[starts[0]:end]) + "\n"


@pytest.mark.parametrize("name", GOLDEN_FUNCTIONS)
def test_golden_rendering(generator: Generator, name: str) -> None:
    got = _render(generator, name)
    path = GOLDEN / f"{name}.txt"
    if UPDATE_GOLDEN:
        path.write_text(got)
    assert path.is_file(), f"no golden file {path.name}; run with MPBIND_UPDATE_GOLDEN=1"
    assert got == path.read_text(), f"rendering of {name} differs from {path.name}"


def _leaked_bytes(call: Callable[[], object], exc: type[BaseException], repeat: int = 50) -> int:
    """Bytes still allocated after `repeat` calls that each raise `exc`."""
    for _ in range(3):  # warm up caches (interned strings, exception machinery)
        with pytest.raises(exc):
            call()
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(repeat):
            with pytest.raises(exc):
                call()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before


# Each call fails on a Python-side check after an argument buffer was allocated and
# before any C call, so it needs no libnccl; 50 calls with 10000-element buffers
# leak megabytes when an error path skips PyMem_Free.
N = 10000
ERROR_PATHS: dict[str, tuple[Callable[[], object], type[BaseException]]] = {
    "comm_init_all: devlist of the wrong length": (lambda: nccl.comm_init_all(N, [0]), UsageError),
    "comm_init_all: devlist with a non-int": (
        lambda: nccl.comm_init_all(N, [0] * (N - 1) + ["x"]),  # type: ignore[list-item]
        TypeError,
    ),
    "comm_shrink: exclude_ranks_list with a non-int": (
        lambda: nccl.comm_shrink(nccl.Comm(0), [0] * (N - 1) + ["x"], None, 0),  # type: ignore[list-item]
        TypeError,
    ),
    "comm_shrink: config of the wrong type": (
        lambda: nccl.comm_shrink(nccl.Comm(0), [0] * N, object(), 0),  # type: ignore[arg-type]
        TypeError,
    ),
}


def test_leak_measurement_reports_no_leak_without_a_buffer() -> None:
    # Fails before any allocation: the measurement itself must read (about) zero.
    leaked = _leaked_bytes(lambda: nccl.comm_shrink(nccl.Comm(0), object(), None, 0), TypeError)  # type: ignore[arg-type]
    assert leaked < 64 * 1024, leaked


@pytest.mark.parametrize("case", sorted(ERROR_PATHS))
def test_argument_buffers_are_freed_on_error_paths(case: str) -> None:
    call, exc = ERROR_PATHS[case]
    leaked = _leaked_bytes(call, exc)
    assert leaked < 256 * 1024, f"{case}: {leaked} bytes leaked over 50 failing calls"


def test_negative_length_fails_cleanly() -> None:
    # Run apart: freeing a buffer pointer that was never set would crash the interpreter.
    code = (
        "from mpbind.bindings import nccl\n"
        "from mpbind.errors import UsageError\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        nccl.comm_init_all(-1)\n"
        "    except UsageError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('no UsageError for ndev=-1')\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("handle", ["Comm", "Window", "ParamHandle"])
def test_handle_newtypes_belong_to_the_module(handle: str) -> None:
    newtype = getattr(nccl, handle)
    assert newtype.__module__ == nccl.__name__, f"{handle}.__module__ is {newtype.__module__!r}"
    assert pickle.loads(pickle.dumps(newtype)) is newtype


# -- the spec ---------------------------------------------------------------------------

def test_every_bound_function_has_a_since_version(ir: dict[str, Any]) -> None:
    missing = [f["name"] for f in ir["functions"] if "excluded" not in f and not f.get("since")]
    assert missing == []


def test_every_excluded_function_has_a_reason(ir: dict[str, Any], generator: Generator) -> None:
    model = generator("model")
    spec = model.Spec.load("nccl")
    assert all(reason.strip() for reason in spec.excluded.values()), spec.excluded
    excluded = [f for f in ir["functions"] if "excluded" in f]
    assert excluded, "the IR excludes nothing: the exclusion records are gone"
    assert [f["name"] for f in excluded if not str(f["excluded"]).strip()] == []


def test_gil_keep_names_bound_functions(ir: dict[str, Any], generator: Generator) -> None:
    model = generator("model")
    spec = model.Spec.load("nccl")
    functions = _functions(ir)
    assert sorted(spec.gil_keep - functions.keys()) == []
    assert sorted(n for n in spec.gil_keep if "excluded" in functions[n]) == []
    assert sorted(n for n in spec.gil_keep if functions[n]["gil"] != "keep") == []
    released = [f["name"] for f in functions.values() if "excluded" not in f and f["name"] not in spec.gil_keep]
    assert released and all(functions[n]["gil"] == "release" for n in released)


# -- helpers shared by every library ----------------------------------------------------

def test_shared_helpers_are_defined_once(generate: ModuleType, generator: Generator) -> None:
    helpers = generator("emit_shared").HELPERS
    bindings = REPO / "src" / "mpbind" / "bindings"
    common = (bindings / "_common.pyx").read_text()
    for name in helpers:
        assert re.search(rf"^cdef [^(]*\b{name}\(", common, re.M), f"_common.pyx does not define {name}"
    for lib in generate.LIBRARIES:
        for path in (bindings / f"{lib}.pyx", bindings / "_internal" / f"{lib}.pyx"):
            defined = [n for n in helpers if re.search(rf"^cdef [^(]*\b_?{n}\(", path.read_text(), re.M)]
            assert defined == [], f"{path.relative_to(REPO)} defines {defined} instead of cimporting them"
