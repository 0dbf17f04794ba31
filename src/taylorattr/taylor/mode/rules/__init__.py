"""The built-in Taylor-mode rules, one module per family; each registers its rules in
:mod:`..registry` where they are defined (importing this package registers them all).

* :mod:`.shape`: views, indexing, copies, padding, cat/where (linear, ``y_k = L(x_k)``);
* :mod:`.affine`: arithmetic, convolutions, products, pooling, sums (affine or bilinear);
* :mod:`.pointwise`: smooth elementwise functions (series recurrences) and
  piecewise-linear ones (``y_k = x_k phi'(x_0)``, exact off the kinks);
* :mod:`.normalisation`: batch, layer and group norm, variance, vector norm;
* :mod:`.attention`: softmax and log-softmax kept whole;
* :mod:`.surrogates`: the smooth surrogates ``ta.smooth`` puts into a captured graph.
"""
from . import affine, attention, normalisation, pointwise, shape, surrogates

__all__ = ["affine", "attention", "normalisation", "pointwise", "shape", "surrogates"]
