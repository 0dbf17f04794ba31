"""The audit: any method made uniform, measured on the probes; the measured Table 2.

``audit(method)`` accepts a registry name, a :class:`~taylorattr.registry.MethodSpec`, one
of our method classes or instances, or any callable ``(model, inputs, baselines, target)``
(:func:`captum_adapter` makes one from a Captum class). See :mod:`taylorattr.principles`
for the probes, the scores and the verdict rule.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from .. import _validation as V
from .._validation import check_seed as _check_seed
from ..methods import AttributionMethod
from ..paper_methods import PAPER, variants
from ..registry import METHODS, MethodSpec
from ..reporting.report import markdown_table
from .measures import _assignment, _completeness, _polarity, _reference_correlation, _target_tensor
from .probes import _audit_suite

__all__ = ["AUDIT_DRAWS", "PAPER_VERDICTS", "PASS_SCORE", "VERDICTS", "AuditReport", "audit",
           "captum_adapter", "format_table", "principles_table"]

#: A probe is passed when its score (1 = exact) is at least this: at most 10% of the
#: mass in question (the output change for principle 1, the higher-order terms for 2,
#: a polarity gap or correlation for 3) is wrong.
PASS_SCORE = 0.9
#: Draws of sampling methods (every method with an ``n_samples`` option) in the audit:
#: at the library default of 50 draws the Monte-Carlo error of a noise-baseline method is
#: about 10% of the higher-order mass (see the docs).
AUDIT_DRAWS = 256
#: The verdict strings, best first.
VERDICTS = ("follows", "partially", "does not")
_F, _P, _N = VERDICTS


class _PaperVerdicts(Mapping):
    """The paper's Table 2 by registry name, read from the registry rows."""

    def _rows(self):
        return {n: PAPER[n].verdicts for n in METHODS if n in PAPER}

    def __getitem__(self, name):
        return self._rows()[name]

    def __iter__(self):
        return iter(self._rows())

    def __len__(self):
        return len(self._rows())


#: The paper's Table 2 (docs/design.md), by registry name (from :data:`METHODS`).
PAPER_VERDICTS: Mapping[str, Mapping[int, str]] = _PaperVerdicts()


# =======================================================================================
# Methods: ours, Captum's, or any callable (model, inputs, baselines, target)
# =======================================================================================
@dataclass(frozen=True)
class _Attributor:
    """A method made uniform: ``run(model, x, baselines, target) -> (a, used)`` where
    ``used`` holds the references the method explained the change against, ``[B, n, ...]``."""

    name: str
    fn: Callable  # (model, x, baselines, target) -> attributions, or an Explanation
    settings: Mapping[str, Any] = field(default_factory=dict)

    def run(self, model, x, baselines, target):
        a = self.fn(model, x, baselines, target)
        used = baselines.unsqueeze(1)
        if hasattr(a, "references"):  # an Explanation of one of our methods
            used = a.references if a.references is not None else used
            a = a.attributions
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"method {self.name!r} must return a torch.Tensor of attributions, "
                            f"got {type(a).__name__}")
        if a.shape != x.shape:
            raise ValueError(f"method {self.name!r} returned attributions of shape "
                             f"{tuple(a.shape)} for inputs of shape {tuple(x.shape)}")
        a = a.detach().to(x.dtype)
        if not torch.isfinite(a).all():
            raise ValueError(f"method {self.name!r} returned NaN or inf attributions")
        return a, used.to(x.dtype)


def _spec_for_class(cls):
    for spec in METHODS.values():
        if spec.cls is cls and not spec.fixed and not spec.defaults:
            return spec
    for spec in METHODS.values():  # e.g. Occlusion: occlusion_1 (its class default patch=1)
        if spec.cls is cls:
            return spec
    return None


#: Methods whose ``n_samples`` is not a count of draws: KernelSHAP's is the model rows of one
#: regression over the G players per sample, and keeps the library default ``min(2^G - 1,
#: 2G + 2048)`` (exact enumeration on the 6-feature probes, a determined fit on the
#: 256- and 1024-feature ones, where AUDIT_DRAWS rows gave a minimum-norm solution and a
#: warning).
ROWS_NOT_DRAWS = frozenset({"kernel_shap"})


