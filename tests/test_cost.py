"""The counted rows of every long entry point equal the rows the model actually saw.

Each test counts a call's rows from its plan (``cost``/``*_cost``, which run no model), then
runs the call on a :class:`RowCounter`-wrapped model (forward rows of every call, backward
rows from a hook on the output) or, for Taylor-mode passes, through counting wrappers of
``propagate``, the traced graph and ``torch.autograd.grad``, and compares exactly.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import taylorattr.taylor.pair_interactions as PI
import taylorattr.taylor.terms as T
from taylorattr.baselines import ReferenceSet
from taylorattr.groups import count_windows
from taylorattr.methods import (
    LRP,
    DeepLift,
    DeepLiftShap,
    EpsilonLRP,
    ExpectedGradients,
    GradCAM,
    GradientInput,
    GradientShap,
    GuidedBackprop,
    IntegratedGradients,
    KernelShap,
    Occlusion,
    PredictionDifference,
    Saliency,
    ShapleyValues,
    SmoothGrad,
    TaylorAttribution,
)
from taylorattr.methods.layerwise import engine
from taylorattr.metrics import infidelity, infidelity_cost
from taylorattr.paper_methods import variants
from taylorattr.registry import METHODS
from taylorattr.runtime.cost import (
    Cost,
    CostError,
    Rates,
    RowCounter,
    check_budget,
    estimate,
    format_seconds,
    measure_rates,
    stage_estimate,
)
from taylorattr.testing import (
    assert_cost_counted,
    conv_model,
    image_batch,
    observed_plan_run,
    reference_images,
)

_model = conv_model  # the common checks' model: conv 3x3, softplus, linear (float64)


@pytest.fixture(scope="module")
def x():
    return image_batch()


MASK = (torch.arange(36).view(1, 1, 6, 6) // 9)  # 4 groups of 9 pixels

CASES = [
    (GradientInput, {}, False),
    (Saliency, {}, False),
    (Occlusion, {"patch": 2, "stride": 1, "perturbations_per_eval": 7}, True),
    (Occlusion, {"patch": (3, 2), "perturbations_per_eval": 5}, False),
    (Occlusion, {"feature_mask": MASK, "perturbations_per_eval": 3}, True),
    (IntegratedGradients, {"n_steps": 5, "internal_batch_size": 7}, True),
    (ShapleyValues, {"feature_mask": MASK, "perturbations_per_eval": 6}, False),
    (ShapleyValues, {"feature_mask": MASK, "method": "sampling", "n_samples": 3,
                     "perturbations_per_eval": 6}, True),
    (KernelShap, {"feature_mask": MASK, "n_samples": 5, "perturbations_per_eval": 4}, False),
    (ExpectedGradients, {"n_samples": 3, "noise_std": 0.5, "internal_batch_size": 4}, True),
    (GradientShap, {"n_samples": 3, "noise_std": 0.5, "internal_batch_size": 4}, False),
    (PredictionDifference, {"n_samples": 2, "noise_std": 0.5, "patch": 3,
                            "perturbations_per_eval": 5}, True),
    (SmoothGrad, {"nt_samples": 3, "nt_samples_batch_size": 2}, False),
]


@pytest.mark.parametrize("cls,options,delta", CASES,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_method_rows_equal_counted(cls, options, delta, x):
    counter = RowCounter(_model())
    _assert_rows_counted(cls(counter), counter, x, delta, options)


def test_occlusion_windows_closed_form():
    # pixel-level occlusion of a 224x224 image: one window per pixel
    assert count_windows((3, 224, 224), 1) == 224 * 224 == 50_176
    # windows start at 0, s, 2s, ... with the last one cut at the edge (Captum's layout)
    assert count_windows((3, 224, 224), 16, 8) == (math.ceil((224 - 16) / 8) + 1) ** 2
    with pytest.raises(ValueError, match="stride"):
        count_windows((1, 6, 6), 2, 3)


def test_cost_refuses_unknown_option_and_tuples(x):
    m = Occlusion(_model())
    with pytest.raises(TypeError, match="n_steps"):
        m.cost(x, n_steps=3)
    with pytest.raises(TypeError, match="one-tensor"):
        m.cost((x, x))


# ------------------------------------------------------------------ Taylor-mode entry points

class _TaylorCount:
    """Counts forwards (``model``, a RowCounter: tracing goes through it uncounted),
    Taylor-mode rows and passes, and reverse sweeps through them."""

    def __init__(self, monkeypatch, n_features):
        self.model = RowCounter(_model())
        self.passes = self.rows = self.sweeps = 0
        real_prop, real_grad = T.propagate, torch.autograd.grad

        def propagate(gm, inputs, directions, order):
            self.passes += 1
            self.rows += directions.shape[0] * directions.shape[1]
            return real_prop(gm, inputs, directions, order)

        inside = []

        def grad(outputs, inputs, *a, **k):
            # counted once per call: under a torch-function mode (TAYLORATTR_DEVICE=cuda's
            # default device and host draws) torch.autograd.grad dispatches through each
            # mode to the module's current `grad`, this wrapper (CUDA showed 3x the sweeps)
            if not inside:
                inp = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
                self.sweeps += inp.numel() // n_features
            inside.append(True)
            try:
                return real_grad(outputs, inputs, *a, **k)
            finally:
                inside.pop()

        monkeypatch.setattr(T, "propagate", propagate)
        monkeypatch.setattr(PI, "propagate", propagate)
        monkeypatch.setattr(torch.autograd, "grad", grad)

    def reset(self):
        self.model.reset()
        self.passes = self.rows = self.sweeps = 0

    def warm(self, x):
        """Measure the automatic sizes' one-off memory probe (not counted, as for the
        methods: the Taylor passes are sized on the model's cached forward plan)."""
        from taylorattr.runtime.batching import chunk_rows

        chunk_rows(self.model, x, backward=False)
        self.reset()

    def check(self, cost: Cost):
        assert (self.model.forward_rows, self.passes, self.rows, self.sweeps) == \
            (cost.forward_rows, cost.taylor_passes, cost.taylor_rows, cost.taylor_backward_rows)


