"""Sphinx configuration of mpbind's documentation (``make docs``: build/docs/html).

The API reference documents the installed package (``make docs`` installs it with the ``docs`` extra);
the pages under _generated/ are written at build time by the extension in _ext/mpbind_docs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mpbind

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "mpbind"
author = "the mpbind authors"
copyright = "the mpbind authors, Apache License 2.0"
release = mpbind.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "mpbind_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The API entries come from the installed package's docstrings (RST) and signatures.
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_docstring_signature = True
autodoc_inherit_docstrings = False
add_module_names = False


html_theme = "furo"
html_title = f"mpbind {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