def _bound(spec: MethodSpec, kwargs: dict, seed: int) -> _Attributor:
    draws = {} if spec.name in ROWS_NOT_DRAWS else {"n_samples": AUDIT_DRAWS}
    bound = spec.bind(context={**draws, "seed": seed}, **kwargs)
    return _Attributor(spec.name, bound.explain, settings=dict(bound.settings))


def _resolve(method, method_kwargs, seed) -> _Attributor:
    if method_kwargs is None:
        method_kwargs = {}
    if not isinstance(method_kwargs, Mapping):
        raise TypeError(f"method_kwargs must be a mapping or None, got "
                        f"{type(method_kwargs).__name__}")
    kwargs = dict(method_kwargs)
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)}, a method class or "
                             f"instance, or a callable (model, inputs, baselines, target); "
                             f"got the unknown name {method!r}")
        return _bound(METHODS[method], kwargs, seed)
    if isinstance(method, MethodSpec):
        return _bound(method, kwargs, seed)
    if isinstance(method, type):
        if issubclass(method, AttributionMethod):
            spec = _spec_for_class(method)
            if spec is None:
                raise ValueError(f"method: the class {method.__name__} is not in the registry "
                                 "taylorattr.registry.METHODS")
            return _bound(spec, kwargs, seed)
        raise TypeError(f"method must be a registry name, one of our method classes or "
                        f"instances, or a callable (model, inputs, baselines, target); got the "
                        f"class {method.__name__} (wrap a Captum class with "
                        "taylorattr.principles.captum_adapter)")
    if isinstance(method, AttributionMethod):
        spec = _spec_for_class(type(method))
        if spec is None:
            raise ValueError(f"method: {type(method).__name__} is not in the registry "
                             "taylorattr.registry.METHODS")
        params = inspect.signature(type(method).__init__).parameters
        init = {k: getattr(method, k) for k in params
                if k not in ("self", "model") and hasattr(method, k)}
        return _bound(spec, {**init, **kwargs}, seed)
    if isinstance(method, nn.Module):
        raise TypeError(f"method must be a method name, a method class or instance, or a callable "
                        f"(model, inputs, baselines, target) -> attributions; got the model "
                        f"{type(method).__name__} itself")
    if callable(method):
        name = getattr(method, "__name__", type(method).__name__)
        if kwargs:
            def fn(model, x, baselines, target):
                return method(model, x, baselines, target, **kwargs)
        else:
            fn = method
        return _Attributor(name, fn, settings=kwargs)
    raise TypeError(f"method must be a registry name (str), one of our method classes or "
                    f"instances, or a callable (model, inputs, baselines, target); got "
                    f"{type(method).__name__}")


def captum_adapter(captum_method_class, **attribute_kwargs) -> Callable:
    """Turn a Captum attribution class into an audit callable.

    ``captum_adapter(captum.attr.IntegratedGradients, n_steps=50)`` returns
    ``fn(model, inputs, baselines, target)`` that builds ``captum_method_class(model)`` and
    calls its ``attribute(inputs, target=target, baselines=baselines, **attribute_kwargs)``
    (``baselines`` only when that ``attribute`` takes them and they are not given here).
    """
    if not isinstance(captum_method_class, type) or not callable(
            getattr(captum_method_class, "attribute", None)):
        raise TypeError("captum_method_class must be an attribution class with an `attribute` "
                        f"method (e.g. captum.attr.IntegratedGradients), got "
                        f"{captum_method_class!r}")
    takes_baselines = "baselines" in inspect.signature(captum_method_class.attribute).parameters

    def attribute(model, inputs, baselines, target):
        kw = dict(attribute_kwargs)
        if takes_baselines:
            kw.setdefault("baselines", baselines)
        return captum_method_class(model).attribute(inputs, target=target, **kw)

    attribute.__name__ = f"captum.{captum_method_class.__name__}"
    attribute.__qualname__ = attribute.__name__
    return attribute


# =======================================================================================
# The report
# =======================================================================================
def _verdict(probe_scores: Iterable[float]) -> str:
    passed = [s >= PASS_SCORE for s in probe_scores]
    if passed and all(passed):
        return _F
    return _P if any(passed) else _N


