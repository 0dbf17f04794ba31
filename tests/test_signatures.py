"""The method contract (issue 47): every registered method writes its ``attribute`` out,
naming exactly the options its ``_attribute`` takes with the same defaults and the shared
arguments, with ``typing.overload``s on ``return_convergence_delta``, so that the two cannot
drift and an editor reads them (jedi); ``_attribute`` returns a frozen
:class:`~taylorattr.methods._call.Attributed`, the call has no side channel, the class
declares one :class:`~taylorattr.methods._call.Traits` value, the pipeline steps are plain
functions no class overrides, and a call is ``attribute -> explain -> run -> _attribute``."""
from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
import warnings
from pathlib import Path

import pytest
import torch
from _builders import DT
from torch import nn

import taylorattr as ta
from taylorattr import methods as M
from taylorattr.baselines import ReferenceSet
from taylorattr.methods import _pipeline
from taylorattr.methods._base import AttributionMethod
from taylorattr.methods._call import SHARED, Attributed, Call, Traits
from taylorattr.registry import METHODS
from taylorattr.runtime.completeness import CompletenessWarning

_KW = inspect.Parameter.KEYWORD_ONLY


def _methods():
    found = {spec.cls for spec in METHODS.values()}
    found.add(M.LayerConductance)  # not registered (no paper row), a method all the same
    return sorted(found, key=lambda c: c.__name__)


def _written(cls):
    """The ``attribute`` function ``cls`` resolves to, and the class that writes it."""
    owner = next(c for c in cls.__mro__ if "attribute" in c.__dict__)
    return owner.__dict__["attribute"], owner


# ---- written signatures ----------------------------------------------------------------
@pytest.mark.parametrize("cls", _methods(), ids=lambda c: c.__name__)
def test_the_written_attribute_names_exactly_the_options_and_the_shared_arguments(cls):
    fn, owner = _written(cls)
    assert owner is not AttributionMethod and owner.__module__.startswith("taylorattr.methods.")
    params = inspect.signature(fn).parameters
    # the independent route: the options _attribute reads, and the shared table
    own = cls.options()
    expected = list(own) + [k for k, _ in SHARED if k not in own]
    named = [k for k, p in params.items() if p.kind is _KW]
    assert named == expected
    for k, p in own.items():
        assert params[k].default == p.default, k
    for k, default in SHARED:
        assert params[k].default is default or params[k].default == default, k
    assert list(params)[:2] == ["self", "inputs"]
    assert ("baselines" in params) == (cls.traits.baseline_kind != "none")
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    # written in the class's source, not generated: the def names every option
    source = inspect.getsource(fn)
    assert source.lstrip().startswith("def attribute(")
    assert all(f"{k}:" in source for k in expected)


@pytest.mark.parametrize("cls", _methods(), ids=lambda c: c.__name__)
def test_overloads_type_the_result_by_return_convergence_delta(cls):
    fn, _ = _written(cls)
    overloads = typing.get_overloads(fn)
    assert len(overloads) == 2
    impl = inspect.signature(fn).parameters
    hints = [typing.get_type_hints(o, sys.modules[fn.__module__].__dict__) for o in overloads]
    assert [h["return_convergence_delta"] for h in hints] == [typing.Literal[False],
                                                               typing.Literal[True]]
    assert typing.get_origin(hints[1]["return"]) is tuple
    for o in overloads:  # the same parameters as the implementation
        assert list(inspect.signature(o).parameters) == list(impl)


def test_the_full_documentation_of_attribute_is_its_options_and_the_shared_arguments():
    doc = M.IntegratedGradients.attribute.__doc__
    assert "n_steps" in doc and "gausslegendre" in doc  # IG's _attribute docstring
    assert "return_convergence_delta" in doc and "layer_baselines" in doc  # SHARED_DOC


