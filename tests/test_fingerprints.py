"""No stale reuse (issue 28): a rerun of ``taylorattr attribute`` into the same ``--out``
with one ingredient changed (an input image, a weight, a method option, the seed)
recomputes exactly the items computed from it, says what changed, and leaves maps equal
to a fresh run's; ``--resume strict`` refuses such a rerun naming the change, before any
work. The reruns are real processes (``python -m taylorattr``); the fresh runs that give
the expected maps and the strict refusals run in this process through ``cli.main``."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from _user_model import run, write_package, write_photo, write_weights

from taylorattr import cli
from taylorattr.experiments.fingerprints import changed, item_digest, model_digest

BASE = ["attribute", "--data", "data", "--model", "mypkg.nets:small_cnn", "--weights", "w.pt",
        "--batch-size", "2", "--input-size", "16", "--resize", "16", "--budget", "none"]


def maps(out: Path) -> dict[str, torch.Tensor]:
    return {p.relative_to(out).as_posix(): torch.load(p, weights_only=True)["attribution"]
            for p in sorted(out.rglob("*.pt")) if p.relative_to(out).parts[0] != "units"}


def same_map(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two computations of one map: bitwise equal on the CPU. The command runs on CUDA where
    it is available, and there two runs of the same call differ by float32 round-off (the
    backward of adaptive average pooling adds with atomics, in a varying order; measured:
    2.9e-11 where the maps reach 3e-4), so there: equal to 1e-5 of the larger map's largest
    |value| (a stale map differs from the fresh one by the map's own size)."""
    if not torch.cuda.is_available():
        return torch.equal(a, b)
    scale = float(torch.maximum(a.abs().max(), b.abs().max()))
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * scale)


def counts(stdout: str) -> tuple[int, int]:
    m = re.search(r"(\d+) items? computed, (\d+) reused", stdout)
    assert m, stdout
    return int(m.group(1)), int(m.group(2))


@pytest.fixture
def user(tmp_path, monkeypatch):
    write_package(tmp_path)
    write_weights(tmp_path / "w.pt", seed=1)
    for i, name in enumerate(["cat/a0.png", "cat/a1.png", "dog/b0.png", "dog/b1.png"]):
        write_photo(tmp_path / "data" / name, seed=i)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def fresh(root: Path, argv: list[str], name: str, capsys) -> dict:
    out = root / name
    assert cli.main(argv + ["--out", str(out)]) == 0
    capsys.readouterr()
    return maps(out)


def refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--out", "out", "--resume", "strict"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_each_changed_ingredient_recomputes_its_units_or_is_refused(user, capsys):
    argv = BASE + ["--method", "EG", "--seed", "0"]  # EG draws per-sample seeded references
    first = run(argv + ["--out", "out"], user)
    assert first.returncode == 0, first.stderr
    assert counts(first.stdout) == (4, 0)
    assert cli.main(argv + ["--out", "out"]) == 0  # unchanged: all reused
    again = capsys.readouterr().out
    assert counts(again) == (0, 4) and "recomputed" not in again

    def change(what: str, new_argv: list[str], edit, expected: tuple[int, int], names=()):
        before = maps(user / "out")
        edit()
        err = refused(new_argv, capsys)
        assert f"changed: {what}" in err and all(n in err for n in names), err
        assert all(torch.equal(before[k], v) for k, v in maps(user / "out").items())  # no work
        rerun = run(new_argv + ["--out", "out"], user)
        assert rerun.returncode == 0, rerun.stderr
        assert counts(rerun.stdout) == expected, rerun.stdout
        assert f"changed: {what} ({expected[0]} item" in rerun.stdout, rerun.stdout
        assert all(n in rerun.stdout for n in names), rerun.stdout
        now = maps(user / "out")
        assert now.keys() == before.keys()
        expect = fresh(user, new_argv, f"fresh-{what}", capsys)
        for key in now:  # every map is the fresh run's: nothing stale was kept
            assert same_map(now[key], expect[key]), (what, key)
        assert any(not same_map(before[k], now[k]) for k in now), what  # it did change
        return now

    photo = user / "data" / "dog" / "b1.png"
    start = maps(user / "out")
    after = change("inputs", argv, lambda: write_photo(photo, seed=99), (1, 3),
                   names=("dog/b1.png",))
    # the other items were reused, also dog/b0.png of the same unit: their maps are the
    # ones from before the change
    assert all(torch.equal(after[k], start[k]) for k in start if k != "dog/b1.png.pt")
    change("model", argv, lambda: write_weights(user / "w.pt", seed=2), (4, 0))
    other = BASE + ["--method", "EG (around 0)", "--seed", "0"]  # EG's baselines option
    change("method", other, lambda: None, (4, 0))
    change("seed", BASE + ["--method", "EG (around 0)", "--seed", "1"], lambda: None, (4, 0))