@dataclass(frozen=True)
class AuditReport:
    """The measured principles of one method.

    ``scores[p]``: mean probe score in [0, 1] for principle ``p`` (1 = exact);
    ``verdicts[p]``: ``"follows"`` / ``"partially"`` / ``"does not"`` (every / some / no
    probe scores at least :data:`PASS_SCORE`); ``details[p]``: per-probe raw numbers;
    ``paper``: the paper's verdicts when ``method`` is one of its seven, else None;
    ``settings``: the pass score, the method's effective settings (e.g. Expected
    Gradients' ``noise_std`` and ``n_samples``) and the names of extra models.
    """

    method: str
    scores: Mapping[int, float]
    verdicts: Mapping[int, str]
    details: Mapping[int, Mapping[str, Mapping[str, Any]]]
    paper: Mapping[int, str] | None = None
    pass_score: float = PASS_SCORE
    seed: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict)

    def differs_from_paper(self) -> list[int]:
        """Principles whose measured verdict differs from the paper's."""
        if self.paper is None:
            return []
        return [p for p in (1, 2, 3) if self.verdicts[p] != self.paper[p]]

    def __str__(self) -> str:
        names = {1: "1 low approximation error", 2: "2 correct assignment",
                 3: "3 unbiased baseline"}
        title = (f"Principle audit of {self.method} (seed {self.seed}; a probe passes at "
                 f"score >= {self.pass_score})")
        lines = [title]
        head = f"  {'principle':<28}{'score':>7}  {'verdict':<11}"
        if self.paper is not None:
            head += "paper"
        lines.append(head)
        for p in (1, 2, 3):
            row = f"  {names[p]:<28}{self.scores[p]:>7.3f}  {self.verdicts[p]:<11}"
            if self.paper is not None:
                row += self.paper[p] + ("" if self.paper[p] == self.verdicts[p] else "  *")
            lines.append(row)
        lines.append("  probe scores:")
        for p in (1, 2, 3):
            items = ", ".join(f"{k} {v['score']:.3f}" for k, v in self.details[p].items())
            lines.append(f"    {p}: {items}")
        if self.differs_from_paper():
            lines.append("  * measured verdict differs from the paper's (docs/principles.md)")
        return "\n".join(lines)


def _check_models(models) -> list[tuple[str, Any, torch.Tensor]]:
    if models is None:
        return []
    if isinstance(models, Mapping):
        items = list(models.items())
    elif isinstance(models, Iterable) and not isinstance(models, (str, bytes, torch.Tensor)):
        items = [(f"model_{k}", pair) for k, pair in enumerate(models)]
    else:
        raise TypeError("models must be None, a mapping name -> (model, inputs) or a sequence "
                        f"of (model, inputs) pairs, got {type(models).__name__}")
    out = []
    for name, pair in items:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"models[{name!r}] must be a (model, inputs) pair, got "
                            f"{type(pair).__name__}")
        model, x = pair
        V.check_model(model, f"models[{name!r}] model")
        V.check_inputs(x, f"models[{name!r}] inputs")
        out.append((str(name), model, x.detach()))
    return out


