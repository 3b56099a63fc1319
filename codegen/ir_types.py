"""The IR as typed objects: what every emitter reads.

`codegen/ir/<lib>.json` is the IR's serialised form (assembled by model.build_ir from the
parsed headers and the spec, reviewed in diffs). `Library.from_json` reads it into the frozen
dataclasses below; a key this module does not know is an error, so the schema lives here.
Emitters never index the JSON themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, TypeVar

Json = Mapping[str, Any]
T = TypeVar("T")


def _build(cls: type[T], d: Json, **converted: Any) -> T:
    """cls(**d) with `converted` replacing raw JSON values; unknown keys are an error."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown IR keys {unknown} in {dict(d)}")
    return cls(**{**d, **converted})


# -- C types ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Builtin:
    """A C builtin or standard typedef (int, size_t, ...); `as_` names the type the spec
    passes as this builtin (CUDA's __half as unsigned short)."""

    kind: ClassVar[str] = "builtin"
    name: str
    const: bool = False
    as_: str | None = None


@dataclass(frozen=True)
class Alias:
    """A typedef the library declares (ncclDataType_t is an enum, this is for the rest)."""

    kind: ClassVar[str] = "alias"
    name: str
    target: CType
    const: bool = False


@dataclass(frozen=True)
class Pointer:
    kind: ClassVar[str] = "pointer"
    pointee: CType
    const: bool = False


@dataclass(frozen=True)
class Array:
    kind: ClassVar[str] = "array"
    element: CType
    length: int
    const: bool = False


@dataclass(frozen=True)
class _Named:
    name: str
    const: bool = False


class EnumType(_Named):
    kind: ClassVar[str] = "enum"


class StructType(_Named):
    kind: ClassVar[str] = "struct"


class HandleType(_Named):
    """An opaque pointer the library hands out (ncclComm_t) or takes from CUDA (cudaStream_t)."""

    kind: ClassVar[str] = "handle"


CType = Builtin | Alias | Pointer | Array | EnumType | StructType | HandleType

_NAMED: dict[str, type[EnumType] | type[StructType] | type[HandleType]] = {
    "enum": EnumType, "struct": StructType, "handle": HandleType,
}


def ctype(d: Json) -> CType:
    """The typed form of an IR type ({"kind": "pointer", "pointee": {...}} -> Pointer(...))."""
    rest = {k: v for k, v in d.items() if k != "kind"}
    kind = d["kind"]
    if kind == "builtin":
        if "as" in rest:
            rest["as_"] = rest.pop("as")
        return _build(Builtin, rest)
    if kind == "alias":
        return _build(Alias, rest, target=ctype(d["target"]))
    if kind == "pointer":
        return _build(Pointer, rest, pointee=ctype(d["pointee"]))
    if kind == "array":
        return _build(Array, rest, element=ctype(d["element"]))
    if kind in _NAMED:
        return _build(_NAMED[kind], rest)
    raise ValueError(f"unknown IR type kind {kind!r}")


def resolve(t: CType) -> CType:
    """Follow typedef aliases down to what they name."""
    while isinstance(t, Alias):
        t = t.target
    return t


def is_void(t: CType) -> bool:
    return isinstance(t, Builtin) and t.name == "void"


def is_char_ptr(t: CType) -> bool:
    return isinstance(t, Pointer) and isinstance(t.pointee, Builtin) and t.pointee.name == "char"


def walk(t: CType) -> list[CType]:
    """t and every type inside it (pointees, elements, alias targets), outermost first."""
    out: list[CType] = [t]
    if isinstance(t, Pointer):
        out += walk(t.pointee)
    elif isinstance(t, Array):
        out += walk(t.element)
    elif isinstance(t, Alias):
        out += walk(t.target)
    return out


# -- declarations ---------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """A C parameter and, for a bound function, how Python passes it (its role, see roles.py)."""

    name: str
    type: CType
    role: str | None = None  # None in an excluded function
    python: str | None = None
    nullable: bool = False  # None passes NULL
    struct: str | None = None  # a pointer to this struct, passed as its class
    address: bool = False  # a pointer passed as an int address (not a string or struct)
    length: str | None = None  # the parameter holding this array's element count
    explicit_length: bool = False  # ... which Python passes too (checked against the sequence)
    length_of: str | None = None  # a length derived from this array parameter
    capacity: str | None = None  # the parameter holding this buffer's size
    capacity_constant: str | None = None  # the constant holding this buffer's size
    length_out: str | None = None  # the output parameter the call writes the filled length to
    keeps: tuple[str, ...] = ()  # parameters whose data this struct points into after the call
    convert: str | None = None  # _convert_<name> turns the Python value into the C value
    pytype: str | None = None  # the type the stub shows, where the C type does not say
    non_null: bool = False  # a handle the library dereferences unchecked: 0 is refused
    minimum: int | None = None  # an int the library divides by, or fails on, below this: refused

    @classmethod
    def from_json(cls, d: Json) -> Param:
        return _build(cls, d, type=ctype(d["type"]), keeps=tuple(d.get("keeps", ())))


