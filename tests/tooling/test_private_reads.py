"""The benchmarks, examples and GPU suites read some of mpbind's private attributes (a plan's parts,
the core's test hooks); nothing on a CPU machine runs them, so a rename in the package would break
them unseen (it did: FFTPlan._cplan). Every private attribute they read must still be defined in the
package, or be one of the few third-party ones listed here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READERS = [*sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "examples").glob("*.py")),
           *sorted((ROOT / "tests" / "gpu").glob("*.py"))]
# Private names of other libraries the benchmarks use on purpose.
THIRD_PARTY = {
    "_scaled_mm": "torch._scaled_mm, the FP8 reference",
    "_symmetric_memory": "torch.distributed._symmetric_memory, the fused-op anchors",
    "_inspect_function_pointer": "numba-cuda's nvshmem4py bridge",
}


def _private_reads(path: Path) -> set[str]:
    """Names of private attributes read in `path` off anything but self or cls (its own)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        names.add(node.attr)
    return names


def _package_text() -> str:
    src = ROOT / "src" / "mpbind"
    files = [p for ext in ("py", "pyx", "pxd", "pxi", "cpp", "hpp") for p in src.rglob(f"*.{ext}")]
    return "\n".join(p.read_text() for p in files)


def _defined(name: str, text: str, modules: set[str]) -> bool:
    if name in modules:
        return True
    patterns = (rf"\bdef {name}\b", rf"\bself\.{name}\s*[:=]", rf"^\s*{name}\s*[:=]", rf"\"{name}\"",
                rf"\bcdef\b[^\n]*\b{name}\b", rf"__slots__[^\n]*['\"]{name}['\"]", rf"\bimport {name}\b")
    return any(re.search(p, text, re.MULTILINE) for p in patterns)


def test_every_private_attribute_read_outside_the_package_exists() -> None:
    text = _package_text()
    modules = {p.stem for p in (ROOT / "src" / "mpbind").rglob("_*.py*")} | {"_core", "_testing"}
    missing = {}
    for path in READERS:
        own = path.read_text()
        for name in sorted(_private_reads(path)):
            if name in THIRD_PARTY or _defined(name, text, modules):
                continue
            if re.search(rf"\b(def|class) {name}\b|\.{name}\s*=(?!=)", own):  # the file's own helper or attribute
                continue
            missing.setdefault(str(path.relative_to(ROOT)), []).append(name)
    assert not missing, f"private attributes read but defined nowhere in mpbind: {missing}"


def test_the_check_sees_a_stale_read(tmp_path: Path) -> None:
    stale = tmp_path / "stale.py"
    stale.write_text("def f(p):\n    return p._cplan.handle, p._buffer\n")
    reads = _private_reads(stale)
    assert reads == {"_cplan", "_buffer"}
    text = _package_text()
    assert not _defined("_cplan", text, set()) and _defined("_buffer", text, set())
