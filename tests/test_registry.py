"""The method registry (issue 12): one file and one registration make a method appear in
the audit, the validation table, the assessment and the saliency grid (a variant naming the
paper's experiments, the application's public :data:`~taylorattr.paper_methods.EXPERIMENTS`);
the library's registry holds no paper facts (issue 37); typed baselines;
``bind`` resolves settings the documented way.

Independent routes: a toy method, Gradient*Input halved, must give exactly half of
Gradient*Input wherever it appears (its maps, its reformulation), the same infidelity as
Gradient*Input (infidelity with the optimal beta is invariant to scaling the attribution)
and a validation percentage change of 0 (its reformulation is exact); Expected Gradients
with ``Noise(s, around=c)`` equals the integral written out by hand with the same draws.
"""
from __future__ import annotations

import pytest
import torch
from _builders import DT
from conftest import device_tolerance

import taylorattr as ta
from taylorattr import models, principles, registry
from taylorattr.baselines import Noise, Point, ReferenceSet
from taylorattr.experiments import assessment as A
from taylorattr.experiments.saliency import saliency_maps, saliency_methods
from taylorattr.experiments.validation import run_validation, validation_methods
from taylorattr.experiments.workspace import Workspace
from taylorattr.methods import ImplicitBaselineMethod
from taylorattr.methods._passes import target_gradient
from taylorattr.methods.reformulations import Reformulation
from taylorattr.paper_methods import EXPERIMENTS, MARKERS, PAPER, TABLE3, marker
from taylorattr.taylor.terms import taylor_attribution


# ---- the toy method: this class and the one register() call below are all it takes ----
# (its variant names the paper's experiments, as a user's own method would)
class HalvedGI(ImplicitBaselineMethod):
    """``a = x * grad f(x) / 2``."""

    name = "halved_gi"

    def _attribute(self, call, x, baselines, target, fx, *, show_progress=False):
        grad, _ = target_gradient(call.model, x.clone(), target)
        return x * grad / 2, torch.zeros_like(x).unsqueeze(1)


def _halved_reformulation(model, inputs, baselines, target, orders):
    return {K: taylor_attribution(model, inputs, 0.0, target, 1) / 2 for K in orders}


@pytest.fixture
def toy():
    spec = registry.register(registry.MethodSpec(
        "halved_gi", HalvedGI, variants=(registry.Variant("GI/2", experiments=EXPERIMENTS),),
        reformulation=Reformulation(_halved_reformulation, claim="half of Theorem 1")))
    yield spec
    registry.unregister("halved_gi")


def _cnn():
    torch.manual_seed(0)
    return models.c_sg().to(DT).eval()


def test_a_registered_method_reaches_every_experiment(toy, tmp_path):
    model = _cnn()
    x = torch.rand(2, 1, 28, 28, dtype=DT)
    gi = ta.GradientInput(model).attribute(x)
    # the library's entry points
    torch.testing.assert_close(ta.METHODS["halved_gi"](model, x), gi / 2)
    torch.testing.assert_close(ta.reformulate("halved_gi", model, x), gi / 2)
    # the audit: it is in the default table, and principle 1 (completeness) sees the halving
    from taylorattr.principles.auditing import _audited

    assert "halved_gi" in [spec.name for spec, _ in _audited()]
    rows = {r["method"]: r for r in principles.principles_table(
        methods=["halved_gi", "gradient_input"], seed=0)}
    assert rows["halved_gi"]["paper_1"] is None
    assert rows["halved_gi"]["score_1"] != rows["gradient_input"]["score_1"]
    # saliency: half of GI's map
    maps, _ = saliency_maps(model, x[:1], 3, saliency_methods(patch=4, steps=4, samples=2))
    torch.testing.assert_close(maps["GI/2"], maps["GI"] / 2)
    # validation: its reformulation is exact, so the percentage change is 0
    ws = Workspace(tmp_path, epochs=0, progress=False)
    assert "GI/2" in [m.label for m in validation_methods()]
    v = run_validation(ws, models=("poly",), orders=(2,), n_samples=2, batch_size=2)
    row = next(r for r in v.rows if r["method"] == "GI/2")
    # exactly 0 on the CPU; on CUDA the method and its reformulation reduce in other orders
    assert row["percentage_change"] == pytest.approx(
        0.0, abs=device_tolerance(0.0, 1e-20)["atol"]) and row["paper"] is None
    # assessment: infidelity with the optimal beta does not see the factor 1/2
    r = A.run_assessment(ws, experiments=("infidelity",), n_samples=2, batch_size=2,
                         models={"infidelity": ("m_sg",)}, methods=("GI", "GI/2"),
                         principle_counts={"GI": 0.0, "GI/2": 0.0}, plots=False)
    inf = {row["method"]: row["infidelity"] for row in r.infidelity}
    assert inf["GI/2"] == pytest.approx(inf["GI"], rel=1e-6)