@dataclass(frozen=True)
class InlineBody:
    """A static inline function of the header, defined in the library's support file."""

    uses: str  # the exported entry point it calls (its `since`)
    signature: str  # the Python signature the stub shows
    python: str | None = None


@dataclass(frozen=True)
class Function:
    name: str
    header: str
    returns: CType
    params: tuple[Param, ...]
    inline: bool
    device_only: bool
    deprecated: bool
    excluded: str | None = None  # why it is not bound
    since: str | None = None
    python: str | None = None
    gil: str | None = None  # "keep" or "release"
    success: tuple[str, ...] | None = None  # statuses that mean success; None: not a status
    null_error: tuple[str, ...] = ()  # a NULL return is an error unless these are all 0
    inline_body: InlineBody | None = None
    needs_init: str | None = None  # the init status (Library.init_check) the call needs; None: any

    @classmethod
    def from_json(cls, d: Json) -> Function:
        success = d.get("success")
        return _build(
            cls, d, returns=ctype(d["returns"]), params=tuple(Param.from_json(p) for p in d["params"]),
            success=None if success is None else tuple(success), null_error=tuple(d.get("null_error", ())),
            inline_body=_build(InlineBody, d["inline_body"]) if "inline_body" in d else None)

    @property
    def returns_status(self) -> bool:
        return self.success is not None

    @property
    def releases_gil(self) -> bool:
        return self.gil == "release"

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


@dataclass(frozen=True)
class Member:
    c: str
    python: str
    value: int


@dataclass(frozen=True)
class Enum:
    name: str
    header: str
    values: tuple[tuple[str, int], ...]
    underlying: str
    python: str
    members: tuple[Member, ...]
    value_types: Mapping[str, str] = field(default_factory=dict)  # member -> C type of its attribute

    @classmethod
    def from_json(cls, d: Json) -> Enum:
        return _build(cls, d, values=tuple((c, v) for c, v in d["values"]),
                      members=tuple(Member(c, py, v) for c, py, v in d["members"]))

    def value_of(self, c_name: str) -> int:
        return next(m.value for m in self.members if m.c == c_name)


@dataclass(frozen=True)
class Field:
    name: str
    type: CType
    offset: int


@dataclass(frozen=True)
class Initializer:
    macro: str
    image: str  # hex of the bytes the *_INITIALIZER macro lays out


@dataclass(frozen=True)
class Struct:
    name: str
    header: str
    size: int
    align: int
    python: str
    fields: tuple[Field, ...] | None = None  # None: opaque
    opaque: str | None = None  # why its fields are not exposed
    initializer: Initializer | None = None
    kind: str | None = None  # "bytes": an opaque bytes-like value (a unique id)
    expose: bool = False  # emitted even though no function signature names it

    @classmethod
    def from_json(cls, d: Json) -> Struct:
        fields = d.get("fields")
        return _build(
            cls, d, fields=None if fields is None else tuple(_build(Field, f, type=ctype(f["type"])) for f in fields),
            initializer=_build(Initializer, d["initializer"]) if "initializer" in d else None)

    @property
    def is_bytes(self) -> bool:
        return self.kind == "bytes"

    @property
    def field_list(self) -> tuple[Field, ...]:
        return self.fields or ()

    def internal_fields(self) -> set[str]:
        """Fields users never set: the size/magic/version header of NCCL-style versioned structs."""
        names = {f.name for f in self.field_list}
        return {"size", "magic", "version"} if self.initializer and {"size", "magic"} <= names else set()


@dataclass(frozen=True)
class Constant:
    name: str
    header: str
    value: int | float


@dataclass(frozen=True)
class Status:
    """The library's status enum and what the spec says about it."""

    type: str
    enum: str
    success: tuple[str, ...]
    not_errors: tuple[str, ...]
    error_base: str
    error_prefix: str
    in_progress: str | None = None
    in_progress_handle: str | None = None
    in_progress_functions: tuple[str, ...] = ()
    error_string: str | None = None  # the library's string for a status
    last_error: str | None = None  # the library's last error message
    log_hint: str = ""
    int_values: tuple[str, ...] | None = None
    null_status: str | None = None  # the status a NULL return means
    null_error: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Json) -> Status:
        tuples = {k: tuple(d[k]) for k in ("success", "not_errors", "in_progress_functions", "int_values") if k in d}
        return _build(cls, d, **tuples, null_error={k: tuple(v) for k, v in d.get("null_error", {}).items()})


@dataclass(frozen=True)
class InitCheck:
    """How a call learns whether the library's runtime is initialised: `function` returns a value
    of `enum`; a function needing status S (Function.needs_init) raises `error` below S."""

    function: str
    enum: str
    error: str


@dataclass(frozen=True)
class VersionFunction:
    function: str
    format: str  # "triple": void f(int*, int*, int*); else status f(int* code)


