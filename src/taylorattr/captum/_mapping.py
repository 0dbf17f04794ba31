"""The mapping shared by the Captum-compatible classes: Captum's base classes, the call of a
native method with Captum's arguments, Captum's draws and several layers at once.

A compatible class holds ``forward_func`` (Captum's attribute name) and builds its native
method once; ``attribute`` turns Captum's arguments into the native call
(:func:`native_call`): ``baselines=None`` is the zero baseline, ``additional_forward_args``
and ``target`` pass as they are (the native methods take Captum's forms), and the result
is Captum's structure. Random draws are made as Captum makes them, from the global
generators, so that ``torch.manual_seed`` / ``np.random.seed`` before a call give
Captum's draws (:func:`captum_noise`, :func:`captum_choice`).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from .._validation import flat_target, resolve_target, select_output
from ..inputs import ModelWrapper, as_tuple, layer_activations, point_baselines
from ..methods import AttributionMethod
from ..runtime.progress import labelled

__all__ = [
    "Attribution",
    "Call",
    "GradientAttribution",
    "LayerAttribution",
    "NeuronAttribution",
    "PerturbationAttribution",
    "TensorOutput",
    "captum_noise",
    "for_layers",
    "future_call",
    "global_generator",
    "native_call",
    "not_offered",
]


def not_offered(what: str, why: str) -> NotImplementedError:
    """The error for a Captum option taylorattr does not offer (docs/captum.md's table)."""
    return NotImplementedError(f"{what} is not offered by taylorattr.captum: {why}")


def native_call(native_method: AttributionMethod, inputs, baselines=None, target=None,
                additional_forward_args=None, return_convergence_delta: bool = False,
                **options):
    """``native_method`` on Captum's arguments: ``(attributions, delta)`` or the attributions,
    in the structure of ``inputs``."""
    if native_method.baseline_kind == "point" and baselines is None:
        baselines = 0.0
    if isinstance(baselines, bool):  # Captum takes True/False for bool inputs
        baselines = float(baselines)
    return native_method.explain(inputs, baselines, target,
                                 additional_forward_args=additional_forward_args,
                                 return_convergence_delta=return_convergence_delta,
                                 **options).result()


@dataclass
class Call:
    """One native call: ``method`` on ``inputs`` with these arguments and options; ``delta``
    asks for the convergence delta, ``finish`` turns the delta into Captum's (the identity
    unless the conventions differ)."""

    method: AttributionMethod
    inputs: object
    baselines: object = None
    target: object = None
    additional_forward_args: object = None
    delta: bool = False
    options: dict = field(default_factory=dict)
    finish: object = None

    def run(self):
        with captum_errors():
            out = native_call(self.method, self.inputs, self.baselines, self.target,
                              self.additional_forward_args, self.delta, **self.options)
        if self.delta and self.finish is not None:
            return out[0], self.finish(out[1])
        return out


@contextmanager
def captum_errors():
    """Argument errors raised as Captum raises them: the native ``TypeError`` /
    ``ValueError`` (same message) that is also an ``AssertionError``, Captum's exception
    for bad arguments, so that code catching either keeps working."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AssertionError):
            raise
        kind = _CAPTUM_ERRORS.setdefault(type(exc), type(
            type(exc).__name__, (type(exc), AssertionError), {"__module__": __name__}))
        raise kind(*exc.args) from exc


_CAPTUM_ERRORS: dict = {}


def captum_noise(parts: tuple, stdevs, copies: int) -> tuple:
    """Captum's NoiseTunnel noise for ``copies`` noisy copies of every sample: one
    ``torch.normal(0, stdev)`` draw per input, in input order, from the global generator
    with Captum's expression (a float32 standard deviation tensor), each ``[B * copies, ...]``
    sample-major, returned as ``[B, copies, ...]``."""
    stds = stdevs if isinstance(stdevs, tuple) else (stdevs,) * len(parts)
    if len(stds) != len(parts):
        raise ValueError(f"stdevs must give one value per input ({len(parts)}), got {len(stds)}")
    out = []
    for p, s in zip(parts, stds):
        size = (p.shape[0] * copies,) + tuple(p.shape[1:])
        noise = torch.normal(0, torch.tensor(s, device=p.device).repeat(size))
        out.append(noise.reshape((p.shape[0], copies) + tuple(p.shape[1:])))
    return tuple(out)


def global_generator() -> torch.Generator:
    """The generator Captum's draws come from: the global generator of the default device.

    Captum draws with device-less factories (``torch.randperm(G)``, ``torch.randn(1, G)``,
    ``torch.bernoulli(torch.ones(1, G) * 0.5)``), which land on the default device and draw
    from its generator: ``torch.default_generator`` on the CPU, the current CUDA device's
    after ``torch.set_default_device("cuda")`` (seeded too by ``torch.manual_seed``). The
    drop-in draws from the same generator, so it draws Captum's numbers on every device."""
    where = torch.get_default_device()
    if where.type == "cpu":
        return torch.default_generator
    module = torch.get_device_module(where.type)
    if hasattr(module, "init"):
        module.init()  # the per-device generators exist once the backend is initialised
    generators = getattr(module, "default_generators", None)
    if not generators:
        raise NotImplementedError(f"the default device is {where}, whose global generator "
                                  "taylorattr.captum cannot read; set the default device to "
                                  "'cpu' or 'cuda' for Captum's draws")
    return generators[module.current_device() if where.index is None else where.index]


def for_layers(layer, run, want_delta: bool = False):
    """``run(one_layer)`` for Captum's ``layer`` argument: a module, or a list of modules
    (several layers in one call: a list of their results; with ``want_delta``, Captum's
    ``(attributions, deltas)``, a list each)."""
    if not isinstance(layer, (list, tuple, nn.ModuleList)):
        return run(layer)
    out = [run(m) for m in layer]
    return ([a for a, _ in out], [d for _, d in out]) if want_delta else out


def layer_inputs(model, layer, inputs, additional_forward_args, to_input: bool):
    """The layer's output (input) when ``model`` runs on ``inputs``."""
    parts, _ = as_tuple(inputs)
    extra = additional_forward_args
    extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
    return layer_activations(model, layer, tuple(parts) + extra, to_input)


class TensorOutput(ModelWrapper):
    """``forward_func`` with a Python number output made a tensor, as Captum's perturbation
    methods read it (a float: float64, an int: int64). While ``awaiting`` (inside
    :func:`future_call`) the forward returns ``torch.futures.Future`` and its value is
    waited for."""

    awaiting = False

    def forward(self, *args):
        out = self.model(*args)
        if isinstance(out, torch.futures.Future):
            if not self.awaiting:
                raise TypeError("forward_func returned a torch.futures.Future: call "
                                "attribute_future(...) for such a forward (attribute needs "
                                "the output itself)")
            out = out.wait()
        elif self.awaiting:
            raise AssertionError("when using attribute_future, forward_func must return a "
                                 f"torch.futures.Future, got {type(out).__name__}")
        if isinstance(out, (int, float)) and not isinstance(out, bool):
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), "cpu")
            return torch.tensor(out, dtype=torch.float64 if isinstance(out, float) else
                                torch.int64, device=device)
        return out


