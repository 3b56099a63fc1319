"""Render <lib>.pyx: the Python API (enums, struct classes, functions) from the IR."""

from __future__ import annotations

import re
import textwrap

import emit_docs
from emit_common import I4, attribute_table, const_name, cy_type
from emit_shared import cimports
from emit_structs import struct_class
from ir_types import Function, Library, TypedAttribute, is_void
from plan import Plan, plan
from pyvalues import to_python

I8 = I4 * 2


# -- functions ------------------------------------------------------------------------

def _function(lib: Library, pl: Plan) -> list[str]:
    """def <python>(...): the roles' conversions around one C call, its status check and result."""
    f = pl.f
    sig = [pp.decl if pp.default is None else f"{pp.decl}={pp.default}" for pp in pl.params]
    # Every guard, then the init check, then every conversion: nothing is converted, allocated
    # or called before each argument was accepted.
    pre = [line for r in pl.roles for line in r.guard()] + _init_check(lib, f) + \
        [line for r in pl.roles for line in r.convert()]
    cleanup = [line for r in pl.roles for line in r.cleanup()]
    # A void function goes to its _internal entry point, which returns 0 or -1 with an exception
    # set: cy<lib>'s `except *` one would make Cython take the GIL after every call to check.
    callee = f"_{lib.name}._{f.name}" if is_void(f.returns) else f.name
    call = f"{callee}({', '.join(r.arg() for r in pl.roles)})"
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


def _init_check(lib: Library, f: Function) -> list[str]:
    """Raise the library's not-initialised error when its runtime is below what f needs: the
    library's own status call, so a runtime another library initialised (or finalised) counts."""
    if lib.init_check is None or f.needs_init is None:
        return []
    needed = lib.enums[lib.init_check.enum].value_of(f.needs_init)
    return [f"if {lib.init_check.function}() < {needed}:", f'{I4}_not_initialized("{f.name}", {needed})']


def _not_initialized(lib: Library, lookup: str = "_enums.get") -> list[str]:
    """_not_initialized(function, needed): raise the init check's error, naming both statuses.
    `lookup` returns an IntEnum of the public module by name."""
    ic = lib.init_check
    if ic is None:
        return []
    e = lib.enums[ic.enum]
    return [
        "cdef int _not_initialized(str function, int needed) except -1:",
        f"{I4}status = {ic.function}()",
        f'{I4}cls = {lookup}("{e.python}")',
        f"{I4}raise _NotInitializedError(function, _enum_or_int(cls, needed), _enum_or_int(cls, status))",
        "",
        "",
    ]


def _docstring(lib: Library, pl: Plan) -> str:
    """The function's docstring: emit_docs.function_doc, the text its stub carries too."""
    doc = emit_docs.function_doc(lib, pl.f, pl.return_type if pl.returns else None)
    return f'"""{chr(10).join(doc)}"""'.replace("\n", "\n" + I4)


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


_ATTRIBUTE_TYPES = [
    "cdef dict _attribute_types(str enum_name, dict rows):",
    f'{I4}"""{{member of enum_name: (C type, struct format, IntEnum or None)}} from rows keyed by member name."""',
    f"{I4}cls = _enums.get(enum_name)",
    f"{I4}return {{cls[m]: (ct, fmt, None if pc is None else _enums.get(pc)) for m, (ct, fmt, pc) in rows.items()}}",
    "",
    "",
]


