"""Parameter roles: how each C parameter of a bound function is passed from Python.

One class per role. The spec (or model.default_role) gives each parameter a role name
("in", "out", "in_array", ...); the classes registered under that name with @role are tried
in the order they are defined here, and the first whose `applies` accepts the parameter
renders it. A role instance says everything about its parameter:

    python_param()  the Python parameter: name, stub type, Cython declaration (None: none)
    returns()       the stub type of what it adds to the function's result (None: nothing)
    guard()         statements refusing a bad Python value before the C call
    convert()       statements turning the Python value into the C argument (or preparing
                    the output the call writes)
    arg()           the C argument expression
    after()         statements after the call succeeded (keep-alive references)
    result()        the Python expression it adds to the result (None: nothing)
    cleanup()       statements of the `finally` clause (frees what convert allocated)

model.py validates role names and attributes against this registry; plan.py arranges the
roles of one function (its Python signature and result); emit_python.py and emit_stubs.py
only place what the roles render. Adding a role is adding a class here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from emit_common import I4, cy_type
from ir_types import CType, Function, Library, Param, Pointer, is_char_ptr, resolve
from pyvalues import class_name, enum_ctype, enum_of, py_type, to_python, value_kind


@dataclass
class PyParam:
    """A parameter of the generated Python function."""

    role: Role
    name: str
    pytype: str  # its type in the stub
    decl: str  # its declaration in the Cython signature ("intptr_t comm", or just the name)
    default: str | None = None


class Role:
    """One parameter's part in a call; subclasses override what their parameters need."""

    requires: ClassVar[tuple[str, ...]] = ()  # spec attributes a parameter with this role must have

    def __init__(self, lib: Library, f: Function, p: Param) -> None:
        self.lib = lib
        self.f = f
        self.p = p
        self.n = p.name  # C name: the stem of every local this role declares
        self.py = p.python or p.name  # Python name

    @classmethod
    def applies(cls, p: Param) -> bool:
        """Whether this class renders p (among the classes registered under p's role name)."""
        return True

    def python_param(self) -> PyParam | None:
        return None

    def returns(self) -> str | None:
        return None

    def guard(self) -> list[str]:
        """Checks of the Python value that raise before anything is converted or called.

        The place for per-role refusals (a handle that is negative or NULL where the library
        does not check, an int argument given a float or bool). A check that must see the Python
        object rather than its C value also makes the role's `typed_decl` untyped. Every role's
        guard runs before any role's `convert`, so a guard may only read its own parameter."""
        return []

    def convert(self) -> list[str]:
        return []

    def arg(self) -> str:
        raise NotImplementedError(type(self).__name__)

    def after(self) -> list[str]:
        return []

    def result(self) -> str | None:
        return None

    def cleanup(self) -> list[str]:
        return []

    # -- helpers for subclasses ---------------------------------------------------------
    @property
    def pointee(self) -> CType:
        t = self.p.type
        assert isinstance(t, Pointer), f"{self.f.name}.{self.n}: {type(self).__name__} needs a pointer"
        return t.pointee

    def python_of(self, c_param: str | None) -> str:
        """The Python name of another parameter of the function (a length, a capacity)."""
        q = self.f.param(c_param or "")
        return q.python or q.name


# -- guards shared by the roles (helpers of mpbind.bindings._common, see emit_shared.py) -----

def address_guard(value: str, name: str, *, non_null: bool = False) -> str:
    """The intptr_t of a pointer or handle: an int (not a bool) in [0, 2**63), not 0 if non_null."""
    return f'_as_address({value}, "{name}", {int(non_null)})'


def int_guard(py: str, name: str | None = None) -> list[str]:
    """Rebind py to an int: ints and IntEnums pass as they are (the fast path), objects with
    __index__ (NumPy integers) become their index; bools and floats are refused. Cython then
    converts the int to the C type, refusing what does not fit (OverflowError)."""
    return [f"if not _is_int({py}):", f'{I4}{py} = _int_arg({py}, "{name or py}")']


def floor_guard(py: str, least: int) -> list[str]:
    """Refuse an int below `least` (a UsageError naming it), once it is an int."""
    return [f"if {py} < {least}:", f'{I4}raise _UsageError("{py} must be >= {least}, got %d" % {py})']


R = TypeVar("R", bound=type[Role])
_REGISTRY: dict[str, list[type[Role]]] = {}


def role(*names: str) -> Callable[[R], R]:
    """Register a Role class under spec role names."""

    def register(cls: R) -> R:
        for name in names:
            _REGISTRY.setdefault(name, []).append(cls)
        return cls

    return register


