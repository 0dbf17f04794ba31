"""The documentation site (docs/, Sphinx: ``make docs``): every gallery example runs and
every ``python`` code block of the site's pages runs, so a broken example fails here; the
site builds with warnings as errors (the gallery's execution left to the examples' own
test, so the build takes seconds); the README stays the short front page and links into
the site.

The design notes (design.md, weights.md, principles.md, scaling.md, supported_ops.md) are
included in the site as they are; their snippets name the reader's own objects
(``my_method``, ``trained_model``) and are not run. The examples and blocks assert what an
independent route gives where they state a number: completeness (``sum(a) = f(x) -
f(x~)``, the model's own forwards), exact Shapley values by enumeration.
"""
from __future__ import annotations

import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The site's own pages, whose ``python`` blocks run (the design notes are not listed;
#: captum.md's one block, the language-model example, runs in tests/test_captum_llm.py with
#: its completeness checked).
PAGES = ["index.md", "getting_started.md", "api.md", "command_line.md",
         "operations.md", "results.md", *sorted(f"methods/{p.name}"
                                               for p in (DOCS / "methods").glob("*.md"))]
EXAMPLES = sorted(p.name for p in (DOCS / "gallery").glob("plot_*.py"))


def _blocks(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(), re.DOTALL | re.MULTILINE)


@pytest.fixture
def figures():
    """Matplotlib without a display; every figure closed after the test."""
    backend = matplotlib.get_backend()
    matplotlib.use("Agg")
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
    matplotlib.use(backend)


def test_the_gallery_has_the_five_worked_examples():
    assert EXAMPLES == ["plot_causal_lm.py", "plot_image_classifier.py", "plot_tabular.py",
                        "plot_taylor_interactions.py", "plot_text_classifier.py"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_gallery_example_runs(example, figures, capsys):
    """The example runs with every warning an error and draws its figure; where it prints
    sums of complete attributions they equal the output change it prints beside them."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scope = runpy.run_path(str(DOCS / "gallery" / example), run_name="__main__")
    import matplotlib.pyplot as plt

    assert plt.get_fignums(), f"{example} drew no figure"
    out = capsys.readouterr().out
    for line in out.splitlines():  # "name: sum S, f(x) - f(0) = C" lines
        found = re.findall(r"sum ([-+]?[\d.]+).*= ([-+]?[\d.]+)", line)
        if found:
            total, change = map(float, found[0])
            assert total == pytest.approx(change, abs=2e-6), line
    if example == "plot_tabular.py":
        exact = scope["estimates"]["Shapley (exact)"]
        torch.testing.assert_close(scope["estimates"]["KernelSHAP"].sum(), exact.sum(),
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)])
def test_docs_page_code_blocks_run(page, figures):
    """Each page's ``python`` blocks, in order, in one namespace, warnings as errors."""
    scope: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, code in enumerate(_blocks(page)):
            exec(compile(code, f"docs/{page} block {i}", "exec"), scope)  # noqa: S102


def test_the_captum_pages_block_is_the_one_the_llm_test_runs():
    """captum.md's only block sits in the section tests/test_captum_llm.py executes."""
    text = (DOCS / "captum.md").read_text()
    section = text.split("## Explaining a language model's answer", 1)[1]
    assert _blocks("captum.md") == [section.split("```python\n", 1)[1].split("```", 1)[0]]


def test_every_page_is_in_the_site():
    """Each Markdown page under docs/ is one the toctrees name (Sphinx -W fails on the
    others too; this says which) and the optional pages are picked up when present."""
    text = (DOCS / "index.md").read_text() + (DOCS / "methods" / "index.md").read_text()
    for page in DOCS.rglob("*.md"):
        name = page.relative_to(DOCS).with_suffix("").as_posix()
        if name in ("index", "methods/index") or name.startswith("auto_examples"):
            continue
        short = name.removeprefix("methods/")
        assert re.search(rf"^{re.escape(short)}$", text, re.MULTILINE) or \
            name in ("llm", "cli"), f"docs/{name}.md is in no toctree"
    assert "<!-- optional pages -->" in (DOCS / "index.md").read_text()


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """``make docs``'s build (the gallery not executed: its examples run above), with the
    command line page's reference generated from every command's ``--help``."""
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-E", "-b", "html",
         "-D", "plot_gallery=0", "-d", str(tmp_path / "doctrees"),
         str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert run.returncode == 0, run.stderr[-4000:]
    html = (tmp_path / "html")
    for page in ("index", "getting_started", "api", "captum", "command_line",
                 "methods/path", "auto_examples/index"):
        assert (html / f"{page}.html").is_file(), page
    assert "IntegratedGradients" in (html / "methods" / "path.html").read_text()
    cli = (html / "command_line.html").read_text()  # the generated reference, every command
    from taylorattr.cli.commands import REGISTERED

    assert all(f"usage: taylorattr {name}" in cli for name in REGISTERED)


def test_readme_is_the_short_front_page(capsys):
    """Under 200 lines; the two set-up commands first; links into the site's pages that
    exist; its one example (at most 20 lines) runs."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    first = re.search(r"```\w*\n(.*?)```", text, re.DOTALL).group(1)
    assert first.splitlines()[:2] == [
        ("make reproduce   # every table and figure of the paper on the bundled data -> "
         "results/report.md, report.html"),
        "make test        # the test suite (installs the test extras into .venv first)"]
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), link
    example = re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert len(example) == 1 and len(example[0].splitlines()) <= 20
    with warnings.catch_warnings():  # it asserts completeness against the model's forwards
        warnings.simplefilter("error")
        exec(compile(example[0], "README.md example", "exec"), {})  # noqa: S102
