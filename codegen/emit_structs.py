"""Render the struct classes of <lib>.pyx: one cdef class per C struct the API uses.

A class holds the struct by value (`_data`), with attribute access to its fields, `ptr` (its
address), `from_ptr` (a copy of one at an address) and, for a bytes-like struct (a unique id),
the bytes and buffer protocols. `_as_<Class>` coerces an argument to the class.
"""

from __future__ import annotations

import emit_docs
from emit_common import I4, cy_type
from ir_types import Array, Field, Library, Struct
from pyvalues import class_name, enum_class, enum_ctype, enum_of, value_kind
from roles import address_guard, int_guard

I8 = I4 * 2


def struct_class(lib: Library, s: Struct) -> list[str]:
    """cdef class <Class> for struct s, then its argument coercion _as_<Class>."""
    lines = [f"cdef class {s.python}:", *emit_docs.render(struct_doc(lib, s)), "", f"{I4}cdef {s.name} _data",
             f"{I4}cdef dict _refs", ""]
    lines += _construction(s)
    if s.is_bytes:
        lines += _bytes_methods(s.python, s.name)
    elif s.opaque is not None:
        lines += _opaque_methods(s.python, s.name)
    else:
        lines += _field_methods(lib, s)
    return lines + _common_methods(s.python, s.name) + _coercion(s)


def struct_doc(lib: Library, s: Struct) -> list[str]:
    """The class's docstring (its stub's too)."""
    return emit_docs.struct_doc(lib, s, _summary(s))


def _summary(s: Struct) -> str:
    if s.is_bytes:
        return f"{s.name}: {s.size} opaque bytes; bytes-like, comparable, hashable and picklable."
    if s.opaque is not None:
        return f"{s.name}: opaque ({s.opaque}). `ptr` is its address, `bytes(obj)` its content."
    dflt = f" Defaults come from {s.initializer.macro}." if s.initializer else ""
    return f"{s.name} with attribute access to its fields.{dflt}"


def _construction(s: Struct) -> list[str]:
    lines = [f"{I4}def __cinit__(self):", f"{I8}self._refs = {{}}"]
    if s.initializer:
        # The bytes of the *_INITIALIZER value, as the compiler laid it out.
        image = bytes.fromhex(s.initializer.image)
        return lines + [f"{I8}memcpy(&self._data, <const char*>{image!r}, sizeof({s.name}))", ""]
    return lines + [f"{I8}memset(&self._data, 0, sizeof({s.name}))", ""]


def _bytes_methods(cls: str, name: str) -> list[str]:
    return [
        f"{I4}def __init__(self, data=None):",
        f"{I8}if data is not None:",
        f"{I8}{I4}b = bytes(memoryview(data))  # bytes-like only: bytes(n) would make n zeros",
        f"{I8}{I4}if len(b) != sizeof({name}):",
        f'{I8}{I4}{I4}raise _UsageError("{cls} takes exactly %d bytes, got %d" % (sizeof({name}), len(b)))',
        f"{I8}{I4}memcpy(&self._data, <const char*>b, sizeof({name}))",
        "",
        f"{I4}def __bytes__(self):",
        f"{I8}return (<const char*>&self._data)[:sizeof({name})]",
        "",
        f"{I4}def __len__(self):",
        f"{I8}return sizeof({name})",
        "",
        f"{I4}def __getbuffer__(self, Py_buffer* buffer, int flags):",
        f"{I8}PyBuffer_FillInfo(buffer, self, &self._data, sizeof({name}), 1, flags)",
        "",
        f"{I4}def __releasebuffer__(self, Py_buffer* buffer):",
        f"{I8}pass",
        "",
        f"{I4}def __eq__(self, other):",
        f"{I8}if not isinstance(other, {cls}):",
        f"{I8}{I4}return NotImplemented",
        f"{I8}return bytes(self) == bytes(other)",
        "",
        f"{I4}def __hash__(self):",
        f"{I8}return hash(bytes(self))",
        "",
        f"{I4}def __reduce__(self):",
        f"{I8}return ({cls}, (bytes(self),))",
        "",
        f"{I4}def __repr__(self):",
        f'{I8}return "{cls}(%s...)" % bytes(self)[:8].hex()',
        "",
    ]


def _opaque_methods(cls: str, name: str) -> list[str]:
    return [
        f"{I4}def __bytes__(self):",
        f"{I8}return (<const char*>&self._data)[:sizeof({name})]",
        "",
        f"{I4}def __repr__(self):",
        f'{I8}return "<{cls} at 0x%x>" % <intptr_t>&self._data',
        "",
    ]


def _field_methods(lib: Library, s: Struct) -> list[str]:
    """__init__(**fields), __repr__, and a property (with a setter unless internal) per field."""
    cls = s.python
    internal = s.internal_fields()
    names = [f.name for f in s.field_list if f.name not in internal]
    lines = [
        f"{I4}def __init__(self, **fields):",
        f"{I8}for key, value in fields.items():",
        f"{I8}{I4}if key not in {cls}._FIELDS:",
        f'{I8}{I4}{I4}raise TypeError("{cls} has no settable field %r (fields: %s)"'
        f' % (key, ", ".join({cls}._FIELDS)))',
        f"{I8}{I4}setattr(self, key, value)",
        "",
        f"{I4}_FIELDS = {tuple(names)!r}",
        "",
        f"{I4}def __repr__(self):",
        f'{I8}return "{cls}(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in {cls}._FIELDS)',
        "",
    ]
    for f in s.field_list:
        lines += [f"{I4}@property", f"{I4}def {f.name}(self):", *(I8 + x for x in _field_get(lib, f)), ""]
        if f.name not in internal:
            lines += [f"{I4}@{f.name}.setter", f"{I4}def {f.name}(self, value):",
                      *(I8 + x for x in _field_set(lib, f)), ""]
    return lines


