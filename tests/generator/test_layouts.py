"""The layout record (codegen/layouts/): what the bindings assume of the releases the other wheel
families install, and its check in ``codegen/generate.py --check``."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def layouts(generator: Callable[[str], ModuleType]) -> ModuleType:
    return generator("layouts")


def _family_releases(versions: ModuleType) -> dict[str, list[str]]:
    return {lib: [w.release for w in pin.others.values()] for lib, pin in versions.load().items()}


def _cu12_cufftmp(generator: Callable[[str], ModuleType]) -> str:
    release: str = generator("versions").load()["cufftmp"].others["cu12"].release
    return release


def test_every_release_a_family_installs_is_recorded_and_agrees(generator: Callable[[str], ModuleType],
                                                                layouts: ModuleType) -> None:
    generate, versions = generator("generate"), generator("versions")
    pinned = {lib: generate.load_library(lib) for lib in generate.LIBRARIES}
    assert layouts.problems(pinned, _family_releases(versions)) == []
    # a release other than the pinned one needs a record; the same release needs none
    assert list(layouts.load("cufftmp")) == [_cu12_cufftmp(generator)]
    assert layouts.load("nccl") == {}


def test_what_cufftmp_11_4_lacks_is_only_status_codes(generator: Callable[[str], ModuleType],
                                                       layouts: ModuleType) -> None:
    release = _cu12_cufftmp(generator)
    pinned = generator("generate").load_library("cufftmp")
    problems, notes = layouts.compare(pinned, release, layouts.load("cufftmp")[release])
    assert problems == []
    assert len(notes) == 2 and all("enum cufftResult" in n for n in notes), notes
    lacks = "CUFFT_MISSING_DEPENDENCY, CUFFT_NVRTC_FAILURE, CUFFT_NVJITLINK_FAILURE, CUFFT_NVSHMEM_FAILURE"
    assert f"lacks {lacks}" in notes[0]
    assert "CUFFT_LICENSE_ERROR = 15" in notes[1]


def _changed(record: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = copy.deepcopy(record)
    edit(out)
    return out


@pytest.mark.parametrize(("what", "edit", "expected"), [
    ("field offset", lambda r: r["structs"]["cudaXtDesc"]["fields"].update(nGPUs="int @8"),
     "struct cudaXtDesc is laid out differently (field nGPUs: int @8 vs int @4)"),
    ("struct size", lambda r: r["structs"]["cufftXt1dFactors"].update(size=104),
     "struct cufftXt1dFactors is laid out differently (size 104 vs 96)"),
    ("field type", lambda r: r["structs"]["cudaLibXtDesc"]["fields"].update(subFormat="long @20"),
     "field subFormat: long @20 vs int @20"),
    ("enum value", lambda r: r["enums"]["cufftType"]["values"].update(CUFFT_C2C=0x2a),
     "enum cufftType has other values: CUFFT_C2C = 42, not 41"),
    ("prototype", lambda r: r["functions"].update(cufftCreate="enum cufftResult (long*)"),
     "cufftCreate is enum cufftResult (long*), the bindings call it as enum cufftResult (int*)"),
])
def test_a_difference_fails_the_check(generator: Callable[[str], ModuleType], layouts: ModuleType,
                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path, what: str,
                                      edit: Callable[[dict[str, Any]], None], expected: str) -> None:
    generate, versions = generator("generate"), generator("versions")
    release = _cu12_cufftmp(generator)
    doc = json.loads(layouts.path("cufftmp").read_text())
    doc["releases"][release] = _changed(doc["releases"][release], edit)
    (tmp_path / "cufftmp.json").write_text(json.dumps(doc))
    monkeypatch.setattr(layouts, "LAYOUTS", tmp_path)
    problems = layouts.problems({"cufftmp": generate.load_library("cufftmp")}, _family_releases(versions))
    assert len(problems) == 1 and expected in problems[0], (what, problems)


def test_a_family_release_without_a_record_fails_the_check(generator: Callable[[str], ModuleType],
                                                           layouts: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    monkeypatch.setattr(layouts, "LAYOUTS", tmp_path)
    pinned = {"cufftmp": generator("generate").load_library("cufftmp")}
    problems = layouts.problems(pinned, {"cufftmp": [_cu12_cufftmp(generator)]})
    assert problems and "no record of cufftmp" in problems[0] and "--layouts" in problems[0]


def test_the_record_of_the_pinned_release_is_its_ir(generator: Callable[[str], ModuleType],
                                                    layouts: ModuleType) -> None:
    """The record is rendered from an IR: that of the pinned headers agrees with the pinned IR."""
    pinned = generator("generate").load_library("cufftmp")
    record = layouts.of(pinned)
    assert layouts.compare(pinned, pinned.version, record) == ([], [])
    assert record["structs"]["cudaXtDesc"]["fields"]["data"] == "void*[64] @264"
    assert record["functions"]["cufftPlan3d"] == "enum cufftResult (int*, int, int, int, enum cufftType)"
    # typedefs are resolved: a typedef that changes its target changes the prototype
    assert "cufftHandle" not in json.dumps(record["functions"])
