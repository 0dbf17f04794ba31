"""One row per method: the registry every caller that runs a method by name reads.

A :class:`MethodSpec` carries everything about a method besides its code: its class,
display label(s) and labelled settings (:class:`Variant`), baseline kind (from the class),
its Taylor reformulation, whether it is complete, and the names of the experiments each
variant takes part in (open-ended: an application names its own, see :func:`variants`).
Adding a method is one file under ``taylorattr/methods/`` and one :func:`register`
call (the library's own rows are in :mod:`taylorattr.registry.catalog`); nothing else names it::

    from taylorattr import registry
    registry.register(registry.MethodSpec("halved_gi", HalvedGI, label="GI/2"))

The library knows no paper: the paper's verdicts, Table 3 numbers, plot markers and
experiment membership are registered on top by the application
(:mod:`taylorattr.paper_methods`) through this same :func:`register`.

Everything that runs a method does it through :meth:`MethodSpec.bind`::

    run = METHODS["occlusion_patch"].bind(context={"patch": 4})   # -> BoundMethod "Occ-4x4"
    attributions = run(model, x, Point(0.0), target)

``context`` holds an experiment's settings by *option name* (``patch``, ``n_steps``,
``n_samples``, ``seed``); each method takes the ones it has as options and ignores the
rest, so no caller tests a method's name. Explicit ``bind(**settings)`` are checked
strictly. A bound method turns the experiment's baseline into what its class takes
(``baseline_kind``): a point method gets the point, an implicit-baseline method
(Gradient*Input, epsilon-LRP) ignores it, a distribution method (Expected Gradients)
uses the distribution in its settings (or the caller's, when it is one).

Why one module: a row (:class:`MethodSpec`), its bound form (:class:`BoundMethod`) and
the functions that resolve and reformulate by row read one table; splitting them would
split that table's invariants.
"""
from __future__ import annotations

import inspect
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from .. import _validation as V
from .._io import fingerprint
from ..baselines import Baseline, Point, as_baseline, describe
from ..inputs import whole_batch_view
from ..methods import AttributionMethod, Explanation
from ..methods import reformulations as R
from ..runtime.progress import model_rows_bar

__all__ = ["LAYOUT_OPTIONS", "METHODS", "BoundMethod", "MethodSpec", "Variant", "of_class", "reformulate", "reformulate_orders", "register", "resolve", "slug",
           "unregister", "variants"]

@dataclass(frozen=True)
class Variant:
    """A labelled setting of a method. ``label`` may name options in braces
    (``"Occ-{patch}x{patch}"``), filled from the effective settings. ``experiments``: the
    names of the experiments it takes part in (an application's own names; none by
    default), selected by :func:`variants`."""

    label: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    experiments: frozenset = frozenset()


