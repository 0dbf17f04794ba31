"""The public API at the top level (issue 47): every registered method class and the
library's public functions under ``import taylorattr as ta``, listed in ``__all__`` and
``dir(ta)``, resolved by editors through the ``TYPE_CHECKING`` block; the paper's
application is not there and no attribute access registers anything on ``ta.METHODS``;
the registry is filled on first use (a NoiseTunnel given a registry name on a fresh
import); ``py.typed`` is shipped and the type checker passes over the public modules.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import jedi
import pytest
import tomllib
import torch
from torch import nn

import taylorattr as ta

pytestmark = pytest.mark.filterwarnings("error")

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DT = torch.float64


def _fresh(code: str) -> str:
    """``code`` run in a fresh interpreter with this checkout's source first (its stdout)."""
    run = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=300, check=False,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_every_registered_class_resolves_at_the_top_level():
    """A row's class is ``ta.<its name>``; a rule row of LRP (``rule_class``: LRP with that
    default rule) is ``ta.LRP`` with ``rule=`` its rule, giving the same relevance."""
    classes = {spec.cls for spec in ta.METHODS.values()}
    assert len(classes) == 30
    for cls in classes:
        if cls.__name__.startswith("LRP_"):
            assert cls.__bases__ == (ta.LRP,) and "LRP" in dir(ta)
            continue
        assert cls.__name__ in dir(ta) and cls.__name__ in ta.__all__
        assert getattr(ta, cls.__name__) is cls
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).to(DT).eval()
    x = torch.randn(2, 4, dtype=DT)
    for spec in ta.METHODS.values():
        if spec.cls.__name__.startswith("LRP_"):
            rows = spec.cls(net).attribute(x, target=1)
            top = ta.LRP(net, rule=spec.cls.default_rule).attribute(x, target=1)
            torch.testing.assert_close(rows, top, rtol=0, atol=0)
    for name in ("Saliency", "GuidedBackprop", "Deconvolution", "KernelShap", "Lime",
                 "NoiseTunnel", "LRP", "GradCAM", "ShapleyValues", "LayerConductance"):
        assert isinstance(getattr(ta, name), type) and name in dir(ta)


