"""Captures made once for every shape and kept across processes (taylorattr.capture_cache):
counted with ``taylorattr.capture.STATS`` (exports: models traced and lowered; loaded:
captures read from disk). The attributions through a reused or loaded capture are checked
against Captum's DeepLift, the model's own output difference (DeepLIFT is complete) and,
bitwise, against those of a fresh capture."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import captum.attr as captum_attr
import pytest
import torch
from _capture_nets import NextTokenLogProb, images, small_cnn, tiny_llama
from torch import nn

from taylorattr import capture_cache, cli
from taylorattr.capture import STATS, CaptureShapeWarning
from taylorattr.capture_cache import CaptureCacheWarning, capture
from taylorattr.methods import DeepLift
from taylorattr.methods.layerwise import graph as layerwise_graph

TESTS = Path(__file__).parent
TIGHT = {"rtol": 1e-10, "atol": 1e-10}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh, empty disk cache for each test; any warning not expected is an error."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(capture_cache.ENV_DIR, str(folder))
    monkeypatch.delenv(capture_cache.ENV_SWITCH, raising=False)
    STATS.reset()
    layerwise_graph._SHARED.clear()  # captures shared in memory by models of one structure
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield folder / "captures"


def _captum(model, x, t):
    with warnings.catch_warnings():  # Captum's notes on its hooks and requires_grad
        warnings.simplefilter("ignore", UserWarning)
        return captum_attr.DeepLift(model).attribute(x, torch.zeros_like(x), target=t)


def test_twenty_batch_sizes_make_one_capture(cache):
    model = small_cnn()
    for batch in range(1, 21):
        x = images(batch, seed=batch)
        t = torch.arange(batch) % 3
        ours = DeepLift(model).attribute(x, 0.0, target=t)
        if batch in (1, 2, 7, 20):
            torch.testing.assert_close(ours, _captum(model, x, t), **TIGHT)
    assert (STATS.exports, STATS.loaded) == (1, 0)
    assert len(list(cache.glob("*.capture"))) == 1


def test_a_capture_fixed_to_one_batch_size_is_never_run_at_another():
    """Issue 46: a hook reading the batch size as a number while the model is captured (a
    progress bar) fixes it; the capture at batch 2 then holds for batch 2 only, and a call
    at batch 1 or 3 gets a capture of its own (it raised ``shape '[2, 24]' is invalid``)."""
    model = small_cnn()
    seen = []
    model.conv1.register_forward_pre_hook(lambda m, args: seen.append(int(args[0].shape[0])))
    DeepLift(model).attribute(images(2), 0.0, target=0)
    for batch in (1, 3, 2, 1):
        x = images(batch, seed=batch)
        torch.testing.assert_close(DeepLift(model).attribute(x, 0.0, target=1),
                                   _captum(model, x, 1), **TIGHT)
    assert STATS.exports == 3  # batch 2, 1 and 3


def test_a_model_that_cannot_be_dynamic_is_said_once_and_captured_per_shape(monkeypatch):
    """Where torch.export raises with the dynamic axes (here: a dynamic-shapes spec it
    refuses, standing for a model's code it cannot trace symbolically), a warning, once
    per model class, and a capture per shape."""
    from taylorattr import capture as capture_module

    monkeypatch.setattr(capture_module, "_dynamic_shapes", lambda *a: {"nope": None})
    model = small_cnn(nn.Sigmoid)
    with pytest.warns(CaptureShapeWarning, match="once per input shape"):
        graph = capture(model, (images(2),))
    capture(small_cnn(nn.Sigmoid), (images(3),))  # said once per model class: no warning
    assert graph.dims[0][0] == 2 and not graph.fits(images(3))
    torch.testing.assert_close(graph.run(images(2)), model(images(2)), rtol=1e-14, atol=1e-14)


def test_twenty_sequence_lengths_make_one_capture_on_a_tiny_llama():
    llama = tiny_llama(dtype=torch.float32)  # (in float64 its RMSNorm computes in float32)
    model = NextTokenLogProb(llama).eval()
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, length, 16, generator=gen) for length in range(2, 22)]
    reused = [DeepLift(model).attribute(e, 0.0, target=0) for e in inputs]
    assert STATS.exports == 1
    for e, ours in zip(inputs, reused):  # complete, up to float32 cancellation in the sum
        with torch.no_grad():
            delta = (model(e) - model(torch.zeros_like(e))).sum()
        assert abs(float(ours.sum() - delta)) <= 1e-6 * float(ours.abs().sum()) + 1e-6
    # the model itself, called with token ids and an attention mask as keywords
    ids = torch.randint(0, 40, (2, 5), generator=gen)
    graph = capture(llama, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                "use_cache": False})
    assert STATS.exports == 2
    for batch, length in ((3, 9), (2, 17)):
        ids = torch.randint(0, 40, (batch, length), generator=gen)
        mask = torch.ones_like(ids)
        mask[0, :2] = 0  # left padding
        assert graph.fits(input_ids=ids, attention_mask=mask, use_cache=False)
        with torch.no_grad():
            want = llama(input_ids=ids, attention_mask=mask, use_cache=False).logits
        torch.testing.assert_close(graph.run(ids, mask), want, rtol=1e-6, atol=1e-6)


_CHILD = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from _capture_nets import images, small_cnn
from taylorattr.capture import STATS
from taylorattr.methods import DeepLift
torch.save(DeepLift(small_cnn()).attribute(images(5), 0.0, target=2), sys.argv[1])
print(json.dumps({{"exports": STATS.exports, "loaded": STATS.loaded}}))
"""


def test_a_second_process_loads_the_capture_and_gets_the_same_bits(tmp_path):
    mine = DeepLift(small_cnn()).attribute(images(5), 0.0, target=2)
    assert (STATS.exports, STATS.stored) == (1, 1)
    out = tmp_path / "theirs.pt"
    run = subprocess.run([sys.executable, "-c", _CHILD.format(tests=str(TESTS)), str(out)],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ),
                         check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"exports": 0, "loaded": 1}, \
        run.stderr
    theirs = torch.load(out, weights_only=True)
    assert torch.equal(theirs, mine)
    model, x = small_cnn(), images(5)
    torch.testing.assert_close(theirs, _captum(model, x, 2), **TIGHT)


