"""The exported functions of every release of a library, and the first release that exports each.

    python codegen/since.py update [--lib nccl ...]   read the releases on the package index that
                                                      codegen/symbols/<lib>.json does not hold yet
    python codegen/since.py show nccl                 print the `since` table derived from the record
    python codegen/since.py check [--lib nccl ...]    the record against the pinned wheel installed here

The record, ``codegen/symbols/<lib>.json``, lists the releases read (oldest first, with the
wheel each was read from) and, per exported function whose name has one of the library's
prefixes, the releases that export it as spans: ``"2.19.3-"`` (from 2.19.3 to the newest
release recorded), ``"2.19.3-2.25.1"``, ``"2.19.3"`` (that release only), comma-separated
when a function left and came back. It is committed, so the `since` of every function (the
first release that exports it, ``"<=oldest"`` when already in the oldest release recorded)
is derived offline; `update` downloads each release's wheel once, reads the dynamic symbol
table of its shared library with ``nm -D`` and deletes the wheel.

Which wheels hold a library's releases is in codegen/versions.toml (``releases_from``, in
order of preference: a release published in several CUDA variants is read from the first).
Pre-releases and post releases (a post release repackages its release) are not read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
RECORDS = ROOT / "symbols"
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]
INDEX_URL = "https://pypi.org/simple"
# Linux wheels, x86-64 first: exports do not differ between platforms, and a few releases were
# published for AArch64 only (nvidia-nccl-cu12 2.20.3); nm reads either.
PLATFORM = "manylinux"
ARCHES = ("x86_64", "aarch64")
# nm's symbol types of code: text, weak, indirect function.
CODE_TYPES = {"T", "W", "i"}
RECORD_FORMAT = 1


def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def is_release(version: str) -> bool:
    """A final release: numbers only (no pre, dev or post part), and not a 0.0.x placeholder."""
    return re.fullmatch(r"\d+(\.\d+)+", version) is not None and not version.startswith("0.0.")


# -- the record -------------------------------------------------------------------------------


@dataclass
class Record:
    """Per release (oldest first), the wheel it was read from and the functions it exports."""

    library: str
    prefixes: list[str]
    wheels: dict[str, str]
    exports: dict[str, set[str]]

    @property
    def releases(self) -> list[str]:
        return sorted(self.wheels, key=release_key)

    def add(self, release: str, wheel: str, symbols: Iterable[str]) -> None:
        self.wheels[release] = wheel
        self.exports[release] = set(symbols)

    def first(self) -> dict[str, str]:
        """Function -> the first release that exports it."""
        out: dict[str, str] = {}
        for release in self.releases:
            for name in self.exports[release]:
                out.setdefault(name, release)
        return out

    def since(self) -> dict[str, str]:
        """Function -> its `since`: the first release exporting it, "<=oldest" for the oldest recorded."""
        oldest = self.releases[0]
        return {name: f"<={oldest}" if first == oldest else first for name, first in self.first().items()}

    def spans(self) -> dict[str, str]:
        releases = self.releases
        out: dict[str, str] = {}
        for name in sorted(set().union(*self.exports.values())):
            present = [name in self.exports[r] for r in releases]
            runs = []
            i = 0
            while i < len(releases):
                if not present[i]:
                    i += 1
                    continue
                j = i
                while j + 1 < len(releases) and present[j + 1]:
                    j += 1
                runs.append(f"{releases[i]}-" if j == len(releases) - 1
                            else releases[i] if i == j else f"{releases[i]}-{releases[j]}")
                i = j + 1
            out[name] = ",".join(runs)
        return out

    def dumps(self) -> str:
        doc = {
            "format": RECORD_FORMAT,
            "library": self.library,
            "written_by": "codegen/since.py update",
            "prefixes": self.prefixes,
            "releases": {r: self.wheels[r] for r in self.releases},
            "exports": self.spans(),
        }
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def loads(cls, text: str) -> Record:
        doc = json.loads(text)
        if doc["format"] != RECORD_FORMAT:
            raise ValueError(f"symbol record format {doc['format']}, this tool reads {RECORD_FORMAT}")
        releases = sorted(doc["releases"], key=release_key)
        index = {r: i for i, r in enumerate(releases)}
        exports: dict[str, set[str]] = {r: set() for r in releases}
        for name, spans in doc["exports"].items():
            for span in spans.split(","):
                first, dash, last = span.partition("-")
                stop = index[last] if last else len(releases) - 1 if dash else index[first]
                for r in releases[index[first]:stop + 1]:
                    exports[r].add(name)
        return cls(doc["library"], doc["prefixes"], dict(doc["releases"]), exports)


def record_path(lib: str) -> Path:
    return RECORDS / f"{lib}.json"


def load_record(lib: str) -> Record:
    return Record.loads(record_path(lib).read_text())


def since_table(lib: str) -> dict[str, str]:
    """The `since` of every function the library has ever exported, from the committed record."""
    return load_record(lib).since()


# -- reading a shared library ------------------------------------------------------------------


def exported_functions(binary: Path, prefixes: Iterable[str]) -> set[str]:
    """Functions the shared library exports whose names start with one of prefixes."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    pre = tuple(prefixes)
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[-2] in CODE_TYPES:
            name = parts[-1].split("@")[0]
            if name.startswith(pre):
                names.add(name)
    return names


