"""Render the C++ core's ABI headers (src/mpbind/bindings/_core_abi/*.hpp) from the typed IR (ir_types).

The core calls each library through the C entry points the generated cy<lib> module exports
in ``__pyx_capi__``, and checks every pointer, when it looks it up, against the signature
Cython recorded as the capsule's name. For the functions ``specs/core.toml`` lists, the header
of a library holds everything such a call needs and nothing typed by hand:

* the C types of their prototypes: handles as opaque pointers (the core keeps them as
  ``void*``), enums with their values, aliases, and the layouts of the structs the core reads
  or passes by value (``static_assert``-ed against the sizes and offsets clang measured);
* one table entry per function: its C prototype, the capsule signature in Cython's spelling,
  whether it returns the library's status, whether the GIL is released around it (the IR's
  GIL policy), and the value its entry point returns when it raised (its ``except?`` clause);
* the status constants (success, in-progress, the entry points' loading-error sentinel), and
  the enums and constants the core names.

The tables hold the functions the core calls, not every bound one: NVSHMEM alone binds about
1,500, whose prototypes need dozens of struct layouts that the core never reads, and every
entry is one capsule lookup when the core first uses the library.

The CUDA driver entry points of graph capture and the runtime's device copies have no IR:
``specs/core.toml`` writes their prototypes as Cython spells them (in its ``cuda_driver`` and
``cuda_runtime`` sections), and they render into ``_core_abi/cuda_driver.hpp`` and
``_core_abi/cuda_runtime.hpp`` the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emit_common import I4, LOADING_ERROR_VALUE, except_clause, loading_error
from ir_types import (
    Alias,
    Array,
    Builtin,
    CType,
    EnumType,
    Function,
    HandleType,
    Library,
    Pointer,
    Struct,
    StructType,
)
from model import ROOT, tomllib

SPEC = ROOT / "specs" / "core.toml"
SPEC_NAME = "codegen/specs/core.toml"
DRIVER = "cuda_driver"
# The spec's sections of CUDA entry points taken from cuda-bindings' capsules, with no IR of ours.
CUDA = (DRIVER, "cuda_runtime")


@dataclass(frozen=True)
class Entry:
    """One function of a table."""

    name: str
    returns: CType
    params: tuple[CType, ...]
    status: bool  # returns the library's status
    release_gil: bool
    raised: str  # C++: how its entry point says it raised (a capi::Except)


@dataclass(frozen=True)
class Enum:
    """An enum as the core's headers declare it (the driver's come from the spec, not an IR)."""

    name: str
    underlying: str
    members: tuple[tuple[str, int], ...]


@dataclass
class Abi:
    """What one header declares."""

    name: str  # file and namespace: nccl, cuda_driver
    pretty: str
    module: str  # exports the entry points
    typed_errors: bool  # mpbind.bindings.<name>._raise_status raises its statuses
    status_type: str
    success: str
    in_progress: str | None
    loading_error: bool  # the entry points' sentinel is ours (LOADING_ERROR_VALUE)
    functions: list[Entry]
    enums: dict[str, Enum] = field(default_factory=dict)
    constants: list[tuple[str, int | float]] = field(default_factory=list)
    handles: list[str] = field(default_factory=list)
    aliases: dict[str, CType] = field(default_factory=dict)
    structs: dict[str, Struct] = field(default_factory=dict)
    layouts: list[str] = field(default_factory=list)  # structs defined with fields, dependencies first


# -- a library, from its typed IR ---------------------------------------------------------------

def _entry(lib: Library, f: Function) -> Entry:
    raised = {
        f"except?{loading_error(lib)}": "capi::except_value(loading_error)",
        "except?NULL": "capi::except_value(0)",
        "except?-1": "capi::except_value(-1)",
        "except?-1.0": "capi::except_value(-1)",
        "except *": "capi::except_any()",
    }[except_clause(lib, f.returns)]
    return Entry(f.name, f.returns, tuple(p.type for p in f.params), f.returns_status, f.releases_gil, raised)


def library_entries(lib: Library, names: list[str] | None = None) -> list[Entry]:
    """Table entries of the C entry points `names` (default: every one) of a library."""
    bound = {f.name: f for f in lib.symbols}
    if names is None:
        names = list(bound)
    missing = [n for n in names if n not in bound]
    if missing:
        raise KeyError(f"{SPEC_NAME}: {lib.name} binds no C entry point {', '.join(missing)}")
    return [_entry(lib, bound[n]) for n in names]


def _enum(lib: Library, name: str) -> Enum:
    e = lib.enums[name]
    return Enum(name, e.underlying, tuple((m.c, m.value) for m in e.members))


def _library_abi(lib: Library, uses: dict[str, Any]) -> Abi:
    abi = Abi(name=lib.name, pretty=f"{lib.pretty} {lib.version}", module=f"mpbind.bindings.cy{lib.name}",
              typed_errors=True, status_type=lib.status.type, success=lib.status.success[0],
              in_progress=lib.status.in_progress, loading_error=True,
              functions=library_entries(lib, uses["functions"]))
    _complete(abi, uses, lambda n: _enum(lib, n), lib.structs.__getitem__)
    abi.constants = [(c, lib.constant(c).value) for c in uses.get("constants", [])]
    return abi


# -- the CUDA driver and runtime, from the spec --------------------------------------------

def _parse_cython_type(text: str, kinds: dict[str, type[HandleType] | type[EnumType]]) -> CType:
    """A parameter or return type as Cython spells it in a capsule ("CUgraph *")."""
    text = text.strip()
    base = text.rstrip("* ")
    const = base.endswith(" const")
    base = base.removesuffix(" const")
    c_name = {v: k for k, v in CYTHON_SPELLING.items()}.get(base, base)
    t: CType = kinds.get(c_name, Builtin)(c_name, const)
    for _ in range(text[len(base):].count("*")):
        t = Pointer(t)
    return t


def _cuda_abi(section: str, spec: dict[str, Any]) -> Abi:
    kinds: dict[str, type[HandleType] | type[EnumType]] = {h: HandleType for h in spec["handles"]}
    kinds |= {e: EnumType for e in spec["enums"]}
    entries = []
    for name, signature in spec["functions"].items():
        ret, params = signature.split(" (", 1)
        ps = params.removesuffix(")")
        entry = Entry(name, _parse_cython_type(ret, kinds),
                      tuple(_parse_cython_type(p, kinds) for p in ps.split(",")) if ps != "void" else (),
                      True, True, f"capi::except_value({spec['error']})")
        if capsule_signature(entry) != signature:
            raise ValueError(f"{SPEC_NAME}: cannot read {name}'s signature {signature!r} back")
        entries.append(entry)
    abi = Abi(name=section, pretty=spec["pretty"], module=spec["module"], typed_errors=False,
              status_type=spec["status"], success=spec["success"], in_progress=None, loading_error=False,
              functions=entries)
    enums = {n: Enum(n, "int", tuple(members.items())) for n, members in spec["enums"].items()}
    _complete(abi, {"enums": list(enums)}, enums.__getitem__, _no_struct)
    return abi


def _no_struct(name: str) -> Struct:
    raise ValueError(f"{SPEC_NAME}: the CUDA prototypes may not use a struct ({name})")


# -- types the prototypes need ---------------------------------------------------------------

def _complete(abi: Abi, uses: dict[str, Any], enum_of: Callable[[str], Enum],
              struct_of: Callable[[str], Struct]) -> None:
    """Add the types the prototypes and `uses` need to `abi`, dependencies first."""

    def need(t: CType, by_value: bool) -> None:
        if isinstance(t, Pointer):
            need(t.pointee, False)
        elif isinstance(t, Array):
            need(t.element, by_value)
        elif isinstance(t, Alias):
            need(t.target, by_value)
            abi.aliases.setdefault(t.name, t.target)
        elif isinstance(t, HandleType) and t.name not in abi.handles:
            abi.handles.append(t.name)
        elif isinstance(t, EnumType) and t.name not in abi.enums:
            abi.enums[t.name] = enum_of(t.name)
        elif isinstance(t, StructType):
            abi.structs.setdefault(t.name, struct_of(t.name))
            if by_value:
                layout(t.name)

    def layout(name: str) -> None:
        if name in abi.layouts:
            return
        s = abi.structs.setdefault(name, struct_of(name))
        for f in s.field_list:
            need(f.type, True)
        abi.layouts.append(name)

    for f in abi.functions:
        need(f.returns, True)
        for p in f.params:
            need(p, True)
    for name in uses.get("structs", []):
        layout(name)
    for name in uses.get("enums", []):
        need(EnumType(name), True)


# -- spelling ------------------------------------------------------------------------------

# Cython's names of the C types it spells otherwise (PyrexTypes: long long is PY_LONG_LONG).
CYTHON_SPELLING = {"long long": "PY_LONG_LONG", "unsigned long long": "unsigned PY_LONG_LONG"}


def cython_type(t: CType, entity: str = "") -> str:
    """`t` declaring `entity` as Cython writes it in a capsule: base type first, then `const`."""
    if isinstance(t, Pointer):
        return cython_type(t.pointee, "*" + entity)  # a const pointer: Cython's pxd drops that const
    if isinstance(t, Array):
        raise ValueError("an array parameter has no capsule spelling")
    if t.const:
        entity = "const " + entity
    base = CYTHON_SPELLING.get(t.name, t.name)
    return f"{base} {entity}" if entity else base


def capsule_signature(f: Entry) -> str:
    """The name of f's capsule in __pyx_capi__: "ncclResult_t (ncclComm_t const , int *)"."""
    params = ", ".join(cython_type(p) for p in f.params) or "void"
    return cython_type(f.returns, f"({params})")


