"""Tests of taylorattr.metrics, each against an independent route.

Routes: Captum's ``infidelity`` on the same perturbations, slow loop re-implementations
(Yeh et al.'s square set, Quantus's RelevanceRankAccuracy), and closed forms (linear
models, constant maps, exhaustive tie enumeration). The last part is a common test in
the scikit-learn style run over every metric in ``taylorattr.metrics.METRICS``.
"""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from _slow import slow_square_infidelity
from captum.metrics import infidelity as captum_infidelity
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from taylorattr import metrics as M
from taylorattr.methods import GradientInput
from taylorattr.metrics import (
    METRICS,
    approximation_error,
    bbox_accuracy,
    boxes_to_mask,
    gaussian_perturbation,
    infidelity,
    max_sensitivity,
    percentage_change,
    square_removal,
)


def sigmoid_mlp(seed=0, side=28, classes=10, dtype=torch.float64):
    """M-sg-like and cheap in float64 (float64 convolutions are slow on CPU)."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(side * side, 16), nn.Sigmoid(),
                        nn.Linear(16, 16), nn.Sigmoid(), nn.Linear(16, classes))
    return net.to(dtype).eval()


def small_cnn(seed=0, channels=1, classes=3):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.Softplus(), nn.Flatten(),
                        nn.LazyLinear(classes))
    return net


def _materialise(net, shape, dtype):
    net(torch.zeros(1, *shape))
    return net.to(dtype).eval()


def _cnn_case(shape, batch, seed):
    """A float64 small CNN for samples of ``shape``, inputs in [0, 1) and random attributions."""
    model = _materialise(small_cnn(), shape, torch.float64)
    g = torch.Generator().manual_seed(seed)
    return (model, torch.rand(batch, *shape, generator=g, dtype=torch.float64),
            torch.randn(batch, *shape, generator=g, dtype=torch.float64))


# ======================================================================================
# square removal set
# ======================================================================================


def yeh_square_loop(h, w, max_side):
    """The order of saliency_evaluation's get_imageset: side, then row, then column."""
    out = []
    for s in range(1, max_side + 1):
        for i in range(h - s + 1):
            for j in range(w - s + 1):
                out.append((s, i, j))
    return out


def test_square_removal_count_and_order_match_yeh():
    sq = square_removal(28, 28, 10)
    assert sq.shape == (5605, 3)
    assert [tuple(r) for r in sq.tolist()] == yeh_square_loop(28, 28, 10)
    # non-square image, sides larger than the image simply have no positions
    assert [tuple(r) for r in square_removal(5, 3, 10).tolist()] == yeh_square_loop(5, 3, 3)


# ======================================================================================
# infidelity
# ======================================================================================


def captum_square_perturb_func(h, w, max_side, baseline, batch):
    """Captum perturb_func yielding the squares in order, as indicator I and removal.

    The indicator of every square is written by a slicing loop (Yeh's get_imageset).
    Captum calls the function with each chunk of ``repeat_interleave``-d inputs
    (sample-major), so a counter tracks which squares the chunk holds.
    """
    squares = yeh_square_loop(h, w, max_side)
    bank = torch.zeros(len(squares), 1, h, w, dtype=baseline.dtype)
    for k, (s, i, j) in enumerate(squares):
        bank[k, :, i:i + s, j:j + s] = 1.0
    state = {"pos": 0}

    def perturb(inputs):
        m = inputs.shape[0] // batch
        ind = bank[state["pos"]:state["pos"] + m].repeat(batch, 1, 1, 1).expand_as(inputs)
        base = baseline.repeat_interleave(m, 0)
        state["pos"] += m
        return ind, inputs * (1 - ind) + base * ind

    return perturb, len(squares)


