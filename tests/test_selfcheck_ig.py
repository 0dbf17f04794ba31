"""Integrated Gradients checks its completeness within its quadrature error (issue 35).

The miss ``|sum_i a_i - (f(x) - f(x~))|`` is computed here from two forwards of the model
(not read from the returned delta), the tolerance by hand from its stated formula
``max(rounding, 0.05 max(|df|, sum_i |a_i|))``; the rows a call runs are counted with a
:class:`~taylorattr.runtime.cost.RowCounter` against the method's declared cost.
"""
import warnings

import pytest
import torch
from _builders import DT
from captum.attr import IntegratedGradients as CaptumIG
from torch import nn

from taylorattr.methods import IntegratedGradients
from taylorattr.runtime.completeness import CompletenessError, CompletenessWarning
from taylorattr.runtime.cost import RowCounter

TARGET = 1


def _relu_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                        nn.Linear(16, 3)).to(DT).eval()
    x = torch.randn(4, 6, dtype=DT, generator=torch.Generator().manual_seed(1))
    return net, x


def _measured(net, x, a):
    """``(miss, tol, rounding)`` per sample: the miss from two model forwards, the
    tolerance and its rounding part (DeepLIFT's whole tolerance) by hand."""
    with torch.no_grad():
        df = net(x)[:, TARGET] - net(torch.zeros_like(x))[:, TARGET]
    flat = a.reshape(a.shape[0], -1)
    miss = (flat.sum(1) - df).abs()
    eps = torch.finfo(DT).eps
    rounding = torch.maximum(1000 * eps * torch.ones_like(df), eps ** 0.5 / 2 * df.abs().clamp(min=1))
    tol = torch.maximum(rounding, 0.05 * torch.maximum(df.abs(), flat.abs().sum(1)))
    return miss, tol, rounding


def _quiet_call(ig, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        return ig.attribute(x, 0.0, target=TARGET, **kw)


def test_too_few_steps_on_a_relu_network_warn_and_enough_are_silent():
    net, x = _relu_net()
    ig = IntegratedGradients(net)
    with pytest.warns(CompletenessWarning, match=r"IntegratedGradients: .*likely cause: too few "
                                                 r"n_steps.*raise n_steps") as caught:
        a2, delta = ig.attribute(x, 0.0, target=TARGET, n_steps=2, return_convergence_delta=True)
    miss, tol, _ = _measured(net, x, a2)
    assert (miss > tol).any()  # a real miss, beyond 5 % of the attributions' size
    bad = (miss > tol).nonzero().flatten().tolist()
    message = str(caught[0].message)
    assert f"sample(s) {', '.join(map(str, bad))}:" in message
    worst = int(miss.argmax())
    assert f"tolerance {float(tol[worst]):.2g} for float64" in message
    # the delta returned is the miss measured here (the check's f(x~), no second forward)
    torch.testing.assert_close(delta.abs(), miss, rtol=0, atol=1e-14)
    # the check changes no attribution: Captum's IG on the same net and nodes
    captum = CaptumIG(net).attribute(x, torch.zeros_like(x), target=TARGET, n_steps=2)
    torch.testing.assert_close(a2, captum, rtol=0, atol=1e-14)
    with pytest.raises(CompletenessError, match="too few n_steps"):
        ig.attribute(x, 0.0, target=TARGET, n_steps=2, strict=True)
    # enough nodes: within 5 % of the attributions' size, silent (strict too)
    a = _quiet_call(ig, x, n_steps=200, strict=True)
    miss, tol, rounding = _measured(net, x, a)
    # a quadrature error that rounding alone would not excuse, tolerated as one
    assert (miss <= tol).all() and (miss > rounding).any()


def test_a_smooth_network_is_silent_with_few_steps():
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(DT).eval()
    x = torch.randn(4, 6, dtype=DT)
    a = _quiet_call(IntegratedGradients(net), x, n_steps=8)
    miss, _, _ = _measured(net, x, a)
    assert (miss < 1e-5).all()  # Gauss-Legendre on an analytic path: small at 8 nodes


@pytest.mark.parametrize("method,extra", [("gausslegendre", 1), ("riemann_right", 1),
                                          ("riemann_middle", 1), ("riemann_left", 0),
                                          ("riemann_trapezoid", 0)])
@pytest.mark.parametrize("delta", [False, True])
def test_the_checks_forward_is_counted_in_the_cost(method, extra, delta):
    """One forward row per sample at the baseline for the check (none where the rule's
    first node is the baseline itself); the delta reads it, no further forward."""
    net, x = _relu_net()
    counter = RowCounter(net)
    ig = IntegratedGradients(counter)
    n, batch = 30, x.shape[0]

    def counted(**kw):  # the second call's rows (a first one may probe the chunk size)
        for _ in range(2):
            counter.reset()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CompletenessWarning)  # riemann rules, 30 nodes
                ig.attribute(x, 0.0, target=TARGET, n_steps=n, method=method,
                             internal_batch_size=64, return_convergence_delta=delta, **kw)
        cost = ig.cost(x, n_steps=n, method=method, return_convergence_delta=delta, **kw)
        assert (counter.forward_rows, counter.backward_rows) == \
            (cost.forward_rows, cost.backward_rows)
        return counter.forward_rows, counter.backward_rows

    assert counted() == (batch + n * batch + extra * batch, n * batch)  # by hand
    # without the factor (x - x~) there is no check: the delta alone pays f(x~)
    assert counted(multiply_by_inputs=False) == (batch + n * batch + delta * batch, n * batch)


def test_riemann_left_reads_the_baseline_output_from_its_first_node():
    net, x = _relu_net()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        a, delta = IntegratedGradients(net).attribute(x, 0.0, target=TARGET, n_steps=7,
                                                      method="riemann_left",
                                                      return_convergence_delta=True)
    miss, _, _ = _measured(net, x, a)
    torch.testing.assert_close(delta.abs(), miss, rtol=0, atol=1e-14)
