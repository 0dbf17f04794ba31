"""Training recipes (presets), pre-activation diagnostics, the study over seeds, the
bootstrap correlation interval and Expected Gradients' baseline variants (issue 19).

Oracles: manual forward passes through slices of the networks (movement), a plain
autograd step of ``CE + lambda/2 ||w||^2`` (weight decay), the second-order expansion by
double backward (eps_bar), scipy's correlations on the same resamples (bootstrap), and a
per-draw autograd loop (Expected Gradients around 0).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import device_tolerance
from scipy import stats

from taylorattr import cli
from taylorattr.baselines import Noise
from taylorattr.experiments.diagnostics import nonlinear_layers, preactivation_movement
from taylorattr.experiments.validation import format_study, run_validation_study
from taylorattr.experiments.workspace import TrainingDigits, Workspace
from taylorattr.methods.expected_gradients import draw
from taylorattr.metrics.statistics import bootstrap_correlation_ci
from taylorattr.models import c_sg, m_sg
from taylorattr.models.training import PRESETS, TrainSettings, get_trained, train
from taylorattr.paper_methods import variants
from taylorattr.registry import METHODS


def _digits(n, seed=0):
    """Random images and labels: drawn on the CPU, on the default device (the same numbers
    on every device)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((n, 1, 28, 28), generator=g, device="cpu")
    y = torch.randint(0, 10, (n,), generator=g, device="cpu")
    return x.to(torch.get_default_device()), y.to(torch.get_default_device())


def _manual_movement(model, x, cut_points):
    """RMS of (input of module idx at x) - (at 0) by running model[:idx] directly."""
    out = []
    for idx in cut_points:  # (no grad: the slices are plain forward passes)
        with torch.no_grad():
            a, b = model[:idx](x).flatten(1), model[:idx](torch.zeros_like(x)).flatten(1)
        out.append(float((a - b).pow(2).mean().sqrt()))
    return out


def test_movement_matches_manual_forward_slices():
    torch.manual_seed(0)
    x = torch.rand(5, 1, 28, 28, dtype=torch.float64)
    for model, cuts in ((m_sg().double(), [2, 4]), (c_sg().double(), [1, 4])):
        names = [n for n, _ in nonlinear_layers(model)]
        assert names == [str(c) for c in cuts]
        got = preactivation_movement(model, x, 0.0)
        assert list(got.values()) == pytest.approx(_manual_movement(model, x, cuts),
                                                   rel=device_tolerance(1e-12)["rtol"])
        per = preactivation_movement(model, x, 0.0, per_sample=True)
        pooled = [float(v.pow(2).mean().sqrt()) for v in per.values()]
        assert pooled == pytest.approx(list(got.values()), rel=device_tolerance(1e-12)["rtol"])
    with pytest.raises(ValueError, match="no nonlinear layer"):
        preactivation_movement(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 2)), x)


