"""The common checks of an attribution method, for your own methods as for the library's.

As scikit-learn's ``check_estimator`` / ``parametrize_with_checks``::

    from taylorattr.testing import check_method, parametrize_with_checks

    check_method(MyMethod)                          # runs every check; AssertionError on a failure

    @parametrize_with_checks([MyMethod, "integrated_gradients"])
    def test_common(check):                         # one pytest test per named check
        check()

A method is an :class:`~taylorattr.methods.AttributionMethod` subclass (checked with
``settings``, its options and constructor arguments), a :class:`~taylorattr.registry.MethodSpec`
or a registry name (every variant of the entry). Each variant is bound at cheap settings
(:data:`CHEAP`: few steps, samples and copies; the variant keeps its other settings) and
run on a small float64 model ``f: [B, 1, 6, 6] -> [B, 3]`` (:func:`conv_model`). The checks:

* ``keeps_shape_dtype_device[float32|float64]``: the attributions ``a`` have the inputs'
  shape, dtype and device, and are finite;
* ``deterministic``: the same call twice (same settings, same seed) agrees bit for bit
  (on CUDA within :func:`cudnn_deterministic`: cuDNN's default convolution backward
  passes add with atomics in a varying order);
* ``cost_equals_rows_run``: the rows the method declares before running
  (:meth:`~taylorattr.registry.BoundMethod.cost`, no model run) equal the forward and
  backward rows a :class:`~taylorattr.runtime.cost.RowCounter` around the model counts;
* ``complete`` (only where the method claims it: ``complete = True`` on the class, or
  the registry row's ``complete``): one player per feature, ``delta = sum_i a_i - (f(x) -
  f(x~))`` is zero to float64 rounding, ``|delta| <= 1e-9 max(1, max |f(x)|)``, both as
  the method reports it (``return_convergence_delta``) and, for a point or implicit
  baseline, as computed here from two model calls;
* ``refuses_inputs[kind]``, ``refuses_target[kind]``, ``refuses_baselines[wrong-shape]``,
  ``refuses_unknown_option``, ``refuses_mistyped_option[name]``: malformed inputs (NaN,
  inf, no batch axis, an empty batch, complex values), targets (out of range, negative, a
  float, a str, too long, 2-d, a float tensor), baselines of another shape, an unknown
  option and a value of the wrong type for each bool/int/float option are refused with a
  ValueError or TypeError whose message names the argument;
* ``tuple_inputs``: tuple inputs come back as a tuple of attributions shaped like the
  inputs, or are refused naming the inputs, the tuple or the model's several inputs.

The checks run on one device, :func:`check_device`: PyTorch's default device
(``torch.get_default_device()``, the CPU unless ``torch.set_default_device`` changed it;
``TAYLORATTR_DEVICE=cuda make test`` makes it CUDA). The models, inputs, baselines,
reference images and malformed targets are all put there explicitly; the models' weights and
the images are drawn on the CPU from seeded generators and moved, so they are the same
numbers on every device.

A method that attributes to a layer of its own (``conductance_layer``) is checked at the
model's own input (the model itself as the layer, ``layer_input=True``), where its
attributions have the inputs' shape. A failing check raises an AssertionError naming the
check and the method. This module imports neither pytest nor Captum at import time.

Why one module: it is the one public home of the checks (as
``sklearn.utils.estimator_checks``); each check is a short function over the same bound
variant and small model.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ._validation import built_on_cpu, cpu_generator, draw
from .baselines import ReferenceSet
from .methods import AttributionMethod, UnsupportedModelError
from .methods.layerwise import engine
from .registry import METHODS, BoundMethod, MethodSpec, Variant
from .runtime.cost import RowCounter
from .runtime.determinism import cudnn_deterministic

__all__ = ["CHEAP", "Check", "assert_cost_counted", "check_device", "check_method", "conv_model",
           "cudnn_deterministic", "image_batch",
           "method_checks", "observed_plan_run", "parametrize_with_checks", "plan_runs_counted",
           "reference_images", "two_input_model"]

#: The cheap settings every check binds, by option name (a method takes the ones it has).
CHEAP: Mapping[str, object] = {"seed": 0, "n_samples": 3, "nt_samples": 2, "n_steps": 3,
                               "patch": 3}
#: The malformed targets, by check label, and the malformed inputs' kinds.
BAD_TARGETS = {"out-of-range": 3, "negative": -4, "float": 1.5, "str": "0",
               "too-long": (0, 1, 2), "2d": ((0,), (1,)), "float-tensor": (0.0, 1.0)}
BAD_INPUTS = ("nan", "inf", "no-batch", "empty-batch", "complex")


# ---------------------------------------------------------------------------- the models
def check_device(device=None) -> torch.device:
    """The device the checks run on: ``device`` if given, else PyTorch's default device
    (``torch.get_default_device()``)."""
    return torch.device(device) if device is not None else torch.get_default_device()


def _seeded(build, seed: int, dtype, device) -> nn.Module:
    """``build()`` with its weights drawn on the CPU from ``seed`` (:func:`built_on_cpu`:
    the same weights on every device), then moved to ``dtype`` and :func:`check_device`
    ``(device)``, in eval mode."""
    return built_on_cpu(build, seed).to(device=check_device(device), dtype=dtype).eval()


def conv_model(dtype=torch.float64, device=None) -> nn.Module:
    """``f: [B, 1, 6, 6] -> [B, 3]``: a 3x3 convolution to 2 channels, softplus, a linear
    map (seeded: the same weights on every call and device), on :func:`check_device`."""
    return _seeded(lambda: nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Softplus(),
                                         nn.Flatten(), nn.Linear(2 * 6 * 6, 3)), 0, dtype, device)


class _TwoInputs(nn.Module):
    """``f(x1, x2)``: an image through a conv and a vector through a linear map, added."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.act = nn.Softplus()
        self.head = nn.Linear(2 * 6 * 6, 3)
        self.side = nn.Linear(4, 3)

    def forward(self, x1, x2):
        return self.head(self.act(self.conv(x1)).flatten(1)) + self.side(x2)


