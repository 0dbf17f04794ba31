"""The networks of the paper's experiments, their training and caching, and adapters for
pretrained ImageNet models.

One module per concept; every name is re-exported here:

* :mod:`~taylorattr.models.layers`: ``PolyActivation`` ``y = sum_k c_k x^k``, ``Square``,
  ``ResidualBlock`` ``y = act(x + body(x))``, ``fold_batchnorm``;
* :mod:`~taylorattr.models.zoo`: the architectures ``poly``, ``m_sg``, ``c_sg``, ``c_sp``,
  ``loc_c_sg``, ``loc_c_sp``, ``loc_vgg``, ``loc_resnet`` and the ``MODELS`` table;
* :mod:`~taylorattr.models.training`: ``train``, ``evaluate``, ``TrainConfig``/``TRAINING``,
  the cache ``get_trained`` and the localisation models' ``held_out_canvases``;
* :mod:`~taylorattr.models.pretrained`: ``ImageClassifier``, ``torchvision_model``,
  ``efficientnet_lite0``.
"""
from __future__ import annotations

from .layers import PolyActivation, ResidualBlock, Square, fold_batchnorm, model_device
from .pretrained import EFFICIENTNET_LITE_MEAN as EFFICIENTNET_LITE_MEAN
from .pretrained import EFFICIENTNET_LITE_STD as EFFICIENTNET_LITE_STD
from .pretrained import ImageClassifier, efficientnet_lite0, torchvision_model
from .training import N_CLUTTERED_HELD as N_CLUTTERED_HELD
from .training import N_CLUTTERED_TRAIN as N_CLUTTERED_TRAIN
from .training import N_CLUTTERED_TRAIN_QUICK as N_CLUTTERED_TRAIN_QUICK
from .training import (
    TRAINING,
    TrainConfig,
    evaluate,
    get_trained,
    held_out_canvases,
    train,
)
from .training import _build as _build
from .zoo import MODELS, c_sg, c_sp, loc_c_sg, loc_c_sp, loc_resnet, loc_vgg, m_sg, poly

__all__ = [
    "MODELS",
    "TRAINING",
    "ImageClassifier",
    "PolyActivation",
    "ResidualBlock",
    "Square",
    "TrainConfig",
    "c_sg",
    "c_sp",
    "efficientnet_lite0",
    "evaluate",
    "fold_batchnorm",
    "get_trained",
    "held_out_canvases",
    "loc_c_sg",
    "loc_c_sp",
    "loc_resnet",
    "loc_vgg",
    "m_sg",
    "model_device",
    "poly",
    "torchvision_model",
    "train",
]
# The "X as X" imports above stay importable from here, outside __all__ as before.
# Monkeypatch a name in the module that looks it up
# (e.g. taylorattr.models.training.load_mnist), not here.
