"""Bump one library to another release in one command, then list what a human must review.

    python codegen/bump.py nccl 2.33.1 [--no-install] [--index-url URL]

1. sets the pin in codegen/versions.toml and rewrites pyproject.toml's pins from it;
2. installs the pinned wheel into this interpreter with pip (the generator reads its headers);
3. reads the releases codegen/symbols/<lib>.json lacks from the package index (codegen/since.py),
   so that every function has its `since`;
4. regenerates the IR and the bindings (codegen/generate.py) of the library and of the libraries
   whose headers include its headers;
5. prints the review list: what changed in the IR, new functions whose parameters took the
   default role, exported functions no parsed header declares, and the old version's mentions
   in the documentation, examples and tests.

docs/DESIGN.md ("Bumping a library version") has the checklist that follows.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

import since  # noqa: E402
import versions  # noqa: E402
from emit_common import c_type  # noqa: E402
from generate import load_library  # noqa: E402
from ir_types import Enum, Function, Library, Pointer, Struct  # noqa: E402
from model import ROOT, Spec, default_role  # noqa: E402

REPO = ROOT.parent
LIBRARIES = since.LIBRARIES
# Hand-written places that may name a version.
MENTIONS = ["README.md", "docs", "examples", "benchmarks", "tests", "src/mpbind"]
MENTION_SUFFIXES = {".md", ".py", ".pyi", ".cpp", ".hpp", ".txt", ".toml"}


def dependents(lib: str, pins: dict[str, versions.Pin]) -> list[str]:
    """The library and those whose headers include its headers."""
    wheel = pins[lib].wheel
    return [other for other in LIBRARIES
            if other == lib or any(w == wheel for w, _ in Spec.load(other).extra_includes)]


def set_pin(lib: str, version: str) -> str:
    """Write the pin into versions.toml and pyproject.toml; returns the old version."""
    old = versions.load()[lib].version
    versions.VERSIONS.write_text(versions.set_version(versions.VERSIONS.read_text(), lib, version))
    pyproject = versions.rewrite_pyproject(versions.PYPROJECT.read_text(), versions.load())
    versions.PYPROJECT.write_text(pyproject)
    return old


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=REPO).returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\nthe pins are already changed: fix the cause and run the "
                         "remaining steps by hand (docs/DESIGN.md, 'Bumping a library version')")


# -- the review list ---------------------------------------------------------------------------


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def _diff(kind: str, old: Iterable[_Named], new: Iterable[_Named], describe: Callable[[Any], Any],
          presence: bool = True) -> list[str]:
    """Named IR entries added, removed (when `presence`) or changed (as `describe` sees them)."""
    a = {e.name: e for e in old}
    b = {e.name: e for e in new}
    out = [f"new {kind} {n}" for n in sorted(set(b) - set(a))] if presence else []
    out += [f"{kind} {n} is gone" for n in sorted(set(a) - set(b))] if presence else []
    out += [f"{kind} {n} changed: {describe(a[n])} -> {describe(b[n])}"
            for n in sorted(set(a) & set(b)) if describe(a[n]) != describe(b[n])]
    return out


def _signature(f: Function) -> str:
    return f"{c_type(f.returns)}({', '.join(c_type(p.type, p.name) for p in f.params)})"


def _layout(s: Struct) -> tuple[int, list[tuple[str, int]]]:
    return s.size, [(x.name, x.offset) for x in s.field_list]


def ir_changes(old: Library, new: Library) -> list[str]:
    """What a reviewer reads in the IR's diff, one line per change."""
    out = _diff("function", old.functions, new.functions, _signature)
    out += _diff("binding of", old.functions, new.functions, lambda f: f.python or f"excluded: {f.excluded}",
                 presence=False)
    out += _diff("since of", old.functions, new.functions, lambda f: f.since, presence=False)
    out += _diff("enum", old.enums.values(), new.enums.values(), lambda e: None)
    out += [line for name, e in new.enums.items() if name in old.enums
            for line in _member_changes(old.enums[name], e)]
    out += _diff("struct", old.structs.values(), new.structs.values(), _layout)
    out += _diff("constant", old.constants, new.constants, lambda c: c.value)
    return out


def _member_changes(old: Enum, new: Enum) -> list[str]:
    a = {m.c: m.value for m in old.members}
    b = {m.c: m.value for m in new.members}
    out = [f"enum {new.name}: new member {c} = {b[c]}" for c in b if c not in a]
    out += [f"enum {new.name}: member {c} is gone" for c in a if c not in b]
    out += [f"enum {new.name}: {c} changed: {a[c]} -> {b[c]}" for c in a if c in b and a[c] != b[c]]
    return out


