"""One explicit call (issue 37): a call is normalised once into a frozen value, methods keep
nothing of a call on ``self`` (one object serves two threads), every method's ``attribute``
names its own options, Captum's conventions cost no extra forward, and
``taylorattr.captum`` drives methods through the public ``explain``."""
from __future__ import annotations

import dataclasses
import inspect
import threading

import pytest
import torch
from _builders import DT
from torch import nn

import taylorattr as ta
import taylorattr.captum.attr as tca
from taylorattr import methods as M
from taylorattr.methods import AttributionMethod
from taylorattr.methods._call import SHARED_NAMES, Call
from taylorattr.registry import METHODS


class _Counted(nn.Module):
    """A small float64 network whose output is reshaped to ``shape`` per sample; counts the
    rows and the calls of its forward (by a forward hook)."""

    def __init__(self, shape=(6,), seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6)).to(DT)
        self.shape = shape
        self.rows = self.calls = 0
        self.register_forward_hook(self._count)

    def _count(self, module, args, out):
        self.rows += args[0].shape[0]
        self.calls += 1

    def forward(self, x):
        x = x if x.is_floating_point() else x.to(DT)
        return self.net(x).reshape((x.shape[0],) + self.shape)


def _x(b=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 4, generator=g, dtype=DT)


# ---- re-entrancy ---------------------------------------------------------------------
@pytest.mark.parametrize("cls, kw", [
    (M.IntegratedGradients, {"n_steps": 8}),
    (M.DeepLift, {}),
    (M.Occlusion, {"patch": 2}),
])
def test_one_method_object_used_from_two_threads_gives_the_results_of_two_objects(cls, kw):
    model = _Counted().eval()
    inputs = [_x(3, seed=s) for s in (11, 12)]
    bases = [torch.zeros(3, 4, dtype=DT), 0.25 * torch.ones(3, 4, dtype=DT)]
    # the independent route: two separate objects, one call each, no threads
    expected = [cls(model).attribute(x, b, target=t, **kw) for x, b, t in
                zip(inputs, bases, (0, 3))]
    shared = cls(model)
    results = [[], []]
    errors = []
    start = threading.Barrier(2)

    def work(k):
        try:
            start.wait()
            for _ in range(40):
                results[k].append(shared.attribute(inputs[k], bases[k], target=(0, 3)[k], **kw))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for k in (0, 1):
        assert len(results[k]) == 40
        for r in results[k]:
            assert torch.equal(r, expected[k])
    assert not torch.equal(expected[0], expected[1])  # the threads' calls differ


@pytest.mark.parametrize("cls, kw", [(M.IntegratedGradients, {"n_steps": 8}),
                                     (M.GradientInput, {}), (M.Occlusion, {"patch": 2})])
def test_layer_calls_on_one_model_from_five_threads_give_the_sequential_results(cls, kw):
    """Calls with ``layer=`` put an injector in the user's model for the call: threads
    attributing to the same layer, to another layer, to a layer's input and to the inputs at
    once each get what one call alone gives (the independent route: the same calls one
    after another), and the model holds its own layers again afterwards. (Capture-based
    methods are left out: torch.export is not safe while other threads run modules.)"""
    model = _Counted().eval()
    first, second = model.net[0], model.net[2]
    jobs = [{"inputs": _x(3, seed=21), "layer": first}, {"inputs": _x(3, seed=22), "layer": first},
            {"inputs": _x(3, seed=23), "layer": second},
            {"inputs": _x(3, seed=24), "layer": first, "attribute_to_layer_input": True},
            {"inputs": _x(3, seed=25)}]
    shared = cls(model)
    expected = [shared.attribute(target=1, **job, **kw) for job in jobs]
    results, errors = [[] for _ in jobs], []
    start = threading.Barrier(len(jobs))

    def work(k):
        try:
            start.wait()
            for _ in range(15):
                results[k].append(shared.attribute(target=1, **jobs[k], **kw))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(jobs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for k, runs in enumerate(results):
        assert len(runs) == 15 and all(torch.equal(r, expected[k]) for r in runs), k
    assert model.net[0] is first and model.net[2] is second  # the layers are back


def test_repeated_layer_calls_share_one_capture_and_each_equals_captum(monkeypatch):
    """A ``layer=`` call runs a new view of the model (the layer's value injected); its
    capture is keyed by the view's structure, so calls on new inputs reuse the first one
    (measured on a torchvision ResNet-18: 7-8 s per call before, 0.15 s after the first),
    and each call still equals Captum's LayerDeepLift on its own inputs."""
    import sys

    from captum.attr import LayerDeepLift as CaptumLayerDeepLift

    capture_module = sys.modules["taylorattr.capture"]
    captures = []
    original = capture_module._capture
    monkeypatch.setattr(capture_module, "_capture",
                        lambda *a, **k: captures.append(1) or original(*a, **k))
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6)).to(DT).eval()
    dl = M.DeepLift(model)  # (no hooks: a model with hooks is captured per call)
    for seed in (31, 32, 33):
        x = _x(4, seed=seed)
        ours = dl.attribute(x, 0.0, target=2, layer=model[0])
        theirs = CaptumLayerDeepLift(model, model[0]).attribute(x, torch.zeros_like(x),
                                                                target=2)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    assert len(captures) == 1


