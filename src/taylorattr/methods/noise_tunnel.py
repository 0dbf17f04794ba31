"""NoiseTunnel (Smilkov et al. 2017; Adebayo et al. 2018): any method averaged over noisy
copies of the input, as Captum's ``NoiseTunnel``.

With ``x_k = x + s * eps_k``, ``eps_k ~ N(0, I)`` (``s``: ``stdevs``), ``k = 1..n`` and
``A`` the wrapped (inner) method,

    smoothgrad:     a = 1/n sum_k A(x_k)
    smoothgrad_sq:  a = 1/n sum_k A(x_k)^2
    vargrad:        a = 1/n sum_k A(x_k)^2 - (1/n sum_k A(x_k))^2

The inner method runs on the ``B * n`` noisy rows (sample-major, each with its sample's
target and baseline, as Captum expands them), in calls of ``nt_samples_batch_size`` noisy
copies per sample (Captum's meaning; default automatic). The noise is drawn at once, in
float64, from a CPU ``torch.Generator`` seeded with ``seed`` (:func:`draw_noise`), so the
same seed gives bitwise the same attributions for the same settings. An inner method
that draws at random itself (an ``n_samples``/``seed`` method) gets one seed per call,
drawn from the same generator after the noise.

Tuple inputs, ``additional_forward_args`` and ``layer=`` (the tunnel's route
:func:`_copies`, then :meth:`NoiseTunnel._run_copies`):
the noise is added to every input (drawn input by input), and the inner method gets the
noisy copies of the user's inputs with each sample's target, baselines and arguments
repeated, so it handles them (and the layer) as in a direct call. ``noise=`` gives the
noise instead of drawing it; ``copy_deltas=True`` returns the inner method's delta of every
noisy copy ``[B, n]`` (Captum's, flattened there) instead of the tunnel's ``[B]``.

``NoiseTunnel(model, inner, **inner_init)`` wraps any registered method (its registry name,
whose pinned options apply, its class, or a method instance; Captum's
``NoiseTunnel(IntegratedGradients(model))`` too); the inner method's options are options of the
tunnel (``n_steps`` for Integrated Gradients, ...), except ``seed`` and ``stdevs``, which
belong to the tunnel. :class:`SmoothGrad` (Saliency inside) and
:class:`SmoothIntegratedGradients` are the registered tunnels.

References. The tunnel's attribution is compared with ``f(x) - f(x~)`` for the inner
method's references (the convergence delta, the audit): for SmoothGrad of Integrated
Gradients the delta measures how far the average over noisy inputs is from explaining
the clean input.

Why one module: the registered tunnels (SmoothGrad, SmoothIntegratedGradients) are the
tunnel with a fixed inner method, and the plain and structured paths share the noise draws
and their combination.

Taylor view: :func:`smoothed` turns the inner method's reformulation into the tunnel's:
the inner reformulation at every noisy input, combined by ``nt_type`` (exact where the
inner one is: Integrated Gradients on polynomial networks of degree <= K). Saliency has
none (the absolute gradient), so neither has SmoothGrad.
"""
from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .. import _validation as V
from .._validation import check_bool, check_positive_int
from .._validation import check_seed as _check_seed
from ..inputs import as_tuple, check_additional_args, check_batch, point_baselines, repeat_option
from ..runtime.cost import Cost
from ._base import Attributed, AttributionMethod, Explanation, Request, Several
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._conventions import check_discrete, discrete
from ._passes import check_optional_positive_int, default_chunk_rows, grid_blocks
from .integrated_gradients import IntegratedGradients
from .saliency import Saliency

__all__ = ["NT_TYPES", "TUNNEL_OPTIONS", "NoiseTunnel", "SmoothGrad", "SmoothIntegratedGradients",
           "check_nt_type", "combine", "draw_noise"]

#: The combinations of the noisy attributions (Captum's names).
NT_TYPES = ("smoothgrad", "smoothgrad_sq", "vargrad")
#: The tunnel's own options (the rest go to the inner method).
TUNNEL_OPTIONS = ("nt_type", "nt_samples", "stdevs", "seed", "nt_samples_batch_size", "noise",
                  "copy_deltas")