@pytest.mark.parametrize("normalize", [True, False])
def test_infidelity_square_matches_captum_on_28x28(normalize):
    model = sigmoid_mlp()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 1, 28, 28, generator=g, dtype=torch.float64)
    attr = torch.randn(2, 1, 28, 28, generator=g, dtype=torch.float64) * 1e-2
    target = torch.tensor([3, 7])
    ours = infidelity(model, x, attr, target=target, normalize=normalize, batch_size=3000)
    perturb, n = captum_square_perturb_func(28, 28, 10, torch.zeros_like(x), 2)
    assert n == 5605
    ref = captum_infidelity(model, perturb, x, attr, target=target, n_perturb_samples=n,
                            max_examples_per_batch=4000, normalize=normalize)
    assert ours.shape == (2,) and ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
def test_infidelity_square_matches_slow_loop_rgb_nonsquare_baseline(normalize):
    shape = (3, 5, 7)
    model = _materialise(small_cnn(channels=3), shape, torch.float64)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    attr = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    baseline = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 2])
    with torch.no_grad():
        ref = slow_square_infidelity(model, x, attr, target, baseline, 3, normalize)
        ours = infidelity(model, x, attr, target=target, baselines=baseline, max_side=3,
                          normalize=normalize, batch_size=37)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-12)


def test_infidelity_is_zero_for_exact_attribution_of_linear_model():
    """Linear f: removing square S to baseline b changes f by sum_S w (x - b)."""
    g = torch.Generator().manual_seed(3)
    lin = nn.Sequential(nn.Flatten(), nn.Linear(2 * 6 * 5, 4)).double().eval()
    x = torch.randn(3, 2, 6, 5, generator=g, dtype=torch.float64)
    target = torch.tensor([1, 0, 3])
    w = lin[1].weight[target].view(3, 2, 6, 5).detach()
    for base in (0.0, 0.7):
        gi = w * (x - base)  # Gradient*Input relative to the removal value
        for normalize in (True, False):
            s = infidelity(lin, x, gi, target=target, baselines=base, normalize=normalize)
            assert torch.all(s.abs() < 1e-20), s
        # GI with x~ = 0 is exact only for the baseline 0
        if base:
            assert (infidelity(lin, x, w * x, target=target, baselines=base) > 1e-3).all()
        # a scaled exact attribution: optimal beta absorbs the scale; beta = 1 gives
        # mean(pred - true)^2 = mean(true^2)
        assert infidelity(lin, x, 2 * gi, target=target, baselines=base).abs().max() < 1e-20
        un = infidelity(lin, x, 2 * gi, target=target, baselines=base, normalize=False)
        squares = square_removal(6, 5, 10)
        true = torch.stack([gi[:, :, t:t + s, l:l + s].sum((1, 2, 3)) for s, t, l in squares], 1)
        torch.testing.assert_close(un, true.pow(2).mean(1))
    # Gaussian noise x - I: true change w . I, so the gradient itself is exact
    for normalize in (True, False):
        s = infidelity(lin, x, w, target=target, perturbation="gaussian", n_perturb_samples=50,
                       normalize=normalize)
        assert torch.all(s.abs() < 1e-20), s


def test_infidelity_gaussian_matches_captum():
    shape = (1, 8, 8)
    model, x, attr = _cnn_case(shape, 3, seed=4)
    n, std, seed = 120, 0.3, 11
    gen = torch.Generator().manual_seed(seed)  # the documented draw: one per perturbation
    draws = [torch.randn(shape, generator=gen, dtype=torch.float64) * std for _ in range(n)]
    state = {"pos": 0}

    def perturb(inputs):
        m = inputs.shape[0] // 3
        noise = torch.stack([draws[state["pos"] + r % m] for r in range(inputs.shape[0])])
        state["pos"] += m
        return noise, inputs - noise

    for normalize in (True, False):
        state["pos"] = 0
        ref = captum_infidelity(model, perturb, x, attr, target=1, n_perturb_samples=n,
                                max_examples_per_batch=50, normalize=normalize)
        # by name, and as the public gaussian_perturbation callable
        for kw in ({"perturbation": "gaussian", "noise_std": std},
                   {"perturbation": gaussian_perturbation(std)}):
            ours = infidelity(model, x, attr, target=1, n_perturb_samples=n, seed=seed,
                              normalize=normalize, batch_size=50, **kw)
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-12)


