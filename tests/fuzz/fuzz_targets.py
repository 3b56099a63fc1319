"""Every public callable of mpbind's two layers, with its parameters.

A target is one thing the fuzzer calls: a module function, a class's constructor, a static
or class method, an instance method, a property getter or a property setter. Parameters
come from ``inspect.signature`` (Cython builds with ``binding=True`` and ``embedsignature``)
and, where that finds none (Cython class constructors, nanobind functions), from the
``.pyi`` stub of the module that defines the object (found by ``_stub_path`` alone: beside the
module, or in the repository's ``stubs/``), else from nanobind's own signature text.
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mpbind

# The public modules (mpbind._PUBLIC_MODULES, the one list) that export something to call: not the
# package that only holds the flat modules, the exception classes, nor the types for annotations.
NOT_CALLED = ("bindings", "errors", "typing")
# A module whose optional package is missing is left out (mpbind._OPTIONAL_MODULES: importing it raises
# MissingDependencyError, as it should).
_CALLED = [m for m in mpbind._PUBLIC_MODULES if m not in NOT_CALLED
           and importlib.util.find_spec(mpbind._OPTIONAL_MODULES.get(m, "mpbind")) is not None]
# The flat bindings, then the Pythonic layer (the package's own functions first).
MODULES: tuple[str, ...] = (
    *(f"mpbind.{m}" for m in _CALLED if m.startswith("bindings.")),
    "mpbind",
    *(f"mpbind.{m}" for m in _CALLED if not m.startswith("bindings.")),
)

# How a target is called (see Call in fuzz_calls.py).
FUNCTION, CONSTRUCTOR, STATIC, METHOD, GETTER, SETTER = (
    "function", "constructor", "static", "method", "getter", "setter")


@dataclass(frozen=True)
class Param:
    name: str
    keyword_only: bool = False
    optional: bool = False      # has a default (the deep sweep leaves it out of a valid call)


@dataclass(frozen=True)
class Target:
    module: str                 # the public module it is reached from
    owner: str | None           # public class name in `module` (members and constructors)
    name: str                   # function, member or class name
    kind: str
    params: tuple[Param, ...]
    signature: str              # where the parameters came from: inspect | stub | nanobind | fixed | recipe | none
    family: str | None = None   # per-type variants (NVSHMEM's float_put, ...): the family (put)

    @property
    def id(self) -> str:
        qual = self.name if self.owner is None or self.kind == CONSTRUCTOR else f"{self.owner}.{self.name}"
        return f"{self.module}.{qual}" + ("=" if self.kind == SETTER else "")

    @property
    def needs_instance(self) -> bool:
        return self.kind in (METHOD, GETTER, SETTER)


# --- parameters ------------------------------------------------------------------------------

def _from_signature(sig: inspect.Signature, drop_first: bool) -> tuple[Param, ...] | None:
    params = list(sig.parameters.values())
    if drop_first and params:
        params = params[1:]
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    star = [p for p in params if p.kind == p.VAR_POSITIONAL]
    if not named and star:
        if any(p.kind == p.VAR_KEYWORD for p in params):
            return None  # (*args, **kwargs): a slot wrapper, not the real signature
        return (Param(star[0].name, optional=True),)  # f(*names): one argument slot
    return tuple(Param(p.name, p.kind == p.KEYWORD_ONLY, p.default is not p.empty) for p in named)


def _from_ast(args: ast.arguments, drop_first: bool) -> tuple[Param, ...]:
    positional = args.posonlyargs + args.args
    # defaults belong to the last positional parameters; kw_defaults has None for required ones
    first_default = len(positional) - len(args.defaults)
    out = [Param(a.arg, optional=i >= first_default) for i, a in enumerate(positional)]
    if drop_first and out:
        out = out[1:]
    keyword = zip(args.kwonlyargs, args.kw_defaults, strict=True)
    return tuple(out) + tuple(Param(a.arg, True, d is not None) for a, d in keyword)


def _from_nanobind(obj: Any, drop_first: bool) -> tuple[Param, ...] | None:
    """Parameters from a nanobind function's own signature text (``__nb_signature__``), for
    functions no stub covers (mpbind._core._testing)."""
    try:
        text = obj.__nb_signature__[0][0]  # "def f(x: int = \\0) -> T": defaults are \\<n> placeholders
        node = ast.parse(text.replace("\\", "") + ": ...").body[0]
    except (AttributeError, IndexError, TypeError, SyntaxError):
        return None
    return _from_ast(node.args, drop_first) if isinstance(node, ast.FunctionDef) else None


# The repository's stubs of the flat bindings, for a run from the source tree (an installed
# package has them beside its modules).
_REPO_STUBS = Path(__file__).resolve().parents[2] / "stubs"


def _stub_path(module: str) -> Path | None:
    """The .pyi of `module`: beside the module (installed, or in the source tree), else in the
    repository's stubs/. Every stub is found here (nanobind submodules have no __file__)."""
    top, _, rest = module.partition(".")
    beside = Path(importlib.import_module(top).__file__ or "").parent.joinpath(*rest.split("."))
    for base in (beside, _REPO_STUBS.joinpath(*module.split("."))):
        for pyi in (base.with_suffix(".pyi"), base / "__init__.pyi"):
            if pyi.is_file():
                return pyi
    return None