def test_fingerprint_fields_follow_their_ingredient():
    """The digests an ingredient enters change with it and with nothing else."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    same = torch.nn.Sequential(torch.nn.Linear(3, 2))
    same.load_state_dict(net.state_dict())
    assert model_digest(net) == model_digest(same)
    with torch.no_grad():
        same[0].bias[1] += 1e-6  # one weight
    assert model_digest(net) != model_digest(same)
    deeper = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Identity())
    deeper[0].load_state_dict(net[0].state_dict())  # same weights, other code
    assert model_digest(net) != model_digest(deeper)
    x = torch.zeros(3, 4, 4)
    y = x.clone()
    y[0, 0, 0] = 1e-7
    assert item_digest(x, 1) == item_digest(x.clone(), 1) != item_digest(y, 1)
    assert item_digest(x, 1) != item_digest(x, 2)
    assert changed({"model": "a", "seed": "0"}, {"model": "a", "seed": "1", "x": "2"}) \
        == ["seed", "x"]


def test_reproduce_units_of_another_library_version_are_recomputed(tmp_path, monkeypatch):
    """A reproduce unit (UnitStore) is reused by the same library build only."""
    import taylorattr.experiments._units as U

    calls = []

    def compute():
        calls.append(1)
        return {"x": torch.tensor([float(len(calls))])}
    store = U.UnitStore(tmp_path)
    assert store.get("k", compute)["x"].item() == 1.0
    assert store.get("k", compute)["x"].item() == 1.0 and len(calls) == 1  # reused
    monkeypatch.setattr(U, "library_version", lambda: "0.0.0+srcother+torch0")
    assert store.get("k", compute)["x"].item() == 2.0 and len(calls) == 2  # recomputed
    assert set(store.get("k", compute)) == {"x"}  # the version stamp is not a result


def test_cached_models_follow_the_training_data_content(tmp_path):
    """Two MNIST folders with files of the same names and sizes but one changed byte name
    different cache entries (the training recipe is in the entry's name already)."""
    from taylorattr.models.training import _data_tag

    for name, byte in (("a", b"\x00"), ("b", b"\x01")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train-images-idx3-ubyte").write_bytes(b"\x00" * 15 + byte)
        (folder / "train-labels-idx1-ubyte").write_bytes(b"\x00" * 8)
    assert _data_tag(tmp_path / "a", None)[0] != _data_tag(tmp_path / "b", None)[0]
    twin = tmp_path / "twin"
    twin.mkdir()
    for p in (tmp_path / "a").iterdir():
        (twin / p.name).write_bytes(p.read_bytes())
    assert _data_tag(tmp_path / "a", None)[0] == _data_tag(twin, None)[0]  # content, not place


def test_saliency_units_follow_the_methods_settings_and_seed():
    """A saliency map is stored under its methods' settings (seed, window, steps), so a run
    with another seed or --full's settings never takes a quick run's maps."""
    from taylorattr.experiments.saliency import SaliencyStage, methods_tag

    quick = SaliencyStage(quick=True, seed=0)
    assert methods_tag(quick.photo_methods()) == methods_tag(SaliencyStage(True, 0).photo_methods())
    assert methods_tag(quick.photo_methods()) != methods_tag(SaliencyStage(True, 1).photo_methods())
    assert methods_tag(quick.photo_methods()) != methods_tag(SaliencyStage(False, 0).photo_methods())
    assert methods_tag(quick.digit_methods()) != methods_tag(SaliencyStage(True, 1).digit_methods())
