"""Same seed, bitwise the same numbers on the CPU (issue 8), and on CUDA with cuDNN's
deterministic algorithms (``taylorattr.testing.cudnn_deterministic``).

Expected Gradients (draws and attributions), infidelity's Gaussian perturbations and
scores, and trained weights (``models.train`` and ``models.get_trained`` on a tiny
subset) are compared with ``torch.equal``, never a tolerance. Each check also perturbs
the global RNG between the two runs (the library must not depend on it) and checks that
another seed does change the result (the seed is really used).
"""
from __future__ import annotations

import pytest
import torch
from conftest import device_tolerance
from torch import nn

from taylorattr import metrics as M
from taylorattr import models
from taylorattr.methods import ExpectedGradients
from taylorattr.methods.expected_gradients import draw
from taylorattr.testing import cudnn_deterministic

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _net(dtype):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 3, 3), nn.Softplus(), nn.Flatten(),
                             nn.Linear(3 * 4 * 4, 4)).to(dtype).eval()


def _inputs(dtype, seed=1):
    return torch.rand(3, 1, 6, 6, generator=torch.Generator().manual_seed(seed), dtype=dtype)


_DISTURBANCES = iter(range(1000, 10**9))


def _disturb_global_rng():
    """Move the global RNG somewhere else (restored after the test by the fixture)."""
    torch.manual_seed(next(_DISTURBANCES))
    torch.rand(17)


@pytest.fixture(autouse=True)
def _keep_global_rng():
    with torch.random.fork_rng(devices=[]):
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("source", ["noise", "reference"])
@cudnn_deterministic()  # on CUDA, bitwise only with cuDNN's deterministic algorithms
def test_expected_gradients_is_bitwise_reproducible(dtype, source):
    model, x = _net(dtype), _inputs(dtype)
    kw = ({"noise_std": 0.3} if source == "noise"
          else {"baselines": _inputs(dtype, seed=7)})
    eg = ExpectedGradients(model)
    a1 = eg.attribute(x, n_samples=12, seed=5, internal_batch_size=7, **kw)
    d1 = draw(x, n_samples=12, seed=5, **kw)
    _disturb_global_rng()
    a2 = ExpectedGradients(model).attribute(x, n_samples=12, seed=5, internal_batch_size=7, **kw)
    d2 = draw(x, n_samples=12, seed=5, **kw)
    assert torch.equal(d1.baselines, d2.baselines) and torch.equal(d1.alphas, d2.alphas)
    assert torch.equal(a1, a2)
    # another chunking of the forward/backward passes: the same draws, but the model's
    # summation order may change with the rows per call, so round-off, not bitwise
    a3 = eg.attribute(x, n_samples=12, seed=5, **kw)
    torch.testing.assert_close(a3, a1, **device_tolerance(
        0.0, 1e-6 if dtype == torch.float32 else 1e-12, dtype))
    assert not torch.equal(eg.attribute(x, n_samples=12, seed=6, **kw), a1)


def _recording(noise_std, record):
    base = M.gaussian_perturbation(noise_std)

    def perturb(inputs, generator):
        pert, perturbed = base(inputs, generator)
        record.append(pert.clone())
        return pert, perturbed

    return perturb


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_infidelity_gaussian_samples_and_scores_are_bitwise_reproducible(dtype):
    model, x = _net(dtype), _inputs(dtype)
    attr = ExpectedGradients(model).attribute(x, noise_std=0.3, n_samples=4, seed=0)
    runs = []
    for _ in range(2):
        record = []
        score = M.infidelity(model, x, attr, perturbation=_recording(0.2, record),
                             n_perturb_samples=40, seed=11, batch_size=32)
        builtin = M.infidelity(model, x, attr, perturbation="gaussian", noise_std=0.2,
                               n_perturb_samples=40, seed=11, batch_size=32)
        runs.append((record, score, builtin))
        _disturb_global_rng()
    (rec1, s1, g1), (rec2, s2, g2) = runs
    assert len(rec1) == len(rec2) == 40
    assert all(torch.equal(a, b) for a, b in zip(rec1, rec2))
    assert torch.equal(s1, s2) and torch.equal(g1, g2)
    assert torch.equal(s1, g1)  # the recorder changes nothing
    other = []
    M.infidelity(model, x, attr, perturbation=_recording(0.2, other), n_perturb_samples=40,
                 seed=12)
    assert not torch.equal(other[0], rec1[0])


def _tiny_mnist_like(n=96, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    return x, y


def test_models_train_is_bitwise_reproducible():
    x, y = _tiny_mnist_like()
    states, histories = [], []
    for _ in range(2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            net = models.m_sg(hidden=16)
        _disturb_global_rng()
        histories.append(models.train(net, (x, y), epochs=2, lr=1e-2, batch_size=32, seed=4,
                                      show_progress=False))
        states.append(net.state_dict())
    assert histories[0] == histories[1]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = models.m_sg(hidden=16)
    models.train(net, (x, y), epochs=2, lr=1e-2, batch_size=32, seed=5, show_progress=False)
    assert not all(torch.equal(states[0][k], v) for k, v in net.state_dict().items())


def test_get_trained_gives_bitwise_identical_weights_in_separate_caches(tmp_path):
    x, y = _tiny_mnist_like()
    data = (x[:64], y[:64], x[64:], y[64:])
    results = []
    for d in ("a", "b"):
        _disturb_global_rng()
        model, info = models.get_trained("poly", tmp_path / d, seed=2, epochs=1, data=data,
                                         show_progress=False)
        assert not info["cached"]
        results.append((model.state_dict(), info))
    (s1, i1), (s2, i2) = results
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert i1["loss_history"] == i2["loss_history"]
    assert i1["held_out_accuracy"] == i2["held_out_accuracy"]
    # the cache returns the very same weights
    cached, info = models.get_trained("poly", tmp_path / "a", seed=2, epochs=1, data=data,
                                      show_progress=False)
    assert info["cached"]
    assert all(torch.equal(cached.state_dict()[k], s1[k]) for k in s1)
    other, _ = models.get_trained("poly", tmp_path / "c", seed=3, epochs=1, data=data,
                                  show_progress=False)
    assert not all(torch.equal(other.state_dict()[k], s1[k]) for k in s1)