def test_an_editor_reads_the_options_of_attribute():
    import jedi  # the dev extra installs it
    src = str(Path(ta.__file__).parents[1])
    site = [p for p in sys.path if p.endswith("site-packages")]
    code = "import taylorattr as ta\nmodel = None\nta.methods.IntegratedGradients(model).attribute("
    project = jedi.Project(path=src, sys_path=[src, *site], smart_sys_path=False)
    signatures = jedi.Script(code, project=project).get_signatures(3, len(code.splitlines()[-1]))
    assert signatures, "jedi found no signature"
    names = {p.name for s in signatures for p in s.params}
    assert {"inputs", "baselines", "target", "n_steps", "return_convergence_delta"} <= names
    assert "kwargs" not in names and "args" not in names


# ---- one explicit contract -------------------------------------------------------------
def test_the_call_has_no_side_channel_and_results_are_frozen():
    assert "notes" not in {f.name for f in dataclasses.fields(Call)}
    done = Attributed(torch.zeros(1, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.attributions = torch.ones(1, 2)
    assert Attributed.of((torch.zeros(1, 2), None)).references is None  # a user's plain pair
    with pytest.raises(TypeError, match="_attribute must return"):
        Attributed.of(torch.zeros(2, 2))  # not read row by row as a pair


def test_the_base_class_is_short_and_no_class_overrides_a_pipeline_step():
    lines, _ = inspect.getsourcelines(AttributionMethod)
    assert len(lines) <= 150
    steps = {"explain", "prepare", "run", "check", "self_check", "delta", "_self_check",
             "_core", "_per_sample", "_delta", "_attribute_reported"}
    for cls in _methods() + [M.NoiseTunnel, M.Deconvolution]:
        for klass in cls.__mro__:
            if klass in (AttributionMethod, object):
                continue
            assert not steps & set(klass.__dict__), (cls.__name__, klass.__name__)
        # what a class adapts before the pipeline is declared: a route in its traits
        route = cls.traits.route
        assert route is None or (inspect.isfunction(route) and "." not in route.__qualname__)


@pytest.mark.parametrize("cls", _methods(), ids=lambda c: c.__name__)
def test_every_class_declares_its_behaviour_as_one_traits_value(cls):
    assert isinstance(cls.traits, Traits)
    for f in dataclasses.fields(Traits):
        for klass in cls.__mro__[:-1]:  # no flag set beside the traits value
            value = klass.__dict__.get(f.name)
            assert value is None or klass is AttributionMethod, (klass.__name__, f.name)
        assert getattr(cls, f.name) == getattr(cls.traits, f.name)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).flatten(1))


def _call_of(cls, model, x):
    """A plain call of ``cls`` on ``x``: (method, args, options)."""
    method = cls(model)
    kind = cls.traits.baseline_kind
    base = () if kind == "none" else (
        ReferenceSet(torch.zeros(2, *x.shape[1:], dtype=DT)) if kind == "distribution"
        else 0.0,)
    options = {"conductance_layer": model.conv} if cls is M.LayerConductance else {}
    if "n_samples" in cls.options() and cls.traits.perturbation:
        options["n_samples"] = 40 if cls is M.KernelShap else 4
    return method, (x, *base), options


@pytest.mark.parametrize("cls", _methods(), ids=lambda c: c.__name__)
def test_attribute_reaches_attribute_in_three_frames_and_gets_a_result_value(cls):
    model = _Net().to(DT).eval()
    x = torch.randn(2, 1, 4, 4, dtype=DT, generator=torch.Generator().manual_seed(1))
    method, args, options = _call_of(cls, model, x)
    seen = []
    inner = method._attribute

    def spy(*a, **kw):  # stands where _attribute stands: frame 1 is its caller
        if not seen:
            frame, depth = sys._getframe(1), 1
            while frame.f_code.co_name != "attribute":
                frame, depth = frame.f_back, depth + 1
            seen.append((depth, frame.f_code.co_filename))
        out = inner(*a, **kw)
        seen.append(out)
        return out

    method._attribute = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Taylor's piecewise-linear note on ReLU
        a = method.attribute(*args, target=1, **options)
    depth, where = seen[0]
    assert depth <= 3 and "taylorattr/methods" in where.replace("\\", "/")
    assert isinstance(seen[1], Attributed)
    # the spy is invisible: the same attributions as the method's own call
    del method._attribute
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(a, method.attribute(*args, target=1, **options),
                                   rtol=0, atol=0)


