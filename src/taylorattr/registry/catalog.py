"""The library's rows: one :func:`~taylorattr.registry.register` call per method.

Each row names the method's class, its labelled variants (settings), the options it pins
or defaults, its constructor arguments, its Taylor reformulation and whether it is
complete. Adding a method is its file under ``taylorattr/methods/`` and one row here (or a
``register`` call in your own code). Nothing here is about the paper: its verdicts, Table 3
numbers, markers, experiment membership and its assessment's extra variants are registered
on top by :mod:`taylorattr.paper_methods`.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

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
    LayerConductance,
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
from .specs import MethodSpec, Variant, register

__all__ = ["EG_NOISE_STD", "LRP_RULES", "SMOOTHGRAD_STD"]

#: Noise scale of the noise-baseline methods' ``N(x, s^2)`` (Expected Gradients, DeepLIFT
#: SHAP, GradientSHAP, Prediction Difference).
EG_NOISE_STD = 0.2
#: SmoothGrad's noise on [0, 1] images: 15% of the range (Smilkov et al. suggest 10-20%).
SMOOTHGRAD_STD = 0.15

register(MethodSpec("gradient_input", GradientInput, label="GI", reformulation=R.GRADIENT_INPUT))
register(MethodSpec("occlusion_1", Occlusion, label="Occ-1", fixed=MappingProxyType({"patch": 1}),
                    reformulation=R.OCCLUSION_1))
register(MethodSpec("occlusion_patch", Occlusion, variants=(
    Variant("Occ-{patch}x{patch}", {"patch": 2}), Variant("Occ-{patch}x{patch}", {"patch": 4})),
    defaults=MappingProxyType({"patch": 2}), reformulation=R.OCCLUSION_PATCH))
register(MethodSpec("deeplift", DeepLift, label="DL", reformulation=R.DEEPLIFT, complete=True))
register(MethodSpec("epsilon_lrp", EpsilonLRP, label="LRP", init_args=("epsilon",),
                    reformulation=R.EPSILON_LRP))
register(MethodSpec("integrated_gradients", IntegratedGradients, variants=(
    Variant("IG", {"n_steps": 50}),), reformulation=R.INTEGRATED_GRADIENTS))
register(MethodSpec("expected_gradients", ExpectedGradients, variants=(
    Variant("EG", {"noise_std": EG_NOISE_STD, "n_samples": 50}),),  # N(x, s^2) around the input
    reformulation=R.averaged_over_draws(ExpectedGradients.draw)))
register(MethodSpec("taylor", TaylorAttribution, variants=(
    Variant("Taylor-{order}", {"order": 1}), Variant("Taylor-{order}", {"order": 2}))))

# ---- the gradient family ---------------------------------------------------------------
_SG = {"nt_samples": 50, "stdevs": SMOOTHGRAD_STD}
register(MethodSpec("saliency", Saliency, label="Saliency"))
register(MethodSpec("guided_backprop", GuidedBackprop, label="GBP"))
register(MethodSpec("grad_cam", GradCAM, variants=(  # needs a convolution
    Variant("Grad-CAM", {"relu_attributions": True, "interpolate_mode": "bilinear"}),)))
register(MethodSpec("deeplift_shap", DeepLiftShap, variants=(
    Variant("DLS", {"noise_std": EG_NOISE_STD, "n_samples": 50}),), complete=True))
register(MethodSpec("gradient_shap", GradientShap, variants=(
    Variant("GS", {"noise_std": EG_NOISE_STD, "n_samples": 50, "stdevs": 0.1}),),
    reformulation=replace(R.gradient_shap_reformulation(),
                          cost=R.drawn_rows_cost(_gradient_shap.draw))))
register(MethodSpec("smoothgrad", SmoothGrad, variants=(
    Variant("SG", {**_SG, "nt_type": "smoothgrad"}),)))
register(MethodSpec("smoothgrad_sq", SmoothGrad, variants=(Variant("SG-sq", _SG),),
                    fixed=MappingProxyType({"nt_type": "smoothgrad_sq"})))
register(MethodSpec("vargrad", SmoothGrad, variants=(Variant("VarGrad", _SG),),
                    fixed=MappingProxyType({"nt_type": "vargrad"})))
register(MethodSpec("smoothgrad_ig", SmoothIntegratedGradients, variants=(
    Variant("SG-IG", {"nt_samples": 10, "stdevs": SMOOTHGRAD_STD, "n_steps": 16}),),
    reformulation=replace(R.smoothed(R.INTEGRATED_GRADIENTS),
                          cost=R.noisy_copies_cost(R.INTEGRATED_GRADIENTS))))

# ---- Shapley-type methods and Prediction Difference --------------------------------------
register(MethodSpec("shapley", ShapleyValues, label="Shapley", reformulation=R.SHAPLEY_RULE,
                    complete=True))
register(MethodSpec("kernel_shap", KernelShap, label="KernelSHAP", complete=True))
register(MethodSpec("prediction_difference", PredictionDifference, variants=(
    Variant("PredDiff", {"noise_std": EG_NOISE_STD}),)))
# LRP rules and composites (Zennit's), one row each (alpha1_beta0 is z_plus, the epsilon rule
# is epsilon_lrp's, so neither has a row of its own)
#: Registry name of each LRP rule row -> its label.
LRP_RULES = {"lrp_z_plus": "LRP-z+", "lrp_alpha2_beta1": "LRP-a2b1", "lrp_gamma": "LRP-gamma",
             "lrp_flat": "LRP-flat", "lrp_w_square": "LRP-w2", "lrp_epsilon_plus": "LRP-eps+",
             "lrp_epsilon_plus_flat": "LRP-eps+flat",
             "lrp_epsilon_alpha2_beta1": "LRP-eps-a2b1",
             "lrp_epsilon_alpha2_beta1_flat": "LRP-eps-a2b1-flat"}
for _name, _label in LRP_RULES.items():
    register(MethodSpec(_name, rule_class(_name.removeprefix("lrp_")), label=_label,
                        init_args=("epsilon", "stabilizer", "gamma")))

# ---- Captum's remaining methods ---------------------------------------------------------
register(MethodSpec("deconvolution", Deconvolution, label="Deconv"))
register(MethodSpec("guided_grad_cam", GuidedGradCam, label="Guided Grad-CAM"))  # a convolution
register(MethodSpec("lime", Lime, label="LIME"))
register(MethodSpec("layer_conductance", LayerConductance, label="Conductance"))
