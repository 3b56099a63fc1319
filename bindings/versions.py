"""The pinned library versions, bindings/versions.toml: the one source of pyproject.toml's pins.

The cu13 extra installs the four pinned library wheels; the test extra pins the same four and
the wheels their headers include. `pyproject_problems` says where pyproject.toml disagrees
(run by ``bindings/generate.py --check``); `rewrite_pyproject` and `set_version` are the edits
``bindings/bump.py`` makes.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
VERSIONS = ROOT / "versions.toml"
PYPROJECT = ROOT.parent / "pyproject.toml"
# Extras that pin the library wheels, and whether each also pins the header wheels.
EXTRAS = {"cu13": False, "test": True}
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s;,]+))?")


@dataclass(frozen=True)
class Pin:
    lib: str
    wheel: str
    version: str
    releases_from: list[str]
    header_wheels: dict[str, str] = field(default_factory=dict)


def load(text: str | None = None) -> dict[str, Pin]:
    doc = tomllib.loads(VERSIONS.read_text() if text is None else text)
    return {lib: Pin(lib, d["wheel"], d["version"], list(d["releases_from"]), dict(d.get("header_wheels", {})))
            for lib, d in doc.items()}


def wheel_pins(pins: dict[str, Pin], headers: bool) -> dict[str, str]:
    """wheel -> version: the library wheels, and with headers=True the wheels their headers include."""
    out = {p.wheel: p.version for p in pins.values()}
    if headers:
        for p in pins.values():
            out.update(p.header_wheels)
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_problems(text: str, pins: dict[str, Pin]) -> list[str]:
    """Where the extras of pyproject.toml (its text) disagree with versions.toml."""
    extras = tomllib.loads(text)["project"]["optional-dependencies"]
    problems = []
    for extra, headers in EXTRAS.items():
        want = {_normal(w): (w, v) for w, v in wheel_pins(pins, headers).items()}
        have: dict[str, str | None] = {}
        for req in extras.get(extra, []):
            m = _REQUIREMENT.match(req)
            if m and (_normal(m[1]) in want or m[1].startswith("nvidia-")):
                have[_normal(m[1])] = m[2]
        for key, (wheel, version) in want.items():
            if key not in have:
                problems.append(f"pyproject.toml: extra {extra} does not pin {wheel}=={version}")
            elif have[key] != version:
                problems.append(f"pyproject.toml: extra {extra} pins {wheel}=={have[key]}, "
                                f"bindings/versions.toml {version}")
        for key in sorted(set(have) - set(want)):
            problems.append(f"pyproject.toml: extra {extra} pins {key}, which bindings/versions.toml does not")
    return problems


def rewrite_pyproject(text: str, pins: dict[str, Pin]) -> str:
    """pyproject.toml's text with every `"<wheel>==<version>"` of a pinned wheel set to its pin."""
    for wheel, version in wheel_pins(pins, headers=True).items():
        text = re.sub(rf'"{re.escape(wheel)}==[^"]*"', f'"{wheel}=={version}"', text)
    return text


def set_version(text: str, lib: str, version: str) -> str:
    """versions.toml's text with [lib] version set."""
    table = re.search(rf"^\[{re.escape(lib)}\]\n(?:(?!\[).*\n?)*", text, re.M)
    if table is None:
        raise KeyError(f"bindings/versions.toml has no [{lib}] table")
    body, n = re.subn(r'^version = "[^"]*"', f'version = "{version}"', table[0], count=1, flags=re.M)
    if n != 1:
        raise KeyError(f"bindings/versions.toml: [{lib}] has no version")
    return text[:table.start()] + body + text[table.end():]


def spec_problems(pins: dict[str, Pin]) -> list[str]:
    """The specs name the same wheels as versions.toml (their headers and what those include)."""
    problems = []
    known = wheel_pins(pins, headers=True)
    for lib, pin in pins.items():
        spec = tomllib.loads((ROOT / "specs" / f"{lib}.toml").read_text())["library"]
        if spec["wheel"] != pin.wheel:
            problems.append(f"bindings/specs/{lib}.toml: wheel {spec['wheel']}, bindings/versions.toml {pin.wheel}")
        for wheel, _ in spec.get("extra_includes", []):
            if wheel not in known:
                problems.append(f"bindings/specs/{lib}.toml: includes headers of {wheel}, "
                                f"which bindings/versions.toml does not pin")
    return problems


def problems() -> list[str]:
    """Where pyproject.toml (when the tree has one: a copy of the generator may not) and the specs
    disagree with versions.toml."""
    pins = load()
    pyproject = pyproject_problems(PYPROJECT.read_text(), pins) if PYPROJECT.is_file() else []
    return pyproject + spec_problems(pins)
