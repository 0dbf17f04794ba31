"""Smooth surrogates of piecewise-linear networks, for Taylor analysis of ReLU models
(``ta.smooth``; the module is not called ``smooth`` so that it cannot shadow the function).

``smooth(model, beta)`` deep-copies ``model`` and replaces every kink by a smooth function
that tends to it as ``beta`` grows:

    ReLU(x)       -> softplus_beta(x) = log(1 + exp(beta x)) / beta         (gap log 2 / beta)
    ReLU6(x)      -> softplus_beta(x) - softplus_beta(x - 6)                 (a smooth clamp)
    LeakyReLU(x)  -> a x + (1 - a) softplus_beta(x)
    MaxPool(x)    -> (1/beta) log sum_{window} exp(beta x)                   (gap <= log n / beta)

Modules are swapped in place; functional calls (``F.relu``, ``torch.relu``, ``x.relu()``,
``F.relu6``, ``F.leaky_relu``, ``F.max_pool1d/2d``) are found by torch.fx and rerouted to
the same surrogates. The result is a :class:`SmoothedModel`; given ``inputs`` it reports
``output_gap = max |f_smooth(inputs) - f(inputs)|``. Its Taylor terms of order >= 2 are
non-zero (the original's vanish almost everywhere) and tend to the kinks' as beta grows.

Example::

    smoothed = ta.smooth(relu_cnn, beta=10.0, inputs=x)
    print(smoothed.output_gap)          # how far the surrogate is from the original on x
    terms = ta.taylor_terms(smoothed, x, order=3)
"""
from __future__ import annotations

import copy
import math
import warnings
from numbers import Real

import torch
import torch.nn.functional as F
from torch import fx, nn

from .. import _fx
from .. import _validation as V

__all__ = ["SmoothLeakyReLU", "SmoothMaxPool", "SmoothReLU", "SmoothReLU6", "SmoothedModel",
           "smooth"]


class SmoothReLU(nn.Module):
    """``softplus_beta(x) = log(1 + exp(beta x)) / beta``; PyTorch returns ``x`` where
    ``beta x > 20`` (an error below ``exp(-20) / beta``)."""

    def __init__(self, beta: float):
        super().__init__()
        self.beta = float(beta)

    def forward(self, x):
        return F.softplus(x, self.beta)


class SmoothReLU6(SmoothReLU):
    """``relu6(x) = relu(x) - relu(x - 6)`` with each ReLU smoothed: a smooth clamp to [0, 6]."""

    def forward(self, x):
        return F.softplus(x, self.beta) - F.softplus(x - 6.0, self.beta)


class SmoothLeakyReLU(SmoothReLU):
    """``leaky(x) = a x + (1 - a) relu(x)`` with the ReLU smoothed."""

    def __init__(self, beta: float, negative_slope: float):
        super().__init__(beta)
        self.negative_slope = float(negative_slope)

    def forward(self, x):
        a = self.negative_slope
        return a * x + (1.0 - a) * F.softplus(x, self.beta)


class SmoothMaxPool(nn.Module):
    """Log-sum-exp pooling with temperature ``1/beta`` (1-d or 2-d, max-pool geometry):

        y = s + (1/beta) log sum_{offsets o in the window} exp(beta (x_o - s))

    with ``s`` the window maximum, held constant: the value does not depend on ``s``, which
    only keeps ``exp`` in range. Each offset of the window is a strided slice of the input.
    Taylor mode runs the same :meth:`log_sum_exp` on Jets (its rule in
    :mod:`taylorattr.taylor.mode.rules_surrogates`)."""

    def __init__(self, beta: float, dims: int, kernel_size, stride=None, padding=0, dilation=1):
        super().__init__()
        pair = (lambda v: (v,) * dims if isinstance(v, int) else tuple(v))
        self.beta, self.dims = float(beta), dims
        self.kernel_size, self.padding, self.dilation = pair(kernel_size), pair(padding), pair(dilation)
        self.stride = self.kernel_size if stride is None or stride == [] else pair(stride)

    def forward(self, x):
        return self.log_sum_exp(x, x.detach(), torch.exp, torch.log, F.pad,
                                lambda t, index: t[index])

    def log_sum_exp(self, x, values: torch.Tensor, exp, log, pad, index):
        """The pooling written once for tensors and Jets: ``values`` are ``x``'s values,
        ``exp``/``log``/``pad``/``index`` the operations on ``x``'s kind."""
        pool = F.max_pool1d if self.dims == 1 else F.max_pool2d
        shift = pool(values, self.kernel_size, self.stride, self.padding, self.dilation)
        pads = [p for p in reversed(self.padding) for _ in range(2)]
        if any(pads):
            x = pad(x, pads, value=float("-inf"))
        out = shift.shape[-self.dims:]
        total = None
        for offset in _offsets(self.kernel_size):
            where = [slice(None)] * (values.dim() - self.dims)
            for d in range(self.dims):
                start = offset[d] * self.dilation[d]
                where.append(slice(start, start + (out[d] - 1) * self.stride[d] + 1, self.stride[d]))
            term = exp((index(x, tuple(where)) - shift) * self.beta)
            total = term if total is None else total + term
        return log(total) * (1.0 / self.beta) + shift


def _offsets(kernel: tuple[int, ...]) -> list[tuple[int, ...]]:
    grids = [()]
    for k in kernel:
        grids = [g + (i,) for g in grids for i in range(k)]
    return grids