def cpp_type(t: CType, entity: str = "") -> str:
    """A C++ declaration of `entity` with type t."""
    if isinstance(t, Pointer):
        return cpp_type(t.pointee, ("* const " if t.const else "*") + entity)
    if isinstance(t, Array):
        return cpp_type(t.element, f"{entity}[{t.length}]")
    base = ("const " if t.const else "") + t.name
    return f"{base} {entity}" if entity else base


def _prototype(f: Entry) -> str:
    return cpp_type(f.returns, f"({', '.join(cpp_type(p) for p in f.params)})")


# -- rendering -----------------------------------------------------------------------------

def _types(abi: Abi) -> list[str]:
    lines = ["// --- types, as the C headers declare them (handles are opaque pointers) ---", ""]
    lines += [f"struct {name};" for name in sorted(abi.structs)]
    lines += [f"using {name} = void*;" for name in sorted(abi.handles)]
    for e in abi.enums.values():
        lines.append(f"enum {e.name} : {e.underlying} {{")
        lines += [f"{I4}{cn} = {v}," for cn, v in e.members]
        lines.append("};")
    for name, target in abi.aliases.items():
        lines.append(f"using {name} = {cpp_type(target)};")
    for name in abi.layouts:
        lines += ["", *_layout(abi.structs[name])]
    return lines


