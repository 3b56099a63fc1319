"""What mpbind finds on this machine: libraries, versions, binding coverage, GPU.

Backs ``python -m mpbind info``, ``python -m mpbind coverage`` and
:func:`mpbind.show_config`. Every probe is independent and never raises: a
failure is reported as text.

Private to mpbind (:mod:`mpbind._infra`): not public API; its names change without notice.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from typing import IO, Any, TypeAlias

from mpbind.errors import MpbindError

# (c_function_name, python_name or None, exclusion reason or None)
CoverageEntry: TypeAlias = "tuple[str, str | None, str | None]"


@dataclass
class CoverageSummary:
    """Counts of one library's C functions in the generated bindings."""

    bound: int
    excluded: int
    total: int

    @property
    def missing(self) -> int:
        """Functions neither bound nor excluded with a reason."""
        return self.total - self.bound - self.excluded


@dataclass
class LibraryReport:
    """What :func:`library_report` found for one library."""

    name: str
    env_var: str | None = None
    env_value: str | None = None
    found: bool = False
    path: str | None = None
    version: str | None = None
    wheel: str | None = None  # the nvidia-* wheel that installed it, "<distribution> <version>"
    family: str | None = None  # its wheel family: cu13, cu12
    found_via: str | None = None
    error: str | None = None
    pinned: str | None = None
    coverage: CoverageSummary | None = None
    notes: list[str] = field(default_factory=list)


# Lines of a "not found" message shown by ``info`` after the first one.
_MAX_ERROR_LINES = 8


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def gpu_count() -> tuple[int, str | None]:
    """Return ``(number of visible CUDA devices, reason)``.

    The reason is ``None`` when at least one device is visible, otherwise it says
    why none is (no ``cuda.bindings``, no driver, no device, ...). Never raises.
    """
    try:
        from cuda.bindings import driver
    except Exception as exc:  # ImportError, or a broken installation
        return 0, f"cuda.bindings.driver not importable ({_describe(exc)})"
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0, f"cuInit failed: {_driver_error(driver, err)}"
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0, f"cuDeviceGetCount failed: {_driver_error(driver, err)}"
    except Exception as exc:  # e.g. libcuda.so.1 missing
        return 0, _describe(exc)
    if count <= 0:
        return 0, "the driver reports 0 CUDA devices"
    return int(count), None


def _driver_error(driver: Any, err: Any) -> str:
    name = getattr(err, "name", str(err))
    try:
        res, text = driver.cuGetErrorString(err)
        if res == driver.CUresult.CUDA_SUCCESS and text:
            decoded = text.decode() if isinstance(text, bytes) else str(text)
            return f"{name} ({decoded})"
    except Exception:
        pass
    return str(name)


def _load_coverage() -> tuple[dict[str, list[CoverageEntry]], dict[str, str], str | None]:
    """Return ``(COVERAGE, PINNED, error)`` from the generated coverage table."""
    try:
        from mpbind.bindings import _coverage
    except Exception as exc:
        return {}, {}, _describe(exc)
    coverage: dict[str, list[CoverageEntry]] = dict(getattr(_coverage, "COVERAGE", {}))
    pinned: dict[str, str] = dict(getattr(_coverage, "PINNED", {}))
    return coverage, pinned, None


def summarize(entries: list[CoverageEntry]) -> CoverageSummary:
    """Count bound, excluded and total functions of one library."""
    bound = sum(1 for _, py_name, _ in entries if py_name is not None)
    excluded = sum(1 for _, py_name, reason in entries if py_name is None and reason is not None)
    return CoverageSummary(bound=bound, excluded=excluded, total=len(entries))


def library_names() -> tuple[list[str], str | None]:
    """Names of the libraries mpbind knows, in order, or the reason they are unknown."""
    try:
        from mpbind._infra import loader as _loader
    except Exception as exc:
        return ["nccl", "nvshmem", "cublasmp", "cufftmp"], f"mpbind._infra.loader: {_describe(exc)}"
    return list(_loader.LIBRARIES), None