def _typed_attribute(lib: Library, enum_name: str, ta: TypedAttribute) -> list[str]:
    """<python>_set(obj, attr, value) / <python>_get(obj, attr) with each attribute's C type."""
    e = lib.enums[enum_name]
    cls = e.python
    setter, getter = lib.function(ta.set).python, lib.function(ta.get).python
    name = ta.python
    table = attribute_table(lib, enum_name)
    py_of = {m.c: m.python for m in e.members}
    table_name = f"{name.upper()}_ATTRIBUTE_TYPES"
    rows = ", ".join(f"{py_of[cn]!r}: ({ct!r}, {fmt!r}, {pc!r})" for cn, (ct, fmt, pc) in table.items())
    return [
        f"# {enum_name} value -> (C type, struct format, enum class), from the header's documentation.",
        f'{table_name} = _attribute_types("{cls}", {{{rows}}})',
        "",
        "",
        f"cdef tuple _{name}_attribute(object attr):",
        f"{I4}try:",
        f'{I8}key = _enums.get("{cls}")(attr)',
        f"{I4}except ValueError:",
        f'{I8}raise _UsageError("unknown {cls} value %r" % (attr,)) from None',
        f"{I4}return (key,) + {table_name}[key]",
        "",
        "",
        f"def {name}_set(obj, attr, value):",
        *emit_docs.render(emit_docs.attribute_doc(lib, enum_name, ta, setter=True)),
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
        *emit_docs.render(emit_docs.attribute_doc(lib, enum_name, ta, setter=False)),
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
    text = f"Support code written by hand in {lib.support}, beside this file" + (
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
        f"{I4}if dtype is None:  # numpy.dtype(None) is float64: never a guess",
        f'{I8}raise TypeError("%s: dtype must be a type name or a NumPy dtype, not None" % op)',
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
    lines += [
        "cdef dict _family(dict names):",
        f'{I4}"""Type name -> function, from type name -> the function\'s name in this module (some are',
        f'{I4}re-exported from private modules, so the names are looked up when the module runs)."""',
        f"{I4}space = globals()",
        f"{I4}return {{t: space[name] for t, name in names.items()}}",
        "",
        "",
    ]
    for fam in lib.families:
        first = lib.function(next(iter(fam.members.values())))
        pl = plan(lib, first)
        names = [pp.name for pp in pl.params]
        sig = ", ".join(["dtype"] + [n if pp.default is None else f"{n}={pp.default}"
                                     for n, pp in zip(names, pl.params, strict=True)])
        table = ", ".join(f'"{t}": "{lib.function(c).python}"' for t, c in fam.members.items())
        op = fam.python
        lines += [
            f"_FAMILY_{op} = _family({{{table}}})",
            "",
            "",
            f"def {op}({sig}):",
            *emit_docs.render(emit_docs.family_doc(lib, fam)),
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


# The per-type members of a library's families, by API family, in private modules of their own:
# mpbind.bindings.<lib> re-exports each function. One module of every function made one C file
# whose compiler process took minutes and gigabytes; these compile apart, in parallel. Per library:
# (module suffix, what it holds, the families' Python names it takes as a regular expression),
# the first match taking a family; a family that none matches is an error, never a silent default.
PRIVATE_MODULES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "nvshmem": (
        ("coll", "collectives: alltoall, broadcast, fcollect", r"(alltoall|broadcast|fcollect)(_on_stream)?"),
        ("reduce", "reductions", r"[a-z]+_reduce(_on_stream)?"),
        ("reducescatter", "reduce-scatter", r"[a-z]+_reducescatter(_on_stream)?"),
        ("amo", "atomic memory operations and point-to-point synchronisation", r"atomic_\w+|wait_until\w*"),
        ("rma", "remote memory access from the host", r"(i?put|i?get|p|g)(_nbi)?"),
        ("rma_on_stream", "remote memory access on a stream", r"\w+_on_stream"),
    ),
}


def private_modules(lib: Library) -> dict[str, tuple[str, list[Function]]]:
    """Private module name (_<lib>_<suffix>) -> (what it holds, its functions in IR order)."""
    groups = PRIVATE_MODULES.get(lib.name, ())
    if not groups:
        return {}
    module_of: dict[str, str] = {}
    for fam in lib.families:
        suffix = next((g[0] for g in groups if re.fullmatch(g[2], fam.python)), None)
        if suffix is None:
            raise ValueError(f"{lib.name}: family {fam.python} matches no private module of PRIVATE_MODULES")
        for c_name in fam.members.values():
            module_of[c_name] = f"_{lib.name}_{suffix}"
    out: dict[str, tuple[str, list[Function]]] = {f"_{lib.name}_{g[0]}": (g[1], []) for g in groups}
    for f in lib.symbols:
        if f.name in module_of:
            out[module_of[f.name]][1].append(f)
    return {name: entry for name, entry in out.items() if entry[1]}


def python_pyx(lib: Library) -> str:
    """<lib>.pyx, in order: imports, constants, handle types, enums, errors, struct classes, the
    support file's include, one function per C function (but those of the private modules, which it
    re-exports), family dispatchers, typed attributes."""
    lines = _head(lib) + _constants(lib) + _enums(lib) + _raise_error(lib) + _not_initialized(lib)
    structs, _, _ = lib.reachable_types()
    for name in structs:
        lines += struct_class(lib, lib.structs[name])
    if lib.support:
        lines += _support(lib)
    private = private_modules(lib)
    elsewhere = {f.name for _, functions in private.values() for f in functions}
    for f in lib.symbols:
        if f.name not in elsewhere:
            lines += _function(lib, plan(lib, f))
    if private:
        lines += _reexports(lib, private)
    if lib.families:
        lines += _families(lib)
    if lib.typed_attributes:
        lines += _ATTRIBUTE_TYPES
    for enum_name, ta in lib.typed_attributes.items():
        lines += _typed_attribute(lib, enum_name, ta)
    return _text(lines)


def _text(lines: list[str]) -> str:
    text = "\n".join(lines)
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip() + "\n"


def _reexports(lib: Library, private: dict[str, tuple[str, list[Function]]]) -> list[str]:
    """Import each private module's functions as this module's own (their __module__ too, so that
    they pickle, print and document as mpbind.bindings.<lib>'s)."""
    lines = [
        "cdef _reexport(str module, tuple names):",
        f"{I4}source = __import__(module, None, None, names)",
        f"{I4}space = globals()",
        f"{I4}for name in names:",
        f"{I8}function = getattr(source, name)",
        f"{I8}function.__module__ = __name__",
        f"{I8}space[name] = function",
        "",
        "",
    ]
    for module, (_, functions) in private.items():
        names = "".join(f'{I4}"{f.python}",\n' for f in functions)
        lines += [f'_reexport("mpbind.bindings.{module}", (', names.rstrip("\n"), "))", "", ""]
    return lines


def python_modules(lib: Library) -> dict[str, str]:
    """Module name -> .pyx text: <lib> and its private modules (the Python API of the library)."""
    return {lib.name: python_pyx(lib), **{m: private_pyx(lib, m) for m in private_modules(lib)}}


def private_pyx(lib: Library, module: str) -> str:
    """One private module of private_modules(lib): its functions, with the error helpers they call."""
    what, functions = private_modules(lib)[module]
    lines = [
        "# cython: language_level=3",
        f'"""{lib.pretty} {lib.version}, {what}: the per-type functions of their families.',
        "",
        f"Private: mpbind.bindings.{lib.name} re-exports every function of this module as its own.",
        '"""',
        "",
        "from libc.stdint cimport intptr_t",
        "",
        f"from mpbind.bindings.cy{lib.name} cimport *",
        f"from mpbind.bindings._internal cimport {lib.name} as _{lib.name}",
        *cimports("enum_or_int", "str_or_none", "raise_library_error", "as_address", "is_int", "int_arg"),
        "",
        "from mpbind.errors import UsageError as _UsageError",
        *([f"from mpbind.errors import {lib.init_check.error} as _NotInitializedError"] if lib.init_check else []),
        "",
        "",
        "cdef object _enum_class(str name):",
        f'{I4}"""An IntEnum of mpbind.bindings.{lib.name}, looked up when needed: that module imports this one."""',
        f"{I4}from mpbind.bindings import {lib.name} as public",
        f"{I4}return getattr(public, name)",
        "",
        "",
    ]
    lines += _raise_error(lib, public=False) + _not_initialized(lib, lookup="_enum_class")
    for f in functions:
        lines += _function(lib, plan(lib, f))
    return _text(lines)


def _head(lib: Library) -> list[str]:
    mpi_comm = any(p.convert == "mpi_comm" for f in lib.bound for p in f.params)
    return [
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
        f"from mpbind.bindings._internal cimport {lib.name} as _{lib.name}",
        *cimports("enum_or_int", "EnumTable", "str_or_none", "to_bytes", "raise_library_error", "as_address",
                  "is_int", "int_arg"),
        *(cimports("convert_mpi_comm") if mpi_comm else []),
        "",
        *(["import struct as _struct"] if lib.typed_attributes else []),
        "from mpbind.bindings._common import HandleType as _HandleType",
        "from mpbind.errors import UsageError as _UsageError",
        *([f"from mpbind.errors import {lib.init_check.error} as _NotInitializedError"] if lib.init_check else []),
        "",
        "",
    ]


def _constants(lib: Library) -> list[str]:
    """Constants, then one handle type per handle (typing.NewType(name, int) in the stubs; at
    run time a HandleType, which behaves alike without importing typing)."""
    lines = [f"{const_name(lib, c.name)} = {c.value!r}" for c in lib.constants] + [""]
    for cname, py in sorted(lib.handles.items()):
        lines.append(f'{py} = _HandleType("{py}", __name__)  # {cname}')
    return lines + ["", ""]


def _enums(lib: Library) -> list[str]:
    """The IntEnums, each made on first use (_common.EnumTable: the module's __getattr__, or
    _enums.get(name) in generated code): importing enum and making every class at import would
    cost more than the rest of the module."""
    lines = ["# IntEnum name -> (docstring, ((member, value), ...)).", "_ENUMS = {"]
    for e in lib.enums.values():
        members = "".join(f"({m.python!r}, {m.value}), " for m in e.members)
        doc = chr(10).join(emit_docs.enum_doc(lib, e))
        lines.append(f"{I4}{e.python!r}: ({doc!r}, ({members.rstrip()})),")
    return lines + [
        "}",
        "cdef _EnumTable _enums = _EnumTable(globals(), __name__, _ENUMS)",
        "__getattr__ = _enums.attribute",
        "__dir__ = _enums.names",
        "",
        "",
    ]


def _raise_error(lib: Library, public: bool = True) -> list[str]:
    """_raise_error: the library's own strings for a status, then the shared typed error; and in
    the public module, _raise_status for mpbind._core."""
    se = lib.status
    lines = [
        "cdef int _raise_error(int status, str function) except -1:",
        f"{I4}description = None",
        f"{I4}last = None",
    ]
    for var, call in (("description", f"{se.error_string}(<{se.type}>status)" if se.error_string else None),
                      ("last", f"{se.last_error}(NULL)" if se.last_error else None)):
        if call is not None:
            lines += [f"{I4}try:", f"{I8}{var} = _str_or_none({call})", f"{I4}except Exception:", f"{I8}pass"]
    lines += [
        f'{I4}_raise_library_error("{lib.name}", function, status, description, last)',
        "",
        "",
    ]
    if not public:
        return lines
    return lines + [
        "def _raise_status(int status, str function):",
        f'{I4}"""Raise the typed error for `status` returned by `function` (used by mpbind._core)."""',
        f"{I4}_raise_error(status, function)",
        "",
        "",
    ]
