"""Render mpbind/bindings/_status.py (error classes) and mpbind/bindings/_coverage.py from all IRs."""

from __future__ import annotations

import textwrap

from emit_common import I4
from ir_types import Library


def _class_name(lib: Library, py_member: str) -> str:
    """NCCLInvalidArgumentError from INVALID_ARGUMENT; NVSHMEMInvalidValueError from ERROR_INVALID_VALUE."""
    words = py_member.split("_")
    if words[0] == "ERROR" and len(words) > 1:
        words = words[1:]
    name = lib.status.error_prefix + "".join(w[:1] + w[1:].lower() for w in words)
    return name if name.endswith("Error") else name + "Error"


def status_py(libs: list[Library]) -> str:
    lines = [
        '"""One exception class per status code of each bound library."""',
        "",
        "from __future__ import annotations",
        "",
    ]
    # isort's order: constants, then classes
    bases = sorted({lib.status.error_base for lib in libs} | {"LIBRARY_ERRORS", "LibraryError"},
                   key=lambda n: (not n.isupper(), n))
    # The bases' own module, not mpbind.errors: that one re-exports these classes (no import circle).
    lines.append(f"from mpbind._error_bases import {', '.join(bases)}")
    lines += ["", "__all__ = ["]
    classes: dict[str, list[tuple[str, str, int]]] = {}
    for lib in libs:
        skip = set(lib.status.not_errors)
        classes[lib.name] = [(_class_name(lib, m.python), m.c, m.value) for m in lib.status_enum.members
                             if m.c not in skip]
        for cls, _, _ in classes[lib.name]:
            lines.append(f'{I4}"{cls}",')
    lines += ["]", "", ""]
    for lib in libs:
        base = lib.status.error_base
        for cls, cn, v in classes[lib.name]:
            lines += [
                f"class {cls}({base}):",
                f'{I4}"""{cn} ({v})."""',
                "",
                f"{I4}status_code = {v}",
                "",
                "",
            ]
    lines.append("_CLASSES: dict[str, dict[int, type[LibraryError]]] = {")
    for lib in libs:
        lines.append(f'{I4}"{lib.name}": {{')
        for cls, _, v in classes[lib.name]:
            lines.append(f"{I4}{I4}{v}: {cls},")
        lines.append(f"{I4}}},")
    lines += ["}", "", "_NAMES: dict[str, dict[int, str]] = {"]
    for lib in libs:
        lines.append(f'{I4}"{lib.name}": {{')
        seen = set()
        for m in lib.status_enum.members:
            if m.value not in seen:
                seen.add(m.value)
                lines.append(f'{I4}{I4}{m.value}: "{m.c}",')
        lines.append(f"{I4}}},")
    lines += ["}", "", "_HINTS: dict[str, str] = {"]
    for lib in libs:
        lines.append(f'{I4}"{lib.name}": {lib.status.log_hint!r},')
    lines += [
        "}",
        "",
        "",
        "def make_error(",
        "    library: str,",
        "    function: str,",
        "    status: int,",
        "    description: str | None = None,",
        "    last_error: str | None = None,",
        ") -> LibraryError:",
        '    """The exception for `status` returned by `function`; unknown statuses get the base class."""',
        "    cls = _CLASSES.get(library, {}).get(status, LIBRARY_ERRORS[library])",
        "    return cls(",
        "        function,",
        "        status,",
        "        status_name=_NAMES.get(library, {}).get(status),",
        "        description=description,",
        "        last_error=last_error,",
        "        hint=_HINTS.get(library),",
        "    )",
    ]
    return "\n".join(lines) + "\n"


def coverage_py(libs: list[Library]) -> str:
    """_coverage.py: per library, every function its pinned headers declare and every function
    its pinned library exports, each bound or excluded with a reason; what the library exports;
    what each reproduced static inline function calls; the `since` of each bound function."""
    lines = [
        '"""The audit of the bindings: every C function of the pinned headers and every function the',
        'pinned library exports, bound (its Python name) or excluded (why)."""',
        "",
        "from __future__ import annotations",
        "",
        "PINNED: dict[str, str] = {",
    ]
    for lib in libs:
        lines.append(f'    "{lib.name}": "{lib.version}",')
    lines += ["}", "", "# (C function, Python name or None, why it is not bound or None)",
              "COVERAGE: dict[str, list[tuple[str, str | None, str | None]]] = {"]
    for lib in libs:
        rows = [(f.name, f.python, f.excluded) for f in lib.functions]
        rows += [(u.name, None, u.excluded) for u in lib.undeclared]
        lines.append(f'    "{lib.name}": [')
        lines += [f"        {row!r}," for row in sorted(rows)]
        lines.append("    ],")
    lines += ["}", "", "# The functions (with one of the library's prefixes) the pinned library exports.",
              "EXPORTED: dict[str, frozenset[str]] = {"]
    for lib in libs:
        names = ", ".join(repr(n) for n in sorted(lib.exports))
        lines.append(f'    "{lib.name}": frozenset({{')
        lines += [f"        {chunk}" for chunk in textwrap.wrap(names, 96, break_on_hyphens=False)]
        lines.append("    }),")
    lines += ["}", "", "# A header's static inline function, reproduced in Python -> the exported function it calls.",
              "CALLS: dict[str, dict[str, str]] = {"]
    for lib in libs:
        calls = {f.name: f.inline_body.uses for f in lib.bound if f.inline_body is not None}
        lines.append(f'    "{lib.name}": {{' + ", ".join(f"{c!r}: {u!r}" for c, u in sorted(calls.items())) + "},")
    lines += ["}", "", "SINCE: dict[str, dict[str, str]] = {"]
    for lib in libs:
        lines.append(f'    "{lib.name}": {{')
        for f in sorted(lib.functions, key=lambda f: f.name):
            if f.since is not None:
                lines.append(f'        {f.name!r}: {f.since!r},')
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"
