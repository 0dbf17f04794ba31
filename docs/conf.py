"""Sphinx configuration of taylorattr's documentation site (``make docs``).

Sphinx with autodoc, myst-parser and sphinx-gallery: what Captum, SHAP and Zennit use, so
a user coming from them finds the same layout (an API reference generated from the
docstrings, a gallery of scripts whose figures are made when the site is built), and the
design notes stay Markdown files that read as well on GitHub as on the site.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "src"))
os.environ.setdefault("MPLBACKEND", "Agg")

project = "taylorattr"
author = "taylorattr contributors"
copyright = "2026, taylorattr contributors"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "gallery/GALLERY_HEADER.rst", "auto_examples/*.ipynb",
                    "auto_examples/*.py", "auto_examples/*.zip", "auto_examples/*.json"]
# Pages written by other work that may or may not be present in a checkout: the toctree
# names them only when they exist (index.md reads OPTIONAL_PAGES through this list).
OPTIONAL_PAGES = [p for p in ("llm", "cli") if (DOCS / f"{p}.md").exists()]

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

sphinx_gallery_conf = {
    "examples_dirs": "gallery",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 1,
    "abort_on_example_error": True,
    "within_subsection_order": "FileNameSortKey",
    "write_computation_times": False,
}

html_theme = "alabaster"
html_static_path: list[str] = []
html_theme_options = {"description": "Exact Taylor decompositions and attribution methods "
                                     "for PyTorch", "fixed_sidebar": True}


def cli_reference() -> str:
    """Every command's ``--help``, as the program prints it (80 columns), in Markdown."""
    import contextlib
    import io

    from taylorattr.cli import main
    from taylorattr.cli.commands import REGISTERED

    os.environ["COLUMNS"] = "80"
    parts = []
    for name in ["", *REGISTERED]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([name, "--help"] if name else ["--help"])
        parts += [f"### `taylorattr {name or '--help'}`", "", "```text",
                  out.getvalue().rstrip(), "```", ""]
    return "\n".join(parts)


def _generated(app, docname, source):
    """The index's optional pages (those that exist, at its marker line) and the command
    line page's reference (every command's help, at its marker line)."""
    if docname == "index":
        source[0] = source[0].replace("<!-- optional pages -->", "\n".join(OPTIONAL_PAGES))
    if docname == "command_line":
        source[0] = source[0].replace("<!-- cli reference -->", cli_reference())


def setup(app):
    app.connect("source-read", _generated)