def test_infidelity_callable_matches_slow_loop_and_is_seeded():
    shape = (1, 5, 5)
    model, x, attr = _cnn_case(shape, 2, seed=5)

    def drop_random_pixel(inputs, generator):  # one pixel per sample, indicator I
        idx = torch.randint(0, 25, (inputs.shape[0],), generator=generator)
        ind = torch.zeros(inputs.shape[0], 25, dtype=inputs.dtype)
        ind[torch.arange(inputs.shape[0]), idx] = 1.0
        ind = ind.view_as(inputs)
        return ind, inputs * (1 - ind)

    n = 40
    ours = infidelity(model, x, attr, perturbation=drop_random_pixel, n_perturb_samples=n,
                      seed=9, batch_size=7)
    with torch.no_grad():
        out = model(x)
        tgt = out.argmax(1)
        gen = torch.Generator().manual_seed(9)
        preds, trues = [], []
        for _ in range(n):
            ind, xp = drop_random_pixel(x, gen)
            preds.append((attr * ind).sum((1, 2, 3)))
            trues.append(out[[0, 1], tgt] - model(xp)[[0, 1], tgt])
        p, t = torch.stack(preds, 1), torch.stack(trues, 1)
        beta = (p * t).mean(1) / (p * p).mean(1)
        ref = ((beta[:, None] * p - t) ** 2).mean(1)
    torch.testing.assert_close(ours, ref)
    again = infidelity(model, x, attr, perturbation=drop_random_pixel, n_perturb_samples=n,
                       seed=9, batch_size=1000)
    # same draws, other model batch sizes: the convolution's summation order may change with
    # the batch (measured 1.3e-15 relative on a fresh venv), so float64 round-off, not bitwise
    torch.testing.assert_close(again, ours, rtol=1e-12, atol=0)


def test_infidelity_chunking_does_not_change_the_result_and_zero_attribution():
    shape = (2, 6, 6)
    model = _materialise(small_cnn(channels=2), shape, torch.float64)
    g = torch.Generator().manual_seed(6)
    x = torch.rand(5, *shape, generator=g, dtype=torch.float64)
    attr = torch.randn(5, *shape, generator=g, dtype=torch.float64)
    ref = infidelity(model, x, attr, max_side=3, batch_size=10_000)
    for bs in (2, 17):  # B > batch_size included
        torch.testing.assert_close(infidelity(model, x, attr, max_side=3, batch_size=bs), ref)
    # all-zero attribution: beta = 0 (Captum's safe_div), score = mean(true^2)
    with torch.no_grad():
        out = model(x)
        tgt = out.argmax(1)
        true = []
        for s, t, l in square_removal(6, 6, 3).tolist():
            xr = x.clone()
            xr[:, :, t:t + s, l:l + s] = 0
            true.append(out[range(5), tgt] - model(xr)[range(5), tgt])
    zero = infidelity(model, x, torch.zeros_like(x), max_side=3)
    torch.testing.assert_close(zero, torch.stack(true, 1).pow(2).mean(1))


