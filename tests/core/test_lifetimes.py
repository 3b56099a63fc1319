"""The lifetime table: docs/DESIGN.md lists exactly the core's rows (mpbind._core.lifetimes()),
the rows are consistent, every facade takes the Owned protocol unchanged, and the process-wide
functions live at the top level with their old names as aliases."""

from __future__ import annotations

import gc
import inspect
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

import mpbind
from mpbind import _core
from mpbind._infra.owned import Owned

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md"
COLUMNS = ["kind", "drop", "collective", "parent", "release"]
DROPS = {"at_once", "queued", "queued_once_collective", "by_owner", "never", "by_parts"}
# Queued without being collective: its release waits for the device (its kernels may still run).
QUEUED_LOCAL = {"nvshmem.KernelLibrary"}


def _documented() -> list[dict[str, Any]]:
    """The rows of the table in the Lifetimes section of docs/DESIGN.md, as lifetimes() gives them."""
    text = DESIGN.read_text()
    section = re.search(r"^## Lifetimes\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "docs/DESIGN.md has no Lifetimes section"
    lines = [ln.strip() for ln in section.group(1).splitlines() if ln.strip().startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS, header
    rows = []
    for line in lines[2:]:  # after the header and its |---| line
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        row = dict(zip(COLUMNS, cells, strict=True))
        assert row["collective"] in ("yes", "no"), line
        rows.append({**row, "collective": row["collective"] == "yes",
                     "parent": None if row["parent"] == "—" else row["parent"]})
    return rows


def test_design_lists_exactly_the_lifetime_table() -> None:
    documented = {r["kind"]: r for r in _documented()}
    actual = {r["kind"]: dict(r) for r in _core.lifetimes()}
    assert len(documented) == len(_documented()), "a kind is listed twice in docs/DESIGN.md"
    assert sorted(set(actual) - set(documented)) == [], "kinds missing from docs/DESIGN.md"
    assert sorted(set(documented) - set(actual)) == [], "kinds in docs/DESIGN.md the core does not have"
    for kind, row in actual.items():
        assert documented[kind] == row, kind


def test_lifetime_rows_are_consistent() -> None:
    rows = _core.lifetimes()
    kinds = {r["kind"] for r in rows}
    for r in rows:
        assert r["drop"] in DROPS, r
        assert r["parent"] is None or r["parent"] in kinds, r
        # The garbage collector never runs a collective release.
        assert not (r["collective"] and r["drop"] == "at_once"), r
        if r["drop"].startswith("queued"):
            assert r["collective"] or r["kind"] in QUEUED_LOCAL, r
    for library in ("nccl", "nvshmem", "cublasmp", "cufftmp"):
        assert any(k.startswith(library + ".") for k in kinds), library


def test_every_facade_keeps_the_owned_protocol() -> None:
    from mpbind import cublasmp, cufftmp, fft, nccl, nvshmem
    from mpbind import kernels as nvshmem_kernels

    protocol = ("close", "closed", "serial", "__enter__", "__exit__", "__repr__", "_over")
    modules = (nccl, cublasmp, cufftmp, nvshmem, fft, nvshmem_kernels)
    facades = [cls for mod in modules for _, cls in inspect.getmembers(mod, inspect.isclass)
               if issubclass(cls, Owned) and cls is not Owned]
    assert {c.__name__ for c in facades} >= {"Communicator", "Matrix", "MatmulDescriptor", "Matmul", "Plan",
                                             "Descriptor", "Reshape", "Library", "FFTPlan", "ReshapePlan"}
    for cls in facades:
        for name in protocol:
            assert inspect.getattr_static(cls, name) is inspect.getattr_static(Owned, name), f"{cls.__name__}.{name}"


def test_process_wide_functions_live_at_the_top_level() -> None:
    from mpbind import cufftmp, nccl

    assert {"drain", "queued", "registrations"} <= set(mpbind.__all__)
    assert nccl.drain is mpbind.drain and cufftmp.drain is mpbind.drain
    assert nccl.queued is mpbind.queued and cufftmp.queued is mpbind.queued
    assert nccl.registrations is mpbind.registrations
    assert mpbind.queued() == _core.queued()
    assert mpbind.registrations() == _core.registrations()


@pytest.mark.parametrize(
    ("make", "queued_kind"),
    [(lambda: _core._testing.Resource(False), None),
     (lambda: _core._testing.Resource(True), "testing.CollectiveResource")],
    ids=["at_once", "queued"],
)
def test_a_dropped_object_follows_its_row(make: Any, queued_kind: str | None) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = make()
        serial = r.serial
        del r
        gc.collect()
    assert [k for k, s in mpbind.queued() if s == serial] == ([queued_kind] if queued_kind else [])
    assert any(issubclass(w.category, ResourceWarning) for w in seen) == (queued_kind is not None)
    assert mpbind.drain() == (1 if queued_kind else 0)


# --- composite plans: a row of the table, not a mechanism of their own --------------------------------


class Part:
    """A part of a composite: records its close() in `log`, raising `error` when given."""

    def __init__(self, name: str, log: list[str], error: Exception | None = None) -> None:
        self.name, self.log, self.error, self.closed = name, log, error, False

    def close(self) -> None:
        self.log.append(self.name)
        self.closed = True
        if self.error is not None:
            raise self.error


def test_a_composite_closes_its_parts_newest_first_once() -> None:
    log: list[str] = []
    parts = [Part(n, log) for n in ("handle", "matrix", "matmul")]
    c = _core.Composite(parts, "plan parts")
    assert c.parts == tuple(parts) and c.what == "plan parts" and not c.closed
    assert ("mpbind.Composite", c.serial) in _core.alive()
    c.close()
    c.close()
    assert log == ["matmul", "matrix", "handle"]
    assert c.closed and c.parts == tuple(parts) and repr(c) == "<plan parts (closed)>"


def test_a_composite_closes_every_part_before_raising_the_first_error() -> None:
    log: list[str] = []
    parts = [Part("a", log), Part("b", log, ValueError("b failed")), Part("c", log, KeyError("c"))]
    c = _core.Composite(parts, "plan parts")
    with pytest.raises(KeyError, match="c"):
        c.close()
    assert log == ["c", "b", "a"] and c.closed
    c.close()  # released once: not retried
    assert log == ["c", "b", "a"]


def test_a_dropped_composite_leaves_each_part_to_its_row() -> None:
    log: list[str] = []
    collective = _core._testing.Resource(True)
    serial = collective.serial
    c = _core.Composite([Part("local", log), collective], "plan parts")
    del collective
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del c
        gc.collect()
    assert log == []  # nothing closed by the garbage collector
    assert ("testing.CollectiveResource", serial) in mpbind.queued()  # the part's own row: queued
    assert any(issubclass(w.category, ResourceWarning) for w in seen)
    assert mpbind.drain() == 1


def test_a_composite_refuses_parts_without_close_and_copies() -> None:
    import copy

    with pytest.raises(TypeError, match="must have close"):
        _core.Composite([object()], "plan parts")
    c = _core.Composite([], "plan parts")
    with pytest.raises(TypeError, match="cannot copy Composite"):
        copy.copy(c)
    c.close()


# --- kernel libraries: the core's row, its queue, its serial --------------------------------------------


def test_a_kernel_library_is_a_row_of_the_core() -> None:
    calls: list[bool] = []
    lib = _core.nvshmem.load_library(object(), 0x1234, 0, "ring", False, calls.append)
    assert (lib.handle, lib.device, lib.name, lib.registered) == (0x1234, 0, "ring", False)
    assert ("nvshmem.KernelLibrary", lib.serial) in _core.alive()
    with lib:
        pass
    lib.close()
    assert calls == [False] and lib.closed
    with pytest.raises(mpbind.errors.UsageError, match="closed"):
        lib.handle  # noqa: B018
    with pytest.raises(mpbind.errors.UsageError, match="closed"):
        lib.code  # noqa: B018


def test_a_dropped_kernel_library_waits_in_the_core_queue() -> None:
    from mpbind import kernels as nvshmem_kernels

    calls: list[bool] = []
    lib = _core.nvshmem.load_library(object(), 0x1234, 0, "ring", False, calls.append)
    serial = lib.serial
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del lib
        gc.collect()
    assert calls == []  # never from the garbage collector
    assert ("nvshmem.KernelLibrary", serial) in mpbind.queued()
    assert any(issubclass(w.category, ResourceWarning) and "KernelLibrary" in str(w.message) for w in seen)
    assert nvshmem_kernels.drain is mpbind.drain
    assert mpbind.drain() == 1 and calls == [False]
    assert mpbind.queued() == []


def test_the_queue_runs_kernel_libraries_with_collective_releases_newest_first() -> None:
    order: list[str] = []
    older = _core._testing.Resource(True, lambda serial: order.append("collective"))
    lib = _core.nvshmem.load_library(object(), 1, 0, "k", False, lambda registered: order.append("library"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        del older, lib
        gc.collect()
    assert mpbind.drain() == 2
    assert order == ["library", "collective"]


def test_a_registered_kernel_library_needs_the_runtime() -> None:
    with pytest.raises(mpbind.errors.UsageError, match="not initialised"):
        _core.nvshmem.load_library(object(), 1, 0, "k", True, lambda registered: None)
    with pytest.raises(TypeError, match="callable"):
        _core.nvshmem.load_library(object(), 1, 0, "k", False, 1)
