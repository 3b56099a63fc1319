"""Which wheel family a library file comes from, and which copies of a library the process holds.

NVIDIA ships each library in one wheel per CUDA major version, its *family* (`nvidia-nccl-cu12`,
`nvidia-nccl-cu13`). Both families install NCCL and NVSHMEM to the same paths
(`nvidia/nccl/lib/libnccl.so.2`), so a path does not tell them apart: the installed distribution
whose file list (its RECORD) holds the file does, and where two do (both families installed over one
another), the one whose recorded size and digest the file has.

Private to mpbind (:mod:`mpbind._infra`): not public API; its names change without notice.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import os
import re
from dataclasses import dataclass
from pathlib import Path

#: The families mpbind knows, in the order cuda.pathfinder searches their folders.
FAMILIES = ("cu13", "cu12")
_FAMILY = re.compile(r"-(cu\d+)$")


@dataclass(frozen=True)
class Owner:
    """The installed wheel a library file belongs to."""

    distribution: str  # its normalised name: nvidia-nccl-cu12
    version: str
    family: str | None  # cu12, cu13; None for a wheel of no family

    def __str__(self) -> str:
        return f"{self.distribution} {self.version}"


def family_of(distribution: str) -> str | None:
    m = _FAMILY.search(distribution)
    return m[1] if m else None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _owner(dist: md.Distribution) -> Owner:
    name = _normal(dist.metadata["Name"])
    return Owner(name, dist.version, family_of(name))


def _digest(path: Path) -> str:
    """The file's sha256 as RECORD writes it (urlsafe base64, no padding)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _recorded(rel: Path, infos: list[Path]) -> list[tuple[md.Distribution, md.PackagePath]]:
    out = []
    for info in infos:
        dist = md.Distribution.at(info)
        for entry in dist.files or ():
            if Path(entry) == rel:
                out.append((dist, entry))
    return out


def _matching(real: Path, found: list[tuple[md.Distribution, md.PackagePath]]
              ) -> list[tuple[md.Distribution, md.PackagePath]]:
    """Of several wheels recording the file (installed over one another), those whose recorded size,
    then digest, the file has: the last one installed."""
    size = real.stat().st_size
    same = [(d, e) for d, e in found if e.size is not None and int(e.size) == size]
    if len(same) > 1:
        digest = _digest(real)
        same = [(d, e) for d, e in same if e.hash is not None and e.hash.value == digest]
    return same


def owner(path: str) -> Owner | None:
    """The installed NVIDIA wheel whose file list holds `path`, or None (a file no such wheel installed).

    Looks at the `nvidia*.dist-info` folders in each folder above the file, so it also finds the
    wheels of other environments (a library another package loaded from its own site-packages)."""
    try:
        real = Path(path).resolve(strict=True)
    except OSError:
        return None
    for root in real.parents:
        try:
            infos = sorted(p for p in root.iterdir()
                           if p.name.endswith(".dist-info") and p.name.lower().startswith("nvidia"))
        except OSError:
            continue
        found = _recorded(real.relative_to(root), infos)
        if len(found) > 1:
            found = _matching(real, found)
        if found:
            return _owner(found[0][0]) if len(found) == 1 else None
    return None


def installed_file(distributions: tuple[str, ...], sonames: tuple[str, ...]) -> str | None:
    """The library file (one of `sonames`) that the first installed of `distributions` put on disk."""
    for name in distributions:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for entry in dist.files or ():
            if entry.name in sonames:
                path = Path(str(dist.locate_file(entry)))
                if path.is_file():
                    return str(path)
    return None


def mapped_copies(sonames: tuple[str, ...]) -> list[str]:
    """The files of this library the process has mapped (every copy, whoever loaded it): those named
    like one of `sonames` or a versioned file of it (`libnccl.so.2.28.9`)."""
    stems = {s.split(".so")[0] + ".so" for s in sonames}
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out: list[str] = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        file = parts[5]
        base = os.path.basename(file)
        if any(base == s or base.startswith(s + ".") for s in stems) and file not in out:
            out.append(file)
    return out


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