def two_input_model(dtype=torch.float64, device=None) -> nn.Module:
    """``f(x1 [B, 1, 6, 6], x2 [B, 4]) -> [B, 3]`` (seeded, as :func:`conv_model`), on
    :func:`check_device`."""
    return _seeded(_TwoInputs, 1, dtype, device)


def image_batch(dtype=torch.float64, seed: int = 1, n: int = 2, device=None) -> torch.Tensor:
    """``n`` standard normal images ``[n, 1, 6, 6]`` drawn on the CPU from a generator seeded
    ``seed`` and moved to :func:`check_device` ``(device)``."""
    return draw(torch.randn, n, 1, 6, 6, dtype=dtype, generator=cpu_generator(seed),
                device=check_device(device))


def reference_images(dtype=torch.float64, device=None) -> ReferenceSet:
    """Three reference images (seed 2): the references of a reference-set variant."""
    return ReferenceSet(image_batch(dtype, seed=2, n=3, device=device))


# ---------------------------------------------------------------------------- binding
def _context(model, per_feature: bool = False) -> dict:
    """:data:`CHEAP`, and a method's own layer at the model's input (module docstring);
    ``per_feature``: no patch (every feature its own player)."""
    context = {**CHEAP, "conductance_layer": model, "layer_input": True}
    if per_feature:
        del context["patch"]
    return context


def _bind(spec: MethodSpec, variant: Variant, model, dtype, per_feature=False) -> BoundMethod:
    """The variant at the check's settings; a reference-set variant gets
    :func:`reference_images`; ``per_feature``: ``patch=None`` where the method has a patch
    that the entry does not pin."""
    own = {}
    if isinstance(variant.settings.get("baselines"), ReferenceSet):  # on check_device, as
        own["baselines"] = reference_images(dtype)                       # the check's model
    if per_feature and "patch" in spec.options() and "patch" not in spec.fixed:
        own["patch"] = None
    return spec.bind(variant, context=_context(model, per_feature), **own)


