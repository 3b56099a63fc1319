"""Render <lib>.pyx: the Python API (enums, struct classes, functions) from the IR."""

from __future__ import annotations

import textwrap

from emit_common import I4, attribute_table, const_name, cy_type
from emit_shared import cimports
from ir_types import Array, Field, Function, Library, Struct, TypedAttribute, is_void
from plan import Plan, plan
from pyvalues import class_name, enum_ctype, enum_of, to_python, value_kind

I8 = I4 * 2


# -- struct classes -----------------------------------------------------------------

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
        return [f"return _enum_or_int({class_name(lib, t)}, self._data.{n})"]
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
            out.append(f"{I4}self._data.{n}[i] = <{cy_type(el, drop_const=True)}><intptr_t>value[i]")
        else:
            out.append(f"{I4}self._data.{n}[i] = value[i]")
        return out
    vk = value_kind(t)
    ct = cy_type(t, drop_const=True)
    if vk in ("int", "float", "bool"):
        return [f"self._data.{n} = value"]
    if vk == "enum":
        return [f"self._data.{n} = <{ct}><{enum_ctype(enum_of(lib, t))}>value"]
    if vk in ("handle", "address"):
        return [f"self._data.{n} = <{ct}><intptr_t>value"]
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


def _struct_class(lib: Library, s: Struct) -> list[str]:
    cls = s.python
    name = s.name
    init = s.initializer
    fields = s.field_list
    internal = s.internal_fields()
    lines = [f"cdef class {cls}:"]
    if s.is_bytes:
        doc = f"{name}: {s.size} opaque bytes; bytes-like, comparable, hashable and picklable."
    elif s.opaque is not None:
        doc = f"{name}: opaque ({s.opaque}). `ptr` is its address, `bytes(obj)` its content."
    else:
        dflt = f" Defaults come from {init.macro}." if init else ""
        doc = f"{name} with attribute access to its fields.{dflt}"
    lines += [f'{I4}"""{doc}"""', "", f"{I4}cdef {name} _data", f"{I4}cdef dict _refs", ""]
    # Construction
    lines += [f"{I4}def __cinit__(self):", f"{I8}self._refs = {{}}"]
    if init:
        # The bytes of the *_INITIALIZER value, as the compiler laid it out.
        lines += [f"{I8}memcpy(&self._data, <const char*>{bytes.fromhex(init.image)!r}, sizeof({name}))", ""]
    else:
        lines += [f"{I8}memset(&self._data, 0, sizeof({name}))", ""]
    if s.is_bytes:
        lines += [
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
    elif s.opaque is not None:
        lines += [
            f"{I4}def __bytes__(self):",
            f"{I8}return (<const char*>&self._data)[:sizeof({name})]",
            "",
            f"{I4}def __repr__(self):",
            f'{I8}return "<{cls} at 0x%x>" % <intptr_t>&self._data',
            "",
        ]
    else:
        names = [f.name for f in fields if f.name not in internal]
        lines += [
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
        for f in fields:
            n = f.name
            lines.append(f"{I4}@property")
            lines.append(f"{I4}def {n}(self):")
            lines += [f"{I8}{x}" for x in _field_get(lib, f)]
            lines.append("")
            if n in internal:
                continue
            lines.append(f"{I4}@{n}.setter")
            lines.append(f"{I4}def {n}(self, value):")
            lines += [f"{I8}{x}" for x in _field_set(lib, f)]
            lines.append("")
    lines += [
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
        f"{I4}def from_ptr(intptr_t address):",
        f'{I8}"""A copy of the {name} at `address` (for example one a library call returned)."""',
        f"{I8}if address == 0:",
        f'{I8}{I4}raise _UsageError("{cls}.from_ptr: NULL address")',
        f"{I8}return {cls}._from_data((<{name}*>address)[0])",
        "",
        f"{I4}@staticmethod",
        f"{I4}cdef {cls} _from_data({name} data):",
        f"{I8}cdef {cls} obj = {cls}.__new__({cls})",
        f"{I8}obj._data = data",
        f"{I8}return obj",
        "",
        "",
    ]
    return lines


# -- functions ------------------------------------------------------------------------

def _function(lib: Library, pl: Plan) -> list[str]:
    """def <python>(...): the roles' conversions around one C call, its status check and result."""
    f = pl.f
    sig = [pp.decl if pp.default is None else f"{pp.decl}={pp.default}" for pp in pl.params]
    pre = [line for r in pl.roles for line in r.guard() + r.convert()]
    cleanup = [line for r in pl.roles for line in r.cleanup()]
    call = f"{f.name}({', '.join(r.arg() for r in pl.roles)})"
    inner = _call(f, call) + _check(lib, f) + [line for r in pl.roles for line in r.after()] + _tail(lib, pl)
    body = [_docstring(lib, pl)] + _result_declaration(f)
    if cleanup:
        # Everything that can fail runs inside try, so finally frees what was
        # allocated; Cython wants the declarations outside it.
        hoisted, stmts = _hoist_declarations(pre)
        body += hoisted + ["try:"] + [I4 + x for x in stmts + inner] + ["finally:"] + [I4 + c for c in cleanup]
    else:
        body += pre + inner
    out = [f"def {f.python}({', '.join(sig)}):"] + [I4 + b for b in body]
    return [line.rstrip() for line in "\n".join(out).split("\n")] + ["", ""]


def _docstring(lib: Library, pl: Plan) -> str:
    f = pl.f
    doc = [f"{f.name}({', '.join(cy_type(q.type, q.name) for q in f.params)})"]
    if pl.returns:
        doc += ["", f"Returns {pl.return_type}."]
    doc += ["", "Releases the GIL." if f.releases_gil else "Keeps the GIL (an O(1) query)."]
    since = f.since or ""
    if not since.startswith("<="):
        doc.append(f"Needs {lib.pretty} {since} or later.")
    return f'"""{chr(10).join(doc).rstrip()}"""'.replace("\n", "\n" + I4)


def _result_declaration(f: Function) -> list[str]:
    if f.returns_status:
        return [f"cdef {cy_type(f.returns, '__status__', drop_const=True)}"]
    if not is_void(f.returns):
        return [f"cdef {cy_type(f.returns, '__ret__', drop_const=False)}"]
    return []


def _call(f: Function, call: str) -> list[str]:
    if f.returns_status:
        lines = [f"__status__ = {call}"]
    elif is_void(f.returns):
        lines = [call]
    else:
        lines = [f"__ret__ = {call}"]
    return ["with nogil:"] + [I4 + x for x in lines] if f.releases_gil else lines


def _check(lib: Library, f: Function) -> list[str]:
    """Raise the library's error for a failing status (or a NULL return that means one)."""
    check: list[str] = []
    if f.returns_status:
        codes = [m.value for m in lib.status_enum.members if m.c in (f.success or ())]
        check.append(f"if {' and '.join(f'__status__ != {c}' for c in codes)}:")
        check.append(f'{I4}_raise_error(__status__, "{f.name}")')
    if f.null_error:
        nonzero = " and ".join(f"{n} != 0" for n in f.null_error)
        null_code = lib.status_enum.value_of(lib.status.null_status or "")
        check.append(f"if __ret__ == NULL and {nonzero}:")
        check.append(f'{I4}_raise_error({null_code}, "{f.name}")')
    return check


def _tail(lib: Library, pl: Plan) -> list[str]:
    results = [] if pl.f.returns_status or is_void(pl.f.returns) else [to_python(lib, pl.f.returns, "__ret__")]
    results += [x for r in pl.roles if (x := r.result()) is not None]
    if not results:
        return ["return None"]
    if len(results) == 1:
        return [f"return {results[0]}"]
    return [f"return ({', '.join(results)})"]


def _typed_attribute(lib: Library, enum_name: str, ta: TypedAttribute) -> list[str]:
    """<python>_set(obj, attr, value) / <python>_get(obj, attr) with each attribute's C type."""
    e = lib.enums[enum_name]
    cls = e.python
    setter, getter = lib.function(ta.set).python, lib.function(ta.get).python
    name = ta.python
    table = attribute_table(lib, enum_name)
    py_of = {m.c: m.python for m in e.members}
    table_name = f"{name.upper()}_ATTRIBUTE_TYPES"
    rows = ", ".join(f'{cls}.{py_of[cn]}: ({ct!r}, {fmt!r}, {pc or "None"})' for cn, (ct, fmt, pc) in table.items())
    return [
        f"# {enum_name} value -> (C type, struct format, enum class), from the header's documentation.",
        f"{table_name} = {{{rows}}}",
        "",
        "",
        f"cdef tuple _{name}_attribute(object attr):",
        f"{I4}try:",
        f"{I8}key = {cls}(attr)",
        f"{I4}except ValueError:",
        f'{I8}raise _UsageError("unknown {cls} value %r" % (attr,)) from None',
        f"{I4}return (key,) + {table_name}[key]",
        "",
        "",
        f"def {name}_set(obj, attr, value):",
        f'{I4}"""Set attribute `attr` ({cls}) to `value`, checked against the attribute\'s C type;',
        f'{I4}then {ta.set}."""',
        f"{I4}key, ctype, fmt, enum_cls = _{name}_attribute(attr)",
        f"{I4}if isinstance(value, float) and fmt not in ('f', 'd') or isinstance(value, (str, bytes)):",
        f'{I8}raise _UsageError("%s takes %s, not %s" % (key.name, ctype, type(value).__name__))',
        f"{I4}if enum_cls is not None:",
        f"{I8}try:",
        f"{I8}{I4}enum_cls(value)",
        f"{I8}except ValueError:",
        f'{I8}{I4}raise _UsageError("%s takes %s: %r is not one of its values" % (key.name, ctype, value)) from None',
        f"{I4}try:",
        f"{I8}buf = _struct.pack(fmt, value)",
        f"{I4}except _struct.error as exc:",
        f'{I8}raise _UsageError("%s takes %s: %s" % (key.name, ctype, exc)) from None',
        f"{I4}cdef const char* p = buf",
        f"{I4}{setter}(obj, key, <intptr_t>p, len(buf))",
        "",
        "",
        f"def {name}_get(obj, attr):",
        f'{I4}"""The value of attribute `attr` ({cls}) as its C type (enums as their IntEnum); {ta.get}."""',
        f"{I4}key, ctype, fmt, enum_cls = _{name}_attribute(attr)",
        f"{I4}cdef char out[16]",
        f"{I4}memset(out, 0, 16)",
        f"{I4}size = _struct.calcsize(fmt)",
        f"{I4}{getter}(obj, key, <intptr_t>out, size)",
        f"{I4}value = _struct.unpack(fmt, out[:size])[0]",
        f"{I4}return value if enum_cls is None else _enum_or_int(enum_cls, value)",
        "",
        "",
    ]


def _support(lib: Library) -> list[str]:
    """The include of the hand-written support file (static inline functions, converters)."""
    inline = [f.python or f.name for f in lib.bound if f.inline_body is not None]
    text = f"Support code written by hand in bindings/{lib.support}" + (
        f": the headers' static inline functions {', '.join(inline)}." if inline else ".")
    return [f"# {line}" for line in textwrap.wrap(text, 96)] + [f'include "{lib.support}"', "", ""]


def _families(lib: Library) -> list[str]:
    """One dispatcher per per-type family: <op>(dtype, ...) -> <type>_<op>(...)."""
    lines = [
        "# Type name -> NumPy dtype name, for the family dispatchers.",
        f"FAMILY_TYPES = {dict(lib.family_types)!r}",
        "",
        "",
        "cdef str _type_name(object dtype, dict members, str op):",
        f"{I4}if isinstance(dtype, str) and dtype in members:",
        f"{I8}return dtype",
        f"{I4}if isinstance(dtype, str) and dtype in FAMILY_TYPES:",
        f'{I8}raise _UsageError("%s has no %s variant; types: %s" % (op, dtype, ", ".join(members)))',
        f"{I4}try:",
        f"{I8}import numpy",
        f"{I8}np_name = numpy.dtype(dtype).name",
        f"{I4}except Exception:",
        f'{I8}raise _UsageError("%s: unknown element type %r; use one of %s" % (op, dtype, ", ".join(members)))'
        " from None",
        f"{I4}for name in members:",
        f"{I8}if FAMILY_TYPES.get(name) == np_name:",
        f"{I8}{I4}return name",
        f'{I4}raise _UsageError("%s has no %s variant; types: %s" % (op, np_name, ", ".join(members)))',
        "",
        "",
    ]
    for fam in lib.families:
        first = lib.function(next(iter(fam.members.values())))
        pl = plan(lib, first)
        names = [pp.name for pp in pl.params]
        sig = ", ".join(["dtype"] + [n if pp.default is None else f"{n}={pp.default}"
                                     for n, pp in zip(names, pl.params, strict=True)])
        table = ", ".join(f'"{t}": {lib.function(c).python}' for t, c in fam.members.items())
        op = fam.python
        lines += [
            f"_FAMILY_{op} = {{{table}}}",
            "",
            "",
            f"def {op}({sig}):",
            f'{I4}"""{op} for the element type `dtype` (a type name or a NumPy dtype):',
            f'{I4}one of {", ".join(fam.members)}."""',
            f"{I4}fn = _FAMILY_{op}[_type_name(dtype, _FAMILY_{op}, \"{op}\")]",
            f"{I4}return fn({', '.join(names)})",
            "",
            "",
        ]
    return lines


_CONSTANT_INIT = {"NULL", "0", "None"}


def _hoist_declarations(pre: list[str]) -> tuple[list[str], list[str]]:
    """Split `cdef T x = expr` into a declaration and, unless expr is a constant, an assignment."""
    hoisted: list[str] = []
    stmts: list[str] = []
    for line in pre:
        if not line.startswith("cdef "):
            stmts.append(line)
            continue
        decl, _, expr = line.partition(" = ")
        if not expr or expr in _CONSTANT_INIT:
            hoisted.append(line)
            continue
        # A pointer the finally clause frees must be NULL until assigned.
        hoisted.append(f"{decl} = NULL" if "*" in decl else decl)
        stmts.append(f"{decl.split()[-1].lstrip('*')} = {expr}")
    return hoisted, stmts


def python_pyx(lib: Library) -> str:
    lines = [
        "# cython: language_level=3",
        f'"""Flat bindings for {lib.pretty} {lib.version}: every host function of the pinned headers.',
        "",
        "Handles are ints; enums are IntEnum (plain ints accepted); structs are classes with",
        "attribute access. Output parameters are returned. Errors raise the library's",
        f'{lib.status.error_base} subclasses from mpbind.errors.',
        '"""',
        "",
        "from cpython.buffer cimport PyBuffer_FillInfo",
        "from cpython.mem cimport PyMem_Free, PyMem_Malloc",
        "from libc.stdint cimport intptr_t",
        "from libc.string cimport memcpy, memset",
        "",
        f"from mpbind.bindings.cy{lib.name} cimport *",
        *cimports("enum_or_int", "str_or_none", "to_bytes", "raise_library_error"),
        *(cimports("convert_mpi_comm") if any(p.convert == "mpi_comm" for f in lib.bound for p in f.params) else []),
        "",
        *(["import struct as _struct"] if lib.typed_attributes else []),
        "from enum import IntEnum as _IntEnum",
        "from typing import NewType as _NewType",
        "",
        "from mpbind.errors import UsageError as _UsageError",
        "",
        "",
    ]
    # constants
    for c in lib.constants:
        lines.append(f"{const_name(lib, c.name)} = {c.value!r}")
    lines.append("")
    for cname, py in sorted(lib.handles.items()):
        lines.append(f'{py} = _NewType("{py}", int)  # {cname}')
        # NewType takes its module from the caller's frame, which Cython lacks.
        lines.append(f"{py}.__module__ = __name__")
    lines += ["", ""]
    for e in lib.enums.values():
        lines.append(f"class {e.python}(_IntEnum):")
        lines.append(f'{I4}"""{e.name}"""')
        for m in e.members:
            lines.append(f"{I4}{m.python} = {m.value}")
        lines += ["", ""]
    se = lib.status
    lines += [
        "cdef int _raise_error(int status, str function) except -1:",
        f"{I4}description = None",
        f"{I4}last = None",
    ]
    if se.error_string:
        lines += [
            f"{I4}try:",
            f"{I8}description = _str_or_none({se.error_string}(<{se.type}>status))",
            f"{I4}except Exception:",
            f"{I8}pass",
        ]
    if se.last_error:
        lines += [
            f"{I4}try:",
            f"{I8}last = _str_or_none({se.last_error}(NULL))",
            f"{I4}except Exception:",
            f"{I8}pass",
        ]
    lines += [
        f'{I4}_raise_library_error("{lib.name}", function, status, description, last)',
        "",
        "",
        "def _raise_status(int status, str function):",
        f'{I4}"""Raise the typed error for `status` returned by `function` (used by mpbind._core)."""',
        f"{I4}_raise_error(status, function)",
        "",
        "",
    ]
    structs, _, _ = lib.reachable_types()
    for name in structs:
        s = lib.structs[name]
        lines += _struct_class(lib, s)
        cls = s.python
        lines.append(f"cdef object _as_{cls}(object value, str what):")
        lines.append(f"{I4}if isinstance(value, {cls}):")
        lines.append(f"{I8}return value")
        if s.is_bytes:
            lines.append(f"{I4}if isinstance(value, (bytes, bytearray, memoryview)):")
            lines.append(f"{I8}return {cls}(value)")
        lines.append(f'{I4}raise TypeError("%s must be {cls}, not %s" % (what, type(value).__name__))')
        lines += ["", ""]
    if lib.support:
        lines += _support(lib)
    for f in lib.symbols:
        lines += _function(lib, plan(lib, f))
    if lib.families:
        lines += _families(lib)
    for enum_name, ta in lib.typed_attributes.items():
        lines += _typed_attribute(lib, enum_name, ta)
    text = "\n".join(lines)
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip() + "\n"
