"""The `since` of every bound function is the first release exporting it, as the symbol record
codegen/symbols/<lib>.json has it, and the record agrees with the pinned wheel installed here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CODEGEN = Path(__file__).resolve().parents[2] / "codegen"
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]


@pytest.fixture(scope="module")
def since(generator: Callable[[str], ModuleType]) -> ModuleType:
    return generator("since")


def _ir(lib: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CODEGEN / "ir" / f"{lib}.json").read_text())
    return data


def _symbol(f: dict[str, Any]) -> str:
    """The exported function a bound function calls: itself, or what a reproduced inline body uses."""
    return str(f["inline_body"]["uses"]) if "inline_body" in f else str(f["name"])


@pytest.mark.parametrize("lib", LIBRARIES)
def test_the_ir_since_is_derived_from_the_record(lib: str, since: ModuleType) -> None:
    table = since.since_table(lib)
    bound = [f for f in _ir(lib)["functions"] if "excluded" not in f]
    assert bound
    wrong = [f"{f['name']}: IR {f['since']}, record {table.get(_symbol(f))}" for f in bound
             if f["since"] != table.get(_symbol(f))]
    assert wrong == []


@pytest.mark.parametrize("lib", LIBRARIES)
def test_the_record_holds_the_pinned_release(lib: str, since: ModuleType, pins: dict[str, Any]) -> None:
    text = since.record_path(lib).read_text()
    record = since.Record.loads(text)
    assert record.dumps() == text, "the record is not as codegen/since.py writes it"
    assert record.library == lib
    assert record.prefixes == since.library_config(lib)[0]
    pin = pins[lib].version
    assert pin in record.wheels
    bound = {_symbol(f) for f in _ir(lib)["functions"] if "excluded" not in f}
    assert bound <= record.exports[pin], sorted(bound - record.exports[pin])


@pytest.mark.parametrize("lib", LIBRARIES)
def test_the_installed_pinned_wheel_exports_what_the_record_says(lib: str, since: ModuleType,
                                                                 pins: dict[str, Any]) -> None:
    import importlib.metadata as md

    pin = pins[lib]
    try:
        installed = md.version(pin.wheel)
    except md.PackageNotFoundError:
        pytest.skip(f"{pin.wheel} is not installed")
    binary = since.installed_binary(lib, pin.wheel)
    if installed != pin.version or binary is None:
        pytest.skip(f"{pin.wheel} {installed} is installed; the pin is {pin.version}")
    record = since.load_record(lib)
    found = since.exported_functions(binary, record.prefixes)
    assert found == record.exports[pin.version]
    first = record.first()
    later = [n for n in found if since.release_key(first[n]) > since.release_key(pin.version)]
    assert later == []
    assert since.check(lib) == []


def test_spans_round_trip_through_gaps_and_removals(since: ModuleType) -> None:
    record = since.Record("demo", ["demo"], {}, {})
    for release, names in [("1.10.0", {"demoA", "demoGap"}), ("1.2.0", {"demoA", "demoB", "demoGone"}),
                           ("1.9.0", {"demoA", "demoB", "demoOnce", "demoGone"}), ("1.11.1", {"demoA", "demoGap"})]:
        record.add(release, "demo-wheel", names)
    # Releases sort by number, not as text (1.10.0 after 1.9.0).
    assert record.releases == ["1.2.0", "1.9.0", "1.10.0", "1.11.1"]
    record.add("1.3.0", "demo-wheel", {"demoA", "demoB", "demoGap", "demoGone"})
    assert record.spans() == {
        "demoA": "1.2.0-", "demoB": "1.2.0-1.9.0", "demoGap": "1.3.0,1.10.0-", "demoGone": "1.2.0-1.9.0",
        "demoOnce": "1.9.0",
    }
    again = since.Record.loads(record.dumps())
    assert again.exports == record.exports and again.wheels == record.wheels
    assert record.since() == {"demoA": "<=1.2.0", "demoB": "<=1.2.0", "demoGap": "1.3.0", "demoGone": "<=1.2.0",
                              "demoOnce": "1.9.0"}


def test_only_final_releases_are_read(since: ModuleType) -> None:
    assert since.is_release("2.28.9") and since.is_release("0.9.1.3056")
    assert not any(since.is_release(v) for v in ["0.0.1.dev5", "0.0.0a0", "2.25.1.post1", "3.0.0rc1", "0.0.1"])


def test_the_shared_library_of_any_release_is_found(since: ModuleType) -> None:
    rx = since.binary_pattern("nvidia/cufftmp/cu13/lib/libcufftMp.so.12")
    assert rx.search("nvidia/cufftmp/cu12/lib/libcufftMp.so.11")
    assert rx.search("nvidia/cufftmp/cu13/lib/libcufftMp.so.12")
    assert not rx.search("nvidia/cufftmp/cu13/lib/libcufftMp_static.a")
