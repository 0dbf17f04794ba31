"""A user's own package, weights, program file and photos, as a new user would bring them
(shared by tests/test_cli_own_model.py and tests/test_fingerprints.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

SRC = str(Path(__file__).resolve().parents[1] / "src")

#: What a user's model with no preprocessing of its own is fed by default: pixels in
#: [0, 1], not normalised (issue 46).
PIXEL_MEAN, PIXEL_STD = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)

NETS = '''
import torch
from torch import nn


def small_cnn(classes: int = 3, width: int = 4):
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.Softplus(),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(16 * width, classes))
'''


def write_package(root: Path) -> Path:
    """``root/mypkg/nets.py`` with ``small_cnn(classes=3, width=4)``."""
    (root / "mypkg").mkdir(parents=True, exist_ok=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "nets.py").write_text(NETS)
    return root


def small_cnn(classes: int = 3, width: int = 4) -> torch.nn.Module:
    """The same network, built here (not imported from the package)."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.Softplus(),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(16 * width, classes))


def write_weights(path: Path, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = small_cnn().eval()
    torch.save(net.state_dict(), path)
    return net


def write_program(net: torch.nn.Module, path: Path, size: int = 16) -> Path:
    """``net`` exported with a dynamic batch dimension."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(net, (torch.zeros(2, 3, size, size),),
                                  dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


def write_photo(path: Path, seed: int, size: int = 16) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)
    return path


def run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m taylorattr ARGV`` in ``cwd`` (so ``mypkg`` is importable from there)."""
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "taylorattr", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