def future_call(wrapper: TensorOutput, run):
    """Captum's ``attribute_future``: ``run()`` with every forward's future waited for, in
    turn (``wrapper`` is the ``forward_func`` of the native method ``run`` calls), and the
    result returned as a completed ``torch.futures.Future``."""
    wrapper.awaiting = True
    try:
        result = run()
    finally:
        wrapper.awaiting = False
    done = torch.futures.Future()
    done.set_result(None)
    # a ``torch.Future`` (``torch._C.Future``), the type Captum's chained futures have
    return torch.futures.collect_all([done]).then(lambda _: result)


class Attribution:
    """Captum's ``Attribution``: holds ``forward_func``."""

    def attribute_future(self, *args, **kwargs):
        """Captum's asynchronous ``attribute``, offered (as by Captum) by FeatureAblation,
        FeaturePermutation, ShapleyValueSampling and ShapleyValues only."""
        raise NotImplementedError(f"attribute_future is not implemented for "
                                  f"{type(self).__name__}")

    def __init__(self, forward_func) -> None:
        self.forward_func = forward_func

    def __init_subclass__(cls, **kw):
        """Every ``attribute`` raises argument errors as Captum does (:func:`captum_errors`)
        and labels its progress bars as Captum does (``"<name> attribution"``)."""
        super().__init_subclass__(**kw)
        if "attribute" in cls.__dict__:
            inner = cls.__dict__["attribute"]

            @functools.wraps(inner)
            def attribute(self, *args, **kwargs):
                with captum_errors(), labelled(f"{self.get_name()} attribution"):
                    return inner(self, *args, **kwargs)

            cls.attribute = attribute

    def has_convergence_delta(self) -> bool:
        return False

    @classmethod
    def get_name(cls) -> str:
        """Captum's name of the class: its words, ``"ShapleyValueSampling"`` ->
        ``"Shapley Value Sampling"``."""
        return "".join(c if c.islower() or i == 0 else " " + c for i, c in enumerate(cls.__name__))

    @property
    def multiplies_by_inputs(self) -> bool:
        return getattr(self, "_multiply_by_inputs", False)


