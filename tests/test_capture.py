"""taylorattr.capture: the captured core-ATen graph runs like the model (also for another
batch size and from a .pt2 file), its input-dependence analysis against the graph by hand,
and one error listing every op an engine refuses."""
import copy
import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
import typing_extensions
from _builders import DT
from torch import nn

from taylorattr.capture import CaptureError, UnsupportedOps, capture, op_name, refuse

#: graph against module: on the CPU the same kernels; on CUDA the module runs cuDNN's
#: fused batch norm and the graph its decomposition, which round differently: measured
#: 4.2e-9 relative in float64 on an H200
TOL = 1e-14 if torch.get_default_device().type == "cpu" else 1e-8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)
        self.register_buffer("table", torch.arange(4, dtype=DT))

    def forward(self, x):
        h = F.hardswish(self.bn(self.conv(x)))
        if h.shape[-1] > 2:  # control flow on shapes only: export runs it
            h = h[..., 1:]
        pos = torch.sin(self.table)  # a constant: does not depend on x
        return self.head(h.mean((2, 3)) + pos)


def _net():
    torch.manual_seed(0)
    model = Net().to(DT).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.2, 0.2)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model


def test_captured_graph_runs_like_the_model_for_any_batch_and_from_a_file(tmp_path):
    model = _net()
    x = torch.randn(3, 3, 7, 7, dtype=DT)
    graph = capture(model, (x,))
    assert graph.batch_dynamic
    for batch in (x, torch.randn(5, 3, 7, 7, dtype=DT)):
        torch.testing.assert_close(graph.run(batch), model(batch), rtol=TOL, atol=TOL)
    with torch.no_grad():  # parameters are read live
        model.head.bias.add_(1.0)
    torch.testing.assert_close(graph.run(x), model(x), rtol=TOL, atol=TOL)
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    torch.testing.assert_close(capture(str(path)).run(x), model(x), rtol=TOL, atol=TOL)
    with pytest.raises(FileNotFoundError, match="pt2"):
        capture(str(tmp_path / "missing.pt2"))


def test_input_dependence_and_handler():
    model = _net()
    x = torch.randn(2, 3, 7, 7, dtype=DT)
    graph = capture(model, (x,))
    by_name = {op_name(n.target): graph.depends_on_input(n) for n in graph.nodes}
    assert by_name["aten.convolution.default"] and by_name["aten.addmm.default"]
    assert not by_name["aten.sin.default"]  # the positional table is a constant
    # a handler sees exactly the input-dependent nodes (and those fed by them)
    seen = []

    def handler(node, args, kwargs):
        seen.append(node)
        return node.target(*args, **kwargs)

    torch.testing.assert_close(graph.run(x, handler=handler), model(x))
    assert {op_name(n.target) for n in seen} >= {"aten.convolution.default", "aten.addmm.default"}
    assert all(graph.depends_on_input(n) for n in seen)
    assert "aten.sin.default" not in {op_name(n.target) for n in seen}


def test_refusal_lists_every_op_with_count_and_line():
    graph = capture(_net(), (torch.randn(2, 3, 7, 7, dtype=DT),))
    found = graph.unsupported(lambda n: op_name(n.target) not in
                              ("aten.convolution.default", "aten.clamp.default"))
    with pytest.raises(UnsupportedOps) as info:
        refuse(graph, found, "An engine", "What you can do: nothing.")
    message = str(info.value)
    assert "2 operation(s)" in message and "aten.clamp.default (x2)" in message
    assert "conv (Conv2d)" in message and "test_capture.py" in message
    assert set(info.value.ops) == {"aten.convolution.default", "aten.clamp.default"}


def test_data_dependent_control_flow_is_refused_with_its_line():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    with pytest.raises(CaptureError, match=r"test_capture.py:\d+ \(if x.sum.*depends on "
                       r"the input's values.*torch\.where"):
        capture(Branchy(), (torch.randn(2, 3),))


def test_a_failing_lowering_and_an_unreadable_file_are_capture_errors(tmp_path, monkeypatch):
    """No raw torch exception: a decomposition that fails names the user's line that made
    the operation; a file that is not a saved program says what to pass instead."""
    import taylorattr.capture as capture_module

    def broken(*args, **kwargs):
        raise RuntimeError("no decomposition today")

    class Normed(nn.Module):
        def forward(self, x):
            return F.rms_norm(x, (3,)).sum(-1)

    monkeypatch.setitem(capture_module.DEVICE_KERNELS, torch.ops.aten.rms_norm.default, broken)
    with pytest.raises(CaptureError, match=r"lowering Normed to core ATen operations failed at "
                       r".*test_capture.py:\d+ \(return F.rms_norm.*no decomposition today"):
        capture(Normed(), (torch.randn(2, 3, dtype=DT),))
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a program")
    with pytest.raises(CaptureError, match=r"could not load .*junk.pt2.*torch.export.save"):
        capture(str(junk))


@dataclasses.dataclass(init=False, frozen=True, eq=False, slots=True)
class _OldSpec:
    """Like torch 2.11's ``LeafSpec``: a slots dataclass deprecated with typing_extensions,
    which warns whenever it is instantiated, also by ``copy.deepcopy`` (copyreg)."""

    def __init__(self):
        pass


_OldSpec = typing_extensions.deprecated("`isinstance(treespec, LeafSpec)` is deprecated",
                                        category=FutureWarning)(_OldSpec)


def _torch_warns_in_lowering(route):
    """A stand-in for torch's lowering that first warns as torch does: ``copyreg`` (torch
    2.11 deep-copies a deprecated pytree spec) or a DeprecationWarning of torch's own
    module."""
    lower = torch.export.ExportedProgram.run_decompositions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = _OldSpec()

    def run_decompositions(self, *args, **kwargs):
        if route == "copyreg":
            copy.deepcopy(spec)
        else:
            warnings.warn_explicit("torch's own API is deprecated", DeprecationWarning,
                                   torch.utils._pytree.__file__, 1,
                                   module="torch.utils._pytree")
        return lower(self, *args, **kwargs)
    return run_decompositions


@pytest.mark.parametrize("route", ["copyreg", "torch"])
def test_torch_deprecation_noise_in_lowering_does_not_break_the_capture(route, monkeypatch):
    """Where the caller turns warnings into errors (``-W error``), the capture still works
    when torch warns about its own code while lowering (torch 2.11's LeafSpec FutureWarning);
    the graph equals the model."""
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        _torch_warns_in_lowering(route))
    model, x = _net(), torch.randn(2, 3, 6, 6, dtype=DT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises((FutureWarning, DeprecationWarning)):  # the stub does warn
            torch.export.export(model, (x,), strict=False).run_decompositions()
        graph = capture(model, (x,))
    torch.testing.assert_close(graph.run(x), model(x), rtol=TOL, atol=TOL)


def test_the_models_own_warnings_stay_visible_while_capturing():
    class Warns(nn.Module):
        def forward(self, x):
            warnings.warn("the model's own deprecation", FutureWarning)
            return x.sum(-1)

    x = torch.randn(2, 3, dtype=DT)
    with pytest.warns(FutureWarning, match="the model's own deprecation"):
        capture(Warns(), (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with pytest.raises(CaptureError, match="FutureWarning: the model's own deprecation"):
            capture(Warns(), (x,))