def test_weight_decay_is_the_l2_term_of_the_loss():
    """One SGD step (momentum has no effect on the first) equals w - lr (grad CE + lambda w)."""
    x, y = _digits(16)
    torch.manual_seed(1)
    model = m_sg(hidden=8)
    ref = m_sg(hidden=8)
    ref.load_state_dict(model.state_dict())
    lr, wd = 0.1, 0.05
    train(model, (x, y), epochs=1, lr=lr, batch_size=16, optimizer="sgd", weight_decay=wd,
          show_progress=False)
    params = list(ref.parameters())
    loss = torch.nn.functional.cross_entropy(ref(x), y) + wd / 2 * sum(p.pow(2).sum() for p in params)
    grads = torch.autograd.grad(loss, params)
    for p_new, p_old, g in zip(model.parameters(), params, grads):
        torch.testing.assert_close(p_new, (p_old - lr * g).detach(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="optimizer"):
        train(model, (x, y), epochs=1, optimizer="rmsprop")
    with pytest.raises(ValueError, match="weight_decay"):
        TrainSettings(weight_decay=-1.0)


def _eps_bar(model, x):
    """mean |df - g_2| / |df| with g_2 = grad.d - 1/2 d.H.d by double backward (d = x)."""
    x = x.clone().requires_grad_(True)
    out = model(x)
    t = out.argmax(1)
    f = out.gather(1, t[:, None]).sum()
    (g,) = torch.autograd.grad(f, x, create_graph=True)
    first = (g * x).flatten(1).sum(1)
    (hd,) = torch.autograd.grad(first.sum(), x)  # d/dx (g.d) at fixed d = H d + g
    second = (hd * x).flatten(1).sum(1) - first  # d.H.d
    with torch.no_grad():
        df = out.gather(1, t[:, None])[:, 0] - model(torch.zeros_like(x)).gather(1, t[:, None])[:, 0]
    g2 = first - 0.5 * second
    return float(((df - g2).abs() / df.abs()).mean())


def test_weight_decay_shrinks_movement_and_error(tmp_path):
    """Two tiny M-sg trainings that differ only in weight decay: the documented direction
    (smaller weights -> smaller pre-activation movement -> smaller eps_bar)."""
    x, _ = _digits(400, seed=3)
    images = (x > 0.7).double()  # sparse binary "digits" with a learnable label rule
    labels = (images.flatten(1)[:, :392].sum(1) > images.flatten(1)[:, 392:].sum(1)).long()
    data = (images[:300].float(), labels[:300], images[300:].float(), labels[300:])
    held = images[300:340]
    results = {}
    for wd in (0.0, 0.05):
        recipe = TrainSettings(f"wd{wd}", weight_decay=wd)
        model, info = get_trained("m_sg", tmp_path, data=data, epochs=4, training=recipe,
                                  show_progress=False)
        assert info["weight_decay"] == wd and info["preset"] == recipe.name
        model = model.double()
        results[wd] = (_manual_movement(model, held, [2, 4]), _eps_bar(model, held))
        got = preactivation_movement(model, held, 0.0)
        assert list(got.values()) == pytest.approx(results[wd][0],
                                                   rel=device_tolerance(1e-10)["rtol"])
    (move0, err0), (move1, err1) = results[0.0], results[0.05]
    assert move1[0] < move0[0] and move1[1] < move0[1]
    assert err1 < err0
    # two cache entries, the default recipe under the name earlier versions used
    stems = sorted(p.stem for p in (tmp_path / "models").glob("*.json"))
    assert len(stems) == 2 and any("-wd0.05-" in s for s in stems)
    assert any(s.startswith("m_sg-seed0-e4-data") for s in stems)
    _, again = get_trained("m_sg", tmp_path, data=data, epochs=4,
                           training=TrainSettings("x", weight_decay=0.05), show_progress=False)
    assert again["cached"]


def test_presets_and_workspace_fields(tmp_path):
    assert set(PRESETS) == {"default", "paper-like"}
    assert PRESETS["default"].weight_decay == 0 and PRESETS["paper-like"].weight_decay > 0
    ws = Workspace(tmp_path, training="paper-like", seeds=(0, 1, 2), progress=False)
    assert ws.preset == "paper-like" and ws.seeds == (0, 1, 2)
    other = ws.for_training("default", seed=2)
    assert (other.preset, other.seed, other.seeds, other.out) == ("default", 2, (2,), ws.out)
    with pytest.raises(ValueError, match="training preset"):
        Workspace(tmp_path, training="huge")
    with pytest.raises(ValueError, match="seeds"):
        Workspace(tmp_path, seeds=(1, 1))


def test_bootstrap_correlation_ci_matches_scipy_on_the_same_resamples():
    rng = np.random.default_rng(5)
    xs = [rng.normal(size=30) for _ in range(2)]
    ys = [x + rng.normal(size=30) for x in xs]
    ys[1][:3] = ys[1][3]  # ties
    for method, fn in (("pearson", lambda a, b: stats.pearsonr(a, b)[0]),
                       ("spearman", lambda a, b: stats.spearmanr(a, b)[0])):
        r, lo, hi = bootstrap_correlation_ci(xs, ys, method, n_resamples=200, seed=7)
        assert r == pytest.approx(np.mean([fn(a, b) for a, b in zip(xs, ys)]), rel=1e-12)
        idx = np.random.default_rng(7).integers(0, 30, size=(200, 30))
        boot = [np.mean([fn(a[i], b[i]) for a, b in zip(xs, ys)]) for i in idx]
        assert (lo, hi) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])), rel=1e-10)
    single = bootstrap_correlation_ci(xs[0], ys[0], "pearson", n_resamples=50)
    assert single[0] == pytest.approx(stats.pearsonr(xs[0], ys[0])[0], rel=1e-12)
    with pytest.raises(ValueError, match="method"):
        bootstrap_correlation_ci(xs, ys, "kendall")


