"""The layer-wise propagation engine behind DeepLIFT (Rescale), epsilon-LRP and the LRP
composites.

Both methods are *modified gradients* (Ancona et al. 2018): the network runs forward,
then backpropagates with every nonlinear operation's local derivative replaced by its
rule's multiplier and every linear map left exact; the attribution is
``(x - x~) * g`` (DeepLIFT) or ``x * g`` (epsilon-LRP) with ``g`` the modified gradient
at the input. The package is split by concept:

* :mod:`.graph`: the model captured as core ATen operations (the shared
  :mod:`taylorattr.capture`, activations and declared elementwise modules kept whole);
* :mod:`.ops`: the kind of each operation (linear, weighted, activation, product, ...),
  decided from the graph, so that coverage follows from it;
* :mod:`.rules`: one rule per kind and method (Rescale, the two-player Shapley split,
  the composed softmax/LayerNorm rules, epsilon, uniform, ...), the two rule sets;
* :mod:`.relevance`: Zennit's rules and composites in relevance form;
* :mod:`.table`: :func:`supported_operations`, the support table generated from them;
* :mod:`.plan`: classifying a captured graph, batch-norm folding and epsilon placement,
  :class:`UnsupportedModelError`;
* :mod:`.engine`: the modified-gradient pass (:func:`propagate`);
* :mod:`.records`: per-layer records and the per-edge terms of the paper (Thm 4).

On ReLU CNNs with BatchNorm (eval), max and adaptive average pooling, concatenation and
residual additions both equal Captum's ``DeepLift`` and ``LRP`` (``EpsilonRule``), except
where Captum's LRP double counts at a residual sum (it passes the whole relevance of
``a + b`` to both ``a`` and ``b``); here a sum splits relevance in proportion,
``R_a = a / (a + b + eps s(a + b)) R_{a+b}``.
"""
from .engine import LayerwiseMethod, Propagation, propagate
from .plan import Plan, UnsupportedModelError, build_plan, get_plan
from .records import (
    LayerRecord,
    denominator,
    edge_terms,
    fold_batchnorm,
    global_relevance,
    local_relevance,
)
from .rules import DEEPLIFT_RESCALE, FAMILIES, RESCALE_THRESHOLD, RuleSet, epsilon_rule
from .table import SupportRow, supported_operations

__all__ = [
    "DEEPLIFT_RESCALE",
    "FAMILIES",
    "RESCALE_THRESHOLD",
    "LayerRecord",
    "LayerwiseMethod",
    "Plan",
    "Propagation",
    "RuleSet",
    "SupportRow",
    "UnsupportedModelError",
    "build_plan",
    "denominator",
    "edge_terms",
    "epsilon_rule",
    "fold_batchnorm",
    "get_plan",
    "global_relevance",
    "local_relevance",
    "propagate",
    "supported_operations",
]