def _common_methods(cls: str, name: str) -> list[str]:
    return [
        f"{I4}@property",
        f"{I4}def ptr(self):",
        f'{I8}"""Address of the C struct (valid while this object lives)."""',
        f"{I8}return <intptr_t>&self._data",
        "",
        f"{I4}@property",
        f"{I4}def nbytes(self):",
        f"{I8}return sizeof({name})",
        "",
        f"{I4}@staticmethod",
        f"{I4}def from_ptr(address):",
        f'{I8}"""A copy of the {name} at `address` (for example one a library call returned)."""',
        f'{I8}cdef intptr_t _h_address = _as_address(address, "{cls}.from_ptr: address", 1)',
        f"{I8}return {cls}._from_data((<{name}*>_h_address)[0])",
        "",
        f"{I4}@staticmethod",
        f"{I4}cdef {cls} _from_data({name} data):",
        f"{I8}cdef {cls} obj = {cls}.__new__({cls})",
        f"{I8}obj._data = data",
        f"{I8}return obj",
        "",
        "",
    ]


def _coercion(s: Struct) -> list[str]:
    cls = s.python
    lines = [f"cdef object _as_{cls}(object value, str what):", f"{I4}if isinstance(value, {cls}):",
             f"{I8}return value"]
    if s.is_bytes:
        lines += [f"{I4}if isinstance(value, (bytes, bytearray, memoryview)):", f"{I8}return {cls}(value)"]
    return lines + [f'{I4}raise TypeError("%s must be {cls}, not %s" % (what, type(value).__name__))', "", ""]


def _field_get(lib: Library, f: Field) -> list[str]:
    t = f.type
    n = f.name
    if isinstance(t, Array):
        el = t.element
        vk = value_kind(el)
        if vk == "struct":
            return [f"return tuple({class_name(lib, el)}._from_data(self._data.{n}[i]) for i in range({t.length}))"]
        if vk == "bool":
            return [f"return tuple(bool(self._data.{n}[i]) for i in range({t.length}))"]
        if vk in ("handle", "address"):
            return [f"return tuple(<intptr_t>self._data.{n}[i] for i in range({t.length}))"]
        return [f"return tuple(self._data.{n}[i] for i in range({t.length}))"]
    vk = value_kind(t)
    if vk in ("int", "float"):
        return [f"return self._data.{n}"]
    if vk == "bool":
        return [f"return bool(self._data.{n})"]
    if vk == "enum":
        return [f"return _enum_or_int({enum_class(lib, t)}, self._data.{n})"]
    if vk in ("handle", "address"):
        return [f"return <intptr_t>self._data.{n}"]
    if vk == "str":
        return [f"return None if self._data.{n} == NULL else (<bytes>self._data.{n}).decode()"]
    if vk == "struct":
        return [f"return {class_name(lib, t)}._from_data(self._data.{n})"]
    raise ValueError(vk)


def _field_set(lib: Library, f: Field) -> list[str]:
    t = f.type
    n = f.name
    if isinstance(t, Array):
        el = t.element
        vk = value_kind(el)
        ln = t.length
        out = [f"if len(value) != {ln}:",
               f'{I4}raise _UsageError("{n} takes exactly {ln} values, got %d" % len(value))',
               f"for i in range({ln}):"]
        if vk == "struct":
            out.append(f"{I4}self._data.{n}[i] = (<{class_name(lib, el)}?>value[i])._data")
        elif vk in ("handle", "address"):
            out.append(f"{I4}self._data.{n}[i] = <{cy_type(el, drop_const=True)}>{address_guard('value[i]', n)}")
        elif vk in ("int", "enum"):
            out.append(f'{I4}self._data.{n}[i] = _int_arg(value[i], "{n}")')
        else:
            out.append(f"{I4}self._data.{n}[i] = value[i]")
        return out
    vk = value_kind(t)
    ct = cy_type(t, drop_const=True)
    if vk == "int":
        return [*int_guard("value", n), f"self._data.{n} = value"]
    if vk in ("float", "bool"):
        return [f"self._data.{n} = value"]
    if vk == "enum":
        return [*int_guard("value", n), f"self._data.{n} = <{ct}><{enum_ctype(enum_of(lib, t))}>value"]
    if vk in ("handle", "address"):
        return [f"self._data.{n} = <{ct}>{address_guard('value', n)}"]
    if vk == "str":
        return ["if value is None:",
                f"{I4}self._data.{n} = NULL",
                f'{I4}self._refs.pop("{n}", None)',
                "else:",
                f"{I4}b = _to_bytes(value, \"{n}\")",
                f'{I4}self._refs["{n}"] = b',
                f"{I4}self._data.{n} = <const char*>b"]
    if vk == "struct":
        return [f"self._data.{n} = (<{class_name(lib, t)}?>value)._data"]
    raise ValueError(vk)
