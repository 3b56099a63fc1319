"""The API reference pages, one per public module (``mpbind._PUBLIC_MODULES``), written from the installed
package: every public name gets an autodoc entry, so nothing is copied by hand and nothing is left out.

A hand-written module's public names are its ``__all__``; a generated flat module (``bindings.<lib>``) has
none, and its public names are those its ``dir()`` lists without a leading underscore (the generator's,
which tests/flat/test_stubs.py checks against the stubs).
"""

from __future__ import annotations

import enum
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import mpbind

FLAT_PREFIX = "bindings."


@dataclass
class ModulePage:
    """What one module's page documents, by kind; `missing` names the extra an optional module needs
    when its package is not installed here."""

    name: str
    classes: list[str] = field(default_factory=list)
    enums: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    data: list[str] = field(default_factory=list)
    missing: str | None = None

    @property
    def dotted(self) -> str:
        return f"mpbind.{self.name}" if self.name else "mpbind"

    @property
    def flat(self) -> bool:
        return self.name.startswith(FLAT_PREFIX)


def public_modules() -> list[str]:
    """The top-level package first, then every public module in the package's own order."""
    return ["", *mpbind._PUBLIC_MODULES]


def public_names(module: ModuleType, flat: bool) -> list[str]:
    if not flat:
        return list(getattr(module, "__all__", ()))
    return [n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))]


def classify(name: str) -> ModulePage:
    page = ModulePage(name)
    try:
        module = importlib.import_module(page.dotted)
    except ImportError as exc:  # an optional module without its package (MissingDependencyError)
        page.missing = mpbind._OPTIONAL_MODULES.get(name, str(exc))
        return page
    for attr in public_names(module, page.flat):
        if attr == "__version__":
            page.data.append(attr)
            continue
        value = getattr(module, attr)
        if inspect.isclass(value) and issubclass(value, enum.Enum):
            page.enums.append(attr)
        elif inspect.isclass(value):
            page.classes.append(attr)
        elif callable(value) and not isinstance(value, type) and _is_function(value):
            page.functions.append(attr)
        else:
            page.data.append(attr)
    return page


def _is_function(value: object) -> bool:
    # Cython functions, nanobind functions and Python functions are all routines; a handle type such as
    # ``nccl.Comm`` is callable but an object of its own (documented as data).
    return inspect.isroutine(value) or type(value).__name__ in ("nb_func", "cython_function_or_method")


def _title(text: str, char: str) -> str:
    return f"{text}\n{char * len(text)}\n"


def render(page: ModulePage) -> str:
    dotted = page.dotted
    out = [_title(f"``{dotted}``", "=")]
    if page.missing:  # the module cannot be imported here: name it, say why its entries are absent
        out.append(f".. py:module:: {dotted}\n\n.. note::\n   This build had no ``{page.missing}`` package, which "
                   f"this module needs (``pip install 'mpbind[{page.missing}]'``), so its entries are not listed.\n")
        return "\n".join(out)
    out.append(f".. automodule:: {dotted}\n   :no-members:\n")
    sections = [("Classes", page.classes, "autoclass", ("members", "undoc-members", "show-inheritance")),
                ("Enumerations", page.enums, "autoclass", ("members", "undoc-members")),
                ("Functions", page.functions, "autofunction", ()),
                ("Constants and types", page.data, "autodata", ())]
    for heading, names, directive, options in sections:
        if not names:
            continue
        out.append(_title(heading, "-"))
        for attr in names:
            opts = "".join(f"   :{o}:\n" for o in options)
            out.append(f".. {directive}:: {dotted}.{attr}\n{opts}")
    return "\n".join(out)


def write(outdir: Path) -> list[ModulePage]:
    """Write ``api/<module>.rst`` for every public module and ``api/index.rst`` listing them."""
    api = outdir / "api"
    api.mkdir(parents=True, exist_ok=True)
    pages = [classify(name) for name in public_modules()]
    toc = []
    for page in pages:
        stem = page.dotted
        _write_if_changed(api / f"{stem}.rst", render(page))
        toc.append(f"   {stem}")
    index = [_title("API reference", "="),
             "Every public name of the layer and of the flat bindings, generated from the installed package. "
             "The flat modules (``mpbind.bindings.<lib>``) are generated from the C headers: each function's "
             "entry gives its C prototype; :doc:`/_generated/c-index` goes from a C name to its Python name.\n",
             ".. toctree::\n   :maxdepth: 1\n", *toc, ""]
    _write_if_changed(api / "index.rst", "\n".join(index))
    return pages


def _write_if_changed(path: Path, text: str) -> None:
    """Leave an unchanged page untouched, so that an incremental build does not reread it."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
