"""Render cy<lib>.pxd / cy<lib>.pyx and _internal/<lib>.pxd / .pyx from the IR.

cy<lib>.pxd carries the library's C types as verbatim C (so that compiling needs
no NVIDIA header, with static asserts pinning sizes and offsets to what clang
measured on the real headers) plus the nogil C entry points. The entry points
forward to _internal/<lib>, which holds the function-pointer table filled by
dlsym on the one handle mpbind._infra.loader opened.
"""

from __future__ import annotations

from emit_common import (
    I4,
    LOADING_ERROR_VALUE,
    c_args,
    c_param_types,
    c_params,
    c_type,
    cimport_lines,
    cy_type,
    except_clause,
    loading_error,
    std_names,
)
from emit_shared import cimports
from ir_types import CType, Function, Library, is_void


def _types_block(lib: Library) -> list[str]:
    structs, aliases, handles = lib.reachable_types()
    guard = f"MPBIND_CY{lib.name.upper()}_TYPES_H"
    c: list[str] = [f"#ifndef {guard}", f"#define {guard}", "#include <stddef.h>",
                    "#include <stdint.h>", "#include <stdbool.h>"]
    # Returned by an entry point whose symbol is missing, with a Python exception set.
    c.append(f"#define {loading_error(lib)} (({lib.status.type}){LOADING_ERROR_VALUE})")
    # Handles are declared with the struct tag the library's header uses, so that two
    # modules declaring the same handle (cynccl, cycublasmp: ncclComm_t) agree.
    for name in sorted(set(lib.foreign_handles) | set(handles)):
        tag = lib.handle_tags.get(name) or _foreign_tag(name)
        c.append(f"typedef struct {tag} *{name};")
    for name in aliases:
        c.append(f"typedef {c_type(lib.aliases[name], name)};")
    for e in lib.enums.values():
        body = ", ".join(f"{m.c} = {m.value}" for m in e.members)
        # Guarded one by one: two modules may both declare an enum another header owns
        # (cudaDataType_t in cycublasmp and cycufftmp), and one unit may cimport both.
        guard_e = f"MPBIND_ENUM_{e.name}"
        c += [f"#ifndef {guard_e}", f"#define {guard_e}", f"typedef enum {{ {body} }} {e.name};", "#endif"]
    for name in structs:
        c.append(f"typedef struct mpbind_{name} {name};")
    for name in structs:
        s = lib.structs[name]
        if s.fields is not None:
            fields = " ".join(f"{c_type(f.type, f.name)};" for f in s.fields)
        else:
            fields = f"_Alignas({s.align}) unsigned char _opaque[{s.size}];"
        c.append(f"struct mpbind_{name} {{ {fields} }};")
        c.append(f'_Static_assert(sizeof({name}) == {s.size}, "size of {name}");')
        for f in s.field_list:
            c.append(f'_Static_assert(offsetof({name}, {f.name}) == {f.offset}, '
                     f'"offset of {name}.{f.name}");')
    c.append(f"#endif  /* {guard} */")

    out = ["cdef extern from *:", f'{I4}"""']
    out += [f"{I4}{line}" for line in c]
    out.append(f'{I4}"""')
    for name in sorted(lib.foreign_handles):
        out.append(f"{I4}ctypedef void* {name}")
    for name in handles:
        if name not in lib.foreign_handles:
            out.append(f"{I4}ctypedef void* {name}")
    for name in aliases:
        out.append(f"{I4}ctypedef {cy_type(lib.aliases[name], name)}")
    for e in lib.enums.values():
        out.append(f"{I4}ctypedef enum {e.name}:")
        for m in e.members:
            out.append(f"{I4}{I4}{m.c}")
        if e.name == lib.status.type:
            out.append(f"{I4}{I4}{loading_error(lib)}")
    for name in structs:
        s = lib.structs[name]
        out.append(f"{I4}ctypedef struct {name}:")
        if s.fields is not None:
            for f in s.fields:
                out.append(f"{I4}{I4}{cy_type(f.type, f.name)}")
        else:
            out.append(f"{I4}{I4}unsigned char _opaque[{s.size}]")
    return out


def _foreign_tag(name: str) -> str:
    # The struct tags CUDA uses, so that a unit that also includes CUDA's own
    # headers sees an identical (and so legal) typedef.
    return {"cudaStream_t": "CUstream_st", "cudaEvent_t": "CUevent_st"}.get(name, f"{name}_opaque")


