"""The deep sweep: each bad value in one argument slot while every other argument is valid.

A recipe is the source text of one valid call, ``callee(args)``, evaluated in the namespace of the
target's module (with the distributions, the value helpers of fuzz_values.py and ``instance``).
Its slots are read from the text: every argument, every element of a tuple, list or dict literal
among them (at any depth), and each optional parameter the signature has and the recipe leaves to
its default (added as a keyword). A slot whose text builds an array or stream object (``cai(...)``,
``dl(...)``, ``tup(...)``, ``stream(...)``, ... or anything wrapped in ``intake(...)``) is an
*intake*: a malformed value there (fuzz_values.Value.malformed) must be refused, and a call that
returns instead has *accepted* it. So has a call whose result fails when used (its public
properties, repr and array interface, those that worked for the valid call), or whose result a
check of :data:`CHECKS` finds impossible (an array description with a negative extent, or a size
or address past 64 bits).

Recipes are curated (:data:`RECIPES`, keyed by target id; private modules included: the core's
array and stream intake, its check runners ``mpbind._core._testing``, the FFT and matmul planners)
or derived: a public callable whose parameters all have defaults is called with none of them, and
a method on the instance fuzz_calls.RECIPES makes. Before the sweep each recipe is called once as
it is: one that returns is *valid*; one that stops at a library that needs a GPU (or cannot make
its instance) *needs GPU*, and its slots are still swept where it got an instance (the checks
before the library call run); a derived one that is refused is dropped. What a call returns that
owns a library resource must refuse copy.copy or give itself: a copy whose close() closes the
original shares the resource without saying so (a finding of the valid call or of the substituted
one).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fuzz_calls as calls_
import fuzz_values as values_
from fuzz_targets import CONSTRUCTOR, FUNCTION, METHOD, MODULES, STATIC, Param, Target, params_of

# Modules only the deep sweep calls (the core's intake and check runners, the planners).
PRIVATE_MODULES = ("mpbind._core", "mpbind._core._testing", "mpbind.fft._planner", "mpbind.matmul._planner")

# Target id -> recipes. `instance(<class id>)` is the instance fuzz_calls.RECIPES makes (once per
# child); without a GPU most cannot be made. `once(<source>)` is made once per child too: a unique
# id starts a bootstrap root (a thread and a socket) each time it is made. `fixed(<source>)` is not
# swept: what a check runner takes from the object it stands in for (a communicator's rank and size,
# a plan's type and layout) or a test's switch (array_info's `source`), not from a caller.
_COMM, _BUF = "instance('mpbind.nccl.Communicator')", "intake(instance('mpbind.nccl.Buffer'))"
_SYM = "intake(instance('mpbind.nvshmem.SymmetricArray'))"
_HEAP = "fixed(2), fixed(False), fixed([(PTR, 4096)])"  # two PEs, a symmetric heap of 4 KiB at PTR
_C64 = "code=5, bits=64"                                  # DLPack's complex64
_NOSOURCE = "'array', fixed(None)"
RECIPES: dict[str, tuple[str, ...]] = {
    # The core's intake: every path of array_info, the checked device_array, dtypes and streams.
    "mpbind._core.array_info": (
        f"array_info(dl(), {_NOSOURCE}, False)", "array_info(dl(legacy=True), 'array', fixed('dlpack'))",
        "array_info(cai(), 'array', 'interface')", f"array_info(tup(), {_NOSOURCE}, True)",
        f"array_info(torch_tensor(), {_NOSOURCE})", f"array_info(cupy_array(), {_NOSOURCE})",
        f"array_info(dl(exchange=True), {_NOSOURCE})"),
    "mpbind._core.device_array": ("device_array(dl(), 'x', 'float32', True, True)",
                                  "device_array(cai(shape=(4, 4)), 'x', 'float32', False, False)"),
    "mpbind._core.dtype_info": ("dtype_info('float32')",),
    "mpbind._core.stream_handle": ("stream_handle(stream())", "stream_handle(torch_stream(2))",
                                   "stream_handle(cupy_stream(2))", "stream_handle(stream_attr('cuda_stream', 2))"),
    "mpbind._core.dlpack_view": ("dlpack_view(PTR, [4, 4], 2, 32, 0, object())",),
    # The hot calls' checks, without the libraries.
    "mpbind._core._testing.nccl_plan": tuple(
        f"nccl_plan(fixed('{name}'), fixed(0), fixed(2), fixed(0), {send}, {recv}, 'sum', {peer}, stream())"
        for name, send, recv, peer in (
            ("all_reduce", "dl()", "dl()", None), ("reduce", "dl()", "dl()", 1), ("broadcast", "dl()", "dl()", 1),
            ("all_gather", "dl()", "dl((8,))", None), ("reduce_scatter", "dl((8,))", "dl()", None),
            ("all_to_all", "dl()", "dl()", None), ("send", "dl()", None, 1), ("recv", None, "dl()", 1))),
    "mpbind._core._testing.nvshmem_plan": tuple(
        f"nvshmem_plan(fixed('{name}'), {args}, {heap})" for name, args, heap in (
            ("put", "(dl(), dl(), 1, stream())", _HEAP), ("get", "(dl(), dl(), 1, stream())", _HEAP),
            ("broadcast", "(dl(), dl(), 1, None, stream())", _HEAP),
            ("fcollect", "(dl((8,)), dl(), None, stream())", _HEAP),
            ("alltoall", "(dl(), dl(), None, stream())", _HEAP),
            ("reduce", "('sum', dl(), dl(), None, stream())", _HEAP), ("quiet", "(stream(),)", "fixed(2)"),
            ("barrier", "(None, stream())", "fixed(2)"))),
    "mpbind._core._testing.cufftmp_exec": (
        f"cufftmp_exec(fixed(0x29), dl({_C64}), dl({_C64}), -1, fixed({{-1: ((4,), (4,))}}))",
        f"cufftmp_exec(fixed(0x2a), dl((8,)), dl((5,), {_C64}), None, fixed(None))",
        "cufftmp_exec(fixed(0x2a), dl((10,)), None, None, fixed({-1: ((8,), (5,))}))"),
    "mpbind._core._testing.cublasmp_operand": ("cublasmp_operand(dl((2, 2), strides=(1, 2)), 'a', fixed(2), fixed(2), "
                                               "fixed(2), fixed('float32'), False)",),
    # The planners' pure parts.
    "mpbind.fft._planner.plan_fft": ("plan_fft((8, 8, 8), 'complex64', 2)",
                                     "plan_fft((8, 8), 'float32', 2, kind='r2c')",
                                     "plan_fft((8, 8, 8), 'float64', 2, kind='r2c', algorithm='boxes')"),
    "mpbind.fft._planner.FFTSpec.input_side": ("plan_fft((8, 8, 8), 'complex64', 2).input_side(1)",),
    "mpbind.fft._planner.FFTSpec.buffer_bytes": ("plan_fft((8, 8, 8), 'complex64', 2).buffer_bytes(1)",),
    "mpbind.fft._planner.FFTSpec.distribution_boxes": ("plan_fft((8, 8, 8), 'complex64', 2).distribution_boxes(1)",),
    "mpbind.fft._planner.FFTSpec.explain": ("plan_fft((8, 8, 8), 'complex64', 2).explain(1)",),
    "mpbind.fft._planner.plan_reshape": ("plan_reshape(Split((8, 8, 8), 2), Split((8, 8, 8), 2, 1), 'complex64')",
                                      "plan_reshape(Split((8, 8), 2), Split((8, 8), 2, 1), 'float32', 4)"),
    "mpbind.fft._planner.ReshapeSpec.cufftmp_boxes": ("plan_reshape(Split((8, 8), 2), Split((8, 8), 2, 1), "
                                                   "'float32').cufftmp_boxes(1)",),
    "mpbind.matmul._planner.plan": (
        "plan(a=Split((8, 8), 2), b=Split((8, 8), 2), d=Split((8, 8), 2), a_dtype='float32')",
        "plan(a=Split((8, 8), 2, 1), b=Replicated((8, 8), 2), d=Split((8, 8), 2, 1), a_dtype='float32')"),
    "mpbind.matmul._planner.MatmulPlan.local_shapes": ("plan(a=Split((8, 8), 2), b=Split((8, 8), 2), "
                                                    "d=Split((8, 8), 2), a_dtype='float32').local_shapes(1)",),
    "mpbind.fft.DeviceView": ("DeviceView(PTR, (4, 4), (4, 1), 'float32', 0, 64, None)",),
    # The distributions: constructors, and methods with valid instances.
    "mpbind.distributions.Box": ("Box((0, 0), (4, 4))",),
    "mpbind.distributions.Box.contains": ("Box((0, 0), (4, 4)).contains((1, 1))",),
    "mpbind.distributions.Box.intersection": ("Box((0, 0), (4, 4)).intersection(Box((1, 1), (8, 8)))",),
    "mpbind.distributions.BlockCyclic": ("BlockCyclic((8, 8), (2, 2), (2, 2), (0, 0), 'col')",),
    "mpbind.distributions.BlockCyclic.owners": ("BlockCyclic((8, 8), (2, 2), (2, 2)).owners((3, 5))",),
    "mpbind.distributions.BlockCyclicArgs": ("BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, 'col')",),
    "mpbind.distributions.BlockCyclicArgs.rank_of": ("BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, 'col').rank_of(1, 1)",),
    "mpbind.distributions.BlockCyclicArgs.local_shape": ("BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, 'col')"
                                                          ".local_shape(3)",),
    "mpbind.distributions.Boxes": ("Boxes((4, 4), [((0, 0), (2, 4)), ((2, 0), (4, 4))])",),
    "mpbind.distributions.Boxes.exchange": ("Boxes.exchange((4, 4), Box((0, 0), (4, 4)), lambda box: [box])",),
    "mpbind.distributions.Boxes.owners": ("Boxes((4, 4), [((0, 0), (2, 4)), ((2, 0), (4, 4))]).owners((3, 1))",),
    "mpbind.distributions.Pencils": ("Pencils((4, 4, 4), (2, 2), (0, 1), None)",
                                     "Pencils((4, 4, 4), (2, 2), (1, 2), ((1, 3), (2, 2)))"),
    "mpbind.distributions.Pencils.box": ("Pencils((4, 4, 4), (2, 2)).box(3)",),
    "mpbind.distributions.Replicated": ("Replicated((4, 4), 2)",),
    "mpbind.distributions.Split": ("Split((4, 4), 2, 0, None)", "Split((8, 4), 2, 0, (3, 5))"),
    "mpbind.distributions.Split.blocked": ("Split.blocked((8, 8), 2, 1, 4)",),
    "mpbind.distributions.Split.boxes": ("Split((8, 4), 2, 0, (3, 5)).boxes(1)",),
    "mpbind.distributions.Split.local_shape": ("Split((8, 4), 2, 0, (3, 5)).local_shape(1)",),
    "mpbind.distributions.by_rows": ("by_rows((8, 4), 2, (3, 5))",),
    "mpbind.distributions.by_columns": ("by_columns((4, 8), 2, (3, 5))",),
    "mpbind.distributions.numroc": ("numroc(8, 2, 1, 0, 2)",),
    "mpbind.kernels.value": ("value('n', 'int32')",),
    "mpbind.kernels.pointer": ("pointer('p', 'float32')",),
    "mpbind.kernels.symmetric": ("symmetric('s', 'float32')",),
    # The flat bindings' calls that need no GPU.
    "mpbind.bindings.nccl.get_error_string": ("get_error_string(0)",),
    "mpbind.bindings.nccl.Config.from_ptr": ("Config.from_ptr(Config().ptr)",),
    "mpbind.bindings.nccl.UniqueId.from_ptr": ("UniqueId.from_ptr(once('get_unique_id()').ptr)",),
    "mpbind.bindings.nvshmem.set_attr_uniqueid_args": ("set_attr_uniqueid_args(0, 2, once('get_uniqueid()'), "
                                                       "InitAttr())",),
    "mpbind.bindings.cublasmp.get_status_string": ("get_status_string(0)",),
    # The hot calls themselves, with device memory: on a GPU.
    **{f"mpbind.nccl.Communicator.{name}": (f"{_COMM}.{name}({args}, intake(stream()))",) for name, args in (
        ("all_reduce", f"{_BUF}, {_BUF}, 'sum'"), ("reduce", f"{_BUF}, {_BUF}, 0, 'sum'"),
        ("broadcast", f"{_BUF}, {_BUF}, 0"), ("all_gather", f"{_BUF}, {_BUF}"), ("all_to_all", f"{_BUF}, {_BUF}"),
        ("reduce_scatter", f"{_BUF}, {_BUF}, 'sum'"))},
    "mpbind.nccl.Communicator.register": (f"{_COMM}.register({_BUF})",),
    "mpbind.nvshmem.put": (f"put({_SYM}, {_SYM}, 0, intake(stream()))",),
    "mpbind.nvshmem.get": (f"get({_SYM}, {_SYM}, 0, intake(stream()))",),
    "mpbind.nvshmem.register": (f"(instance('mpbind.nvshmem.Runtime'), register)[1]({_BUF})",),
    "mpbind.cufftmp.Reshape.create": ("(instance('mpbind.nvshmem.Runtime'), Reshape.create)[1](None, 'float32', "
                                      "((0, 0, 0), (4, 4, 4)), ((0, 0, 0), (4, 4, 4)))",),
}

def _description(info: tuple[Any, ...]) -> str | None:
    """Why an array description (array_info's tuple) cannot describe memory, or None: the kind of
    flaw, a colon, the details."""
    from mpbind import _core

    ptr, shape, strides, dtype = info[:4]
    if len(shape) != len(strides) or len(shape) > 64:
        return f"more than 64 extents, or as many strides: {len(shape)} extents, {len(strides)} strides"
    if any(n < 0 for n in shape):
        return f"a negative extent: {shape}"
    itemsize = _core.dtype_info(dtype)[1]
    elements = 1
    for n in shape:
        elements *= n
    if elements * itemsize >= 2**63:
        return f"2**63 bytes or more: {elements} elements of {itemsize} bytes"
    if elements and ptr + (sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True)) + 1) * itemsize > 2**64:
        return f"elements past 2**64: at {ptr:#x}, strides {strides}"
    return None


def _dlpack_view(view: Any) -> str | None:
    from mpbind import _core

    return _description(_core.array_info(view))


# Target id -> a check of what a call returned: why it cannot be (None: it can).
CHECKS: dict[str, Callable[[Any], str | None]] = {
    "mpbind._core.array_info": _description, "mpbind._core.device_array": _description,
    "mpbind._core.dlpack_view": _dlpack_view}

# Exceptions of a call that needs what this machine lacks: a GPU (its driver, an initialised
# runtime), or an optional package.
_GPU_ERRORS = ("LibraryNotFoundError", "FunctionNotFoundError", "LibraryError", "NVSHMEMNotInitializedError")
_PACKAGE_ERRORS = ("MissingDependencyError",)
# Buffer intakes (nccl.Communicator.register, register_window, nvshmem.register) take ``(ptr, nbytes)``
# as one of their documented forms (_interop.device_span): that pair is malformed as an array, not
# as a buffer, and what it points at is the library's to check (an address-like value).
BUFFER_TARGETS = frozenset({"mpbind.nccl.Communicator.register", "mpbind.nccl.Communicator.register_window",
                            "mpbind.nvshmem.register"})
BUFFER_PAIRS = frozenset({"(PTR, 4)"})
INTAKES = frozenset({"intake", "cai", "cai_device", "dl", "tup", "stream", "stream_attr", "torch_tensor",
                     "cupy_array", "torch_stream", "cupy_stream"})


class NoInstance(Exception):
    """instance() could not make the object a recipe calls or passes (no GPU)."""


@dataclass(frozen=True)
class Slot:
    name: str
    start: int      # where its text is in the recipe's arguments; an added keyword goes at `start`
    end: int
    intake: bool
    added: bool = False


@dataclass(frozen=True)
class Recipe:
    target: Target
    source: str                  # the valid call
    callee: str                  # the text before the call's parentheses
    args: str                    # the text between them
    slots: tuple[Slot, ...]
    curated: bool

    @property
    def instance(self) -> str | None:
        """The instance part of a method call's callee (made once per child), or None."""
        node = ast.parse(self.callee, mode="eval").body
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call):
            return ast.unparse(node.value)
        return None

    def arguments(self, slot: int, value: str) -> str:
        """The argument text with `value` in `slot` (-1: as the recipe has them)."""
        if slot < 0:
            return self.args
        s = self.slots[slot]
        if s.added:
            sep = ", " if self.args.strip() else ""
            return f"{self.args}{sep}{s.name}={value}"
        return self.args[:s.start] + value + self.args[s.end:]