def _call(spec, variant, model, x, per_feature=False, **extra):
    """``attribute`` of the variant, with ``extra`` options (a ``baselines`` among them
    replaces the bound one)."""
    dtype = x.dtype if isinstance(x, torch.Tensor) else torch.float64
    bound = _bind(spec, variant, model, dtype, per_feature)
    method, opts = bound._built(model)
    base = extra.pop("baselines", bound._baselines(0.0))
    return method.attribute(x, *([] if base is None else [base]), **{**opts, **extra})


@contextlib.contextmanager
def plan_runs_counted():
    """Within it, each run of a layer-wise method's traced plan is reported to the
    :class:`~taylorattr.runtime.cost.RowCounter` it runs on (the engine runs the plan, an fx
    interpreter of the model's submodules, not the model's forward, so the counter would
    not see it otherwise); its output is hooked to count the modified backward sweep."""

    real = engine._Pass.run
    engine._Pass.run = observed_plan_run(real)
    try:
        yield
    finally:
        engine._Pass.run = real


def observed_plan_run(real):
    """``real`` (the engine's ``_Pass.run``) reporting each run to the counter it runs on."""
    def run(self, *args, **kwargs):
        return self.module.observe(args[0], real(self, *args, **kwargs))
    return run


def assert_cost_counted(bound: BoundMethod, counter: RowCounter, x=None):
    """:meth:`BoundMethod.cost` (no model run) equals the rows a second run of ``bound``
    on ``x`` shows on ``counter`` (the first run may probe the chunk size once); returns
    the cost. Call within :func:`plan_runs_counted`."""
    x = image_batch() if x is None else x
    cost = bound.cost(counter, x, 0.0)
    bound(counter, x, 0.0, None)
    counter.reset()
    bound(counter, x, 0.0, None)
    assert (counter.forward_rows, counter.backward_rows) == \
        (cost.forward_rows, cost.backward_rows), \
        f"{bound.label}: declared (forward, backward) rows ({cost.forward_rows}, " \
        f"{cost.backward_rows}), counted ({counter.forward_rows}, {counter.backward_rows})"
    return cost


# ---------------------------------------------------------------------------- the checks
@dataclass(frozen=True)
class Check:
    """One named check of one method variant. Calling it runs the check; a failure (an
    assertion, or any exception the method raises where none is expected) is raised as an
    AssertionError naming the check and the method."""

    name: str
    method: str
    run: Callable[[], None]

    @property
    def id(self) -> str:
        return f"{self.method}-{self.name}"

    def __call__(self) -> None:
        try:
            self.run()
        except Exception as err:
            what = str(err) if isinstance(err, AssertionError) else \
                f"{type(err).__name__}: {err}"
            raise AssertionError(f"check {self.name!r} failed for {self.method}: {what}") from err


def _refused_naming(argument: str, call) -> None:
    try:
        call()
    except (TypeError, ValueError) as err:
        assert argument in str(err), f"the error does not name {argument!r}: {err}"
        return
    raise AssertionError(f"a malformed {argument} was accepted (expected a ValueError or "
                         f"TypeError naming {argument!r})")


def _malformed_inputs(kind: str) -> torch.Tensor:
    x = image_batch()
    if kind == "nan":
        return x.clone().index_fill_(0, torch.tensor([1], device=x.device), float("nan"))
    if kind == "inf":
        return x.clone().index_fill_(0, torch.tensor([0], device=x.device), float("inf"))
    return {"no-batch": lambda: x[0, 0, 0], "empty-batch": lambda: x[:0],
            "complex": lambda: x.to(torch.complex128)}[kind]()


def _bad_target(label: str):
    """The malformed target ``label``; a tuple as a tensor on :func:`check_device`, so that
    it is refused for what is wrong with it, not for its device."""
    value = BAD_TARGETS[label]
    return torch.tensor(value, device=check_device()) if isinstance(value, tuple) else value