def _all_types(lib: Library) -> list[CType]:
    ts: list[CType] = []
    for f in lib.symbols:
        ts.append(f.returns)
        ts += [p.type for p in f.params]
    for s in lib.structs.values():
        ts += [f.type for f in s.field_list]
    ts += list(lib.aliases.values())
    return ts


def cy_pxd(lib: Library) -> str:
    lines = ["# cython: language_level=3", ""]
    lines += cimport_lines(std_names(_all_types(lib)))
    lines.append("")
    lines += _types_block(lib)
    lines += ["", "", "# Entry points: callable without the GIL; each raises FunctionNotFoundError",
              "# (taking the GIL) when the loaded library lacks the symbol.", ""]
    for f in lib.symbols:
        lines.append(f"cdef {cy_type(f.returns, f.name)}({c_params(f)}) "
                     f"{except_clause(lib, f.returns)} nogil")
    return "\n".join(lines) + "\n"


# An entry point returning void, a struct or a handle has no spare value to signal an error, so it is
# `except *`: its caller looks for an exception (taking the GIL) after each call. That is deliberate:
# a missing symbol raises FunctionNotFoundError, and the Cython code cimporting cy<lib> relies on it
# (the flat bindings call _internal's int-returning entry point of a void function instead). Cython
# hints at each of these; the hints say nothing new, so the modules defining them turn them off.
NO_PERFORMANCE_HINTS = [
    "# cython: show_performance_hints=False",
    "# (except * on void, struct and handle entry points is deliberate: see codegen/emit_cython.py)",
]


def cy_pyx(lib: Library) -> str:
    lines = ["# cython: language_level=3", *NO_PERFORMANCE_HINTS, "",
             f"from mpbind.bindings._internal cimport {lib.name} as _{lib.name}", ""]
    for f in lib.symbols:
        lines.append(f"cdef {cy_type(f.returns, f.name)}({c_params(f)}) "
                     f"{except_clause(lib, f.returns)} nogil:")
        call = f"_{lib.name}._{f.name}({c_args(f)})"
        if is_void(f.returns):
            lines.append(f"{I4}{call}")
        else:
            lines.append(f"{I4}return {call}")
        lines.append("")
    return "\n".join(lines)


def internal_pxd(lib: Library) -> str:
    lines = ["# cython: language_level=3", "",
             f"from mpbind.bindings.cy{lib.name} cimport *", ""]
    for f in lib.symbols:
        lines.append(f"cdef {_internal_signature(lib, f)} nogil")
    return "\n".join(lines) + "\n"


def _internal_signature(lib: Library, f: Function) -> str:
    """An _internal entry point's declaration. A void C function's returns int, 0 or -1 with an
    exception set, so that its callers test a value instead of taking the GIL to look for one."""
    if is_void(f.returns):
        return f"int _{f.name}({c_params(f)}) except -1"
    return f"{cy_type(f.returns, '_' + f.name)}({c_params(f)}) {except_clause(lib, f.returns)}"


def internal_pyx(lib: Library) -> str:
    """_internal/<lib>.pyx: the function-pointer table, filled by dlsym on the library's one handle.

    One C array holds the pointers, _fn[i] that of the i-th function of SINCE (named in a comment
    where it is used): a module-level variable per function made Cython list every one of them in
    the traceback data of every function, which took it minutes and gigabytes for NVSHMEM's."""
    slot = {f.name: i for i, f in enumerate(lib.symbols)}
    lines = [
        "# cython: language_level=3",
        *NO_PERFORMANCE_HINTS,
        "",
        "from libc.stdint cimport intptr_t",
        "",
        "from mpbind.bindings._common cimport dlsym",
        *cimports("open_library", "function_not_found"),
        "",
        "from _thread import allocate_lock  # not threading: importing the bindings stays cheap",
        "",
        f'LIBRARY = "{lib.name}"',
        "SINCE = {",
        *(f'{I4}"{f.name}": "{f.since}",' for f in lib.symbols),
        "}",
        "",
        "cdef object _lock = allocate_lock()",
        "cdef bint _initialized = False",
        f"cdef void* _fn[{max(len(slot), 1)}]  # NULL until _load: the function of SINCE in the same place",
        "",
        "",
    ]
    lines += _loader() + _addresses() + _version_code(lib, slot)
    for f in lib.symbols:
        lines += _entry_point(lib, f, slot[f.name])
    return "\n".join(lines) + "\n"