def _module_of(target_id: str) -> tuple[str, str]:
    """(module, qualified name) of a target id: the longest importable prefix."""
    parts = target_id.split(".")
    for i in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:i])
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name, ".".join(parts[i:])
    raise ValueError(f"no module in {target_id}")


def recipe_modules() -> list[str]:
    """The modules of the curated recipes (without importing them), in RECIPES' order."""
    known = sorted(MODULES + PRIVATE_MODULES, key=len, reverse=True)
    return list(dict.fromkeys(next(m for m in known if t.startswith(m + ".")) for t in RECIPES))


def _private_target(target_id: str) -> Target:
    """A Target for a callable the public enumeration leaves out (a private module's)."""
    module, qualname = _module_of(target_id)
    owner, _, name = qualname.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not owner:
        return Target(module, None, name, CONSTRUCTOR if isinstance(obj, type) else FUNCTION,
                      params_of(obj, module, qualname, drop_first=False), "recipe")
    cls = getattr(importlib.import_module(module), owner)
    static = isinstance(cls.__dict__.get(name), (staticmethod, classmethod))
    return Target(module, owner, name, STATIC if static else METHOD,
                  params_of(obj, module, qualname, drop_first=not static), "recipe")


def _slots(call: ast.Call, args_at: int, params: tuple[Param, ...]) -> tuple[Slot, ...] | None:
    """The slots of `call`'s arguments (offsets from `args_at`); None when a required parameter of
    `params` is missing."""
    out: list[Slot] = []

    def visit(node: ast.expr, name: str) -> None:
        called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
        if called == "fixed":
            return
        intake = called in INTAKES
        out.append(Slot(name, node.col_offset - args_at, (node.end_col_offset or 0) - args_at, intake))
        if isinstance(node, (ast.Tuple, ast.List)):
            for i, element in enumerate(node.elts):
                visit(element, f"{name}[{i}]")
        elif isinstance(node, ast.Dict):
            for key, element in zip(node.keys, node.values, strict=True):
                visit(element, f"{name}[{ast.unparse(key) if key is not None else '**'}]")

    given = set()
    for i, arg in enumerate(call.args):
        name = params[i].name if i < len(params) else f"arg{i}"
        given.add(name)
        visit(arg, name)
    for kw in call.keywords:
        given.add(kw.arg or "**")
        visit(kw.value, kw.arg or "**")
    for p in params:
        if p.name in given:
            continue
        if not p.optional:
            return None
        out.append(Slot(p.name, 0, 0, False, added=True))
    return tuple(out)