def _keeps_shape(spec, variant, dtype):
    def run():
        x = image_batch(dtype)
        model = conv_model(dtype)
        a = _bind(spec, variant, model, dtype)(model, x, 0.0, None)
        assert isinstance(a, torch.Tensor), f"attributions are a {type(a).__name__}"
        assert (a.shape, a.dtype, a.device) == (x.shape, x.dtype, x.device), \
            f"attributions {tuple(a.shape)} {a.dtype} on {a.device} for inputs " \
            f"{tuple(x.shape)} {x.dtype} on {x.device}"
        assert torch.isfinite(a).all(), "attributions are not finite"
    return run


def _deterministic(spec, variant):
    def run():
        model, x = conv_model(), image_batch()
        with cudnn_deterministic():
            first = _bind(spec, variant, model, x.dtype)(model, x, 0.0, None)
            again = _bind(spec, variant, model, x.dtype)(model, x, 0.0, None)
        assert torch.equal(first, again), \
            f"two equal calls differ by up to {float((first - again).abs().max()):.3g}"
    return run


def _cost(spec, variant):
    def run():
        counter = RowCounter(conv_model())
        with plan_runs_counted():
            assert_cost_counted(_bind(spec, variant, counter, torch.float64), counter)
    return run


def _complete(spec, variant):
    def run():
        model, x = conv_model(), image_batch()
        with torch.no_grad():
            fx = model(x)
        t = fx.argmax(1)
        a, delta = _call(spec, variant, model, x, per_feature=True, target=t,
                         return_convergence_delta=True)
        scale = fx.abs().max().clamp_min(1.0)
        assert delta.shape == (x.shape[0],), f"delta shaped {tuple(delta.shape)}"
        assert delta.abs().max() <= 1e-9 * scale, \
            f"reported |sum(a) - (f(x) - f(x~))| up to {float(delta.abs().max()):.3g}"
        if spec.baseline_kind in ("point", "none"):  # f(x) - f(0) from the model itself
            with torch.no_grad():
                df = (fx - model(torch.zeros_like(x))).gather(1, t[:, None])[:, 0]
            miss = a.flatten(1).sum(1) - df
            assert miss.abs().max() <= 1e-9 * scale, \
                f"|sum(a) - (f(x) - f(0))| up to {float(miss.abs().max()):.3g}"
    return run


def _refuses(spec, variant, argument, make_call):
    def run():
        model = conv_model()
        _refused_naming(argument, lambda: make_call(model))
    return run


def _tuple_inputs(spec, variant):
    def run():
        model = two_input_model()
        gen = cpu_generator(3)
        xs = (draw(torch.randn, 2, 1, 6, 6, dtype=torch.float64, generator=gen,
                   device=check_device()),
              draw(torch.randn, 2, 4, dtype=torch.float64, generator=gen, device=check_device()))
        try:
            out = _call(spec, variant, model, xs)
        except (TypeError, ValueError, UnsupportedModelError) as err:
            # a refusal says what it refuses: the inputs, the tuple, or a model of several inputs
            assert any(w in str(err) for w in ("inputs", "tuple", "exactly one tensor")), \
                f"the refusal names neither the inputs nor the tuple: {err}"
            return
        assert isinstance(out, tuple) and len(out) == 2, \
            f"tuple inputs gave a {type(out).__name__}"
        for a, x in zip(out, xs):
            assert (a.shape, a.dtype) == (x.shape, x.dtype) and torch.isfinite(a).all(), \
                f"attributions {tuple(a.shape)} {a.dtype} for an input {tuple(x.shape)} {x.dtype}"
        assert not any(m.training for m in model.modules()), "a call changed the model's mode"
    return run


def _mistyped_options(spec: MethodSpec) -> dict:
    """Every keyword-only option whose default is a bool, an int or a float (and that the
    entry does not pin), with a value of the wrong type: a str."""
    out = {}
    for option, p in spec.signature().parameters.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and option not in spec.fixed \
                and isinstance(p.default, (bool, int, float)):
            out[option] = "yes" if isinstance(p.default, bool) else "3"
    return out