def _baselines(x):
    # sample 0 keeps 30 of its 36 pixels at the baseline, sample 1 moves 7: the widest
    # sample (7 moved features) sets the passes
    base = x.clone()
    base[0, 0, 0, :6] = 0.0
    base[1, 0, 5, :] = 0.0
    base[1, 0, 4, 0] = 0.0
    return base


@pytest.mark.parametrize("order,chunk", [(1, None), (2, 3), (3, None)])
def test_taylor_terms_rows(monkeypatch, x, order, chunk):
    cost = T.taylor_terms_cost(x, _baselines(x), order, chunk)
    count = _TaylorCount(monkeypatch, 36)
    count.warm(x)
    T.taylor_terms(count.model, x, _baselines(x), order=order, chunk_size=chunk)
    count.check(cost)
    if order == 2:
        assert cost.taylor_passes == 1 + math.ceil(7 / 3)


def test_group_expansions_rows(monkeypatch, x):
    groups = (torch.arange(36).view(1, 6, 6) // 4)
    cost = T.group_expansions_cost(x, _baselines(x), 2, groups, chunk_size=2)
    count = _TaylorCount(monkeypatch, 36)
    T.group_expansions(count.model, x, _baselines(x), order=2, groups=groups, chunk_size=2)
    count.check(cost)


@pytest.mark.parametrize("route,order", [("gradient", 2), ("gradient", 3), ("pairs", 2)])
def test_interactions_rows(monkeypatch, x, route, order):
    groups = (torch.arange(36).view(1, 6, 6) // 6)
    cost = PI.interactions_cost(x, groups, order, route=route, chunk_size=4)
    count = _TaylorCount(monkeypatch, 36)
    PI.interactions(count.model, x, 0.0, groups=groups, order=order, route=route, chunk_size=4)
    count.check(cost)


# ------------------------------------------------------------------ infidelity and units

@pytest.mark.parametrize("kw", [{"perturbation": "square", "max_side": 3},
                                {"perturbation": "gaussian", "n_perturb_samples": 7}])
def test_infidelity_rows(x, kw):
    counter = RowCounter(_model())
    cost = infidelity_cost(x, **kw)
    infidelity(counter, x, torch.ones_like(x), batch_size=11, **kw)
    assert counter.forward_rows == cost.forward_rows
    if kw["perturbation"] == "square":  # sum over sides of the positions of each square
        assert cost.forward_rows == 2 + 2 * sum((6 - s + 1) ** 2 for s in (1, 2, 3))


def test_bound_methods_of_the_assessment(monkeypatch, x):
    """Every method of the assessment, with its registry settings, as a unit runs it."""
    _count_plan_passes(monkeypatch)
    bounds = [spec.bind(v, context={"seed": 0}) for spec, v in variants("assessment")]
    checked = []
    for bound in bounds:
        if isinstance(bound.settings.get("baselines"), ReferenceSet):
            continue  # references sized for the digits, not for these inputs
        cost = _assert_bound_counted(bound, x)
        assert cost.label == bound.label
        checked.append(bound.label)
    # every assessment variant but EG (data), the layer-wise rules (DeepLift, LRP) included
    assert len(checked) == len(bounds) - 1, checked


# ------------------------------------------------------------------ estimate and budget

def test_estimate_is_the_rates_weighted_sum():
    cost = Cost(forward_rows=100, backward_rows=40, taylor_rows=10, taylor_backward_rows=5,
                taylor_passes=2, order=2)
    rates = Rates(forward=0.01, backward=0.02, taylor=0.3, order=2, device="cpu")
    est = estimate(cost, rates=rates)
    assert est.seconds == pytest.approx(100 * 0.01 + 40 * 0.02 + (10 + 2 * 5) * 0.3)
    with pytest.raises(ValueError, match="taylor_order=3"):
        estimate(Cost(taylor_rows=1, order=3), rates=rates)


def test_stage_estimate_measures_on_the_model(x):
    model = _model()
    unit = Occlusion(model).cost(x, patch=1)
    est = stage_estimate("bbox on toy", [unit, unit], model, x)
    assert est.forward_rows == 2 * unit.forward_rows and est.samples == 4
    assert est.label.startswith("bbox on toy: occlusion") and est.seconds > 0
    assert est.device == str(x.device)  # where it was measured ("cuda:0" on CUDA)


def test_describe_and_gpu_scale_flag():
    c = Cost(label="Occlusion-1", samples=4, forward_rows=200_704, seconds=80 * 60,
             device="cpu")
    assert c.describe().startswith("Occlusion-1, 4 images, 200,704 forwards, about 80 min on cpu")
    assert "GPU-scale" in c.describe()
    assert "GPU-scale" not in Cost(label="Occ-16", samples=4, forward_rows=4 * 196).describe()
    assert "GPU-scale" not in Cost(samples=1, forward_rows=50_176, device="cuda:0").describe()
    assert format_seconds(30) == "30 s" and format_seconds(3 * 3600) == "3.0 h"


def test_check_budget_one_line_naming_cheaper_options():
    c = Cost(label="Occlusion-1", samples=4, forward_rows=200_704, seconds=4800.0)
    assert check_budget(c, 5000) is c
    assert check_budget(c, None) is c
    with pytest.raises(CostError) as err:
        check_budget(c, 600)
    msg = str(err.value)
    assert "\n" not in msg and "80 min" in msg and "10 min" in msg
    for option in ("patch", "--samples", "GPU", "torchrun"):
        assert option in msg
    with pytest.raises(ValueError, match="budget"):
        check_budget(c, -1)
    with pytest.raises(ValueError, match="estimate"):
        check_budget(Cost(forward_rows=1), 10)


# ------------------------------------------------------------------ the other methods

def _assert_rows_counted(method, counter, x, delta, options):
    """``method.cost`` (no model run) equals the rows ``counter`` sees in a second call."""
    cost = method.cost(x, return_convergence_delta=delta, **options)
    assert counter.forward_rows == 0  # counting runs no model
    # the automatic chunk size's one-off memory probe (the delta's reference forwards use
    # it) is not counted: warm it up once, then count a second identical call
    method.attribute(x, return_convergence_delta=delta, **options)  # may probe chunk sizes once
    counter.reset()
    out = method.attribute(x, return_convergence_delta=delta, **options)
    assert torch.isfinite(out[0] if delta else out).all()
    assert (counter.forward_rows, counter.backward_rows) == \
        (cost.forward_rows, cost.backward_rows)
    assert cost.samples == x.shape[0] and cost.taylor_rows == 0
    return cost


def _assert_bound_counted(bound, x) -> Cost:
    """:meth:`BoundMethod.cost` (no model run) equals the rows a second run of ``bound`` shows."""
    return assert_cost_counted(bound, RowCounter(_model()), x)


def _count_plan_passes(monkeypatch):
    """The layer-wise engine runs the model's traced plan (an fx interpreter calling its
    submodules), never the model's forward: report each run of the plan (on the inputs or
    on the baselines) to the RowCounter it runs on, which also hooks the run's output to
    count the modified backward sweep through it (as ``taylorattr.testing`` does)."""
    monkeypatch.setattr(engine._Pass, "run", observed_plan_run(engine._Pass.run))


def _relu_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(2 * 3 * 3, 3)).double().eval()


REFS = reference_images()

# (class, constructor arguments, call options, delta, rows per sample besides the target's
# forward: (forward, backward), counted by hand from the method's passes)
OTHER_CASES = [
    (DeepLift, {}, {}, True, (1 + 1, 1)),            # baseline pass (its f(x~): the delta's), main
    (DeepLift, {}, {"multiply_by_inputs": False}, True, (1 + 1 + 1, 1)),  # + the delta's ref
    (DeepLift, {}, {}, False, (1 + 1, 1)),
    (EpsilonLRP, {}, {}, True, (1, 1)),              # no baseline pass, no reference
    (LRP, {"rule": "epsilon_plus_flat"}, {}, True, (1, 1)),
    (LRP, {"rule": "gamma"}, {}, False, (1, 1)),
    (DeepLiftShap, {}, {"baselines": REFS, "internal_batch_size": 4}, True,
     (3 * 2, 3)),                                    # 3 references: DeepLIFT each (f(x~) read)
    (DeepLiftShap, {}, {"noise_std": 0.5, "n_samples": 2}, False, (2 * 2, 2)),
    (GuidedBackprop, {}, {}, True, (1 + 1, 1)),
    (GuidedBackprop, {}, {}, False, (1, 1)),
    (GradCAM, {}, {"relu_attributions": True, "interpolate_mode": "bilinear"}, True, (1 + 1, 1)),
    (GradCAM, {}, {}, False, (1, 1)),
]


@pytest.mark.parametrize("make", [_model, _relu_model], ids=["softplus", "relu-maxpool"])
@pytest.mark.parametrize("cls,init,options,delta,per_sample", OTHER_CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(OTHER_CASES)])
def test_other_method_rows_equal_counted(monkeypatch, x, make, cls, init, options, delta,
                                         per_sample):
    """Layer-wise (DeepLift, LRP, DeepLiftShap), Guided Backprop and Grad-CAM: the counted
    rows equal the rows the model saw (the plan's runs reported by the engine) and the
    rows counted by hand."""
    _count_plan_passes(monkeypatch)
    counter = RowCounter(make())
    cost = _assert_rows_counted(cls(counter, **init), counter, x, delta, options)
    batch = x.shape[0]
    assert (cost.forward_rows, cost.backward_rows) == \
        (batch * (1 + per_sample[0]), batch * per_sample[1])


