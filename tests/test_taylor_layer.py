"""``taylor_terms(..., layer=)``: the change its result says it explains is the model with
the layer's output at its value minus the model with that output replaced by its baseline,
against the model run twice with the layer's output replaced by hand (a forward hook)."""
import torch
from torch import nn

import taylorattr as ta

DT = torch.float64


def _replaced(model, layer, value, x):
    """``model(x)`` with ``layer``'s output replaced by ``value`` (a forward hook)."""
    handle = layer.register_forward_hook(lambda module, args, out: value)
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def test_layer_expansion_reports_the_change_with_the_layer_replaced():
    # issue 45: output_change was 0 and error = -total on every model
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(DT).eval()
    x = torch.randn(3, 4, dtype=DT)
    with torch.no_grad():
        h, h_base = model[0](x), model[0](torch.zeros_like(x))
    by_hand = _replaced(model, model[0], h, x)[:, 1] - _replaced(model, model[0], h_base, x)[:, 1]
    terms = ta.taylor_terms(model, x, 0.0, target=1, order=3, layer=model[0])
    torch.testing.assert_close(terms.output_change, by_hand, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(terms.error, by_hand - terms.total, rtol=1e-12, atol=1e-14)
    assert (by_hand.abs() > 1e-3).all() and (terms.error.abs() < 0.5 * by_hand.abs()).all()


def test_layer_baseline_differs_from_the_input_baseline_route():
    # a skip connection around the layer: replacing only the layer's output is not f(x~)
    torch.manual_seed(1)

    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)) + x)

    model = Skip().to(DT).eval()
    x, base = torch.randn(2, 4, dtype=DT), 0.2 * torch.randn(2, 4, dtype=DT)
    with torch.no_grad():
        h, h_base = model.a(x), model.a(base)
        direct = model(x)[:, 0] - model(base)[:, 0]
    by_hand = _replaced(model, model.a, h, x)[:, 0] - _replaced(model, model.a, h_base, x)[:, 0]
    terms = ta.taylor_terms(model, x, base, target=0, order=2, layer=model.a)
    torch.testing.assert_close(terms.output_change, by_hand, rtol=1e-12, atol=1e-14)
    assert (by_hand - direct).abs().min() > 1e-3  # not the inputs' change
