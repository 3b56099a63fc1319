"""The two wheel families (CUDA 13 and CUDA 12) under one set of bindings: which wheel each loaded
library came from, the installed family's libraries against the bindings, and a process that already
holds the other family's copy of a library.

These run in both CI environments (the cu13 one of ``make test`` and the cu12 one of ``.ci/run``):
the expected versions are those of the family installed here (the ``installed`` fixture).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mpbind._infra import families as _families
from mpbind._infra import loader as _loader
from mpbind.bindings import _status
from mpbind.errors import CuFFTMpError, LibraryConflictError, LibraryNotFoundError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]
# What loads without a GPU driver (libcublasmp links libcuda.so.1).
LOADABLE = ["nccl", "nvshmem", "cufftmp"]


def _installed_version(wheel: str) -> str | None:
    try:
        return md.version(wheel)
    except md.PackageNotFoundError:
        return None


def _needs(pin: Any) -> None:
    if _installed_version(pin.wheel) != pin.version:
        pytest.skip(f"{pin.wheel} {pin.version} is not installed (found {_installed_version(pin.wheel)})")


def _run(code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`code` in a fresh interpreter (loading is once per process); its last line is a JSON object."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MPBIND_")}
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=180, env=full)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --- the families mpbind knows ------------------------------------------------------------------


def test_the_loader_knows_each_familys_wheels() -> None:
    """The loader's wheel names (shipped) are versions.toml's (the pins of the extras)."""
    doc = tomllib.loads((REPO / "codegen" / "versions.toml").read_text())
    for lib in LIBRARIES:
        others = [v["wheel"] for k, v in doc[lib].items() if re.fullmatch(r"cu\d+", k)]
        assert set(_loader.LIBRARIES[lib].wheels) == {doc[lib]["wheel"], *others}, lib
        assert [_families.family_of(w) for w in _loader.LIBRARIES[lib].wheels] == list(_families.FAMILIES)


def test_each_extra_pins_one_family_and_its_cuda_bindings() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for family in _families.FAMILIES:
        names = [re.split(r"[=<>!~ ]", r, maxsplit=1)[0] for r in extras[family]]
        nvidia = [n for n in names if n.startswith("nvidia-")]
        assert len(nvidia) == len(LIBRARIES) and all(n.endswith("-" + family) for n in nvidia), (family, names)
        bindings = next(r for r in extras[family] if r.startswith("cuda-bindings"))
        assert f">={family[2:]}" in bindings and f"<{int(family[2:]) + 1}" in bindings, bindings


# --- which wheel a loaded library came from ---------------------------------------------------


@pytest.mark.parametrize("lib", LOADABLE)
def test_a_loaded_library_names_its_wheel_and_family(lib: str, installed: dict[str, Any]) -> None:
    pin = installed[lib]
    _needs(pin)
    if os.environ.get(_loader.LIBRARIES[lib].env_var):
        pytest.skip(f"{_loader.LIBRARIES[lib].env_var} is set")
    loaded = _loader.load(lib)
    assert loaded.owner is not None, loaded
    assert (loaded.owner.distribution, loaded.owner.version, loaded.owner.family) == (pin.wheel, pin.version,
                                                                                        pin.family)
    assert _loader.loaded_version(lib) == ".".join(map(str, pin.parts[:3]))


def test_info_says_which_family_and_version_it_loaded(installed: dict[str, Any]) -> None:
    pin = installed["nccl"]
    _needs(pin)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPBIND_")}
    proc = subprocess.run([sys.executable, "-m", "mpbind", "info"], capture_output=True, text=True, timeout=180,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    nccl = out[out.index("\nnccl:"):out.index("\nnvshmem:")]
    assert f"version:  {pin.version}" in nccl
    assert f"wheel:    {pin.wheel} {pin.version} (family {pin.family})" in nccl
    assert re.search(rf"^wheel family: {pin.family} \(nccl, nvshmem", out, re.M), out


def test_the_family_line_flags_a_mix() -> None:
    from mpbind._infra.info import LibraryReport, family_line

    one = [LibraryReport("nccl", found=True, family="cu12"), LibraryReport("cufftmp", found=True, family="cu12"),
           LibraryReport("cublasmp")]
    assert family_line(one) == "wheel family: cu12 (nccl, cufftmp)"
    mixed = [LibraryReport("nccl", found=True, family="cu12"), LibraryReport("cufftmp", found=True, family="cu13")]
    assert "mixed" in family_line(mixed)
    assert family_line([LibraryReport("nccl")]) == "wheel family: none loaded"


# --- the installed family's libraries under the bindings --------------------------------------


def _exports(path: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split(".post")[0]))


@pytest.mark.parametrize("lib", LIBRARIES)
def test_every_bound_function_is_exported_or_names_a_later_release(lib: str, installed: dict[str, Any]) -> None:
    """Coverage against the installed family's library: what it lacks must be newer than it (so the binding
    raises FunctionNotFoundError naming that release), never a function it should have."""
    pin = installed[lib]
    _needs(pin)
    path = _families.installed_file((pin.wheel,), _loader.LIBRARIES[lib].sonames)
    assert path is not None
    exported = _exports(path)
    ir = json.loads((REPO / "codegen" / "ir" / f"{lib}.json").read_text())
    missing = []
    for f in ir["functions"]:
        if f.get("excluded") or f.get("device_only"):
            continue
        symbol = f["inline_body"]["uses"] if f.get("inline_body") else f["name"]
        if symbol in exported:
            continue
        since = f.get("since") or ""
        if since.startswith("<=") or _release(since) <= pin.parts:
            missing.append(f"{symbol} (since {since})")
    assert missing == []


def test_the_loaded_cufftmp_resolves_every_bound_function(installed: dict[str, Any]) -> None:
    pin = installed["cufftmp"]
    _needs(pin)
    from mpbind.bindings._internal import cufftmp

    ir = json.loads((REPO / "codegen" / "ir" / "cufftmp.json").read_text())
    names = [f["inline_body"]["uses"] if f.get("inline_body") else f["name"]
             for f in ir["functions"] if not f.get("excluded")]
    assert [n for n in names if cufftmp.symbol_address(n) == 0] == []


def test_a_status_the_bindings_do_not_name_is_still_a_typed_error() -> None:
    # cuFFTMp 11.4 returns 15 (CUFFT_LICENSE_ERROR), which 12.1 dropped: unnamed, still a CuFFTMpError
    err = _status.make_error("cufftmp", "cufftPlan3d", 15)
    assert isinstance(err, CuFFTMpError) and err.status == 15 and "unknown status (15)" in str(err)


# --- which wheel a file belongs to --------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _fake_wheel(site: Path, name: str, version: str, files: dict[str, bytes | None],
                sizes: dict[str, int] | None = None) -> None:
    """A dist-info of `name` in `site` recording `files` (content None: the file on disk as it is)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for rel, data in files.items():
        target = site / rel
        if data is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        body = target.read_bytes()
        rows.append(f"{rel},sha256={_record_hash(body)},{(sizes or {}).get(rel, len(body))}")
    rows.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")