@dataclass(frozen=True, eq=False)
class MethodSpec:
    """A registry row. ``variants[0]`` is the method's default setting.

    Attributes:
        name: the registry name.
        cls: the method class (an :class:`~taylorattr.methods.AttributionMethod`).
        variants: labelled settings; give ``label`` instead for a single default one.
        fixed: options this entry pins (``occlusion_1``: ``patch=1``).
        defaults: options a direct call ``spec(model, inputs)`` defaults
            (``occlusion_patch``: ``patch=2``, the paper's 2x2).
        init_args: settings routed to the constructor (``epsilon`` for LRP).
        reformulation: the Taylor reformulation, None where the method has none.
        complete: whether the attributions sum to ``f(x) - f(x~)`` (the mean over its
            references) up to float rounding on the models it runs on, one player per
            feature (with groups, per group: each feature carries its group's value);
            ``tests/test_common.py`` checks the convergence delta of every such variant.
    """

    name: str
    cls: type[AttributionMethod]
    label: str = ""
    variants: tuple[Variant, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    init_args: tuple[str, ...] = ()
    reformulation: R.Reformulation | None = None
    complete: bool = False

    def __post_init__(self):
        if not (isinstance(self.cls, type) and issubclass(self.cls, AttributionMethod)):
            raise TypeError(f"cls must be an AttributionMethod subclass, got {self.cls!r}")
        if not self.variants:
            object.__setattr__(self, "variants", (Variant(self.label or self.name),))
        if not self.label:
            object.__setattr__(self, "label", self.variants[0].label)
        for v in self.variants:
            self._check_settings(v.settings, f"variant {v.label!r}")

    # ---- what the method is ----------------------------------------------------
    @property
    def baseline_kind(self) -> str:
        return self.cls.baseline_kind

    @property
    def uses_baselines(self) -> bool:
        """Whether ``attribute`` takes ``baselines``."""
        return self.baseline_kind != "none"

    def options(self) -> set[str]:
        """The settings this method takes: its options and constructor arguments."""
        return set(self.cls.options()) | set(self.init_args)

    def signature(self) -> inspect.Signature:
        """The signature of the class's ``_attribute`` (its options are keyword-only)."""
        return inspect.signature(self.cls._attribute)

    def _check_settings(self, settings: Mapping, where: str) -> None:
        unknown = sorted(set(settings) - self.options() - {"baselines"})
        if unknown:
            raise TypeError(f"{self.name} ({where}): unexpected setting(s) {unknown}; it takes "
                            f"{sorted(self.options())}")
        for k, v in self.fixed.items():
            if k in settings and settings[k] != v:
                raise ValueError(f"{self.name} fixes {k}={v!r}, got {k}={settings[k]!r}")

    # ---- running it ------------------------------------------------------------
    def bind(self, variant: Variant | str | None = None, context: Mapping | None = None,
             **settings) -> BoundMethod:
        """The method with its settings resolved: ``variant`` (default the first) <
        ``context`` (only the options this method has, never a pinned one) < ``settings``."""
        if variant is None:
            variant = self.variants[0]
        elif isinstance(variant, str):
            found = [v for v in self.variants if v.label == variant]
            if not found:
                raise ValueError(f"variant must be one of {[v.label for v in self.variants]}, "
                                 f"got {variant!r}")
            variant = found[0]
        self._check_settings(settings, "bind")
        own = {k: v for k, v in (context or {}).items()
               if k in self.options() and k not in self.fixed}
        effective = {**variant.settings, **own, **settings, **self.fixed}
        return BoundMethod(self, _format_label(variant.label, effective),
                           MappingProxyType(effective), variant)

    def build(self, model, **init_kwargs) -> AttributionMethod:
        """The method object for ``model`` (constructor arguments: ``init_args``)."""
        unknown = set(init_kwargs) - set(self.init_args)
        if unknown:
            raise TypeError(f"{self.name}: unexpected constructor argument(s) {sorted(unknown)}")
        return self.cls(model, **init_kwargs)

    def attribute_kwargs(self, **kwargs) -> dict:
        """``kwargs`` with this entry's defaults and pinned options applied."""
        self._check_settings({k: v for k, v in kwargs.items() if k in self.fixed}, "call")
        return {**self.defaults, **kwargs, **self.fixed}

    def __call__(self, model, inputs, **kwargs):
        """Build the method and attribute ``inputs``; keyword arguments are routed to the
        constructor (``init_args``) or to ``attribute``."""
        init = {k: kwargs.pop(k) for k in self.init_args if k in kwargs}
        method = self.build(model, **init)  # attribute: written on each class (issue 47)
        return method.attribute(  # type: ignore[attr-defined, unused-ignore]
            inputs, **self.attribute_kwargs(**kwargs))


def _format_label(label: str, settings: Mapping) -> str:
    names = [f for _, f, _, _ in string.Formatter().parse(label) if f]
    return label.format(**{n: settings.get(n) for n in names}) if names else label


@dataclass(frozen=True)
class BoundMethod:
    """A method with resolved settings: ``run(model, x, baseline, target)``."""

    spec: MethodSpec
    label: str
    settings: Mapping[str, Any]
    variant: Variant

    @property
    def name(self) -> str:
        return self.spec.name

    def tag(self) -> str:
        """A stable text of the settings (for cache keys)."""
        return ",".join(f"{k}={_describe(self.settings[k])}" for k in sorted(self.settings)) \
            or "default"

    def explain(self, model, inputs, baseline=0.0, target=None, *, show_progress: bool = False,
                desc: str = "") -> Explanation:
        """Attributions with the references they explain the change against.

        ``show_progress``: a tqdm bar (``leave=False``) that moves once per model call, i.e.
        per chunk, by the rows of that chunk, totalled by the rows the method plans (its
        :meth:`~taylorattr.methods.AttributionMethod.cost`) where they can be counted;
        described by ``desc`` (e.g. the experiment's unit) and the method's label. The bar
        only observes: the attributions are bitwise those without it.
        """
        V.check_bool(show_progress, "show_progress")
        if not isinstance(desc, str):
            raise TypeError(f"desc must be a str, got {type(desc).__name__}")
        method, opts = self._built(model)
        baselines = self._baselines(baseline)
        if not show_progress:
            return method.explain(inputs, baselines, target, **opts)

        label = f"{desc}: {self.label}" if desc else self.label
        with model_rows_bar(model, label, _planned_rows(method, inputs, baselines, opts)) as bar:
            # no hook on this model: the method's own per-chunk bar instead
            return method.explain(inputs, baselines, target, show_progress=bar is None,
                                  **opts)

    def cost(self, model, inputs, baseline=0.0):
        """The rows a call runs on ``inputs`` (:meth:`AttributionMethod.cost
        <taylorattr.methods.AttributionMethod.cost>` with the bound settings), labelled with
        the variant's label. Runs no model."""
        method, opts = self._built(model)
        return method.cost(inputs, self._baselines(baseline), **opts).labelled(self.label)

    def _built(self, model):
        """The method built on ``model`` with the bound constructor settings, and the bound
        call options."""
        init = {k: v for k, v in self.settings.items() if k in self.spec.init_args}
        opts = {k: v for k, v in self.settings.items()
                if k not in self.spec.init_args and k != "baselines"}
        return self.spec.build(model, **init), opts

    def __call__(self, model, inputs, baseline=0.0, target=None, *, show_progress: bool = False,
                 desc: str = "") -> torch.Tensor:
        return self.explain(model, inputs, baseline, target, show_progress=show_progress,
                            desc=desc).attributions

    def _baselines(self, baseline):
        kind = self.spec.baseline_kind
        if kind == "none":
            return None
        if kind == "distribution":
            own = self.settings.get("baselines")
            if own is not None:
                return own
            # the caller's distribution, else none (the method may define its own, e.g. noise_std)
            return baseline if isinstance(baseline, Baseline) and baseline.kind == "distribution" \
                else None
        point = as_baseline(baseline)
        if not isinstance(point, Point):
            raise TypeError(f"baseline: {self.spec.name} takes a point baseline, got a "
                            f"{type(point).__name__}")
        return point.value


def _planned_rows(method, inputs, baselines, opts) -> int | None:
    """The forward rows a call plans (what a forward hook on the model sees), None where
    the method cannot count them (tuple inputs, a method without a cost model)."""
    try:
        return method.cost(inputs, baselines, **opts).forward_rows or None
    except (TypeError, ValueError, NotImplementedError):
        return None


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}:{fingerprint([('t', value)])}"
    if isinstance(value, Baseline):
        return describe(value)
    return repr(value)


