"""Render mpbind.bindings._common (.pxd and .pyx): helpers every library's modules cimport.

They are written once instead of into each <lib>.pyx and _internal/<lib>.pyx. A cimported
cdef function is called through a pointer filled when the module is imported, so the flat
call path costs no attribute lookup.
"""

from __future__ import annotations

from emit_common import I4

I8 = I4 * 2
SOURCE = "codegen/emit_shared.py (helpers shared by every library)"

# name -> C signature (without the name) of each helper, as the .pxd declares it.
HELPERS = {
    "enum_or_int": "object {}(cls, long long value)",
    "str_or_none": "object {}(const char* s)",
    "to_bytes": "bytes {}(object value, str what)",
    "raise_library_error": "int {}(str library, str function, int status, object description, object last) except -1",
    "convert_mpi_comm": "intptr_t {}(object comm) except? 0",
    "open_library": "void* {}(str library) except NULL",
    "function_not_found": "int {}(str library, str name, object since) except -1",
    "address_arg": "intptr_t {}(object value, const char* name, bint non_null) except? -1",
    "int_arg": "object {}(object value, const char* name)",
}

# The guards' fast paths, defined in the .pxd as inline functions: compiled into every module that
# cimports them, so an argument that passes costs a type check and a compare, no call. What does not
# pass (or is not a plain int) takes the slow path above, which refuses it naming the argument.
INLINE = {
    "is_int": [
        "cdef inline bint is_int(object value) noexcept:",
        f'{I4}"""An int or an int subclass other than bool (an IntEnum): what int_arg would return as is."""',
        f"{I4}return PyLong_CheckExact(value) or (PyLong_Check(value) and not PyBool_Check(value))",
    ],
    "as_address": [
        "cdef inline intptr_t as_address(object value, const char* name, bint non_null) except? -1:",
        f'{I4}"""A pointer or handle: an int in [0, 2**63) (1 and up when non_null); else address_arg raises."""',
        f"{I4}cdef Py_ssize_t v",
        f"{I4}if PyLong_CheckExact(value):",
        f"{I8}v = _ssize_or_error(value)",
        f"{I8}if v > 0 or (v == 0 and not non_null):",
        f"{I8}{I4}return v",
        f"{I8}_clear_error()  # 2**63 and over overflowed: address_arg raises it again, naming the argument",
        f"{I4}return address_arg(value, name, non_null)",
    ],
}


# Classes the generated modules cimport: their .pxd declaration.
CLASSES = {
    "EnumTable": [
        "cdef class EnumTable:",
        f"{I4}cdef dict made",
        f"{I4}cdef str module",
        f"{I4}cdef dict specs",
        f"{I4}cdef object get(self, str name)",
    ],
}


def cimports(*names: str) -> list[str]:
    """The lines cimporting helpers under the module-private names the generated code calls (_name)."""
    for name in names:
        if name not in HELPERS and name not in INLINE and name not in CLASSES:
            raise KeyError(f"_common has no helper {name}")
    return [f"from mpbind.bindings._common cimport {name} as _{name}" for name in names]


def common_pxd() -> str:
    lines = ["# cython: language_level=3", "", "from cpython.bool cimport PyBool_Check",
             "from cpython.long cimport PyLong_Check, PyLong_CheckExact", "from libc.stdint cimport intptr_t", "",
             'cdef extern from "<dlfcn.h>" nogil:', f"{I4}void* dlsym(void* handle, const char* symbol)", "",
             "# Without an exception clause: as_address reads the error itself.",
             'cdef extern from "Python.h":', f'{I4}Py_ssize_t _ssize_or_error "PyLong_AsSsize_t"(object value)',
             f'{I4}void _clear_error "PyErr_Clear"()', ""]
    lines += [f"cdef {signature.format(name)}" for name, signature in HELPERS.items()]
    lines += ["", *CLASSES["EnumTable"]]
    for body in INLINE.values():
        lines += ["", ""] + body
    return "\n".join(lines) + "\n"


def common_pyx() -> str:
    lines = [
        "# cython: language_level=3",
        '"""Helpers shared by the generated modules of every library (cimported from _common.pxd)."""',
        "",
        "from cpython.number cimport PyNumber_Index",
        "from libc.stdint cimport intptr_t",
        "",
        "import _thread",
        "",
        "from mpbind.errors import UsageError",
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
        "cdef object _status = None  # mpbind.bindings._status: its classes load on the first error, not on import",
        "",
        "",
        "cdef int raise_library_error(str library, str function, int status, object description, object last) "
        "except -1:",
        f'{I4}"""Raise the typed error of `library` for `status` returned by `function`."""',
        f"{I4}global _status",
        f"{I4}if _status is None:",
        f"{I8}from mpbind.bindings import _status as module",
        f"{I8}_status = module",
        f"{I4}raise _status.make_error(library, function, status, description, last)",
        "",
        "",
    ]
    return "\n".join(lines + _enum_table() + _guards() + _handle_type() + _convert_mpi_comm() + _loading()
                     ).rstrip() + "\n"


