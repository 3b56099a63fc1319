"""One source of the pinned versions: codegen/versions.toml feeds pyproject.toml's pins, the IRs and
the tests; and the edits codegen/bump.py makes from it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]


@pytest.fixture(scope="module")
def versions(generator: Callable[[str], ModuleType]) -> ModuleType:
    return generator("versions")


def test_pyproject_pins_and_specs_agree_with_versions_toml(versions: ModuleType) -> None:
    assert versions.problems() == []
    pins = versions.load()
    assert sorted(pins) == sorted(LIBRARIES)
    test_pins = versions.wheel_pins(pins, headers=True)
    assert len(test_pins) > len(versions.wheel_pins(pins, headers=False)) == len(LIBRARIES)


def test_a_stale_pin_is_reported_then_rewritten(versions: ModuleType) -> None:
    text = versions.PYPROJECT.read_text()
    pins = versions.load()
    wheel, version = pins["nccl"].wheel, pins["nccl"].version
    stale = text.replace(f'"{wheel}=={version}"', f'"{wheel}==2.0.1"')
    assert stale != text
    problems = versions.pyproject_problems(stale, pins)
    # the extras of the generator's family (cu13, test) pin it
    generators = [extra for extra, (family, _) in versions.EXTRAS.items() if family is None]
    assert generators == ["cu13", "test"]
    assert problems == [f"pyproject.toml: extra {extra} pins {wheel}==2.0.1, codegen/versions.toml {version}"
                        for extra in generators]
    assert versions.rewrite_pyproject(stale, pins) == text
    missing = text.replace(f'    "{pins["cublasmp"].wheel}=={pins["cublasmp"].version}",\n', "", 1)
    assert versions.pyproject_problems(missing, pins) == [
        f"pyproject.toml: extra cu13 does not pin {pins['cublasmp'].wheel}=={pins['cublasmp'].version}"]


def test_the_cu12_extra_pins_the_cu12_family(versions: ModuleType) -> None:
    text = versions.PYPROJECT.read_text()
    pins = versions.load()
    cu12 = pins["cufftmp"].others["cu12"]
    assert (cu12.family, cu12.release) == ("cu12", cu12.version.split(".post")[0])
    assert versions.wheel_pins(pins, headers=False, family="cu12") == {
        p.others["cu12"].wheel: p.others["cu12"].version for p in pins.values()}
    stale = text.replace(f'"{cu12.wheel}=={cu12.version}"', f'"{cu12.wheel}==11.0.0"')
    assert versions.pyproject_problems(stale, pins) == [
        f"pyproject.toml: extra cu12 pins {cu12.wheel}==11.0.0, codegen/versions.toml {cu12.version}"]
    assert versions.rewrite_pyproject(stale, pins) == text
    mixed = text.replace(f'"{cu12.wheel}=={cu12.version}"', f'"{pins["cufftmp"].wheel}=={pins["cufftmp"].version}"')
    assert f"pyproject.toml: extra cu12 does not pin {cu12.wheel}=={cu12.version}" in \
        versions.pyproject_problems(mixed, pins)
    with pytest.raises(ValueError, match="family"):
        versions.load(versions.VERSIONS.read_text().replace('cu12 = { wheel = "nvidia-nccl-cu12"',
                                                            'cu12 = { wheel = "nvidia-nccl-cu13"'))


def test_set_version_changes_one_library(versions: ModuleType) -> None:
    text = versions.VERSIONS.read_text()
    before = versions.load(text)
    after = versions.load(versions.set_version(text, "nvshmem", "3.9.1"))
    assert after["nvshmem"].version == "3.9.1"
    assert {k: v for k, v in after.items() if k != "nvshmem"} == {k: v for k, v in before.items() if k != "nvshmem"}
    with pytest.raises(KeyError):
        versions.set_version(text, "nosuchlib", "1.0.0")


@pytest.mark.parametrize("lib", LIBRARIES)
def test_each_ir_is_generated_from_its_pin(lib: str, pins: dict[str, Any]) -> None:
    ir = json.loads((REPO / "codegen" / "ir" / f"{lib}.json").read_text())
    assert (ir["wheel"], ir["version"]) == (pins[lib].wheel, pins[lib].version)


def test_generate_check_fails_on_a_stale_pin(generator: Callable[[str], ModuleType], versions: ModuleType,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    generate = generator("generate")
    stale = tmp_path / "pyproject.toml"
    pin = versions.load()["cufftmp"]
    stale.write_text(versions.PYPROJECT.read_text().replace(f"=={pin.version}", "==12.0.0.1"))
    monkeypatch.setattr(versions, "PYPROJECT", stale)
    assert generate.check([]) == 1
    assert f"pins {pin.wheel}==12.0.0.1, codegen/versions.toml {pin.version}" in capsys.readouterr().out


def test_no_test_hard_codes_a_pinned_version(versions: ModuleType) -> None:
    """Tests read the pins (the `pins` and `installed` fixtures, the IR); a literal would go stale at the
    next bump. Every family's pins count."""
    every = {w.version for p in versions.load().values() for w in p.families().values()}
    needles = every | {".".join(v.split(".")[:3]) for v in every}
    rx = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in needles) + r")(?![\w.])")
    tests = REPO / "tests"
    found = [f"{path.relative_to(REPO)}:{no}" for path in sorted(tests.rglob("*.py")) if "fixtures" not in path.parts
             for no, line in enumerate(path.read_text().splitlines(), 1) if rx.search(line)]
    assert found == []


def test_bump_lists_what_changed(generator: Callable[[str], ModuleType]) -> None:
    bump, library = generator("bump"), generator("ir_types").Library
    old = json.loads((REPO / "codegen" / "ir" / "nccl.json").read_text())
    new = json.loads(json.dumps(old))
    gone = new["functions"].pop(0)
    new["functions"][0]["since"] = "9.9.9"
    new["constants"][0]["value"] += 1
    changes = bump.ir_changes(library.from_json(old), library.from_json(new))
    assert f"function {gone['name']} is gone" in changes
    assert f"since of {new['functions'][0]['name']} changed: {old['functions'][1]['since']} -> 9.9.9" in changes
    assert any(line.startswith(f"constant {old['constants'][0]['name']} changed") for line in changes)
    assert len(changes) == 3


def test_bump_lists_the_default_roles_of_new_functions(generator: Callable[[str], ModuleType]) -> None:
    bump, generate = generator("bump"), generator("generate")
    lib = generate.load_library("nccl")
    # ncclMemAlloc(void** ptr, size_t size): `ptr` is an output by default, as the spec leaves it
    alloc = lib.function("ncclMemAlloc")
    added = bump.default_roles(replace(lib, functions=()), replace(lib, functions=(alloc,)), "out")
    assert len(added) == 1 and added[0].startswith("ncclMemAlloc: pointer parameters with the default role: ptr (out);")


def test_bump_finds_the_old_version_in_the_readme(generator: Callable[[str], ModuleType],
                                                  pins: dict[str, Any]) -> None:
    bump = generator("bump")
    readme = (REPO / "README.md").read_text()
    mentioned = [lib for lib, p in pins.items() if p.version in readme]
    if not mentioned:
        pytest.skip("the README names no pinned version")
    assert any(line.startswith("README.md:") for line in bump.mentions(pins[mentioned[0]].version))


@pytest.mark.parametrize("tool", ["bump.py", "since.py", "generate.py"])
def test_the_tools_document_themselves(tool: str) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "codegen" / tool), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"python codegen/{tool}" in proc.stdout
