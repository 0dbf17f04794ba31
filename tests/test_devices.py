"""Device-true library code (issue 34): nothing is created on the default device.

``TAYLORATTR_DEVICE=cuda make test`` runs the suite under ``torch.set_default_device('cuda')``.
A tensor factory called without ``device=`` then lands on CUDA beside CPU inputs, and a CPU
``torch.Generator`` refuses to draw there. The library therefore makes every generator
through :func:`taylorattr._validation.cpu_generator`, draws through
:func:`taylorattr._validation.draw` (on the CPU, then moved to the inputs' device) and names
a device in every factory call. Two independent checks, both on the CPU:

* statically: the syntax tree of every module of ``src/`` holds no ``torch.Generator(`` outside
  ``cpu_generator`` and no call of a factory that the default device rewrites
  (``torch.utils._device._device_constructors``, PyTorch's own list) without ``device=``;
* dynamically: every registered method variant, run on CPU inputs under a
  ``TorchFunctionMode`` that records every such factory call made from the library's code
  without a device, records none.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
import torch.fft  # (sys.modules lookups below)
import torch.nested
import torch.utils._device as torch_device
from test_common import IDS, VARIANTS
from torch.overrides import TorchFunctionMode

import taylorattr
from taylorattr.registry import METHODS
from taylorattr.testing import _bind, conv_model, cudnn_deterministic, image_batch

SRC = Path(taylorattr.__file__).resolve().parent
#: the factories the default device rewrites (PyTorch's list), by module and name
NAMES = {(mod, f.__name__) for f in torch_device._device_constructors()
         for mod in ("torch", "torch.fft", "torch.nested")
         if getattr(sys.modules[mod], f.__name__, None) is f}
NAMES |= {("torch.fft", "fftfreq"), ("torch.fft", "rfftfreq")}  # wrapped: not `is` the same
#: the one function allowed to make a generator
HELPER = ("_validation.py", "cpu_generator")


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def device_less_calls(source: str, filename: str) -> list[str]:
    """``file:line: call`` for every ``torch.Generator(...)`` outside the helper and every
    factory call of :data:`NAMES` without a ``device=`` keyword (``**kwargs`` counts as
    naming one)."""
    found = []
    tree = ast.parse(source)
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def enclosing_function(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return None

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name is None or "." not in name:
            continue
        module, attr = name.rsplit(".", 1)
        keywords = {k.arg for k in node.keywords}
        if name == "torch.Generator":
            if (Path(filename).name, enclosing_function(node)) != HELPER:
                found.append(f"{filename}:{node.lineno}: torch.Generator(")
        elif (module, attr) in NAMES and "device" not in keywords and None not in keywords:
            found.append(f"{filename}:{node.lineno}: {name}( without device=")
    return found


def test_the_scan_finds_what_it_looks_for():
    """A test of the test: each kind of offence is found, the allowed forms are not."""
    src = ("import torch\n"
           "def f(x):\n"
           "    g = torch.Generator().manual_seed(0)\n"
           "    a = torch.zeros(3)\n"
           "    b = torch.randn(2, generator=g, dtype=torch.float64)\n"
           "    c = torch.fft.rfftfreq(4)\n"
           "    d = torch.zeros(3, device=x.device)\n"
           "    e = torch.as_tensor([1.0], **{'device': 'cpu'})\n"
           "    return torch.zeros_like(x) + x.new_zeros(1)\n")
    found = device_less_calls(src, "m.py")
    assert sorted(s.split(":")[1] for s in found) == ["3", "4", "5", "6"], found
    helper = "import torch\ndef cpu_generator(seed):\n    return torch.Generator()\n"
    assert device_less_calls(helper, "_validation.py") == []


def test_no_generator_and_no_device_less_factory_in_src():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        found += device_less_calls(path.read_text(), str(path.relative_to(SRC.parent)))
    assert not found, ("make generators with _validation.cpu_generator, draw with "
                       "_validation.draw and give every factory device=:\n" + "\n".join(found))


_DISPATCH = (str(Path("torch", "overrides.py")), str(Path("torch", "utils", "_device.py")))


class _FactoryRecorder(TorchFunctionMode):
    """Records ``file:line`` of every factory call without a device made directly from the
    library's code (calls torch makes inside its own functions are torch's business)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in torch_device._device_constructors() and kwargs.get("device") is None:
            frame = sys._getframe(1)  # the caller, past torch's dispatch of the mode
            while frame is not None and frame.f_code.co_filename.endswith(_DISPATCH):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(str(SRC)):
                self.calls.append(f"{frame.f_code.co_filename}:{frame.f_lineno}: "
                                  f"{getattr(func, '__name__', func)}")
        return func(*args, **kwargs)