def test_what_changes_the_graph_makes_a_new_capture_and_weights_do_not(monkeypatch):
    x = images(3)
    capture(small_cnn(), (x,))
    assert (STATS.exports, STATS.loaded) == (1, 0)
    tuned = small_cnn(seed=5)  # other weights, the same architecture: reused
    graph = capture(tuned, (x,))
    assert (STATS.exports, STATS.loaded) == (1, 1)
    torch.testing.assert_close(graph.run(x), tuned(x), rtol=1e-14, atol=1e-14)
    capture(small_cnn(nn.Tanh), (x,))  # another activation
    capture(small_cnn(dtype=torch.float32), (x.float(),))  # another dtype
    capture(small_cnn(), (x[:, :, :8, :8],))  # another (static) image size
    assert (STATS.exports, STATS.loaded) == (4, 1)
    # the same classes, another setting read in forward: LeakyReLU's negative slope
    slopes = [small_cnn(lambda s=s: nn.LeakyReLU(s)) for s in (0.1, 0.2)]
    graphs = [capture(m, (x,)) for m in slopes]
    assert (STATS.exports, STATS.loaded) == (6, 1)
    for m, graph in zip(slopes, graphs):
        torch.testing.assert_close(graph.run(x), m(x), rtol=1e-14, atol=1e-14)
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    capture(small_cnn(), (x,))
    assert (STATS.exports, STATS.loaded) == (7, 1)


def test_a_capture_at_one_row_does_not_replace_the_dynamic_entry(cache):
    """An example of one row fixes that axis (export specialises size 1): its capture goes
    under the key of its own shape, and the dynamic capture's entry stays."""
    capture(small_cnn(), (images(1),))
    capture(small_cnn(), (images(3),))
    assert (STATS.exports, STATS.loaded, len(list(cache.glob("*.capture")))) == (2, 0, 2)
    for batch in (4, 1, 7):
        model = small_cnn()  # (held: a capture read from disk reads its weights)
        graph = capture(model, (images(batch),))
        torch.testing.assert_close(graph.run(images(batch)), model(images(batch)),
                                   rtol=1e-14, atol=1e-14)
    assert (STATS.exports, STATS.loaded) == (2, 3)
    del model
    with pytest.raises(ValueError, match="is gone"):
        graph.run(images(7))


def test_a_truncated_entry_is_rebuilt_with_a_warning(cache):
    x = images(2)
    capture(small_cnn(), (x,))
    (entry,) = cache.glob("*.capture")
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])
    with pytest.warns(CaptureCacheWarning, match="truncated"):
        graph = capture(small_cnn(), (x,))
    assert (STATS.exports, STATS.loaded) == (2, 0)
    torch.testing.assert_close(graph.run(x), small_cnn()(x), rtol=1e-14, atol=1e-14)
    entry.write_bytes(b"garbage")
    with pytest.warns(CaptureCacheWarning, match="corrupt"):
        capture(small_cnn(), (x,))
    capture(small_cnn(), (x,))
    assert (STATS.exports, STATS.loaded) == (3, 1)


def test_the_cache_can_be_turned_off(cache, monkeypatch):
    monkeypatch.setenv(capture_cache.ENV_SWITCH, "0")
    capture(small_cnn(), (images(2),))
    capture(small_cnn(), (images(2),))
    assert (STATS.exports, STATS.loaded, STATS.stored) == (2, 0, 0)
    assert not cache.exists()


def test_cli_cache_info_and_clear(cache, capsys):
    capture(small_cnn(), (images(2),))
    capture(small_cnn(nn.Tanh), (images(2),))
    assert cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and "entries: 2" in out
    assert cli.main(["cache", "clear"]) == 0
    assert "deleted 2" in capsys.readouterr().out
    assert not list(cache.glob("*.capture"))