def _layout(s: Struct) -> list[str]:
    if s.fields is None:
        lines = [f"struct alignas({s.align}) {s.name} {{", f"{I4}unsigned char opaque[{s.size}];", "};"]
    else:
        lines = [f"struct {s.name} {{", *(f"{I4}{cpp_type(f.type, f.name)};" for f in s.fields), "};"]
    what = "as clang measured it in the C header"
    lines.append(f'static_assert(sizeof({s.name}) == {s.size} && alignof({s.name}) == {s.align}, '
                 f'"{s.name}: size and alignment {what}");')
    for f in s.field_list:
        lines.append(f'static_assert(offsetof({s.name}, {f.name}) == {f.offset}, "{s.name}.{f.name}: offset {what}");')
    return lines


def _statuses(abi: Abi) -> list[str]:
    st = abi.status_type
    lines = ["", "// --- statuses ---", "", f"inline constexpr {st} success = {abi.success};"]
    if abi.in_progress:
        lines.append(f"inline constexpr {st} in_progress = {abi.in_progress};")
    if abi.loading_error:
        lines += [f"// What an entry point of {abi.module} returns, with a Python exception set, when the",
                  "// library or the symbol is missing.",
                  f"inline constexpr {st} loading_error = static_cast<{st}>({LOADING_ERROR_VALUE});"]
    typed = "true" if abi.typed_errors else "false"
    lines.append(f'inline constexpr capi::Library library{{"{abi.name}", "{abi.module}", "{st}", success, {typed}}};')
    if abi.constants:
        lines += ["", "// --- constants ---", ""]
        for name, value in abi.constants:
            ctype = "double" if isinstance(value, float) else "int" if -2**31 <= value < 2**31 else "long long"
            lines.append(f"inline constexpr {ctype} {name} = {value};")
    return lines