def test_infidelity_errors_name_the_argument():
    shape = (1, 5, 5)
    model = _materialise(small_cnn(), shape, torch.float64)
    x = torch.rand(2, *shape, dtype=torch.float64)
    a = torch.rand_like(x)
    cases = [
        ({"attributions": a[:1]}, ValueError, "attributions"),
        ({"attributions": a.view(2, 25)}, ValueError, "attributions"),
        ({"attributions": a.cpu().numpy()}, TypeError, "attributions"),
        ({"inputs": x.view(2, 25), "attributions": a.view(2, 25)}, ValueError, "square"),
        ({"n_perturb_samples": 10}, ValueError, "n_perturb_samples"),
        ({"noise_std": 0.1}, ValueError, "noise_std"),
        ({"perturbation": "gaussian", "baselines": 0.5}, ValueError, "baselines"),
        ({"perturbation": "blur"}, ValueError, "perturbation"),
        ({"perturbation": 3}, TypeError, "perturbation"),
        ({"perturbation": "gaussian", "n_perturb_samples": 0}, ValueError, "n_perturb_samples"),
        ({"perturbation": "gaussian", "noise_std": -1.0}, ValueError, "noise_std"),
        ({"max_side": 0}, ValueError, "max_side"),
        ({"batch_size": 2.5}, TypeError, "batch_size"),
        ({"target": 5}, ValueError, "target"),
        ({"baselines": torch.zeros(3, 5, 5)}, ValueError, "baselines"),
        ({"perturbation": lambda i, g: i}, TypeError, "perturbation"),
        ({"perturbation": lambda i, g: (i[:, :, :2], i)}, ValueError, "perturbation"),
        ({"perturbation": lambda i, g: (i, i[:1])}, ValueError, "perturbation"),
    ]
    for kw, exc, word in cases:
        args = {"model": model, "inputs": x, "attributions": a}
        args.update(kw)
        with pytest.raises(exc, match=word):
            infidelity(**args)


# ======================================================================================
# percentage change and approximation error
# ======================================================================================


def test_percentage_change_closed_form_and_zero_original():
    o = torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]], [[0.0, 0.0]]], dtype=torch.float64)
    r = torch.tensor([[[3.0, 3.0]], [[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=r"samples \[2\]"):
        d = percentage_change(o, r)
    assert d.shape == (3,)
    torch.testing.assert_close(d[:2], torch.tensor([100 / 25, 0.0], dtype=torch.float64))
    assert torch.isnan(d[2])
    # the table's d is the mean over the defined samples
    torch.testing.assert_close(torch.nanmean(d), torch.tensor(2.0, dtype=torch.float64))
    # slow route on random data, all dims flattened
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(4, 2, 3, 3, generator=g), torch.randn(4, 2, 3, 3, generator=g)
    slow = [100 * float(((a[i] - b[i]) ** 2).sum() / (a[i] ** 2).sum()) for i in range(4)]
    torch.testing.assert_close(percentage_change(a, b), torch.tensor(slow))
    with pytest.raises(ValueError, match="same shape"):
        percentage_change(a, b[:, :1])


def test_approximation_error_closed_form():
    e = torch.tensor([0.5, -0.2, 0.0, 1.0])
    df = torch.tensor([-2.0, 0.4, 3.0, 0.0])
    with pytest.warns(RuntimeWarning, match=r"samples \[3\]"):
        r = approximation_error(e, df)
    torch.testing.assert_close(r[:3], torch.tensor([0.25, 0.5, 0.0]))
    assert torch.isnan(r[3])
    with pytest.raises(ValueError, match="shape"):
        approximation_error(e, df[:3])
    with pytest.raises(ValueError, match="error"):
        approximation_error(e.view(2, 2), df.view(2, 2))
    with pytest.raises(TypeError, match="output_change"):
        approximation_error(e, [1.0, 2.0, 3.0, 4.0])


# ======================================================================================
# bounding-box accuracy
# ======================================================================================


def quantus_relevance_rank_accuracy(a, s, absolute=False):
    """Slow re-implementation of Quantus's RelevanceRankAccuracy.evaluate_instance."""
    out = []
    for ai, si in zip(a.cpu().numpy(), s.cpu().numpy()):
        if ai.ndim == 3:
            ai = ai.sum(0)
        if absolute:
            ai = np.abs(ai)
        ai = ai.flatten()
        sidx = np.where(si.flatten().astype(bool))[0]
        k = len(sidx)
        top = np.argsort(ai)[-int(k):]
        out.append(len(np.intersect1d(sidx, top)) / float(k))
    return torch.tensor(out)


def random_masks(b, h, w, g):
    m = torch.rand(b, h, w, generator=g) < 0.3
    m[:, 0, 0] = True  # never empty
    return m


@pytest.mark.parametrize("absolute", [False, True])
def test_bbox_accuracy_matches_quantus_on_tie_free_maps(absolute):
    g = torch.Generator().manual_seed(8)
    a = torch.randn(6, 3, 9, 11, generator=g, dtype=torch.float64)
    m = random_masks(6, 9, 11, g)
    ref = quantus_relevance_rank_accuracy(a, m, absolute).double()
    for ties in ("expected", "index"):
        got = bbox_accuracy(a, m, absolute=absolute, ties=ties)
        torch.testing.assert_close(got, ref)
    # [B, H, W] attributions and [B, 1, H, W] 0/1 float masks give the same
    torch.testing.assert_close(
        bbox_accuracy(a.sum(1), m[:, None].double(), absolute=absolute), ref)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-2, 2), min_size=12, max_size=12),
       st.lists(st.booleans(), min_size=12, max_size=12))