def _depth_to_attribute(method):
    """A spy in place of ``method._attribute``: the frames from ``attribute`` to it, per call."""
    seen, inner = [], method._attribute

    def spy(*a, **kw):
        frame, depth = sys._getframe(1), 1
        while frame.f_code.co_name != "attribute":
            frame, depth = frame.f_back, depth + 1
        seen.append(depth)
        return inner(*a, **kw)

    method._attribute = spy
    return seen


def test_routed_calls_reach_attribute_in_three_frames_with_the_same_result():
    """The calls a class adapts by its declared route (Grad-CAM's and conductance's
    ``layer=``, conductance's tuple inputs, the tunnel's plain tensor) are still
    ``attribute -> explain -> run -> _attribute``; the independent route: the same option
    given by its own name, and the joined tuple given as one tensor."""
    model = _Net().to(DT).eval()
    x = torch.randn(2, 1, 4, 4, dtype=DT, generator=torch.Generator().manual_seed(3))
    cam = M.GradCAM(model)
    seen = _depth_to_attribute(cam)
    with pytest.warns(UserWarning, match="receives the model's input"):  # the stem: expected
        a = cam.attribute(x, target=1, layer=model.conv)
    assert seen == [3]
    del cam._attribute
    with pytest.warns(UserWarning, match="receives the model's input"):
        torch.testing.assert_close(a, cam.attribute(x, target=1, conv_layer=model.conv),
                                   rtol=0, atol=0)
    two = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(DT).eval()

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = two

        def forward(self, u, v):
            return self.net(torch.cat([u, v], 1))

    pair = Pair().eval()
    u, v = torch.randn(2, 1, dtype=DT), torch.randn(2, 2, dtype=DT)
    cond = M.LayerConductance(pair)
    seen = _depth_to_attribute(cond)
    a = cond.attribute((u, v), target=0, layer=two[1], n_steps=8)
    assert seen == [3]
    whole = M.LayerConductance(two).attribute(torch.cat([u, v], 1), target=0,
                                              conductance_layer=two[1], n_steps=8)
    torch.testing.assert_close(a, whole, rtol=0, atol=0)
    tunnel = M.SmoothGrad(model)
    seen = _depth_to_attribute(tunnel)
    tunnel.attribute(x, target=1, nt_samples=2)
    assert seen == [3]


@pytest.mark.parametrize("cls,peer", [("GuidedBackprop", "GuidedBackprop"),
                                      ("Deconvolution", "Deconvolution")])
def test_the_relus_of_a_model_are_found_once_and_never_reused_for_another(cls, peer):
    """Guided Backprop's ReLU list depends only on the model: a second call reuses the
    cached entry, another model or a changed structure gets its own; the independent
    route: Captum's method on each model as it is at the call."""
    import captum.attr as ca

    from taylorattr.methods import guided_backprop as gb

    def net():
        return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(),
                             nn.Linear(6, 3)).to(DT).eval()

    x = torch.randn(3, 4, dtype=DT, generator=torch.Generator().manual_seed(4))

    def check(model, a):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Setting backward hooks")  # Captum's note
            want = getattr(ca, peer)(model).attribute(x.clone().requires_grad_(True),
                                                      target=2)
        torch.testing.assert_close(a, want, rtol=0, atol=1e-12)

    model, other = net(), net()
    method = getattr(M, cls)(model)
    check(model, method.attribute(x, target=2))
    entry = gb._RELUS[model]
    assert entry[1] == (model[1], model[3])
    check(model, method.attribute(x, target=2))
    assert gb._RELUS[model] is entry  # reused, not searched again
    check(other, getattr(M, cls)(other).attribute(x, target=2))
    assert gb._RELUS[other][1] == (other[1], other[3]) and gb._RELUS[model] is entry
    model[3] = nn.ReLU()  # a changed structure: a new ReLU (the cached one would miss it)
    check(model, method.attribute(x, target=2))
    assert gb._RELUS[model] is not entry and gb._RELUS[model][1] == (model[1], model[3])