def test_dir_is_all_and_every_name_resolves():
    assert dir(ta) == ta.__all__ == sorted(set(ta.__all__))
    for name in ta.__all__:
        assert getattr(ta, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        ta.no_such_name  # noqa: B018


def test_type_checking_block_names_exactly_the_lazy_table():
    """The editors' imports (``if TYPE_CHECKING:``) and the run-time table name the same
    objects from the same modules, each re-exported explicitly (``import X as X``)."""
    tree = ast.parse((SRC / "taylorattr" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        module = "taylorattr" + (f".{node.module}" if node.module else "")
        for alias in node.names:
            seen[alias.asname] = (module, alias.name)
    expected = {n: (m, n) for n, m in ta._EXPORTS.items()}
    expected |= {n: tuple(m.rsplit(".", 1)) for n, m in ta._SUBMODULES.items()}
    assert seen == expected
    assert sorted(seen) == ta.__all__


def test_no_attribute_registers_anything_and_the_application_is_not_here():
    """In a fresh interpreter: ``ta.METHODS`` is the same (names and rows) before and after
    touching every attribute of ``ta``; the application's names say where they live now."""
    out = _fresh(
        "import json, taylorattr as ta\n"
        "before = {k: repr(v) for k, v in ta.METHODS.items()}\n"
        "for name in dir(ta): getattr(ta, name)\n"
        "after = {k: repr(v) for k, v in ta.METHODS.items()}\n"
        "moved = {}\n"
        "for name in ('evaluate', 'audit', 'AuditReport', 'interaction_map', 'experiments',\n"
        "             'principles', 'paper_methods', 'models', 'data', 'reporting', 'plotting'):\n"
        "    try: getattr(ta, name)\n"
        "    except AttributeError as e: moved[name] = str(e)\n"
        "print(json.dumps([before == after, len(before), len(after), moved]))\n")
    same, n_before, n_after, moved = json.loads(out)
    assert same and n_before == n_after == 33
    assert moved["evaluate"].endswith("from taylorattr.experiments.evaluate import evaluate")
    assert moved["audit"].endswith("from taylorattr.principles import audit")
    assert moved["interaction_map"].endswith(
        "from taylorattr.reporting.interaction_plot import interaction_map")
    assert moved["experiments"].endswith("import taylorattr.experiments")
    assert len(moved) == 11


def test_the_registry_is_filled_on_first_use_and_captum_style_noise_tunnel():
    """On a fresh import, before anything touched the registry, ``NoiseTunnel(model,
    "integrated_gradients")`` runs, and ``NoiseTunnel(IntegratedGradients(model))`` (Captum's
    spelling) gives the same; both equal the closed form on a linear model: IG of
    ``w.x + c`` from 0 is ``x * w``, so SmoothGrad of it is ``mean_k (x + noise_k) * w``."""
    out = _fresh(
        "import json, torch\n"
        "from taylorattr.methods import IntegratedGradients, NoiseTunnel\n"
        "from taylorattr.methods.noise_tunnel import draw_noise\n"
        "torch.manual_seed(0)\n"
        "net = torch.nn.Linear(3, 2).double().eval()\n"
        "x = torch.randn(2, 3, dtype=torch.float64)\n"
        "kw = dict(target=1, nt_samples=4, stdevs=0.3, seed=5)\n"
        "a = NoiseTunnel(net, 'integrated_gradients').attribute(x, **kw)\n"
        "b = NoiseTunnel(IntegratedGradients(net)).attribute(x, **kw)\n"
        "noise = draw_noise(x, 4, 0.3, seed=5)\n"
        "hand = ((x[:, None] + noise) * net.weight[1].detach()).mean(1)\n"
        "print(json.dumps([torch.equal(a, b), (a - hand).abs().max().item()]))\n")
    same, err = json.loads(out)
    assert same and err < 1e-12


def _jedi_script(code: str):
    project = jedi.Project(str(ROOT), sys_path=[str(SRC), *sys.path], smart_sys_path=False)
    return jedi.Script(code, path=str(ROOT / "scratch.py"), project=project)


def test_jedi_resolves_top_level_classes_through_the_type_checking_block():
    """An editor (jedi, static analysis only) finds ``ta.IntegratedGradients`` and
    ``ta.Saliency`` in their modules and shows the constructor's arguments."""
    for name, module in (("IntegratedGradients", "integrated_gradients"),
                         ("Saliency", "saliency")):
        code = f"import taylorattr as ta\nta.{name}"
        found = _jedi_script(code).infer(2, len(f"ta.{name}"))
        assert [(d.name, d.type) for d in found] == [(name, "class")]
        assert found[0].module_path == SRC / "taylorattr" / "methods" / f"{module}.py"
        call = f"import taylorattr as ta\nta.{name}("
        sigs = _jedi_script(call).get_signatures(2, len(f"ta.{name}("))
        assert [p.name for p in sigs[0].params][:1] == ["model"]


def test_jedi_shows_the_written_attribute_options_of_a_top_level_class():
    """``ta.IntegratedGradients(model).attribute(`` shows ``n_steps`` in an editor: the
    written signature, read statically through the top level's TYPE_CHECKING block."""
    code = "import taylorattr as ta\nta.IntegratedGradients(model).attribute("
    sigs = _jedi_script(code).get_signatures(2, len("ta.IntegratedGradients(model).attribute("))
    names = [p.name for p in sigs[0].params]
    assert names[:3] == ["inputs", "baselines", "target"]
    assert "n_steps" in names and "return_convergence_delta" in names


def test_py_typed_is_shipped():
    assert (SRC / "taylorattr" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["taylorattr"]


def _mypy(*files: str) -> tuple[str, int]:
    """mypy with pyproject's configuration (its files, or ``files``), from the checkout."""
    from mypy import api

    args = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
            str(ROOT / ".mypy_cache"), *files]
    out, err, status = api.run(args)
    return out + err, status


def test_the_type_checker_passes_over_the_public_api(monkeypatch):
    """``make lint``'s mypy run: the top level, the registry and the user's uses in
    tests/type_checked/public_api.py, clean."""
    monkeypatch.chdir(ROOT)
    out, status = _mypy()
    assert status == 0 and "Success: no issues found" in out, out


def test_the_type_checker_sees_the_public_api(tmp_path, monkeypatch):
    """A test of the test: a misspelt top-level name, a wrong annotation of a public class
    and a misspelt keyword are each a type error (``__getattr__`` is hidden from the
    checker, the TYPE_CHECKING block gives it the real classes)."""
    monkeypatch.chdir(ROOT)
    use = tmp_path / "wrong_use.py"
    use.write_text("import torch\nimport taylorattr as ta\n\n"
                   "def f(model: torch.nn.Module) -> None:\n"
                   "    ta.IntegratedGradient(model)\n"
                   "    spec: int = ta.METHODS['saliency']\n"
                   "    ta.taylor_terms(model, torch.zeros(1), ordr=2)\n")
    out, status = _mypy(str(use))
    assert status == 1, out
    assert 'Module has no attribute "IntegratedGradient"' in out
    assert 'has type "MethodSpec", variable has type "int"' in out
    assert 'Unexpected keyword argument "ordr"' in out
