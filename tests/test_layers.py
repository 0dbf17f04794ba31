"""The package's layering, checked by import-linter on every run (issue 24).

``pyproject.toml`` holds three contracts: the layers (a module imports only from its own
layer and below), the library never importing the paper's application (issue 37) and no
import loop between the children of any package. They are run here on the real tree, and
on a scratch copy with one upward import, one library-to-application import the layers
allow (Captum's drop-in sits beside the CLI) and one loop added (the contracts must catch
each: a test of the test). ``docs/design.md`` shows the same layers in the same order.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(LINT), "--no-cache"], check=False, cwd=root, env=env,
                          capture_output=True,
                          text=True, timeout=300)


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c["layers"] for c in config["contracts"] if c["type"] == "layers")


def test_the_package_keeps_its_layers_and_has_no_import_loops():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "3 kept, 0 broken" in run.stdout


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A copy of the package and its contracts, to break on purpose."""
    root = tmp_path_factory.mktemp("layers")
    shutil.copytree(ROOT / "src" / "taylorattr", root / "src" / "taylorattr",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _lint_with(scratch: Path, lines: dict[str, str]):
    """``lint-imports`` on ``scratch`` with one scratch line appended to each module of
    ``lines`` (its path under ``src/taylorattr`` -> the line), the modules restored after."""
    paths = {scratch / "src" / "taylorattr" / name: line for name, line in lines.items()}
    originals = {path: path.read_text() for path in paths}
    try:
        for path, line in paths.items():
            path.write_text(originals[path] + "\n" + line + "  # noqa: E402 (scratch)\n")
        return _lint(scratch)
    finally:
        for path, text in originals.items():
            path.write_text(text)


def test_an_upward_import_breaks_the_layers(scratch):
    run = _lint_with(scratch, {"runtime/cost.py": "from ..methods import occlusion"})
    assert run.returncode != 0
    assert "taylorattr.runtime is not allowed to import taylorattr.methods" in run.stdout
    assert "taylorattr.runtime.cost -> taylorattr.methods.occlusion" in run.stdout


def test_a_library_import_of_the_application_breaks_the_library_contract(scratch):
    """``taylorattr.captum`` shares the top layer with the CLI, so the layers contract lets
    it import the experiments; the library contract does not."""
    run = _lint_with(scratch, {"captum/__init__.py": "from ..experiments import paper"})
    assert run.returncode != 0
    assert "Layers import only downward KEPT" in run.stdout
    assert "The library never imports the application BROKEN" in run.stdout
    assert "taylorattr.captum is not allowed to import taylorattr.experiments" in run.stdout


def _library_and_application() -> tuple[list[str], list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["id"] == "library")
    return contract["source_modules"], contract["forbidden_modules"]


def test_every_top_level_module_is_library_or_application():
    """The library contract names every module of the package on one side or the other, so a
    new one cannot slip between them (``docs/design.md`` says which is which)."""
    library, application = _library_and_application()
    names = {f"taylorattr.{p.stem if p.is_file() else p.name}"
             for p in (ROOT / "src" / "taylorattr").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert not set(library) & set(application)
    assert names == set(library) | set(application), sorted(names ^ (set(library) | set(application)))


def test_an_import_loop_inside_a_layer_breaks_the_acyclic_contract(scratch):
    run = _lint_with(scratch, {"methods/saliency.py": "from . import occlusion",
                                "methods/occlusion.py": "from . import saliency"})
    assert run.returncode != 0
    assert "No cycles are allowed in taylorattr.methods" in run.stdout


def test_the_design_doc_draws_the_contracts_layers():
    """docs/design.md's layer diagram lists the contract's layers, top to bottom."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"<!-- layers -->\n```\n(.*?)```", text, re.DOTALL)
    assert block, "docs/design.md lost its layer diagram (the block after <!-- layers -->)"
    drawn = [line.split("  ")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    contract = [" | ".join(m.strip("()").removeprefix("taylorattr.") for m in layer.split(" | "))
                for layer in _layers()]
    assert drawn == contract


#: Modules of more lines than this say in their docstring why they are one module.
LONG_MODULE = 400


def test_long_modules_say_why_they_are_one_module():
    import ast

    unexplained = []
    for path in sorted((ROOT / "src" / "taylorattr").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > LONG_MODULE and \
                "Why one module:" not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(str(path.relative_to(ROOT)))
    assert not unexplained, f"modules over {LONG_MODULE} lines without 'Why one module:' " \
                            f"in their docstring: {unexplained}"


def test_only_the_core_layer_has_loose_top_level_modules():
    """Every other layer is a sub-package whose ``__init__`` is its public face."""
    core = {layer.split(".")[-1].strip("()") for line in _layers()[-3:]
            for layer in line.split(" | ")}
    loose = {p.stem for p in (ROOT / "src" / "taylorattr").glob("*.py")} - {"__init__"}
    # testing: the public home of the common checks (as sklearn.utils.estimator_checks)
    assert loose <= core | {"__main__", "testing"}, sorted(loose - core)


# ---- function-local imports (issue 37) ------------------------------------------------------
#: At most this many imports of the package's own modules are written inside functions in
#: src/, each with its reason in a comment on its line or the line above (the command
#: line's commands import what they run after parsing, so --help waits for no torch).
MAX_LOCAL_IMPORTS = 15


def _local_own_imports(text: str) -> list[tuple[int, bool]]:
    """``(line, has a reason comment)`` of each import of the package's own modules
    written inside a function of the module source ``text``."""
    import ast

    lines = text.splitlines()
    found = []

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            own = (isinstance(child, ast.ImportFrom)
                   and (child.level > 0 or (child.module or "").startswith("taylorattr"))) \
                or (isinstance(child, ast.Import)
                    and any(a.name.startswith("taylorattr") for a in child.names))
            if in_function and own:
                span = lines[child.lineno - 1:child.end_lineno]
                above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                found.append((child.lineno, any("#" in line for line in span)
                              or above.startswith("#")))
            walk(child, inner)

    walk(ast.parse(text), False)
    return found


def test_the_local_import_counter_sees_what_it_should():
    """A test of the test: imports inside functions (nested, in methods, of relative or
    absolute own modules) count, with or without a reason; top-level, TYPE_CHECKING and
    third-party imports do not."""
    text = ("import os\nfrom . import a\nif False:\n    from . import b\n"
            "def f():\n    import torch\n    from .c import d  # why\n"
            "    class K:\n        def g(self):\n            # why, above\n"
            "            import taylorattr.x\n    from ..e import (\n        f,\n    )\n")
    assert _local_own_imports(text) == [(7, True), (11, True), (12, False)]


def test_few_function_local_imports_each_with_its_reason():
    found, lacking = [], []
    for path in sorted((ROOT / "src" / "taylorattr").rglob("*.py")):
        for line, reason in _local_own_imports(path.read_text()):
            where = f"{path.relative_to(ROOT)}:{line}"
            found.append(where)
            if not reason:
                lacking.append(where)
    assert len(found) <= MAX_LOCAL_IMPORTS, f"{len(found)} function-local imports: {found}"
    assert not lacking, f"function-local imports without a reason comment: {lacking}"