def test_a_recomputation_that_raises_is_reported_not_skipped():
    """A failing sample is recomputed at batch 2; when that raises (out of memory here) the
    warning names the error, and the unrepaired attributions are returned."""
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)).to(DT).eval()
    x = torch.randn(3, 4, dtype=DT, generator=torch.Generator().manual_seed(2))

    class Broken(M.DeepLift):  # off by half, and out of memory at the recomputation
        def _attribute(self, call, x, *args, **kwargs):
            if x.shape[0] == 2:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            done = super()._attribute(call, x, *args, **kwargs)
            return dataclasses.replace(done, attributions=done.attributions * 1.5)

    with pytest.warns(CompletenessWarning) as caught:
        a = Broken(model).attribute(x[:1], 0.0, target=1)
    messages = [str(w.message) for w in caught]
    assert any("recomputing sample 0 at batch 2" in m and "OutOfMemoryError" in m and
               "simulated" in m for m in messages), messages
    # it points at the caller's line
    assert any(w.filename == __file__ for w in caught if "recomputing" in str(w.message))
    torch.testing.assert_close(a, 1.5 * M.DeepLift(model).attribute(x[:1], 0.0, target=1),
                               rtol=0, atol=0)


def test_checks_of_a_model_are_cached_and_not_reused_for_another():
    model, other = (nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).to(DT).eval()
                    for _ in range(2))
    x = torch.randn(2, 4, dtype=DT)
    ig = M.IntegratedGradients(model)
    calls = []
    check = _pipeline.check_layer

    def counted(*a):
        calls.append(a[:2])
        return check(*a)

    try:
        _pipeline.check_layer = counted
        a1 = ig.attribute(x, 0.0, target=1, layer=model[1], n_steps=4)
        a2 = ig.attribute(x, 0.0, target=1, layer=model[1], n_steps=4)
        assert calls == [(model, model[1])]  # once for this model and layer
        with pytest.raises(ValueError, match="layer"):  # not this model's layer: refused
            ig.attribute(x, 0.0, target=1, layer=other[1], n_steps=4)
        assert len(calls) == 2
    finally:
        _pipeline.check_layer = check
    torch.testing.assert_close(a1, a2, rtol=0, atol=0)


def test_a_flag_a_method_of_ones_own_sets_as_before_is_folded_into_its_traits():
    """``complete = True`` on a user's class (as the README's method writes it) becomes its
    traits: the pipeline reads it (``strict=True`` is taken, as for complete methods)."""

    class Own(AttributionMethod):
        complete = True
        baseline_kind = "none"

        def _attribute(self, call, x, baselines, target, fx, *, show_progress=False):
            return torch.zeros_like(x), None

    assert Own.traits.complete is True and Own.traits.baseline_kind == "none"
    assert Own.complete is True and isinstance(Own.__dict__["complete"], type(
        AttributionMethod.__dict__["complete"]))
    model = nn.Sequential(nn.Linear(3, 2)).to(DT).eval()
    a = Own(model).attribute(torch.ones(2, 3, dtype=DT), 0, strict=True)  # (inputs, target)
    assert a.shape == (2, 3)
    with pytest.raises(ValueError, match="strict applies"):
        M.Saliency(model).attribute(torch.ones(2, 3, dtype=DT), 0, strict=True)
