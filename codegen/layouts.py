"""What the bindings assume of the other releases they serve: struct layouts, enum values, prototypes.

The bindings are generated from the pinned headers (codegen/versions.toml `wheel`, `version`), and
the wheel of another family may hold another release (the cu12 extra's cuFFTMp is 11.4, the bindings'
12.1). A function that release lacks raises FunctionNotFoundError (its `since`, from the symbol
record); what it has must mean the same bytes. `codegen/layouts/<lib>.json` records, for each such
release, what of its headers the bindings rely on: every struct's size, alignment and field offsets
(with their C types, typedefs resolved), every enum's values and every bound function's prototype.
It is written from that release's headers by the version tooling:

    python codegen/generate.py --lib cufftmp --headers DIR --release 11.4.0.6 --layouts

`problems` (run by ``codegen/generate.py --check``) compares each record with the pinned IR: a
struct laid out differently, an enum member with another value or a function with another prototype
would make the bindings read, write or call the wrong thing on that release, so the check fails until
the bindings select the layout of the loaded release or refuse it. A release of a family in
versions.toml other than the pinned one needs a record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ir_types import Alias, Array, CType, EnumType, HandleType, Library, Pointer, StructType

ROOT = Path(__file__).resolve().parent
LAYOUTS = ROOT / "layouts"
FORMAT = 1


def path(lib: str) -> Path:
    return LAYOUTS / f"{lib}.json"


def abi(t: CType) -> str:
    """A C type as the ABI sees it: typedefs resolved, const dropped."""
    if isinstance(t, Alias):
        return abi(t.target)
    if isinstance(t, Pointer):
        return abi(t.pointee) + "*"
    if isinstance(t, Array):
        return f"{abi(t.element)}[{t.length}]"
    if isinstance(t, HandleType):
        return "void*"
    if isinstance(t, EnumType):
        return f"enum {t.name}"
    if isinstance(t, StructType):
        return f"struct {t.name}"
    return t.name


def of(lib: Library) -> dict[str, Any]:
    """The record of one release, from its IR."""
    return {
        "headers_digest": lib.headers_digest,
        "structs": {s.name: {"size": s.size, "align": s.align,
                             "fields": {f.name: f"{abi(f.type)} @{f.offset}" for f in s.field_list},
                             **({"initializer": s.initializer.image} if s.initializer else {})}
                    for s in lib.structs.values()},
        "enums": {e.name: {"underlying": e.underlying, "values": dict(e.values)} for e in lib.enums.values()},
        "functions": {f.name: f"{abi(f.returns)} ({', '.join(abi(p.type) for p in f.params)})"
                      for f in lib.functions if not f.excluded},
    }


def load(lib: str) -> dict[str, dict[str, Any]]:
    """release -> its record (empty when the library has none)."""
    p = path(lib)
    return json.loads(p.read_text())["releases"] if p.is_file() else {}


def write(lib: str, release: str, record: dict[str, Any], by: str) -> Path:
    releases = {**load(lib), release: record}
    doc = {"format": FORMAT, "library": lib, "written_by": by,
           "releases": dict(sorted(releases.items()))}
    p = path(lib)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=1) + "\n")
    return p


def compare(pinned: Library, release: str, record: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, notes) of running the bindings of `pinned` on `release`: problems are what they would
    get wrong; notes what that release lacks or has besides (which the bindings handle)."""
    mine = of(pinned)
    problems: list[str] = []
    notes: list[str] = []
    where = f"{pinned.library} {release}"
    for name, s in mine["structs"].items():
        other = record["structs"].get(name)
        if other is None:
            notes.append(f"{where} has no struct {name}")
        elif other != s:
            problems.append(f"{where}: struct {name} is laid out differently ({_struct_diff(s, other)})")
    for name, e in mine["enums"].items():
        other = record["enums"].get(name)
        if other is None:
            notes.append(f"{where} has no enum {name}")
            continue
        if other["underlying"] != e["underlying"]:
            problems.append(f"{where}: enum {name} is {other['underlying']}, not {e['underlying']}")
        changed = [f"{m} = {other['values'][m]}, not {v}" for m, v in e["values"].items()
                   if m in other["values"] and other["values"][m] != v]
        if changed:
            problems.append(f"{where}: enum {name} has other values: {'; '.join(changed)}")
        lacks = [m for m in e["values"] if m not in other["values"]]
        extra = [f"{m} = {v}" for m, v in other["values"].items() if m not in e["values"]]
        if lacks:
            notes.append(f"{where}: enum {name} lacks {', '.join(lacks)}")
        if extra:
            notes.append(f"{where}: enum {name} also has {', '.join(extra)} (unnamed in the bindings)")
    for name, proto in mine["functions"].items():
        other = record["functions"].get(name)
        if other is not None and other != proto:
            problems.append(f"{where}: {name} is {other}, the bindings call it as {proto}")
    return problems, notes


def _struct_diff(mine: dict[str, Any], other: dict[str, Any]) -> str:
    parts = [f"{k} {other.get(k)} vs {mine.get(k)}" for k in ("size", "align", "initializer")
             if other.get(k) != mine.get(k)]
    fields, theirs = mine["fields"], other["fields"]
    parts += [f"field {n}: {theirs.get(n, 'absent')} vs {f}" for n, f in fields.items() if theirs.get(n) != f]
    parts += [f"field {n} only there" for n in theirs if n not in fields]
    return "; ".join(parts)


def problems(pinned: dict[str, Library], releases: dict[str, list[str]]) -> list[str]:
    """What the bindings would get wrong on the recorded releases, and the `releases` (library -> the
    other families' releases, from versions.toml) that have no record."""
    out = []
    for name, lib in pinned.items():
        records = load(name)
        for release in releases.get(name, []):
            if release != lib.version and release not in records:
                out.append(f"codegen/layouts/{name}.json: no record of {name} {release}, which a wheel family "
                           f"installs (python codegen/generate.py --lib {name} --headers DIR --release "
                           f"{release} --layouts)")
        for release, record in records.items():
            out += compare(lib, release, record)[0]
    return out