@pytest.mark.parametrize("order,delta", [(1, True), (2, False), (3, True)])
def test_taylor_attribution_rows(monkeypatch, x, order, delta):
    count = _TaylorCount(monkeypatch, 36)
    method = TaylorAttribution(count.model)
    kw = {"order": order, "return_convergence_delta": delta}
    cost = method.cost(x, _baselines(x), **kw)
    method.attribute(x, _baselines(x), **kw)  # may probe the delta's chunk size once
    count.reset()
    method.attribute(x, _baselines(x), **kw)
    count.check(cost)
    batch = x.shape[0]
    assert (count.model.backward_rows, cost.backward_rows, cost.order) == (0, 0, order)
    # one pass of B rows, which computes f(x) itself; forwards: the call's own one (the
    # target), the first-order check's forward-mode pass and the delta's f(x~)
    assert (cost.taylor_passes, cost.taylor_rows) == (1, batch)
    assert cost.forward_rows == batch * (2 + delta)


# ------------------------------------------------------------------ taylor_terms with groups (issue 16)

@pytest.mark.parametrize("order,chunk", [(1, None), (2, 2), (3, None)])
def test_taylor_terms_rows_with_groups(monkeypatch, x, order, chunk):
    groups = (torch.arange(36).view(1, 6, 6) // 4)  # 9 groups of 4 pixels
    cost = T.taylor_terms_cost(x, _baselines(x), order, chunk, groups=groups)
    count = _TaylorCount(monkeypatch, 36)
    count.warm(x)
    terms = T.taylor_terms(count.model, x, _baselines(x), order=order, chunk_size=chunk,
                           groups=groups)
    count.check(cost)
    assert terms.independent.shape == (2, 9)
    if order >= 2:
        # sample 0 moves groups {0, 1}, sample 1 moves {6, 7, 8}: B x 3 expansion rows
        assert cost.taylor_rows == 2 + 2 * 3
        assert cost.taylor_passes == 1 + (math.ceil(3 / chunk) if chunk else 1)


def test_taylor_terms_cost_with_patch_groups_is_linear_in_the_groups():
    """A 3x224x224 image in 196 patches of 16x16: B x 196 expansion rows, not B x 150,528."""
    x = torch.rand(2, 3, 224, 224)
    r = torch.arange(224) // 16
    patches = (r[:, None] * 14 + r[None, :]).expand(3, 224, 224)
    grouped = T.taylor_terms_cost(x, 0.0, 2, groups=patches)
    assert grouped.taylor_rows == 2 + 2 * 196
    # two sweeps back per sample (order 2); two forwards per sample: at the baselines
    # (f(x~)) and the first-order check's forward-mode pass (none with check=False)
    assert grouped.taylor_backward_rows == 2 * 2 and grouped.forward_rows == 2 * 2
    assert T.taylor_terms_cost(x, 0.0, 2, groups=patches, check=False).forward_rows == 2
    # each group's direction spans the whole image: at most 2^25 direction entries per pass
    assert grouped.taylor_passes == 1 + math.ceil(196 / (2**25 // (2 * 150_528))) == 3
    assert T.taylor_terms_cost(x, 0.0, 2).taylor_rows == 2 + 2 * 3 * 224 * 224


# ------------------------------------------------------------------ reformulations count their own rows

import taylorattr.taylor.shapley_rule as SR
from taylorattr.experiments.validation import reformulation_cost

#: Registered methods whose reformulation does not count its rows (``cost`` None), and why.
#: Empty: every reformulation counts; a new one without a count must be named here.
REFORMULATIONS_NOT_COUNTED: dict[str, str] = {}
_REFORM_CONTEXT = {"seed": 0, "n_samples": 3, "nt_samples": 2, "n_steps": 3, "patch": 3}


def _reformulated():
    """``(spec, bound variant, baselines)`` of every variant of every registered method with
    a reformulation; a distribution method gets its variant's references (``REFS`` for
    training digits), the others the validation's baseline 0."""
    out = []
    for spec in METHODS.values():
        if spec.reformulation is None:
            continue
        for v in spec.variants:
            own = {"baselines": REFS} if isinstance(v.settings.get("baselines"),
                                                    ReferenceSet) else {}
            bound = spec.bind(v, context=_REFORM_CONTEXT, **own)
            base = bound._baselines(0.0) if spec.baseline_kind == "distribution" else 0.0
            out.append((spec, bound, base))
    return out


@pytest.mark.parametrize("spec,bound,base", _reformulated(),
                         ids=[b.label for _, b, _ in _reformulated()])
def test_reformulation_rows_equal_counted(monkeypatch, x, spec, bound, base):
    """``Reformulation.cost_of`` (no model run) equals the rows one run of the
    reformulation shows, as the validation runs it (the method's own options, orders 1-3):
    forwards and reverse sweeps of the model (the layer-wise plan's runs included),
    Taylor-mode passes and rows, and the sweeps back through them."""
    _count_plan_passes(monkeypatch)
    count = _TaylorCount(monkeypatch, 36)
    monkeypatch.setattr(SR, "propagate", T.propagate)  # the counting wrapper
    reform, orders = spec.reformulation, (1, 2, 3)
    cost = reform.cost_of(x, base, orders, bound.settings)
    assert cost is not None and cost.samples == x.shape[0], bound.label
    with torch.no_grad():
        target = count.model(x).argmax(1)
    count.warm(x)
    reform.orders(count.model, x, base, target, orders, **reform.own_options(bound.settings))
    assert (count.model.forward_rows, count.model.backward_rows, count.passes, count.rows,
            count.sweeps) == (cost.forward_rows, cost.backward_rows, cost.taylor_passes,
                              cost.taylor_rows, cost.taylor_backward_rows + cost.backward_rows), \
        bound.label
    if spec.name in ("shapley", "integrated_gradients"):
        assert cost.taylor_passes > 0 and cost.order == 3
    if base == 0.0:  # the validation's estimate is this hook
        assert reformulation_cost(bound, x, orders) == cost


def test_every_reformulation_counts_or_is_declared_not_counted(x):
    """A reformulation registered later without a ``cost`` fails here unless it is named
    in :data:`REFORMULATIONS_NOT_COUNTED` (and the estimates then name it as not counted)."""
    with_reform = {name for name, spec in METHODS.items() if spec.reformulation is not None}
    assert {"gradient_input", "occlusion_1", "occlusion_patch", "deeplift", "epsilon_lrp",
            "integrated_gradients", "expected_gradients", "gradient_shap", "smoothgrad_ig",
            "shapley"} <= with_reform
    not_counted = {n for n in with_reform if METHODS[n].reformulation.cost is None}
    assert not_counted == set(REFORMULATIONS_NOT_COUNTED), not_counted
    counted = {spec.name for spec, bound, base in _reformulated()
               if spec.reformulation.cost_of(x, base, (2,), bound.settings) is not None}
    assert counted == with_reform - not_counted
    # the layer-wise counts say what they leave out
    assert "not counted" in " ".join(METHODS["deeplift"].reformulation.cost_of(x, 0.0, (2,)).notes)


@pytest.mark.parametrize("kwargs, name", [({"probe_seconds": -1}, "probe_seconds"),
                                          ({"probe_seconds": float("nan")}, "probe_seconds"),
                                          ({"probe_seconds": True}, "probe_seconds"),
                                          ({"max_rows": 0}, "max_rows"),
                                          ({"probe_rows": 0}, "probe_rows")])
def test_measure_rates_names_bad_arguments(x, kwargs, name):
    with pytest.raises((TypeError, ValueError), match=name):
        measure_rates(_model(), x, **kwargs)


def test_measure_rates_probes_at_the_stage_call_size(x, monkeypatch):
    """Without probe_rows the probe runs at the automatic chunk size (the rows per call
    the stage's passes use; batching.chunk_rows, computed here), capped by max_rows."""
    import taylorattr.runtime.cost as C

    # the automatic chunk is chosen by timing, which varies under load: fix it, so the
    # test sees which size the probe used
    seen = []

    def chunk_rows(model, rows, backward):
        seen.append((rows.shape, backward))
        return 37

    monkeypatch.setattr(C, "chunk_rows", chunk_rows)
    model = _model()
    assert measure_rates(model, x, backward=False, probe_seconds=60).probe_rows == 37
    assert seen and seen[0] == (x[:1].shape, False)  # asked for the stage's own rows
    assert measure_rates(model, x, backward=False, max_rows=3).probe_rows == 3
