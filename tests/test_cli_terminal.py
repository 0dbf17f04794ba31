"""The same command gives the same answer on a terminal as in a log (issue 46, item 1).

On a terminal the command draws progress bars (a forward hook on the model counts its
rows); in a log it prints lines. The maps must not depend on which: every map written
with the output on a pseudo-terminal equals, bitwise, the map written with the output
redirected to a file, and no method is left out on one and drawn on the other."""
from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import torch
from _user_model import (
    PIXEL_MEAN,
    PIXEL_STD,
    SRC,
    small_cnn,
    write_package,
    write_photo,
    write_weights,
)

from taylorattr.data import imagenet_transform, load_image


def _on_terminal(argv: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """``python -m taylorattr ARGV`` with stdout and stderr on a pseudo-terminal:
    ``(exit status, what the terminal showed)``."""
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "taylorattr", *argv], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return proc.wait(timeout=timeout), shown.decode(errors="replace")


def _in_a_file(argv: list[str], cwd: Path, log: Path) -> int:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as fh:
        return subprocess.run([sys.executable, "-m", "taylorattr", *argv], cwd=cwd, env=env,
                              stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                              timeout=300, check=False).returncode


def _maps(folder: Path) -> dict[str, torch.Tensor]:
    return {p.name: torch.load(p, weights_only=True) for p in sorted(folder.glob("*.pt"))}


def test_explain_draws_the_same_maps_on_a_terminal_and_in_a_log(tmp_path):
    """DeepLIFT and DeepLiftShap capture the model once; on a terminal the progress bar's
    hook ran during that capture and fixed the probe's batch of 2 into it, so the batch
    of 1 then failed and DL was left out on the terminal only."""
    write_package(tmp_path)
    write_weights(tmp_path / "w.pt", seed=3)
    write_photo(tmp_path / "photos" / "circle.png", seed=5, size=20)
    argv = ["explain", "photos/circle.png", "--model", "mypkg.nets:small_cnn", "--weights",
            "w.pt", "--methods", "dl", "dls", "gi", "--beta", "0", "--save-maps",
            "--format", "pt", "--input-size", "20", "--resize", "20"]
    code, shown = _on_terminal([*argv, "--out", "tty"], tmp_path)
    assert code == 0 and "left out" not in shown and "Traceback" not in shown, shown
    assert _in_a_file([*argv, "--out", "log"], tmp_path, tmp_path / "log.txt") == 0
    logged = (tmp_path / "log.txt").read_text()
    assert "left out" not in logged and "\r" not in logged, logged
    tty, log = _maps(tmp_path / "tty" / "circle-maps"), _maps(tmp_path / "log" / "circle-maps")
    assert sorted(tty) == sorted(log) == ["dl.pt", "dls.pt", "gi.pt"], (sorted(tty), sorted(log))
    for name in tty:
        assert torch.equal(tty[name], log[name]), name
    # and the GI map is the hand-written float64 x * df_t/dx of the 20x20 image read the
    # same way (an independent route: the two runs do not merely agree on a wrong answer)
    net = small_cnn().eval()
    net.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    x = imagenet_transform(load_image(tmp_path / "photos" / "circle.png"), 20, 20,
                           PIXEL_MEAN, PIXEL_STD)[None].double().requires_grad_(True)
    out = net.double()(x)
    (grad,) = torch.autograd.grad(out[0, int(out.argmax(1))], x)
    torch.testing.assert_close(log["gi.pt"].double(), (x * grad)[0].sum(0).detach(),
                               rtol=1e-4, atol=1e-6)