def names() -> set[str]:
    return set(_REGISTRY)


def check(name: str, attrs: Mapping[str, Any], where: str) -> None:
    """Refuse an unknown role name, or a parameter missing an attribute its role requires."""
    if name not in _REGISTRY:
        raise ValueError(f"{where}: unknown role {name} (roles: {', '.join(sorted(_REGISTRY))})")
    missing = sorted({a for cls in _REGISTRY[name] for a in cls.requires} - set(attrs))
    if missing:
        raise ValueError(f"{where}: role {name} needs {', '.join(missing)}")


def bind(lib: Library, f: Function, p: Param) -> Role:
    """The role object rendering parameter p of f."""
    for cls in _REGISTRY.get(p.role or "", []):
        if cls.applies(p):
            return cls(lib, f, p)
    raise ValueError(f"{f.name}.{p.name}: no role class of {p.role!r} takes a {p.type}")


# -- inputs ("in"; "inout": a struct the call updates in place) -------------------------

class Input(Role):
    """A Python argument passed to C."""

    def python_param(self) -> PyParam:
        pytype = self.p.pytype or self.stub_type()
        if self.p.nullable:
            pytype += " | None"
        typed = self.p.role == "in" and not self.p.nullable
        return PyParam(self, self.py, pytype, self.typed_decl() if typed else self.py)

    def stub_type(self) -> str:
        return py_type(self.lib, self.p.type)

    def typed_decl(self) -> str:
        """The Cython declaration when the argument is required: a C type converts on entry."""
        return self.py

    def if_given(self, line: str) -> list[str]:
        """line, run only when a nullable argument is not None."""
        return [f"if {self.py} is not None:", I4 + line] if self.p.nullable else [line]


@role("in", "inout")
class Converted(Input):
    """A value _convert_<name> turns into the C value (an mpi4py communicator, a callback):
    the generated _convert_mpi_comm, or one from the library's support code."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return p.convert is not None

    def stub_type(self) -> str:
        return "int | Any"

    def convert(self) -> list[str]:
        return [f"cdef intptr_t _h_{self.n} = _convert_{self.p.convert}({self.py})"]

    def arg(self) -> str:
        return f"<{cy_type(self.p.type)}>_h_{self.n}"


@role("in", "inout")
class StructPointer(Input):
    """A pointer to a struct, passed as its class (bytes too for a bytes-like struct)."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return isinstance(p.type, Pointer) and p.struct is not None

    @property
    def cls(self) -> str:
        return self.lib.structs[self.p.struct or ""].python

    def stub_type(self) -> str:
        return self.cls + (" | bytes" if self.lib.structs[self.p.struct or ""].is_bytes else "")

    def guard(self) -> list[str]:
        return self.if_given(f'_o_{self.n} = _as_{self.cls}({self.py}, "{self.py}")')

    def convert(self) -> list[str]:
        n, cls = self.n, self.cls
        return [f"cdef {cy_type(self.pointee, drop_const=True)}* _p_{n} = NULL",
                *self.if_given(f"_p_{n} = &(<{cls}>_o_{n})._data")]

    def arg(self) -> str:
        return f"_p_{self.n}"

    def after(self) -> list[str]:
        # The call stores a pointer into kept's data in this struct: keep kept alive with it.
        return [f'(<{self.cls}>_o_{self.n})._refs["{kept}"] = _o_{kept}' for kept in self.p.keeps]


@role("in", "inout")
class String(Input):
    """A NUL-terminated string: str (UTF-8) or bytes."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return is_char_ptr(p.type) and not p.address

    def guard(self) -> list[str]:
        n, py = self.n, self.py
        return [f"cdef bytes _b_{n} = None", *self.if_given(f'_b_{n} = _to_bytes({py}, "{py}")')]

    def convert(self) -> list[str]:
        n = self.n
        return [f"cdef const char* _s_{n} = NULL", *self.if_given(f"_s_{n} = <const char*>_b_{n}")]

    def arg(self) -> str:
        return f"_s_{self.n}"


class _IntegerAddress(Input):
    """A pointer-sized value passed as an int (None is NULL where nullable). The guard refuses
    bools, floats, negative values and 2**63 and above, and NULL where the spec marks the
    parameter `non_null` (the library dereferences it unchecked)."""

    def guard(self) -> list[str]:
        value = address_guard(self.py, self.py, non_null=self.p.non_null)
        if self.p.nullable:
            value = f"0 if {self.py} is None else {value}"
        return [f"cdef intptr_t _h_{self.n} = {value}"]

    def cast(self) -> str:
        return cy_type(self.p.type, drop_const=True)

    def arg(self) -> str:
        return f"<{self.cast()}>_h_{self.n}"


@role("in", "inout")
class Address(_IntegerAddress):
    """A host or device address (a pointer the library reads or writes through)."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return isinstance(p.type, Pointer) or value_kind(p.type) == "address"

    def stub_type(self) -> str:
        return "int"

    def cast(self) -> str:
        return cy_type(self.p.type, drop_const=not isinstance(self.p.type, Pointer))