def binary_pattern(binary: str) -> re.Pattern[str]:
    """The shared library in any release's wheel: the spec's name with any soname version
    (cuFFTMp 11 ships libcufftMp.so.11, 12 libcufftMp.so.12) under any folder."""
    stem = Path(binary).name.split(".so")[0]
    return re.compile(rf"(^|/){re.escape(stem)}\.so(\.\d+)*$")


# -- the package index -------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelFile:
    wheel: str
    version: str
    url: str
    sha256: str


def index_files(wheel: str, index_url: str) -> list[WheelFile]:
    """One Linux wheel of every final release of `wheel` (PEP 691 JSON simple API), in ARCHES order."""
    req = urllib.request.Request(f"{index_url.rstrip('/')}/{wheel}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        doc = json.load(resp)
    out: dict[str, WheelFile] = {}
    for arch in ARCHES:
        for f in doc["files"]:
            name = f["filename"]
            if not name.endswith(".whl") or PLATFORM not in name or arch not in name or f.get("yanked"):
                continue
            version = name.split("-")[1]
            if is_release(version):
                out.setdefault(version, WheelFile(wheel, version, f["url"], f["hashes"].get("sha256", "")))
    return list(out.values())


def read_wheel(file: WheelFile, binary: re.Pattern[str], prefixes: list[str], scratch: Path) -> set[str]:
    """Download one wheel, read its shared library's exports, delete both."""
    path = scratch / "wheel.whl"
    digest = hashlib.sha256()
    with urllib.request.urlopen(file.url, timeout=600) as resp, path.open("wb") as out:
        while chunk := resp.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    try:
        if file.sha256 and digest.hexdigest() != file.sha256:
            raise RuntimeError(f"{file.url}: sha256 {digest.hexdigest()}, the index says {file.sha256}")
        with zipfile.ZipFile(path) as whl:
            members = [m for m in whl.namelist() if binary.search(m)]
            if len(members) != 1:
                raise RuntimeError(f"{file.url}: expected one shared library matching {binary.pattern}, "
                                   f"found {members}")
            lib = Path(whl.extract(members[0], scratch))
        try:
            return exported_functions(lib, prefixes)
        finally:
            lib.unlink()
    finally:
        path.unlink()


def library_config(lib: str) -> tuple[list[str], str, list[str]]:
    """(prefixes, binary, wheels holding its releases) from the spec and versions.toml."""
    spec = tomllib.loads((ROOT / "specs" / f"{lib}.toml").read_text())["library"]
    pins = tomllib.loads((ROOT / "versions.toml").read_text())[lib]
    return list(spec["prefixes"]), spec["binary"], list(pins["releases_from"])


def update(lib: str, index_url: str, only: set[str] | None = None) -> list[str]:
    """Read the releases the record lacks (or just `only`); returns the releases added."""
    prefixes, binary, wheels = library_config(lib)
    path = record_path(lib)
    record = load_record(lib) if path.exists() else Record(lib, prefixes, {}, {})
    if record.prefixes != prefixes:
        raise SystemExit(f"{lib}: the record holds prefixes {record.prefixes}, the spec {prefixes}: "
                         f"delete {path.relative_to(ROOT.parent)} and read every release again")
    chosen: dict[str, WheelFile] = {}
    for wheel in wheels:  # preference order: a release is read from the first wheel that has it
        for f in index_files(wheel, index_url):
            chosen.setdefault(f.version, f)
    todo = sorted((v for v in chosen if v not in record.wheels and (only is None or v in only)),
                  key=release_key)
    if only:
        missing = only - set(chosen)
        if missing:
            raise SystemExit(f"{lib}: {sorted(missing)} not on the index as {wheels}")
    pattern = binary_pattern(binary)
    with tempfile.TemporaryDirectory(prefix="mpbind-symbols-") as scratch:
        for version in todo:
            f = chosen[version]
            print(f"{lib}: reading {f.wheel} {version}", flush=True)
            record.add(version, f.wheel, read_wheel(f, pattern, prefixes, Path(scratch)))
            RECORDS.mkdir(exist_ok=True)
            path.write_text(record.dumps())  # after each release, so an interrupted run keeps its work
    return todo


# -- checks -------------------------------------------------------------------------------------


def installed_binary(lib: str, wheel: str) -> Path | None:
    import importlib.metadata as md

    _, binary, _ = library_config(lib)
    try:
        path = Path(str(md.distribution(wheel).locate_file(binary)))
    except md.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def check(lib: str) -> list[str]:
    """The record against the pinned wheel installed in this interpreter (if it is)."""
    import importlib.metadata as md

    pin = tomllib.loads((ROOT / "versions.toml").read_text())[lib]
    record = load_record(lib)
    if pin["version"] not in record.wheels:
        return [f"{lib}: the pinned release {pin['version']} is not recorded (run codegen/since.py update)"]
    try:
        installed = md.version(pin["wheel"])
    except md.PackageNotFoundError:
        print(f"note: {lib}: {pin['wheel']} is not installed; the record is not checked against it")
        return []
    binary = installed_binary(lib, pin["wheel"])
    if installed != pin["version"] or binary is None:
        print(f"note: {lib}: {pin['wheel']} {installed} is installed, the pin is {pin['version']}")
        return []
    found = exported_functions(binary, record.prefixes)
    recorded = record.exports[pin["version"]]
    problems = [f"{lib}: {pin['wheel']} {installed} exports {n}, which the record does not list for it"
                for n in sorted(found - recorded)]
    problems += [f"{lib}: the record lists {n} for {installed}, which its library does not export"
                 for n in sorted(recorded - found)]
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["update", "show", "check"])
    ap.add_argument("lib", nargs="*", help=f"libraries (default: all of {', '.join(LIBRARIES)})")
    ap.add_argument("--release", action="append", help="update: read only this release (repeatable)")
    ap.add_argument("--index-url", default=os.environ.get("PIP_INDEX_URL", INDEX_URL),
                    help="a PEP 691 simple index (default: $PIP_INDEX_URL or PyPI)")
    a = ap.parse_args()
    libs = a.lib or LIBRARIES
    unknown = set(libs) - set(LIBRARIES)
    if unknown:
        ap.error(f"unknown libraries {sorted(unknown)}; choose from {LIBRARIES}")
    if a.command == "update":
        if shutil.which("nm") is None:
            raise SystemExit("nm (binutils) is needed to read the dynamic symbol tables")
        for lib in libs:
            added = update(lib, a.index_url, set(a.release) if a.release else None)
            print(f"{lib}: {len(added)} release(s) added" + (f": {', '.join(added)}" if added else ""))
        return 0
    if a.command == "show":
        for lib in libs:
            for name, since in sorted(since_table(lib).items()):
                print(f"{lib} {name} {since}")
        return 0
    problems = [p for lib in libs for p in check(lib)]
    for p in problems:
        print(f"error: {p}")
    if not problems:
        print(f"ok: {', '.join(libs)}: the records hold the pinned releases and agree with the installed wheels")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