# =======================================================================================
# The registry
# =======================================================================================
_ROWS: dict[str, MethodSpec] = {}
#: Registry name -> :class:`MethodSpec` (read-only view; use :func:`register`).
METHODS: Mapping[str, MethodSpec] = MappingProxyType(_ROWS)


def register(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add ``spec`` to :data:`METHODS` (``replace=True`` to overwrite a row of that name)."""
    if not isinstance(spec, MethodSpec):
        raise TypeError(f"spec must be a MethodSpec, got {type(spec).__name__}")
    if spec.name in _ROWS and not replace:
        raise ValueError(f"a method named {spec.name!r} is registered already "
                         "(pass replace=True to overwrite it)")
    _ROWS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registered method."""
    if name not in _ROWS:
        raise ValueError(f"name must be a registered method, got {name!r}")
    del _ROWS[name]


def variants(experiment: str) -> list[tuple[MethodSpec, Variant]]:
    """Every (method, variant) whose ``experiments`` name ``experiment``, in registration
    order (an application's experiments; :data:`taylorattr.paper_methods.EXPERIMENTS`
    for the paper's)."""
    if not isinstance(experiment, str):
        raise TypeError(f"experiment must be a str, got {type(experiment).__name__}")
    return [(spec, v) for spec in _ROWS.values() for v in spec.variants
            if experiment in v.experiments]


def of_class(cls: type) -> MethodSpec:
    """The registry row of the method class ``cls`` (the first registered, where several
    rows share a class): how code that needs one particular method finds its row without
    naming it."""
    found = next((spec for spec in _ROWS.values() if spec.cls is cls), None)
    if found is None:
        raise ValueError(f"cls: {getattr(cls, '__name__', cls)!r} has no registry row; "
                         "register(MethodSpec(...)) it first")
    return found


def slug(label) -> str:
    """A label as a file and command-line name: lower case, each run of other characters
    one hyphen (``"Occ-4x4"`` -> ``"occ-4x4"``, ``"Taylor-2"`` -> ``"taylor-2"``)."""
    return re.sub(r"[^a-z0-9]+", "-", str(label).lower()).strip("-")


def _spelling(text) -> str:
    """What two spellings of one name share: its letters and digits, lower case."""
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


def resolve(name, among=None, argument: str = "methods") -> BoundMethod:
    """The bound method ``name`` means: a :class:`BoundMethod` (returned as it is), a
    registry name (the first of ``among`` of that method, or its default variant), or a
    variant label in any case and spelling (``"IG"``, ``"ig"``, ``"Occ-4x4"``, ``"occ4x4"``).

    ``among``: the bound methods to choose from, in order (default: every variant of every
    registered method); an unknown name is a ValueError naming ``argument`` and the choices.
    """
    if isinstance(name, BoundMethod):
        return name
    pool = [spec.bind(v) for spec in _ROWS.values() for v in spec.variants] \
        if among is None else list(among)
    if isinstance(name, str):
        if name in _ROWS:
            return next((b for b in pool if b.name == name), None) or _ROWS[name].bind()
        wanted = _spelling(name)
        found = next((b for b in pool if _spelling(b.label) == wanted), None) or \
            next((b for b in pool if _spelling(b.name) == wanted), None)
        if found is not None:
            return found
    raise ValueError(f"{argument}: unknown method {name!r}; {_closest(name, pool)}")


def _closest(name, pool) -> str:
    """What to choose instead of ``name``: the (at most three) labels and registry names
    of ``pool`` closest to it (difflib's ratio of the spellings), then every label when
    there are at most 20, else two for example."""
    import difflib

    labels = list(dict.fromkeys(slug(b.label) for b in pool))
    spellings: dict[str, str] = {}
    for b in pool:
        spellings.setdefault(_spelling(b.label), slug(b.label))
        spellings.setdefault(_spelling(b.name), b.name)
    near = difflib.get_close_matches(_spelling(name), list(spellings), n=3, cutoff=0.5)
    quoted = [repr(spellings[k]) for k in near]
    shown = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
    hint = f"did you mean {shown}? " if near else ""
    if len(labels) <= 20:
        return f"{hint}choose from {', '.join(labels)} (labels in any spelling)"
    return (f"{hint}({len(labels)} labels in any spelling, e.g. {labels[0]!r} or "
            f"{labels[-1]!r}, or registry names such as {pool[0].name})")


# =======================================================================================
# reformulate()
# =======================================================================================
def _reformulation(method, baselines, kwargs):
    if not isinstance(method, str):
        raise TypeError(f"method must be a method name (str), got {type(method).__name__}")
    with_reform = sorted(n for n, s in _ROWS.items() if s.reformulation is not None)
    if method not in with_reform:
        raise ValueError(f"method must be one of {with_reform}, got {method!r}")
    spec = _ROWS[method]
    assert spec.reformulation is not None  # with_reform holds only rows with one
    spec.reformulation.check_options(method, kwargs)
    if spec.baseline_kind == "distribution" and not isinstance(baselines, (Baseline, torch.Tensor)) \
            and baselines == 0.0:
        baselines = None  # the default point means "none given" for a distribution method
    return spec.reformulation, baselines


#: Settings measured in pixels of each input's layout (window and player sizes, strides).
#: Reformulations that take them group features by that layout: on tuple inputs they would
#: need per-input groups, so they are refused there.
LAYOUT_OPTIONS = frozenset({"patch", "stride"})


def _sweep(method, reform, model, inputs, baselines, target, orders, kwargs) -> dict:
    """``reform.orders`` on a tensor, or on the one-tensor view of tuple inputs (all inputs'
    deltas together; attributions split back into the tuple)."""
    if isinstance(inputs, torch.Tensor):
        return reform.orders(model, inputs, baselines, target, orders, **kwargs)

    if reform.options & LAYOUT_OPTIONS:
        raise ValueError(f"inputs: reformulate('{method}') groups features by each input's "
                         "layout and takes one tensor; for tuple inputs use "
                         "taylorattr.group_expansions(..., feature_mask=...)")
    if baselines is None or isinstance(baselines, Baseline) and baselines.kind != "point":
        raise ValueError(f"baselines: reformulate('{method}') on tuple inputs takes point "
                         "baselines (a scalar, or one tensor per input)")
    view = whole_batch_view(model, inputs, baselines)
    with view.active():
        out = reform.orders(view.model, view.x, view.baselines, target, orders, **kwargs)
    if reform.layerwise:
        return out
    return {K: view.layout.result(view.layout.split(r)) for K, r in out.items()}


def reformulate(method: str, model, inputs: torch.Tensor, baselines=0.0, target=None,
                order: int = 2, **kwargs):
    """The Taylor reformulation of ``method`` at order ``order``.

    ``inputs`` is a tensor or a tuple of tensors (point baselines; the expansion runs over
    all inputs' deltas together and the attributions come back as a tuple). Returns an
    attribution shaped like ``inputs``, except for the layer-wise methods
    (``deeplift``, ``epsilon_lrp``), which return one
    :class:`~taylorattr.methods.reformulations.LayerReformulation` per layer followed by a
    nonlinearity. Extra keyword arguments: those the reformulation takes (``patch``,
    ``stride``, ``chunk_size``, ``show_progress`` for occlusion; ``n_samples``,
    ``noise_std``, ``seed`` for Expected Gradients, whose ``baselines`` is a distribution
    or reference tensor; ``epsilon`` for epsilon-LRP).
    """
    reform, baselines = _reformulation(method, baselines, kwargs)
    V.check_positive_int(order, "order")
    return _sweep(method, reform, model, inputs, baselines, target, (order,), kwargs)[order]


def reformulate_orders(method: str, model, inputs: torch.Tensor, baselines=0.0, target=None,
                       orders=(2,), **kwargs) -> dict:
    """``{K: reformulate(method, ..., order=K) for K in orders}``, sharing work across orders.

    The occlusion reformulations expand once at ``max(orders)`` and cut the series at each
    K (``P_k`` does not depend on the truncation), so a sweep costs about one expansion at
    the highest order; the other methods run once per order.
    """
    reform, baselines = _reformulation(method, baselines, kwargs)
    if isinstance(orders, (str, bytes)) or not hasattr(orders, "__iter__"):
        raise TypeError(f"orders must be a sequence of positive ints, got {type(orders).__name__}")
    orders = tuple(orders)
    if not orders:
        raise ValueError("orders must hold at least one order, got an empty sequence")
    for K in orders:
        V.check_positive_int(K, "orders")
    return _sweep(method, reform, model, inputs, baselines, target, orders, kwargs)


__all__ += ["Point"]
