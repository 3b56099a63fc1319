"""Render src/mpbind/bindings/<lib>.pyi, beside the <lib>.pyx it types, from the IR."""

from __future__ import annotations

import re
from collections.abc import Iterable

import emit_docs
from emit_common import I4, attribute_table, const_name
from emit_structs import struct_doc
from ir_types import Array, CType, HandleType, Library, Struct
from plan import plan
from pyvalues import class_name, py_type, value_kind
from roles import STUB_TYPES


def _field_type(lib: Library, t: CType) -> tuple[str, str]:
    """(getter type, setter type) of a struct field."""
    if isinstance(t, Array):
        g, _ = _field_type(lib, t.element)
        return f"tuple[{g}, ...]", f"Sequence[{g}]"
    vk = value_kind(t)
    if vk == "str":
        return "str | None", "str | bytes | None"
    if vk == "enum":
        cls = class_name(lib, t)
        return f"{cls} | int", f"{cls} | int"
    if vk == "handle":
        return "int", "int"
    return py_type(lib, t), py_type(lib, t)


def _struct(lib: Library, s: Struct) -> list[str]:
    cls = s.python
    out = [f"class {cls}:", *emit_docs.render(struct_doc(lib, s))]
    internal = s.internal_fields()
    if s.is_bytes:
        out += [
            f"{I4}def __init__(self, data: bytes | bytearray | memoryview | None = None) -> None: ...",
            f"{I4}def __bytes__(self) -> bytes: ...",
            f"{I4}def __len__(self) -> int: ...",
            f"{I4}def __buffer__(self, flags: int, /) -> memoryview: ...",
            f"{I4}def __eq__(self, other: object, /) -> bool: ...",
            f"{I4}def __hash__(self) -> int: ...",
        ]
    elif s.opaque is not None:
        out += [f"{I4}def __init__(self) -> None: ...", f"{I4}def __bytes__(self) -> bytes: ..."]
    else:
        kw = []
        for f in s.field_list:
            if f.name in internal:
                continue
            _, st = _field_type(lib, f.type)
            kw.append(f"{f.name}: {st} = ...")
        args = ", ".join(["self", "*"] + kw) if kw else "self"
        out.append(f"{I4}def __init__({args}) -> None: ...")
        for f in s.field_list:
            g, st = _field_type(lib, f.type)
            out.append(f"{I4}@property")
            out.append(f"{I4}def {f.name}(self) -> {g}: ...")
            if f.name not in internal:
                out.append(f"{I4}@{f.name}.setter")
                out.append(f"{I4}def {f.name}(self, value: {st}) -> None: ...")
    out += [
        f"{I4}@staticmethod",
        f"{I4}def from_ptr(address: int) -> {cls}: ...",
        f"{I4}@property",
        f"{I4}def ptr(self) -> int: ...",
        f"{I4}@property",
        f"{I4}def nbytes(self) -> int: ...",
        "",
    ]
    return out


def _union(types: Iterable[str]) -> str:
    """'int | float' from the members' types, in first-seen order."""
    seen: list[str] = []
    for t in types:
        for part in t.split(" | "):
            if part not in seen:
                seen.append(part)
    return " | ".join(seen)


def stub(lib: Library) -> str:
    lines: list[str] = []
    for c in lib.constants:
        name = const_name(lib, c.name)
        lines.append(f"{name}: {type(c.value).__name__}")
    lines.append("")
    for _, py in sorted(lib.handles.items()):
        lines.append(f'{py} = NewType("{py}", int)')
    lines.append("")
    # The IntEnums are made on first use (a module __getattr__, listed by __dir__); to a type
    # checker they are plain classes.
    lines += ["def __dir__() -> list[str]: ...", ""]
    for e in lib.enums.values():
        lines.append(f"class {e.python}(IntEnum):")
        lines += emit_docs.render(emit_docs.enum_doc(lib, e))
        for m in e.members:
            lines.append(f"{I4}{m.python} = {m.value}")
        lines.append("")
    structs, _, _ = lib.reachable_types()
    for name in structs:
        lines += _struct(lib, lib.structs[name])
    for f in lib.bound:
        if f.inline_body is not None:
            lines.append(f"def {f.python}{f.inline_body.signature}:")
            lines += emit_docs.render(emit_docs.inline_doc(lib, f))
            continue
        pl = plan(lib, f)
        args = []
        for pp in pl.params:
            a = f"{pp.name}: {pp.pytype}"
            if pp.default is not None:
                a += f" = {pp.default}"
            args.append(a)
        lines.append(f"def {f.python}({', '.join(args)}) -> {pl.return_type}:")
        lines += emit_docs.render(emit_docs.function_doc(lib, f, pl.return_type if pl.returns else None))
    if lib.families:
        lines.append("")
        lines.append("FAMILY_TYPES: dict[str, str]")
    for fam in lib.families:
        plans = [plan(lib, lib.function(c)) for c in fam.members.values()]
        pl = plans[0]
        args = ["dtype: str | Any"]
        for i, pp in enumerate(pl.params):
            a = f"{pp.name}: {_union(q.params[i].pytype for q in plans)}"
            if pp.default is not None:
                a += f" = {pp.default}"
            args.append(a)
        lines.append(f"def {fam.python}({', '.join(args)}) -> {_union(q.return_type for q in plans)}:")
        lines += emit_docs.render(emit_docs.family_doc(lib, fam))
    for enum_name, ta in lib.typed_attributes.items():
        cls = lib.enums[enum_name].python
        handle = lib.function(ta.set).params[0].type
        obj = lib.handles.get(handle.name, "int") if isinstance(handle, HandleType) else "int"
        kinds = sorted({pc or ("float" if fmt in "fd" else "int")
                        for _, fmt, pc in attribute_table(lib, enum_name).values()})
        value = _union(k if k in ("int", "float") else f"{k} | int" for k in kinds)
        lines.append(f"{ta.python.upper()}_ATTRIBUTE_TYPES: dict[{cls}, tuple[str, str, type | None]]")
        lines.append(f"def {ta.python}_set(obj: {obj}, attr: {cls} | int, value: {value}) -> None:")
        lines += emit_docs.render(emit_docs.attribute_doc(lib, enum_name, ta, setter=True))
        lines.append(f"def {ta.python}_get(obj: {obj}, attr: {cls} | int) -> {value}:")
        lines += emit_docs.render(emit_docs.attribute_doc(lib, enum_name, ta, setter=False))
    body = "\n".join(lines) + "\n"
    # Import what the body uses.
    abc = [n for n in ("Callable", "Sequence") if re.search(rf"\b{n}\[", body)]
    typing_names = [n for n in ("Any", "NewType") if re.search(rf"\b{n}\b", body)]
    head = [f'"""Flat bindings for {lib.pretty} {lib.version}."""', ""]
    if abc:
        head.append(f"from collections.abc import {', '.join(abc)}")
    head.append("from enum import IntEnum")
    if typing_names:
        head.append(f"from typing import {', '.join(typing_names)}")
    own = [n for n in STUB_TYPES if re.search(rf"\b{n}\b", body)]
    if own:
        head += ["", f"from mpbind.typing import {', '.join(own)}"]
    head.append("")
    return "\n".join(head) + "\n" + body
