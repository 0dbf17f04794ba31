"""A new user's first hour with their own model (issue 33), as they would try it: a small
CNN in ``mypkg/nets.py``, six PNGs in two class folders, the ``taylorattr`` CLI.

Each map is checked against a hand-written float64 Gradient*Input on the same
preprocessed image (``sum_c x * df_t/dx``, baseline 0), so what the CLI read (the input
size of a ``.pt2`` program, the recomputed item) is checked by an independent route."""
from __future__ import annotations

import copy
import csv
import re
import sys
from pathlib import Path

import pytest
import torch
from _user_model import (
    PIXEL_MEAN,
    PIXEL_STD,
    run,
    small_cnn,
    write_package,
    write_photo,
    write_weights,
)

from taylorattr import cli
from taylorattr.data import imagenet_transform, load_image

PHOTOS = ["cat/cat1.png", "cat/cat2.png", "cat/cat3.png",
          "dog/dog1.png", "dog/dog2.png", "dog/dog3.png"]


@pytest.fixture
def user(tmp_path, monkeypatch):
    write_package(tmp_path)
    write_weights(tmp_path / "w.pt", seed=3)
    for i, name in enumerate(PHOTOS):
        write_photo(tmp_path / "photos" / name, seed=40 + i, size=24)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def hand_gi(net, path: Path, size: int, resize: int) -> tuple[torch.Tensor, int]:
    """``(x * df_t/dx [3, H, W], t)`` in float64 on the CPU (where the image is read and
    the maps are loaded, whatever device ``net`` is on), ``t`` the predicted class."""
    x = imagenet_transform(load_image(path), resize, size, PIXEL_MEAN, PIXEL_STD)[None]
    net = copy.deepcopy(net).double().cpu().eval()
    x = x.double().requires_grad_(True)
    out = net(x)
    t = int(out.argmax(1))
    (grad,) = torch.autograd.grad(out[0, t], x)
    return (x * grad)[0].detach(), t


def index(out: Path) -> list[dict]:
    with open(out / "index.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def fails(argv, capsys) -> str:
    """The one stderr line of an expected failure (exit 2, no traceback)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(errors) == 1, err
    return errors[0]


OWN = ["--model", "mypkg.nets:small_cnn", "--weights", "w.pt", "--budget", "none"]


def test_pt2_program_runs_at_the_size_it_was_exported_for(user, capsys):
    """The .pt2 command of docs/command_line.md, no --input-size: the program's 64x64 is
    read from it; a contradicting --input-size is one line naming --input-size and 64."""
    torch.manual_seed(3)
    net = small_cnn().eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(net, (torch.zeros(2, 3, 64, 64),), dynamic_shapes=({0: batch},))
    torch.export.save(program, "small.pt2")
    proc = run(["attribute", "--data", "photos", "--model", "small.pt2", "--method", "GI",
                "--out", "maps_pt2", "--batch-size", "1", "--budget", "none"], user)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rows = index(user / "maps_pt2")
    assert sorted(r["source"] for r in rows) == PHOTOS
    for r in rows:
        saved = torch.load(user / "maps_pt2" / r["map"], weights_only=True)
        # 64 read from the program; the whole image's center square scaled to it
        expected, t = hand_gi(net, user / "photos" / r["source"], 64, 64)
        assert saved["attribution"].shape == (3, 64, 64) and saved["target"] == t
        torch.testing.assert_close(saved["attribution"].double(), expected, rtol=1e-4,
                                   atol=1e-6)
    line = fails(["attribute", "--data", "photos", "--model", "small.pt2", "--method", "GI",
                  "--input-size", "224", "--out", "o", "--budget", "none"], capsys)
    assert "--input-size" in line and "64" in line and "224" in line, line
    assert not (user / "o").exists()
    torch.export.save(torch.export.export(net, (torch.zeros(2, 3, 64, 64),)), "fixed.pt2")
    line = fails(["attribute", "--data", "photos", "--model", "fixed.pt2", "--method", "GI",
                  "--out", "o", "--budget", "none"], capsys)
    assert "--model" in line and "dynamic batch" in line, line


def test_one_changed_image_is_recomputed_alone(user, capsys):
    """Default --batch-size 16 (all six in one unit): changing dog/dog1.png recomputes and
    rewrites its map only, says so in words, and the map is the new image's."""
    argv = ["attribute", "--data", "photos", *OWN, "--method", "GI", "--input-size", "16",
            "--resize", "16", "--out", "maps"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "6 items computed, 0 reused" in out and "rank" not in out, out
    assert (user / "maps" / "cat" / "cat1.png.pt").is_file()
    assert not (user / "maps" / "maps").exists()  # --out maps is where the maps go
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns)
              for p in (user / "maps").glob("*/*.png.pt")}
    assert len(stamps) == 6
    assert cli.main(argv) == 0
    assert "0 items computed, 6 reused" in capsys.readouterr().out

    write_photo(user / "photos" / "dog" / "dog1.png", seed=99, size=24)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "1 item computed, 5 reused (1 recomputed because what it was computed from " \
           "changed: inputs (1 item); changed item: 3 (dog/dog1.png))" in out, out
    changed = user / "maps" / "dog" / "dog1.png.pt"
    for p, stamp in stamps.items():  # only the changed image's map was written again
        assert ((p.stat().st_ino, p.stat().st_mtime_ns) == stamp) == (p != changed), p
    torch.manual_seed(3)
    net = small_cnn().eval()
    net.load_state_dict(torch.load(user / "w.pt", weights_only=True))
    for r in index(user / "maps"):
        saved = torch.load(user / "maps" / r["map"], weights_only=True)
        expected, t = hand_gi(net, user / "photos" / r["source"], 16, 16)
        assert saved["target"] == t
        torch.testing.assert_close(saved["attribution"].double(), expected, rtol=1e-4,
                                   atol=1e-6)
    before = torch.load(user / "maps" / "cat" / "cat2.png.pt", weights_only=True)
    (user / "maps" / "cat" / "cat2.png.pt").unlink()  # a map deleted by hand is written again
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "1 item computed, 5 reused" in out and "recomputed" not in out, out
    after = torch.load(user / "maps" / "cat" / "cat2.png.pt", weights_only=True)
    torch.testing.assert_close(after["attribution"], before["attribution"], rtol=1e-5,
                               atol=1e-7)
    # a renamed image (same pixels, same index) gets its map under its new name, and the
    # old name's map is gone
    (user / "photos" / "dog" / "dog3.png").rename(user / "photos" / "dog" / "dog4.png")
    assert cli.main(argv) == 0
    assert "1 item computed, 5 reused" in capsys.readouterr().out
    assert {r["source"] for r in index(user / "maps")} == {*PHOTOS[:5], "dog/dog4.png"}
    assert (user / "maps" / "dog" / "dog4.png.pt").is_file()
    assert not (user / "maps" / "dog" / "dog3.png.pt").exists()


