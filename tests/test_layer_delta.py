"""The delta at a layer says which difference it measures (``layer_delta``).

A tabular model whose numeric columns bypass the embedding: at the embedding, DeepLIFT is
complete for the layer's convention (the rest of the network held at x) and misses
``f(x) - f(x~)`` by what the bypassing columns change; Captum's ``LayerDeepLift`` (and
ours in ``taylorattr.captum``) measures the delta against ``f(x) - f(x~)``.
"""
import pytest
import torch
from _builders import DT
from captum.attr import LayerDeepLift as CaptumLayerDeepLift
from torch import nn

from taylorattr.captum.attr import LayerDeepLift
from taylorattr.methods import DeepLift


class Tabular(nn.Module):
    """Numeric columns through a Linear, categorical ids through an Embedding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.num = nn.Linear(3, 4)
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(4, 2))

    def forward(self, x, ids):
        return self.head(self.num(x) + self.emb(ids).sum(1))


def _setup():
    torch.manual_seed(0)
    model = Tabular().to(DT).eval()
    x, ids = torch.randn(2, 3, dtype=DT), torch.tensor([[1, 2], [3, 4]])
    return model, (x, ids), (torch.zeros_like(x), torch.zeros_like(ids))


def test_the_layer_convention_and_the_model_convention_measure_their_own_differences():
    model, inputs, base = _setup()
    dl = DeepLift(model)
    ex = dl.explain(inputs, base, 0, layer=model.emb, return_convergence_delta=True)
    assert ex.delta_of == "layer"
    with torch.no_grad():
        fx = model(*inputs)[:, 0]
        # the layer at its baseline value, every other path (the numeric columns) at x
        held = model.head(model.num(inputs[0]) + model.emb(base[1]).sum(1))[:, 0]
        f_base = model(*base)[:, 0]
    total = ex.attributions.sum((1, 2))
    torch.testing.assert_close(total, fx - held, rtol=0, atol=1e-12)
    torch.testing.assert_close(ex.delta, total - (fx - held), rtol=0, atol=1e-12)
    assert (total - (fx - f_base)).abs().min() > 1e-2  # the trap: not f(x) - f(x~)
    ex = dl.explain(inputs, base, 0, layer=model.emb, layer_delta="model",
                    return_convergence_delta=True)
    assert ex.delta_of == "model"
    torch.testing.assert_close(ex.delta, total - (fx - f_base), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="layer_delta must be 'layer' or 'model'"):
        dl.attribute(inputs, base, 0, layer=model.emb, layer_delta="captum")


def test_captum_layer_deeplift_measures_against_the_whole_model_as_captum_does():
    model, inputs, base = _setup()
    ours, delta = LayerDeepLift(model, model.emb).attribute(
        inputs, base, target=0, return_convergence_delta=True)
    with torch.no_grad():
        df = model(*inputs)[:, 0] - model(*base)[:, 0]
    torch.testing.assert_close(delta, ours.sum((1, 2)) - df, rtol=0, atol=1e-12)
    # Captum's own delta is of the same difference (its attributions at this layer take
    # the Rescale multipliers with the numeric columns at the baseline too)
    theirs, their_delta = CaptumLayerDeepLift(model, model.emb).attribute(
        inputs, base, target=0, return_convergence_delta=True)
    torch.testing.assert_close(their_delta, theirs.sum((1, 2)) - df, rtol=0, atol=1e-6)