def default_roles(old: Library, new: Library, scalar_pointers: str) -> list[str]:
    """New bound functions with pointer parameters whose role the spec does not give."""
    known = {f.name for f in old.functions}
    out = []
    for f in new.bound:
        if f.name in known:
            continue
        pointers = [f"{p.name} ({p.role})" for p in f.params
                    if isinstance(p.type, Pointer) and p.role == default_role(p.type, scalar_pointers)]
        gil = "keeps" if f.gil == "keep" else "releases"
        if pointers:
            out.append(f"{f.name}: pointer parameters with the default role: {', '.join(pointers)}; {gil} the GIL")
        else:
            out.append(f"{f.name}: {gil} the GIL")
    return out


def undeclared_exports(lib: str, release: str, ir: Library) -> list[str]:
    declared = {f.name for f in ir.functions}
    return sorted(since.load_record(lib).exports[release] - declared)


def mentions(old_version: str) -> list[str]:
    """file:line of the old version in hand-written files (a.b.c.d pins are also looked up as a.b.c)."""
    needles = {old_version, ".".join(old_version.split(".")[:3])}
    rx = re.compile(r"(?<![\d.])(" + "|".join(re.escape(n) for n in sorted(needles)) + r")(?![\d])")
    out = []
    for top in MENTIONS:
        root = REPO / top
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in MENTION_SUFFIXES)
        for path in files:
            lines = path.read_text(errors="replace").splitlines()
            if lines and "GENERATED by" in lines[0]:
                continue  # generated files carry the IR's version
            for no, line in enumerate(lines, 1):
                if rx.search(line):
                    out.append(f"{path.relative_to(REPO)}:{no}: {line.strip()}")
    return out


def review(lib: str, old_version: str, new_version: str, before: dict[str, Library],
           after: dict[str, Library]) -> None:
    def section(title: str, lines: list[str]) -> None:
        print(f"\n{title}" + ("" if lines else ": nothing"))
        for line in lines:
            print(f"  - {line}")

    print(f"\n=== {lib} {old_version} -> {new_version}: to review ===")
    for other in after:
        section(f"IR changes of {other} (git diff codegen/ir/{other}.json)", ir_changes(before[other], after[other]))
    spec = Spec.load(lib)
    section(f"new functions: give their parameters' roles and the GIL in codegen/specs/{lib}.toml "
            "if the defaults are wrong, and bind them in the Pythonic layer where it covers their kind",
            default_roles(before[lib], after[lib], spec.scalar_pointers))
    section(f"exported by {lib} {new_version} but declared by no parsed header (bind them from their header, "
            "or say in the spec why not)", undeclared_exports(lib, new_version, after[lib]))
    section(f"hand-written mentions of {old_version} (README, docs, examples, benchmarks, tests)",
            mentions(old_version))
    print("\nthen: make install && make test; the GPU suites (tests/gpu) on a machine with "
          f"{lib} {new_version}; commit the pins, codegen/symbols, the IR and the generated files together.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lib", choices=LIBRARIES)
    ap.add_argument("version", help="the release to pin, as the package index spells it (e.g. 2.33.1)")
    ap.add_argument("--no-install", action="store_true", help="the wheel is already installed here")
    ap.add_argument("--index-url", default=since.INDEX_URL, help="a PEP 691 simple index (default: PyPI)")
    a = ap.parse_args()
    if not since.is_release(a.version):
        ap.error(f"{a.version} is not a final release (numbers only)")
    pins = versions.load()
    wheel = pins[a.lib].wheel
    if a.version not in {f.version for f in since.index_files(wheel, a.index_url)}:
        raise SystemExit(f"{wheel} {a.version} is not on {a.index_url} (as a Linux x86-64 wheel)")
    libs = dependents(a.lib, pins)
    before = {other: load_library(other) for other in libs}
    old_version = set_pin(a.lib, a.version)
    print(f"{a.lib}: {old_version} -> {a.version} in codegen/versions.toml and pyproject.toml")
    if not a.no_install:
        extra = [] if a.index_url == since.INDEX_URL else ["--index-url", a.index_url]
        run([sys.executable, "-m", "pip", "install", f"{wheel}=={a.version}", *extra])
    added = since.update(a.lib, a.index_url)
    print(f"{a.lib}: symbol record: {', '.join(added) or 'nothing new'} read")
    run([sys.executable, str(ROOT / "generate.py"), *(arg for other in libs for arg in ("--lib", other))])
    after = {other: load_library(other) for other in libs}
    review(a.lib, old_version, a.version, before, after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