def test_the_library_registry_holds_no_paper_facts():
    """The library's rows carry no verdicts, Table 3 numbers, markers or experiments: in a
    process that never imports the application, every variant takes part in no experiment
    and the library imports no module of the application (lint-imports checks the same
    statically); the application's table then tags exactly the paper's variants."""
    import subprocess
    import sys

    code = ("import sys, taylorattr.registry as r\n"
            "app = ('experiments', 'principles', 'reporting', 'cli', 'models', 'data', "
            "'paper_methods')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[1:2] and m.split('.')[1] in app"
            " and m.startswith('taylorattr.')))\n"
            "print(sum(len(v.experiments) for s in r.METHODS.values() for v in s.variants))\n"
            "print(sorted(f for f in r.MethodSpec.__dataclass_fields__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "[]" and out[1] == "0"
    assert not {"paper", "marker", "table3"} & set(eval(out[2]))
    # in this process the application is loaded: its facts sit in its own tables
    assert set(PAPER) <= set(ta.METHODS) and set(MARKERS) <= set(ta.METHODS) | {"halved_gi"}
    assert marker("gradient_input") == "o" and marker("no_such_method") == "o"
    labels = {s.bind(v).label for s in ta.METHODS.values() for v in s.variants}
    assert set(TABLE3) <= labels and TABLE3["IG"]["C-sg"] == 40.29


def test_register_refuses_duplicates_and_non_specs(toy):
    with pytest.raises(ValueError, match="registered already"):
        registry.register(toy)
    with pytest.raises(TypeError, match="spec"):
        registry.register("halved_gi")
    with pytest.raises(TypeError, match="cls"):
        registry.MethodSpec("x", int)
    with pytest.raises(ValueError, match="name"):
        registry.unregister("no_such_method")


def test_bind_precedence_and_labels():
    occ = ta.METHODS["occlusion_patch"]
    assert occ.bind().label == "Occ-2x2"
    assert occ.bind(context={"patch": 4, "n_steps": 7}).label == "Occ-4x4"  # n_steps: not its
    assert occ.bind(context={"patch": 4}, patch=3).settings["patch"] == 3
    assert ta.METHODS["occlusion_1"].bind(context={"patch": 4}).settings["patch"] == 1  # pinned
    with pytest.raises(ValueError, match="fixes patch=1"):
        ta.METHODS["occlusion_1"].bind(patch=2)
    with pytest.raises(TypeError, match="unexpected setting"):
        ta.METHODS["integrated_gradients"].bind(n_step=3)
    with pytest.raises(ValueError, match="variant"):
        occ.bind("Occ-9x9")


def test_baselines_follow_the_method_kind():
    model = _cnn()
    x = torch.rand(2, 1, 28, 28, dtype=DT)
    t = torch.tensor([1, 2])
    ig = ta.METHODS["integrated_gradients"].bind(n_steps=8)
    torch.testing.assert_close(ig(model, x, Point(0.3), t), ig(model, x, 0.3, t))
    with pytest.raises(TypeError, match="point baseline"):
        ig(model, x, Noise(0.1), t)
    gi = ta.METHODS["gradient_input"].bind()  # implicit zero: the experiment's point is unused
    torch.testing.assert_close(gi(model, x, Point(0.3), t), gi(model, x, Point(0.0), t))
    with pytest.raises(TypeError, match="point baseline"):
        ta.IntegratedGradients(model).attribute(x, ReferenceSet(x))


def test_noise_around_a_point_equals_the_draws_by_hand():
    """EG with Noise(s, around=c): references c + s * eps, eps from the seeded generator
    (then the path positions), and a = mean_k (x - x~_k) * grad f(x~_k + alpha_k (x - x~_k))."""
    model = _cnn()
    x = torch.rand(2, 1, 28, 28, dtype=DT)
    t = torch.tensor([1, 2])
    n, s, c = 4, 0.3, 0.1
    eg = ta.METHODS["expected_gradients"].bind(baselines=Noise(s, around=c), noise_std=None,
                                               n_samples=n, seed=7)
    ours = eg(model, x, Point(0.0), t)
    gen = torch.Generator().manual_seed(7)
    eps = torch.randn((2, n, 1, 28, 28), generator=gen, dtype=DT)
    alphas = torch.rand((2, n), generator=gen, dtype=DT)
    total = torch.zeros_like(x)
    for b in range(2):
        for k in range(n):
            ref = c + s * eps[b, k]
            point = (ref + alphas[b, k] * (x[b] - ref)).unsqueeze(0).requires_grad_(True)
            (g,) = torch.autograd.grad(model(point)[0, t[b]], point)
            total[b] += (x[b] - ref) * g[0]
    torch.testing.assert_close(ours, total / n)
    with pytest.raises(ValueError, match="around"):
        Noise(0.1, around="baseline")
    with pytest.raises(ValueError, match="std"):
        Noise(0.0)
