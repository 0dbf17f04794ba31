"""Fixtures shared by the test modules.

``TAYLORATTR_DEVICE=cuda make test`` makes CUDA the default device of every tensor and
module the tests create (``torch.set_default_device``), so the suite exercises the library's
device handling; without it (and on CI) everything runs on the CPU. A requested device that
is not available is an error, never a silent fall back to the CPU.
"""
import atexit
import os
import shutil
import socket
import tempfile

import pytest
import torch
import torch.utils._device as _torch_device
from torch.overrides import TorchFunctionMode

_DEVICE = os.environ.get("TAYLORATTR_DEVICE", "").strip()

# the suite's captures are kept in a folder of its own (inherited by its subprocesses),
# never in the user's cache (taylorattr.capture_cache)
os.environ["TAYLORATTR_CACHE_DIR"] = tempfile.mkdtemp(prefix="taylorattr-tests-cache-")
atexit.register(shutil.rmtree, os.environ["TAYLORATTR_CACHE_DIR"], True)


class _HostDraws(TorchFunctionMode):
    """The tests' own seeded draws under a non-CPU default device: a factory given a CPU
    ``generator=`` and no device draws on the CPU and moves the result to the default
    device, so every test sees the same numbers on every device (as the library draws:
    ``taylorattr._validation.draw``). Without it a CPU generator refuses to draw on CUDA.
    The library itself never relies on this: tests/test_devices.py checks that it names a
    device in every factory call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gen = kwargs.get("generator")
        if (gen is not None and gen.device.type == "cpu" and kwargs.get("device") is None
                and func in _torch_device._device_constructors()):
            return func(*args, **{**kwargs, "device": "cpu"}).to(torch.get_default_device())
        return func(*args, **kwargs)


if _DEVICE and _DEVICE != "cpu":
    if _DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"TAYLORATTR_DEVICE={_DEVICE} but CUDA is not available here")
    torch.set_default_device(_DEVICE)
    _HostDraws().__enter__()  # above the default device's mode: sees the calls first


def device_tolerance(rtol: float, atol: float = 0.0, dtype=torch.float64) -> dict:
    """``{"rtol", "atol"}`` for comparing a result of the default device with an independent
    route: the CPU's own tolerances, widened on CUDA, where the same dtype does not give
    the same bits. CUDA kernels reduce in another order (parallel tree sums, split-K matrix
    products, atomic adds in scatter/index_add, cuDNN's algorithm choice by shape), so
    float64 results agree to about 1e-12 relative, not 1e-15 (measured up to 4e-9 after
    the many layers of a capture test; the floor below); float32 convolutions run in TF32
    by default (a 10-bit mantissa: about 1e-3 relative) unless
    ``torch.backends.cudnn.allow_tf32 = False``. On the CPU the arguments come back as
    given."""
    if torch.get_default_device().type != "cuda":
        return {"rtol": rtol, "atol": atol}
    floor = {torch.float64: 1e-8, torch.float32: 2e-3}.get(dtype, 2e-2)
    return {"rtol": max(rtol, floor), "atol": max(atol, floor)}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny reproduce (tests/_dist_reproduce.py's settings), run once per session (here,
    so that every module using it shares the one run: a fixture imported into two test
    modules is two fixtures, and ran twice, 82 s each) in a fresh process, on one thread
    (as each rank of the torchrun job of tests/test_distributed_reproduce.py, so that the
    two runs compare bitwise), with the
    output folder given as a relative path (as ``make reproduce`` does). A fresh process,
    because after the suite's earlier tests this process computed a few numbers differently
    in their last bits (measured: principles score_1, 2e-16 relative; cause not found)."""
    import os
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("tiny")
    code = (f"import sys, torch\nsys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\ntorch.set_num_threads(1)\n"
            "from _dist_reproduce import TINY\n"
            "from taylorattr.experiments.reproduce import reproduce\n"
            "print(reproduce('results', show_progress=False, settings=TINY))"
            )
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=1200, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return root / r.stdout.strip().splitlines()[-1]


@pytest.fixture
def one_thread():
    """Torch on one thread within the test (restored after it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say how many registered method variants the common checks ran (tests/test_common.py)."""
    n = getattr(config, "common_variants", None)
    if n:
        terminalreporter.write_line(f"common method checks: {n} registered variants")