@functools.cache
def _stub(module: str) -> dict[str, list[tuple[Param, ...]]]:
    """`qualname -> parameters of each overload` in the stub of `module` (self and cls left out)."""
    pyi = _stub_path(module)
    if pyi is None:
        return {}
    index: dict[str, list[tuple[Param, ...]]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                key = prefix + node.name + ("=" if any(d.endswith(".setter") for d in decorators) else "")
                bound = bool(prefix) and "staticmethod" not in decorators
                index.setdefault(key, []).append(_from_ast(node.args, drop_first=bound))

    visit(ast.parse(pyi.read_text()).body, "")
    return index


def _stub_params(defining_module: str, qualname: str) -> tuple[Param, ...] | None:
    overloads = _stub(defining_module).get(qualname)
    if not overloads:
        return None
    return max(overloads, key=len)  # several overloads (nanobind): fuzz the widest


def _params(obj: Any, defining_module: str, qualname: str, drop_first: bool) -> tuple[tuple[Param, ...], str]:
    """Parameters of `obj` and where they came from; `drop_first`: its signature starts with self."""
    try:
        found = _from_signature(inspect.signature(obj), drop_first)
    except (TypeError, ValueError):
        found = None
    if found is not None:
        return found, "inspect"
    found = _stub_params(defining_module, qualname)
    if found is not None:
        return found, "stub"
    found = _from_nanobind(obj, drop_first)
    if found is not None:
        return found, "nanobind"
    return (), "none"


def params_of(obj: Any, defining_module: str, qualname: str, drop_first: bool) -> tuple[Param, ...]:
    return _params(obj, defining_module, qualname, drop_first)[0]


# --- enumeration ------------------------------------------------------------------------------

def public_names(module: Any) -> list[str]:
    """`__all__`, or else the callables the module itself defines under a public name."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return sorted(names)
    # dir(), not vars(): the flat bindings make their IntEnums on first use (a module __getattr__).
    return sorted(
        n for n in dir(module)
        if not n.startswith("_") and callable(v := getattr(module, n))
        and getattr(v, "__module__", None) == module.__name__
    )


# Special methods a caller calls by name or syntax with arguments of its own: instances that are
# called (AllGatherMatmul) are public callables too.
CALLED_SPECIALS = ("__call__",)


def _own_members(cls: type) -> dict[str, Any]:
    """Public members defined by the class or its mpbind bases, nearest first (not int's, Enum's...)."""
    members: dict[str, Any] = {}
    for base in cls.__mro__:
        if not (getattr(base, "__module__", "") or "").startswith("mpbind"):
            continue
        for name, value in vars(base).items():
            if not name.startswith("_") or name in CALLED_SPECIALS:
                members.setdefault(name, (base, value))
    return members


def _settable(cls_module: str, qualname: str, descriptor: Any) -> bool:
    if isinstance(descriptor, property):  # Python and nanobind properties
        return descriptor.fset is not None
    return f"{qualname}=" in _stub(cls_module)  # Cython getset descriptors: the stub's @x.setter


def _class_targets(module: str, public: str, cls: type) -> list[Target]:
    out: list[Target] = []
    if issubclass(cls, enum.Enum):
        # Enum(value): the functional API's other parameters are the standard library's.
        return [Target(module, public, public, CONSTRUCTOR, (Param("value"),), "fixed")]
    # inspect.signature(cls) leaves self out already.
    params, source = _params(cls, cls.__module__, f"{cls.__qualname__}.__init__", drop_first=False)
    out.append(Target(module, public, public, CONSTRUCTOR, params, source))
    for name, (base, value) in sorted(_own_members(cls).items()):
        qualname = f"{base.__qualname__}.{name}"
        kind_name = type(value).__name__
        if isinstance(value, (staticmethod, classmethod)) or kind_name == "nb_func":
            params, source = _params(getattr(cls, name), base.__module__, qualname, drop_first=False)
            out.append(Target(module, public, name, STATIC, params, source))
        elif isinstance(value, property) or kind_name in ("getset_descriptor", "member_descriptor"):
            out.append(Target(module, public, name, GETTER, (), "fixed"))
            if _settable(base.__module__, qualname, value):
                out.append(Target(module, public, name, SETTER, (Param("value"),), "fixed"))
        elif callable(value) and not isinstance(value, type):
            params, source = _params(value, base.__module__, qualname, drop_first=True)
            out.append(Target(module, public, name, METHOD, params, source))
    return out


def targets(modules: tuple[str, ...] = MODULES) -> list[Target]:
    """Every public callable of `modules`, in a stable order."""
    out: list[Target] = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        for public in public_names(module):
            obj = getattr(module, public)
            if isinstance(obj, type):
                out.extend(_class_targets(module_name, public, obj))
            elif callable(obj) and not inspect.ismodule(obj):
                defining = getattr(obj, "__module__", None) or module_name
                if type(obj).__name__ == "NewType":
                    out.append(Target(module_name, None, public, FUNCTION, (Param("x"),), "fixed"))
                    continue
                params, source = _params(obj, defining, getattr(obj, "__qualname__", public), drop_first=False)
                out.append(Target(module_name, None, public, FUNCTION, params, source, _family(module, public)))
    return out


def _family(module: Any, name: str) -> str | None:
    """`put` for `float_put` in a module whose FAMILY_TYPES names the element types of its families."""
    for type_name in getattr(module, "FAMILY_TYPES", ()):
        if name.startswith(type_name + "_"):
            return name[len(type_name) + 1:]
    return None
