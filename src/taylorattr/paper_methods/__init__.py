"""The paper's facts about the registered methods, put on top of the library's registry.

The library's registry (:mod:`taylorattr.registry`) knows methods, their labelled settings
and reformulations, and nothing of Deng et al. (AAAI 2021). This application module adds
what the paper says and what its experiments run, through the same public API a user
has (``register(replace(spec, variants=...), replace=True)``):

* the experiments each variant takes part in (:data:`EXPERIMENTS`: the principle audit,
  the validation table, the assessment, the saliency grid), read by :func:`variants`;
* the assessment's own variants (Expected Gradients around 0 and on training digits,
  Shapley-type methods on 4x4 players);
* the paper's Table 2 verdicts (:data:`PAPER`, a :class:`PaperFacts` per method), its
  Table 3 percentage changes by variant label (:data:`TABLE3`) and the plot marker of each
  method in the trend figures (:func:`marker`).

Importing this module registers them; every experiment, the audit and the CLI import it.
A method of your own joins the paper's experiments by naming them in its variants:
``Variant("GI/2", experiments=paper_methods.EXPERIMENTS)``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from ..baselines import Noise
from ..data.references import TrainingDigits
from ..registry import METHODS, MethodSpec, Variant, register
from ..registry import variants as _tagged
from ..registry.catalog import EG_NOISE_STD, LRP_RULES

__all__ = ["EXPERIMENTS", "MARKERS", "PAPER", "TABLE3", "PaperFacts", "marker", "paper_facts",
           "principle_count", "variants"]

#: Where a method can take part: the principle audit, the validation table (needs a
#: reformulation), the assessment (infidelity, bounding boxes), the saliency grid.
EXPERIMENTS = frozenset({"audit", "validation", "assessment", "saliency"})

_VERDICT_WEIGHT = {"follows": 1.0, "partially": 0.5, "does not": 0.0}
_F, _P, _N = "follows", "partially", "does not"


def principle_count(verdicts) -> float:
    """``#follows + 0.5 * #partially`` over verdicts (a mapping principle -> verdict or a
    sequence of verdicts)."""
    values = list(verdicts.values()) if isinstance(verdicts, Mapping) else list(verdicts)
    bad = [v for v in values if v not in _VERDICT_WEIGHT]
    if bad:
        raise ValueError(f"unknown verdict(s) {bad}; expected one of {list(_VERDICT_WEIGHT)}")
    return float(sum(_VERDICT_WEIGHT[v] for v in values))


@dataclass(frozen=True)
class PaperFacts:
    """What the paper's Table 2 says of a method: ``verdicts[p]`` for principles 1..3."""

    verdicts: Mapping[int, str]

    def __post_init__(self):
        bad = [v for v in self.verdicts.values() if v not in _VERDICT_WEIGHT]
        if sorted(self.verdicts) != [1, 2, 3] or bad:
            raise ValueError(f"verdicts must map 1, 2, 3 to one of {list(_VERDICT_WEIGHT)}, got "
                             f"{dict(self.verdicts)}")

    @property
    def principle_count(self) -> float:
        """``#follows + 0.5 * #partially`` (the x-axis of the paper's Figures 3 and 4)."""
        return principle_count(self.verdicts)


def _paper(v1, v2, v3) -> PaperFacts:
    return PaperFacts(MappingProxyType({1: v1, 2: v2, 3: v3}))


def _table3(poly, msg, csg) -> Mapping[str, float]:
    return MappingProxyType({"Poly": poly, "M-sg": msg, "C-sg": csg})


#: The paper's Table 2, by registry name (methods outside the paper have none).
PAPER: dict[str, PaperFacts] = {
    "gradient_input": _paper(_N, _N, _N), "occlusion_1": _paper(_N, _P, _N),
    "occlusion_patch": _paper(_N, _P, _N), "deeplift": _paper(_F, _N, _N),
    "epsilon_lrp": _paper(_F, _N, _N), "integrated_gradients": _paper(_F, _F, _N),
    "expected_gradients": _paper(_F, _F, _F)}
#: The paper's Table 3 (percentage change per model label), by variant label.
TABLE3: dict[str, Mapping[str, float]] = {
    "GI": _table3(0.0, 0.0, 0.0), "Occ-1": _table3(0.0, 0.05, 13.17),
    "Occ-2x2": _table3(0.0, 0.35, 21.22), "Occ-4x4": _table3(0.0, 2.00, 35.93),
    "DL": _table3(0.0, 2.35, 32.76), "IG": _table3(0.12, 3.50, 40.29)}
