"""Fixtures shared by the test modules.

``TAYLORATTR_DEVICE=cuda make test`` makes CUDA the default device of every tensor and
module the tests create (``torch.set_default_device``), so the suite exercises the library's
device handling; without it (and on CI) everything runs on the CPU. A requested device that
is not available is an error, never a silent fall back to the CPU.
"""
import os
import socket

import pytest
import torch

_DEVICE = os.environ.get("TAYLORATTR_DEVICE", "").strip()
if _DEVICE and _DEVICE != "cpu":
    if _DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"TAYLORATTR_DEVICE={_DEVICE} but CUDA is not available here")
    torch.set_default_device(_DEVICE)


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