@dataclass(frozen=True)
class Family:
    """Per-type functions <prefix>_<type>_<op> dispatched by one <op>(dtype, ...)."""

    python: str
    members: Mapping[str, str]  # type name -> C function


@dataclass(frozen=True)
class TypedAttribute:
    """Typed <python>_set/_get over a library's untyped attribute setter and getter."""

    python: str
    set: str
    get: str


@dataclass(frozen=True)
class UndeclaredExport:
    """A function the library exports that no parsed header declares."""

    name: str
    header: str | None  # the header whose text declares it (not parsed for the host), or None
    excluded: str  # why it is not bound


@dataclass(frozen=True)
class Library:
    """One library's IR, with the lookups emitters need."""

    format: int
    library: str
    pretty: str
    prefix: str
    wheel: str
    version: str
    headers: Mapping[str, str]
    status: Status
    version_function: VersionFunction
    handles: Mapping[str, str]  # C handle type -> Python NewType name
    handle_tags: Mapping[str, str]  # C handle type -> the struct tag it points to
    foreign_handles: Mapping[str, str]
    aliases: Mapping[str, CType]
    enums: Mapping[str, Enum]  # by C name, in IR order
    structs: Mapping[str, Struct]  # by C name, in IR order
    constants: tuple[Constant, ...]
    functions: tuple[Function, ...]
    families: tuple[Family, ...]
    support: str  # the hand-written file the Python module includes (_support/<lib>.pxi beside it), or ""
    typed_attributes: Mapping[str, TypedAttribute]  # by attribute enum
    prefixes: tuple[str, ...]
    family_types: Mapping[str, str]  # family type name -> NumPy dtype name
    exports: frozenset[str] = frozenset()  # the functions (with a library prefix) the library exports
    undeclared: tuple[UndeclaredExport, ...] = ()  # exported, but declared in no parsed header
    headers_digest: str = ""
    init_check: InitCheck | None = None

    @classmethod
    def from_json(cls, d: Json) -> Library:
        return _build(
            cls, d,
            init_check=_build(InitCheck, d["init_check"]) if "init_check" in d else None,
            status=Status.from_json(d["status"]),
            version_function=_build(VersionFunction, d["version_function"]),
            aliases={n: ctype(t) for n, t in d["aliases"].items()},
            enums={e["name"]: Enum.from_json(e) for e in d["enums"]},
            structs={s["name"]: Struct.from_json(s) for s in d["structs"]},
            constants=tuple(_build(Constant, c) for c in d["constants"]),
            functions=tuple(Function.from_json(f) for f in d["functions"]),
            families=tuple(_build(Family, f) for f in d["families"]),
            typed_attributes={n: _build(TypedAttribute, a) for n, a in d["typed_attributes"].items()},
            prefixes=tuple(d["prefixes"]),
            exports=frozenset(d.get("exports", ())),
            undeclared=tuple(_build(UndeclaredExport, u) for u in d.get("undeclared", ())))

    # -- lookups --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.library

    @property
    def source(self) -> str:
        """What a file generated from this IR names as its source."""
        return f"codegen/ir/{self.library}.json ({self.pretty} {self.version})"

    @property
    def bound(self) -> tuple[Function, ...]:
        return tuple(f for f in self.functions if f.excluded is None)

    @property
    def symbols(self) -> tuple[Function, ...]:
        """Bound functions with a library symbol (static inline ones are reproduced in Python)."""
        return tuple(f for f in self.bound if f.inline_body is None)

    @property
    def status_enum(self) -> Enum:
        return self.enums[self.status.type]

    @cached_property
    def _functions_by_name(self) -> dict[str, Function]:
        return {f.name: f for f in self.functions}

    def function(self, name: str) -> Function:
        return self._functions_by_name[name]

    def constant(self, name: str) -> Constant:
        return next(c for c in self.constants if c.name == name)

    def reachable_types(self) -> tuple[list[str], list[str], list[str]]:
        """Structs, aliases and handles that bound functions need, in dependency order."""
        structs: list[str] = []
        aliases: list[str] = []
        handles: set[str] = set()
        seen: set[str] = set()

        def visit(t: CType) -> None:
            if isinstance(t, Pointer):
                visit(t.pointee)
            elif isinstance(t, Array):
                visit(t.element)
            elif isinstance(t, Alias):
                if t.name not in aliases:
                    visit(t.target)
                    aliases.append(t.name)
            elif isinstance(t, HandleType):
                handles.add(t.name)
            elif isinstance(t, StructType) and t.name not in seen:
                seen.add(t.name)
                if t.name not in self.structs:
                    raise KeyError(f"struct {t.name} is used but was not parsed")
                for f in self.structs[t.name].field_list:
                    visit(f.type)
                structs.append(t.name)

        for f in self.bound:
            visit(f.returns)
            for p in f.params:
                visit(p.type)
        for s in self.structs.values():
            if s.expose:
                visit(StructType(s.name))
        return structs, aliases, sorted(handles)