@role("in", "inout")
class Handle(_IntegerAddress):
    """An opaque handle (ncclComm_t, cudaStream_t), typed as its NewType in the stubs."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return value_kind(p.type) == "handle"


@role("in", "inout")
class StructValue(Input):
    """A struct passed by value, as its class."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return value_kind(p.type) == "struct"

    def guard(self) -> list[str]:
        cls = class_name(self.lib, self.p.type)
        return [f'_o_{self.n} = _as_{cls}({self.py}, "{self.py}")']

    def convert(self) -> list[str]:
        n, cls = self.n, class_name(self.lib, self.p.type)
        ct = cy_type(resolve(self.p.type), drop_const=True)
        return [f"cdef {ct} _v_{n} = (<{cls}>_o_{n})._data"]

    def arg(self) -> str:
        return f"_v_{self.n}"


@role("in", "inout")
class EnumValue(Input):
    """An enum value: its IntEnum or a plain int."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return value_kind(p.type) == "enum"

    def guard(self) -> list[str]:
        ct = enum_ctype(enum_of(self.lib, self.p.type))
        return [*int_guard(self.py), f"cdef {ct} _c_{self.n} = {self.py}"]

    def arg(self) -> str:
        return f"<{cy_type(self.p.type, drop_const=True)}>_c_{self.n}"


@role("in", "inout")
class Scalar(Input):
    """An int, float or bool, converted by the typed Cython signature."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return value_kind(p.type) in ("int", "float", "bool")

    @property
    def is_int(self) -> bool:
        return value_kind(self.p.type) == "int"

    def typed_decl(self) -> str:
        # An int is converted after its guard; a float or bool by the signature (bool is bint).
        return self.py if self.is_int else cy_type(resolve(self.p.type), self.py, drop_const=True)

    def guard(self) -> list[str]:
        if not self.is_int:
            return []
        local = cy_type(resolve(self.p.type), "_c_" + self.n, drop_const=True)
        floor = [] if self.p.minimum is None else floor_guard(self.py, self.p.minimum)
        return [*int_guard(self.py), *floor, f"cdef {local} = {self.py}"]

    def arg(self) -> str:
        return f"_c_{self.n}" if self.is_int else self.py


@role("in_array")
class InArray(Input):
    """A pointer to `length` elements, given as a Python sequence (copied into a C array)."""

    requires = ("length",)

    def stub_type(self) -> str:
        return f"Sequence[{py_type(self.lib, self.pointee)}]"

    def convert(self) -> list[str]:
        n, py, el = self.n, self.py, self.pointee
        elt = cy_type(el, drop_const=True)
        src = f"_seq_{n}"
        body = [f"{src} = list({py})", f"_n_{n} = len({src})"]
        if self.p.explicit_length:
            ln = self.python_of(self.p.length)
            body += [f"if _n_{n} != {ln}:",
                     f'{I4}raise _UsageError("{py} has %d elements; {ln} is %d" % (_n_{n}, {ln}))']
        body += [f"_a_{n} = <{elt}*>PyMem_Malloc(max(_n_{n}, 1) * sizeof({elt}))",
                 f"if _a_{n} == NULL:", f"{I4}raise MemoryError()",
                 f"for _i in range(_n_{n}):", f"{I4}_a_{n}[_i] = {self.element(f'{src}[_i]')}"]
        if self.p.nullable:
            body = [f"if {py} is not None:"] + [I4 + line for line in body]
        return [f"cdef {elt}* _a_{n} = NULL", f"cdef Py_ssize_t _n_{n} = 0", *body]

    def element(self, item: str) -> str:
        """The C value of one element of the sequence."""
        el = self.pointee
        vk = value_kind(el)
        if vk == "struct":
            cls = class_name(self.lib, el)
            return f"(<{cls}>_as_{cls}({item}, \"{self.py}\"))._data"
        if vk in ("handle", "address"):
            return f"<{cy_type(el, drop_const=True)}>{address_guard(item, self.py)}"
        if vk == "enum":
            return f'<{cy_type(el, drop_const=True)}><{enum_ctype(enum_of(self.lib, el))}>_int_arg({item}, "{self.py}")'
        if vk == "int":
            return f'_int_arg({item}, "{self.py}")'
        return item

    def arg(self) -> str:
        return f"_a_{self.n}"

    def cleanup(self) -> list[str]:
        return [f"PyMem_Free(_a_{self.n})"]