#: matplotlib marker of each method in the trend figures, by registry name ("o" otherwise).
MARKERS: dict[str, str] = {
    "gradient_input": "o", "occlusion_1": "v", "occlusion_patch": "^", "deeplift": "s",
    "epsilon_lrp": "P", "integrated_gradients": "D", "expected_gradients": "*", "taylor": "X",
    "saliency": "X", "guided_backprop": "P", "grad_cam": "8", "deeplift_shap": "p",
    "gradient_shap": "d", "smoothgrad": "<", "smoothgrad_sq": ">", "vargrad": "h",
    "smoothgrad_ig": "1", "shapley": "h", "kernel_shap": "H", "prediction_difference": "d",
    "deconvolution": "v", "guided_grad_cam": "8", "lime": "s"} | dict(zip(
        LRP_RULES, ("<", ">", "p", "8", "1", "2", "3", "4", "+")))

# In the assessment the players are 4x4 patches (pixel-level players cost 10^4-10^5
# forwards per image): permutation sampling for Shapley, 300 coalitions for KernelSHAP
# (a determined fit needs G + 1 rows: 50 for a 28x28 digit's 49 players, 257 for a 64x64
# canvas's 256; 200 rows warned on every canvas and gave a minimum-norm solution).
_ASSESSMENT_VARIANTS = {
    "expected_gradients": (
        # N(0, s^2): noise around the black image that the square removal sets pixels to
        Variant("EG (around 0)", {"baselines": Noise(EG_NOISE_STD, around=0.0), "n_samples": 50}),
        # training digits (Erion et al.); the workspace rebinds them to its own MNIST source
        Variant("EG (data)", {"baselines": TrainingDigits(), "n_samples": 50})),
    "shapley": (Variant("Shapley-4x4", {"patch": 4, "method": "sampling", "n_samples": 25}),),
    "kernel_shap": (Variant("KernelSHAP-4x4", {"patch": 4, "n_samples": 300}),),
    "prediction_difference": (
        Variant("PredDiff-4x4", {"patch": 4, "noise_std": EG_NOISE_STD, "n_samples": 8}),)}

_ALL, _AUDIT, _ASSESSED = EXPERIMENTS, frozenset({"audit"}), frozenset({"assessment"})
_NO_VALIDATION = frozenset({"audit", "assessment", "saliency"})
_SALIENCY = frozenset({"saliency"})
#: The experiments of each variant, by its label (variants not named here take part in none:
#: Deconvolution, Guided Grad-CAM and LIME). Shapley-type methods: exact enumeration on the
#: audit's 6-feature probes, permutation sampling on its 256-feature principle-3 probes.
_MEMBERSHIP: dict[str, frozenset] = {
    "GI": _ALL, "Occ-1": _ALL - _SALIENCY, "Occ-2x2": _ALL, "Occ-4x4": frozenset({"validation"}),
    "DL": _ALL, "LRP": _AUDIT, "IG": _ALL, "EG": _ALL - {"validation"},
    "EG (around 0)": _ASSESSED, "EG (data)": _ASSESSED,
    "Taylor-1": _SALIENCY, "Taylor-2": _SALIENCY,
    "Saliency": _NO_VALIDATION, "GBP": _NO_VALIDATION,
    "Grad-CAM": frozenset({"saliency", "assessment"}),  # needs a convolution (not in the audit)
    "DLS": _NO_VALIDATION, "GS": _NO_VALIDATION, "SG": _NO_VALIDATION, "SG-sq": _NO_VALIDATION,
    "VarGrad": _NO_VALIDATION, "SG-IG": frozenset({"audit", "validation", "saliency"}),
    "Shapley": _AUDIT, "Shapley-4x4": _ASSESSED, "KernelSHAP": _AUDIT,
    "KernelSHAP-4x4": _ASSESSED, "PredDiff": _AUDIT, "PredDiff-4x4": _ASSESSED,
    } | {label: _AUDIT | _ASSESSED for label in LRP_RULES.values()}


def _paper_row(spec: MethodSpec) -> MethodSpec:
    """``spec`` with the assessment's extra variants and every variant's experiments."""
    extended = spec.variants + _ASSESSMENT_VARIANTS.get(spec.name, ())
    return replace(spec, variants=tuple(
        replace(v, experiments=_MEMBERSHIP.get(spec.bind(v).label, frozenset())) for v in extended))


for _name in list(METHODS):
    register(_paper_row(METHODS[_name]), replace=True)


def variants(experiment: str) -> list:
    """Every registered (method, variant) taking part in the paper's ``experiment``, in
    registration order (the validation table: only methods with a reformulation)."""
    if experiment not in EXPERIMENTS:
        raise ValueError(f"experiment must be one of {sorted(EXPERIMENTS)}, got {experiment!r}")
    return [(spec, v) for spec, v in _tagged(experiment)
            if experiment != "validation" or spec.reformulation is not None]


def paper_facts(name: str) -> PaperFacts | None:
    """The paper's Table 2 verdicts of the method registered as ``name`` (None outside it)."""
    return PAPER.get(name)


def marker(name: str) -> str:
    """The plot marker of the method registered as ``name``."""
    return MARKERS.get(name, "o")
