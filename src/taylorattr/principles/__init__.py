"""The three principles of a good attribution (paper Table 2), measured.

Modules: :mod:`.probes` (the probe networks), :mod:`.measures` (the scores),
:mod:`.auditing` (methods made uniform, the audit and the measured Table 2).

The paper states three principles and asserts which of its seven methods follow them:

1. **low approximation error** (completeness): the attributions sum to the output change
   ``df = f(x) - f(x~)``;
2. **correct assignment**: the first-order and independent terms of feature ``i`` go to
   ``a_i`` only, and the interactive terms of a feature set ``A`` only to features in ``A``
   (any split inside ``A`` is allowed);
3. **an unbiased baseline**: the baseline does not decide which features get attribution.

:func:`audit` measures them for any attribution method on *probes*: small networks
whose answer is known in closed form, plus, for principle 1, any models you pass.
Nothing is hard-coded: a verdict comes only from the numbers in ``report.details``.

Probes (all built in float64 from ``seed``; inputs ``x`` with ``|x_i|`` in [0.5, 1.5])
-------------------------------------------------------------------------------------

=================  ==========================================================  ==========
probe              function (realised as a network)                            principles
=================  ==========================================================  ==========
``independent``    ``sum_i a_i x_i + b_i x_i^2 + e_i x_i^3`` (independent terms)  1, 2
``pairwise``       ``c x_0 x_1 + c' x_3 x_4``; features 2, 5 unused (order 2)   1, 2
``triple``         ``d x_1 x_2 x_3``; features 0, 4, 5 unused (order 3)         1, 2
``deep``           ``x_0^3`` computed as ``F(z) = z_1^3 + 3 z_1 (z_3 - z_2^2)`` of   1, 2
                   hidden features ``z = (x_0, x_1, x_1^2)``: two nonlinear
                   layers whose units mix ``x_0`` with ``x_1`` (which cancels)
``sigmoid_mlp``    random ``6-16-16-1`` sigmoid MLP                            1
``sigmoid_cnn``    random ``Conv(1,4,3), sigmoid, AvgPool2, Linear`` on 1x8x8     1
``polarity``       ``sigmoid(w . x)`` with ``w = 1`` on a disc, ``0.1`` outside,    3
                   the disc dark on light and light on dark (1x16x16)
``equal_weights``  ``sigmoid(4 mean(x) - 2)``: every pixel weighs the same, on   3
                   random textures in [0, 1] (2 x 1x32x32)
=================  ==========================================================  ==========

The first four have 6 input features; their hidden units (activations ``y + y^2`` and
``y + y^2 + y^3``) see *all* features, with random weights and biases, and the
read-out layers are solved for so that the network computes the stated polynomial
exactly (checked to 1e-8): the *function* has the stated monomials while the units mix
features the way trained networks do.

Scores (each probe scores in [0, 1], 1 = the principle holds exactly)
----------------------------------------------------------------------
Every method uses its own baseline: the audit passes ``baselines = 0`` (the black image),
which Gradient*Input and epsilon-LRP use implicitly; Expected Gradients draws its own,
``x~ ~ N(x, EG_NOISE_STD^2)`` (``AUDIT_DRAWS`` draws). Targets are averaged over the
baselines a method used (one for a deterministic method); masses and ``|df|`` average
their absolute values per baseline, so terms that cancel in expectation over random
baselines (interactions under isotropic noise) still count.

* Principle 1, per probe: ``gap = sum_b |sum_i a_bi - df_b| / sum_b E_k |df_bk|`` over the
  probe's samples ``b`` (and baselines ``k``); score ``1 - min(1, gap)``.
* Principle 2, per probe. The function of each probe is additively separable over known
  blocks (singletons and interaction sets), so the correct attributions form the set
  ``C = {a : a_i = t_i for singletons i, sum_{i in A} a_i = t_A for sets A}`` with
  ``t_i = f(x) - f(x with x_i := x~_i) = T^a_i + T^gd_i`` (Thm 2: first plus independent
  terms, all orders) and ``t_A = f(x) - f(x with x_A := x~_A)``. The misassigned mass is
  the L1 distance from ``a`` to ``C``; it is divided by the mass of the terms the
  principle is about, ``sum_i |T^gd_i| + sum_A |T^gt_A|`` (``T^gd_i = t_i - d_i f(x)
  delta_i``, ``T^gt_A = t_A - sum_{i in A} t_i``); score ``1 - min(1, ratio)``. Details
  also give (a) the share of the independent terms that reaches its own feature and
  (b) the share of the interactive terms that reaches its set and the share landing
  outside it.
* Principle 3: ``polarity`` scores ``1 - |s_dark - s_light|`` with ``s`` the share of
  ``sum |a_i|`` on the object; ``equal_weights`` scores ``1 - max(0, r)`` with ``r`` the
  largest Pearson correlation, over references ``c`` in {0, 0.1, ..., 1}, between
  ``|a_i|`` and ``|x_i - c|`` (attribution driven by the distance to *some* constant
  baseline; ``c = 0`` is ``|delta_i|`` for the black baseline, reported as
  ``corr_black``).

A probe is **passed** when its score is at least :data:`PASS_SCORE`. The verdict of a
principle is ``"follows"`` when every probe of that principle is passed, ``"partially"``
when some are, and ``"does not"`` when none is. ``report.scores[p]`` is the mean probe
score.
"""
from __future__ import annotations

from ..registry.catalog import EG_NOISE_STD
from .auditing import (
    AUDIT_DRAWS,
    PAPER_VERDICTS,
    PASS_SCORE,
    VERDICTS,
    AuditReport,
    audit,
    captum_adapter,
    format_table,
    principles_table,
)
from .probes import Probe, probe_suite

__all__ = [
    "AUDIT_DRAWS",
    "EG_NOISE_STD",
    "PAPER_VERDICTS",
    "PASS_SCORE",
    "VERDICTS",
    "AuditReport",
    "Probe",
    "audit",
    "captum_adapter",
    "format_table",
    "principles_table",
    "probe_suite",
]
