"""Argument checks shared by every public entry point.

Every check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError``
(right kind, wrong value or shape) with a message that names the argument and says
what was expected. Nothing here silently repairs an input.
"""
from __future__ import annotations

import math
import warnings
from numbers import Integral, Real

import torch
from torch import nn

__all__ = [
    "accumulation_dtype",
    "broadcast_baselines",
    "built_on_cpu",
    "check_bool",
    "check_inputs",
    "check_model",
    "check_output",
    "check_positive_int",
    "check_seed",
    "cpu_generator",
    "draw",
    "flat_target",
    "model_output",
    "read_output",
    "resolve_target",
    "run_model",
    "select_output",
    "tuple_target",
]

#: the dtypes inputs and outputs may have; half precision (float16, bfloat16) runs in every
#: method, the methods accumulating their sums in float32 (:func:`accumulation_dtype`)
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_HALF = (torch.float16, torch.bfloat16)
# out-of-memory errors are RuntimeErrors too, but say nothing about the inputs
_OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def check_model(model, name: str = "model") -> None:
    """Require a callable; warn when an ``nn.Module`` is in train mode."""
    if not callable(model):
        raise TypeError(f"{name} must be a callable (an nn.Module), got {type(model).__name__}")
    if isinstance(model, nn.Module) and model.training:
        warnings.warn(
            f"{name} is in train mode; dropout and batch statistics make attributions "
            "non-deterministic and non-exact. Call model.eval() first.",
            stacklevel=3,
        )


def check_inputs(inputs, name: str = "inputs") -> torch.Tensor:
    """A batch-first floating tensor (float64, float32, float16 or bfloat16) with at least
    one sample, all finite."""
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(inputs).__name__}")
    if inputs.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float32, float64, float16 or bfloat16, got "
                        f"{inputs.dtype}")
    if inputs.dim() < 2:
        raise ValueError(
            f"{name} must be batch-first with at least 2 dimensions [B, ...], got shape "
            f"{tuple(inputs.shape)}"
        )
    if inputs.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one sample, got an empty batch")
    if inputs.numel() == 0:
        raise ValueError(f"{name} must have at least one feature, got shape {tuple(inputs.shape)}")
    if not torch.isfinite(inputs).all():
        raise ValueError(f"{name} must be finite; it contains NaN or inf")
    return inputs


def broadcast_baselines(baselines, inputs: torch.Tensor, name: str = "baselines") -> torch.Tensor:
    """Expand a scalar, a tensor broadcastable to ``inputs``, or a per-sample tensor.

    Returns a tensor with exactly the shape, dtype and device of ``inputs``.
    """
    if isinstance(baselines, bool) or not isinstance(baselines, (Real, torch.Tensor)):
        raise TypeError(
            f"{name} must be a real scalar or a torch.Tensor, got {type(baselines).__name__}"
        )
    if isinstance(baselines, Real):
        b = torch.full_like(inputs, float(baselines))
    else:
        if not (baselines.is_floating_point() or baselines.dtype in (torch.int64, torch.int32)):
            raise TypeError(f"{name} must be a float tensor, got dtype {baselines.dtype}")
        try:
            b = torch.broadcast_to(baselines.to(inputs), inputs.shape).clone()
        except RuntimeError:
            raise ValueError(
                f"{name} of shape {tuple(baselines.shape)} does not broadcast to inputs of shape "
                f"{tuple(inputs.shape)}; give a scalar, a tensor of shape {tuple(inputs.shape[1:])}, "
                f"or one baseline per sample {tuple(inputs.shape)}"
            ) from None
    if not torch.isfinite(b).all():
        raise ValueError(f"{name} must be finite; it contains NaN or inf")
    return b


def model_output(model, inputs: torch.Tensor, name: str = "model") -> torch.Tensor:
    """Run ``model`` and require a floating output (float64, float32, float16 or bfloat16) of
    shape [B] or [B, C], all finite (:func:`run_model`, then :func:`check_output`)."""
    return check_output(run_model(model, inputs, name), inputs, name)