def test_unknown_method_names_the_flag_and_the_closest_names(user, capsys):
    line = fails(["attribute", "--data", "photos", *OWN, "--method", "IGG", "--out", "o"],
                 capsys)
    assert "--method" in line and "'ig'" in line and "did you mean" in line, line
    assert len(line) < 300 and not line.rstrip(")").endswith("]"), line
    line = fails(["evaluate", "--data", "photos", *OWN, "--methods", "gi", "Occ2x", "--out",
                  "o"], capsys)
    assert "--methods" in line and "'occ-2x2'" in line and len(line) < 300, line


@pytest.mark.parametrize("command", ["attribute", "evaluate"])
def test_progress_bar_on_a_terminal_one_line_in_a_log(user, capsys, monkeypatch, command):
    method = ["--method", "GI"] if command == "attribute" else ["--methods", "GI",
                                                                "--max-side", "2"]
    argv = [command, "--data", "photos", *OWN, *method, "--input-size", "16", "--resize",
            "16", "--batch-size", "2"]
    assert cli.main(argv + ["--out", "log"]) == 0
    err = capsys.readouterr().err
    stage = [ln for ln in err.splitlines() if ln.startswith(f"taylorattr {command}: GI: ")]
    assert len(stage) == 2 and "\r" not in err and "item/s" not in err, err
    assert stage[0].endswith(": GI: started, 6 items"), stage
    assert re.fullmatch(rf"taylorattr {command}: GI: done, 6 items in [0-9.]+ s", stage[1]), stage
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(argv + ["--out", "tty"]) == 0
    err = capsys.readouterr().err
    assert "started" not in err and "done," not in err, err
    bars = re.findall(r"GI:\s+\d+%\|[^|]*\| (\d)/6 \[", err)  # tqdm's "n/total", by unit
    assert bars and bars == sorted(bars) and set(bars) <= set("0246"), err
    assert err.count("/6 [") == len(bars) and "item/s" in err, err  # one bar, over items