def parse(target: Target, source: str, curated: bool) -> Recipe:
    call = ast.parse(source, mode="eval").body
    if not isinstance(call, ast.Call) or "\n" in source:
        raise ValueError(f"a recipe is one call on one line: {source}")
    args_at = (call.func.end_col_offset or 0) + 1
    slots = _slots(call, args_at, target.params)
    if slots is None:
        raise ValueError(f"{source} leaves out a required parameter of {target.id}")
    return Recipe(target, source, source[:args_at - 1], source[args_at:(call.end_col_offset or 0) - 1], slots, curated)


def _derived(target: Target) -> str | None:
    """A recipe from the signature: every parameter left to its default, on a curated instance."""
    if not target.params or not all(p.optional for p in target.params):
        return None
    if target.kind == FUNCTION:
        return f"{target.name}()"
    if target.kind == CONSTRUCTOR:
        return f"{target.owner}()"
    if target.kind == STATIC:
        return f"{target.owner}.{target.name}()"
    if target.kind == METHOD and calls_.RECIPES.get(f"{target.module}.{target.owner}"):
        return f"instance('{target.module}.{target.owner}').{target.name}()"
    return None


def recipes(targets: list[Target], modules: tuple[str, ...] | None = None) -> list[Recipe]:
    """The curated recipes of `modules` (all: None) and those derived for `targets`."""
    by_id = {t.id: t for t in targets}
    out: list[Recipe] = []
    for target_id, sources in RECIPES.items():
        if modules is not None and _module_of(target_id)[0] not in modules:
            continue
        target = by_id.get(target_id) or _private_target(target_id)
        out += [parse(target, s, curated=True) for s in sources]
    for t in targets:
        derived = None if t.id in RECIPES else _derived(t)
        if derived is not None:
            out.append(parse(t, derived, curated=False))
    return out


