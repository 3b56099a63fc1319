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
DROPS = {"at_once", "queued", "queued_once_collective", "by_owner", "never"}


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
            assert r["collective"], r
    for library in ("nccl", "nvshmem", "cublasmp", "cufftmp"):
        assert any(k.startswith(library + ".") for k in kinds), library


def test_every_facade_keeps_the_owned_protocol() -> None:
    from mpbind import cublasmp, cufftmp, nccl, nvshmem

    protocol = ("close", "closed", "serial", "__enter__", "__exit__", "__repr__", "_over")
    facades = [cls for mod in (nccl, cublasmp, cufftmp, nvshmem) for _, cls in inspect.getmembers(mod, inspect.isclass)
               if issubclass(cls, Owned) and cls is not Owned]
    assert {c.__name__ for c in facades} >= {"Communicator", "Matrix", "MatmulDescriptor", "Matmul", "Plan",
                                             "Descriptor", "Reshape", "SymmetricArray"}
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
