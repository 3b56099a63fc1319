"""How a C value looks from Python: its kind, its type in the stubs, its conversion to Python.

Shared by the parameter roles (roles.py), the struct classes (emit_python) and the stubs.
"""

from __future__ import annotations

from ir_types import Builtin, CType, Enum, EnumType, HandleType, Library, Pointer, StructType, is_char_ptr, resolve


def value_kind(t: CType) -> str:
    """Classify a C value type for conversion: int, float, bool, void, enum, handle, address, str, struct."""
    r = resolve(t)
    if isinstance(r, Builtin):
        if r.name in ("float", "double"):
            return "float"
        if r.name in ("bool", "void"):
            return r.name
        return "int"
    if isinstance(r, EnumType):
        return "enum"
    if isinstance(r, HandleType):
        return "handle"
    if isinstance(r, StructType):
        return "struct"
    if is_char_ptr(r):
        return "str"
    if isinstance(r, Pointer):
        return "address"
    raise ValueError(f"no conversion for {t}")


def class_name(lib: Library, t: CType) -> str:
    """The Python class of an enum or struct type (through aliases)."""
    r = resolve(t)
    if isinstance(r, EnumType):
        return enum_of(lib, r).python
    if isinstance(r, StructType):
        return lib.structs[r.name].python
    raise ValueError(f"{t} has no Python class")


def enum_class(lib: Library, t: CType) -> str:
    """The expression of an enum type's IntEnum in the generated module (made on first use)."""
    return f'_enums.get("{enum_of(lib, t).python}")'


def enum_of(lib: Library, t: CType) -> Enum:
    """The enum declaration of an enum type (through aliases)."""
    r = resolve(t)
    if not isinstance(r, EnumType):
        raise ValueError(f"{t} is not an enum")
    return lib.enums[r.name]


def enum_ctype(e: Enum) -> str:
    """The C integer type that holds every value of e."""
    return "long long" if any(m.value < -(2**31) or m.value >= 2**31 for m in e.members) else "int"


def py_type(lib: Library, t: CType, *, out: bool = False) -> str:
    """The stub type of a value of C type t passed in (or, with out, returned)."""
    vk = value_kind(t)
    r = resolve(t)
    if vk in ("int", "float", "bool"):
        return vk
    if vk == "enum":
        return f"{class_name(lib, t)} | int"
    if vk == "handle":
        assert isinstance(r, HandleType)
        return lib.handles.get(r.name, "int")
    if vk == "address":
        return "int"
    if vk == "str":
        return "str | None" if out else "str"
    if vk == "struct":
        assert isinstance(r, StructType)
        s = lib.structs[r.name]
        return f"{s.python} | bytes" if not out and s.is_bytes else s.python
    raise ValueError(vk)


def to_python(lib: Library, t: CType, expr: str) -> str:
    """Python value of the C value expr of type t."""
    vk = value_kind(t)
    if vk in ("int", "float"):
        return expr
    if vk == "bool":
        return f"bool({expr})"
    if vk == "enum":
        return f"_enum_or_int({enum_class(lib, t)}, {expr})"
    if vk in ("handle", "address"):
        return f"<intptr_t>{expr}"
    if vk == "str":
        return f"_str_or_none({expr})"
    if vk == "struct":
        return f"{class_name(lib, t)}._from_data({expr})"
    raise ValueError(vk)
