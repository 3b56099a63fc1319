"""What the plain sweep calls: one call per (target, argument slot, value), how a child process
makes it, which exceptions are acceptable, and which calls are left out by design.

Each argument slot of a target is given in turn each value of fuzz_values.py with every other
argument 0, and each target is also called with all arguments 0. Methods, getters and setters run
on an instance made by the first recipe of :data:`RECIPES` (or ``Class()`` / ``Class(0, ...)``)
that returns one; without an instance (most layer objects need a GPU) they are not run.
"""

from __future__ import annotations

import importlib
import zlib
from dataclasses import dataclass
from typing import Any

import fuzz_values as values_
from fuzz_targets import CONSTRUCTOR, FUNCTION, GETTER, METHOD, MODULES, STATIC, Target

# Besides mpbind.errors: what a refusal may raise. BufferError is what DLPack prescribes for an
# array that cannot be exported; fuzz_values.Raised is a hostile object's own error, passed on.
ACCEPTABLE_BUILTINS: tuple[type[BaseException], ...] = (TypeError, ValueError, OverflowError, BufferError,
                                                        values_.Raised)
ZERO = "0"
ALL_ZEROS = -1  # the slot of the call that passes 0 everywhere

# Calls that end the process or block by design. They are skipped unless asked for (--by-design);
# then they run like any other call (a block gets SIGINT when the call times out, which shows
# whether Ctrl-C interrupts it), and their outcomes are reported apart from the findings.
# Every other exit, signal or block is a finding.
#
# Targets: target id -> why.
BY_DESIGN: dict[str, str] = {
    "mpbind.bindings.nvshmem.global_exit":
        "nvshmem_global_exit(status) ends the process of every PE with `status` once NVSHMEM is initialised: "
        "that is its purpose (before init the bindings refuse it: NVSHMEMNotInitializedError)",
}
# Calls the bad values never make (they need a valid unique id): source -> why. They block only
# where the library can initialise (a GPU); elsewhere they fail at once.
BY_DESIGN_CALLS: dict[str, str] = {
    "mpbind.nvshmem.init(mpbind.bindings.nvshmem.get_uniqueid(), 0, 2)":
        "NVSHMEM's unique-id bootstrap waits for the other PE, which never comes, until the layer's deadline "
        "(MPBIND_TIMEOUT, 600 s by default; Ctrl-C interrupts it): longer than a call's timeout here",
    "mpbind.nccl.Communicator.init(2, 0, mpbind.nccl.get_unique_id())":
        "ncclCommInitRank waits for the other rank, which never comes, until the layer's deadline (Ctrl-C "
        "interrupts it): longer than a call's timeout here",
    "mpbind.bindings.nccl.comm_init_rank(2, mpbind.bindings.nccl.get_unique_id(), 0)":
        "the same wait through the flat bindings, which have no deadline: the library's call blocks where a "
        "signal does not reach it",
}