LIB = "nvidia/nccl/lib/libnccl.so.2"


def test_owner_of_a_file_one_wheel_installed(tmp_path: Path) -> None:
    _fake_wheel(tmp_path, "nvidia-nccl-cu12", "2.30.1", {LIB: b"library"})
    owner = _families.owner(str(tmp_path / LIB))
    assert owner == _families.Owner("nvidia-nccl-cu12", "2.30.1", "cu12")
    assert str(owner) == "nvidia-nccl-cu12 2.30.1"
    other = tmp_path / "elsewhere" / "libnccl.so.2"
    other.parent.mkdir()
    other.write_bytes(b"library")
    assert _families.owner(str(other)) is None
    assert _families.owner(str(tmp_path / "missing.so")) is None


def test_owner_of_a_file_both_families_installed_over_one_another(tmp_path: Path) -> None:
    """Both families record nvidia/nccl/lib/libnccl.so.2: the file is the wheel whose size, then digest,
    it has."""
    _fake_wheel(tmp_path, "nvidia-nccl-cu13", "2.30.1", {LIB: b"cu13 library"}, sizes={LIB: 999})
    _fake_wheel(tmp_path, "nvidia-nccl-cu12", "2.30.1", {LIB: None})  # installed last: the file is its
    assert _families.owner(str(tmp_path / LIB)).family == "cu12"  # type: ignore[union-attr]

    same_size = tmp_path / "b"
    _fake_wheel(same_size, "nvidia-nccl-cu12", "2.30.1", {LIB: b"cu12 library"})
    _fake_wheel(same_size, "nvidia-nccl-cu13", "2.30.1", {LIB: b"cu13 library"})  # same size, last
    assert _families.owner(str(same_size / LIB)).family == "cu13"  # type: ignore[union-attr]
    (same_size / LIB).write_bytes(b"xxxx library")  # neither wheel's bytes
    assert _families.owner(str(same_size / LIB)) is None


def test_mapped_copies_reads_the_process_maps() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6")
    assert any(os.path.basename(p).startswith("libc.so") for p in _families.mapped_copies(("libc.so.6",)))
    assert _families.mapped_copies(("libnosuchlibrary.so.1",)) == []


# --- a process that already holds the other family's copy ---------------------------------------

