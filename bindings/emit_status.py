"""Render mpbind/_status.py (error classes) and mpbind/bindings/_coverage.py from all IRs."""

from __future__ import annotations

from typing import Any

I4 = "    "


def _class_name(ir: dict[str, Any], py_member: str) -> str:
    """NCCLInvalidArgumentError from INVALID_ARGUMENT; NVSHMEMInvalidValueError from ERROR_INVALID_VALUE."""
    words = py_member.split("_")
    if words[0] == "ERROR" and len(words) > 1:
        words = words[1:]
    name = ir["status"]["error_prefix"] + "".join(w[:1] + w[1:].lower() for w in words)
    return name if name.endswith("Error") else name + "Error"


def status_py(irs: list[dict[str, Any]]) -> str:
    lines = [
        '"""One exception class per status code of each bound library."""',
        "",
        "from __future__ import annotations",
        "",
    ]
    # isort's order: constants, then classes
    bases = sorted({ir["status"]["error_base"] for ir in irs} | {"LIBRARY_ERRORS", "LibraryError"},
                   key=lambda n: (not n.isupper(), n))
    lines.append(f"from mpbind.errors import {', '.join(bases)}")
    lines += ["", "__all__ = ["]
    classes: dict[str, list[tuple[str, str, int]]] = {}
    for ir in irs:
        enum = next(e for e in ir["enums"] if e["name"] == ir["status"]["type"])
        skip = set(ir["status"].get("not_errors", []))
        classes[ir["library"]] = [(_class_name(ir, py), cn, v) for cn, py, v in enum["members"] if cn not in skip]
        for cls, _, _ in classes[ir["library"]]:
            lines.append(f'{I4}"{cls}",')
    lines += ["]", "", ""]
    for ir in irs:
        base = ir["status"]["error_base"]
        for cls, cn, v in classes[ir["library"]]:
            lines += [
                f"class {cls}({base}):",
                f'{I4}"""{cn} ({v})."""',
                "",
                f"{I4}status_code = {v}",
                "",
                "",
            ]
    lines.append("_CLASSES: dict[str, dict[int, type[LibraryError]]] = {")
    for ir in irs:
        lines.append(f'{I4}"{ir["library"]}": {{')
        for cls, _, v in classes[ir["library"]]:
            lines.append(f"{I4}{I4}{v}: {cls},")
        lines.append(f"{I4}}},")
    lines += ["}", "", "_NAMES: dict[str, dict[int, str]] = {"]
    for ir in irs:
        enum = next(e for e in ir["enums"] if e["name"] == ir["status"]["type"])
        lines.append(f'{I4}"{ir["library"]}": {{')
        seen = set()
        for cn, _, v in enum["members"]:
            if v not in seen:
                seen.add(v)
                lines.append(f'{I4}{I4}{v}: "{cn}",')
        lines.append(f"{I4}}},")
    lines += ["}", "", "_HINTS: dict[str, str] = {"]
    for ir in irs:
        lines.append(f'{I4}"{ir["library"]}": {ir["status"].get("log_hint", "")!r},')
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


def coverage_py(irs: list[dict[str, Any]]) -> str:
    lines = [
        '"""Every C function of the pinned headers: its Python name, or why it is excluded."""',
        "",
        "from __future__ import annotations",
        "",
        "PINNED: dict[str, str] = {",
    ]
    for ir in irs:
        lines.append(f'    "{ir["library"]}": "{ir["version"]}",')
    lines += ["}", "", "COVERAGE: dict[str, list[tuple[str, str | None, str | None]]] = {"]
    for ir in irs:
        lines.append(f'    "{ir["library"]}": [')
        for f in sorted(ir["functions"], key=lambda f: f["name"]):
            lines.append(f'        ({f["name"]!r}, {f.get("python")!r}, {f.get("excluded")!r}),')
        lines.append("    ],")
    lines += ["}", "", "SINCE: dict[str, dict[str, str]] = {"]
    for ir in irs:
        lines.append(f'    "{ir["library"]}": {{')
        for f in sorted(ir["functions"], key=lambda f: f["name"]):
            if "since" in f:
                lines.append(f'        {f["name"]!r}: {f["since"]!r},')
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"