@role("length")
class Length(Role):
    """An array length the call takes from the Python sequence of `length_of`."""

    requires = ("length_of",)

    def arg(self) -> str:
        return f"<{cy_type(self.p.type, drop_const=True)}>_n_{self.p.length_of}"


# -- outputs: pointers the call writes through; their values are returned -----------------

@role("out")
class OutStruct(Role):
    """A struct the call fills, returned as a new object of its class."""

    @classmethod
    def applies(cls, p: Param) -> bool:
        return isinstance(p.type, Pointer) and value_kind(p.type.pointee) == "struct"

    def returns(self) -> str:
        return py_type(self.lib, self.pointee, out=True)

    def convert(self) -> list[str]:
        cls = class_name(self.lib, self.pointee)
        return [f"cdef {cls} _r_{self.n} = {cls}()"]

    def arg(self) -> str:
        return f"&_r_{self.n}._data"

    def result(self) -> str:
        return f"_r_{self.n}"


@role("out")
class Out(Role):
    """One value the call writes, returned converted to Python."""

    def returns(self) -> str:
        return py_type(self.lib, self.pointee, out=True)

    def convert(self) -> list[str]:
        init = " = NULL" if value_kind(self.pointee) in ("handle", "address", "str") else ""
        return [f"cdef {cy_type(self.pointee, '_r_' + self.n, drop_const=False)}{init}"]

    def arg(self) -> str:
        return f"&_r_{self.n}"

    def result(self) -> str:
        return to_python(self.lib, self.pointee, f"_r_{self.n}")


@role("out_discard")
class OutDiscard(Role):
    """An output the Python API does not return (a string's length, read by another role)."""

    def convert(self) -> list[str]:
        return [f"cdef {cy_type(self.pointee, '_d_' + self.n, drop_const=False)}"]

    def arg(self) -> str:
        return f"&_d_{self.n}"


@role("out_str_buffer")
class OutStrBuffer(Role):
    """A char buffer of `capacity_constant` bytes the call fills; returned as str."""

    requires = ("capacity_constant",)

    def returns(self) -> str:
        return "str"

    @property
    def capacity(self) -> int | float:
        return self.lib.constant(self.p.capacity_constant or "").value

    def convert(self) -> list[str]:
        return [f"cdef char _sb_{self.n}[{self.capacity}]", f"memset(_sb_{self.n}, 0, {self.capacity})"]

    def arg(self) -> str:
        return f"_sb_{self.n}"

    def result(self) -> str:
        return f"_sb_{self.n}[:{self.capacity - 1}].split(b'\\0', 1)[0].decode(errors=\"replace\")"


@role("out_array")
class OutArray(Role):
    """A pointer to `length` elements the call writes; returned as a list."""

    requires = ("length",)

    def returns(self) -> str:
        return f"list[{py_type(self.lib, self.pointee, out=True)}]"

    def convert(self) -> list[str]:
        # The length is another parameter: checked here, once every guard has run.
        n, ln, elt = self.n, self.python_of(self.p.length), cy_type(self.pointee, drop_const=True)
        least = self.f.param(self.p.length or "").minimum
        checked = [] if least is not None and least >= 0 else floor_guard(ln, 0)  # else its own guard refused it
        return [*checked,
                f"cdef {elt}* _oa_{n} = <{elt}*>PyMem_Malloc(max({ln}, 1) * sizeof({elt}))",
                f"if _oa_{n} == NULL:", f"{I4}raise MemoryError()",
                f"memset(_oa_{n}, 0, max({ln}, 1) * sizeof({elt}))"]

    def arg(self) -> str:
        return f"_oa_{self.n}"

    def result(self) -> str:
        item = to_python(self.lib, self.pointee, f"_oa_{self.n}[_i]")
        return f"[{item} for _i in range({self.python_of(self.p.length)})]"

    def cleanup(self) -> list[str]:
        return [f"PyMem_Free(_oa_{self.n})"]