def test_a_call_is_frozen_and_the_method_keeps_nothing_of_it():
    model = _Counted().eval()
    ig = M.IntegratedGradients(model)
    before = dict(vars(ig))
    call = ig.prepare(_x(), 0.0, 1, options={"n_steps": 5})
    assert isinstance(call, Call)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.target = None
    with pytest.raises(TypeError):
        call.options["n_steps"] = 7  # a read-only mapping
    ex = ig.run(call)
    assert vars(ig) == before
    # the explained output is f(x) at the target: the independent route is the model
    with torch.no_grad():
        torch.testing.assert_close(ex.output, model(_x())[:, 1], rtol=0, atol=0)
    torch.testing.assert_close(ex.attributions,
                               ig.attribute(_x(), 0.0, target=1, n_steps=5), rtol=0, atol=0)


# ---- no retry: conventions decided up front ------------------------------------------
def _rows(model, method, inputs, **kw):
    model.rows = model.calls = 0
    out = method.attribute(inputs, **kw)
    return model.rows, model.calls, out


def test_outputs_beyond_b_c_and_tuple_targets_cost_no_extra_forward():
    x = _x()
    kw = {"n_steps": 4, "internal_batch_size": 1000}
    plain = _Counted((6,)).eval()
    rows, calls, a = _rows(plain, M.IntegratedGradients(plain), x, target=5, **kw)
    # the independent count: the method's plan (Cost), one forward of the batch + its rows
    assert rows == M.IntegratedGradients(plain).cost(x, target=5, **kw).forward_rows
    assert calls == 3  # the target forward, the rows, f(x~) for IG's self-check
    for shape, target in (((2, 3), (1, 2)), ((6, 1), 5), ((2, 3), [(1, 2)] * 3)):
        model = _Counted(shape).eval()
        r, c, b = _rows(model, M.IntegratedGradients(model), x, target=target, **kw)
        assert (r, c) == (rows, calls), shape
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_a_refused_output_is_refused_after_one_forward():
    model = _Counted((2, 3)).eval()
    with pytest.raises(ValueError, match="target must be a tuple of 2 ints"):
        _rows(model, M.IntegratedGradients(model), _x(), target=1, n_steps=4)
    assert model.calls == 1


def test_integer_inputs_cost_the_forwards_of_float_inputs():
    ids = torch.randint(0, 5, (3, 4), generator=torch.Generator().manual_seed(0))
    model = _Counted().eval()
    occ = M.Occlusion(model)
    r_int, c_int, a_int = _rows(model, occ, ids, target=2, perturbations_per_eval=100)
    r_f, c_f, a_f = _rows(model, occ, ids.to(DT), target=2, perturbations_per_eval=100)
    assert (r_int, c_int) == (r_f, c_f)
    assert r_f == occ.cost(ids.to(DT), target=2, perturbations_per_eval=100).forward_rows
    torch.testing.assert_close(a_int, a_f, rtol=0, atol=0)