def test_bbox_accuracy_ties(values, mask):
    """Integer-valued maps with many ties: 'index' against a stable slow sort, 'expected'
    against exhaustive enumeration of every order of the tied pixels."""
    mask[0] = True
    a = torch.tensor(values, dtype=torch.float64).view(1, 3, 4)
    m = torch.tensor(mask).view(1, 3, 4)
    n = sum(mask)
    order = sorted(range(12), key=lambda i: (-values[i], i))
    ref_index = sum(mask[i] for i in order[:n]) / n
    assert bbox_accuracy(a, m, ties="index").item() == pytest.approx(ref_index, abs=1e-12)
    cut = sorted(values, reverse=True)[n - 1]
    above = [i for i in range(12) if values[i] > cut]
    tied = [i for i in range(12) if values[i] == cut]
    picks = list(itertools.combinations(tied, n - len(above)))
    expected = np.mean([(sum(mask[i] for i in above) + sum(mask[i] for i in p)) / n
                        for p in picks])
    assert bbox_accuracy(a, m).item() == pytest.approx(expected, abs=1e-12)


def test_bbox_accuracy_constant_map_and_errors():
    m = torch.zeros(2, 8, 8, dtype=torch.bool)
    m[0, 0, :6] = True     # top-left box: 'index' rewards it
    m[1, 5:, 4:] = True   # bottom-right box: 'index' punishes it
    zero = torch.zeros(2, 1, 8, 8)
    torch.testing.assert_close(bbox_accuracy(zero, m), torch.tensor([6 / 64, 12 / 64]))
    torch.testing.assert_close(bbox_accuracy(zero, m, ties="index"), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"empty for samples \[1\]"):
        bbox_accuracy(zero, torch.stack([m[0], torch.zeros_like(m[0])]))
    with pytest.raises(ValueError, match="masks"):
        bbox_accuracy(zero, m.float() * 2)
    with pytest.raises(ValueError, match="masks"):
        bbox_accuracy(zero, m[:, :4])
    with pytest.raises(ValueError, match="ties"):
        bbox_accuracy(zero, m, ties="random")
    with pytest.raises(TypeError, match="attributions"):
        bbox_accuracy(zero.long(), m)


