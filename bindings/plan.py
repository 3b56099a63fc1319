"""How each C function looks from Python: shared by the .pyx and .pyi emitters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emit_common import Index
from model import is_char_ptr

INT_BUILTINS = {
    "char", "signed char", "unsigned char", "short", "unsigned short", "int", "unsigned int",
    "long", "unsigned long", "long long", "unsigned long long", "size_t", "ptrdiff_t",
    "intptr_t", "uintptr_t", "int8_t", "int16_t", "int32_t", "int64_t",
    "uint8_t", "uint16_t", "uint32_t", "uint64_t",
}


def resolve(ix: Index, t: dict[str, Any]) -> dict[str, Any]:
    """Follow typedef aliases down to a builtin."""
    while t["kind"] == "alias":
        t = t["target"]
    return t


def is_void(t: dict[str, Any]) -> bool:
    return t["kind"] == "builtin" and t["name"] == "void"


def value_kind(ix: Index, t: dict[str, Any]) -> str:
    """Classify a C value type for conversion: int, float, bool, enum, handle, address, str, struct."""
    r = resolve(ix, t)
    k = r["kind"]
    if k == "builtin":
        if r["name"] in ("float", "double"):
            return "float"
        if r["name"] == "bool":
            return "bool"
        if r["name"] == "void":
            return "void"
        return "int"
    if k == "enum":
        return "enum"
    if k == "handle":
        return "handle"
    if k == "struct":
        return "struct"
    if is_char_ptr(r):
        return "str"
    if k == "pointer":
        return "address"
    raise ValueError(f"no conversion for {t}")


def py_value_type(ix: Index, t: dict[str, Any], *, out: bool = False) -> str:
    vk = value_kind(ix, t)
    r = resolve(ix, t)
    if vk == "int":
        return "int"
    if vk == "float":
        return "float"
    if vk == "bool":
        return "bool"
    if vk == "enum":
        return f"{ix.enums[r['name']]['python']} | int"
    if vk == "handle":
        if r["name"] in ix.handles:
            return ix.handles[r["name"]]
        return "int"
    if vk == "address":
        return "int"
    if vk == "str":
        return "str | None" if out else "str"
    if vk == "struct":
        s = ix.structs[r["name"]]
        if not out and s.get("kind") == "bytes":
            return f"{s['python']} | bytes"
        return s["python"]
    raise ValueError(vk)


@dataclass
class PyParam:
    c: dict[str, Any]
    name: str
    pytype: str
    default: str | None = None


@dataclass
class Plan:
    f: dict[str, Any]
    params: list[PyParam] = field(default_factory=list)
    returns: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (c param or {}, pytype)

    @property
    def return_type(self) -> str:
        if not self.returns:
            return "None"
        if len(self.returns) == 1:
            return self.returns[0][1]
        return "tuple[" + ", ".join(t for _, t in self.returns) + "]"


def plan(ix: Index, f: dict[str, Any]) -> Plan:
    p = Plan(f)
    ret = f["returns"]
    if f.get("success") is None and not is_void(ret):
        p.returns.append(({}, py_value_type(ix, ret, out=True)))
    for cp in f["params"]:
        role = cp["role"]
        t = cp["type"]
        if role in ("in", "inout"):
            if cp.get("pytype"):
                pytype = cp["pytype"]
            elif cp.get("convert") == "mpi_comm":
                pytype = "int | Any"
            elif t["kind"] == "pointer" and cp.get("struct"):
                s = ix.structs[cp["struct"]]
                pytype = s["python"] + (" | bytes" if s.get("kind") == "bytes" else "")
            elif t["kind"] == "pointer" and (cp.get("address") or not is_char_ptr(t)):
                pytype = "int"
            else:
                pytype = py_value_type(ix, t)
            if cp.get("nullable"):
                pytype += " | None"
            p.params.append(PyParam(cp, cp["python"], pytype))
        elif role == "in_array":
            elem = t["pointee"]
            pytype = f"Sequence[{py_value_type(ix, elem)}]"
            if cp.get("nullable"):
                pytype += " | None"
            p.params.append(PyParam(cp, cp["python"], pytype))
        elif role == "out":
            p.returns.append((cp, py_value_type(ix, t["pointee"], out=True)))
        elif role == "out_array":
            p.returns.append((cp, f"list[{py_value_type(ix, t['pointee'], out=True)}]"))
        elif role == "out_str_buffer":
            p.returns.append((cp, "str"))
        elif role == "out_bytes":
            p.returns.append((cp, "bytes"))
        elif role == "out_str_array":
            p.returns.append((cp, "list[str]"))
    # Trailing nullable parameters default to None.
    for pp in reversed(p.params):
        if pp.c.get("nullable"):
            pp.default = "None"
        else:
            break
    return p
