"""Render mpbind.bindings._common (.pxd and .pyx): helpers every library's modules cimport.

They are written once instead of into each <lib>.pyx and _internal/<lib>.pyx. A cimported
cdef function is called through a pointer filled when the module is imported, so the flat
call path costs no attribute lookup.
"""

from __future__ import annotations

from emit_common import I4

I8 = I4 * 2
SOURCE = "bindings/emit_shared.py (helpers shared by every library)"

# name -> C signature (without the name) of each helper, as the .pxd declares it.
HELPERS = {
    "enum_or_int": "object {}(cls, long long value)",
    "str_or_none": "object {}(const char* s)",
    "to_bytes": "bytes {}(object value, str what)",
    "raise_library_error": "int {}(str library, str function, int status, object description, object last) except -1",
    "convert_mpi_comm": "intptr_t {}(object comm) except? 0",
    "open_library": "void* {}(str library) except NULL",
    "function_not_found": "int {}(str library, str name, object since) except -1",
}


def cimports(*names: str) -> list[str]:
    """The lines cimporting helpers under the module-private names the generated code calls (_name)."""
    for name in names:
        if name not in HELPERS:
            raise KeyError(f"_common has no helper {name}")
    return [f"from mpbind.bindings._common cimport {name} as _{name}" for name in names]


def common_pxd() -> str:
    lines = ["# cython: language_level=3", "", "from libc.stdint cimport intptr_t", "",
             'cdef extern from "<dlfcn.h>" nogil:', f"{I4}void* dlsym(void* handle, const char* symbol)", ""]
    lines += [f"cdef {signature.format(name)}" for name, signature in HELPERS.items()]
    return "\n".join(lines) + "\n"


def common_pyx() -> str:
    lines = [
        "# cython: language_level=3",
        '"""Helpers shared by the generated modules of every library (cimported from _common.pxd)."""',
        "",
        "from libc.stdint cimport intptr_t",
        "",
        "from mpbind import _status",
        "",
        "",
        "cdef object enum_or_int(cls, long long value):",
        f"{I4}try:",
        f"{I8}return cls(value)",
        f"{I4}except ValueError:",
        f"{I8}return value",
        "",
        "",
        "cdef object str_or_none(const char* s):",
        f"{I4}return None if s == NULL else (<bytes>s).decode(errors=\"replace\")",
        "",
        "",
        "cdef bytes to_bytes(object value, str what):",
        f"{I4}if isinstance(value, str):",
        f"{I8}return (<str>value).encode()",
        f"{I4}if isinstance(value, bytes):",
        f"{I8}return <bytes>value",
        f'{I4}raise TypeError("%s must be str or bytes, not %s" % (what, type(value).__name__))',
        "",
        "",
        "cdef int raise_library_error(str library, str function, int status, object description, object last) "
        "except -1:",
        f'{I4}"""Raise the typed error of `library` for `status` returned by `function`."""',
        f"{I4}raise _status.make_error(library, function, status, description, last)",
        "",
        "",
    ]
    return "\n".join(lines + _convert_mpi_comm() + _loading()).rstrip() + "\n"


def _convert_mpi_comm() -> list[str]:
    return [
        "cdef intptr_t convert_mpi_comm(object comm) except? 0:",
        f'{I4}"""The address of an MPI_Comm: an int, an mpi4py communicator, or None (NULL)."""',
        f"{I4}if comm is None:",
        f"{I8}return 0",
        f"{I4}if isinstance(comm, int):",
        f"{I8}return comm",
        f"{I4}try:",
        f"{I8}from mpi4py import MPI",
        f"{I4}except ImportError:",
        f'{I8}raise TypeError("mpi_comm must be an int address or an mpi4py communicator") from None',
        f"{I4}if not isinstance(comm, MPI.Comm):",
        f'{I8}raise TypeError("mpi_comm must be an int address or an mpi4py communicator, not %s"'
        f" % type(comm).__name__)",
        f"{I4}return MPI._addressof(comm)",
        "",
        "",
    ]


def _loading() -> list[str]:
    return [
        "cdef void* open_library(str library) except NULL:",
        f'{I4}"""The dlopen handle of `library`, which mpbind._loader opens once; every symbol is',
        f'{I4}looked up on it."""',
        f"{I4}from mpbind import _loader",
        f"{I4}return <void*><intptr_t>_loader.load(library).handle",
        "",
        "",
        "cdef int function_not_found(str library, str name, object since) except -1:",
        f"{I4}from mpbind import _loader",
        f"{I4}raise _loader.function_not_found(library, name, since)",
    ]
