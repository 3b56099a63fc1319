"""The pinned library versions, codegen/versions.toml: the one source of pyproject.toml's pins.

A wheel family is the CUDA major version its wheels are built for (the `-cu13`/`-cu12` suffix of
their names). The bindings are generated from the pinned wheels of the first family (`wheel`,
`version`); each other family (`cu12`) pins its own wheel of the same library. The extra named
after a family installs its four library wheels; the test extra pins those of the first family and
the wheels their headers include. `pyproject_problems` says where pyproject.toml disagrees (run by
``codegen/generate.py --check``); `rewrite_pyproject` and `set_version` are the edits
``codegen/bump.py`` makes.
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
# Extras that pin the library wheels: the family whose wheels each pins (None: the first family, the
# generator's), and whether it also pins the header wheels.
EXTRAS: dict[str, tuple[str | None, bool]] = {"cu13": (None, False), "cu12": ("cu12", False), "test": (None, True)}
_FAMILY = re.compile(r"-(cu\d+)$")
_FAMILY_KEY = re.compile(r"cu\d+")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s;,]+))?")


@dataclass(frozen=True)
class Wheel:
    """One family's wheel of a library: its name, its pinned version, and the release the symbol and
    layout records name it by (the version, less a `.postN` repackaging)."""

    wheel: str
    version: str
    release: str

    @property
    def family(self) -> str:
        return family_of(self.wheel)


@dataclass(frozen=True)
class Pin:
    lib: str
    wheel: str
    version: str
    releases_from: list[str]
    header_wheels: dict[str, str] = field(default_factory=dict)
    # the other families' wheels of this library: family -> Wheel
    others: dict[str, Wheel] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """The family the bindings are generated from."""
        return family_of(self.wheel)

    def families(self) -> dict[str, Wheel]:
        """Every family's wheel, the generator's first."""
        return {self.family: Wheel(self.wheel, self.version, self.version), **self.others}


def family_of(wheel: str) -> str:
    m = _FAMILY.search(wheel)
    if m is None:
        raise ValueError(f"{wheel} names no wheel family (-cuNN)")
    return m[1]


def load(text: str | None = None) -> dict[str, Pin]:
    doc = tomllib.loads(VERSIONS.read_text() if text is None else text)
    pins = {}
    for lib, d in doc.items():
        others = {key: Wheel(v["wheel"], v["version"], v.get("release", v["version"]))
                  for key, v in d.items() if _FAMILY_KEY.fullmatch(key)}
        for key, w in others.items():
            if w.family != key:
                raise ValueError(f"codegen/versions.toml: [{lib}] {key} names {w.wheel}, of family {w.family}")
        pins[lib] = Pin(lib, d["wheel"], d["version"], list(d["releases_from"]), dict(d.get("header_wheels", {})),
                        others)
    return pins


def wheel_pins(pins: dict[str, Pin], headers: bool, family: str | None = None) -> dict[str, str]:
    """wheel -> version: one family's library wheels (None: the generator's), and with headers=True the
    wheels their headers include."""
    chosen = [p.families()[family or p.family] for p in pins.values()]
    out = {w.wheel: w.version for w in chosen}
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
    for extra, (family, headers) in EXTRAS.items():
        want = {_normal(w): (w, v) for w, v in wheel_pins(pins, headers, family).items()}
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
                                f"codegen/versions.toml {version}")
        for key in sorted(set(have) - set(want)):
            problems.append(f"pyproject.toml: extra {extra} pins {key}, which codegen/versions.toml does not")
    return problems


def rewrite_pyproject(text: str, pins: dict[str, Pin]) -> str:
    """pyproject.toml's text with every `"<wheel>==<version>"` of a pinned wheel set to its pin."""
    every = {w.wheel: w.version for p in pins.values() for w in p.families().values()}
    for wheel, version in {**every, **wheel_pins(pins, headers=True)}.items():
        text = re.sub(rf'"{re.escape(wheel)}==[^"]*"', f'"{wheel}=={version}"', text)
    return text


def set_version(text: str, lib: str, version: str) -> str:
    """versions.toml's text with [lib] version set."""
    table = re.search(rf"^\[{re.escape(lib)}\]\n(?:(?!\[).*\n?)*", text, re.M)
    if table is None:
        raise KeyError(f"codegen/versions.toml has no [{lib}] table")
    body, n = re.subn(r'^version = "[^"]*"', f'version = "{version}"', table[0], count=1, flags=re.M)
    if n != 1:
        raise KeyError(f"codegen/versions.toml: [{lib}] has no version")
    return text[:table.start()] + body + text[table.end():]


def spec_problems(pins: dict[str, Pin]) -> list[str]:
    """The specs name the same wheels as versions.toml (their headers and what those include)."""
    problems = []
    known = wheel_pins(pins, headers=True)
    for lib, pin in pins.items():
        spec = tomllib.loads((ROOT / "specs" / f"{lib}.toml").read_text())["library"]
        if spec["wheel"] != pin.wheel:
            problems.append(f"codegen/specs/{lib}.toml: wheel {spec['wheel']}, codegen/versions.toml {pin.wheel}")
        for wheel, _ in spec.get("extra_includes", []):
            if wheel not in known:
                problems.append(f"codegen/specs/{lib}.toml: includes headers of {wheel}, "
                                f"which codegen/versions.toml does not pin")
    return problems


def problems() -> list[str]:
    """Where pyproject.toml (when the tree has one: a copy of the generator may not) and the specs
    disagree with versions.toml."""
    pins = load()
    pyproject = pyproject_problems(PYPROJECT.read_text(), pins) if PYPROJECT.is_file() else []
    return pyproject + spec_problems(pins)
