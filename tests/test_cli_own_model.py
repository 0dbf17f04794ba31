"""Your own model and data on the command line (issue 28): ``--model
package.module:callable`` with ``--weights`` and the same network as a ``torch.export``
``.pt2`` program give the maps of a hand-written float64 Gradient*Input on the same
preprocessed image; ``--labels`` decides what a class folder means (a mismatch refused
with the names listed; matching labels give the labelled indices; none: the predicted
class, said so)."""
from __future__ import annotations

import copy
import csv
import re

import numpy as np
import pytest
import torch
from _user_model import (
    PIXEL_MEAN,
    PIXEL_STD,
    run,
    small_cnn,
    write_package,
    write_photo,
    write_program,
    write_weights,
)

from taylorattr import cli
from taylorattr.data import imagenet_transform, load_image


@pytest.fixture
def user(tmp_path, monkeypatch):
    write_package(tmp_path)
    net = write_weights(tmp_path / "w.pt", seed=3)
    write_program(net, tmp_path / "net.pt2")
    write_photo(tmp_path / "photo.png", seed=7, size=20)
    for i, name in enumerate(["cat/a.png", "cat/b.png", "dog/c.png"]):
        write_photo(tmp_path / "data" / name, seed=20 + i)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def gradient_input_by_hand(net, x: torch.Tensor, target: int) -> torch.Tensor:
    """sum_c x * d f_t / d x in float64 on the CPU (baseline 0), where the maps are loaded."""
    net = copy.deepcopy(net).double().cpu()
    x = x.double().cpu().requires_grad_(True)
    (grad,) = torch.autograd.grad(net(x)[0, target], x)
    return (x * grad)[0].sum(0).detach()


def test_callable_and_program_give_the_library_maps(user):
    """A real process for the callable (a user's first run), the .pt2 in this process."""
    torch.manual_seed(3)
    net = small_cnn().eval()
    x = imagenet_transform(load_image(user / "photo.png"), 16, 16, PIXEL_MEAN,
                           PIXEL_STD)[None]
    target = int(net(x.to(next(net.parameters()).device)).argmax(1))
    expected = gradient_input_by_hand(net, x, target)
    common = ["--methods", "gi", "--save-maps", "--format", "npy", "--input-size", "16",
              "--resize", "16", "--beta", "0", "--budget", "none"]
    proc = run(["explain", "photo.png", "--model", "mypkg.nets:small_cnn", "--weights", "w.pt",
                *common, "--out", "own"], user)
    assert proc.returncode == 0, proc.stderr
    # no class names: the index alone (not "1 1"), and the real count of classes
    assert re.search(rf"%\s+{target}  <- explained", proc.stdout), proc.stdout
    assert proc.stdout.startswith("top-3 classes:"), proc.stdout
    assert cli.main(["explain", "photo.png", "--model", "net.pt2", *common,
                     "--out", "program"]) == 0
    for folder in ("own", "program"):
        got = torch.from_numpy(np.load(user / folder / "photo-maps" / "gi.npy"))
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)


def index_rows(out):
    with open(out / "index.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_labels_decide_what_a_class_folder_means(user, capsys):
    argv = ["attribute", "--data", "data", "--model", "mypkg.nets:small_cnn", "--weights",
            "w.pt", "--method", "GI", "--input-size", "16", "--resize", "16",
            "--budget", "none"]
    (user / "wrong.txt").write_text("bird\nfish\ncat\n")
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--labels", "wrong.txt", "--out", "o1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--labels" in err and "dog" in err and "bird, fish, cat" in err, err
    assert not (user / "o1").exists()

    (user / "labels.txt").write_text("dog\nbird\ncat\n")
    assert cli.main(argv + ["--labels", "labels.txt", "--out", "o2"]) == 0
    rows = index_rows(user / "o2")
    assert [(r["source"], int(r["target"]), r["explained"]) for r in rows] == [
        ("cat/a.png", 2, "label"), ("cat/b.png", 2, "label"), ("dog/c.png", 0, "label")]
    assert rows[0]["map"] == "cat/a.png.pt" and (user / "o2" / rows[0]["map"]).is_file()

    assert cli.main(argv + ["--out", "o3", "--format", "npy"]) == 0
    err = capsys.readouterr().err
    assert "no --labels" in err and "predicted class" in err
    torch.manual_seed(3)
    net = small_cnn().eval()
    for r in index_rows(user / "o3"):
        x = imagenet_transform(load_image(user / "data" / r["source"]), 16, 16,
                               PIXEL_MEAN, PIXEL_STD)[None]
        pred = int(net(x.to(next(net.parameters()).device)).argmax(1))
        assert r["explained"] == "predicted" and int(r["target"]) == pred
        got = torch.from_numpy(np.load(user / "o3" / r["map"]))
        expected = gradient_input_by_hand(net, x, int(r["target"]))
        torch.testing.assert_close(got.sum(0).double(), expected, rtol=1e-4, atol=1e-6)


def test_paper_model_without_weights_uses_the_model_reproduce_trained(tmp_path, capsys):
    """``--model poly`` without ``--weights`` loads the model ``reproduce``'s workspace
    trained and cached under ``--models-dir`` (nothing is trained again): its maps are the
    hand-written Gradient*Input of that model."""
    from taylorattr.data import mnist_split
    from taylorattr.data.mnist import load_mnist
    from taylorattr.experiments.workspace import Workspace

    model, _ = Workspace(tmp_path / "results", seed=0, quick=True, progress=False).trained("poly")
    cached = sorted((tmp_path / "results" / "models").iterdir())
    out = tmp_path / "maps"
    assert cli.main(["attribute", "--data", "mnist", "--model", "poly", "--models-dir",
                     str(tmp_path / "results"), "--samples", "2", "--method", "GI",
                     "--budget", "none", "--out", str(out)]) == 0
    assert sorted((tmp_path / "results" / "models").iterdir()) == cached
    held = mnist_split(*load_mnist(None), seed=0).held_images
    for r in index_rows(out):
        x = held[int(r["index"]):int(r["index"]) + 1]
        got = torch.load(out / r["map"], weights_only=True)
        assert r["explained"] == "label" and got["target"] == int(r["target"])  # digit labels
        expected = copy.deepcopy(model).double().cpu()  # the maps are loaded on the CPU
        xd = x.double().cpu().requires_grad_(True)
        (grad,) = torch.autograd.grad(expected(xd)[0, got["target"]], xd)
        torch.testing.assert_close(got["attribution"].double(), (xd * grad)[0].detach(),
                                   rtol=1e-4, atol=1e-6)


def test_a_pickled_whole_model_as_weights_is_one_plain_line(user, capsys):
    """torch's weights-only refusal (long, coloured, about its Python API) becomes one line
    naming --weights and what to save instead."""
    torch.save(small_cnn(), user / "whole.pt")  # the whole module, pickled
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain", "photo.png", "--model", "mypkg.nets:small_cnn", "--weights",
                  "whole.pt", "--out", "o"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--weights: whole.pt" in err and "state_dict()" in err and "\x1b" not in err, err
    assert "weights_only" not in err and not (user / "o").exists()