def library_report(
    name: str,
    coverage: dict[str, list[CoverageEntry]] | None = None,
    pinned: dict[str, str] | None = None,
) -> LibraryReport:
    """Probe one library: load it, read its version and binding coverage. Never raises."""
    report = LibraryReport(name=name)
    if coverage is None or pinned is None:
        coverage, pinned, _ = _load_coverage()
    try:
        report.pinned = pinned.get(name)
        if name in coverage:
            report.coverage = summarize(list(coverage[name]))
    except Exception as exc:
        report.notes.append(f"coverage table unreadable: {_describe(exc)}")
    try:
        import os

        from mpbind._infra import loader as _loader

        spec = _loader.LIBRARIES[name]
        report.env_var = spec.env_var
        report.env_value = os.environ.get(spec.env_var) if spec.env_var else None
        lib = _loader.load(name)
        report.found = True
        report.path = str(lib.path)
        report.found_via = lib.found_via
        if lib.owner is not None:
            report.wheel = str(lib.owner)
            report.family = lib.owner.family
    except Exception as exc:
        report.error = _describe(exc)
        return report
    try:
        report.version = _loader.loaded_version(name)
    except Exception as exc:
        report.notes.append(f"version query failed: {_describe(exc)}")
    if report.version and report.pinned and not report.pinned.startswith(report.version):
        report.notes.append(f"the bindings are generated from {report.pinned}'s headers: what {report.version} "
                            "lacks raises FunctionNotFoundError")
    return report


def _package_version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "not installed"


def format_info() -> str:
    """The text printed by ``python -m mpbind info`` and :func:`mpbind.show_config`."""
    lines: list[str] = []
    try:
        import mpbind

        mpbind_version = mpbind.__version__
    except Exception as exc:
        mpbind_version = f"unknown ({_describe(exc)})"
    lines.append(f"mpbind {mpbind_version}")
    lines.append(
        f"Python {platform.python_version()} ({platform.machine()}), "
        f"numpy {_package_version('numpy')}, "
        f"cuda-pathfinder {_package_version('cuda-pathfinder')}, "
        f"cuda-bindings {_package_version('cuda-bindings')}"
    )

    names, names_error = library_names()
    if names_error:
        lines.append(f"warning: cannot read the library list ({names_error})")
    coverage, pinned, coverage_error = _load_coverage()
    if coverage_error:
        lines.append(f"warning: no coverage table ({coverage_error})")

    reports = []
    for name in names:
        try:
            report = library_report(name, coverage, pinned)
        except Exception as exc:  # library_report does not raise; belt and braces
            report = LibraryReport(name=name, error=_describe(exc))
        reports.append(report)
        lines.append("")
        lines.extend(_format_report(report))
    lines.append("")
    lines.append(family_line(reports))

    lines.append("")
    count, reason = gpu_count()
    if count > 0:
        lines.append(f"GPU: {count} CUDA device{'s' if count != 1 else ''} visible")
    else:
        lines.append(f"GPU: no GPU visible: {reason}")
    return "\n".join(lines)


def _format_report(report: LibraryReport) -> list[str]:
    out = [f"{report.name}:"]
    if report.found:
        out.append("  status:   found")
        out.append(f"  path:     {report.path}")
        out.append(f"  version:  {report.version or 'unknown'}")
        if report.wheel:
            out.append(f"  wheel:    {report.wheel} (family {report.family or 'unknown'})")
        else:
            out.append("  wheel:    none (not installed by an nvidia-* wheel: family unknown)")
        out.append(f"  via:      {report.found_via or 'unknown'}")
    else:
        out.append("  status:   not found")
        if report.error:
            first, *rest = report.error.splitlines() or [""]
            out.append(f"  tried:    {first}")
            out.extend(f"            {line}" for line in rest[:_MAX_ERROR_LINES])
            if len(rest) > _MAX_ERROR_LINES:
                out.append(f"            ... ({len(rest) - _MAX_ERROR_LINES} more lines)")
    if report.coverage is not None:
        cov = report.coverage
        text = f"{cov.bound} bound / {cov.excluded} excluded / {cov.total} total"
        if cov.missing:
            text += f" ({cov.missing} neither bound nor excluded)"
        out.append(f"  coverage: {text}")
    else:
        out.append("  coverage: no bindings yet")
    out.append(f"  pinned:   {report.pinned or '-'}")
    if report.env_var:
        value = report.env_value if report.env_value else "unset"
        out.append(f"  override: {report.env_var} ({value})")
    out.extend(f"  note:     {note}" for note in report.notes)
    return out