# --- in the child --------------------------------------------------------------------------------

def _identity(x: Any) -> Any:
    return x


class State:
    """A child's namespaces (one per module) and instances (made once, again once closed)."""

    def __init__(self) -> None:
        self.instances = calls_.Instances()
        self._namespaces: dict[str, dict[str, Any]] = {}
        self._made: dict[tuple[str, str], Any] = {}

    def made(self, module: str, source: str) -> Any:
        """What `source` makes in `module`'s namespace, once per child (again once closed)."""
        key = (module, source)
        obj = self._made.get(key)
        if obj is None or calls_.closed(obj):
            obj = self._made[key] = eval(source, self.namespace(module))  # our own recipes
        return obj

    def instance(self, class_id: str) -> Any:
        module, _ = _module_of(class_id)
        try:
            return self.instances.get(module, calls_.RECIPES[class_id][0])
        except Exception as exc:
            raise NoInstance(f"{class_id}: {type(exc).__name__}: {exc}") from exc

    def namespace(self, module: str) -> dict[str, Any]:
        ns = self._namespaces.get(module)
        if ns is None:
            distributions = importlib.import_module("mpbind.distributions")
            ns = {n: getattr(distributions, n) for n in distributions.__all__}
            ns.update(values_.NAMESPACE)
            ns.update(calls_.namespace(module))
            ns.update(instance=self.instance, intake=_identity, fixed=_identity,
                      once=functools.partial(self.made, module))
            ns = self._namespaces[module] = ns
        return ns