def test_boxes_to_mask():
    mask = boxes_to_mask([(1, 0, 3, 2), (2, 1, 4, 4)], height=5, width=6)
    slow = torch.zeros(5, 6, dtype=torch.bool, device="cpu")  # boxes given as numbers: the CPU
    for x0, y0, x1, y1 in [(1, 0, 3, 2), (2, 1, 4, 4)]:
        for r in range(5):
            for c in range(6):
                slow[r, c] |= (x0 <= c < x1) and (y0 <= r < y1)
    assert torch.equal(mask, slow)
    # float coordinates: pixel centres decide; parts outside the image are clipped (a
    # tensor's mask is on the tensor's device)
    assert torch.equal(boxes_to_mask(torch.tensor([[0.6, -3.0, 2.4, 1.6]]), 3, 3),
                       torch.tensor([[0, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bool))
    assert not boxes_to_mask([], 4, 4).any()
    with pytest.raises(ValueError, match="x_max"):
        boxes_to_mask([(3, 0, 1, 2)], 4, 4)


# ======================================================================================
# common test over every registered metric
# ======================================================================================

_MODEL_SHAPE = (1, 6, 6)
_MODEL64 = _materialise(small_cnn(seed=1), _MODEL_SHAPE, torch.float64)
_MODEL32 = _materialise(small_cnn(seed=1), _MODEL_SHAPE, torch.float64).float()


def _model(dtype):
    return _MODEL64 if dtype == torch.float64 else _MODEL32


def _rand(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _masks():
    return random_masks(5, 6, 6, torch.Generator().manual_seed(12))


def _tanh_net(dtype):
    torch.manual_seed(9)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)).to(dtype).eval()


_TANH = {torch.float64: _tanh_net(torch.float64), torch.float32: _tanh_net(torch.float32)}


def _gradient_input(x, target):
    """Gradient*Input of a tanh MLP on [B, 2, 3] (a real explanation with a per-sample
    target; it refuses other feature shapes and targets of another length)."""
    return GradientInput(_TANH[x.dtype]).attribute(x, target=target)


# each case: (batched float64 arguments, call(*args) -> [B]); float arguments are cast
# to the dtype under test, integer/bool ones are kept
CASES = {
    "percentage_change": [
        ((_rand((5, 2, 3), 0) + 3, _rand((5, 2, 3), 1)), lambda o, r: percentage_change(o, r)),
    ],
    "approximation_error": [
        ((_rand((5,), 2), _rand((5,), 3)), lambda e, df: approximation_error(e, df)),
    ],
    "infidelity": [
        ((_rand((5, *_MODEL_SHAPE), 4), _rand((5, *_MODEL_SHAPE), 5), torch.tensor([0, 1, 2, 1, 0])),
         lambda x, a, t: infidelity(_model(x.dtype), x, a, target=t, max_side=3, batch_size=64)),
        ((_rand((5, *_MODEL_SHAPE), 4), _rand((5, *_MODEL_SHAPE), 5), torch.tensor([2, 1, 2, 1, 0])),
         lambda x, a, t: infidelity(_model(x.dtype), x, a, target=t, perturbation="gaussian",
                                    n_perturb_samples=30, noise_std=0.5, normalize=False)),
    ],
    "max_sensitivity": [
        ((_rand((5, 2, 3), 8), torch.tensor([0, 1, 2, 1, 0])),
         lambda x, t: max_sensitivity(_gradient_input, x, target=t, radius=0.3,
                                      n_perturb_samples=7, batch_size=10)),
    ],
    "bbox_accuracy": [
        ((_rand((5, 2, 6, 6), 6), _masks()), lambda a, m: bbox_accuracy(a, m)),
        ((_rand((5, 6, 6), 7), _masks()), lambda a, m: bbox_accuracy(a, m, absolute=True)),
    ],
}


def test_every_registered_metric_has_a_common_case():
    assert set(CASES) == set(METRICS)
    assert set(METRICS) <= set(M.__all__)
    for name in M.__all__:
        assert hasattr(M, name)


def _cast(args, dtype):
    return tuple(a.to(dtype) if a.is_floating_point() else a for a in args)


COMMON = [pytest.param(name, i, id=f"{name}-{i}") for name in CASES
          for i in range(len(CASES[name]))]


@pytest.mark.parametrize("name,i", COMMON)
def test_common_invariances(name, i):
    args, call = CASES[name][i]
    full = call(*args)
    b = args[0].shape[0]
    assert full.shape == (b,) and full.dtype == torch.float64 and torch.isfinite(full).all()
    # batch-order equivariance
    perm = torch.tensor([3, 0, 4, 2, 1])
    torch.testing.assert_close(call(*(a[perm] for a in args)), full[perm])
    # per-sample independence
    for k in (0, 3):
        torch.testing.assert_close(call(*(a[k:k + 1] for a in args)), full[k:k + 1])
    # float32 agrees with float64 and returns float32
    f32 = call(*_cast(args, torch.float32))
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32.double(), full, rtol=1e-3, atol=1e-6)
    # mismatched batch or feature shapes of any argument raise ValueError
    for j, a in enumerate(args):
        short = tuple(x[:-1] if jj == j else x for jj, x in enumerate(args))
        with pytest.raises(ValueError):
            call(*short)
        if a.dim() >= 2:
            cut = tuple(x[..., :-1] if jj == j else x for jj, x in enumerate(args))
            with pytest.raises(ValueError):
                call(*cut)