def run_model(model, inputs: torch.Tensor, name: str = "model"):
    """``model(inputs)``; a ``RuntimeError`` or ``IndexError`` raised by the model itself
    (typically inputs of a shape or dtype it does not accept) becomes a ``ValueError``
    naming the inputs' shape and dtype, chained to the original error."""
    try:
        return model(inputs)
    except _OUT_OF_MEMORY:
        raise
    except (RuntimeError, IndexError) as exc:
        raise ValueError(
            f"{name} failed on inputs of shape {tuple(inputs.shape)} and dtype {inputs.dtype} "
            f"(do the inputs have the shape and dtype the model expects?): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def check_output(out, inputs: torch.Tensor, name: str = "model") -> torch.Tensor:
    """Require ``out``, the model's output at ``inputs``, to be a finite floating tensor
    (float64, float32, float16 or bfloat16) of shape [B] or [B, C]."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must return a torch.Tensor, got {type(out).__name__}")
    if out.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must return a floating tensor (float32, float64, float16 or "
                        f"bfloat16), got dtype {out.dtype}")
    if out.dtype in _HALF and inputs.is_floating_point() and \
            torch.finfo(out.dtype).eps > torch.finfo(inputs.dtype).eps:
        raise TypeError(f"{name} returned {out.dtype} for {inputs.dtype} inputs: a half-"
                        "precision output of higher-precision inputs would give every "
                        "attribution the output's rounding (2^-8 to 2^-11); run the model in "
                        "the inputs' dtype (model.to(dtype)) or give inputs of the model's dtype")
    if out.dim() not in (1, 2) or out.shape[0] != inputs.shape[0]:
        raise ValueError(
            f"{name} must map inputs [B, ...] to an output of shape [B] or [B, C]; for B="
            f"{inputs.shape[0]} it returned shape {tuple(out.shape)}"
        )
    if not torch.isfinite(out).all():
        raise ValueError(f"{name} returned NaN or inf for the given inputs")
    return out


def tuple_target(target) -> bool:
    """Whether ``target`` indexes an output beyond ``[B, C]``: a tuple, or a list of them."""
    return isinstance(target, tuple) or (
        isinstance(target, list) and bool(target) and isinstance(target[0], tuple))


def flat_target(target, out: torch.Tensor):
    """The target of the flattened output ``[B, d_1 * ... * d_k]``: a tuple target (or one
    per sample) as its column; when ``d_2 = ... = d_k = 1`` an int, a ``[B]`` tensor or None
    reads the first output axis as the columns of ``[B, C]`` do (Captum's ``output[:, t]``)."""
    shape = tuple(out.shape[1:])
    if not tuple_target(target) and math.prod(shape[1:]) == 1:
        return target
    if target is None:
        raise ValueError(f"target must be given for a model with output shape "
                         f"{tuple(out.shape)}: a tuple of {len(shape)} indices (or a list "
                         "of them, one per sample)")
    rows = target if isinstance(target, list) else [target]
    flat = []
    for r in rows:
        if not isinstance(r, tuple) or len(r) != len(shape) or \
                not all(isinstance(i, Integral) for i in r):
            raise ValueError(f"target must be a tuple of {len(shape)} ints indexing the model's "
                             f"output shape {shape} (or a list of them, one per sample), got "
                             f"{r!r}")
        if not all(0 <= i < n for i, n in zip(r, shape)):
            raise ValueError(f"target {r!r} lies outside the model's output shape {shape}")
        flat.append(sum(i * math.prod(shape[k + 1:]) for k, i in enumerate(r)))
    if isinstance(target, list):
        if len(flat) != out.shape[0]:
            raise ValueError(f"target must give one tuple per sample ({out.shape[0]}), got "
                             f"{len(flat)}")
        return torch.tensor(flat, dtype=torch.long, device=out.device)
    return flat[0]


def resolve_target(target, output: torch.Tensor, name: str = "target") -> torch.Tensor | None:
    """Turn ``target`` (None, int, a [B] integer tensor or a list of B ints) into a [B] long
    tensor; a one-element tensor is one class for every sample (as an int; Captum's reading).

    For a [B] output the target must be None and ``None`` is returned. For [B, C] outputs
    ``None`` means the argmax class of each sample.
    """
    batch = output.shape[0]
    if isinstance(target, list) and not tuple_target(target):  # one class per sample
        if not all(isinstance(v, Integral) and not isinstance(v, bool) for v in target):
            raise TypeError(f"{name} must be a list of ints (one class per sample), got "
                            f"{target!r}")
        if len(target) != batch:
            raise ValueError(f"{name} must give one class per sample ({batch}), got "
                             f"{len(target)}")
        target = torch.tensor(target, dtype=torch.long, device=output.device)
    if output.dim() == 1:
        if target is not None:
            raise ValueError(f"{name} must be None for a model with output shape [B], got {target!r}")
        return None
    n_classes = output.shape[1]
    if target is None:
        return output.detach().argmax(dim=1)
    if isinstance(target, bool):
        raise TypeError(f"{name} must be None, an int or a [B] integer tensor, got bool")
    if isinstance(target, Integral):  # int or a numpy integer
        target = int(target)
        if not 0 <= target < n_classes:
            raise ValueError(f"{name} must lie in [0, {n_classes}), got {target}")
        return torch.full((batch,), target, dtype=torch.long, device=output.device)
    if isinstance(target, torch.Tensor):
        if target.dtype.is_floating_point or target.dtype == torch.bool or target.is_complex():
            raise TypeError(f"{name} must be an integer tensor, got dtype {target.dtype}")
        if target.dim() == 0 or target.shape == (1,):
            t = target.to(output.device, torch.long).reshape(()).expand(batch).clone()
        elif target.shape == (batch,):
            t = target.to(output.device, torch.long)
        else:
            raise ValueError(
                f"{name} must be an int or a tensor of shape [{batch}], got shape {tuple(target.shape)}"
            )
    else:
        raise TypeError(f"{name} must be None, an int or a [B] integer tensor, got {type(target).__name__}")
    if ((t < 0) | (t >= n_classes)).any():
        raise ValueError(f"{name} must lie in [0, {n_classes}), got {t.tolist()}")
    return t


def select_output(output: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """The explained scalar per sample: ``output[b, target[b]]`` (or ``output`` when [B])."""
    if target is None:
        return output
    return output.gather(1, target.view(-1, 1)).squeeze(1)


def check_int(value, name: str, minimum: int | None = None) -> int:
    """Require an int (not a bool; a TypeError naming ``name``) of at least ``minimum``
    (a ValueError)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_positive_int(value, name: str) -> int:
    """Require an int >= 1."""
    return check_int(value, name, 1)


def check_optional_positive_int(value, name: str) -> int | None:
    """None (automatic) or an int >= 1."""
    return None if value is None else check_positive_int(value, name)


def check_real(value, name: str, minimum: float | None = None, strict: bool = False) -> float:
    """Require a finite real number (not a bool; a TypeError naming ``name``), at least
    ``minimum`` (above it with ``strict``; a ValueError), returned as a float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {value:g}")
    return value


def check_bool(value, name: str) -> bool:
    """Require a bool (not merely something truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_seed(seed, name: str = "seed") -> int:
    """Require an int in ``[0, 2**63)`` (what ``torch.Generator.manual_seed`` accepts)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"{name} must lie in [0, 2**63), got {seed}")
    return seed


def check_nonnegative_real(value, name: str) -> float:
    """A finite real number >= 0 (not a bool), as a float."""
    return check_real(value, name, 0.0)


def cpu_generator(seed: int) -> torch.Generator:
    """The library's one way to make a seeded generator: a CPU ``torch.Generator`` seeded
    with ``seed`` (checked by the caller).

    Every random draw of the library comes from such a generator through :func:`draw`:
    the numbers are drawn on the CPU and then moved to the device of the inputs, so a
    seed gives the same numbers on every device (a CUDA generator draws a different
    stream from the same seed), and a CPU generator never meets the CUDA default device
    that ``torch.set_default_device('cuda')`` installs. The price is one host-to-device
    copy of the draws, small beside the model evaluations they feed.
    """
    return torch.Generator(device="cpu").manual_seed(int(seed))


def built_on_cpu(build, seed: int):
    """``build()`` (a module factory) with its initial weights drawn on the CPU by the
    global CPU generator seeded with ``seed``: the same weights on every device (a CUDA
    generator draws other numbers from the same seed); the caller moves the module. The
    global CPU generator is left seeded, no device generator is touched (wrap the call in
    ``torch.random.fork_rng(devices=[])`` to keep the caller's CPU stream)."""
    torch.default_generator.manual_seed(int(seed))
    with torch.device("cpu"):
        return build()


def draw(factory, *args, generator: torch.Generator, device, **kwargs) -> torch.Tensor:
    """``factory(*args, generator=generator, **kwargs)`` drawn on the CPU, then moved to
    ``device`` (the device of the inputs the draws are for; ``"cpu"`` for draws that stay
    on the host, such as indices into a CPU dataset).

    ``factory`` is one of ``torch.randn``, ``torch.rand``, ``torch.randint`` and
    ``torch.randperm`` (any factory taking ``generator=``, ``device=`` and ``dtype=``);
    ``dtype`` passes through (draw in float64 and cast afterwards to keep the numbers
    of every dtype the same draws). The draw is made with an explicit ``device="cpu"``,
    so neither the default device nor the device of ``generator`` decides where it lands.
    """
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (draws are made on the CPU "
                         f"and moved), got one on {generator.device}")
    return factory(*args, generator=generator, device="cpu", **kwargs).to(device)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums over many terms are accumulated in for values of ``dtype``: float32
    for float16 and bfloat16 (8 and 11 significant bits: a sum of ``n`` terms would lose
    ``log2 n`` of them; bfloat16's eps is 2^-7 = 7.8e-3), else ``dtype`` itself."""
    return torch.float32 if dtype in _HALF else dtype


def read_output(out, target, inputs: torch.Tensor, discrete: bool = False):
    """The model's output at ``inputs`` read by Captum's conventions, decided from its
    shape: ``(view, flat, target, fx)``. An output beyond ``[B, C]`` is seen flattened to
    ``[B, d_1 * ... * d_k]`` (``flat``) and a tuple target (or one per sample) as its column
    (:func:`flat_target`); integer outputs of integer inputs (``discrete``) are carried as
    float64. ``view`` is then checked (:func:`check_output`), the target resolved
    (:func:`resolve_target`) and ``fx`` is the explained output ``[B]``."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"model must return a torch.Tensor, got {type(out).__name__}")
    flat = out.dim() > 2
    if flat or tuple_target(target):
        target = flat_target(target, out)
    view = out
    if (discrete or flat) and not (out.is_floating_point() or out.is_complex()):
        view = out.double()  # integer outputs of integer inputs: exact in float64
    if flat:
        view = view.flatten(1)
    check_output(view, inputs, "model")
    t = resolve_target(target, view)
    return view, flat, t, select_output(view, t)
