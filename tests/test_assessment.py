"""Tests of the assessment experiments (paper Figures 3 and 4), each against an
independent route.

Routes: the shared-forward infidelity against ``taylorattr.metrics.infidelity`` (the
pieces, and the experiment's table against direct calls on the same digits); the
first-order Taylor row against Gradient*Input (Theorem 1: the same attribution); the mask
rule against coverage counted by hand; Spearman against ``scipy.stats.spearmanr``; resume
with every compute path made to fail; the ImageNet route end to end on JPEG + XML files
written here, with random ResNet18 weights saved here, against direct bbox-accuracy calls.
Models are untrained (``epochs=0``) so the tests need no training.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from _imagenet import write_folder
from _slow import slow_square_infidelity
from torch import nn

from taylorattr import data as D
from taylorattr import models as M
from taylorattr.experiments import assessment as A
from taylorattr.experiments._units import UnitStore
from taylorattr.experiments.assessment import infidelity as AI
from taylorattr.experiments.assessment import localisation as AL
from taylorattr.experiments.assessment.stage import Stage
from taylorattr.experiments.workspace import Workspace
from taylorattr.methods import UnsupportedModelError
from taylorattr.metrics import bbox_accuracy, infidelity
from taylorattr.metrics.statistics import spearman
from taylorattr.paper_methods import principle_count
from taylorattr.registry import METHODS

COUNTS = {"GI": 0.0, "Occ-1": 1.0, "Occ-2x2": 0.0, "DL": 1.5, "IG": 2.0, "EG": 3.0}


def small_cnn(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Softplus(), nn.AvgPool2d(2), nn.Flatten(),
                        nn.Linear(3 * 5 * 5, 4))
    return net.to(dtype).eval()


# ------------------------------------------------------------------ infidelity pieces
@pytest.mark.parametrize("normalize", [True, False])
def test_shared_forward_infidelity_equals_a_slow_loop(normalize):
    """One set of removal forwards scored against many attributions gives, per method, what
    removing each square one at a time and scoring it gives."""
    model = small_cnn()
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2, 1, 12, 12, generator=gen, dtype=torch.float64)
    target = model(x).argmax(1)
    attrs = {"GI": METHODS["gradient_input"](model, x, target=target),
             "random": torch.randn(x.shape, generator=gen, dtype=torch.float64),
             "zero": torch.zeros_like(x)}
    changes = A.square_output_changes(model, x, target, 0.0, batch_size=50)
    for name, a in attrs.items():
        ours = A.infidelity_from_changes(A.square_predictions(a), changes, normalize=normalize)
        # a zero attribution predicts 0 whatever beta is: score it with beta = 1
        with torch.no_grad():
            ref = slow_square_infidelity(model, x, a, target, torch.zeros_like(x), 10,
                                         normalize and name != "zero")
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12, msg=name)


def test_square_predictions_slow_loop():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(2, 2, 7, 6, generator=gen, dtype=torch.float64)
    pred = A.square_predictions(a, max_side=3)
    k = 0
    for s in range(1, 4):
        for top in range(7 - s + 1):
            for left in range(6 - s + 1):
                torch.testing.assert_close(pred[:, k], a[:, :, top:top + s, left:left + s]
                                           .sum((1, 2, 3)))
                k += 1
    assert pred.shape[1] == k


# ------------------------------------------------------------------ pure helpers
def test_principle_count():
    assert principle_count({1: "follows", 2: "partially", 3: "does not"}) == 1.5
    assert principle_count(["follows"] * 3) == 3.0
    assert principle_count(["does not"] * 3) == 0.0
    with pytest.raises(ValueError, match="unknown verdict"):
        principle_count(["yes"])


def test_spearman_equals_scipy():
    rng = np.random.default_rng(0)
    cases = [([0, 0.5, 0.5, 1, 2, 3], [3.1, 2.0, 2.5, 1.0, 0.5, 0.1]),
             ([0, 1, 0, 1.5, 2, 3], [0.2, 0.2, 0.9, 0.4, 0.4, 0.4]),
             (list(rng.integers(0, 4, 20) / 2), list(rng.normal(size=20)))]
    for x, y in cases:
        assert spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic,
                                                 abs=1e-12)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1], [2]))


def test_mask_exclusion_matches_hand_count():
    h, w = 10, 10
    areas = [0, 1, 20, 33, 34, 50, 100]  # 33 pixels = exactly 33%: kept; 34: excluded
    masks = torch.zeros(len(areas), h, w, dtype=torch.bool)
    for i, n in enumerate(areas):
        masks.view(len(areas), -1)[i, torch.randperm(h * w)[:n]] = True
    by_hand = [0 < n and n / (h * w) <= 0.33 for n in areas]
    assert A.keep_by_coverage(masks).tolist() == by_hand
    torch.testing.assert_close(A.mask_coverage(masks),
                               torch.tensor(areas, dtype=torch.float64) / 100)
    idx, excluded = AL._select(masks, 2)  # the first two kept: areas 1 and 20, after area 0
    assert idx.tolist() == [1, 2] and excluded == 1
    idx, excluded = AL._select(masks, 10)
    assert idx.tolist() == [1, 2, 3] and excluded == 1


def test_measured_counts_from_audit_rows(monkeypatch, tmp_path):
    import taylorattr.principles as P

    verdicts = {"gradient_input": ("does not",) * 3,
                "occlusion_1": ("partially", "partially", "does not"),
                "occlusion_patch": ("does not", "partially", "does not"),
                "deeplift": ("follows", "partially", "does not"),
                "integrated_gradients": ("follows", "follows", "does not"),
                "expected_gradients": ("follows",) * 3}
    calls = []

    def fake_table(methods=None, seed=0):
        calls.append(list(methods))
        return [{"method": m, **{f"verdict_{p}": verdicts[m][p - 1] for p in (1, 2, 3)},
                 **{f"score_{p}": 0.5 for p in (1, 2, 3)}} for m in methods]

    monkeypatch.setattr(P, "principles_table", fake_table)
    store = UnitStore(tmp_path)
    methods = A.assessment_methods(0, labels=("GI", "Occ-1", "Occ-2x2", "DL", "IG", "EG"))
    counts, rows = A.measured_principle_counts(methods, 0, store)
    assert counts == {"GI": 0.0, "Occ-1": 1.0, "Occ-2x2": 0.5, "DL": 1.5, "IG": 2.0, "EG": 3.0}
    assert [r["principles_paper"] for r in rows] == [0.0, 0.5, 0.5, 1.0, 2.0, 3.0]
    assert A.measured_principle_counts(methods, 0, store)[0] == counts  # cached: no second audit
    assert len(calls) == 6  # one audit per method, none on the second call


# ------------------------------------------------------------------ the MNIST route, resume
RUN = {"n_samples": 2, "batch_size": 1,
       "principle_counts": COUNTS, "method_kwargs": {"IG": {"n_steps": 8}, "EG": {"n_samples": 4}},
       "models": {"infidelity": ("m_sg",), "taylor_order": ("m_sg",), "bbox": ("loc_c_sp",)}}


METHODS_RUN = ("GI", "DL", "IG", "EG")


def _ws(out):
    """An untrained (epochs=0), quiet workspace."""
    return Workspace(out, epochs=0, progress=False)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("assess")
    result = A.run_assessment(_ws(out), methods=METHODS_RUN, **RUN)
    return out, result


def test_tables_and_files(first_run):
    out, r = first_run
    assert {(row["model"], row["method"]) for row in r.infidelity} == {
        ("M-sg", m) for m in METHODS_RUN}
    assert all(row["n"] == 2 and row["infidelity"] >= 0 for row in r.infidelity)
    assert [row["principles"] for row in r.bbox] == [COUNTS[m] for m in METHODS_RUN]
    assert all(row["n_excluded"] == 0 for row in r.bbox)  # boxes cover <= 19% of a canvas
    assert {c["experiment"] for c in r.correlations} == {"infidelity", "bbox"}
    for name in ("assessment.json", "infidelity.csv", "taylor_order.csv", "bbox.csv",
                 "correlations.csv", "figure3_infidelity.png", "figure4_bbox_accuracy.png"):
        assert (out / "assessment" / name).stat().st_size > 0
    text = A.format_assessment(r)
    assert "0.27" in text and "0.48" in text and "negative" in text and "positive" in text


def test_correlations_equal_scipy_all_and_point_baselines(first_run):
    _, r = first_run
    for c in r.correlations:
        metric = c["metric"]
        rows = [row for row in getattr(r, c["experiment"]) if row["model"] == c["model"]]
        for key, kept in (("spearman", rows),
                          ("spearman_point_baselines",
                           [row for row in rows if row["method"] != "EG"])):
            expected = scipy.stats.spearmanr([row["principles"] for row in kept],
                                             [row[metric] for row in kept]).statistic
            assert c[key] == pytest.approx(expected, abs=1e-12, nan_ok=True), (c, key)


def test_infidelity_row_equals_direct_metric(first_run):
    """The experiment's infidelity = the slow square-by-square infidelity (tests/_slow.py)
    of the same attributions on the same digits and model."""
    out, r = first_run
    model, _ = M.get_trained("m_sg", out, epochs=0, quick=True, show_progress=False)
    images, labels = D.load_mnist()  # read on the CPU: the digits go to the model's device
    x = D.mnist_split(images, labels, seed=0).held_images[:2].to(M.model_device(model))
    target = model(x).argmax(1)
    for label, name, kw in (("GI", "gradient_input", {}), ("IG", "integrated_gradients",
                                                            {"n_steps": 8, "baselines": 0.0})):
        a = METHODS[name](model, x, target=target, **kw)
        with torch.no_grad():
            direct = slow_square_infidelity(model, x, a, target, torch.zeros_like(x), 10,
                                            True).mean()
        row = next(row for row in r.infidelity if row["method"] == label)
        assert row["infidelity"] == pytest.approx(float(direct), rel=1e-5)


def test_first_order_taylor_row_equals_gradient_input(first_run):
    _, r = first_run
    k1 = next(row for row in r.taylor_order if row["order"] == 1)
    gi = next(row for row in r.infidelity if row["method"] == "GI")
    assert k1["infidelity"] == pytest.approx(gi["infidelity"], rel=1e-4)
    assert {row["order"] for row in r.taylor_order} == {1, 2}


def test_bbox_row_equals_direct_metric(first_run):
    out, r = first_run
    model, _ = M.get_trained("loc_c_sp", out, epochs=0, quick=True, show_progress=False)
    images, labels = D.load_mnist()
    split = D.mnist_split(images, labels, seed=0)
    canv = D.cluttered_mnist(split.held_images, split.held_labels, M.N_CLUTTERED_HELD, seed=1)
    x, masks = canv.images[:2].to(M.model_device(model)), canv.masks[:2].to(M.model_device(model))
    target = model(x).argmax(1)
    a = METHODS["gradient_input"](model, x, target=target)
    row = next(row for row in r.bbox if row["method"] == "GI")
    # the share of the n best pixels (channel sums) inside the n-pixel box, ties at the cut
    # counted at their expected share, written out per sample
    scores = []
    for rel, box in zip(a.sum(1).flatten(1), masks.reshape(masks.shape[0], -1).bool()):
        n = int(box.sum())
        cut = rel.sort(descending=True).values[n - 1]
        above, tied = rel > cut, rel == cut
        free = n - int(above.sum())
        scores.append((float((above & box).sum()) + free * float((tied & box).sum())
                       / float(tied.sum())) / n)
    assert row["bbox_accuracy"] == pytest.approx(sum(scores) / len(scores), rel=1e-6)


def test_resume_computes_nothing_new(first_run, monkeypatch):
    out, r = first_run

    def fail(*args, **kwargs):
        raise AssertionError("a finished unit was computed again")

    import taylorattr.methods.taylor_attribution as TA
    import taylorattr.taylor

    monkeypatch.setattr(Stage, "attribute", fail)
    monkeypatch.setattr(AI, "square_output_changes", fail)
    monkeypatch.setattr(taylorattr.taylor.terms, "taylor_attribution", fail)
    monkeypatch.setattr(TA, "taylor_attribution", fail)
    monkeypatch.setattr(AL, "bbox_accuracy", fail)
    again = A.run_assessment(_ws(out), methods=METHODS_RUN, **RUN)
    for name in ("infidelity", "taylor_order", "bbox", "correlations", "principles"):
        assert getattr(again, name) == getattr(r, name), name


def test_interrupted_run_resumes(tmp_path, monkeypatch):
    """A run killed after some units picks up where it stopped."""
    real = Stage.attribute
    calls = []

    def flaky(*args, **kwargs):
        calls.append(args[0].label)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(Stage, "attribute", staticmethod(flaky))
    kw = {**RUN, "models": {"infidelity": ("m_sg",)}}
    with pytest.raises(KeyboardInterrupt):
        A.run_assessment(_ws(tmp_path), experiments=("infidelity",), methods=("GI", "IG"), **kw)
    calls.clear()
    r = A.run_assessment(_ws(tmp_path), experiments=("infidelity",), methods=("GI", "IG"), **kw)
    assert len(calls) == 2  # units (GI, batch 1) and (IG, batch 1); batch 0 was stored
    assert all(row["n"] == 2 for row in r.infidelity)


def test_arguments_are_checked(tmp_path):
    ws = _ws(tmp_path)
    with pytest.raises(ValueError, match="experiments"):
        A.run_assessment(ws, experiments=("nope",))
    with pytest.raises(ValueError, match="methods"):
        A.run_assessment(ws, methods=("LRP",))
    with pytest.raises(ValueError, match="methods"):
        A.run_assessment(ws, method_kwargs={"LRP": {}})
    with pytest.raises(ValueError, match="weights"):
        A.ImagenetRoute(tmp_path, {})
    with pytest.raises(ValueError, match="weights names"):
        A.ImagenetRoute(tmp_path, {"alexnet": tmp_path})
    with pytest.raises(TypeError, match="imagenet"):
        A.run_assessment(ws, imagenet=tmp_path)
    with pytest.raises(ValueError, match="lacks"):
        A.run_assessment(ws, experiments=("infidelity",), principle_counts={"GI": 0})


# ------------------------------------------------------------------ the ImageNet route
def test_imagenet_route_end_to_end(tmp_path):
    folder = write_folder(tmp_path / "val", [
        ("a", "n01440764", (5, 6, 20, 18)),     # small box: kept
        ("b", "n01443537", (1, 1, 48, 40)),     # whole image: excluded
        ("c", "n01440764", (30, 20, 44, 36))],  # small box: kept
        width=48, height=40)
    import torchvision

    torch.manual_seed(0)
    weights = tmp_path / "resnet18.pt"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)

    r = A.run_assessment(_ws(tmp_path / "out"), experiments=("bbox",), models={"bbox": ()},
                         methods=("GI", "DL", "IG"), method_kwargs={"IG": {"n_steps": 4}},
                         n_samples=5, batch_size=2, principle_counts=COUNTS,
                         imagenet=A.ImagenetRoute(folder, {"resnet18": weights}, (20, 16)))
    rows = {row["method"]: row for row in r.bbox}
    assert set(rows) == {"GI", "DL", "IG"}
    assert all(row["model"] == "ResNet18" and row["n_excluded"] == 1 for row in rows.values())
    model = M.torchvision_model("resnet18", weights)
    try:
        METHODS["deeplift"].build(model)
    except UnsupportedModelError:  # recorded as unsupported, never replaced by something else
        assert rows["DL"]["bbox_accuracy"] is None
        assert "UnsupportedModelError" in rows["DL"]["note"]
    else:
        assert rows["DL"]["bbox_accuracy"] is not None and rows["DL"]["note"] == ""

    # independent route: the dataset, the model and the metric called directly
    ds = D.ImageFolderWithBoxes(folder, size=16, resize=20)
    items = [ds[i] for i in range(len(ds))]
    cover = [float(m.float().mean()) for _, m, _, _ in items]
    assert [c <= 0.33 for c in cover] == [True, False, True]
    x = torch.stack([items[i][0] for i in (0, 2)]).to(M.model_device(model))  # read on the CPU
    masks = torch.stack([items[i][1] for i in (0, 2)]).to(x.device)
    target = model(x).argmax(1)
    mean = torch.tensor(D.IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(D.IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    for label, name, kw in (("GI", "gradient_input", {}),
                            ("IG", "integrated_gradients",
                             {"baselines": -mean / std, "n_steps": 4})):
        a = METHODS[name](model, x, target=target, **kw)
        assert rows[label]["n"] == 2
        assert rows[label]["bbox_accuracy"] == pytest.approx(
            float(bbox_accuracy(a.double(), masks).mean()), rel=1e-5)
    assert (tmp_path / "out" / "assessment" / "figure4_bbox_accuracy.png").stat().st_size > 0


def test_cli_passes_the_imagenet_route_through(tmp_path, monkeypatch):
    from taylorattr import cli

    weights = tmp_path / "vgg16.pt"
    weights.write_bytes(b"")
    seen = {}

    def fake_run(ws, **kw):
        seen.update(kw, out=ws.out)
        return A.AssessmentResult()

    monkeypatch.setattr(A, "run_assessment", fake_run)
    monkeypatch.setattr(A, "format_assessment", lambda result: "table")
    assert cli.main(["assess", "--experiment", "bbox", "--imagenet-dir", str(tmp_path),
                     "--weights", f"vgg16={weights}", "--out", str(tmp_path / "out"),
                     "--budget", "none"]) == 0
    route = seen["imagenet"]
    assert route.root == tmp_path and dict(route.weights) == {"vgg16": weights}
    assert seen["out"] == tmp_path / "out"
    assert seen["experiments"] == ("bbox",)


def test_taylor_orders_compared_by_a_paired_test(first_run):
    """The report words the order comparison by the Wilcoxon signed-rank test on the same
    digits (scipy.stats.wilcoxon, exact, is the independent route), not by two means."""
    out, r = first_run
    import json

    saved = json.loads((out / "assessment" / "assessment.json").read_text())
    assert saved["taylor_tests"] == r.taylor_tests and len(r.taylor_tests) == 1
    t = r.taylor_tests[0]
    assert (t["order"], t["against"], t["n"]) == (2, 1, 2)
    assert "p = " in t["statement"] and t["statement"] in A.format_assessment(r)
    assert "not lower" not in A.format_assessment(r)
    # the same per-digit infidelities by direct calls, and scipy's exact Wilcoxon p-value
    from taylorattr.taylor.terms import taylor_attribution

    model, _ = M.get_trained("m_sg", out, epochs=0, quick=True, show_progress=False)
    x = D.mnist_split(*D.load_mnist(), seed=0).held_images[:2].to(M.model_device(model))
    target = model(x).argmax(1)
    v = {k: infidelity(model, x, taylor_attribution(model, x, 0.0, target, k), target=target)
         for k in (1, 2)}
    expected = scipy.stats.wilcoxon(v[2].cpu().numpy(), v[1].cpu().numpy(), method="exact").pvalue
    assert t["p_value"] == pytest.approx(expected, rel=1e-9)


def test_a_method_the_audit_cannot_run_has_no_count():
    """Grad-CAM needs a convolution, which the probes lack: its row says why and carries no
    count (the correlations leave it out); the other methods keep their audited counts."""
    methods = A.assessment_methods(0, labels=("GI", "Grad-CAM"))
    counts, rows = A.measured_principle_counts(methods, 0)
    assert counts["Grad-CAM"] is None and counts["GI"] == 0.0
    row = next(r for r in rows if r["method"] == "Grad-CAM")
    assert "convolution" in row["note"] and row["verdict_1"] == "n/a"
    from taylorattr.experiments.assessment.ranking import correlation_rows

    table = [{"model": "m", "method": "GI", "principles": 0.0, "principles_paper": 0.0, "v": 1.0},
             {"model": "m", "method": "Grad-CAM", "principles": None, "principles_paper": None,
              "v": 2.0}]
    assert correlation_rows(table, "infidelity", "v", {"GI"})[0]["n_methods"] == 1
