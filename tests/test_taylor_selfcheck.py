"""Taylor mode checks its first order against the model's own forward-mode derivative
(``taylorattr.taylor.first_order_check``): a deliberately broken Taylor rule, a captured
graph that is not the model and a float32 cast in a float64 call warn, naming the cause;
correct models do not warn; ``strict`` raises, ``check=False`` skips."""
import warnings

import pytest
import torch
from torch import nn

import taylorattr as ta
from taylorattr import series as S
from taylorattr.capture import capture
from taylorattr.runtime.completeness import CompletenessError, CompletenessWarning
from taylorattr.runtime.cost import RowCounter
from taylorattr.taylor import taylor_attribution, taylor_attribution_cost

DT = torch.float64


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(DT).eval()


def _broken_tanh(x):
    """tanh's value and a first coefficient 0.1 x_k too large: ``tanh(x) + 0.1 (x - x_0)``
    (the value, and the reverse-mode derivative of the value, stay right)."""
    return x.unary(S.tanh) + 0.1 * (x - x.primal)


@pytest.fixture
def broken_rule():
    remove = ta.register_taylor_rule(torch.ops.aten.tanh.default, _broken_tanh)
    yield
    remove()


def test_a_broken_rule_warns_and_strict_raises(broken_rule):
    model = _mlp()
    x, base = torch.randn(2, 5, dtype=DT), 0.2 * torch.randn(2, 5, dtype=DT)
    with pytest.warns(CompletenessWarning, match="Taylor rule") as record:
        terms = ta.taylor_terms(model, x, base, target=0, order=2)
    # the warning's value is the expansion's, its reference the model's own derivative
    z = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(z)[:, 0].sum(), z)
    exact = (grad * (x - base)).sum(1)
    assert not torch.allclose(terms.orders[:, 0], exact, rtol=1e-6)
    assert f"{float(exact[0]):.10g}" in str(record[0].message)
    with pytest.raises(CompletenessError, match="Taylor rule"):
        taylor_attribution(model, x, base, target=0, order=2, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ta.taylor_terms(model, x, base, target=0, order=2, check=False)


@pytest.mark.parametrize("batch", [1, 2])
def test_correct_models_do_not_warn(batch):
    model = _mlp(1)
    x, base = torch.randn(batch, 5, dtype=DT), 0.2 * torch.randn(batch, 5, dtype=DT)
    relu = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(12, 2)).to(DT).eval()
    images = torch.randn(batch, 1, 6, 6, dtype=DT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        terms = ta.taylor_terms(model, x, base, target=1, order=3)
        taylor_attribution(model, x, base, target=1, order=2)
        ta.taylor_terms(model, x, base, target=1, order=2, layer=model[0])
        ta.taylor_terms(ta.smooth(relu, 5.0, inputs=images), images, 0.0, target=0, order=2)
    z = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(z)[:, 1].sum(), z)
    torch.testing.assert_close(terms.orders[:, 0], (grad * (x - base)).sum(1))


class _NotTheModel(nn.Module):
    """A model whose Taylor-mode graph is another function's (as ``ta.smooth`` once was:
    surrogates acting only in the captured graph)."""

    def __init__(self):
        super().__init__()
        self.model, self.other = _mlp(2), _mlp(3)

    def forward(self, x):
        return self.model(x)

    def taylor_core_graph(self, x):
        return capture(self.other, (x.detach(),))


def test_a_graph_that_is_not_the_model_is_named():
    x = torch.randn(2, 5, dtype=DT)
    with pytest.warns(CompletenessWarning, match="the function expanded is not the model"):
        ta.taylor_terms(_NotTheModel().eval(), x, 0.0, target=0, order=1)


class _RMSNorm(nn.Module):
    """Llama's RMSNorm: computes in float32 whatever the inputs' dtype."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


def test_a_float32_cast_in_a_float64_call_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), _RMSNorm(32), nn.Tanh(), nn.Linear(32, 4)).to(DT)
    x, base = torch.randn(4, 16, dtype=DT), 0.3 * torch.randn(4, 16, dtype=DT)
    with pytest.warns(CompletenessWarning, match="casts float64 to float32 at 1 \\(_RMSNorm\\)"):
        taylor_attribution(model.eval(), x, base, target=0, order=1)


def test_check_costs_one_forward_of_the_batch_and_nothing_when_off():
    counter = RowCounter(_mlp(4))
    x = torch.randn(3, 5, dtype=DT)
    for check in (True, False):
        counter.reset()
        taylor_attribution(counter, x, 0.0, target=0, order=2, check=check)
        cost = taylor_attribution_cost(x, 0.0, 2, check=check)
        assert counter.forward_rows == cost.forward_rows == 3 * check
