"""taylorattr.metrics.statistics against scipy.stats (installed with scikit-image) and enumeration."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats as ss

from taylorattr.metrics.statistics import (
    bootstrap_ci,
    compare_paired,
    sign_flip_test,
    wilcoxon_signed_rank,
)


@pytest.mark.parametrize("n,shift", [(1, 0.0), (6, 0.2), (13, 0.8), (40, 0.4)])
def test_wilcoxon_exact_matches_scipy(n, shift):
    rng = np.random.default_rng(n)
    a = rng.normal(size=n)
    b = a - rng.normal(shift, 1.0, size=n)
    ours, ref = wilcoxon_signed_rank(a, b), ss.wilcoxon(a, b, method="exact")
    assert ours.method == "exact" and ours.n == n
    assert ours.statistic == ref.statistic
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-12)


def test_wilcoxon_with_ties_and_zeros_matches_scipy_normal_approximation():
    rng = np.random.default_rng(3)
    a, b = np.round(rng.normal(size=90), 1), np.round(rng.normal(0.2, 1, size=90), 1)
    assert (a == b).any() and len(np.unique(np.abs(a - b))) < 90  # zeros and ties present
    ours = wilcoxon_signed_rank(a, b)
    ref = ss.wilcoxon(a, b, method="approx", correction=False, zero_method="wilcox")
    assert ours.method == "normal" and ours.n == int((a != b).sum())
    assert ours.statistic == ref.statistic
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-10)


def test_sign_flip_exact_matches_enumeration_and_scipy():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=9), rng.normal(0.6, 1.0, size=9)
    d = a - b
    slow = np.mean([abs(np.mean(np.array(s) * d)) >= abs(d.mean()) - 1e-12
                    for s in itertools.product((-1, 1), repeat=9)])
    ref = ss.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis),
                              permutation_type="samples", n_resamples=np.inf).pvalue
    ours = sign_flip_test(a, b)
    assert ours.method == "exact" and ours.direction == -1
    assert ours.p_value == pytest.approx(slow, abs=1e-15) == pytest.approx(ref, abs=1e-12)


def test_sign_flip_monte_carlo_is_close_to_the_normal_limit():
    rng = np.random.default_rng(5)
    d = rng.normal(0.25, 1.0, size=200)
    ours = sign_flip_test(d, np.zeros_like(d), n_resamples=20_000)
    # the sign-flip null of the mean is ~ N(0, sum d^2 / n^2)
    z = abs(d.mean()) / (np.sqrt((d ** 2).sum()) / d.size)
    assert ours.method.startswith("Monte Carlo")
    assert ours.p_value == pytest.approx(2 * ss.norm.sf(z), abs=0.01)


def test_bootstrap_ci_matches_scipy_percentile_bootstrap():
    v = np.random.default_rng(6).exponential(size=60)
    low, high = bootstrap_ci(v, n_resamples=20_000)
    ref = ss.bootstrap((v,), np.mean, method="percentile", n_resamples=20_000,
                       rng=np.random.default_rng(0)).confidence_interval
    assert low < v.mean() < high
    assert (low, high) == pytest.approx((ref.low, ref.high), abs=0.03)


def test_compare_paired_wording_follows_the_test():
    rng = np.random.default_rng(7)
    first = rng.normal(1.0, 0.1, size=30)
    lower = first - 0.2 + rng.normal(0, 0.02, size=30)
    p = ss.wilcoxon(lower, first, method="exact").pvalue
    assert compare_paired(lower, first) == f"lower (p = {p:.2g}, n = 30)"
    assert compare_paired(first, lower).startswith("higher (p = ")
    # the case: 0.80 vs 0.82 means with a large spread is not a finding
    noisy_a, noisy_b = rng.normal(0.80, 0.5 * np.sqrt(24), 24), rng.normal(0.82, 0.5 * np.sqrt(24), 24)
    p = ss.wilcoxon(noisy_a, noisy_b, method="exact").pvalue
    assert p >= 0.05
    assert compare_paired(noisy_a, noisy_b) == f"no significant difference (p = {p:.2g}, n = 24)"


@pytest.mark.parametrize("call,match", [
    (lambda: wilcoxon_signed_rank([1, 2], [1]), "same number"),
    (lambda: sign_flip_test([], []), "at least one"),
    (lambda: wilcoxon_signed_rank([1, float("nan")], [0, 0]), "finite"),
    (lambda: bootstrap_ci([1.0, 2.0], level=1.5), "level"),
    (lambda: compare_paired([1.0], [2.0], test="t"), "test must be"),
])
def test_bad_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