def _variant_checks(spec: MethodSpec, variant: Variant, first: bool) -> list[tuple[str, Callable]]:
    checks = [(f"keeps_shape_dtype_device[{str(d).removeprefix('torch.')}]",
               _keeps_shape(spec, variant, d)) for d in (torch.float32, torch.float64)]
    checks += [("deterministic", _deterministic(spec, variant)),
               ("cost_equals_rows_run", _cost(spec, variant))]
    if spec.complete or spec.cls.complete:
        checks.append(("complete", _complete(spec, variant)))

    def call(**extra):
        return lambda model, x=None: _call(spec, variant, model,
                                           image_batch() if x is None else x, **extra)
    checks += [(f"refuses_inputs[{kind}]",
                _refuses(spec, variant, "inputs",
                         lambda m, k=kind: call()(m, _malformed_inputs(k))))
               for kind in BAD_INPUTS]
    checks += [(f"refuses_target[{label}]",
                _refuses(spec, variant, "target",
                         lambda m, label=label: call(target=_bad_target(label))(m)))
               for label in BAD_TARGETS]
    if spec.baseline_kind == "point":
        checks.append(("refuses_baselines[wrong-shape]",
                       _refuses(spec, variant, "baselines", lambda m: call(
                           baselines=torch.zeros(3, 1, 5, 5, dtype=torch.float64,
                                                 device=check_device()))(m))))
    checks.append(("refuses_unknown_option",
                   _refuses(spec, variant, "no_such_option", lambda m: call(no_such_option=1)(m))))
    if first:  # the options are the class's: once per entry is enough
        checks += [(f"refuses_mistyped_option[{option}]",
                    _refuses(spec, variant, option, lambda m, o=option, v=value: call(**{o: v})(m)))
                   for option, value in _mistyped_options(spec).items()]
    checks.append(("tuple_inputs", _tuple_inputs(spec, variant)))
    return checks


def _as_spec(method, settings: Mapping | None) -> MethodSpec:
    if isinstance(method, MethodSpec):
        spec = method
    elif isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"method must be an AttributionMethod subclass, a MethodSpec or a "
                             f"registered name, got {method!r}")
        spec = METHODS[method]
    elif isinstance(method, type) and issubclass(method, AttributionMethod):
        params = inspect.signature(method.__init__).parameters
        init = tuple(k for k, p in params.items() if k not in (
            "self", "model", "layer", "attribute_to_layer_input") and p.kind in (
            inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        return MethodSpec(method.name or method.__name__, method,
                          variants=(Variant(method.__name__, dict(settings or {})),),
                          init_args=init, complete=method.complete)
    else:
        raise TypeError(f"method must be an AttributionMethod subclass, a MethodSpec or a "
                        f"registered name, got {type(method).__name__}")
    if settings:
        raise TypeError("settings apply to a method class; a registry entry keeps its own")
    return spec


def method_checks(method, settings: Mapping | None = None) -> list[Check]:
    """The named checks of ``method`` (module docstring), one list over its variants.

    ``method``: an :class:`~taylorattr.methods.AttributionMethod` subclass (bound with
    ``settings``: its options and constructor arguments), a
    :class:`~taylorattr.registry.MethodSpec` or a registered name."""
    spec = _as_spec(method, settings)
    out = []
    for i, variant in enumerate(spec.variants):
        label = spec.name if len(spec.variants) == 1 else f"{spec.name}[{variant.label}]"
        out += [Check(name, label, run) for name, run in _variant_checks(spec, variant, i == 0)]
    return out


def check_method(method, settings: Mapping | None = None) -> list[str]:
    """Run every check of ``method`` (:func:`method_checks`); returns the names of the
    checks run, or raises an AssertionError naming the first check that fails and the
    method."""
    checks = method_checks(method, settings)
    for check in checks:
        check()
    return [c.id for c in checks]


def parametrize_with_checks(methods: Iterable):
    """A pytest decorator: one test per check of each of ``methods`` (given as to
    :func:`method_checks`), the check passed as ``check``, ids ``"<method>-<check>"``."""
    import pytest  # only where the caller uses pytest

    checks = [c for m in methods for c in method_checks(m)]
    return pytest.mark.parametrize("check", checks, ids=[c.id for c in checks])