class GradientAttribution(Attribution):
    """Captum's ``GradientAttribution``."""

    def has_convergence_delta(self) -> bool:
        return True

    def compute_convergence_delta(self, attributions, start_point, end_point, target=None,
                                  additional_forward_args=None) -> torch.Tensor:
        """Captum's delta of given attributions, ``sum(a) - (f(end) - f(start))`` per sample
        (the native delta's definition, :meth:`taylorattr.methods.AttributionMethod._delta`)."""
        with captum_errors():
            ends, _ = as_tuple(end_point, "end_point")
            attrs, _ = as_tuple(attributions, "attributions")
            if attrs[0].shape[0] != ends[0].shape[0]:
                raise ValueError(f"attributions hold {attrs[0].shape[0]} samples but end_point "
                                 f"{ends[0].shape[0]}; give one attribution per sample")
            starts = point_baselines(0.0 if start_point is None else start_point, ends)
            extra = additional_forward_args
            extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
            with torch.no_grad():
                f_end, f_start = (self.forward_func(*p, *extra) for p in (ends, starts))
            if f_end.dim() > 2:  # read as the native methods read it (tuple targets)
                target = flat_target(target, f_end)
                f_end, f_start = f_end.flatten(1), f_start.flatten(1)
            t = resolve_target(target, f_end)
            change = select_output(f_end, t) - select_output(f_start, t)
            total = sum(a.reshape(a.shape[0], -1).sum(1) for a in attrs)
            return total - change.to(total.dtype)


class PerturbationAttribution(Attribution):
    """Captum's ``PerturbationAttribution`` (its ``multiplies_by_inputs`` is True)."""

    _multiply_by_inputs = True


class LayerAttribution(Attribution):
    """Captum's ``LayerAttribution``: ``forward_func`` and ``layer``."""

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        super().__init__(forward_func)
        self.layer = layer
        self.device_ids = device_ids

    @staticmethod
    def interpolate(layer_attribution: torch.Tensor, interpolate_dims,
                    interpolate_mode: str = "nearest") -> torch.Tensor:
        """``F.interpolate`` of a ``[B, C, ...]`` layer map to ``interpolate_dims``."""
        return nn.functional.interpolate(layer_attribution, size=interpolate_dims,
                                         mode=interpolate_mode)


class NeuronAttribution(Attribution):
    """Captum's ``NeuronAttribution``: ``forward_func`` and ``layer``."""

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        super().__init__(forward_func)
        self.layer = layer
        self.device_ids = device_ids