def _surrogate(m: nn.Module, beta: float) -> nn.Module | None:
    if isinstance(m, nn.ReLU):
        return SmoothReLU(beta)
    if isinstance(m, nn.ReLU6):
        return SmoothReLU6(beta)
    if isinstance(m, nn.LeakyReLU):
        return SmoothLeakyReLU(beta, m.negative_slope)
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)):
        if m.ceil_mode or m.return_indices:
            raise ValueError(f"model: {type(m).__name__} with ceil_mode or return_indices has no "
                             "smooth surrogate here; use ceil_mode=False")
        dims = 1 if isinstance(m, nn.MaxPool1d) else 2
        return SmoothMaxPool(beta, dims, m.kernel_size, m.stride, m.padding, m.dilation)
    if isinstance(m, (nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.Hardtanh,
                      nn.PReLU)):
        raise TypeError(f"model: {type(m).__name__} has no smooth surrogate in ta.smooth "
                         "(ReLU, ReLU6, LeakyReLU and MaxPool1d/2d have one)")
    return None


def _functional(node: fx.Node, beta: float) -> nn.Module | None:
    """The surrogate for a functional kink in a traced graph (args taken from the node)."""
    args, kwargs = node.args[1:], dict(node.kwargs)
    if node.op == "call_method":
        return SmoothReLU(beta) if node.target in ("relu", "relu_") else None
    if node.op != "call_function":
        return None
    if node.target in (F.relu, torch.relu, torch.relu_):
        return SmoothReLU(beta)
    if node.target is F.relu6:
        return SmoothReLU6(beta)
    if node.target is F.leaky_relu:
        return SmoothLeakyReLU(beta, (args or (kwargs.get("negative_slope", 0.01),))[0])
    if node.target in (F.max_pool1d, F.max_pool2d):
        names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
        given = dict(zip(names, args)) | kwargs
        if given.get("ceil_mode") or given.get("return_indices"):
            raise ValueError("model: F.max_pool with ceil_mode or return_indices has no smooth "
                             "surrogate here")
        dims = 1 if node.target is F.max_pool1d else 2
        return SmoothMaxPool(beta, dims, given["kernel_size"], given.get("stride"),
                             given.get("padding", 0), given.get("dilation", 1))
    return None


def _smooth_functional(model: nn.Module, beta: float) -> nn.Module:
    """Reroute functional kinks found by torch.fx to surrogate submodules (if any). A model
    torch.fx cannot trace keeps its functional calls (with a warning): Taylor mode could not
    trace it either."""
    try:
        gm = _fx.trace(model, "ta.smooth", ValueError, leaf_modules=(SmoothMaxPool,))
    except ValueError as exc:
        warnings.warn(f"ta.smooth replaced the kink modules only; functional ReLU/max-pool calls "
                      f"were not checked: {exc}", stacklevel=3)
        return model
    count = 0
    for node in list(gm.graph.nodes):
        surrogate = _functional(node, beta)
        if surrogate is None:
            continue
        name = f"smooth_{count}"
        count += 1
        gm.add_submodule(name, surrogate)
        with gm.graph.inserting_after(node):
            new = gm.graph.call_module(name, (node.args[0],))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    if not count:
        return model
    gm.graph.lint()
    gm.recompile()
    return gm


class SmoothedModel(nn.Module):
    """A smoothed copy of a model. ``module``: the copy; ``beta``; ``replaced``: the names of
    the kinks replaced; ``output_gap``: ``max |f_smooth - f|`` on the inputs given to
    :func:`smooth` (``None`` without inputs); :meth:`gap` measures it on other inputs."""

    def __init__(self, module: nn.Module, original: nn.Module, beta: float, replaced: list[str]):
        super().__init__()
        self.module = module
        self.__dict__["original"] = original  # not a submodule: its parameters stay its own
        self.beta = beta
        self.replaced = replaced
        self.output_gap: float | None = None

    def forward(self, inputs):
        return self.module(inputs)

    @torch.no_grad()
    def gap(self, inputs: torch.Tensor) -> float:
        """``max |f_smooth(inputs) - f(inputs)|`` over every sample and output."""
        V.check_inputs(inputs)
        return float((self.module(inputs) - self.original(inputs)).abs().max())


def smooth(model: nn.Module, beta: float, inputs: torch.Tensor | None = None) -> SmoothedModel:
    """A copy of ``model`` with every ReLU / ReLU6 / LeakyReLU / max-pool replaced by its
    smooth surrogate of sharpness ``beta`` (module docstring); ``model`` is not changed.

    Args:
        model: an ``nn.Module``.
        beta: sharpness > 0; the surrogate tends to the kink as ``beta`` grows.
        inputs: optional ``[B, ...]`` inputs on which ``output_gap`` is measured.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(beta, bool) or not isinstance(beta, Real):
        raise TypeError(f"beta must be a real number > 0, got {type(beta).__name__}")
    if not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    copy_ = copy.deepcopy(model)
    replaced = []
    for name, m in list(copy_.named_modules()):
        surrogate = _surrogate(m, float(beta))
        if surrogate is None:
            continue
        if not name:  # the model itself is a single kink
            copy_ = surrogate
        else:
            parent, _, leaf = name.rpartition(".")
            setattr(copy_.get_submodule(parent) if parent else copy_, leaf, surrogate)
        replaced.append(f"{name or '(model)'} ({type(m).__name__})")
    smoothed = _smooth_functional(copy_, float(beta))
    if smoothed is not copy_:
        replaced += [f"{n.target} ({type(smoothed.get_submodule(n.target)).__name__}, functional)"
                     for n in smoothed.graph.nodes
                     if n.op == "call_module" and str(n.target).startswith("smooth_")]
    result = SmoothedModel(smoothed, model, float(beta), replaced)
    result.train(model.training)
    if inputs is not None:
        result.output_gap = result.gap(inputs)
    return result