@role("out_bytes")
class OutBytes(Role):
    """A buffer of `capacity` bytes the call fills, its filled length in `length_out`; returns bytes."""

    requires = ("capacity", "length_out")

    def returns(self) -> str:
        return "bytes"

    def convert(self) -> list[str]:
        # The capacity is another parameter: checked here, once every guard has run.
        n, cap = self.n, self.python_of(self.p.capacity)
        return [*floor_guard(cap, 0),
                f"cdef char* _ob_{n} = <char*>PyMem_Malloc(max({cap}, 1))", f"if _ob_{n} == NULL:",
                f"{I4}raise MemoryError()"]

    def arg(self) -> str:
        return f"<void*>_ob_{self.n}"

    def result(self) -> str:
        return f"_ob_{self.n}[:min(max(_d_{self.p.length_out}, 0), {self.python_of(self.p.capacity)})]"

    def cleanup(self) -> list[str]:
        return [f"PyMem_Free(_ob_{self.n})"]


@role("out_str_array")
class OutStrArray(Role):
    """A const char*** the call points at its strings, their count in `length_out`; returns list[str]."""

    requires = ("length_out",)

    def returns(self) -> str:
        return "list[str]"

    def convert(self) -> list[str]:
        return [f"cdef const char** _osa_{self.n} = NULL"]

    def arg(self) -> str:
        return f"&_osa_{self.n}"

    def result(self) -> str:
        n = self.n
        return f"[_str_or_none(_osa_{n}[_i]) for _i in range(_d_{self.p.length_out})] if _osa_{n} != NULL else []"


# -- CUDA kernel launches: a kernel, a grid or block shape, the kernel's arguments ----------
# Their conversions are cdef functions of the library's support file (src/mpbind/bindings/
# _support/<lib>.pxi), named in `helpers`; the stubs name the argument types mpbind.typing defines.

STUB_TYPES = ("Dim3Like", "KernelArguments", "KernelLike")  # imported by a stub that uses them


class _LaunchInput(Input):
    """An argument converted by a support-file helper; never a typed Cython parameter (the helper
    sees the Python object)."""

    helpers: ClassVar[tuple[str, ...]] = ()


@role("kernel")
class Kernel(_LaunchInput):
    """A kernel passed as CUDA's `const void* func`: a CUkernel or CUfunction (cuda.bindings), an
    object whose `handle` is one (cuda.core's Kernel), or an int address; never NULL."""

    helpers = ("_launch_kernel",)

    @classmethod
    def applies(cls, p: Param) -> bool:
        return isinstance(p.type, Pointer)

    def stub_type(self) -> str:
        return "KernelLike"

    def guard(self) -> list[str]:
        return [f'cdef const void* _k_{self.n} = _launch_kernel({self.py}, "{self.py}")']

    def arg(self) -> str:
        return f"_k_{self.n}"


@role("dim3")
class Dim3(_LaunchInput):
    """A grid or block shape, CUDA's dim3 by value: an int n (n, 1, 1), a tuple or list of one to
    three extents (the missing ones 1, as dim3's constructor), or an object with x, y and z."""

    helpers = ("_launch_dim3",)

    @classmethod
    def applies(cls, p: Param) -> bool:
        return value_kind(p.type) == "struct"

    def stub_type(self) -> str:
        return "Dim3Like"

    def guard(self) -> list[str]:
        return [f'cdef {cy_type(resolve(self.p.type), drop_const=True)} _d3_{self.n} = '
                f'_launch_dim3({self.py}, "{self.py}")']

    def arg(self) -> str:
        return f"_d3_{self.n}"


@role("kernel_args")
class KernelArgs(_LaunchInput):
    """A kernel's arguments as CUDA's `void** kernelParams`: a tuple or list with the address of
    each argument's value (copied into a C array for the call), the int address of such an
    array, or None (NULL: a kernel without parameters)."""

    helpers = ("_launch_addresses", "_launch_params")

    def stub_type(self) -> str:
        return "KernelArguments"

    def guard(self) -> list[str]:
        # The addresses are checked here; the C array holding them is allocated by convert.
        return [f'_a_{self.n} = _launch_addresses({self.py}, "{self.py}")']

    def convert(self) -> list[str]:
        n = self.n
        return [f"cdef void** _kp_{n} = NULL", f"cdef void** _ka_{n} = NULL",
                f"_launch_params(_a_{n}, &_kp_{n}, &_ka_{n})"]

    def arg(self) -> str:
        return f"_kp_{self.n}"

    def cleanup(self) -> list[str]:
        return [f"PyMem_Free(_ka_{self.n})"]