@functools.cache
def _member_names(cls: type) -> tuple[str, ...]:
    """Public properties of an mpbind class (and its mpbind bases)."""
    names = []
    for base in cls.__mro__:
        if (getattr(base, "__module__", "") or "").startswith("mpbind"):
            names += [n for n, v in vars(base).items() if not n.startswith("_") and
                      (isinstance(v, property) or type(v).__name__ in ("getset_descriptor", "member_descriptor"))]
    return tuple(dict.fromkeys(names))


def uses(result: Any) -> dict[str, Callable[[], Any]]:
    """What using a result means: its public properties, repr, and array interface where it has one."""
    cls = type(result)
    if not (getattr(cls, "__module__", "") or "").startswith("mpbind"):
        return {}
    out: dict[str, Callable[[], Any]] = {"repr": lambda: repr(result)}
    for name in _member_names(cls):
        out[name] = functools.partial(getattr, result, name)
    if hasattr(cls, "__cuda_array_interface__"):
        out["__cuda_array_interface__"] = lambda: result.__cuda_array_interface__
    return out


def sample_slots(recipe: Recipe, candidates: list[str]) -> list[tuple[int, str]]:
    """One value per slot (rotating through `candidates`, deterministic per recipe), and each
    sentinel in every intake slot."""
    start = zlib.crc32(recipe.source.encode())
    out = [(i, candidates[(start + i) % len(candidates)]) for i in range(len(recipe.slots))]
    sentinels = [v.source for v in values_.VALUES.values() if v.sentinel]
    out += [(i, v) for i, s in enumerate(recipe.slots) if s.intake for v in sentinels]
    return list(dict.fromkeys(out))