# Instances for methods, getters and setters: expressions evaluated in the class's public module
# (with `flat`, the library's flat bindings, and `mpbind`), tried in order before Class() and
# Class(0, ...). They need a GPU; without one they fail and the next is tried.
_NCCL_COMM = "Communicator.init(1, 0, get_unique_id())"
_NVSHMEM_RUNTIME = "init(flat.get_uniqueid(), 0, 1)"
RECIPES: dict[str, tuple[str, ...]] = {
    "mpbind.nccl.Communicator": (_NCCL_COMM,),
    "mpbind.nccl.Buffer": ("mem_alloc(256)",),
    "mpbind.nccl.Registration": (f"{_NCCL_COMM}.register(mem_alloc(256))",),
    "mpbind.nvshmem.Runtime": (_NVSHMEM_RUNTIME,),
    "mpbind.nvshmem.Team": (f"{_NVSHMEM_RUNTIME}.team_world",),
    "mpbind.nvshmem.SymmetricArray": (f"({_NVSHMEM_RUNTIME}, empty(4))[1]",),
    "mpbind.nvshmem.SymmetricMemory": (f"({_NVSHMEM_RUNTIME}, empty(4))[1].memory",),
    "mpbind.cublasmp.Grid": ("grid(mpbind.nccl.Communicator.init(1, 0, mpbind.nccl.get_unique_id()), 1, 1)",),
    # Values that refuse zeros: valid ones, so that their methods are called without a GPU.
    "mpbind.distributions.Box": ("Box((0, 0), (4, 4))",),
    "mpbind.distributions.BlockCyclicArgs": ('BlockCyclicArgs(8, 8, 2, 2, 0, 0, 2, 2, "col")',),
    "mpbind.distributions.BlockCyclic": ("BlockCyclic((8, 8), (2, 2), (2, 2))",),
    "mpbind.distributions.Boxes": ("Boxes((4, 4), [((0, 0), (2, 4)), ((2, 0), (4, 4))])",),
    "mpbind.distributions.Pencils": ("Pencils((4, 4, 4), (2, 2))",),
    "mpbind.distributions.Replicated": ("Replicated((4, 4), 2)",),
    "mpbind.distributions.Split": ("Split((4, 4), 2)",),
    "mpbind.kernels.Param": ('value("n", "int32")',),
    "mpbind.kernels.Cubin": ('Cubin(b"\\x7fELF", "k", "sm_90", ("k",), (), "0", False, "")',),
    # Called like a function (its __call__): on the runtime of one PE, made here unless one is.
    "mpbind.collective.AllGatherMatmul": (
        "(mpbind.nvshmem.is_initialized() or mpbind.nvshmem.init(mpbind.bindings.nvshmem.get_uniqueid(), 0, 1), "
        "AllGatherMatmul(8, 8, 8))[1]",),
}


def _mpbind() -> Any:
    """mpbind with every fuzzed module imported, so that source text may name them in full."""
    for name in MODULES:
        importlib.import_module(name)
    return importlib.import_module("mpbind")


def namespace(module: str) -> dict[str, Any]:
    """Names a recipe sees: the public module's, `flat` (the library's flat bindings) and `mpbind`."""
    public = importlib.import_module(module)
    ns = {name: getattr(public, name) for name in dir(public)}  # with the IntEnums made on first use
    library = module.rsplit(".", 1)[-1]
    if library in ("nccl", "nvshmem", "cublasmp", "cufftmp"):
        ns["flat"] = importlib.import_module(f"mpbind.bindings.{library}")
    ns["mpbind"] = _mpbind()
    return ns


def default_recipes(target: Target) -> tuple[str, ...]:
    """Recipes for instances of a constructor target's class, curated first."""
    assert target.kind == CONSTRUCTOR and target.owner is not None
    curated = RECIPES.get(target.id, ())
    zeros = f"{target.owner}({', '.join(_arg_texts(target, ALL_ZEROS, ZERO))})"
    return curated + tuple(dict.fromkeys((f"{target.owner}()", zeros)))


def _arg_texts(target: Target, slot: int, value: str) -> list[str]:
    texts = []
    for i, p in enumerate(target.params):
        text = value if i == slot else ZERO
        texts.append(f"{p.name}={text}" if p.keyword_only else text)
    return texts


@dataclass(frozen=True)
class Call:
    """One call: `target` with `value` in argument `slot` and 0 elsewhere (slot -1: all 0)."""

    target: Target
    slot: int
    value: str
    recipe: str | None = None   # how the instance is made (methods, getters, setters)

    @property
    def param(self) -> str | None:
        return None if self.slot == ALL_ZEROS else self.target.params[self.slot].name

    def render(self) -> str:
        t = self.target
        args = ", ".join(_arg_texts(t, self.slot, self.value))
        where = t.module + "."
        if t.kind == FUNCTION:
            return f"{where}{t.name}({args})"
        if t.kind == CONSTRUCTOR:
            return f"{where}{t.owner}({args})"
        if t.kind == STATIC:
            return f"{where}{t.owner}.{t.name}({args})"
        inst = f"{where}{self.recipe}"
        if t.kind == METHOD:
            return f"{inst}.{t.name}({args})"
        if t.kind == GETTER:
            return f"{inst}.{t.name}"
        return f"{inst}.{t.name} = {self.value if self.slot == 0 else ZERO}"

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for i, p in enumerate(self.target.params):
            v = values_.make(self.value) if i == self.slot else 0
            if p.keyword_only:
                kwargs[p.name] = v
            else:
                args.append(v)
        return args, kwargs