def _loader() -> list[str]:
    """_load (every dlsym, once, under a lock), its fast check, and the missing-symbol error."""
    return [
        "cdef int _load() except -1:",
        f"{I4}global _initialized",
        f"{I4}cdef void* handle",
        f"{I4}cdef Py_ssize_t i",
        f"{I4}with _lock:",
        f"{I4}{I4}if _initialized:",
        f"{I4}{I4}{I4}return 0",
        f"{I4}{I4}handle = _open_library(LIBRARY)",
        f"{I4}{I4}for i, name in enumerate(SINCE):",
        f"{I4}{I4}{I4}_fn[i] = dlsym(handle, (<str>name).encode())",
        f"{I4}{I4}_initialized = True",
        f"{I4}return 0",
        "",
        "",
        "cdef inline int _ensure_loaded() except -1 nogil:",
        f"{I4}if _initialized:",
        f"{I4}{I4}return 0",
        f"{I4}with gil:",
        f"{I4}{I4}return _load()",
        "",
        "",
        "cdef int _resolve(Py_ssize_t i) except -1 nogil:",
        f'{I4}"""An entry point whose pointer _fn[i] is NULL: load the library (once), then raise',
        f'{I4}FunctionNotFoundError if it lacks the symbol. One function for every entry point: each',
        f'{I4}taking the GIL on its own made the module much longer to generate and compile."""',
        f"{I4}with gil:",
        f"{I4}{I4}_load()",
        f"{I4}{I4}if _fn[i] == NULL:",
        f"{I4}{I4}{I4}name = list(SINCE)[i]",
        f"{I4}{I4}{I4}_function_not_found(LIBRARY, name, SINCE[name])",
        f"{I4}return 0",
        "",
        "",
    ]


def _addresses() -> list[str]:
    return [
        "def symbol_address(str name):",
        f'{I4}"""Address of a bound symbol in the loaded library (0 when it lacks it)."""',
        f"{I4}_ensure_loaded()",
        f"{I4}return _addresses().get(name, 0)",
        "",
        "",
        "cdef dict _addresses():",
        f"{I4}return {{name: <intptr_t>_fn[i] for i, name in enumerate(SINCE)}}",
        "",
        "",
    ]


def _version_code(lib: Library, slot: dict[str, int]) -> list[str]:
    vf = lib.version_function.function
    fn = f"_fn[{slot[vf]}]"
    lines = [
        "def library_version_code():",
        f'{I4}"""The loaded library\'s version from {vf}, or None if it lacks it."""',
        f"{I4}_ensure_loaded()",
        f"{I4}if {fn} == NULL:  # {vf}",
        f"{I4}{I4}return None",
    ]
    if lib.version_function.format == "triple":
        # void f(int* major, int* minor, int* patch)
        return lines + [
            f"{I4}cdef int major = 0, minor = 0, patch = 0",
            f"{I4}(<void (*)(int*, int*, int*) noexcept nogil>{fn})(&major, &minor, &patch)",
            f"{I4}return (major, minor, patch)",
            "",
        ]
    # status f(int* code)
    return lines + [
        f"{I4}cdef int code = 0",
        f"{I4}if (<int (*)(int*) noexcept nogil>{fn})(&code) != 0:",
        f"{I4}{I4}return None",
        f"{I4}return code",
        "",
    ]


def _entry_point(lib: Library, f: Function, i: int) -> list[str]:
    """_<name>(...): load on first use, raise FunctionNotFoundError for a missing symbol (both in
    _resolve, when the pointer is NULL), call."""
    fptr = f"<{cy_type(f.returns)} (*)({c_param_types(f)}) noexcept nogil>_fn[{i}]"
    call = f"({fptr})({c_args(f)})"
    return [
        "",
        f"cdef {_internal_signature(lib, f)} nogil:",
        f"{I4}if _fn[{i}] == NULL:  # {f.name}",
        f"{I4}{I4}_resolve({i})",
        *([f"{I4}{call}", f"{I4}return 0"] if is_void(f.returns) else [f"{I4}return {call}"]),
    ]
