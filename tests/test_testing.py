"""``taylorattr.testing``: the common checks on a user's own method.

A toy method, "the input's change times a constant", ``a = c (x - x~)``, written as a
user would write it: its own module in a scratch folder, registered by one
:func:`taylorattr.registry.register` call in a second file. It passes ``check_method``
and runs through the registry by name with the closed-form result. Broken variants of it
(a nondeterministic one, one of the wrong shape, one whose declared cost misses a
forward, one claiming completeness it lacks) fail the check that
catches them, with an AssertionError naming the check and the method.
"""
from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import taylorattr
from taylorattr import registry, testing

TOY = '''
"""Input times a constant: a = scale * (x - x~)."""
import torch

from taylorattr.methods import AttributionMethod
from taylorattr.runtime.cost import Cost


class TimesConstant(AttributionMethod):
    """``a = scale * (x - x~)``: no model call besides the base class's forward."""

    name = "times_constant"

    def _attribute(self, call, x, baselines, target, fx, *, scale: float = 2.0,
                   show_progress=False):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a float, got {type(scale).__name__}")
        x = x.detach()
        return scale * (x - baselines), baselines.unsqueeze(1)

    def _cost(self, x, options):
        return Cost(), 1
'''
REGISTRATION = '''
from taylorattr import registry
from toy_method import TimesConstant

registry.register(registry.MethodSpec("times_constant", TimesConstant, label="xC"))
'''


def _tree_digest() -> str:
    """One hash of every file of the installed package's source."""
    root = Path(taylorattr.__file__).parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy method's module and its registration, imported from a scratch folder;
    unregistered afterwards."""
    before = _tree_digest()
    (tmp_path / "toy_method.py").write_text(textwrap.dedent(TOY))
    (tmp_path / "toy_registration.py").write_text(textwrap.dedent(REGISTRATION))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("toy_registration")
    yield sys.modules["toy_method"].TimesConstant, tmp_path, before
    registry.unregister("times_constant")
    for name in ("toy_method", "toy_registration"):
        sys.modules.pop(name, None)


def test_adding_a_toy_method_touches_two_files_and_passes_the_checks(toy):
    cls, folder, before = toy
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".py") == \
        ["toy_method.py", "toy_registration.py"]
    assert _tree_digest() == before  # nothing in the library was edited
    ran = testing.check_method(cls)
    names = {r.split("-", 1)[1] for r in ran}
    assert {"keeps_shape_dtype_device[float64]", "deterministic", "cost_equals_rows_run",
            "refuses_inputs[nan]", "refuses_target[str]", "refuses_baselines[wrong-shape]",
            "refuses_mistyped_option[scale]", "tuple_inputs"} <= names
    assert "complete" not in names  # not claimed
    # the registry entry passes the same checks, and runs by name: a = 2 (x - b)
    assert len(testing.check_method("times_constant")) == len(ran)
    model, x = testing.conv_model(), testing.image_batch()
    b = torch.full_like(x, 0.25)
    expected = 2.0 * (x - 0.25)
    assert torch.equal(registry.METHODS["times_constant"](model, x, baselines=b), expected)
    assert torch.equal(registry.resolve("xc")(model, x, b), expected)
    assert torch.equal(registry.METHODS["times_constant"](model, x, baselines=b, scale=0.5),
                       0.5 * (x - 0.25))


def _broken(toy_cls, attribute=None, cost=None, complete=False, name="broken"):
    """A subclass of the toy with one part replaced."""
    body = {"name": name, "complete": complete}
    if attribute is not None:
        body["_attribute"] = attribute
    if cost is not None:
        body["_cost"] = cost
    return type(name, (toy_cls,), body)


def _nondeterministic(self, call, x, baselines, target, fx, *, scale: float = 2.0,
                      show_progress=False):
    return torch.rand_like(x), baselines.unsqueeze(1)


def _wrong_shape(self, call, x, baselines, target, fx, *, scale: float = 2.0,
                 show_progress=False):
    return (scale * (x - baselines))[..., :3], baselines.unsqueeze(1)


def _one_more_forward(self, call, x, baselines, target, fx, *, scale: float = 2.0,
                      show_progress=False):
    call.model(x)  # a forward the cost does not declare
    return super(type(self), self)._attribute(call, x, baselines, target, fx, scale=scale)


@pytest.mark.parametrize("kind,check", [
    ("nondeterministic", "deterministic"),
    ("wrong-shape", "keeps_shape_dtype_device[float64]"),
    ("undeclared-forward", "cost_equals_rows_run"),
    ("false-completeness", "complete"),
])
def test_a_broken_method_fails_the_check_that_catches_it(toy, kind, check):
    cls = toy[0]
    broken = {"nondeterministic": lambda: _broken(cls, _nondeterministic),
              "wrong-shape": lambda: _broken(cls, _wrong_shape),
              "undeclared-forward": lambda: _broken(cls, _one_more_forward),
              # a = 2 (x - x~) is not f(x) - f(x~)
              "false-completeness": lambda: _broken(cls, complete=True)}[kind]()
    found = {c.name: c for c in testing.method_checks(broken)}
    with pytest.raises(AssertionError) as err:
        found[check]()
    assert f"check {check!r} failed for broken" in str(err.value)
    # check_method stops at the first failing check, naming it
    with pytest.raises(AssertionError, match=r"check '.+' failed for broken"):
        testing.check_method(broken)


def test_the_checks_that_pass_stay_independent_of_the_broken_one(toy):
    """The wrong-cost method still passes its shape, determinism and refusal checks: a
    failure is the failing check's, not everyone's."""
    broken = _broken(toy[0], _one_more_forward)
    results = {}
    for c in testing.method_checks(broken):
        try:
            c()
            results[c.name] = True
        except AssertionError:
            results[c.name] = False
    assert [n for n, ok in results.items() if not ok] == ["cost_equals_rows_run"]


def test_settings_reach_the_method_and_bad_ones_are_refused(toy):
    cls = toy[0]
    assert testing.check_method(cls, {"scale": 3.0})
    with pytest.raises(TypeError, match="no_such"):
        testing.check_method(cls, {"no_such": 1})
    with pytest.raises(TypeError, match="method must be"):
        testing.check_method(object)
    with pytest.raises(ValueError, match="method must be"):
        testing.check_method("no_such_method")


def test_the_module_imports_without_pytest_or_captum():
    code = ("import sys; sys.modules['pytest'] = None; sys.modules['captum'] = None; "
            "import taylorattr.testing as t; print(len(t.method_checks('saliency')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert int(out.stdout) > 10
