"""mpbind's Sphinx extension: the pages written from the package and the repository at build time.

* ``_generated/api/``: the API reference, one page per public module (:mod:`.api`);
* ``_generated/c-index.rst``: every bound C function → its Python name and the release that added it
  (:mod:`.cindex`); the build checks that every entry's link resolves;
* ``_generated/performance.inc``: the kept benchmark results (:mod:`.performance`), included by
  ``performance.md``;
* the ``distribution`` directive: a figure of :mod:`mpbind.distributions` values (:mod:`.figures`).

Generated files live in docs/_generated (ignored by git) and are rewritten only when they change.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.domains.python import PythonDomain
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from . import api, cindex, figures, performance

logger = logging.getLogger(__name__)

GENERATED = "_generated"
REPO = Path(__file__).resolve().parents[3]

# The C prototype line of a flat binding's docstring ("ncclResult_t ncclAllReduce(const void* sendbuff, ...)"),
# its return type included.
C_PROTOTYPE = re.compile(r"^\s*(?:[\w\s*]+?\b)?[A-Za-z_]\w*\(.*\)\s*;?\s*$")
# A line whose indented continuation is RST markup, not an example: a list item, a directive, a field.
MARKUP_LINE = re.compile(r"\s*([-*+] |\d+\. |\.\. |:[^:`]+:(\s|$))")


def generate(app: Sphinx) -> None:
    out = Path(app.srcdir) / GENERATED
    out.mkdir(exist_ok=True)
    for page in api.write(out):
        if page.missing:
            logger.info("mpbind docs: %s needs %s, not installed: its API page lists no entries",
                        page.dotted, page.missing)
    app.env.mpbind_c_index = [t for e in cindex.write(out) for t in e.targets]  # type: ignore[attr-defined]
    text = performance.render(REPO / "benchmarks" / "results", out / "perf", f"{GENERATED}/perf",
                              lambda message: logger.warning(message, type="mpbind", subtype="performance"))
    path = out / "performance.inc"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def literal_examples(lines: list[str]) -> None:
    """Module docstrings show code as an indented block after a paragraph, as plain text reads it; in
    RST that is a block quote (whose nested indentation is an error): make each such block a literal one."""
    i = 1
    while i < len(lines):
        prev = i - 1
        if lines[i].strip() and not lines[prev].strip() and prev > 0 and lines[prev - 1].strip():
            before = lines[prev - 1]
            plain = not before.rstrip().endswith("::") and not MARKUP_LINE.match(before)
            if plain and _indent(lines[i]) > _indent(before) and _indent(before) == 0:
                lines[prev:prev] = ["", "::"]
                i += 2
        i += 1


def tidy_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Docstrings as the API pages show them: a flat function's C prototype as code (its ``*`` are C's,
    not emphasis); a module's example blocks as literal blocks; no docstring of a value's type (a dict
    constant would otherwise be documented by ``dict``'s own docstring)."""
    if what == "function" and name.startswith("mpbind.bindings."):
        python = name.rpartition(".")[2]
        for i, line in enumerate(lines):
            if C_PROTOTYPE.match(line) and not line.strip().startswith(python + "("):
                lines[i] = f"C: ``{line.strip()}``"
    elif what == "module":
        literal_examples(lines)
    elif what == "data" and lines:
        own = (type(obj).__doc__ or "").strip().splitlines()
        if own and lines[0].strip() == own[0].strip():
            lines.clear()


def check_c_index(app: Sphinx, env: BuildEnvironment) -> None:
    """Every C-index entry must link to an API entry: a missing one is a warning (an error under -W)."""
    objects = env.get_domain("py").objects  # type: ignore[attr-defined]
    targets = getattr(env, "mpbind_c_index", [])
    missing = [t for t in targets if t not in objects]
    if missing:
        logger.warning("C-name index: %d entries link to no API entry, e.g. %s", len(missing),
                       ", ".join(missing[:5]), type="mpbind", subtype="c-index")


class CanonicalPythonDomain(PythonDomain):
    """Python's domain, keeping the first of two canonical names that coincide: nanobind names the module
    of every core class ``mpbind._core``, so distinct public classes (``mpbind.nccl.Registration`` and
    ``mpbind.nvshmem.Registration``) claim one canonical name. Each is still documented under its own."""

    def note_object(self, name: str, objtype: str, node_id: str, aliased: bool = False,
                    location: Any = None) -> None:
        if aliased and name in self.objects and self.objects[name].aliased:
            return
        super().note_object(name, objtype, node_id, aliased, location)


class DistributionFigure(SphinxDirective):
    """``label = expression`` lines of :mod:`mpbind.distributions` values (``dist``): the code, then the
    figure of every element coloured by its owning rank."""

    has_content = True
    option_spec = {"caption": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        source = "\n".join(self.content)
        try:
            panels = figures.parse(list(self.content))
            path = figures.write(panels, Path(self.env.srcdir) / GENERATED / "fig", source)
        except Exception as exc:  # a wrong example must fail the build, naming the page and line
            raise self.error(f"distribution figure: {exc}") from exc
        code = nodes.literal_block(source, "from mpbind import distributions as dist\n" + source, language="python")
        rel = "/" + path.relative_to(Path(self.env.srcdir)).as_posix()
        figure = nodes.figure("", nodes.image(uri=rel, alt=self.options.get("caption", "distribution")))
        if "caption" in self.options:
            figure += nodes.caption(self.options["caption"], self.options["caption"])
        return [code, figure]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    app.connect("autodoc-process-docstring", tidy_docstring)
    app.connect("env-check-consistency", check_c_index)
    app.add_directive("distribution", DistributionFigure)
    app.add_domain(CanonicalPythonDomain, override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