def test_the_recorder_sees_a_device_less_call():
    with _FactoryRecorder() as rec:
        torch.zeros(2)
    assert rec.calls == []  # made from this test module, not from the library
    from taylorattr.methods import kernel_design

    with _FactoryRecorder() as rec:
        kernel_design._kernel_sizes(4)  # names its device: nothing recorded
    assert rec.calls == []
    path = Path(kernel_design.__file__)
    code = compile("import torch\ndef f():\n    return torch.ones(2)\n", str(path), "exec")
    scope = {}
    exec(code, scope)  # noqa: S102  (a function that claims to live in the library)
    with _FactoryRecorder() as rec:
        scope["f"]()
    assert len(rec.calls) == 1 and rec.calls[0].startswith(str(path)), rec.calls


@pytest.mark.parametrize("name,i", VARIANTS, ids=IDS)
def test_no_method_creates_a_tensor_on_the_default_device(name, i):
    """Every registered variant on CPU float32 inputs and a CPU model makes no factory call of
    its own without a device: under a CUDA default device nothing of it lands beside the
    inputs (there, a device-less factory would also fail the call)."""
    x = image_batch(torch.float32, device="cpu")
    model = conv_model(torch.float32, device="cpu")
    bound = _bind(METHODS[name], METHODS[name].variants[i], model, torch.float32)
    with _FactoryRecorder() as rec:
        a = bound(model, x, 0.0, None)
    assert a.device == x.device
    assert not rec.calls, "\n".join(rec.calls)


def test_draws_are_made_on_the_cpu_and_moved():
    """The helper's numbers are the CPU generator's whatever the target device (``meta``
    stands in for CUDA: a CPU generator cannot draw there either)."""
    from taylorattr._validation import cpu_generator, draw

    want = torch.randn(2, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64,
                       device="cpu")
    got = draw(torch.randn, 2, 3, generator=cpu_generator(5), device="cpu", dtype=torch.float64)
    assert torch.equal(got, want)
    moved = draw(torch.randn, 2, 3, generator=cpu_generator(5), device="meta")
    assert moved.device.type == "meta" and moved.shape == (2, 3)
    with torch.device("meta"):  # a default device other than the inputs' changes nothing
        again = draw(torch.randn, 2, 3, generator=cpu_generator(5), device="cpu",
                     dtype=torch.float64)
    assert torch.equal(again, want)


def test_the_suites_own_draws_follow_the_default_device():
    """conftest's mode: a test's CPU-generator draw lands on the default device with the
    CPU's numbers."""
    from conftest import _HostDraws

    want = torch.rand(4, generator=torch.Generator().manual_seed(0))
    with _HostDraws():
        assert torch.equal(torch.rand(4, generator=torch.Generator().manual_seed(0)), want)
    with torch.device("meta"), _HostDraws():
        got = torch.rand(4, generator=torch.Generator().manual_seed(0))
    assert got.device.type == "meta" and got.shape == want.shape


@pytest.mark.parametrize("name,i", VARIANTS, ids=IDS)
@cudnn_deterministic()  # bitwise on CUDA too (as the common checks' deterministic)
def test_a_cpu_target_explains_inputs_on_any_device(name, i):
    """As Captum: a target given as a CPU integer tensor or a list of ints, beside inputs on
    another device (the default one: CUDA under ``TAYLORATTR_DEVICE=cuda``), is moved to the
    model output's device (``_validation.resolve_target``) and gives bit for bit the
    attributions of the same target on the inputs' device."""
    x = image_batch()
    model = conv_model()
    bound = _bind(METHODS[name], METHODS[name].variants[i], model, x.dtype)
    want = bound(model, x, 0.0, torch.tensor([0, 2], device=x.device))
    for target in (torch.tensor([0, 2], device="cpu"), [0, 2]):
        assert torch.equal(bound(model, x, 0.0, target), want), type(target).__name__