FAKE_SOURCE = r"""
int calls = 0;
int ncclGetVersion(int* version) { ++calls; *version = 22809; return 0; }
const char* ncclGetErrorString(int result) { (void)result; return "fake"; }
"""


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory: pytest.TempPathFactory, c_compiler: str) -> bytes:
    """A libnccl.so.2 (soname libnccl.so.2) counting the calls into it."""
    folder = tmp_path_factory.mktemp("fake_nccl")
    (folder / "fake.c").write_text(FAKE_SOURCE)
    lib = folder / "libnccl.so.2"
    subprocess.run([c_compiler, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(lib),
                    str(folder / "fake.c")], check=True, capture_output=True, timeout=120)
    return lib.read_bytes()


def _other(family: str) -> str:
    return next(f for f in _families.FAMILIES if f != family)


CONFLICT_REPORT = """
import ctypes, json, os, pickle
fake = ctypes.CDLL({fake!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)  # another package loads its copy
from mpbind._infra import loader as _loader
from mpbind.bindings import nccl
from mpbind.errors import LibraryNotFoundError
try:
    version = nccl.get_version()
    lib = _loader.load("nccl")
    out = {{"type": None, "version": version, "path": lib.path, "family": lib.owner and lib.owner.family}}
except Exception as exc:
    clone = pickle.loads(pickle.dumps(exc))
    out = {{"type": type(exc).__name__, "lnf": isinstance(exc, LibraryNotFoundError), "message": str(exc),
           "attrs": [exc.library, exc.path, exc.wheel, exc.loaded_path, exc.loaded_wheel],
           "clone": [type(clone).__name__, str(clone)]}}
out["calls"] = ctypes.c_int.in_dll(fake, "calls").value
out["mapped"] = sorted({{line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line}})
print(json.dumps(out))
"""


def _wheel_nccl(installed: dict[str, Any]) -> Path:
    pin = installed["nccl"]
    _needs(pin)
    path = _families.installed_file((pin.wheel,), ("libnccl.so.2",))
    assert path is not None
    return Path(path).resolve()


def test_the_other_familys_copy_already_loaded_is_refused(tmp_path: Path, fake_library: bytes,
                                                          installed: dict[str, Any]) -> None:
    ours = _wheel_nccl(installed)
    family = installed["nccl"].family
    other = f"nvidia-nccl-{_other(family)}"
    _fake_wheel(tmp_path, other, "2.28.9", {LIB: fake_library})
    fake = str(tmp_path / LIB)
    out = _run(CONFLICT_REPORT.format(fake=fake))
    assert out["type"] == "LibraryConflictError", out
    assert out["lnf"] is True
    library, path, wheel, loaded_path, loaded_wheel = out["attrs"]
    assert (library, Path(path).resolve(), loaded_path) == ("nccl", ours, fake)
    assert wheel.startswith(f"{installed['nccl'].wheel} ") and f"family {family}" in wheel
    assert loaded_wheel == f"{other} 2.28.9, family {_other(family)}"
    for text in (fake, str(ours), other, installed["nccl"].wheel, "MPBIND_NCCL_PATH"):
        assert text in out["message"]
    assert out["clone"] == ["LibraryConflictError", out["message"]]
    # refused before any call into either copy, and mpbind's copy never opened
    assert out["calls"] == 0
    assert out["mapped"] == [fake]


def test_the_same_familys_copy_already_loaded_is_used(tmp_path: Path, fake_library: bytes,
                                                      installed: dict[str, Any]) -> None:
    """As before: cuda.pathfinder uses the copy the process holds (a check of its version is the caller's)."""
    _wheel_nccl(installed)
    family = installed["nccl"].family
    _fake_wheel(tmp_path, f"nvidia-nccl-{family}", "2.28.9", {LIB: fake_library})
    fake = str(tmp_path / LIB)
    out = _run(CONFLICT_REPORT.format(fake=fake))
    assert (out["type"], out["version"], out["path"], out["family"]) == (None, 22809, fake, family)
    assert out["mapped"] == [fake]


def test_a_copy_of_unknown_origin_already_loaded_is_used(tmp_path: Path, fake_library: bytes,
                                                         installed: dict[str, Any]) -> None:
    _wheel_nccl(installed)
    fake = tmp_path / "libnccl.so.2"  # no wheel installed it: its family is unknown
    fake.write_bytes(fake_library)
    out = _run(CONFLICT_REPORT.format(fake=str(fake)))
    assert (out["type"], out["version"], out["path"], out["family"]) == (None, 22809, str(fake), None)


