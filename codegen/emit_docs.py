"""The docstrings of the flat bindings: one text per function or class, rendered into both the
Cython module (so that ``help()`` shows it) and the stub beside it (what an IDE shows on hover).

Each names the C function or type it binds, the release of the library that first exported it
(``Function.since``, from codegen/symbols/<lib>.json through codegen/since.py) and the library's
own documentation. The links are per library: the documentation sites lay functions out on pages
that change between releases, so no per-function anchor is derived.
"""

from __future__ import annotations

from emit_common import I4, cy_type
from ir_types import Enum, Family, Function, Library, Struct, TypedAttribute

# The library's API documentation, stable across releases.
DOC_URLS = {
    "nccl": "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api.html",
    "nvshmem": "https://docs.nvidia.com/nvshmem/api/",
    "cublasmp": "https://docs.nvidia.com/cuda/cublasmp/",
    "cufftmp": "https://docs.nvidia.com/hpc-sdk/cufftmp/",
}


def doc_url(lib: Library) -> str:
    return DOC_URLS[lib.name]


def see_also(lib: Library) -> str:
    return f"{lib.pretty} documentation: {doc_url(lib)}"


def since_line(lib: Library, since: str | None) -> str | None:
    """The release that added a function, as the symbol record has it (None: not recorded)."""
    if not since:
        return None
    if since.startswith("<="):
        return f"In {lib.pretty} {since[2:]} (the oldest release recorded) and later."
    return f"Added in {lib.pretty} {since}."


def prototype(f: Function) -> str:
    return f"{cy_type(f.returns, drop_const=False)} {f.name}({', '.join(cy_type(q.type, q.name) for q in f.params)})"


def function_doc(lib: Library, f: Function, return_type: str | None) -> list[str]:
    """A bound C function's docstring: what it binds, its C prototype, what the binding returns,
    whether it releases the GIL, what it needs, the release that added it, the documentation."""
    doc = [f"Binds {f.name}.", "", prototype(f)]
    if return_type:
        doc += ["", f"Returns {return_type}."]
    doc += ["", "Releases the GIL." if f.releases_gil else "Keeps the GIL (the call returns at once)."]
    if f.needs_init is not None and lib.init_check is not None:
        member = next(m for m in lib.enums[lib.init_check.enum].members if m.c == f.needs_init)
        doc.append(f"Needs {lib.init_check.function}() >= {member.python} (else {lib.init_check.error}).")
    added = since_line(lib, f.since)
    if added:
        doc.append(added)
    return doc + ["", see_also(lib)]


def inline_doc(lib: Library, f: Function) -> list[str]:
    """A static inline function of the header, written again in Python over the entry point it calls."""
    assert f.inline_body is not None
    uses = lib.function(f.inline_body.uses)
    doc = [f"Binds {f.name}, a static inline function of the header: written again here over "
           f"{uses.name}."]
    added = since_line(lib, uses.since)
    if added:
        doc += ["", added]
    return doc + ["", see_also(lib)]


def family_doc(lib: Library, fam: Family) -> list[str]:
    names = list(fam.members.values())
    return [f"{fam.python} for the element type `dtype` (a type name or a NumPy dtype):",
            f"one of {', '.join(fam.members)}.", "",
            f"Binds {names[0]} ... {names[-1]}: the member for `dtype`.", "", see_also(lib)]


def attribute_doc(lib: Library, enum_name: str, ta: TypedAttribute, setter: bool) -> list[str]:
    cls = lib.enums[enum_name].python
    if setter:
        return [f"Set attribute `attr` ({cls}) to `value`, checked against the attribute's C type.", "",
                f"Binds {ta.set}.", "", see_also(lib)]
    return [f"The value of attribute `attr` ({cls}) as its C type (enums as their IntEnum).", "",
            f"Binds {ta.get}.", "", see_also(lib)]


def enum_doc(lib: Library, e: Enum) -> list[str]:
    return [f"Binds the enum {e.name}.", "", see_also(lib)]


def struct_doc(lib: Library, s: Struct, summary: str) -> list[str]:
    return [summary, "", f"Binds {s.name}.", "", see_also(lib)]


def render(doc: list[str], indent: str = I4) -> list[str]:
    """A docstring's lines as a triple-quoted literal indented by `indent` (no trailing blanks)."""
    lines = [f'{indent}"""{doc[0]}'] + [f"{indent}{line}" if line else "" for line in doc[1:]]
    lines[-1] += '"""'
    return lines