def _enum_table() -> list[str]:
    """EnumTable: the generated modules' IntEnums, made on first use."""
    return [
        "cdef object _enum_lock = _thread.allocate_lock()",
        "",
        "",
        "cdef class EnumTable:",
        f'{I4}"""A generated module\'s IntEnums, each made on first use: importing enum and making every class',
        f"{I4}at import would cost more than the rest of the module's import. `made` is the module's globals,",
        f'{I4}so a class made once is a plain attribute from then on."""',
        "",
        f"{I4}def __init__(self, dict made, str module, dict specs):",
        f"{I8}self.made = made",
        f"{I8}self.module = module",
        f"{I8}self.specs = specs  # name -> (docstring, ((member, value), ...))",
        "",
        f"{I4}cdef object get(self, str name):",
        f'{I8}"""The IntEnum `name` (KeyError for another name)."""',
        f"{I8}cls = self.made.get(name)",
        f"{I8}if cls is not None:",
        f"{I8}{I4}return cls",
        f"{I8}doc, members = self.specs[name]",
        f"{I8}with _enum_lock:  # one class per name, also when threads ask at once",
        f"{I8}{I4}cls = self.made.get(name)",
        f"{I8}{I4}if cls is None:",
        f"{I8}{I8}from enum import IntEnum",
        f"{I8}{I8}cls = IntEnum(name, members, module=self.module, qualname=name)",
        f"{I8}{I8}cls.__doc__ = doc",
        f"{I8}{I8}self.made[name] = cls",
        f"{I8}return cls",
        "",
        f"{I4}def attribute(self, name):",
        f'{I8}"""The module\'s __getattr__: an IntEnum not made yet."""',
        f"{I8}if name in self.specs:",
        f"{I8}{I4}return self.get(name)",
        f'{I8}raise AttributeError("module %r has no attribute %r" % (self.module, name))',
        "",
        f"{I4}def names(self):",
        f'{I8}"""The module\'s __dir__: its globals and the IntEnums."""',
        f"{I8}return sorted(set(self.made) | set(self.specs))",
        "",
        "",
    ]


def _guards() -> list[str]:
    """The slow paths of the argument guards (their fast paths are INLINE in the .pxd)."""
    return [
        "cdef object int_arg(object value, const char* name):",
        f'{I4}"""value as an int: an int or IntEnum as it is, an object with __index__ (a NumPy integer) as its',
        f'{I4}index; a bool or a float (which C would truncate) is refused."""',
        f"{I4}if PyBool_Check(value):",
        f'{I8}raise TypeError("%s must be an int, not bool" % name.decode())',
        f"{I4}if PyLong_Check(value):",
        f"{I8}return value",
        f"{I4}try:",
        f"{I8}return PyNumber_Index(value)",
        f"{I4}except TypeError:",
        f'{I8}raise TypeError("%s must be an int, not %s" % (name.decode(), type(value).__name__)) from None',
        "",
        "",
        "cdef intptr_t address_arg(object value, const char* name, bint non_null) except? -1:",
        f'{I4}"""What as_address does not pass: refused with the argument\'s name, or an int-like object\'s',
        f'{I4}index. A negative value or one of 2**63 and above is no pointer or handle; a bool is an',
        f'{I4}int of 1 that no caller means as an address."""',
        f"{I4}what = name.decode()",
        f"{I4}if PyBool_Check(value):",
        f'{I8}raise TypeError("%s must be an int (an address or handle), not bool" % what)',
        f"{I4}try:",
        f"{I8}index = PyNumber_Index(value)",
        f"{I4}except TypeError:",
        f'{I8}raise TypeError("%s must be an int (an address or handle), not %s" % (what, type(value).__name__))'
        " from None",
        f"{I4}if index < 0:",
        f'{I8}raise UsageError("%s must be an address or handle >= 0, got %d" % (what, index))',
        f"{I4}if index >= 2**63:",
        f'{I8}raise OverflowError("%s must be an address or handle below 2**63, got %d" % (what, index))',
        f"{I4}if index == 0 and non_null:",
        f'{I8}raise UsageError("%s must not be NULL (0): the library does not check it" % what)',
        f"{I4}return index",
        "",
        "",
    ]


def _handle_type() -> list[str]:
    return [
        "class HandleType:",
        f'{I4}"""A handle type of the flat bindings (typing.NewType(name, int) in the stubs). Like a NewType,',
        f'{I4}calling it returns its argument; unlike one, making it imports no typing."""',
        "",
        f"{I4}__supertype__ = int",
        "",
        f"{I4}def __init__(self, name, module):",
        f"{I8}self.__name__ = self.__qualname__ = name",
        f"{I8}self.__module__ = module",
        "",
        f"{I4}def __call__(self, value):",
        f"{I8}return value",
        "",
        f"{I4}def __repr__(self):",
        f'{I8}return "%s.%s" % (self.__module__, self.__qualname__)',
        "",
        f"{I4}def __reduce__(self):",
        f"{I8}return self.__qualname__  # pickled by reference, as a NewType is",
        "",
        f"{I4}def __or__(self, other):",
        f"{I8}import typing",
        f"{I8}return typing.Union[self, other]",
        "",
        f"{I4}def __ror__(self, other):",
        f"{I8}import typing",
        f"{I8}return typing.Union[other, self]",
        "",
        "",
    ]


def _convert_mpi_comm() -> list[str]:
    return [
        "cdef intptr_t convert_mpi_comm(object comm) except? 0:",
        f'{I4}"""The address of an MPI_Comm: an int, an mpi4py communicator, or None (NULL)."""',
        f"{I4}if comm is None:",
        f"{I8}return 0",
        f"{I4}if isinstance(comm, int):",
        f'{I8}return as_address(comm, "mpi_comm", 0)',  # not a bool, not negative
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
        f'{I4}"""The dlopen handle of `library`, which mpbind._infra.loader opens once; every symbol is',
        f'{I4}looked up on it."""',
        f"{I4}from mpbind._infra import loader as _loader",
        f"{I4}return <void*><intptr_t>_loader.load(library).handle",
        "",
        "",
        "cdef int function_not_found(str library, str name, object since) except -1:",
        f"{I4}from mpbind._infra import loader as _loader",
        f"{I4}raise _loader.function_not_found(library, name, since)",
    ]