def lacks(exc: BaseException) -> str | None:
    """What a valid call that raised `exc` needs that this machine lacks: "GPU", "package" or None."""
    names = {c.__name__ for c in type(exc).__mro__}
    if isinstance(exc, NoInstance) or names & set(_GPU_ERRORS):
        return "GPU"
    return "package" if names & set(_PACKAGE_ERRORS) else None


@dataclass(frozen=True)
class DeepCall:
    """A recipe with the value `value` (a fuzz_values source) in slot `slot` (-1: the valid call)."""

    recipe: Recipe
    slot: int
    value: str
    uses: tuple[str, ...] = ()   # what of the result to use: what worked for the valid call

    @property
    def target(self) -> Target:
        return self.recipe.target

    @property
    def param(self) -> str | None:
        return None if self.slot < 0 else self.recipe.slots[self.slot].name

    @property
    def malformed_intake(self) -> bool:
        if self.value in BUFFER_PAIRS and self.target.id in BUFFER_TARGETS:
            return False
        return self.slot >= 0 and self.recipe.slots[self.slot].intake and values_.VALUES[self.value].malformed

    def render(self) -> str:
        return f"{self.recipe.callee}({self.recipe.arguments(self.slot, self.value)})"


def invoke(call: DeepCall, state: State) -> Any:
    r = call.recipe
    module = r.target.module
    ns = state.namespace(module)
    instance = r.instance
    if instance is None:
        fn = eval(r.callee, ns)  # our own recipes
    else:
        try:
            obj = state.made(module, instance)
        except Exception as exc:
            raise NoInstance(f"{instance}: {type(exc).__name__}: {exc}") from exc
        fn = getattr(obj, r.callee.rsplit(".", 1)[1])
    # The value is made apart (its source may name what the module names otherwise).
    ns["_callee_"], ns["_value_"] = fn, values_.make(call.value) if call.slot >= 0 else None
    return eval(f"_callee_({r.arguments(call.slot, '_value_')})", ns)  # our recipe