def test_eg_variants_state_their_baselines_and_around_zero_is_exact():
    labels = {METHODS["expected_gradients"].bind(v).label: v for s, v in variants("assessment")
              if s.name == "expected_gradients"}
    assert set(labels) == {"EG", "EG (around 0)", "EG (data)"}
    assert isinstance(labels["EG (data)"].settings["baselines"], TrainingDigits)
    assert "validation" not in labels["EG (around 0)"].experiments
    torch.manual_seed(0)
    model = m_sg(hidden=6).double().eval()
    x = torch.rand(2, 1, 28, 28, dtype=torch.float64)
    bound = METHODS["expected_gradients"].bind("EG (around 0)", context={"seed": 3},
                                               n_samples=4)
    target = torch.tensor([1, 4])
    got = bound(model, x, 0.0, target)
    d = draw(x, Noise(0.2, around=0.0), n_samples=4, seed=3)
    want = torch.zeros_like(x)
    for b in range(2):
        for k in range(4):
            xb = d.baselines[b, k]
            p = (xb + d.alphas[b, k] * (x[b] - xb)).requires_grad_(True)
            (g,) = torch.autograd.grad(model(p[None])[0, target[b]], p)
            want[b] += (x[b] - xb) * g / 4
    torch.testing.assert_close(got, want, **device_tolerance(1e-10, 1e-12))


def test_training_digits_follow_the_workspace_source(tmp_path):
    ws = Workspace(tmp_path, progress=False)
    assert ws.method_kwargs("assessment") == {}
    other = Workspace(tmp_path, mnist_dir=tmp_path, progress=False).method_kwargs("assessment")
    assert list(other) == ["EG (data)"]
    assert other["EG (data)"]["baselines"].mnist_dir == tmp_path
    rows = TrainingDigits(n=7).samples
    split = ws.held_out_split()  # on the default device (the models'); the references are read
    torch.testing.assert_close(rows, split.train_images[:7].cpu(), rtol=0, atol=0)  # on the CPU


def test_study_over_seeds_against_direct_expansion(tmp_path):
    """Two untrained seeds of M-sg: the study's eps_bar and movement equal the double-backward
    expansion and the sliced forward per seed, as mean and sample sd."""
    ws = Workspace(tmp_path, epochs=0, progress=False, seeds=(0, 1))
    study = run_validation_study(ws, models=("m_sg",), orders=(2,), n_samples=4,
                                 batch_size=2, ig_steps=4)
    x = ws.held_out_digits(4).double()
    errs, moves = [], []
    for s in (0, 1):
        model = ws.for_training(seed=s).trained("m_sg", torch.float64)[0]
        errs.append(_eps_bar(model, x))
        moves.append(_manual_movement(model, x, [2, 4])[0])
    row = study.approximation[0]
    assert row["mean"] == pytest.approx(np.mean(errs), rel=1e-8)
    assert row["spread"] == pytest.approx(np.std(errs, ddof=1), rel=1e-6)
    assert row["first_movement"] == pytest.approx(np.mean(moves), rel=1e-10)
    primary = json.loads((tmp_path / "validation" / "validation.json").read_text())
    assert primary["approximation"][0]["approximation_error"] == pytest.approx(errs[0], rel=1e-8)
    assert (tmp_path / "validation" / "runs" / "default-seed1" / "validation.json").is_file()
    assert (tmp_path / "figures" / "error_vs_movement.png").stat().st_size > 0
    text = format_study(study)
    assert f"{row['mean']:.3f} ± {row['spread']:.2g}" in text
    assert not math.isnan(study.table3[0]["spread"])


@pytest.mark.parametrize("argv, needle", [
    (["validate", "--preset", "huge"], "--preset"),
    (["validate", "--seeds", "0"], "--seeds"),
    (["assess", "--preset", "huge"], "--preset"),
    (["reproduce", "--seeds", "x"], "--seeds"),
])
def test_cli_refuses_bad_training_flags_in_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
