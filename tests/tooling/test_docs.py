"""The documentation's CPU examples run, and what the docs build generates is right.

Every ```` ```{doctest} ```` block of a page under docs/ is run with :mod:`doctest` (the blocks of one
page share their names, in order, as Sphinx's doctest builder runs them), so a page whose example no
longer matches the package fails here, in ``make test``. GPU examples are the files in examples/,
which the pages include. The generated pages (the C-name index, the performance page, the API pages)
are checked from the generators themselves; the site's own build with ``-W`` is ``make docs``.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(`{3,}|:{3,})\{doctest\}[^\n]*\n(.*?)^\1\s*$", re.M | re.S)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE  # the doctest builder's defaults, and ELLIPSIS


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_generated" not in p.parts)


def doctest_blocks(text: str) -> list[tuple[int, str]]:
    """(line, source) of every doctest block of a Markdown page."""
    return [(text.count("\n", 0, m.start()) + 2, m.group(2)) for m in FENCE.finditer(text)]


def run_page(path: Path) -> tuple[int, int, str]:
    """Run a page's doctest blocks in one namespace: (failures, examples, report)."""
    parser, globs, out = doctest.DocTestParser(), {"__name__": "docs"}, []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for line, source in doctest_blocks(path.read_text()):
        test = parser.get_doctest(source, globs, path.name, str(path), line - 1)
        runner.run(test, out=out.append, clear_globs=False)
        globs.update(test.globs)  # a DocTest runs in a copy: carry its names to the page's next block
    result = runner.summarize(verbose=False)
    return result.failed, result.attempted, "".join(out)


PAGES_WITH_EXAMPLES = [p for p in pages() if doctest_blocks(p.read_text())]


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: str(p.relative_to(DOCS)))
def test_the_examples_of_a_page_run(page: Path) -> None:
    failed, attempted, report = run_page(page)
    assert attempted > 0
    assert failed == 0, report


def test_some_pages_have_examples() -> None:
    names = {p.name for p in PAGES_WITH_EXAMPLES}
    assert {"getting-started.md", "distributions.md"} <= names


def test_a_wrong_example_fails(tmp_path: Path) -> None:
    page = tmp_path / "wrong.md"
    page.write_text("# A page\n\n```{doctest}\n>>> 1 + 1\n3\n```\n\nText.\n\n```{doctest}\n>>> 2 * 2\n4\n```\n")
    assert len(doctest_blocks(page.read_text())) == 2
    failed, attempted, report = run_page(page)
    assert (failed, attempted) == (1, 2) and "Expected:\n    3\nGot:\n    2" in report


def _generator(name: str) -> ModuleType:
    """A module of the docs' extension (docs/_ext/mpbind_docs) that needs no Sphinx; the figures need
    matplotlib, of the docs extra."""
    path = DOCS / "_ext" / "mpbind_docs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"mpbind_docs_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_c_index_links_every_bound_function_to_its_python_name() -> None:
    cindex = _generator("cindex")
    entries = {e.c_name: e for e in cindex.entries()}
    assert len(entries) > 1500
    want = {"ncclAllReduce": "mpbind.bindings.nccl.all_reduce",
            "nvshmemx_collective_launch": "mpbind.bindings.nvshmem.collective_launch",
            "cublasMpMatmul": "mpbind.bindings.cublasmp.matmul",
            "cufftMpExecReshapeAsync": "mpbind.bindings.cufftmp.mp_exec_reshape_async"}
    for c_name, target in want.items():
        assert entries[c_name].targets == (target,)
    text = cindex.render(list(entries.values()))
    for c_name, target in want.items():
        assert re.search(rf"``{c_name}``\n     - :py:func:`~{re.escape(target)}`\n     - \S", text), c_name
    for e in entries.values():  # every link names a function the module has
        for target in e.targets:
            module, _, name = target.rpartition(".")
            assert callable(getattr(importlib.import_module(module), name)), target
    assert all(e.since for e in entries.values())


def test_every_kept_result_is_on_the_performance_page_with_its_command(tmp_path: Path) -> None:
    performance = _generator("performance")
    warnings: list[str] = []
    text = performance.render(ROOT / "benchmarks" / "results", tmp_path, "perf", warnings.append)
    assert warnings == []
    for key, run in performance.RUNS.items():
        assert run.title in text, key
        for script in re.findall(r"(?:benchmarks|examples)/\w+\.py", run.command):
            assert (ROOT / script).exists(), f"{key}: {script}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        k.replace("/", "-") + ".png" for k in performance.RUNS
        if (ROOT / "benchmarks" / "results" / f"{k}.png").exists())


def test_every_public_name_has_an_api_entry() -> None:
    api = _generator("api")
    for name in api.public_modules():
        page = api.classify(name)
        if page.missing:
            continue
        module = importlib.import_module(page.dotted)
        listed = page.classes + page.enums + page.functions + page.data
        assert sorted(listed) == sorted(api.public_names(module, page.flat)), page.dotted
        text = api.render(page)
        assert all(f"{page.dotted}.{n}\n" in text for n in listed), page.dotted


def test_a_distribution_figure_is_drawn_from_the_objects() -> None:
    pytest.importorskip("matplotlib", reason="the docs extra draws the figures")
    figures = _generator("figures")
    panels = figures.parse(["rows = dist.by_rows((4, 3), 2)", "X-slabs = dist.Split((4, 4, 4), 2, axis=0)"])
    assert [label for label, _ in panels] == ["rows", "X-slabs"]
    assert figures.draw(panels).startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="not a distribution"):
        figures.parse(["n = dist.numroc(10, 2, 0, 0, 2)"])


def test_the_readme_is_a_short_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme and "make test" in readme
    for link in re.findall(r"\]\((?!https?:|#)([^)#]+)", readme):
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