def test_the_override_may_name_the_loaded_copy(tmp_path: Path, fake_library: bytes,
                                               installed: dict[str, Any]) -> None:
    _wheel_nccl(installed)
    _fake_wheel(tmp_path, f"nvidia-nccl-{_other(installed['nccl'].family)}", "2.28.9", {LIB: fake_library})
    fake = str(tmp_path / LIB)
    out = _run(CONFLICT_REPORT.format(fake=fake), {"MPBIND_NCCL_PATH": fake})
    assert (out["type"], out["version"], out["path"]) == (None, 22809, fake)


def test_the_conflict_error_is_a_library_not_found_error() -> None:
    err = LibraryConflictError("nvshmem", "/a/libnvshmem_host.so.3", "nvidia-nvshmem-cu12 3.7.1, family cu12",
                               "/b/libnvshmem_host.so.3", "nvidia-nvshmem-cu13 3.4.5, family cu13")
    assert isinstance(err, LibraryNotFoundError) and isinstance(err, ImportError)
    assert "MPBIND" not in str(err)  # no override variable named: none given


SECOND_NVSHMEM = """
import ctypes, json, os, pickle
ctypes.CDLL({first!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)  # another package loaded its NVSHMEM first
from mpbind._infra import loader as _loader
try:
    out = {{"type": None, "path": _loader.load("nvshmem").path}}
except Exception as exc:
    clone = pickle.loads(pickle.dumps(exc))
    out = {{"type": type(exc).__name__, "message": str(exc), "same_family": exc.same_family,
           "attrs": [exc.path, exc.loaded_path], "clone": [type(clone).__name__, str(clone)]}}
out["mapped"] = sorted({{line.split()[-1] for line in open("/proc/self/maps") if "libnvshmem_host" in line}})
print(json.dumps(out))
"""


def test_a_second_nvshmem_copy_named_by_the_override_is_refused(tmp_path: Path, installed: dict[str, Any]) -> None:
    """NVSHMEM is one runtime per copy, and cuFFTMp and cuBLASMp bind to the copy loaded first: an
    override naming another file than the mapped copy would split them, so it is refused before loading."""
    pin = installed["nvshmem"]
    _needs(pin)
    wheel_copy = _families.installed_file((pin.wheel,), ("libnvshmem_host.so.3",))
    assert wheel_copy is not None
    first = tmp_path / "libnvshmem_host.so.3"
    shutil.copyfile(wheel_copy, first)
    out = _run(SECOND_NVSHMEM.format(first=str(first)), {"MPBIND_NVSHMEM_PATH": str(Path(wheel_copy).parent)})
    assert out["type"] == "LibraryConflictError" and out["same_family"] is True, out
    assert [Path(p).resolve() for p in out["attrs"]] == [Path(wheel_copy).resolve(), first.resolve()]
    for text in ("MPBIND_NVSHMEM_PATH", "not symmetric", str(first)):
        assert text in out["message"]
    assert out["clone"] == ["LibraryConflictError", out["message"]]
    assert out["mapped"] == [str(first)]  # mpbind's copy never opened
    # The override naming the mapped copy, or no override (the search takes the mapped copy), loads it.
    for env in ({"MPBIND_NVSHMEM_PATH": str(first)}, {}):
        out = _run(SECOND_NVSHMEM.format(first=str(first)), env)
        assert (out["type"], out["mapped"]) == (None, [str(first)]), out


def test_load_libraries_loads_now_and_first(tmp_path: Path, installed: dict[str, Any]) -> None:
    """Loaded before another package maps its copy, mpbind's is the one copy the process holds."""
    pin = installed["nvshmem"]
    _needs(pin)
    wheel_copy = _families.installed_file((pin.wheel,), ("libnvshmem_host.so.3",))
    assert wheel_copy is not None
    out = _run("""
        import json, mpbind
        paths = mpbind.load_libraries("nvshmem")
        mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnvshmem_host" in line})
        errors = []
        for bad in ((), ("nvshmem", "mpi"), (3,)):
            try:
                mpbind.load_libraries(*bad)
            except (TypeError, ValueError) as exc:
                errors.append(type(exc).__name__)
        print(json.dumps({"paths": paths, "mapped": mapped, "errors": errors}))
    """)
    assert [Path(p).resolve() for p in out["mapped"]] == [Path(wheel_copy).resolve()]
    assert Path(out["paths"]["nvshmem"]).resolve() == Path(wheel_copy).resolve()
    assert out["errors"] == ["TypeError", "ValueError", "ValueError"]


def test_version_is_the_installed_distributions() -> None:
    import importlib.metadata as md

    proc = subprocess.run([sys.executable, "-m", "mpbind", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"mpbind {md.version('mpbind')}"
    meta = md.metadata("mpbind")
    assert "License :: OSI Approved :: Apache Software License" in meta.get_all("Classifier")
