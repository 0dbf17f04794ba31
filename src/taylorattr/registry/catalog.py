"""The registry's rows: one :func:`~taylorattr.registry.register` call per method.

Each row names the method's class, its labelled variants (settings and the experiments
each takes part in), the paper's verdicts (Table 2) and Table 3 numbers where the paper
has them, its Taylor reformulation and its plot marker. Adding a method is its file under
``taylorattr/methods/`` and one row here (or a ``register`` call in your own code).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from ..baselines import Noise
from ..data.references import TrainingDigits
from ..methods import (
    Deconvolution,
    DeepLift,
    DeepLiftShap,
    EpsilonLRP,
    ExpectedGradients,
    GradCAM,
    GradientInput,
    GradientShap,
    GuidedBackprop,
    GuidedGradCam,
    IntegratedGradients,
    KernelShap,
    Lime,
    Occlusion,
    PredictionDifference,
    Saliency,
    ShapleyValues,
    SmoothGrad,
    SmoothIntegratedGradients,
    TaylorAttribution,
)
from ..methods import gradient_shap as _gradient_shap
from ..methods import reformulations as R
from ..methods.lrp_rules import rule_class
from .specs import EXPERIMENTS, MethodSpec, PaperFacts, Variant, register

__all__ = ["EG_NOISE_STD", "SMOOTHGRAD_STD"]

#: Noise scale of Expected Gradients' baselines ``N(x, s^2)`` (the paper's wording).
EG_NOISE_STD = 0.2
_F, _P, _N = "follows", "partially", "does not"


def _paper(v1, v2, v3) -> PaperFacts:
    return PaperFacts(MappingProxyType({1: v1, 2: v2, 3: v3}))


def _table3(poly, msg, csg) -> Mapping[str, float]:
    return MappingProxyType({"Poly": poly, "M-sg": msg, "C-sg": csg})


_NOT_VALIDATED = EXPERIMENTS - {"validation"}
register(MethodSpec("gradient_input", GradientInput, variants=(
    Variant("GI", table3=_table3(0.0, 0.0, 0.0), experiments=EXPERIMENTS),),
    paper=_paper(_N, _N, _N), reformulation=R.GRADIENT_INPUT, marker="o"))
register(MethodSpec("occlusion_1", Occlusion, variants=(
    Variant("Occ-1", table3=_table3(0.0, 0.05, 13.17), experiments=EXPERIMENTS - {"saliency"}),),
    fixed=MappingProxyType({"patch": 1}), paper=_paper(_N, _P, _N),
    reformulation=R.OCCLUSION_1, marker="v"))
register(MethodSpec("occlusion_patch", Occlusion, variants=(
    Variant("Occ-{patch}x{patch}", {"patch": 2}, _table3(0.0, 0.35, 21.22)),
    Variant("Occ-{patch}x{patch}", {"patch": 4}, _table3(0.0, 2.00, 35.93),
            frozenset({"validation"}))),
    defaults=MappingProxyType({"patch": 2}), paper=_paper(_N, _P, _N), reformulation=R.OCCLUSION_PATCH, marker="^"))
register(MethodSpec("deeplift", DeepLift, variants=(
    Variant("DL", table3=_table3(0.0, 2.35, 32.76)),),
    paper=_paper(_F, _N, _N), reformulation=R.DEEPLIFT, marker="s", complete=True))
register(MethodSpec("epsilon_lrp", EpsilonLRP, variants=(
    Variant("LRP", experiments=frozenset({"audit"})),),
                    init_args=("epsilon",), paper=_paper(_F, _N, _N),
                    reformulation=R.EPSILON_LRP, marker="P"))
register(MethodSpec("integrated_gradients", IntegratedGradients, variants=(
    Variant("IG", {"n_steps": 50}, _table3(0.12, 3.50, 40.29)),),
    paper=_paper(_F, _F, _N), reformulation=R.INTEGRATED_GRADIENTS, marker="D"))
register(MethodSpec("expected_gradients", ExpectedGradients, variants=(
    # N(x, s^2) around the input: the paper's wording
    Variant("EG", {"noise_std": EG_NOISE_STD, "n_samples": 50}, experiments=_NOT_VALIDATED),
    # N(0, s^2): noise around the black image that the square removal sets pixels to
    Variant("EG (around 0)", {"baselines": Noise(EG_NOISE_STD, around=0.0),
                              "n_samples": 50}, experiments=frozenset({"assessment"})),
    # training digits (Erion et al.); the workspace rebinds them to its own MNIST source
    Variant("EG (data)", {"baselines": TrainingDigits(), "n_samples": 50},
            experiments=frozenset({"assessment"}))),
    paper=_paper(_F, _F, _F), reformulation=R.averaged_over_draws(ExpectedGradients.draw),
    marker="*"))
register(MethodSpec("taylor", TaylorAttribution, variants=(
    Variant("Taylor-{order}", {"order": 1}, experiments=frozenset({"saliency"})),
    Variant("Taylor-{order}", {"order": 2}, experiments=frozenset({"saliency"}))),
    marker="X"))


# ---- the follow-up's methods, part 1: the gradient family ----------------------------

_NO_VALIDATION = frozenset({"audit", "assessment", "saliency"})
#: SmoothGrad's noise on [0, 1] images: 15% of the range (Smilkov et al. suggest 10-20%).
SMOOTHGRAD_STD = 0.15
_SG = {"nt_samples": 50, "stdevs": SMOOTHGRAD_STD}
register(MethodSpec("saliency", Saliency, variants=(Variant("Saliency", experiments=_NO_VALIDATION),),
                    marker="X"))
register(MethodSpec("guided_backprop", GuidedBackprop, variants=(
    Variant("GBP", experiments=_NO_VALIDATION),), marker="P"))
register(MethodSpec("grad_cam", GradCAM, variants=(  # needs a convolution (not in the audit)
    Variant("Grad-CAM", {"relu_attributions": True, "interpolate_mode": "bilinear"},
            experiments=frozenset({"saliency", "assessment"})),), marker="8"))
register(MethodSpec("deeplift_shap", DeepLiftShap, variants=(
    Variant("DLS", {"noise_std": EG_NOISE_STD, "n_samples": 50}, experiments=_NO_VALIDATION),),
    marker="p", complete=True))
register(MethodSpec("gradient_shap", GradientShap, variants=(
    Variant("GS", {"noise_std": EG_NOISE_STD, "n_samples": 50, "stdevs": 0.1},
            experiments=_NO_VALIDATION),),
    reformulation=replace(R.gradient_shap_reformulation(),
                          cost=R.drawn_rows_cost(_gradient_shap.draw)), marker="d"))
register(MethodSpec("smoothgrad", SmoothGrad, variants=(
    Variant("SG", {**_SG, "nt_type": "smoothgrad"}, experiments=_NO_VALIDATION),), marker="<"))
register(MethodSpec("smoothgrad_sq", SmoothGrad, variants=(
    Variant("SG-sq", _SG, experiments=_NO_VALIDATION),),
    fixed=MappingProxyType({"nt_type": "smoothgrad_sq"}), marker=">"))
register(MethodSpec("vargrad", SmoothGrad, variants=(
    Variant("VarGrad", _SG, experiments=_NO_VALIDATION),),
    fixed=MappingProxyType({"nt_type": "vargrad"}), marker="h"))
register(MethodSpec("smoothgrad_ig", SmoothIntegratedGradients, variants=(
    Variant("SG-IG", {"nt_samples": 10, "stdevs": SMOOTHGRAD_STD, "n_steps": 16},
            experiments=frozenset({"audit", "validation", "saliency"})),),
    reformulation=replace(R.smoothed(R.INTEGRATED_GRADIENTS),
                          cost=R.noisy_copies_cost(R.INTEGRATED_GRADIENTS)), marker="1"))
# ---- the follow-up's methods, part 2: Shapley-type methods and Prediction Difference ----
_AUDIT = frozenset({"audit"})
# exact enumeration on the audit's 6-feature probes, permutation sampling (n_samples =
# AUDIT_DRAWS orders) on the 256-feature principle-3 probes
# In the assessment the players are 4x4 patches (pixel-level players cost 10^4-10^5
# forwards per image): permutation sampling for Shapley, 200 coalitions for KernelSHAP.
_ASSESSED = frozenset({"assessment"})
register(MethodSpec("shapley", ShapleyValues, variants=(
    Variant("Shapley", experiments=_AUDIT),
    Variant("Shapley-4x4", {"patch": 4, "method": "sampling", "n_samples": 25},
            experiments=_ASSESSED)),
    reformulation=R.SHAPLEY_RULE, marker="h", complete=True))
register(MethodSpec("kernel_shap", KernelShap, variants=(
    Variant("KernelSHAP", experiments=_AUDIT),
    Variant("KernelSHAP-4x4", {"patch": 4, "n_samples": 200}, experiments=_ASSESSED)),
    marker="H", complete=True))
register(MethodSpec("prediction_difference", PredictionDifference, variants=(
    Variant("PredDiff", {"noise_std": EG_NOISE_STD}, experiments=_AUDIT),
    Variant("PredDiff-4x4", {"patch": 4, "noise_std": EG_NOISE_STD, "n_samples": 8},
            experiments=_ASSESSED)), marker="d"))
# LRP rules and composites (Zennit's), one row each (alpha1_beta0 is z_plus, the epsilon rule
# is epsilon_lrp's, so neither has a row of its own)
for _rule, _label, _marker in (
        ("z_plus", "LRP-z+", "<"), ("alpha2_beta1", "LRP-a2b1", ">"), ("gamma", "LRP-gamma", "p"),
        ("flat", "LRP-flat", "8"), ("w_square", "LRP-w2", "1"), ("epsilon_plus", "LRP-eps+", "2"),
        ("epsilon_plus_flat", "LRP-eps+flat", "3"), ("epsilon_alpha2_beta1", "LRP-eps-a2b1", "4"),
        ("epsilon_alpha2_beta1_flat", "LRP-eps-a2b1-flat", "+")):
    register(MethodSpec(f"lrp_{_rule}", rule_class(_rule), variants=(
        Variant(_label, experiments=_AUDIT | _ASSESSED),), init_args=("epsilon", "stabilizer", "gamma"),
        marker=_marker))

# ---- Captum's remaining methods (issue 27): no experiment runs them by default ----------
_NONE = frozenset()
register(MethodSpec("deconvolution", Deconvolution, variants=(
    Variant("Deconv", experiments=_NONE),), marker="v"))
register(MethodSpec("guided_grad_cam", GuidedGradCam, variants=(  # needs a convolution
    Variant("Guided Grad-CAM", experiments=_NONE),), marker="8"))
register(MethodSpec("lime", Lime, variants=(
    Variant("LIME", experiments=_NONE),), marker="s"))