def test_any_format_pillow_reads_and_the_skipped_files_are_named(user, capsys):
    from PIL import Image

    Image.open(user / "photos" / "cat" / "cat1.png").save(user / "photos" / "cat" / "c.bmp")
    (user / "photos" / "notes.txt").write_text("my photos")
    hidden = user / "photos" / ".ipynb_checkpoints" / "cat1-checkpoint.png"  # not a photo
    write_photo(hidden, seed=1, size=24)
    assert cli.main(["attribute", "--data", "photos", *OWN, "--method", "GI", "--input-size",
                     "16", "--resize", "16", "--out", "m"]) == 0
    captured = capsys.readouterr()
    assert "7 maps (GI)" in captured.out
    assert "skipped 1 file under --data whose format Pillow does not read: notes.txt" \
        in captured.err, captured.err
    got = torch.load(user / "m" / "cat" / "c.bmp.pt", weights_only=True)["attribution"]
    same = torch.load(user / "m" / "cat" / "cat1.png.pt", weights_only=True)["attribution"]
    assert torch.equal(got, same)  # BMP is lossless: the same pixels, the same map


def test_a_damaged_image_is_named_with_what_to_do(user, capsys):
    (user / "photos" / "dog" / "dog2.png").write_bytes(b"\x89PNG not really")
    line = fails(["attribute", "--data", "photos", *OWN, "--method", "GI", "--out", "o"],
                 capsys)
    assert "photos/dog/dog2.png" in line and "not an image Pillow can read" in line, line
    assert "--bad-items skip" in line and "replace or remove it" in line, line
    assert "Error" not in line, line  # no exception class names


def test_weights_of_another_network_say_all_that_differs(user, capsys):
    torch.save(small_cnn(width=5).state_dict(), user / "w5.pt")
    line = fails(["attribute", "--data", "photos", "--model", "mypkg.nets:small_cnn",
                  "--weights", "w5.pt", "--method", "GI", "--out", "o"], capsys)
    own, file = small_cnn().state_dict(), torch.load(user / "w5.pt", weights_only=True)
    differ = [k for k in own if own[k].shape != file[k].shape]
    assert f"{len(differ)} tensors of another shape" in line, line
    assert f"0.weight: file {list(file['0.weight'].shape)}, model " \
           f"{list(own['0.weight'].shape)}" in line, line
    assert line.rstrip().endswith("or the --model-args it was built with"), line


def test_one_image_figure_is_a_grid_with_titles_apart(tmp_path):
    """18 panels (the image and 17 maps): rows of at most 6, no two titles overlapping in
    the drawn figure, at most 2,400 px wide at the saved 150 dpi."""
    import matplotlib

    matplotlib.use("Agg")
    from taylorattr.experiments.saliency import SaliencyPanel
    from taylorattr.reporting.plotting import GRID_COLUMNS, draw_saliency_grid, saliency_grid

    g = torch.Generator().manual_seed(0)
    labels = [f"Method number {k} with a long label" for k in range(17)]
    maps = {k: torch.randn(16, 16, generator=g) for k in labels}
    panel = SaliencyPanel("img", torch.rand(3, 16, 16, generator=g), "class 1: cat\np = 0.5",
                          maps, [])
    fig = draw_saliency_grid([panel])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panels = fig.axes[:-1]  # the last axes is the colour bar
    assert len(panels) == 18
    columns = {round(ax.get_position().x0, 3) for ax in panels}
    rows = {round(ax.get_position().y0, 3) for ax in panels}
    assert len(columns) == GRID_COLUMNS and len(rows) == 3
    boxes = [ax.title.get_window_extent(renderer) for ax in panels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    path = saliency_grid([panel], tmp_path / "f.png")
    from PIL import Image

    with Image.open(path) as im:
        assert im.size[0] <= 2400 and im.size[0] > im.size[1], im.size


def test_pt2_program_with_dynamic_sides_takes_a_size_in_its_range(tmp_path):
    """Height and width exported dynamic in [16, 96]: the default 224 is out of range, so
    the nearest side the program takes (96) is used, and runs; 128 is refused naming the
    range."""
    from taylorattr.experiments.user_model import load_model, preprocessing

    net = small_cnn().eval()
    batch, side = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("side", min=16,
                                                                            max=96)
    program = torch.export.export(net, (torch.zeros(2, 3, 32, 32),),
                                  dynamic_shapes=({0: batch, 2: side, 3: side},))
    torch.export.save(program, str(tmp_path / "dyn.pt2"))
    model = load_model(str(tmp_path / "dyn.pt2"))
    size = preprocessing(model)["size"]
    assert size == 96
    x = torch.rand(1, 3, size, size)
    torch.testing.assert_close(model(x), net(x))  # the program runs at that size
    assert preprocessing(model, size=40)["size"] == 40
    with pytest.raises(ValueError, match=r"input_size: .*--input-size 128 .*between 16 and 96"):
        preprocessing(model, size=128)
