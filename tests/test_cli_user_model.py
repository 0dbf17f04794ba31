"""A user's own model as a new user brings it (issue 46, items 2, 3 and 7): a ``.pt2``
exported with an unbounded batch dimension, the images fed at their own size with no
ImageNet normalisation unless asked (and said once), a network for gray images given
RGB photos, and one line with exit status 2 for a broken module or a damaged photo.

What the model was fed is read by the model itself (``mypkg/seen.py`` records every
input it is called on) and compared with the photo's pixels read by Pillow; maps are
compared with a hand-written float64 Gradient*Input."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from _user_model import small_cnn, write_package, write_photo, write_weights
from PIL import Image

from taylorattr import cli

SEEN = '''
import torch
from torch import nn

INPUTS = []


class Seen(nn.Module):
    """small_cnn's layers; every real input it is called on is recorded."""

    def __init__(self, channels=3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.Softplus(),
                                  nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64, 3))

    def forward(self, x):
        if not torch.compiler.is_compiling() and type(x) is torch.Tensor:
            INPUTS.append(x.detach().clone())
        return self.body(x)


def seen(channels=3):
    torch.manual_seed(1)
    return Seen(channels).eval()
'''


def _forget_mypkg() -> None:
    import sys

    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]  # another test's mypkg is another folder's


@pytest.fixture
def user(tmp_path, monkeypatch):
    _forget_mypkg()
    write_package(tmp_path)
    (tmp_path / "mypkg" / "seen.py").write_text(SEEN)
    write_weights(tmp_path / "w.pt", seed=3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    _forget_mypkg()


def fails(argv, capsys) -> str:
    """The one stderr line of an expected failure (exit 2, no traceback)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(errors) == 1, err
    return errors[0]


def pixels(path) -> torch.Tensor:
    """The photo as Pillow reads it, ``[3, H, W]`` in [0, 1]."""
    with Image.open(path) as im:
        return torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32) / 255
                                ).permute(2, 0, 1)


def hand_gi(net, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(sum_c x * df_t/dx, t)`` in float64, ``t`` the predicted class."""
    import copy

    net = copy.deepcopy(net).double().eval()
    x = x.double()[None].requires_grad_(True)
    out = net(x)
    t = int(out.argmax(1))
    (grad,) = torch.autograd.grad(out[0, t], x)
    return (x * grad)[0].sum(0).detach(), t


def test_images_go_in_at_their_own_size_unnormalised_and_it_is_said(user, capsys):
    """A 40x40 photo, no --input-size, --resize, --mean, --std: the model is fed the
    photo's own 40x40 pixels in [0, 1] (not 224, not ImageNet-normalised), and one note
    says so; --mean/--std given are applied and said."""
    from mypkg import seen

    photo = write_photo(user / "p.png", seed=8, size=40)
    argv = ["explain", "p.png", "--model", "mypkg.seen:seen", "--methods", "gi",
            "--save-maps", "--format", "pt", "--budget", "none"]
    assert cli.main([*argv, "--out", "own"]) == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "images fed at" in ln]
    assert len(notes) == 1, err
    assert "40x40" in notes[0] and "own size" in notes[0] and "not rescaled" in notes[0]
    assert "not normalised" in notes[0], notes[0]
    assert seen.INPUTS and all(x.shape[1:] == (3, 40, 40) for x in seen.INPUTS)
    expected = pixels(photo)
    assert torch.equal(seen.INPUTS[0][0], expected)  # exactly the pixels, nothing else
    gi, _ = hand_gi(seen.seen(), expected)
    got = torch.load(user / "own" / "p-maps" / "gi.pt", weights_only=True)
    torch.testing.assert_close(got.double(), gi, rtol=1e-4, atol=1e-6)

    seen.INPUTS.clear()
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    assert cli.main([*argv, "--out", "norm", "--mean", *map(str, mean),
                     "--std", *map(str, std), "--input-size", "32"]) == 0
    err = capsys.readouterr().err
    assert "images fed at 32x32 (--input-size)" in err and "rescaled (shorter side 40 -> " \
           "32)" in err and "--mean/--std" in err, err
    m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
    with Image.open(photo) as im:
        small = torch.from_numpy(np.asarray(im.convert("RGB").resize((32, 32), Image.BILINEAR),
                                            dtype=np.float32) / 255).permute(2, 0, 1)
    torch.testing.assert_close(seen.INPUTS[0][0], (small - m) / s, rtol=1e-6, atol=1e-6)


def test_a_folder_goes_in_at_its_smallest_side(user, capsys):
    """Photos of shorter sides 24 and 30: all fed at 24x24 (the smaller one rescaled),
    said once in the log."""
    from mypkg import seen

    write_photo(user / "photos" / "a" / "small.png", seed=1, size=24)
    write_photo(user / "photos" / "b" / "large.png", seed=2, size=30)
    assert cli.main(["attribute", "--data", "photos", "--model", "mypkg.seen:seen",
                     "--methods", "gi", "--out", "maps", "--budget", "none"]) == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "images fed at" in ln]
    assert len(notes) == 1 and "24x24" in notes[0] and "24/30 -> 24" in notes[0], err
    assert seen.INPUTS and all(x.shape[1:] == (3, 24, 24) for x in seen.INPUTS)
    fed = torch.cat(seen.INPUTS)
    small = pixels(user / "photos" / "a" / "small.png")
    assert any(torch.equal(row, small) for row in fed)  # the 24x24 one as it is


def test_pt2_with_an_unbounded_dynamic_batch_runs_and_its_taylor_panels_are_smoothed(
        user, capsys):
    """``Dim("batch")`` with no bounds (an ``int_oo`` upper bound in the program): the
    program loads, runs at the size it was exported for, its GI map is the network's, and
    --beta auto smooths its Taylor panels (said in their names), as for the module."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.AdaptiveAvgPool2d(4),
                              torch.nn.Flatten(), torch.nn.Linear(64, 3)).eval()
    program = torch.export.export(net, (torch.zeros(2, 3, 32, 32),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, "free.pt2")
    photo = write_photo(user / "p.png", seed=9, size=32)
    assert cli.main(["explain", "p.png", "--model", "free.pt2", "--methods", "gi", "taylor-1",
                     "--save-maps", "--format", "pt", "--out", "o", "--budget", "none"]) == 0
    err = capsys.readouterr().err
    assert "images fed at 32x32 (the size the .pt2 program takes)" in err, err
    files = sorted(p.name for p in (user / "o" / "p-maps").glob("*.pt"))
    assert files[0] == "gi.pt" and len(files) == 2 and "smooth" in files[1], files
    gi, _ = hand_gi(net, pixels(photo))
    got = torch.load(user / "o" / "p-maps" / "gi.pt", weights_only=True)
    torch.testing.assert_close(got.double(), gi, rtol=1e-4, atol=1e-6)


def test_a_gray_model_given_rgb_photos_is_fed_their_luma(user, capsys):
    """A network whose first convolution takes 1 channel: the photos are converted to gray
    (0.299 R + 0.587 G + 0.114 B), said once; the map is GI of the RGB pixels through that
    conversion; without --grayscale a 3-channel network is not converted, and --grayscale
    on it is one line."""
    from mypkg import seen

    photo = write_photo(user / "p.png", seed=4, size=20)
    argv = ["explain", "p.png", "--model", "mypkg.seen:seen", "--model-args", "[1]",
            "--methods", "gi", "dl", "--save-maps", "--format", "pt", "--out", "g"]
    assert cli.main(argv) == 0  # with the estimate: its probe runs the gray network too
    err = capsys.readouterr().err
    assert err.count("converted to one gray channel, 0.299 R + 0.587 G + 0.114 B") == 1, err
    assert "left out" not in err, err
    rgb = pixels(photo)
    gray = (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])[None]
    assert seen.INPUTS and all(x.shape[1:] == (1, 20, 20) for x in seen.INPUTS)
    torch.testing.assert_close(seen.INPUTS[0][0], gray, rtol=0, atol=1e-6)
    lin = torch.nn.Conv2d(3, 1, 1, bias=False)
    lin.weight.data = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    gi, _ = hand_gi(torch.nn.Sequential(lin, seen.seen(1)), rgb)
    got = torch.load(user / "g" / "p-maps" / "gi.pt", weights_only=True)
    torch.testing.assert_close(got.double(), gi, rtol=1e-4, atol=1e-6)
    line = fails(["explain", "p.png", "--model", "mypkg.seen:seen", "--grayscale",
                  "--out", "x"], capsys)
    assert "--grayscale" in line and "3 channels" in line, line


def test_a_broken_module_and_a_damaged_photo_are_one_line_before_any_estimate(user, capsys):
    (user / "mypkg" / "broken.py").write_text("import torch\n\ndef net(:\n    pass\n")
    write_photo(user / "p.png", seed=1, size=16)
    line = fails(["explain", "p.png", "--model", "mypkg.broken:net", "--out", "x"], capsys)
    assert "--model" in line and "SyntaxError" in line and "broken.py, line 3" in line, line
    for i in range(3):
        write_photo(user / "photos" / f"{i}.png", seed=i, size=16)
    (user / "photos" / "1.png").write_bytes((user / "photos" / "1.png").read_bytes()[:120])
    with pytest.raises(SystemExit) as exc:
        cli.main(["attribute", "--data", "photos", "--model", "mypkg.nets:small_cnn",
                  "--methods", "gi", "--out", "o"])  # the default budget: an estimate
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and "estimate" not in err, err
    assert "--data: dataset item 1 photos/1.png: not an image Pillow can read" in err, err
    assert "--bad-items skip" in err and len(err.strip().splitlines()) == 1, err
    assert not (user / "o").exists()
    # with --bad-items skip the other two are computed
    assert cli.main(["attribute", "--data", "photos", "--model", "mypkg.nets:small_cnn",
                     "--methods", "gi", "--out", "o", "--bad-items", "skip",
                     "--budget", "none"]) == 0
    assert "2 maps (GI)" in capsys.readouterr().out



def test_kernel_shap_out_of_reach_warns_before_its_first_row_and_the_budget_refuses(user,
                                                                                   capsys):
    """KernelShap with a player per pixel of a 3x64x64 image: 12,288 players, a
    12,289-square solve per image. Its cost says it is out of reach; the call warns before
    the model runs a coalition; the CLI's default budget refuses it in one line. With no players
    given, an image gets patches (at most 8 x 8 of them): 64 players here."""
    import warnings

    from taylorattr.methods import KernelShap

    calls = []
    net = small_cnn().eval()
    net.register_forward_hook(lambda *a: calls.append(1))
    x = torch.rand(1, 3, 64, 64)
    per_pixel = torch.arange(3 * 64 * 64).view(1, 3, 64, 64)
    cost = KernelShap(net).cost(x, feature_mask=per_pixel)
    assert "12,288 players" in cost.out_of_reach and "12,289-square" in cost.out_of_reach
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match=r"12,288 players.*group the features"):
            KernelShap(net).attribute(x, 0.0, target=0, feature_mask=per_pixel)
    assert calls == [1]  # warned after f(x) (the call's own forward), before any coalition
    # the default players are the 8x8 patches: equal to passing them as a feature mask
    patches = (torch.arange(64) // 8).view(1, 1, 64, 1) * 8 + (torch.arange(64) // 8).view(
        1, 1, 1, 64)
    patches = patches.expand(1, 3, 64, 64)
    grouped = KernelShap(net).cost(x)
    assert not grouped.out_of_reach and grouped.forward_rows <= 1 + 2 * 64 + 2048
    assert grouped == KernelShap(net).cost(x, feature_mask=patches)
    own = KernelShap(net).attribute(x, 0.0, target=0, n_samples=300, seed=1)
    given = KernelShap(net).attribute(x, 0.0, target=0, n_samples=300, seed=1,
                                      feature_mask=patches)
    assert torch.equal(own, given)
    # the CLI: the default budget refuses such a run in one line, before timing anything
    # (KernelSHAP-4x4 on a 256x256 photo: 64 x 64 = 4,096 patches)
    write_photo(user / "big" / "a.png", seed=1, size=256)
    with pytest.raises(SystemExit) as exc:
        cli.main(["attribute", "--data", "big", "--model", "mypkg.nets:small_cnn",
                  "--methods", "KernelSHAP-4x4", "--out", "o"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert exc.value.code == 2 and len(lines) == 1 and "estimate" not in err, err
    assert "--budget" in lines[0] and "out of reach" in lines[0] and "4,096 players" in lines[0]
    assert not (user / "o").exists()