def judge(call: DeepCall, result: Any) -> tuple[str | None, tuple[str, Exception] | None]:
    """Of a call that returned: why it should have refused (None: it may return), and what using
    its result raised ((use, exception), or None)."""
    if call.malformed_intake:
        return "a malformed object in an intake slot", None
    check = CHECKS.get(call.target.id)
    try:
        why = check(result) if check is not None else None
    except Exception as exc:  # what it returned cannot even be described
        return None, ("description", exc)
    if why:
        return why, None
    why = copy_shares(result)
    if why:
        return why, None
    use = uses(result)
    for name in call.uses:
        if name in use:
            try:
                use[name]()
            except Exception as exc:
                return None, (name, exc)
    return None, None


def copy_shares(result: Any) -> str | None:
    """Why a copy.copy of an object that owns a library resource (mpbind's, with close() and closed)
    is wrong, or None: refused (TypeError, as deepcopy is) or the same object is right; a copy whose
    close() closes the original shares what it owns without saying so."""
    if not (getattr(type(result), "__module__", "") or "").startswith("mpbind") or not hasattr(result, "close"):
        return None
    if not hasattr(result, "closed") or calls_.closed(result):
        return None
    try:
        twin = copy.copy(result)
    except TypeError:
        return None
    if twin is result:
        return None
    twin.close()
    return "copy.copy shares what it owns: closing the copy closed the original" if calls_.closed(result) else None


def working_uses(result: Any) -> list[str]:
    """The uses of a valid call's result that work: those a substituted call's result must pass."""
    out = []
    for name, use in uses(result).items():
        try:
            use()
        except Exception:
            continue
        out.append(name)
    return out