def test_a_whole_batch_output_is_read_from_the_first_forward():
    class Summed(_Counted):
        def forward(self, x):
            return super().forward(x)[:, 0].sum()

    model = Summed().eval()
    x = _x()
    _, c, a = _rows(model, M.Occlusion(model), x, perturbations_per_eval=1)
    # the independent route: g(X) - g(X with feature j at 0 in every sample), by hand
    with torch.no_grad():
        g = model(x)
        want = torch.stack([g - model(x * (torch.arange(4) != j)) for j in range(4)])
    torch.testing.assert_close(a, want.reshape(1, 4), rtol=0, atol=1e-12)
    assert c == 1 + 4  # the call's forward, then one per feature


# ---- signatures ----------------------------------------------------------------------
def _methods():
    found = {spec.cls for spec in METHODS.values()}
    found.add(M.LayerConductance)  # not registered (no paper row), a method all the same
    return sorted(found, key=lambda c: c.__name__)


def test_integrated_gradients_names_its_options():
    params = inspect.signature(ta.IntegratedGradients.attribute).parameters
    for name in ("n_steps", "method", "internal_batch_size", "multiply_by_inputs",
                 "target", "baselines", "return_convergence_delta", "show_progress"):
        assert name in params
    assert params["n_steps"].default == 50
    assert "n_steps" in ta.IntegratedGradients.attribute.__doc__


@pytest.mark.parametrize("cls", _methods(), ids=lambda c: c.__name__)
def test_every_method_signature_names_its_options_and_has_no_catch_all(cls):
    params = inspect.signature(cls.attribute).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params.values())
    own = inspect.signature(cls._attribute).parameters  # the options the method reads
    for name, p in own.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "show_progress":
            assert name in params and params[name].default == p.default, name
    specs = [s for s in METHODS.values() if s.cls is cls]
    for spec in specs:  # every registry setting that is not a constructor argument
        for name in {**spec.defaults, **spec.fixed}:
            assert name in params or name in spec.init_args or name == "baselines", name
    assert ("baselines" in params) == (cls.baseline_kind != "none")
    assert SHARED_NAMES <= set(params)


@pytest.mark.parametrize("cls", _methods(), ids=lambda c: c.__name__)
def test_an_unknown_option_is_refused_naming_it_and_the_method(cls):
    model = _Counted().eval()
    try:
        method = cls(model)
    except (TypeError, ValueError):  # a method needing a convolution or a layer
        method = object.__new__(cls)
    # the written def refuses it (Python's message names the class whose def it is)
    owner = next(c for c in cls.__mro__ if "attribute" in c.__dict__)
    with pytest.raises(TypeError, match=rf"{owner.__name__}\.attribute\(\) got an unexpected "
                                        r"keyword argument 'n_stepz'"):
        method.attribute(_x(), n_stepz=3)
    # a driver calling explain by its options is refused naming the method
    with pytest.raises(TypeError, match=rf"{cls.__name__}\.attribute got unexpected keyword "
                                        r"argument\(s\) 'n_stepz'"):
        method.explain(_x(), n_stepz=3)


def test_a_tunnel_around_a_method_given_at_construction_takes_its_options():
    params = inspect.signature(M.NoiseTunnel.attribute).parameters
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    model = _Counted().eval()
    nt = M.NoiseTunnel(model, M.IntegratedGradients)
    a = nt.attribute(_x(), 0.0, target=1, n_steps=3, nt_samples=2, stdevs=0.0)
    # zero noise: the tunnel is the inner method itself
    torch.testing.assert_close(a, M.IntegratedGradients(model).attribute(_x(), 0.0, target=1,
                                                                         n_steps=3))
    with pytest.raises(TypeError, match=r"NoiseTunnel\.attribute got unexpected keyword "
                                        r"argument\(s\) 'n_stepz'"):
        nt.attribute(_x(), 0.0, target=1, n_stepz=3)


# ---- the public entry point ----------------------------------------------------------
def test_captum_drives_methods_through_explain(monkeypatch):
    seen = []
    explain = AttributionMethod.explain

    def spy(self, *args, **kwargs):
        seen.append(type(self).__name__)
        return explain(self, *args, **kwargs)

    monkeypatch.setattr(AttributionMethod, "explain", spy)
    model = _Counted().eval()
    a = tca.IntegratedGradients(model).attribute(_x(), target=1, n_steps=4)
    assert seen == ["IntegratedGradients"]
    torch.testing.assert_close(a, M.IntegratedGradients(model).attribute(
        _x(), 0.0, target=1, n_steps=4, method="gausslegendre"))