def audit(method, *, seed: int = 0, models=None, method_kwargs=None) -> AuditReport:
    """Measure the three principles for ``method`` (see the module docstring).

    Args:
        method: a registry name (``"integrated_gradients"``, see
            ``taylorattr.methods.METHODS``), one of our method classes or instances, or any
            callable ``(model, inputs, baselines, target) -> attributions`` (attributions
            shaped like ``inputs``; :func:`captum_adapter` makes one from a Captum class).
        seed: builds the probes and seeds the draws of sampling methods.
        models: extra models for principle 1, e.g. trained MNIST networks: a mapping
            ``name -> (model, inputs)`` or a sequence of ``(model, inputs)`` pairs; each is
            explained for its argmax class against the zero baseline.
        method_kwargs: keyword arguments for the method (constructor or ``attribute``
            arguments for ours, e.g. ``{"n_steps": 64}``; extra keyword arguments for a
            callable). Methods are bound with their registry settings, and sampling methods
            with ``n_samples=AUDIT_DRAWS``.
    """
    _check_seed(seed)
    att = _resolve(method, method_kwargs, seed)
    extra = _check_models(models)
    probes = _audit_suite(seed)
    details: dict[int, dict[str, dict]] = {1: {}, 2: {}, 3: {}}
    for probe in probes.values():
        x = probe.inputs
        target = _target_tensor(probe.model, x, probe.target)
        baselines = torch.zeros_like(x)
        a, used = att.run(probe.model, x, baselines, target)
        if 1 in probe.principles:
            details[1][probe.name] = _completeness(probe.model, x, a, used, target)
        if 2 in probe.principles:
            details[2][probe.name] = _assignment(probe.model, x, a, used, target, probe.groups)
        if 3 in probe.principles:  # an object mask: its share; else |a| against |delta|
            details[3][probe.name] = (_polarity(a, probe.mask) if probe.mask is not None
                                      else _reference_correlation(x, a, baselines))
    for name, model, x in extra:
        target = _target_tensor(model, x, None)
        baselines = torch.zeros_like(x)
        a, used = att.run(model, x, baselines, target)
        details[1][name] = _completeness(model, x, a, used, target)
    scores = {p: sum(v["score"] for v in details[p].values()) / len(details[p]) for p in details}
    verdicts = {p: _verdict(v["score"] for v in details[p].values()) for p in details}
    return AuditReport(
        method=att.name,
        scores=MappingProxyType(scores),
        verdicts=MappingProxyType(verdicts),
        details=MappingProxyType({p: MappingProxyType(d) for p, d in details.items()}),
        paper=PAPER_VERDICTS.get(att.name),
        seed=seed,
        settings=MappingProxyType({"pass_score": PASS_SCORE, "method": dict(att.settings),
                                   "models": [name for name, *_ in extra]}),
    )


def _audited():
    seen, out = set(), []
    for spec, v in variants("audit"):
        if spec.name not in seen:
            seen.add(spec.name)
            out.append((spec, v))
    return out


# =======================================================================================
# The measured Table 2
# =======================================================================================
def principles_table(methods=None, seed: int = 0) -> list[dict]:
    """The measured Table 2: one row per method (default: every registered method that
    takes part in the audit, see :func:`taylorattr.paper_methods.variants`).

    Each row: ``method``, ``score_1..3``, ``verdict_1..3`` and ``paper_1..3`` (the
    paper's verdicts, None for methods outside the paper).
    """
    if methods is None:
        methods = [spec.name for spec, _ in _audited()]
    elif isinstance(methods, (str, bytes)) or not isinstance(methods, Iterable):
        raise TypeError(f"methods must be None or a sequence of methods, got "
                        f"{type(methods).__name__}")
    rows = []
    for m in methods:
        r = audit(m, seed=seed)
        row = {"method": r.method}
        for p in (1, 2, 3):
            row[f"score_{p}"] = r.scores[p]
        for p in (1, 2, 3):
            row[f"verdict_{p}"] = r.verdicts[p]
        for p in (1, 2, 3):
            row[f"paper_{p}"] = None if r.paper is None else r.paper[p]
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown pipe table of :func:`principles_table` rows (score, verdict and the
    paper's verdict per principle); ``*`` marks a measured verdict that differs from the
    paper's."""

    cols = ["1 low error", "2 assignment", "3 unbiased baseline"]
    body, marked = [], False
    for r in rows:
        cells = [r["method"]]
        for p in (1, 2, 3):
            paper = r.get(f"paper_{p}")
            text = f"{r[f'score_{p}']:.2f} {r[f'verdict_{p}']}"
            if paper is not None:
                mark = "" if paper == r[f"verdict_{p}"] else " *"
                marked |= bool(mark)
                text += f" ({paper}){mark}"
            cells.append(text)
        body.append(cells)
    out = [markdown_table(["method"] + [f"{c}: score verdict (paper)" for c in cols], body), "",
           (f"A probe passes at score >= {PASS_SCORE}; follows = every probe passes, "
            "partially = some do, does not = none.")]
    if marked:
        out.append("Verdicts marked * differ from the paper's Table 2 (see docs/principles.md).")
    return "\n".join(out)