def draw_noise(inputs: torch.Tensor, nt_samples: int = 5, stdevs: float = 1.0,
               seed: int = 0) -> torch.Tensor:
    """The noise ``stdevs * eps`` ``[B, n, ...]`` added to the inputs: ``eps ~ N(0, I)``
    drawn in float64 on the CPU from ``_validation.cpu_generator(seed)``, cast to the
    inputs' dtype and device (the same numbers on every device)."""
    gen = V.cpu_generator(_check_seed(seed))
    return _noise(V.check_inputs(inputs), nt_samples, stdevs, gen)


def _noise(x, nt_samples, stdevs, gen) -> torch.Tensor:
    n = check_positive_int(nt_samples, "nt_samples")
    s = V.check_nonnegative_real(stdevs, "stdevs")
    eps = V.draw(torch.randn, (x.shape[0], n) + tuple(x.shape[1:]), generator=gen,
                 device=x.device, dtype=torch.float64)
    return (s * eps).to(x.device, x.dtype)


def combine(total, total_sq, n, nt_type):
    mean = total / n
    if nt_type == "smoothgrad":
        return mean
    if nt_type == "smoothgrad_sq":
        return total_sq / n
    return total_sq / n - mean * mean


def check_nt_type(nt_type) -> str:
    if nt_type not in NT_TYPES:
        raise ValueError(f"nt_type must be one of {list(NT_TYPES)}, got {nt_type!r}")
    return nt_type


def _registered() -> Mapping:
    """The registered methods by name (the registry's ``METHODS``, rows with ``cls``,
    ``fixed``, ``defaults``). The registry sits above the methods (it knows them, they never
    import it), so a name is looked up at call time in the module imported by name: filled
    on first use, whether or not the caller has touched the registry."""
    return importlib.import_module("taylorattr.registry").METHODS


def _resolve_inner(inner):
    """``(class, pinned options, default options)`` of an inner method given by registry
    name or class."""
    if isinstance(inner, str):
        METHODS = _registered()
        if inner not in METHODS:
            raise ValueError(f"inner must be a registered method name (one of "
                             f"{sorted(METHODS)}) or an AttributionMethod class, got {inner!r}")
        spec = METHODS[inner]
        return spec.cls, dict(spec.fixed), dict(spec.defaults)
    if isinstance(inner, type) and issubclass(inner, AttributionMethod):
        if issubclass(inner, NoiseTunnel):
            raise TypeError("inner must not be a NoiseTunnel (nest the noise in one tunnel)")
        return inner, {}, {}
    raise TypeError(f"inner must be a registered method name or an AttributionMethod class, "
                    f"got {type(inner).__name__}")


class _InnerOptions:
    """``options()`` on the class (its class-level inner) and on an instance (its inner)."""

    def __get__(self, obj, owner):
        def options():
            own = {k: p for k, p in inspect.signature(owner._attribute).parameters.items()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY and k != "show_progress"}
            inner = obj._inner_cls if obj is not None else owner.inner
            if inner is not None:
                for k, p in inner.options().items():
                    own.setdefault(k, p)
            return own
        return options


def _copies(method, request: Request) -> Request | Explanation:
    """NoiseTunnel's route (:attr:`~taylorattr.methods._call.Traits.route`): ``baselines``
    are what the inner method takes (None for an implicit baseline; None is 0.0 for a point
    baseline). Plain ``[B, ...]`` float tensors are the pipeline's call
    (:meth:`NoiseTunnel._attribute`); tuple inputs, ``additional_forward_args``, ``layer=``,
    given ``noise`` and per-copy deltas take :meth:`NoiseTunnel._run_copies`, which hands
    the inner method the noisy copies of the user's inputs (the inner method then does its
    own input handling)."""
    baselines, inputs, own = request.baselines, request.inputs, request.options
    if method.baseline_kind == "none" and baselines is not None:
        raise TypeError(f"baselines: {method._inner_cls.__name__} has an implicit baseline; "
                        "give none")
    if method.baseline_kind == "point" and baselines is None:
        baselines = 0.0
    if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 and inputs.is_floating_point() \
            and request.shared["additional_forward_args"] is None and request.layer is None \
            and not request.attribute_to_layer_input and own.get("noise") is None and \
            not own.get("copy_deltas", False):
        return replace(request, baselines=baselines)
    return method._run_copies(inputs, baselines, request.target, request.layer,
                              request.attribute_to_layer_input, request.model,
                              {**request.shared, **own})