def test_metrics_do_not_warn_on_ordinary_inputs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for cases in CASES.values():
            for args, call in cases:
                call(*args)


# ======================================================================================
# max-sensitivity
# ======================================================================================
def test_max_sensitivity_of_a_linear_explanation_is_the_largest_relative_change_by_hand():
    """Phi(x) = x W^T: Phi(x + u_k) - Phi(x) = u_k W^T, so the score is
    max_k ||u_k W^T|| / ||x W^T|| for the given perturbations (float64 by hand); the
    infinity norm likewise."""
    w = _rand((4, 3), 20)
    x = _rand((2, 3), 21)
    u = _rand((5, 3), 22) * 0.1

    def explain(z):
        return z @ w.T

    def perturb(rows, generator, k):
        return rows + u[k]

    for norm, order in (("fro", 2), (float("inf"), float("inf"))):
        got = max_sensitivity(explain, x, n_perturb_samples=5, perturbation=perturb, norm=norm,
                              batch_size=4)
        change = torch.linalg.vector_norm(u @ w.T, ord=order, dim=1)
        hand = change.max() / torch.linalg.vector_norm(explain(x), ord=order, dim=1)
        torch.testing.assert_close(got, hand, rtol=1e-12, atol=0)


def test_max_sensitivity_default_draws_stay_in_the_radius_and_do_not_depend_on_batching():
    """The identity explanation moves by exactly the draw: with the infinity norm the score
    is the largest draw's infinity norm over ||x||_inf, the draws being U(-r, r) from the
    seed's generator (rebuilt here), within r / ||x||_inf; the scores do not change with
    batch_size."""
    x = _rand((3, 4), 23) + 2.0
    full = max_sensitivity(lambda z: z, x, radius=0.05, n_perturb_samples=6, norm=float("inf"))
    split = max_sensitivity(lambda z: z, x, radius=0.05, n_perturb_samples=6,
                            norm=float("inf"), batch_size=3)
    # bitwise: the identity explanation and the infinity norm sum nothing, so no summation
    # order can change with the batch size
    torch.testing.assert_close(full, split, rtol=0, atol=0)
    draws = torch.rand((6, 4), generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64) * 0.1 - 0.05
    torch.testing.assert_close(full, draws.abs().amax() / x.abs().amax(1), rtol=1e-12, atol=0)
    assert (full <= 0.05 / x.abs().amax(1)).all()
    with pytest.raises(TypeError, match="norm must be 'fro' or a number"):
        max_sensitivity(lambda z: z, x, norm="nuclear")
    with pytest.raises(TypeError, match="perturbation must be callable"):
        max_sensitivity(lambda z: z, x, perturbation=0.1)
