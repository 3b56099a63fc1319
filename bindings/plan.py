"""How each C function looks from Python: shared by the .pyx and .pyi emitters."""

from __future__ import annotations

from dataclasses import dataclass, field

from ir_types import Function, Library, Param, Pointer, is_char_ptr, is_void
from pyvalues import py_type


@dataclass
class PyParam:
    c: Param
    name: str
    pytype: str
    default: str | None = None


@dataclass
class Plan:
    f: Function
    params: list[PyParam] = field(default_factory=list)
    returns: list[tuple[Param | None, str]] = field(default_factory=list)  # (C param or None, pytype)

    @property
    def return_type(self) -> str:
        if not self.returns:
            return "None"
        if len(self.returns) == 1:
            return self.returns[0][1]
        return "tuple[" + ", ".join(t for _, t in self.returns) + "]"


def plan(lib: Library, f: Function) -> Plan:
    p = Plan(f)
    ret = f.returns
    if f.success is None and not is_void(ret):
        p.returns.append((None, py_type(lib, ret, out=True)))
    for cp in f.params:
        role = cp.role
        t = cp.type
        if role in ("in", "inout"):
            if cp.pytype:
                pytype = cp.pytype
            elif cp.convert == "mpi_comm":
                pytype = "int | Any"
            elif isinstance(t, Pointer) and cp.struct:
                s = lib.structs[cp.struct]
                pytype = s.python + (" | bytes" if s.is_bytes else "")
            elif isinstance(t, Pointer) and (cp.address or not is_char_ptr(t)):
                pytype = "int"
            else:
                pytype = py_type(lib, t)
            if cp.nullable:
                pytype += " | None"
            p.params.append(PyParam(cp, cp.python or cp.name, pytype))
        elif role == "in_array":
            assert isinstance(t, Pointer)
            pytype = f"Sequence[{py_type(lib, t.pointee)}]"
            if cp.nullable:
                pytype += " | None"
            p.params.append(PyParam(cp, cp.python or cp.name, pytype))
        elif role == "out":
            assert isinstance(t, Pointer)
            p.returns.append((cp, py_type(lib, t.pointee, out=True)))
        elif role == "out_array":
            assert isinstance(t, Pointer)
            p.returns.append((cp, f"list[{py_type(lib, t.pointee, out=True)}]"))
        elif role == "out_str_buffer":
            p.returns.append((cp, "str"))
        elif role == "out_bytes":
            p.returns.append((cp, "bytes"))
        elif role == "out_str_array":
            p.returns.append((cp, "list[str]"))
    # Trailing nullable parameters default to None.
    for pp in reversed(p.params):
        if pp.c.nullable:
            pp.default = "None"
        else:
            break
    return p