def family_line(reports: list[LibraryReport]) -> str:
    """Which wheel family the loaded libraries come from: one, several (a mix), or none known."""
    by_family: dict[str, list[str]] = {}
    for r in reports:
        if r.found:
            by_family.setdefault(r.family or "unknown", []).append(r.name)
    if not by_family:
        return "wheel family: none loaded"
    text = "; ".join(f"{family} ({', '.join(libs)})" for family, libs in by_family.items())
    known = [f for f in by_family if f != "unknown"]
    if len(known) > 1:
        return f"wheel families: {text} -- mixed: install one of the extras cu13 and cu12"
    return f"wheel family: {text}"


def show_config(file: IO[str] | None = None) -> None:
    """Print :func:`format_info` to ``file`` (default: standard output)."""
    print(format_info(), file=file if file is not None else sys.stdout)


class CoverageUnavailableError(MpbindError):
    """The generated coverage table cannot be read (a broken installation); the message says why."""


def _coverage_module() -> Any:
    """mpbind.bindings._coverage, or CoverageUnavailableError saying why it cannot be read."""
    try:
        from mpbind.bindings import _coverage
    except Exception as exc:
        raise CoverageUnavailableError(f"no coverage table: {_describe(exc)}") from exc
    return _coverage


def coverage_json() -> dict[str, dict[str, Any]]:
    """Coverage of every bound library, in the shape printed by ``coverage --json``: per library
    its pin and, for every function its pinned headers declare or its pinned library exports, the
    Python name or why it is excluded, whether the library exports it, and (for a header's static
    inline function reproduced in Python) the exported function it calls."""
    cov = _coverage_module()
    return {
        lib: {
            "pinned": cov.PINNED.get(lib),
            "functions": [
                {
                    "c_name": c_name,
                    "python_name": py_name,
                    "excluded": reason,
                    "exported": c_name in cov.EXPORTED.get(lib, ()),
                    "calls": cov.CALLS.get(lib, {}).get(c_name),
                }
                for c_name, py_name, reason in entries
            ],
        }
        for lib, entries in cov.COVERAGE.items()
    }


# Exclusion reasons shared by at most this many functions list them by name.
_NAMED_UP_TO = 5


def format_coverage_table() -> str:
    """A one-line-per-library summary of :func:`coverage_json`, then the exclusions by reason."""
    try:
        cov = _coverage_module()
    except CoverageUnavailableError as exc:
        return str(exc)
    names, _ = library_names()
    names += [lib for lib in cov.COVERAGE if lib not in names]
    header = ("library", "pinned", "bound", "excluded", "missing", "total", "exported")
    rows: list[tuple[str, ...]] = [header]
    for lib in names:
        pinned = cov.PINNED.get(lib, "-")
        if lib in cov.COVERAGE:
            s = summarize(list(cov.COVERAGE[lib]))
            counts = (s.bound, s.excluded, s.missing, s.total, len(cov.EXPORTED.get(lib, ())))
            rows.append((lib, pinned, *map(str, counts)))
        else:
            rows.append((lib, pinned, "-", "-", "-", "-", "no bindings yet"))
    lines = _aligned(rows, left=2)
    lines += ["", "excluded, by reason:"]
    for lib in names:
        by_reason: dict[str, list[str]] = {}
        for c_name, _, reason in cov.COVERAGE.get(lib, ()):
            if reason is not None:
                by_reason.setdefault(reason, []).append(c_name)
        for reason, functions in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
            named = f": {', '.join(functions)}" if len(functions) <= _NAMED_UP_TO else ""
            lines.append(f"  {lib:<9} {len(functions):>5}  {reason}{named}")
    return "\n".join(lines)


def _aligned(rows: list[tuple[str, ...]], left: int) -> list[str]:
    """Rows as columns: the first `left` left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if i < left else cell.rjust(width)
                      for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]