def _table(abi: Abi) -> list[str]:
    lines = ["", "// --- functions ---", "", "struct Api {"]
    for f in abi.functions:
        kind = "capi::Status" if f.status else "capi::Value"
        gil = "capi::ReleaseGil" if f.release_gil else "capi::KeepGil"
        lines += [f"{I4}capi::Fn<{_prototype(f)}, {kind}, {gil}> {f.name}{{",
                  f'{I4}{I4}&library, "{f.name}", "{capsule_signature(f)}", {f.raised}}};']
    lines += ["", f"{I4}template <class Visit>", f"{I4}void each(Visit&& visit) {{"]
    lines += [f"{I4}{I4}visit({f.name});" for f in abi.functions]
    lines += [f"{I4}}}", "};", "",
              "// The table, loaded on first use (needs the GIL).",
              "inline const Api& api() { return capi::table<Api>(); }"]
    return lines


def header(abi: Abi) -> str:
    lines = [
        f"// The C ABI of {abi.pretty} as mpbind._core calls it: the functions {SPEC_NAME}",
        f"// lists for {abi.name}, from the C entry points {abi.module} exports.",
        "#pragma once",
        "",
        "#include <cstddef>",
        "#include <cstdint>",
        "",
        '#include "mpbind/_core/capi.hpp"',
        "",
        f"namespace mpbind::abi::{abi.name} {{",
        "",
        *_types(abi),
        *_statuses(abi),
        *_table(abi),
        "",
        f"}}  // namespace mpbind::abi::{abi.name}",
    ]
    return "\n".join(lines) + "\n"


def tables_header(names: list[str]) -> str:
    lines = [
        "// Every function table of mpbind._core, for visiting them all (mpbind._core._abi).",
        "#pragma once",
        "",
        *(f'#include "{n}.hpp"' for n in names),
        "",
        "namespace mpbind::abi {",
        "",
        "// visit(Api{}) with a fresh, unloaded table of each library.",
        "template <class Visit>",
        "void each_table(Visit&& visit) {",
        *(f"{I4}visit({n}::Api{{}});" for n in names),
        "}",
        "",
        "}  // namespace mpbind::abi",
    ]
    return "\n".join(lines) + "\n"


def spec() -> dict[str, Any]:
    return tomllib.loads(SPEC.read_text())


def abis(libs: dict[str, Library]) -> list[Abi]:
    uses = spec()
    out = [_library_abi(lib, uses[name]) for name, lib in libs.items()]
    return out + [_cuda_abi(name, uses[name]) for name in CUDA]


def headers(libs: dict[str, Library]) -> dict[str, tuple[str, str]]:
    """File name under src/mpbind/bindings/_core_abi -> (body, what it is generated from)."""
    out: dict[str, tuple[str, str]] = {}
    all_abis = abis(libs)
    for abi in all_abis:
        origin = (f"{SPEC_NAME} ({abi.pretty})" if abi.name in CUDA else
                  f"codegen/ir/{abi.name}.json and {SPEC_NAME} ({abi.pretty})")
        out[f"{abi.name}.hpp"] = (header(abi), origin)
    out["tables.hpp"] = (tables_header(sorted(a.name for a in all_abis)), SPEC_NAME)
    return out
