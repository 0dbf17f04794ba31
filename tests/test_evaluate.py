"""evaluate and attribute_dataset on one process, against slow obvious routes: float64
autograd Gradient*Input, infidelity by enumerating every square removal, bbox accuracy
by sorting, numpy mean and standard error; bad items, resume, manifest and lock."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from taylorattr import _io, cli
from taylorattr.experiments.evaluate import attribute_dataset, evaluate, resolve_methods
from taylorattr.experiments.evaluation.items import TensorItems
from taylorattr.experiments.evaluation.lock import LOCK_NAME, JobLock, LockHeld
from taylorattr.experiments.evaluation.sharding import sample_seed
from taylorattr.models import Square
from taylorattr.registry import METHODS

H = W = 5
MAX_SIDE = 2


def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(H * W, 6), Square(), nn.Linear(6, 3)).double()


def _data(n=7, masks=False):
    g = torch.Generator().manual_seed(2)
    x = torch.rand(n, 1, H, W, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    m = None
    if masks:
        m = torch.zeros(n, H, W, dtype=torch.bool)
        for i in range(n):
            r, c = int(torch.randint(0, 3, (1,), generator=g)), int(torch.randint(0, 3, (1,), generator=g))
            m[i, r:r + 2, c:c + 3] = True
    return TensorItems(x, y, m)


def _gi(model, x, t):
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model(x[None])[0, t], x)
    return (x * g).detach()


@torch.no_grad()
def _infidelity_slow(model, x, a, t):
    f0 = float(model(x[None])[0, t])
    pred, true = [], []
    for s in range(1, MAX_SIDE + 1):
        for i in range(H - s + 1):
            for j in range(W - s + 1):
                xk = x.clone()
                xk[:, i:i + s, j:j + s] = 0.0
                pred.append(float(a[:, i:i + s, j:j + s].sum()))
                true.append(f0 - float(model(xk[None])[0, t]))
    p, q = np.array(pred), np.array(true)
    beta = (p * q).sum() / (p * p).sum()
    return float(np.mean((beta * p - q) ** 2))


def _bbox_slow(a, mask):
    r = a.sum(0).flatten().cpu().numpy()
    m = mask.flatten().cpu().numpy()
    n = int(m.sum())
    return float(m[np.argsort(-r, kind="stable")[:n]].sum() / n)


def _scores(out):
    return {(int(r["index"]), r["method"], r["metric"]): float(r["value"])
            for r in _io.load_csv(out / "scores.csv")}


def test_scores_and_summary_match_slow_routes(tmp_path):
    model, ds = _model(), _data(masks=True)
    rep = evaluate(model, ds, ["gradient_input"], ["infidelity", "bbox"], out=tmp_path,
                      batch_size=3, infidelity_options={"max_side": MAX_SIDE})
    assert (rep.n_units, rep.computed, rep.reused) == (3, 7, 0)  # 7 items, units of 3
    got = _scores(tmp_path)
    infd, bbox = [], []
    for i in range(len(ds)):
        x, t, m = ds[i]
        a = _gi(model, x, t)
        infd.append(_infidelity_slow(model, x, a, t))
        bbox.append(_bbox_slow(a, m))
        assert got[(i, "GI", "infidelity")] == pytest.approx(infd[-1], rel=1e-9, abs=1e-15)
        assert got[(i, "GI", "bbox")] == pytest.approx(bbox[-1], abs=1e-12)
    summary = {(s["method"], s["metric"]): s for s in _io.load_json(tmp_path / "summary.json")["summary"]}
    for name, v in (("infidelity", infd), ("bbox", bbox)):
        s = summary[("GI", name)]
        assert s["n"] == len(ds)
        assert s["mean"] == pytest.approx(np.mean(v), rel=1e-9)
        assert s["sem"] == pytest.approx(np.std(v, ddof=1) / np.sqrt(len(v)), rel=1e-9)


def test_per_sample_seeds_make_scores_independent_of_batching(tmp_path):
    model, ds = _model(), _data(5)
    opts = {"max_side": MAX_SIDE}
    evaluate(model, ds, ["EG"], out=tmp_path / "b1", batch_size=1, seed=7,
                infidelity_options=opts)
    evaluate(model, ds, ["EG"], out=tmp_path / "b4", batch_size=4, seed=7,
                infidelity_options=opts)
    one, four = _scores(tmp_path / "b1"), _scores(tmp_path / "b4")
    eg = METHODS["expected_gradients"]
    for i in range(len(ds)):
        x, t = ds[i]
        a = eg.bind(seed=sample_seed(7, i))(model, x[None], 0.0, torch.tensor([t]))[0]
        slow = _infidelity_slow(model, x, a.detach(), t)
        assert one[(i, "EG", "infidelity")] == pytest.approx(slow, rel=1e-9, abs=1e-15)
        assert four[(i, "EG", "infidelity")] == pytest.approx(slow, rel=1e-9, abs=1e-15)


class _Broken(torch.utils.data.Dataset):
    """Item 1 has the wrong shape, item 3 cannot be read, item 4 has no box."""

    def __init__(self):
        self.base = _data(6, masks=True)

    def __len__(self):
        return 6

    def __getitem__(self, i):
        x, t, m = self.base[i]
        if i == 1:
            return x[:, :4], t, m
        if i == 3:
            raise OSError("unreadable image file img3.png")
        return (x, t) if i == 4 else (x, t, m)


def test_bad_items_are_refused_or_skipped_and_listed(tmp_path):
    model = _model()
    with pytest.raises(ValueError, match=r"dataset item 1: input has shape \(1, 4, 5\).*skip"):
        evaluate(model, _Broken(), ["GI"], ["bbox"], out=tmp_path / "r", batch_size=2)
    with pytest.warns(RuntimeWarning, match="skipped dataset item 3"):
        rep = evaluate(model, _Broken(), ["GI"], ["bbox"], out=tmp_path / "s", batch_size=2,
                          on_bad_item="skip")
    skipped = rep.merged["skipped"]
    assert [i for i, _ in skipped] == [1, 3, 4]
    assert "unreadable image" in skipped[1][1] and "no box mask" in skipped[2][1]
    got = _scores(tmp_path / "s")
    assert sorted({k[0] for k in got}) == [0, 2, 5]
    base = _data(6, masks=True)
    for i in (0, 2, 5):
        x, t, m = base[i]
        assert got[(i, "GI", "bbox")] == pytest.approx(_bbox_slow(_gi(model, x, t), m), abs=1e-12)


def test_resume_computes_only_missing_units_and_recomputes_or_refuses_changed(tmp_path):
    model, ds = _model(), _data(6)
    opts = {"max_side": MAX_SIDE}
    evaluate(model, ds, ["GI", "IG"], out=tmp_path, batch_size=2, infidelity_options=opts)
    before = (tmp_path / "scores.csv").read_bytes()
    stamps = {p.name: p.stat().st_ino for p in (tmp_path / "units").glob("*.pt")}
    (tmp_path / "units" / "unit-000001.pt").unlink()
    rep = evaluate(model, ds, ["GI", "IG"], out=tmp_path, batch_size=2, infidelity_options=opts)
    assert (rep.computed, rep.reused) == (2, 4)  # the unit's two items
    for name in ("unit-000000.pt", "unit-000002.pt"):
        assert (tmp_path / "units" / name).stat().st_ino == stamps[name]
    assert (tmp_path / "scores.csv").read_bytes() == before
    with pytest.raises(ValueError, match=r"--resume strict.*changed: seed \(6 items\)"):
        evaluate(model, ds, ["GI", "IG"], out=tmp_path, batch_size=2, seed=1,
                    infidelity_options=opts, resume="strict")
    assert (tmp_path / "units" / "unit-000000.pt").stat().st_ino == stamps["unit-000000.pt"]
    rep = evaluate(model, ds, ["GI", "IG"], out=tmp_path, batch_size=2, seed=1,
                      infidelity_options=opts)
    assert (rep.computed, rep.reused, rep.changes) == (6, 0, {"seed": 6})


def test_lock_names_holder_and_stale_lock_is_taken_over(tmp_path, capsys):
    model, ds = _model(), _data(2)
    with JobLock(tmp_path), pytest.raises(LockHeld, match=f"pid {os.getpid()} on "):
        evaluate(model, ds, ["GI"], out=tmp_path, infidelity_options={"max_side": 2})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    lock = tmp_path / LOCK_NAME
    import socket

    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "started": "x"}))
    rep = evaluate(model, ds, ["GI"], out=tmp_path, infidelity_options={"max_side": 2})
    assert rep.stale_lock["pid"] == pid and not lock.exists()
    lock.write_text(json.dumps({"host": "elsewhere", "pid": pid, "started": "x"}))
    with pytest.raises(LockHeld, match=f"pid {pid} on elsewhere.*delete"):
        evaluate(model, ds, ["GI"], out=tmp_path, infidelity_options={"max_side": 2})


def test_resolve_methods_accepts_names_and_labels():
    got = [b.label for b in resolve_methods(["integrated_gradients", "gi", "Occ-4x4", "eg"])]
    assert got == ["IG", "GI", "Occ-4x4", "EG"]
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        resolve_methods(["nope"])
    with pytest.raises(ValueError, match="once"):
        resolve_methods(["IG", "integrated_gradients"])
    with pytest.raises(ValueError, match="metrics"):
        evaluate(_model(), _data(2), ["GI"], ["accuracy"], out="unused")


def test_attribute_dataset_writes_maps_equal_to_autograd(tmp_path):
    model, ds = _model(), _data(5)
    rep = attribute_dataset(model, ds, "GI", out=tmp_path, batch_size=2, previews=True)
    assert rep.merged["n_written"] == 5
    from PIL import Image

    for i in range(5):
        saved = _io.load_tensors(tmp_path / f"{i:06d}.pt")
        x, t = ds[i]
        assert saved["index"] == i and saved["target"] == t and saved["method"] == "GI"
        # saved maps hold CPU tensors (they load without a GPU)
        torch.testing.assert_close(saved["attribution"], _gi(model, x, t).cpu(), rtol=1e-12,
                                   atol=1e-15)
        with Image.open(tmp_path / f"{i:06d}.preview.png") as im:
            assert im.size == (W, H)


def test_cli_attribute_folder_skips_unreadable_image(tmp_path, capsys):
    import torchvision as tv
    from PIL import Image

    data = tmp_path / "data" / "n01"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(2):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(data / f"a{k}.png")
    (data / "b.png").write_bytes(b"not a png")
    torch.manual_seed(0)
    weights = tmp_path / "r18.pt"
    torch.save(tv.models.resnet18(weights=None, num_classes=1000).state_dict(), weights)
    argv = ["attribute", "--data", str(tmp_path / "data"), "--model", "resnet18", "--weights",
            str(weights), "--method", "GI", "--batch-size", "2", "--out", str(tmp_path / "maps"),
            "--budget", "none"]  # the bad item is tested, not the estimate
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "dataset item 2" in err and "b.png" in err, err
    assert cli.main([*argv, "--bad-items", "skip", "--out", str(tmp_path / "maps2")]) == 0
    out = capsys.readouterr().out
    assert "2 maps (GI)" in out and "skipped 1: 2 (cannot be read" in out, out
    summary = _io.load_json(tmp_path / "maps2" / "summary.json")
    assert [i for i, _ in summary["skipped"]] == [2]


def test_scaled_infidelity_squares_match_a_slow_enumeration(tmp_path):
    """``infidelity_options={"scale": s}`` (the CLI's default for large images, side // 28):
    squares of side s, 2s, ... on a grid of step s, by enumeration; the default for 5x5
    inputs is scale 1 (Yeh et al.'s squares)."""
    from taylorattr.experiments.evaluate import infidelity_scale

    assert infidelity_scale((3, 224, 224)) == 8 and infidelity_scale((1, 28, 28)) == 1
    assert infidelity_scale((1, H, W)) == 1
    model, ds = _model(), _data(3)
    scale, sides = 2, 2  # squares 2x2 and 4x4 at even positions of the 5x5 input
    rep = evaluate(model, ds, ["GI"], out=tmp_path, batch_size=3,
                      infidelity_options={"max_side": sides, "scale": scale})
    got = _scores(tmp_path)
    for i in range(3):
        x, t = ds[i]
        a = _gi(model, x, t)
        with torch.no_grad():
            f0 = float(model(x[None])[0, t])
        pred, true = [], []
        for s in range(scale, scale * sides + 1, scale):
            for r in range(0, H - s + 1, scale):
                for c in range(0, W - s + 1, scale):
                    xk = x.clone()
                    xk[:, r:r + s, c:c + s] = 0.0
                    pred.append(float(a[:, r:r + s, c:c + s].sum()))
                    with torch.no_grad():
                        true.append(f0 - float(model(xk[None])[0, t]))
        p, q = np.array(pred), np.array(true)
        assert len(p) == 4 + 1  # four 2x2 squares and one 4x4
        beta = (p * q).sum() / (p * p).sum()
        assert got[(i, "GI", "infidelity")] == pytest.approx(float(np.mean((beta * p - q) ** 2)),
                                                            rel=1e-9, abs=1e-15)
    assert rep.computed == 3  # one unit of three items