@dataclass(frozen=True)
class Scenario:
    """A call of BY_DESIGN_CALLS, written out in full."""

    source: str
    why: str

    def render(self) -> str:
        return self.source


class Instances:
    """The instance each class's recipe makes, one per child process, made again once closed."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str], Any] = {}

    def get(self, module: str, recipe: str) -> Any:
        key = (module, recipe)
        obj = self._made.get(key)
        if obj is None or closed(obj):
            obj = self._made[key] = eval(recipe, namespace(module))  # our own recipes
        return obj


def closed(obj: Any) -> bool:
    try:
        return bool(getattr(obj, "closed", False))
    except Exception:
        return False


def acceptable(exc: BaseException) -> bool:
    from mpbind.errors import MpbindError

    return isinstance(exc, (MpbindError, *ACCEPTABLE_BUILTINS))


def invoke(call: Call | Scenario, instances: Instances) -> Any:
    """Make the call (in the child process)."""
    if isinstance(call, Scenario):
        return eval(call.source, {"mpbind": _mpbind()})  # our own list
    t = call.target
    module = importlib.import_module(t.module)
    args, kwargs = call.arguments()
    if t.kind == FUNCTION:
        return getattr(module, t.name)(*args, **kwargs)
    cls = getattr(module, t.owner or "")
    if t.kind == CONSTRUCTOR:
        return cls(*args, **kwargs)
    if t.kind == STATIC:
        return getattr(cls, t.name)(*args, **kwargs)
    assert call.recipe is not None
    obj = instances.get(t.module, call.recipe)
    if t.kind == METHOD:
        return getattr(obj, t.name)(*args, **kwargs)
    if t.kind == GETTER:
        return getattr(obj, t.name)
    setattr(obj, t.name, args[0])
    return None


def full(target: Target, recipe: str | None = None, values: tuple[str, ...] = tuple(values_.VALUES)) -> list[Call]:
    """Every value in every slot (but address-like ones where raw addresses are taken), then the
    all-zeros call."""
    values = tuple(values_.values_for(target.module, target.name, values))
    calls = [Call(target, slot, value, recipe) for slot in range(len(target.params)) for value in values]
    return calls + [Call(target, ALL_ZEROS, ZERO, recipe)]


def sample_targets(targets: list[Target], per_family: int = 3) -> list[Target]:
    """Every target, but of each family of per-type variants (generated from one template) only
    `per_family`, chosen deterministically: a sample that runs in seconds, not minutes."""
    families: dict[str, list[Target]] = {}
    for t in targets:
        if t.family is not None:
            families.setdefault(f"{t.module}.{t.family}", []).append(t)
    keep = set()
    for family, members in families.items():
        start = zlib.crc32(family.encode())
        step = max(1, len(members) // per_family)
        keep |= {members[(start + i * step) % len(members)].id for i in range(min(per_family, len(members)))}
    return [t for t in targets if t.family is None or t.id in keep]


def sample_values() -> list[str]:
    """The values the sample rotates through: all but the slow ones."""
    return [s for s, v in values_.VALUES.items() if not v.slow]


def sample(target: Target, recipe: str | None = None) -> list[Call]:
    """One value per slot (rotating through the values, deterministic per target), and all zeros."""
    values = values_.values_for(target.module, target.name, sample_values())
    start = zlib.crc32(target.id.encode())
    calls = [Call(target, slot, values[(start + slot) % len(values)], recipe) for slot in range(len(target.params))]
    return calls + [Call(target, ALL_ZEROS, ZERO, recipe)]
