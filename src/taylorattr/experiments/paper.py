"""The paper's own numbers and names that are not about one method.

Per-method facts (the verdicts of Table 2, the rows of Table 3) live in the method's row
of :mod:`taylorattr.registry`; this module holds the rest: the title, the model labels,
the approximation errors and correlations the paper reports, and the infidelity of
first- vs second-order Taylor attribution (Deng et al., AAAI 2021).
"""
from __future__ import annotations

__all__ = ["APPROX_ERROR", "CORRELATION_SIGN", "FIGURE3_METHODS", "IG_ERROR_CORRELATION", "MODEL_LABELS", "TAYLOR_ORDER",
           "TITLE", "model_label"]

TITLE = "A Unified Taylor Framework for Revisiting Attribution Methods"
#: Registry model name -> the label used in tables (the paper's names where it has them).
MODEL_LABELS = {
    "poly": "Poly", "m_sg": "M-sg", "c_sg": "C-sg", "c_sp": "C-sp",
    "loc_c_sg": "C-sg (loc)", "loc_c_sp": "C-sp (loc)", "loc_vgg": "VGG-style (loc)",
    "loc_resnet": "ResNet-style (loc)", "vgg16": "VGG16", "vgg19": "VGG19",
    "resnet18": "ResNet18",
}
#: Mean |eps| / |df| of the second-order expansion (section "Validation").
APPROX_ERROR = {"Poly": 0.0, "M-sg": 0.084, "C-sg": 0.420}
#: Pearson correlation of IG's percentage change with that error on C-sg.
IG_ERROR_CORRELATION = 0.72
#: Infidelity of the order-K Taylor attribution: model -> {K: value}.
TAYLOR_ORDER = {"C-sg": {1: 0.48, 2: 0.27}, "C-sp": {1: 0.84, 2: 0.75}}
#: The methods of the paper's Figures 3 and 4, by their table labels.
FIGURE3_METHODS = ("GI", "Occ-1", "Occ-2x2", "DL", "IG", "EG")
#: The sign of the correlation with the principle count the paper reports (Figures 3, 4).
CORRELATION_SIGN = {"infidelity": "negative", "bbox": "positive"}


def model_label(name: str) -> str:
    """The table label of a registry model name (the name itself when it has none)."""
    return MODEL_LABELS.get(name, name)