class NoiseTunnel(AttributionMethod):
    """NoiseTunnel around ``inner`` (a registry name or a method class; constructor
    arguments of the inner method in ``inner_init``). Equals Captum's ``NoiseTunnel``
    around the same method given the same noise. ``baseline_kind`` is the inner method's.
    """

    name = "noise_tunnel"
    #: the wrapped method of a registered tunnel (subclasses); None: give ``inner``.
    inner: type[AttributionMethod] | None = None

    options = _InnerOptions()

    #: the inner method is given at construction: ``attribute`` takes its options too;
    #: structured calls run the inner method on noisy copies (:func:`_copies`)
    traits = replace(AttributionMethod.traits, open_options=True, route=_copies)

    def __init_subclass__(cls, **kw):
        if cls.inner is not None:  # its signature names the inner method's options
            cls.traits = replace(cls.traits, baseline_kind=cls.inner.traits.baseline_kind,
                                 open_options=False)
        super().__init_subclass__(**kw)

    def __init__(self, model, inner=None, **inner_init) -> None:
        if isinstance(model, AttributionMethod) and inner is None and type(self).inner is None:
            model, inner = model.model, model  # Captum's NoiseTunnel(IntegratedGradients(net))
        super().__init__(model)
        if inner is None:
            inner = type(self).inner
            if inner is None:
                raise TypeError("inner: give the method to smooth (a registry name such as "
                                "'saliency' or an AttributionMethod class)")
        if isinstance(inner, AttributionMethod):  # a method built by the caller
            if isinstance(inner, NoiseTunnel) or inner_init:
                raise TypeError("inner: give a method (not a NoiseTunnel) without inner_init, "
                                "or its class with inner_init")
            self._inner_cls, self._fixed, self._defaults = type(inner), {}, {}
            self.inner_method = inner
        else:
            self._inner_cls, self._fixed, self._defaults = _resolve_inner(inner)
            self.inner_method = self._inner_cls(model, **inner_init)
        self.baseline_kind = self._inner_cls.baseline_kind

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__}, inner={self._inner_cls.__name__})"

    def _run_copies(self, inputs, baselines, target, layer, to_input, model, options):
        """The tunnel on the user's inputs (module docstring): the noise of every input
        (drawn as :func:`draw_noise`, in input order, or ``noise``: one ``[B, n, ...]`` per
        input), the inner method on the noisy copies with their sample's target, baselines
        and ``additional_forward_args``; ``copy_deltas``: the inner method's delta of every
        noisy copy ``[B, n]``."""
        options = dict(options)
        want_delta = check_bool(options.pop("return_convergence_delta", False),
                                "return_convergence_delta")
        check_bool(options.pop("show_progress", False), "show_progress")
        extra = options.pop("additional_forward_args", None)
        shared = {k: options.pop(k) for k in ("strict", "layer_baselines", "layer_delta")
                  if k in options}
        self._check_options(options)
        nt_type = check_nt_type(options.pop("nt_type", "smoothgrad"))
        n = check_positive_int(options.pop("nt_samples", 5), "nt_samples")
        stdevs = options.pop("stdevs", 1.0)
        gen = V.cpu_generator(_check_seed(options.pop("seed", 0)))
        per_call = check_optional_positive_int(options.pop("nt_samples_batch_size", None),
                                               "nt_samples_batch_size") or n
        noise = options.pop("noise", None)
        copy_deltas = check_bool(options.pop("copy_deltas", False), "copy_deltas")
        if want_delta and not copy_deltas:
            raise ValueError("return_convergence_delta: with tuple inputs, "
                             "additional_forward_args, layer= or given noise the tunnel "
                             "returns the inner method's delta of every noisy copy; pass "
                             "copy_deltas=True")
        parts, is_tuple = as_tuple(inputs)
        if layer is None and any(discrete(p) for p in parts):
            check_discrete(self, parts, is_tuple)
        batch = check_batch(parts, vectors=True)
        extra = check_additional_args(extra, batch)
        model = self._model if model is None else model
        with torch.no_grad():
            out = V.run_model(lambda _: model(*parts, *extra), parts[0])
        read = self._read_output(out, parts, target, discrete=False, layer=layer)
        t, model = read.target, read.wrap(model, (None,) * len(parts))
        noise = self._copy_noise(noise, parts, n, stdevs, gen)
        n = noise[0].shape[1]
        kind = self.baseline_kind
        base = point_baselines(baselines, parts) if kind == "point" else baselines
        opts = {**self._defaults, **options, **self._fixed}
        totals: list[torch.Tensor] = []
        totals_sq: list[torch.Tensor] = []
        fx = read.fx.detach()
        deltas = torch.zeros(batch, n, dtype=fx.dtype, device=fx.device) if want_delta else None
        for k0 in range(0, n, per_call):
            k1 = min(n, k0 + per_call)

            def rows(v, k=k1 - k0):
                return v.repeat_interleave(k, 0) if isinstance(v, torch.Tensor) else v

            noisy = tuple((p.unsqueeze(1) + z[:, k0:k1].reshape((batch, k1 - k0) + p.shape[1:]))
                          .reshape((-1,) + tuple(p.shape[1:])) for p, z in zip(parts, noise))
            b = tuple(rows(v) for v in base) if kind == "point" else base
            kw = {k: repeat_option(v, k1 - k0, batch)
                  if k in self.inner_method.batch_options else v for k, v in opts.items()}
            kw.update({"additional_forward_args": tuple(rows(a) for a in extra) or None,
                       "layer": layer, "attribute_to_layer_input": to_input})
            if "seed" in self._inner_cls.options():
                kw["seed"] = int(V.draw(torch.randint, 2**62, (1,), generator=gen, device="cpu"))
            ex = _one(self.inner_method.explain(
                noisy if is_tuple else noisy[0],
                (b if is_tuple else b[0]) if kind == "point" else b,
                None if t is None else rows(t), model=model, return_convergence_delta=want_delta,
                **shared, **kw))
            as_parts = isinstance(ex.attributions, tuple)
            attrs = ex.attributions if as_parts else (ex.attributions,)
            attrs = [a.view((batch, k1 - k0) + tuple(a.shape[1:])) for a in attrs]
            if not totals:
                totals = [torch.zeros_like(a[:, 0]) for a in attrs]
                totals_sq = [torch.zeros_like(a[:, 0]) for a in attrs]
            for i, a in enumerate(attrs):
                totals[i] += a.sum(1)
                totals_sq[i] += (a * a).sum(1)
            if deltas is not None:  # asked of the inner call: its delta is a tensor
                deltas[:, k0:k1] = typing.cast(torch.Tensor, ex.delta).view(batch, k1 - k0)
        result = tuple(combine(a, sq, n, nt_type) for a, sq in zip(totals, totals_sq))
        return Explanation(result if as_parts else result[0], None, fx, t, deltas)

    @staticmethod
    def _copy_noise(noise, parts, n, stdevs, gen) -> tuple:
        """The noise of every input ``[B, n, *s_i]``: given, or drawn input by input."""
        if noise is None:
            return tuple(_noise(p.reshape(p.shape[0], -1), n, stdevs, gen).reshape(
                (p.shape[0], n) + tuple(p.shape[1:])) for p in parts)
        noise = noise if isinstance(noise, (tuple, list)) else (noise,)
        if len(noise) != len(parts):
            raise ValueError(f"noise must give one tensor per input ({len(parts)}), got "
                             f"{len(noise)}")
        for i, (z, p) in enumerate(zip(noise, parts)):
            if not isinstance(z, torch.Tensor) or z.dim() != p.dim() + 1 or \
                    z.shape[0] != p.shape[0] or tuple(z.shape[2:]) != tuple(p.shape[1:]) or \
                    z.shape[1] != noise[0].shape[1]:
                raise ValueError(f"noise[{i}] must be a tensor [B, n, ...] shaped like the "
                                 f"input {tuple(p.shape)} with n noisy copies per sample (the "
                                 f"same n for every input), got "
                                 f"{getattr(z, 'shape', type(z).__name__)}")
        return tuple(z.to(p.device, p.dtype) for z, p in zip(noise, parts))

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  nt_type: str = ..., nt_samples: int = ..., stdevs: float = ...,
                  seed: int = ..., nt_samples_batch_size: int | None = ..., noise: Any = ...,
                  copy_deltas: bool = ..., return_convergence_delta: Literal[False] = ...,
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ..., **options: Any) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  nt_type: str = ..., nt_samples: int = ..., stdevs: float = ...,
                  seed: int = ..., nt_samples_batch_size: int | None = ..., noise: Any = ...,
                  copy_deltas: bool = ..., return_convergence_delta: Literal[True],
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...,
                  **options: Any) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = None, target: Target = None, *,
                  nt_type: str = "smoothgrad", nt_samples: int = 5, stdevs: float = 1.0,
                  seed: int = 0, nt_samples_batch_size: int | None = None, noise: Any = None,
                  copy_deltas: bool = False, return_convergence_delta: bool = False,
                  show_progress: bool = False, strict: bool = False,
                  additional_forward_args: Any = None, layer: Any = CONSTRUCTED,
                  attribute_to_layer_input: Any = CONSTRUCTED, layer_baselines: Any = None,
                  layer_delta: str = "layer",
                  **options: Any) -> Attributions | tuple[Attributions, torch.Tensor]:
        """NoiseTunnel: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, base, t, fx, *, nt_type: str = "smoothgrad", nt_samples: int = 5,
                   stdevs: float = 1.0, seed: int = 0, nt_samples_batch_size: int | None = None,
                   noise=None, copy_deltas: bool = False, show_progress: bool = False,
                   **inner_options):
        """Options (the tunnel's; the rest go to the inner method): ``nt_type``,
        ``nt_samples``, ``stdevs``, ``seed``, ``nt_samples_batch_size`` (module docstring);
        ``noise``: the noise to add instead of drawing it (``[B, n, ...]``, one per input);
        ``copy_deltas``: with ``return_convergence_delta``, the inner method's delta of every
        noisy copy ``[B, n]`` (Captum's) instead of the tunnel's ``[B]``. The last two run
        through :meth:`_run_copies`."""
        check_nt_type(nt_type)
        per_call = check_optional_positive_int(nt_samples_batch_size, "nt_samples_batch_size")
        gen = V.cpu_generator(_check_seed(seed))
        noise = _noise(x, nt_samples, stdevs, gen)
        batch, n, feat = x.shape[0], nt_samples, tuple(x.shape[1:])
        size = batch * (per_call or max(1, default_chunk_rows(x, backward=True) // batch))
        blocks = list(grid_blocks(batch, n, size, show_progress, "noise tunnel"))
        opts = {**self._defaults, **inner_options, **self._fixed}
        seeds = None  # for an inner method that draws: one seed per call, after the noise
        if "seed" in self._inner_cls.options():
            seeds = V.draw(torch.randint, 2**62, (len(blocks),), generator=gen,
                           device="cpu").tolist()
        total = torch.zeros_like(x)
        total_sq = torch.zeros_like(x)
        refs = None
        for i, (s0, s1, k0, k1) in enumerate(blocks):
            rows = (x[s0:s1, None] + noise[s0:s1, k0:k1]).reshape((-1,) + feat)
            tr = None if t is None else t[s0:s1].repeat_interleave(k1 - k0)
            b = base[s0:s1].repeat_interleave(k1 - k0, 0) if self.baseline_kind == "point" \
                else base
            kw = {k: repeat_option(v, k1 - k0, batch, slice(s0, s1))
                  if k in self.inner_method.batch_options else v for k, v in opts.items()}
            if seeds is not None:
                kw["seed"] = seeds[i]
            ex = _one(self.inner_method.explain(rows, b, tr, model=call.model, **kw))
            a = ex.attributions.view((s1 - s0, k1 - k0) + feat)
            total[s0:s1] += a.sum(1)
            total_sq[s0:s1] += (a * a).sum(1)
            refs = _gather_refs(refs, ex.references, (s0, s1, k0, k1), batch, n, self.baseline_kind)
        return Attributed(combine(total, total_sq, n, nt_type), refs)

    def _cost(self, x, options):
        """The inner method's cost on the ``B * nt_samples`` noisy rows (their targets resolved
        by one forward each, as the inner call does); the inner references per noisy row."""
        n = check_positive_int(options.get("nt_samples", 5), "nt_samples")
        opts = {**self._defaults, **{k: v for k, v in options.items() if k not in TUNNEL_OPTIONS},
                **self._fixed}
        rows = x[:1].expand((x.shape[0] * n,) + tuple(x.shape[1:]))
        inner = self.inner_method
        own, refs = inner._cost(rows, {k: v for k, v in opts.items() if k in inner.options()})
        return Cost(forward_rows=rows.shape[0]) + own, refs * n


def _one(result: Explanation | Several) -> Explanation:
    """The :class:`Explanation` of an inner call, which names at most one layer (a list of
    layers is split into calls of one by the tunnel's own ``explain``, before its route)."""
    if isinstance(result, Several):
        raise TypeError("layer: the tunnel's inner call takes one layer; give a list of "
                        "layers to the tunnel itself")
    return result


def _gather_refs(refs, block_refs, block, batch, n, kind):
    """The references of every sample: the inner method's own for a point or implicit
    baseline (the same for every noisy copy: those of copy 0), all of them for a
    distribution (``[B, n * m, ...]``); None if the inner method has none."""
    if block_refs is None:
        return None
    s0, s1, k0, k1 = block
    m = block_refs.shape[1]
    r = block_refs.view((s1 - s0, (k1 - k0) * m) + tuple(block_refs.shape[2:]))
    if kind != "distribution":
        if k0 != 0:
            return refs
        r = r[:, :m]
        width = m
    else:
        width = n * m
    if refs is None:
        refs = r.new_empty((batch, width) + tuple(r.shape[2:]))
    refs[s0:s1, k0 * m:k0 * m + r.shape[1]] = r
    return refs


class SmoothGrad(NoiseTunnel):
    """SmoothGrad: NoiseTunnel around :class:`~taylorattr.methods.Saliency`
    (``abs=True`` by default, as Captum's ``NoiseTunnel(Saliency(model))``)."""

    name = "smoothgrad"
    inner = Saliency

    @overload  # type: ignore[override]  # its inner method's options only: narrower
    def attribute(self, inputs: Inputs, target: Target = ..., *, nt_type: str = ...,
                  nt_samples: int = ..., stdevs: float = ..., seed: int = ...,
                  nt_samples_batch_size: int | None = ..., noise: Any = ...,
                  copy_deltas: bool = ..., abs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *, nt_type: str = ...,
                  nt_samples: int = ..., stdevs: float = ..., seed: int = ...,
                  nt_samples_batch_size: int | None = ..., noise: Any = ...,
                  copy_deltas: bool = ..., abs: bool = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, target: Target = None, *, nt_type: str = "smoothgrad",
                  nt_samples: int = 5, stdevs: float = 1.0, seed: int = 0,
                  nt_samples_batch_size: int | None = None, noise: Any = None,
                  copy_deltas: bool = False, abs: bool = True,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """SmoothGrad: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def __init__(self, model) -> None:
        super().__init__(model)

class SmoothIntegratedGradients(NoiseTunnel):
    """NoiseTunnel around :class:`~taylorattr.methods.IntegratedGradients` (a point
    baseline; the inner options ``n_steps``, ``method``, ``internal_batch_size``)."""

    name = "smoothgrad_ig"
    inner = IntegratedGradients

    @overload  # type: ignore[override]  # its inner method's options only: narrower
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  nt_type: str = ..., nt_samples: int = ..., stdevs: float = ...,
                  seed: int = ..., nt_samples_batch_size: int | None = ..., noise: Any = ...,
                  copy_deltas: bool = ..., n_steps: int = ..., method: str = ...,
                  internal_batch_size: int | None = ..., multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  nt_type: str = ..., nt_samples: int = ..., stdevs: float = ...,
                  seed: int = ..., nt_samples_batch_size: int | None = ..., noise: Any = ...,
                  copy_deltas: bool = ..., n_steps: int = ..., method: str = ...,
                  internal_batch_size: int | None = ..., multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  nt_type: str = "smoothgrad", nt_samples: int = 5, stdevs: float = 1.0,
                  seed: int = 0, nt_samples_batch_size: int | None = None, noise: Any = None,
                  copy_deltas: bool = False, n_steps: int = 50, method: str = "gausslegendre",
                  internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """SmoothIntegratedGradients: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def __init__(self, model) -> None:
        super().__init__(model)
